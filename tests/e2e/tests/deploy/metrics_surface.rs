//! The agent's `/metrics` surface as a checked interface (issue 40): the
//! metric names, their label sets and their HELP and TYPE lines, on the
//! eBPF fast path, on the kernel path and with `--network-policy=false`,
//! compared with golden files under `tests/e2e/golden/`. A refactor of the
//! agent that means to change no behaviour must leave them as they are.
//!
//! One lab (2 dual-stack nodes, 1 pod each) serves all three: it comes up
//! on the fast path, then its agents restart on the kernel path, then on
//! the fast path without NetworkPolicy. Each scrape is the union of both
//! nodes', normalized (see [`normalize`]): HELP and TYPE lines verbatim;
//! each sample as its name and label set, values of labels that vary run
//! to run replaced by [`VARIES`]; sample values dropped; sorted, deduped.
//! Each configuration is read once it holds still (see [`settled`]); the
//! lab is quiet (no NetworkPolicy, no traffic of its own), so the series
//! that only events bring (per-policy series, rejected peers) are absent
//! every run. The whole test takes about 16 s.
//!
//! The golden files were made on the commit before the issue-40 refactor,
//! on a kernel with BTF where the eBPF programs load: a kernel where they
//! do not would serve the kernel path's surface under the ebpf name (the
//! test refuses to run then: `check_datapath`).
//!
//! Re-bless (after a change to the surface that is meant):
//!
//! ```text
//! MYCNI_BLESS=1 flock /tmp/mycni-e2e.lock \
//!   cargo +1.98.0 test -p mycni-e2e --test deploy metrics_surface -- --nocapture
//! ```

use crate::common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use mycni_lab::{Lab, Stack};

/// What a varying label's value becomes.
const VARIES: &str = "<varies>";

/// Label keys whose values are a closed vocabulary spelled by the agent's
/// own code (enum names, fixed strings), the same every run: kept, so a
/// renamed or lost value shows as a difference. What the lab's scrapes
/// carry (all of them, every run):
const CLOSED: &[&str] = &[
    // Histogram buckets: the bucket layout is part of the interface.
    "le",
    // mycni_datapath_{packets,bytes}_total: the programs' path names
    // (mycni_common's counters), fast true/false, family ipv4/ipv6/other;
    // also mycni_antispoof_dropped_total's family.
    "path",
    "fast",
    "family",
    // mycni_datapath_entries: local/remote.
    "map",
    // mycni_netlink_op_duration_seconds: dump, fdb_set, route_del, ...
    "op",
    // mycni_flow_events_total, mycni_flow_kube_events_total: emitted,
    // lost, published, rate_limited, ...
    "outcome",
    // mycni_policy_drops_total: egress/ingress x denied/invalid/not_judged.
    "direction",
    "reason",
    // Keys of series that need an event the quiet lab has none of (so
    // no golden file has them); their values are fixed strings too:
    // mycni_policy_problems's kind (Pod, Namespace, NetworkPolicy),
    // mycni_policy_rejected_total's problem (`kind:problem`), and reason
    // again in mycni_rejected_peers and
    // mycni_flow_kernel_drops_unavailable_total.
    "kind",
    "problem",
];

/// Label keys whose values vary run to run or lab to lab: the objects a
/// cluster happens to have. Replaced by [`VARIES`]; the key stays. The
/// quiet lab's scrapes have none of them (the per-policy series need
/// NetworkPolicies, mycni_flow_pod_drops_total needs drops and is left out
/// anyway, see [`SOMETIMES`]), but a lab that meets them must not make the
/// surface depend on names.
const OPEN: &[&str] = &[
    // mycni_policy_{selected_pods,rule_packets_total,...}: the policy's
    // namespace and name, the rule's index in it; the pod's namespace and
    // name in mycni_flow_pod_drops_total.
    "namespace",
    "policy",
    "rule",
    "pod",
];

/// Families whose samples appear only after events that may or may not
/// happen in a quiet lab: their samples are left out (their HELP and TYPE
/// lines, always there, stay). mycni_flow_pod_drops_total gets a series
/// when the kernel drops a packet of a local pod (stray IPv6 multicast,
/// say), with the kernel's drop reason: neither its presence nor its
/// reasons are the same every run.
const SOMETIMES: &[&str] = &["mycni_flow_pod_drops_total"];

/// The scrape's surface: every `# HELP` and `# TYPE` line verbatim, every
/// sample as `name{k="v",...}` with its label keys sorted (a label set, not
/// a sequence), the values of [`OPEN`] keys replaced by [`VARIES`], the
/// sample value dropped, the samples of [`SOMETIMES`] families left out;
/// sorted and deduped. A label key in neither [`CLOSED`] nor [`OPEN`] is
/// an error: a new label must be classified.
fn normalize(scrape: &str) -> Result<BTreeSet<String>> {
    let mut out = BTreeSet::new();
    for line in scrape.lines() {
        let line = line.trim_end();
        if line.is_empty() {
            continue;
        }
        if line.starts_with("# HELP ") || line.starts_with("# TYPE ") {
            out.insert(line.to_string());
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let (name, labels) = sample(line).with_context(|| format!("not a sample: {line:?}"))?;
        if SOMETIMES.contains(&name) {
            continue;
        }
        if labels.is_empty() {
            out.insert(name.to_string());
            continue;
        }
        let mut kv = Vec::new();
        for (k, v) in labels {
            let v = if CLOSED.contains(&k.as_str()) {
                v
            } else if OPEN.contains(&k.as_str()) {
                VARIES.to_string()
            } else {
                bail!(
                    "label {k:?} (value {v:?}) of {name} is neither in CLOSED nor in OPEN in \
                     tests/e2e/tests/deploy/metrics_surface.rs: say whether its values vary run to run"
                );
            };
            kv.push(format!("{k}=\"{v}\""));
        }
        kv.sort();
        out.insert(format!("{name}{{{}}}", kv.join(",")));
    }
    Ok(out)
}

/// A text-format sample line's name and labels, each value as written
/// (escapes included, so it goes back between quotes as it came).
fn sample(line: &str) -> Result<(&str, Vec<(String, String)>)> {
    let end = line.find(['{', ' ']).context("no value")?;
    let name = &line[..end];
    ensure!(!name.is_empty(), "no name");
    let mut labels = Vec::new();
    if line[end..].starts_with('{') {
        let mut rest = &line[end + 1..];
        loop {
            rest = rest.trim_start_matches(',');
            if let Some(r) = rest.strip_prefix('}') {
                ensure!(r.starts_with(' '), "no value after the labels");
                break;
            }
            let (k, r) = rest.split_once("=\"").context("no key=\"")?;
            let mut v = String::new();
            let mut chars = r.char_indices();
            let close = loop {
                match chars.next() {
                    Some((_, '\\')) => {
                        let (_, c) = chars.next().context("a trailing backslash")?;
                        v.push('\\');
                        v.push(c);
                    }
                    Some((i, '"')) => break i,
                    Some((_, c)) => v.push(c),
                    None => bail!("an unterminated value"),
                }
            };
            labels.push((k.trim().to_string(), v));
            rest = &r[close + 1..];
        }
    }
    Ok((name, labels))
}

fn golden(config: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("golden/metrics-{config}.txt"))
}

fn blessing() -> bool {
    std::env::var("MYCNI_BLESS").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The union of every node's normalized scrape.
fn surface(l: &Lab) -> Result<BTreeSet<String>> {
    let mut all = BTreeSet::new();
    for i in 1..=l.spec.nodes {
        let raw = l.metrics(i)?;
        let body = raw
            .strip_prefix("HTTP/1.1 200 OK ")
            .with_context(|| format!("node {i} /metrics: {raw}"))?;
        all.extend(normalize(body)?);
    }
    Ok(all)
}

/// The value of the unlabelled sample `name` on node `i`.
fn value(l: &Lab, i: usize, name: &str) -> Result<f64> {
    let m = l.metrics(i)?;
    m.lines()
        .find_map(|x| x.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .with_context(|| format!("node {i}: no {name}"))
}

/// The surface once it holds still: every agent ready and past a few full
/// passes (1 s resync) since it started, then two readings 3 s apart that
/// agree (series that appear with the first passes, the policy room's and
/// the flows room's first rounds, have appeared by then).
fn settled(l: &Lab) -> Result<BTreeSet<String>> {
    for i in 1..=l.spec.nodes {
        common::wait_every(
            &format!("node {i} ready and 3 passes in"),
            Duration::from_secs(60),
            Duration::from_millis(250),
            || {
                Ok(value(l, i, "mycni_ready")? == 1.0
                    && value(l, i, "mycni_reconcile_runs_total")? >= 3.0)
            },
        )?;
    }
    let t0 = Instant::now();
    let mut last = surface(l)?;
    loop {
        std::thread::sleep(Duration::from_secs(3));
        let now = surface(l)?;
        if now == last {
            return Ok(now);
        }
        if t0.elapsed() > Duration::from_secs(60) {
            bail!(
                "the surface did not settle in 60 s; last change:\n{}",
                diff(&last, &now, "before", "after")
            );
        }
        last = now;
    }
}

/// `a` and `b` line by line: what only `a` has (`-`), what only `b` has (`+`).
fn diff(a: &BTreeSet<String>, b: &BTreeSet<String>, a_name: &str, b_name: &str) -> String {
    let mut s = format!("only in {a_name}:\n");
    for x in a.difference(b) {
        s.push_str(&format!("  - {x}\n"));
    }
    s.push_str(&format!("only in {b_name}:\n"));
    for x in b.difference(a) {
        s.push_str(&format!("  + {x}\n"));
    }
    s
}

/// Checks (or, blessing, writes) `config`'s golden file: the difference,
/// if any.
fn check(config: &str, got: &BTreeSet<String>) -> Result<Option<String>> {
    let path = golden(config);
    if blessing() {
        std::fs::create_dir_all(path.parent().context("golden dir")?)?;
        let mut text: String = got.iter().map(|l| format!("{l}\n")).collect();
        if text.is_empty() {
            text.push('\n');
        }
        std::fs::write(&path, text)?;
        eprintln!("blessed {} ({} lines)", path.display(), got.len());
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "reading {} (bless it: MYCNI_BLESS=1 ... --test deploy metrics_surface)",
            path.display()
        )
    })?;
    let want: BTreeSet<String> = text
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    Ok((want != *got).then(|| {
        format!(
            "{config}: /metrics differs from {}\n{}",
            path.display(),
            diff(
                &want,
                got,
                "the golden file (gone from the scrape)",
                "the scrape (new)"
            )
        )
    }))
}

#[test]
fn metrics_surface_matches_the_golden_files() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let t0 = Instant::now();
    let mut t = common::lab_stack(2, 1, Stack::Dual, &[])?;
    let l = &mut t.0;
    l.check_datapath("ebpf")
        .context("the golden ebpf surface needs the eBPF object (cargo xtask build-ebpf)")?;
    let mut wrong = Vec::new();
    let ebpf = settled(l)?;
    wrong.extend(check("ebpf", &ebpf)?);

    l.set_datapath("kernel")?;
    let kernel = settled(l)?;
    wrong.extend(check("kernel", &kernel)?);

    l.set_agent_flags(&[("--datapath", "ebpf"), ("--network-policy", "false")])?;
    let no_policy = settled(l)?;
    wrong.extend(check("no-policy", &no_policy)?);

    eprintln!("metrics surface: 3 configurations in {:?}", t0.elapsed());
    ensure!(
        wrong.is_empty(),
        "{}\nIf the change is meant, re-bless: MYCNI_BLESS=1 flock /tmp/mycni-e2e.lock \
         cargo +1.98.0 test -p mycni-e2e --test deploy metrics_surface -- --nocapture",
        wrong.join("\n")
    );
    Ok(())
}

#[test]
fn normalize_keeps_help_type_and_label_sets() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let scrape = "# HELP mycni_x Things.\n# TYPE mycni_x counter\n\
        mycni_x_total 3\n\
        mycni_h_bucket{le=\"0.5\"} 1\n\
        mycni_h_bucket{le=\"+Inf\"} 2\n\
        mycni_p{policy=\"deny-all\",namespace=\"x\",direction=\"ingress\"} 4\n\
        mycni_p{namespace=\"y\",direction=\"ingress\",policy=\"other\"} 0\n\
        mycni_flow_pod_drops_total{namespace=\"x\",pod=\"a\",direction=\"ingress\",reason=\"NO_SOCKET\"} 1\n";
    let got: Vec<String> = normalize(scrape)?.into_iter().collect();
    assert_eq!(
        got,
        [
            "# HELP mycni_x Things.",
            "# TYPE mycni_x counter",
            "mycni_h_bucket{le=\"+Inf\"}",
            "mycni_h_bucket{le=\"0.5\"}",
            "mycni_p{direction=\"ingress\",namespace=\"<varies>\",policy=\"<varies>\"}",
            "mycni_x_total",
        ]
    );
    assert!(normalize("mycni_y{unheard_of=\"1\"} 1\n").is_err());
    let (name, labels) = sample(r#"m{a="x\"y",b="z"} 1"#)?;
    assert_eq!(name, "m");
    assert_eq!(
        labels,
        [
            ("a".to_string(), "x\\\"y".to_string()),
            ("b".to_string(), "z".to_string())
        ]
    );
    Ok(())
}
