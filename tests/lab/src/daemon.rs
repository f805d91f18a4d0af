//! Processes in the lab's namespaces: commands, daemons that outlive `lab
//! up`, and waiting on a condition with Ctrl-C honoured.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::check_interrupted;
use mycni_testkit::sh;

pub(crate) fn ns_exec(ns: &str, program: &str, args: &[&str]) -> Result<String> {
    let mut full = vec!["netns", "exec", ns, program];
    full.extend_from_slice(args);
    sh("ip", &full)
}

/// Starts `program` inside `ns` as a daemon in its own session (so it
/// outlives `lab up`), logging to `log`; records its pid in `pidfile`.
pub fn spawn_daemon(
    ns: &str,
    program: &Path,
    args: &[String],
    log: &Path,
    pidfile: &Path,
) -> Result<u32> {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns]).arg(program).args(args);
    spawn_command(cmd, program, log, pidfile)
}

/// [`spawn_daemon`] in this process's own namespace (the host's).
pub(crate) fn spawn_host_daemon(
    program: &Path,
    args: &[String],
    log: &Path,
    pidfile: &Path,
) -> Result<u32> {
    let mut cmd = Command::new(program);
    cmd.args(args);
    spawn_command(cmd, program, log, pidfile)
}

fn spawn_command(mut cmd: Command, program: &Path, log: &Path, pidfile: &Path) -> Result<u32> {
    let out = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let err = out.try_clone()?;
    cmd.stdin(Stdio::null()).stdout(out).stderr(err);
    // SAFETY: setsid, sigemptyset, sigprocmask and signal are
    // async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            // A daemon must die on SIGTERM whatever mask or disposition the
            // spawning thread had (a test harness thread, a runtime worker).
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
            libc::signal(libc::SIGTERM, libc::SIG_DFL);
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {}", program.display()))?;
    let pid = child.id();
    std::fs::write(pidfile, pid.to_string())?;
    Ok(pid)
}

pub(crate) fn stop_pidfile(pidfile: &Path) {
    let Ok(s) = std::fs::read_to_string(pidfile) else {
        return;
    };
    let Ok(pid) = s.trim().parse::<i32>() else {
        return;
    };
    // SAFETY: plain kill(2) on a pid we started.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    for _ in 0..500 {
        // When this process started the daemon (tests), it is our child and
        // stays a zombie until reaped: kill(pid, 0) alone would see it alive.
        // SAFETY: WNOHANG waitpid on a pid; ECHILD when it is not our child.
        let reaped = unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) } == pid;
        // SAFETY: signal 0 only probes for existence.
        if reaped || unsafe { libc::kill(pid, 0) } != 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let _ = std::fs::remove_file(pidfile);
}

/// Polls `f` every 100 ms until it holds, Ctrl-C or `timeout`.
pub(crate) fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        check_interrupted()?;
        if f() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("timed out after {timeout:?} waiting for {what}")
}

/// A log line without its terminal colour codes (tracing's ANSI escapes),
/// so its fields can be read.
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c == '\u{1b}' {
            if it.peek() == Some(&'[') {
                it.next();
                for d in it.by_ref() {
                    if d.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}
