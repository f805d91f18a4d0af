//! The one way the agent runs `nft`: every table goes through here, so the
//! spawn, the error text and the "is nftables installed?" hint are the same
//! for all of them.

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
    if let Some(mut s) = child.stdin.take() {
        s.write_all(script.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    ok_or_stderr(out.status, &out.stderr)
}

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

fn ok_or_stderr(status: std::process::ExitStatus, stderr: &[u8]) -> Result<()> {
    if !status.success() {
        bail!("nft failed: {}", String::from_utf8_lossy(stderr).trim());
    }
    Ok(())
}
