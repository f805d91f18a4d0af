//! `mycni-bench plugin`: ADD and DEL latency of the mycni plugin (built-in
//! IPAM, and host-local delegation in the config's version and in 1.1.0,
//! which host-local does not speak) against the reference ptp +
//! host-local, interleaved run by run so machine noise hits all alike.

use std::fmt::Write as _;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use mycni_lab::chart::{Bar, Chart, Kind, Panel, Reference};
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

/// One run of variant `v`'s plugin, as the runtime runs it for pod `cid`
/// in `netns`, with the reference plugins as its CNI_PATH.
fn invoke(v: &Variant, cmd: &str, cid: &str, netns: &str) -> Result<Duration> {
    let (bin, cni_path) = (&v.bin, REFERENCE_PLUGINS);
    let stdin = v.conf.to_string();
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

pub fn bench(runs: usize, mycni: &Path, base: Option<&Path>, out: Option<&Path>) -> Result<()> {
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
    // mycni's state (pod records, what a delegated IPAM speaks) beside the
    // ready file it is told of: here, not the host's /run/mycni.
    let ready = d.join("ready");
    let mycni_conf = |version: &str, name: &str, ipam: Value| {
        json!({"cniVersion": version, "name": name, "type": "mycni", "logFile": log,
            "readyFile": ready, "ipam": ipam})
    };
    let variant = |label, bin: &Path, conf| Variant {
        label,
        bin: bin.to_path_buf(),
        conf,
        add: vec![],
        del: vec![],
    };
    let host_local = |subnet: &str, dir: &str| json!({"type": "host-local", "ranges": [[{"subnet": subnet}]], "dataDir": d.join(dir)});
    let mut variants = vec![
        variant(
            "mycni + built-in IPAM",
            mycni,
            mycni_conf(
                "1.0.0",
                "benchA",
                json!({"type": "mycni-ipam", "subnet": "10.201.0.0/16", "dataDir": d.join("a")}),
            ),
        ),
        variant(
            "mycni + host-local",
            mycni,
            mycni_conf("1.0.0", "benchB", host_local("10.202.0.0/16", "b")),
        ),
        variant(
            "ptp + host-local (reference)",
            &Path::new(REFERENCE_PLUGINS).join("ptp"),
            json!({"cniVersion": "1.0.0", "name": "benchC", "type": "ptp", "mtu": 1450,
                "ipam": host_local("10.203.0.0/16", "c")}),
        ),
        // What containerd 2 runs: the conflist's newest version, 1.1.0,
        // newer than Debian's host-local speaks (1.0.0). ptp refuses it.
        variant(
            "mycni + host-local, cniVersion 1.1.0",
            mycni,
            mycni_conf("1.1.0", "benchF", host_local("10.206.0.0/16", "f")),
        ),
    ];
    // The reference stays third: the report's ratios are against it.
    if let Some(base) = base {
        variants.extend([
            variant(
                "base mycni + built-in IPAM",
                base,
                mycni_conf(
                    "1.0.0",
                    "benchD",
                    json!({"type": "mycni-ipam", "subnet": "10.204.0.0/16", "dataDir": d.join("d")}),
                ),
            ),
            variant(
                "base mycni + host-local",
                base,
                mycni_conf("1.0.0", "benchE", host_local("10.205.0.0/16", "e")),
            ),
            variant(
                "base mycni + host-local, cniVersion 1.1.0",
                base,
                mycni_conf("1.1.0", "benchG", host_local("10.207.0.0/16", "g")),
            ),
        ]);
    }
    // Warm caches (page cache of the binaries) before measuring.
    // Every pod's namespace lives until the last run: the kernel tears a
    // deleted namespace down in the background, holding the RTNL lock for
    // milliseconds, and a namespace deleted right before an ADD made that
    // ADD wait for it (the veth's creation, 0.6 ms, took 3.5 ms in traces),
    // at random for whichever variant came next. An empty namespace holds
    // about 130 KiB: 100 runs of 7 variants, under 100 MiB.
    let mut pods = Vec::with_capacity((runs + 3) * variants.len());
    for i in 0..runs + 3 {
        for v in variants.iter_mut() {
            let pod = NetNs::new("bp")?;
            let p = pod.path().to_string_lossy().into_owned();
            let cid = format!("bench{i}");
            let add = invoke(v, "ADD", &cid, &p)?;
            let del = invoke(v, "DEL", &cid, &p)?;
            if i >= 3 {
                v.add.push(add);
                v.del.push(del);
            }
            pods.push(pod);
        }
    }
    drop(pods);
    let report = Report {
        runs,
        base: base.map(|b| b.display().to_string()),
        rows: variants
            .iter()
            .map(|v| Row {
                label: v.label.into(),
                add_ms: ms_at(&v.add, 50),
                add_p90_ms: ms_at(&v.add, 90),
                del_ms: ms_at(&v.del, 50),
                del_p90_ms: ms_at(&v.del, 90),
            })
            .collect(),
    };
    let text = report.text();
    print!("{text}");
    if let Some(out) = out {
        std::fs::write(out, &text).with_context(|| format!("writing {}", out.display()))?;
        eprintln!("bench: wrote {}", out.display());
        let caption = vec![
            format!(
                "cargo xtask bench plugin: medians of {runs} interleaved ADD/DEL runs per variant; \
                 blue: mycni, grey: the reference."
            ),
            format!(
                "Measured {} on {}.",
                mycni_lab::chart::today(),
                mycni_lab::chart::machine()
            ),
        ];
        mycni_lab::chart::write_beside(out, &report.chart(caption))?;
    }
    Ok(())
}

/// One variant's figures, in ms.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub label: String,
    pub add_ms: f64,
    pub add_p90_ms: f64,
    pub del_ms: f64,
    pub del_p90_ms: f64,
}

/// The bench's report: every variant's figures, the reference third.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub runs: usize,
    /// The base build's path, when one ran interleaved.
    pub base: Option<String>,
    pub rows: Vec<Row>,
}

/// The reference's place in [`Report::rows`].
const REFERENCE: usize = 2;

impl Report {
    fn reference(&self) -> Option<&Row> {
        self.rows.get(REFERENCE)
    }

    /// The markdown table and the ratios against the reference.
    pub fn text(&self) -> String {
        let mut w = String::new();
        let _ = writeln!(
            w,
            "CNI plugin ADD/DEL, {} interleaved runs each, sequential, 2-core machine",
            self.runs
        );
        if let Some(base) = &self.base {
            let _ = writeln!(w, "base build: {base}");
        }
        let _ = writeln!(
            w,
            "| variant | ADD median ms | ADD p90 ms | DEL median ms | DEL p90 ms |"
        );
        let _ = writeln!(w, "|---|---|---|---|---|");
        for r in &self.rows {
            let _ = writeln!(
                w,
                "| {} | {:.2} | {:.2} | {:.2} | {:.2} |",
                r.label, r.add_ms, r.add_p90_ms, r.del_ms, r.del_p90_ms
            );
        }
        let Some(reference) = self.reference() else {
            return w;
        };
        let _ = writeln!(w);
        let _ = writeln!(
            w,
            "ratios against {} (higher = mycni faster):",
            reference.label
        );
        for (_, r) in self
            .rows
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != REFERENCE)
        {
            let _ = writeln!(
                w,
                "  {}: ADD {:.1}x, DEL {:.1}x",
                r.label,
                reference.add_ms / r.add_ms,
                reference.del_ms / r.del_ms
            );
        }
        w
    }

    /// ADD and DEL medians as bars, the reference's as the line.
    pub fn chart(&self, caption: Vec<String>) -> Chart {
        let panel = |title: &str, get: fn(&Row) -> f64| Panel {
            title: title.into(),
            bars: self
                .rows
                .iter()
                .enumerate()
                .map(|(i, r)| Bar {
                    label: r.label.clone(),
                    value: get(r),
                    range: None,
                    kind: if i == REFERENCE {
                        Kind::Baseline
                    } else {
                        Kind::Mycni
                    },
                })
                .collect(),
            reference: self.reference().map(|r| Reference {
                label: r.label.clone(),
                value: get(r),
            }),
        };
        Chart {
            title: "CNI plugin: ADD and DEL latency against ptp + host-local".into(),
            caption,
            panels: vec![
                panel("ADD median (ms): lower is better", |r| r.add_ms),
                panel("DEL median (ms): lower is better", |r| r.del_ms),
            ],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The figures of the README's plugin bench (2026-11-21, 200 runs):
    /// ADD 3.8 ms against ptp's 12.5, DEL 24.8 against 38.5; host-local
    /// delegated 11.0 against 10.7 (a 3-run check; DEL not published).
    pub(crate) fn published() -> Report {
        let row = |label: &str, add_ms, del_ms| Row {
            label: label.into(),
            add_ms,
            add_p90_ms: f64::NAN,
            del_ms,
            del_p90_ms: f64::NAN,
        };
        Report {
            runs: 200,
            base: None,
            rows: vec![
                row("mycni + built-in IPAM", 3.8, 24.8),
                row("mycni + host-local", 11.0, f64::NAN),
                row("ptp + host-local (reference)", 12.5, 38.5),
            ],
        }
    }

    fn caption() -> Vec<String> {
        vec![
            "cargo xtask bench plugin, 2026-11-21: medians of 200 interleaved ADD/DEL runs \
             (mycni + host-local: 10.7 ms for the reference in a 3-run check of its own, DEL \
             not published); blue: mycni, grey: the reference."
                .into(),
            "Measured on this project's VM: 2 vCPUs (AMD EPYC), Linux 6.18, Debian 12.".into(),
        ]
    }

    #[test]
    fn the_text_has_every_variant_and_the_ratios() {
        let text = published().text();
        assert!(text.contains("| mycni + built-in IPAM | 3.80 |"), "{text}");
        assert!(text.contains("ratios against ptp + host-local (reference)"));
        assert!(
            text.contains("mycni + built-in IPAM: ADD 3.3x, DEL 1.6x"),
            "{text}"
        );
    }

    #[test]
    fn the_chart_has_both_verbs_and_the_reference_line() {
        let wanted = [
            "ADD median (ms): lower is better",
            "DEL median (ms): lower is better",
            "mycni + built-in IPAM",
            "ptp + host-local (reference) 12.5",
            "3.8",
        ];
        match mycni_lab::chart::missing_texts(&published().chart(caption()), &wanted) {
            Ok(m) => assert!(m.is_empty(), "not in the chart: {m:?}"),
            Err(e) => panic!("{e:#}"),
        }
    }

    /// Writes the chart `docs/benchmarks.md` shows (see
    /// `labbench/report/published.rs` for the command).
    #[test]
    #[ignore = "writes docs/benchmarks/plugin.svg"]
    fn published_charts_plugin() {
        if let Err(e) = mycni_lab::chart::write_published("plugin", &published().chart(caption())) {
            panic!("{e:#}");
        }
    }
}
