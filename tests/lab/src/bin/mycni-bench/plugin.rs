//! `mycni-bench plugin`: ADD and DEL latency of the mycni plugin (built-in
//! IPAM, and host-local delegation) against the reference ptp + host-local,
//! interleaved run by run so machine noise hits all alike.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use mycni_lab::stats::percentile_duration;
use mycni_testkit::NetNs;
use mycni_testkit::cni::REFERENCE_PLUGINS;
use serde_json::{Value, json};

struct Variant {
    label: &'static str,
    bin: PathBuf,
    conf: Value,
    add: Vec<Duration>,
    del: Vec<Duration>,
}

fn invoke(
    bin: &Path,
    cmd: &str,
    cid: &str,
    netns: &str,
    conf: &Value,
    cni_path: &str,
) -> Result<Duration> {
    let stdin = conf.to_string();
    let start = Instant::now();
    let mut child = Command::new(bin)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", cmd)
        .env("CNI_CONTAINERID", cid)
        .env("CNI_NETNS", netns)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", cni_path)
        .env(
            "CNI_ARGS",
            format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME={cid}"),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("spawn {}", bin.display()))?;
    if let Some(mut s) = child.stdin.take() {
        s.write_all(stdin.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    let took = start.elapsed();
    ensure!(
        out.status.success(),
        "{} {cmd}: {}{}",
        bin.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(took)
}

/// The p-th percentile in ms (see `mycni_lab::stats`).
fn ms_at(v: &[Duration], p: u32) -> f64 {
    percentile_duration(v, p).unwrap_or_default().as_secs_f64() * 1e3
}

pub fn bench(runs: usize, mycni: &Path, base: Option<&Path>) -> Result<()> {
    let node = NetNs::new("bench")?;
    let dir = tempfile::Builder::new().prefix("mycni-bench-").tempdir()?;
    // This process is the "runtime": it lives in the node namespace, so the
    // plugins' host side is the node and nothing touches the real host.
    let f = std::fs::File::open(node.path())?;
    // SAFETY: single-threaded at this point; setns on the main thread is intended.
    if unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&f), libc::CLONE_NEWNET) } != 0 {
        bail!("setns: {}", std::io::Error::last_os_error());
    }
    let d = dir.path();
    let log = d.join("plugin.log");
    let mut variants = vec![
        Variant {
            label: "mycni + built-in IPAM",
            bin: mycni.to_path_buf(),
            conf: json!({"cniVersion": "1.0.0", "name": "benchA", "type": "mycni", "logFile": log,
                "ipam": {"type": "mycni-ipam", "subnet": "10.201.0.0/16", "dataDir": d.join("a")}}),
            add: vec![],
            del: vec![],
        },
        Variant {
            label: "mycni + host-local",
            bin: mycni.to_path_buf(),
            conf: json!({"cniVersion": "1.0.0", "name": "benchB", "type": "mycni", "logFile": log,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.202.0.0/16"}]], "dataDir": d.join("b")}}),
            add: vec![],
            del: vec![],
        },
        Variant {
            label: "ptp + host-local (reference)",
            bin: Path::new(REFERENCE_PLUGINS).join("ptp"),
            conf: json!({"cniVersion": "1.0.0", "name": "benchC", "type": "ptp", "mtu": 1450,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.203.0.0/16"}]], "dataDir": d.join("c")}}),
            add: vec![],
            del: vec![],
        },
    ];
    // The reference stays third: the ratios below are against it.
    if let Some(base) = base {
        for (label, ipam) in [
            (
                "base mycni + built-in IPAM",
                json!({"type": "mycni-ipam", "subnet": "10.204.0.0/16", "dataDir": d.join("d")}),
            ),
            (
                "base mycni + host-local",
                json!({"type": "host-local", "ranges": [[{"subnet": "10.205.0.0/16"}]], "dataDir": d.join("e")}),
            ),
        ] {
            variants.push(Variant {
                label,
                bin: base.to_path_buf(),
                conf: json!({"cniVersion": "1.0.0", "name": format!("bench{}", variants.len()), "type": "mycni", "logFile": log, "ipam": ipam}),
                add: vec![],
                del: vec![],
            });
        }
    }
    // Warm caches (page cache of the binaries) before measuring.
    for i in 0..runs + 3 {
        for v in variants.iter_mut() {
            let pod = NetNs::new("bp")?;
            let p = pod.path().to_string_lossy().into_owned();
            let cid = format!("bench{i}");
            let add = invoke(&v.bin, "ADD", &cid, &p, &v.conf, REFERENCE_PLUGINS)?;
            let del = invoke(&v.bin, "DEL", &cid, &p, &v.conf, REFERENCE_PLUGINS)?;
            if i >= 3 {
                v.add.push(add);
                v.del.push(del);
            }
        }
    }
    println!("CNI plugin ADD/DEL, {runs} interleaved runs each, sequential, 2-core machine");
    if let Some(base) = base {
        println!("base build: {}", base.display());
    }
    println!("| variant | ADD median ms | ADD p90 ms | DEL median ms | DEL p90 ms |");
    println!("|---|---|---|---|---|");
    let mut med = Vec::new();
    for v in &variants {
        let (am, ap, dm, dp) = (
            ms_at(&v.add, 50),
            ms_at(&v.add, 90),
            ms_at(&v.del, 50),
            ms_at(&v.del, 90),
        );
        println!("| {} | {am:.2} | {ap:.2} | {dm:.2} | {dp:.2} |", v.label);
        med.push((am, dm));
    }
    let (ptp_add, ptp_del) = med[2];
    println!();
    println!("ratios against ptp + host-local (higher = mycni faster):");
    for (i, v) in variants.iter().enumerate().filter(|(i, _)| *i != 2) {
        println!(
            "  {}: ADD {:.1}x, DEL {:.1}x",
            v.label,
            ptp_add / med[i].0,
            ptp_del / med[i].1
        );
    }
    Ok(())
}
