//! `mycni-agent inspect policy <ns>/<pod>` and the policy room's counters
//! on the model lab, against upstream truth-table cases: once a case's
//! tables have settled, inspect on x/a's node names the policies selecting
//! and isolating x/a and the rules it compiled (peers and ports), and the
//! counters it shows (per rule, and what no rule admitted) move when the
//! probes send traffic again; the node's scrape carries the same counts
//! per policy and passes `promtool check metrics`.

use crate::common;

use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use mycni_agent::policy::inspect::PodReport;
use mycni_lab::netpol::cases::upstream;
use mycni_lab::netpol::{Action, Case, ProbeSet, Reach};
use mycni_lab::{Lab, pod_label};

/// What inspect must show for x/a once a case has settled.
struct Want {
    case: &'static str,
    selected_by: &'static [&'static str],
    ingress_by: &'static [&'static str],
    egress_by: &'static [&'static str],
    /// (policy, direction, index, a port text it admits): the rule must
    /// be listed and its counter move with the probes.
    rule: Option<(&'static str, &'static str, usize, &'static str)>,
    /// A direction whose denial counter must move with the probes.
    denied: Option<&'static str>,
}

const WANTS: [Want; 4] = [
    Want {
        case: "3 deny-ingress plus allow-all for x/a (union)",
        selected_by: &["x/allow-a", "x/deny-ingress"],
        ingress_by: &["x/allow-a", "x/deny-ingress"],
        egress_by: &[],
        rule: Some(("x/allow-a", "ingress", 0, "any protocol and port")),
        denied: None,
    },
    Want {
        case: "4 x/a from pod=b",
        selected_by: &["x/x-a-from-b"],
        ingress_by: &["x/x-a-from-b"],
        egress_by: &[],
        rule: Some(("x/x-a-from-b", "ingress", 0, "any protocol and port")),
        denied: Some("ingress"),
    },
    Want {
        case: "11 x/a from ns=y on TCP 81 only",
        selected_by: &["x/y-81"],
        ingress_by: &["x/y-81"],
        egress_by: &[],
        rule: Some(("x/y-81", "ingress", 0, "TCP 81")),
        denied: Some("ingress"),
    },
    Want {
        case: "21 x/a egress deny-all (others still reach x/a)",
        selected_by: &["x/no-egress"],
        ingress_by: &[],
        egress_by: &["x/no-egress"],
        rule: None,
        denied: Some("egress"),
    },
];

/// `mycni-agent inspect policy <pod> [--json]` run on node `node` against
/// its agent, as an operator on the node would.
fn inspect(l: &Lab, node: usize, pod: &str, json: bool) -> Result<String> {
    let agent = l.spec.metrics_socket(node).to_string();
    let bin = l.spec.bins.agent.to_string_lossy().into_owned();
    let mut args = vec![
        "netns",
        "exec",
        &l.spec.node_name(node),
        &bin,
        "inspect",
        "policy",
        pod,
        "--agent",
        &agent,
    ]
    .into_iter()
    .map(str::to_string)
    .collect::<Vec<_>>();
    if json {
        args.push("--json".into());
    }
    let out = Command::new("ip").args(&args).output()?;
    ensure!(
        out.status.success(),
        "inspect policy {pod}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn report(l: &Lab, node: usize) -> Result<PodReport> {
    serde_json::from_str(&inspect(l, node, "x/a", true)?).context("inspect --json: no report")
}

/// Packets counted under `policy`'s rule `index` of `direction`.
fn rule_packets(r: &PodReport, policy: &str, direction: &str, index: usize) -> Option<u64> {
    let d = if direction == "ingress" {
        &r.ingress
    } else {
        &r.egress
    };
    d.rules
        .iter()
        .find(|x| x.policy == policy && x.index == index)
        .map(|x| x.count.packets)
}

fn denied_packets(r: &PodReport, direction: &str) -> u64 {
    let d = if direction == "ingress" {
        &r.ingress
    } else {
        &r.egress
    };
    d.denied.as_ref().map_or(0, |c| c.packets)
}

/// The value of the scrape's sample `series` (name and labels as printed).
fn sample(scrape: &str, series: &str) -> Option<f64> {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn settled(l: &Lab, set: &ProbeSet, expect: Reach, what: &str) -> Result<()> {
    let r = l.settle(set, &expect.into(), Instant::now(), what)?;
    ensure!(r.settled.is_some(), "{what}: not settled\n{}", r.line());
    Ok(())
}

/// Applies `case`'s one step and waits for its tables; then checks what
/// inspect says against `want`; then deletes its policies and waits for
/// everything open.
fn check_case(l: &Lab, set: &ProbeSet, node: usize, case: &Case, want: &Want) -> Result<()> {
    let step = case.steps.first().context("a case without steps")?;
    let since = Instant::now();
    for a in &step.actions {
        l.apply_action(a)?;
    }
    let r = l.settle(set, &step.expect, since, case.name.as_str())?;
    ensure!(
        r.settled.is_some(),
        "{}: not settled\n{}",
        case.name,
        r.line()
    );

    let text = inspect(l, node, "x/a", false)?;
    eprintln!("{}: inspect policy x/a\n{text}", case.name);
    let before = report(l, node)?;
    let fail = |why: String| -> Result<()> { bail!("{}: {why}\n{text}", case.name) };
    if before.selected_by != want.selected_by {
        fail(format!("selected by {:?}", before.selected_by))?;
    }
    if before.ingress.isolated_by != want.ingress_by || before.egress.isolated_by != want.egress_by
    {
        fail(format!(
            "isolated by {:?} / {:?}",
            before.ingress.isolated_by, before.egress.isolated_by
        ))?;
    }
    for (d, by) in [("ingress", want.ingress_by), ("egress", want.egress_by)] {
        let line = if by.is_empty() {
            format!("{d}: open")
        } else {
            format!("{d}: isolated by {}", by.join(", "))
        };
        if !text.contains(&line) {
            fail(format!("no line {line:?}"))?;
        }
    }
    if let Some((policy, d, index, ports)) = want.rule {
        let heading = format!("  {policy} {d}[{index}]: ");
        if !text.contains(&heading) || !text.contains(ports) {
            fail(format!("no rule {heading:?} admitting {ports:?}"))?;
        }
    }

    // Traffic again: the counters inspect shows must move.
    l.probe(set)?;
    let after = report(l, node)?;
    if let Some((policy, d, index, _)) = want.rule {
        let (b, a) = (
            rule_packets(&before, policy, d, index),
            rule_packets(&after, policy, d, index),
        );
        if !matches!((b, a), (Some(b), Some(a)) if a > b) {
            fail(format!("{policy} {d}[{index}] counted {b:?} then {a:?}"))?;
        }
    }
    if let Some(d) = want.denied {
        let (b, a) = (denied_packets(&before, d), denied_packets(&after, d));
        if a <= b {
            fail(format!("{d} denials counted {b} then {a}"))?;
        }
    }
    if case.name.starts_with("4 ") {
        scrape_counts_per_policy(l, node)?;
    }

    for (ns, name) in case.policies() {
        l.apply_action(&Action::Delete { ns, name })?;
    }
    settled(l, set, Reach::all(true), "policies deleted, all open")
}

/// Case 4 in force: the node's scrape counts x/x-a-from-b's rule and
/// denials, its selected pod and the events it enforced, and promtool
/// accepts it with the per-policy series in.
fn scrape_counts_per_policy(l: &Lab, node: usize) -> Result<()> {
    let raw = l.metrics(node)?;
    // The lab's reader puts the status line before the body.
    let scrape = raw
        .strip_prefix("HTTP/1.1 200 OK ")
        .with_context(|| format!("/metrics: {raw}"))?;
    let labels = "namespace=\"x\",policy=\"x-a-from-b\"";
    for (series, at_least) in [
        (
            format!("mycni_policy_rule_packets_total{{{labels},direction=\"ingress\",rule=\"0\"}}"),
            1.0,
        ),
        (
            format!("mycni_policy_rule_bytes_total{{{labels},direction=\"ingress\",rule=\"0\"}}"),
            1.0,
        ),
        (
            format!("mycni_policy_denied_packets_total{{{labels},direction=\"ingress\"}}"),
            1.0,
        ),
        (format!("mycni_policy_selected_pods{{{labels}}}"), 1.0),
        (
            "mycni_policy_drops_total{direction=\"ingress\",reason=\"denied\"}".to_string(),
            1.0,
        ),
        (
            "mycni_policy_event_to_enforced_seconds_count".to_string(),
            1.0,
        ),
    ] {
        let v = sample(scrape, &series);
        ensure!(
            v.is_some_and(|v| v >= at_least),
            "{series} is {v:?}, want >= {at_least}:\n{scrape}"
        );
    }
    common::promtool_check_metrics(scrape)
}

#[test]
fn inspect_names_the_policies_and_rules_of_the_truth_table_cases_and_counts() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let t = common::model_lab("mycni-t-pi", &[])?;
    let l = &t.0;
    let pods = l.pods()?;
    let xa = pods
        .iter()
        .find(|p| pod_label(p) == "x/a")
        .context("no x/a in the model lab")?;
    let set = l.probe_set(false)?;
    settled(l, &set, Reach::all(true), "the model, before any policy")?;

    // No policy: open both ways, selected by none.
    let text = inspect(l, xa.node, "x/a", false)?;
    ensure!(
        text.contains("selected by no NetworkPolicy")
            && text.contains("ingress: open")
            && text.contains("egress: open"),
        "{text}"
    );
    // A pod of another node is not this agent's to tell.
    let elsewhere = pods
        .iter()
        .find(|p| p.kube.is_some() && p.node != xa.node)
        .context("every model pod on one node")?;
    let other = pod_label(elsewhere);
    ensure!(
        inspect(l, xa.node, &other, false).is_err(),
        "inspect on x/a's node answered for {other} of another node"
    );

    let cases = upstream(&pods);
    for want in &WANTS {
        let case = cases
            .iter()
            .find(|c| c.name == want.case)
            .with_context(|| format!("no upstream case {:?}", want.case))?;
        check_case(l, &set, xa.node, case, want)?;
    }
    Ok(())
}
