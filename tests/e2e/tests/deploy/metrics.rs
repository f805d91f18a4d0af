//! The agent's metrics endpoint as Prometheus sees it, and the monitoring
//! under deploy/monitoring/ checked against it: the real agent's scrape must
//! pass `promtool check metrics`, the alerting rules `promtool check rules`
//! and their unit tests, and the alerts and the Grafana dashboard may only
//! query metrics that a real scrape declares.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use mycni_lab::{Lab, METRICS_PORT, node_ip};
use mycni_testkit::in_netns;
use serde_json::Value;

use crate::common;
use common::lab;

fn monitoring() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/monitoring")
}

/// `promtool` with `args`, `stdin` fed in; its combined output, or an error
/// with that output when it exits non-zero.
fn promtool(args: &[&str], stdin: &str) -> Result<String> {
    let mut child = Command::new("promtool")
        .args(args)
        .current_dir(monitoring())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running promtool (Debian package prometheus; `cargo xtask setup` installs it)")?;
    child
        .stdin
        .take()
        .context("promtool's stdin")?
        .write_all(stdin.as_bytes())?;
    let out = child.wait_with_output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        out.status.success(),
        "promtool {args:?}: {}\n{text}",
        out.status
    );
    Ok(text)
}

/// One HTTP/1.1 GET to node `i`'s metrics port from the underlay:
/// (status code, content type, body).
fn get(l: &Lab, i: usize, path: &str, accept: Option<&str>) -> Result<(u16, String, String)> {
    let addr = SocketAddr::from((node_ip(i), METRICS_PORT));
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(a) = accept {
        req.push_str(&format!("Accept: {a}\r\n"));
    }
    req.push_str("\r\n");
    let raw = in_netns(&l.spec.underlay_ns(), || -> Result<String> {
        let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        c.set_read_timeout(Some(Duration::from_secs(5)))?;
        c.write_all(req.as_bytes())?;
        let mut s = String::new();
        c.read_to_string(&mut s)?;
        Ok(s)
    })??;
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .with_context(|| format!("no end of headers in {raw:?}"))?;
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("no status in {head:?}"))?;
    let mut content_type = String::new();
    for l in lines {
        let (k, v) = l.split_once(':').unwrap_or((l, ""));
        ensure!(
            !(k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked")),
            "chunked answer; this client reads plain bodies only: {head}"
        );
        if k.eq_ignore_ascii_case("content-type") {
            content_type = v.trim().to_string();
        }
    }
    Ok((status, content_type, body.to_string()))
}

/// Every series name a scrape in the 0.0.4 text format declares: the
/// families' TYPE lines (a histogram's as its _bucket, _sum and _count) and
/// the samples' names. A family declared without samples counts: the
/// datapath counters, say, have none while a node runs the kernel path.
fn exposed(scrape: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in scrape.lines() {
        if let Some(t) = line.strip_prefix("# TYPE ") {
            let mut it = t.split_whitespace();
            if let (Some(name), Some(kind)) = (it.next(), it.next()) {
                names.insert(name.to_string());
                if matches!(kind, "histogram" | "summary") {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        names.insert(format!("{name}{suffix}"));
                    }
                }
            }
        } else if !line.starts_with('#') {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            if end > 0 {
                names.insert(line[..end].to_string());
            }
        }
    }
    names
}

/// The agent's metric names a PromQL expression uses (recording rules'
/// `level:metric:ops` names contain colons and are not the agent's).
fn queried(expr: &str) -> BTreeSet<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| w.starts_with("mycni_"))
        .map(str::to_string)
        .collect()
}

fn yaml(name: &str) -> Result<Value> {
    let path = monitoring().join(name);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_norway::from_str(&text).with_context(|| format!("{name}: not YAML"))
}

fn dashboard() -> Result<Value> {
    let path = monitoring().join("grafana-dashboard.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).context("grafana-dashboard.json: not JSON")
}

/// Every `expr` of every panel (rows nest theirs under `panels`), with the
/// panel's title.
fn dashboard_exprs(d: &Value) -> Vec<(String, String)> {
    fn walk(panels: &[Value], out: &mut Vec<(String, String)>) {
        for p in panels {
            let title = p["title"].as_str().unwrap_or("").to_string();
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(e) = t["expr"].as_str() {
                    out.push((title.clone(), e.to_string()));
                }
            }
            walk(p["panels"].as_array().map_or(&[], Vec::as_slice), out);
        }
    }
    let mut out = Vec::new();
    walk(d["panels"].as_array().map_or(&[], Vec::as_slice), &mut out);
    out
}

fn alert_exprs(rules: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for g in rules["groups"].as_array().into_iter().flatten() {
        for r in g["rules"].as_array().into_iter().flatten() {
            let name = r["alert"].as_str().or(r["record"].as_str()).unwrap_or("");
            if let Some(e) = r["expr"].as_str() {
                out.push((name.to_string(), e.to_string()));
            }
        }
    }
    out
}

#[test]
fn real_scrape_passes_promtool_and_backs_every_alert_and_panel() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let t = lab(2, 0)?;
    let l = &t.0;
    let start = Instant::now();
    let scrape = loop {
        let (code, content_type, body) = get(l, 1, "/metrics", None)?;
        ensure!(code == 200, "/metrics: {code} {body}");
        ensure!(
            content_type.starts_with("text/plain; version=0.0.4"),
            "no Accept header must get the 0.0.4 text format, got {content_type:?}"
        );
        if body.lines().any(|x| x == "mycni_ready 1") {
            break body;
        }
        if start.elapsed() > Duration::from_secs(30) {
            bail!("node 1 not ready within 30 s:\n{body}");
        }
        std::thread::sleep(Duration::from_millis(200));
    };

    // promtool parses and lints the 0.0.4 format; lint findings (names,
    // units, help) fail it too.
    promtool(&["check", "metrics"], &scrape)?;
    // The reconcile loop feeds the histograms: the first pass applied the
    // initial Node list, dumped the overlay and programmed the peer's FDB entry.
    for series in [
        "mycni_reconcile_duration_seconds_count",
        "mycni_node_event_to_kernel_seconds_count",
        "mycni_netlink_op_duration_seconds_count{op=\"dump\"}",
        "mycni_netlink_op_duration_seconds_count{op=\"fdb_set\"}",
    ] {
        let n = scrape.lines().find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .parse::<f64>()
                .ok()
        });
        ensure!(
            n.is_some_and(|n| n >= 1.0),
            "{series} is {n:?}, want >= 1:\n{scrape}"
        );
    }
    for line in [
        "mycni_peers_programmed 1",
        "# TYPE mycni_reconcile_duration_seconds histogram",
        "# TYPE mycni_node_event_to_kernel_seconds histogram",
        "# TYPE mycni_netlink_op_duration_seconds histogram",
        "# TYPE mycni_datapath_packets_total counter",
    ] {
        ensure!(
            scrape.lines().any(|x| x == line),
            "no {line:?} in\n{scrape}"
        );
    }

    datapath_series_have_a_family(&scrape)?;

    // What Prometheus asks for: OpenMetrics, which promtool cannot check;
    // its framing and counter naming are checked here.
    let prometheus_accept = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    let (code, content_type, om) = get(l, 1, "/metrics", Some(prometheus_accept))?;
    ensure!(code == 200, "/metrics (OpenMetrics): {code} {om}");
    ensure!(
        content_type.starts_with("application/openmetrics-text; version=1.0.0"),
        "{content_type:?}"
    );
    ensure!(om.ends_with("# EOF\n"), "no EOF at the end:\n{om}");
    ensure!(
        om.lines()
            .any(|x| x == "# TYPE mycni_reconcile_runs counter")
            && om
                .lines()
                .any(|x| x.starts_with("mycni_reconcile_runs_total ")),
        "{om}"
    );
    ensure!(
        om.lines()
            .any(|x| x == "# UNIT mycni_reconcile_duration_seconds seconds"),
        "{om}"
    );

    // The other paths keep their answers.
    let (code, _, body) = get(l, 1, "/healthz", None)?;
    ensure!(
        (code, body.as_str()) == (200, "ok\n"),
        "/healthz: {code} {body}"
    );
    let (code, _, body) = get(l, 1, "/readyz", None)?;
    ensure!(
        code == 200 && body.starts_with("ready: "),
        "/readyz: {code} {body}"
    );
    let (code, _, _) = get(l, 1, "/nothing", None)?;
    ensure!(code == 404, "/nothing: {code}");

    let names = exposed(&scrape);
    let mut unknown = Vec::new();
    let rules = yaml("alerts.yaml")?;
    let d = dashboard()?;
    for (what, expr) in alert_exprs(&rules)
        .into_iter()
        .map(|(n, e)| (format!("alerts.yaml {n}"), e))
        .chain(
            dashboard_exprs(&d)
                .into_iter()
                .map(|(n, e)| (format!("dashboard panel {n:?}"), e)),
        )
    {
        for m in queried(&expr) {
            if !names.contains(&m) {
                unknown.push(format!("{what}: {m}"));
            }
        }
    }
    ensure!(
        unknown.is_empty(),
        "queried but not exposed by the agent: {unknown:#?}\nexposed: {names:#?}"
    );
    Ok(())
}

/// The per-path datapath counters of an eBPF agent: one series per path
/// and address family, `family` last; the scrapes themselves reach the
/// node over the underlay as IPv4, so that row moves.
fn datapath_series_have_a_family(scrape: &str) -> Result<()> {
    ensure!(
        scrape.lines().any(|l| l == "mycni_datapath_ebpf 1"),
        "the lab's agent does not run the eBPF datapath:\n{scrape}"
    );
    for metric in ["mycni_datapath_packets_total", "mycni_datapath_bytes_total"] {
        let mut seen = BTreeSet::new();
        for line in scrape.lines() {
            let Some(rest) = line.strip_prefix(metric).and_then(|r| r.strip_prefix('{')) else {
                continue;
            };
            let (labels, _) = rest.split_once("} ").context("no value")?;
            let (path, family) = labels
                .strip_prefix("path=\"")
                .and_then(|r| Some((r.split('"').next()?, r.rsplit_once(",family=\"")?.1)))
                .with_context(|| format!("{line}: not path=...,fast=...,family=..."))?;
            let family = family.strip_suffix('"').unwrap_or(family);
            ensure!(
                ["ipv4", "ipv6", "other"].contains(&family),
                "{line}: family {family:?}"
            );
            ensure!(
                seen.insert((path.to_string(), family.to_string())),
                "{line}: twice"
            );
        }
        ensure!(
            seen.len() == mycni_common::COUNTERS_LEN as usize,
            "{metric}: {} series, want one per path and family:\n{seen:?}",
            seen.len()
        );
    }
    let underlay_v4 = scrape.lines().find_map(|l| {
        l.strip_prefix(
            "mycni_datapath_packets_total{path=\"kernel_underlay_other\",fast=\"false\",family=\"ipv4\"} ",
        )?
        .parse::<u64>()
        .ok()
    });
    ensure!(
        underlay_v4.is_some_and(|n| n > 0),
        "no IPv4 counted on the underlay: {underlay_v4:?}"
    );
    Ok(())
}

#[test]
fn alert_rules_pass_promtool_check_and_their_unit_tests() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let out = promtool(&["check", "rules", "alerts.yaml"], "")?;
    ensure!(out.contains("SUCCESS"), "{out}");
    let out = promtool(&["test", "rules", "alerts_test.yaml"], "")?;
    ensure!(out.contains("SUCCESS"), "{out}");
    // The unit tests cover these alerts at least.
    let tests = std::fs::read_to_string(monitoring().join("alerts_test.yaml"))?;
    for alert in [
        "MycniAgentNotReady",
        "MycniFastShareDropping",
        "MycniRejectedPeers",
        "MycniEbpfLoadFailed",
    ] {
        ensure!(
            tests.contains(&format!("alertname: {alert}")),
            "alerts_test.yaml does not test {alert}"
        );
    }
    Ok(())
}

#[test]
fn prometheusrule_carries_exactly_the_checked_rules() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let plain = yaml("alerts.yaml")?;
    let wrapped = yaml("prometheusrule.yaml")?;
    ensure!(
        wrapped["apiVersion"] == "monitoring.coreos.com/v1" && wrapped["kind"] == "PrometheusRule",
        "prometheusrule.yaml: {wrapped}"
    );
    ensure!(
        wrapped["spec"]["groups"] == plain["groups"],
        "prometheusrule.yaml's spec.groups differ from alerts.yaml's groups (alerts.yaml is the one promtool checks: copy it over)"
    );
    let alerts: BTreeSet<&str> = plain["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .filter_map(|r| r["alert"].as_str())
        .collect();
    for want in [
        "MycniAgentNotReady",
        "MycniReconcileErrors",
        "MycniFastShareDropping",
        "MycniRejectedPeers",
        "MycniEbpfLoadFailed",
    ] {
        ensure!(alerts.contains(want), "no alert {want} in {alerts:?}");
    }
    Ok(())
}

#[test]
fn dashboard_has_the_panels_the_issue_asks_for() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let d = dashboard()?;
    ensure!(
        d["title"].as_str().is_some_and(|t| !t.is_empty()),
        "no title"
    );
    let exprs = dashboard_exprs(&d);
    let uses = |needle: &str| exprs.iter().any(|(_, e)| e.contains(needle));
    for (what, needle) in [
        ("fast share", "fast=\"true\""),
        ("packets by path", "by (path)"),
        ("reconcile p50", "histogram_quantile(0.5, "),
        ("reconcile p99", "histogram_quantile(0.99, "),
        (
            "reconcile duration",
            "mycni_reconcile_duration_seconds_bucket",
        ),
        (
            "event-to-kernel latency",
            "mycni_node_event_to_kernel_seconds_bucket",
        ),
        ("rejected peers", "mycni_rejected_peers"),
        (
            "netlink op latency",
            "mycni_netlink_op_duration_seconds_bucket",
        ),
        ("readiness", "mycni_ready"),
    ] {
        ensure!(
            uses(needle),
            "no panel for {what} (no query with {needle:?})"
        );
    }
    // promtool parses PromQL only inside rule files: each query, with
    // Grafana's variables replaced by what they stand for, as a recording
    // rule.
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, (_, e)) in exprs.iter().enumerate() {
        let e = e
            .replace("$__rate_interval", "5m")
            .replace("$instance", ".*");
        rules.push_str(&format!(
            "      - record: dashboard:query{i}\n        expr: {}\n",
            serde_json::to_string(&e)?
        ));
    }
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("dashboard-rules.yaml");
    std::fs::write(&file, rules)?;
    let out = promtool(&["check", "rules", &file.to_string_lossy()], "")
        .context("a dashboard query is not valid PromQL")?;
    ensure!(out.contains("SUCCESS"), "{out}");
    Ok(())
}
