//! The one way the agent runs `nft`: every table of every room goes
//! through here, so the spawn, the error text and the "is nftables
//! installed?" hint are the same for all of them.

use std::io::Write;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// Applies `script` with `nft -f -`: nft runs the whole file as one
/// transaction, so a table is never seen half-written.
pub fn apply(script: &str) -> Result<()> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("running nft (is nftables installed?)")?;
    // Drained beside the wait: an nft with much to say must not block on a
    // full pipe while it is being waited for.
    let stderr = child.stderr.take().map(|mut e| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = std::io::Read::read_to_end(&mut e, &mut buf);
            buf
        })
    });
    if let Some(mut s) = child.stdin.take() {
        s.write_all(script.as_bytes())?;
    }
    // nft has been seen to hang for minutes under load (an agent's start
    // stalled 4 min in its first table): bounded, the caller's retry or
    // repair runs instead, and the error says where the kernel held it.
    let deadline = std::time::Instant::now() + APPLY_TIMEOUT;
    while child.try_wait()?.is_none() {
        if std::time::Instant::now() > deadline {
            let pid = child.id();
            let at = |f: &str| {
                std::fs::read_to_string(format!("/proc/{pid}/{f}"))
                    .unwrap_or_default()
                    .replace('\n', " | ")
            };
            let (wchan, stack) = (at("wchan"), at("stack"));
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "nft -f did not finish in {APPLY_TIMEOUT:?} and was killed (waiting in {wchan:?}; kernel stack: {stack})"
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let status = child.wait()?;
    let err = stderr.and_then(|t| t.join().ok()).unwrap_or_default();
    ok_or_stderr(status, &err)
}

/// How long one `nft -f` may take: far past what a whole table takes (tens
/// of milliseconds), short of a stall nobody would notice.
const APPLY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// Runs `nft <args>` and returns what it printed (a `list` command).
pub fn query(args: &[&str]) -> Result<String> {
    let out = Command::new("nft")
        .args(args)
        .output()
        .context("running nft (is nftables installed?)")?;
    ok_or_stderr(out.status, &out.stderr)?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether `table` of `family` exists. Any failure (no nft, no table)
/// reads as absent: the caller's answer to both is to install it.
pub fn table_exists(family: &str, table: &str) -> bool {
    Command::new("nft")
        .args(["list", "table", family, table])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `nft list chain` of one chain; None when it (or nft) is not there.
pub(crate) fn list_chain(family: &str, table: &str, chain: &str) -> Option<String> {
    let out = Command::new("nft")
        .args(["list", "chain", family, table, chain])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ok_or_stderr(status: std::process::ExitStatus, stderr: &[u8]) -> Result<()> {
    if !status.success() {
        bail!("nft failed: {}", String::from_utf8_lossy(stderr).trim());
    }
    Ok(())
}
