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
    let timeout = timeout * time_scale();
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

/// `MYCNI_LAB_TIME_SCALE` (default 1): how many times longer the lab waits
/// for anything, for a lab in a guest under QEMU's emulation (~8x slower;
/// `cargo xtask kernels` sets it).
pub fn time_scale() -> u32 {
    std::env::var("MYCNI_LAB_TIME_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n >= 1)
        .unwrap_or(1)
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

/// The capabilities of Linux 6.18 by number (`include/uapi/linux/capability.h`).
const CAPS: [&str; 41] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
];

/// `program args` run through capsh with every capability but `keep` (a
/// comma-separated list of names as a pod spec writes them, `NET_ADMIN`)
/// dropped from the bounding set: as root, the program then holds exactly
/// `keep`, as a container with `drop: [ALL]` and `add: keep` does.
pub(crate) fn with_only_caps(
    keep: &str,
    program: &Path,
    args: Vec<String>,
) -> Result<(std::path::PathBuf, Vec<String>)> {
    let keep: Vec<&str> = keep
        .split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    if let Some(unknown) = keep.iter().find(|c| !CAPS.contains(c)) {
        anyhow::bail!("unknown capability {unknown:?} in {AGENT_CAPS_ENV}");
    }
    let drop: Vec<String> = (0..CAPS.len())
        .filter(|&n| !keep.contains(&CAPS[n]))
        .map(|n| n.to_string())
        .collect();
    let mut out = vec![
        format!("--drop={}", drop.join(",")),
        format!("--shell={}", program.display()),
        "--".into(),
    ];
    out.extend(args);
    Ok(("/usr/sbin/capsh".into(), out))
}

/// Set to a comma-separated list of capability names (`NET_ADMIN,BPF`),
/// every agent the lab starts holds exactly those (the DaemonSet's list:
/// tests read it from deploy/base/daemonset.yaml).
pub const AGENT_CAPS_ENV: &str = "MYCNI_LAB_AGENT_CAPS";
