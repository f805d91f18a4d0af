//! Flows on the model lab (eBPF datapath), read as a user would: with the
//! sample policy (default-deny ingress in x, x/a open to namespace y on
//! TCP 80) in force and probed, `mycni-agent flows` with the lab's
//! kubeconfig (every node's agent, found through the Node objects) shows
//! the policy drops with the policy that isolated the pod, the admitted
//! connections with the rule that admitted them, the programs' first
//! packets with their path; every filter holds on every line; the JSON is
//! Hubble's; a Kubernetes Event tells the isolated pod's story; the
//! per-pod drop series is on the scrape and promtool passes it.

use crate::common;

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use mycni_agent::flows::record::Line;
use mycni_lab::netpol::Reach;
use mycni_lab::netpol::cases::sample;
use mycni_lab::{Lab, Method};

fn flows(l: &Lab, args: &[&str]) -> Result<String> {
    l.flows_cli(args)
}

fn json(l: &Lab, args: &[&str]) -> Result<Vec<Line>> {
    let mut all = vec!["-o", "json", "--last", "4000"];
    all.extend_from_slice(args);
    flows(l, &all)?
        .lines()
        .map(|t| serde_json::from_str::<Line>(t).with_context(|| format!("not a flow line: {t}")))
        .collect()
}

fn names(by: &[mycni_agent::flows::record::PolicyRef]) -> Vec<String> {
    by.iter()
        .map(|p| format!("{}/{}", p.namespace, p.name))
        .collect()
}

/// `args`' lines, retried for a few seconds: NFLOG and the ring deliver
/// within milliseconds, but the probes' last round may be in flight.
fn eventually(l: &Lab, args: &[&str], ok: impl Fn(&[Line]) -> bool) -> Result<Vec<Line>> {
    let t0 = Instant::now();
    loop {
        let lines = json(l, args)?;
        if ok(&lines) {
            return Ok(lines);
        }
        if t0.elapsed() > Duration::from_secs(10) {
            bail!(
                "flows {args:?}: no satisfying lines in 10 s; got {}:\n{}",
                lines.len(),
                lines.iter().map(Line::human).collect::<Vec<_>>().join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn flows_show_policy_verdicts_and_paths_filtered_across_nodes() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let t = common::model_lab("mycni-t-fl", &[])?;
    let l = &t.0;
    let set = l.probe_set(false)?;
    let open = l.settle(&set, &Reach::all(true).into(), Instant::now(), "no policy")?;
    ensure!(open.settled.is_some(), "the model did not settle open");
    let case = sample();
    let step = case.steps.first().context("the sample has a step")?;
    let since = Instant::now();
    for a in &step.actions {
        l.apply_action(a)?;
    }
    let r = l.settle(&set, &step.expect, since, &case.name)?;
    ensure!(
        r.settled.is_some(),
        "the sample did not settle\n{}",
        r.line()
    );
    l.probe(&set)?;

    // Drops by the default deny: the isolated pod and its policies named.
    let drops = eventually(
        l,
        &["--verdict", "DROPPED", "--policy", "x/default-deny-ingress"],
        |ls| !ls.is_empty(),
    )?;
    for d in &drops {
        let f = &d.flow;
        ensure!(f.verdict == "DROPPED", "{}", d.human());
        ensure!(
            names(&f.ingress_denied_by).contains(&"x/default-deny-ingress".to_string()),
            "{}",
            d.human()
        );
        // A reply the table cut (a connection the policy no longer
        // admits) runs from the isolated pod.
        let isolated = if f.is_reply == Some(true) {
            &f.source
        } else {
            &f.destination
        };
        ensure!(isolated.namespace == "x", "{}", d.human());
        ensure!(
            f.drop_reason_desc.as_deref() == Some("POLICY_DENIED")
                && f.traffic_direction.as_deref() == Some("INGRESS"),
            "{}",
            d.human()
        );
    }
    ensure!(
        drops.iter().any(|d| !d.flow.source.pod_name.is_empty()),
        "no drop names its source pod"
    );
    let nodes: std::collections::BTreeSet<&str> =
        drops.iter().map(|d| d.node_name.as_str()).collect();
    ensure!(nodes.len() >= 2, "drops from one node only: {nodes:?}");

    // Admitted by the allow rule: y -> x/a on TCP 80, rule 0 named.
    let allowed = eventually(
        l,
        &[
            "--verdict",
            "FORWARDED",
            "--policy",
            "x/allow-x-a-from-y-tcp-80",
        ],
        |ls| !ls.is_empty(),
    )?;
    for a in &allowed {
        let f = &a.flow;
        ensure!(
            f.source.namespace == "y"
                && f.destination.namespace == "x"
                && f.destination.pod_name == "a"
                && f.ports().map(|p| p.1) == Some(80)
                && f.ingress_allowed_by.iter().any(|p| p.rule == Some(0)),
            "{}",
            a.human()
        );
    }

    // The programs' first packets: a SYN left to the kernel, from a pod's veth.
    let first = eventually(l, &["--reason", "kernel_tcp_control"], |ls| {
        ls.iter().any(|x| {
            x.flow.event == "new"
                && x.flow.trace_observation_point == "FROM_ENDPOINT"
                && !x.flow.source.pod_name.is_empty()
        })
    })?;
    ensure!(
        first
            .iter()
            .all(|x| x.flow.path.as_deref() == Some("kernel"))
    );

    // Filters hold on every line.
    let some = json(l, &["--pod", "x/a", "--port", "80", "--protocol", "tcp"])?;
    ensure!(!some.is_empty(), "no x/a TCP 80 flows");
    for x in &some {
        let f = &x.flow;
        let xa = |e: &mycni_agent::flows::record::Endpoint| e.namespace == "x" && e.pod_name == "a";
        ensure!(
            (xa(&f.source) || xa(&f.destination))
                && f.protocol() == "tcp"
                && f.ports().is_some_and(|(s, d)| s == 80 || d == 80),
            "{}",
            x.human()
        );
    }
    let few = flows(l, &["-o", "json", "--namespace", "y", "--last", "3"])?;
    let n = few.lines().count();
    ensure!(
        (1..=3).contains(&n),
        "--last 3 over every node gave {n}:\n{few}"
    );

    // The human line says why.
    let text = flows(
        l,
        &[
            "--verdict",
            "DROPPED",
            "--policy",
            "default-deny-ingress",
            "--last",
            "3",
        ],
    )?;
    ensure!(
        text.contains("DROPPED POLICY_DENIED") && text.contains("x/default-deny-ingress"),
        "{text}"
    );
    eprintln!("flows, human:\n{text}");

    // A Kubernetes Event on an isolated pod of x.
    let (code, list) = l.kube(
        Method::Get,
        "/apis/events.k8s.io/v1/namespaces/x/events",
        None,
    )?;
    ensure!(code == 200, "events: {code} {list}");
    let events = list["items"].as_array().cloned().unwrap_or_default();
    ensure!(
        events.iter().any(|e| e["reason"] == "PolicyDenied"
            && e["regarding"]["kind"] == "Pod"
            && e["note"]
                .as_str()
                .is_some_and(|n| n.contains("x/default-deny-ingress"))),
        "no PolicyDenied event in x: {list}"
    );

    // The per-pod drop series, and promtool accepts the scrape.
    let mut seen = false;
    for i in 1..=l.spec.nodes {
        let raw = l.metrics(i)?;
        let scrape = raw
            .strip_prefix("HTTP/1.1 200 OK ")
            .with_context(|| format!("/metrics: {raw}"))?;
        if scrape.lines().any(|s| {
            s.starts_with("mycni_flow_pod_drops_total{namespace=\"x\"")
                && s.contains("reason=\"POLICY_DENIED\"")
        }) {
            seen = true;
            common::promtool_check_metrics(scrape)?;
        }
    }
    ensure!(seen, "no node counts x's policy drops per pod");
    Ok(())
}
