//! `mycni-agent explain` against what probes see: on the model lab, for
//! upstream truth-table cases of every kind (namespace and pod selectors,
//! ports by number and by name, egress, ipBlock), every pod-to-pod cell
//! of the settled table (IPv4 and IPv6, by pod IP) is asked of node 1's
//! agent, and its verdict must be what the probe saw: explain is checked
//! against the datapath, not against the evaluator it is built on.

use crate::common;

use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use mycni_agent::flows::explain::Explanation;
use mycni_lab::model::serve_port_name;
use mycni_lab::netpol::cases::upstream;
use mycni_lab::netpol::{Action, Reach, Via};
use mycni_lab::{Lab, pod_label};

const CASES: [&str; 7] = [
    "2 default-deny-all",
    "6 x/a from [ns NotIn x] or [pod=b]",
    "11 x/a from ns=y on TCP 81 only",
    "12 x ingress on named port serve-81-tcp",
    "13 x egress to named port serve-80-tcp",
    "22 x/a egress only to y/a while y/a and y/b admit x/a",
    "23 x/a egress to ipBlock <y/b>/32 and /128",
];

fn explain(l: &Lab, src: &str, dst: &str, port: u16, proto: &str) -> Result<Explanation> {
    let raw = l.get_from_node(1, &format!("/inspect/explain/{src}/{dst}/{port}/{proto}"))?;
    let body = raw
        .strip_prefix("HTTP/1.1 200 OK ")
        .with_context(|| format!("explain {src} {dst} {port}/{proto}: {raw}"))?;
    serde_json::from_str(body).with_context(|| format!("no explanation: {body}"))
}

#[test]
fn explain_agrees_with_the_probes_on_the_truth_table_cases() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let t = common::model_lab("mycni-t-fx", &[])?;
    let l = &t.0;
    let pods = l.pods()?;
    let set = l.probe_set(false)?;
    let open = l.settle(&set, &Reach::all(true).into(), Instant::now(), "no policy")?;
    ensure!(open.settled.is_some(), "the model did not settle open");
    let cases = upstream(&pods);
    let mut asked = 0;
    for name in CASES {
        let case = cases
            .iter()
            .find(|c| c.name == name)
            .with_context(|| format!("no upstream case {name:?}"))?;
        let step = case.steps.first().context("a case without steps")?;
        let since = Instant::now();
        for a in &step.actions {
            l.apply_action(a)?;
        }
        let r = l.settle(&set, &step.expect, since, name)?;
        ensure!(r.settled.is_some(), "{name}: not settled\n{}", r.line());
        let mut wrong = Vec::new();
        for ((col, from, to), reached) in &r.observed.0 {
            // Nodes are no pods to explain; Services go by their VIP.
            if col.via != Via::PodIp || !from.contains('/') {
                continue;
            }
            let dst = pods
                .iter()
                .find(|p| pod_label(p) == *to)
                .and_then(|p| p.kube.as_ref())
                .with_context(|| format!("no model pod {to}"))?;
            // A pod without the named port is probed where nothing
            // listens: the cell says nothing about policy.
            let Some(port) = dst.resolve(&serve_port_name(col.port, col.proto), col.proto) else {
                continue;
            };
            let e = explain(l, from, to, port, &col.proto.api().to_lowercase())?;
            asked += 1;
            if (e.verdict == "allowed") != *reached {
                wrong.push(format!(
                    "{from} -> {to} {port}/{} ({}): probe {}, explain {} (egress {:?} {:?}, ingress {:?} {:?})",
                    col.proto.api(),
                    col.family,
                    if *reached { "reached" } else { "did not reach" },
                    e.verdict,
                    e.egress.judgement,
                    e.egress.rules,
                    e.ingress.judgement,
                    e.ingress.rules
                ));
            }
        }
        if !wrong.is_empty() {
            bail!(
                "{name}: explain disagrees with the probes:\n{}",
                wrong.join("\n")
            );
        }
        eprintln!("{name}: explain agrees with every pod-to-pod probe");
        for (ns, name) in case.policies() {
            l.apply_action(&Action::Delete { ns, name })?;
        }
        let r = l.settle(&set, &Reach::all(true).into(), Instant::now(), "deleted")?;
        ensure!(
            r.settled.is_some(),
            "{name}: policies deleted, not open again"
        );
    }
    ensure!(asked > 500, "only {asked} cells explained");
    Ok(())
}
