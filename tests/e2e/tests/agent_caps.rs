//! The agent with one capability removed at a time (capsh drops it from the
//! bounding set, so even root cannot have it): it must stop at once and name
//! the missing capability, before touching the API or the kernel.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

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
