//! The agent with one capability removed at a time (capsh drops it from the
//! bounding set, so even root cannot have it): it must stop at once and name
//! the missing capability, before touching the API or the kernel.
//!
//! CAP_SYS_ADMIN is the exception: only the program load may use it (to
//! find nf_conntrack's BTF object where conntrack is a module), a running
//! agent must not hold it in any thread, and an agent started without it
//! must run (the fast path where the kfuncs are in vmlinux, else the
//! kernel path naming CAP_SYS_ADMIN).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};

use crate::common;
use common::lab;

const SYS_ADMIN: u64 = 1 << 21;
/// CAP_NET_ADMIN, CAP_PERFMON, CAP_BPF: what the agent keeps.
const KEPT: u64 = (1 << 12) | (1 << 38) | (1 << 39);

fn agent() -> std::path::PathBuf {
    mycni_e2e::bin("mycni-agent")
}

/// Runs `mycni-agent run` without `cap` and returns (exit ok, stderr, time).
fn run_without(cap: &str, extra: &[&str]) -> Result<(bool, String, Duration)> {
    let dir = tempfile::tempdir()?;
    let mut cmd = vec![
        agent().to_string_lossy().into_owned(),
        "run".into(),
        "--node-name".into(),
        "n1".into(),
        // Nothing listens there: an agent that got past the probe would
        // fail (or hang) on the API, not on a capability.
        "--kubeconfig".into(),
        dir.path().join("absent").to_string_lossy().into_owned(),
        "--state-dir".into(),
        dir.path().join("run").to_string_lossy().into_owned(),
        "--data-dir".into(),
        dir.path().join("data").to_string_lossy().into_owned(),
        "--cni-conf-dir".into(),
        dir.path().join("net.d").to_string_lossy().into_owned(),
        "--metrics-addr".into(),
        "off".into(),
    ];
    cmd.extend(extra.iter().map(|s| s.to_string()));
    let t0 = Instant::now();
    let out = Command::new("timeout")
        // The time asserted is the agent's, not anyhow's: with RUST_BACKTRACE
        // set (CI sets it) the error's backtrace is symbolized from a 350 MB
        // debug binary, 2-3 s of its own.
        .env("RUST_BACKTRACE", "0")
        .env("RUST_LIB_BACKTRACE", "0")
        .arg("10")
        .arg("capsh")
        .arg(format!("--drop={cap}"))
        .arg("--")
        .arg("-c")
        .arg(format!("exec {}", cmd.join(" ")))
        .output()
        .context("running capsh (Debian package libcap2-bin)")?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        t0.elapsed(),
    ))
}

#[test]
fn each_missing_capability_is_named_at_start() -> Result<()> {
    let _turn = crate::turn(module_path!());
    for (cap, name) in [
        ("cap_net_admin", "CAP_NET_ADMIN"),
        ("cap_bpf", "CAP_BPF"),
        ("cap_perfmon", "CAP_PERFMON"),
    ] {
        let (ok, stderr, took) = run_without(cap, &[])?;
        eprintln!("without {name}: {} ms\n{stderr}", took.as_millis());
        assert!(!ok, "the agent ran without {name}");
        assert!(
            stderr.contains(&format!("missing capability {name}")),
            "stderr does not name {name}:\n{stderr}"
        );
        assert!(
            took < Duration::from_secs(3),
            "took {took:?} to fail without {name}"
        );
    }
    Ok(())
}

#[test]
fn the_kernel_datapath_needs_no_bpf_capabilities() -> Result<()> {
    let _turn = crate::turn(module_path!());
    for cap in ["cap_bpf", "cap_perfmon"] {
        let (_, stderr, _) = run_without(cap, &["--datapath", "kernel"])?;
        assert!(
            !stderr.contains("missing capabilit"),
            "--datapath kernel refused without {cap}:\n{stderr}"
        );
    }
    let (ok, stderr, _) = run_without("cap_net_admin", &["--datapath", "kernel"])?;
    assert!(
        !ok && stderr.contains("missing capability CAP_NET_ADMIN"),
        "{stderr}"
    );
    Ok(())
}

/// A capability set of `/proc/.../status` (`CapEff:` etc.).
fn set(status: &str, name: &str) -> Result<u64> {
    let v = status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .with_context(|| format!("no {name} line"))?;
    Ok(u64::from_str_radix(v.trim(), 16)?)
}

/// The pid node 1's agent runs as (`ip netns exec` and capsh exec it).
fn agent_pid(l: &mycni_lab::Lab) -> Result<u32> {
    let pidfile = l.spec.node_dir(1).join("agent.pid");
    Ok(std::fs::read_to_string(&pidfile)?.trim().parse()?)
}

#[test]
fn a_running_agent_holds_no_sys_admin_in_any_thread() -> Result<()> {
    let _turn = crate::turn(module_path!());
    // The lab starts its agents as root: every capability, CAP_SYS_ADMIN
    // included, and CAP_SETPCAP to empty the bounding set of it too. A pod,
    // so the agent reads a pod's veth and attaches to it after the drop.
    let t = lab(1, 1)?;
    let l = &t.0;
    let pid = agent_pid(l)?;
    let mut threads = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let path = task?.path().join("status");
        let status = std::fs::read_to_string(&path)?;
        for name in ["CapEff:", "CapPrm:", "CapInh:", "CapBnd:"] {
            let v = set(&status, name)?;
            ensure!(v & SYS_ADMIN == 0, "{}: {name} {v:#x}", path.display());
        }
        let eff = set(&status, "CapEff:")?;
        ensure!(eff & KEPT == KEPT, "{}: CapEff {eff:#x}", path.display());
        ensure!(
            status.lines().any(|l| l == "NoNewPrivs:\t1"),
            "{}: no no_new_privs",
            path.display()
        );
        threads += 1;
    }
    ensure!(
        threads > 1,
        "{threads} thread(s): the runtime's are missing"
    );
    // A few of the lab's 1 s passes (overlay, tables, policy, flows) after
    // the drop: none of them may need it.
    std::thread::sleep(Duration::from_secs(3));
    let log = std::fs::read_to_string(l.spec.node_dir(1).join("agent.log"))?;
    ensure!(!log.contains("os error 1)"), "EPERM after the drop:\n{log}");
    let metrics = l.metrics(1)?;
    ensure!(
        metrics.lines().any(|m| m == "mycni_datapath_ebpf 1"),
        "the fast path is not running: {}",
        l.readyz(1)?
    );
    Ok(())
}

#[test]
fn without_sys_admin_the_agent_runs() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let t = lab(1, 0)?;
    let l = &t.0;
    let cmdline = l.agent_cmdline(1).context("node 1's agent command line")?;
    l.stop_agent(1);
    let dir = l.spec.node_dir(1);
    let mut args: Vec<String> = vec![
        "--drop=cap_sys_admin".into(),
        "--".into(),
        "-c".into(),
        r#"exec "$0" "$@""#.into(),
    ];
    args.extend(cmdline);
    // In the lab's pid file, so the lab stops it when the test ends.
    mycni_lab::spawn_daemon(
        &l.spec.node_name(1),
        Path::new("capsh"),
        &args,
        &dir.join("agent.log"),
        &dir.join("agent.pid"),
    )?;
    let log = || std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    l.check_ready().with_context(log)?;
    let status = std::fs::read_to_string(format!("/proc/{}/status", agent_pid(l)?))?;
    ensure!(set(&status, "CapBnd:")? & SYS_ADMIN == 0, "capsh kept it");
    let ebpf = l.metrics(1)?.lines().any(|m| m == "mycni_datapath_ebpf 1");
    let ready = l.readyz(1)?;
    // The lab's first agent loaded nf_conntrack if it is a module.
    if Path::new("/sys/kernel/btf/nf_conntrack").exists() {
        ensure!(
            !ebpf && ready.contains("CAP_SYS_ADMIN"),
            "kfuncs in a module: the kernel path naming CAP_SYS_ADMIN expected: {ready}"
        );
    } else {
        ensure!(
            ebpf,
            "kfuncs in vmlinux: the fast path expected: {ready}\n{}",
            log()
        );
    }
    Ok(())
}
