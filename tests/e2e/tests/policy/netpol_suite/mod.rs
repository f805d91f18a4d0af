//! The NetworkPolicy truth tables on a model lab, shared by the eBPF
//! (`netpol.rs`) and kernel (`netpol_kernel.rs`) datapaths: every case of
//! `mycni_lab::netpol::suite`, each first judged by the agent's reference
//! evaluator (`cluster::allowed`) on the very objects the case applies, so
//! a hand-written expectation and the semantics module must agree before
//! the lab's tables are compared with them.

use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{Namespace, Pod as KubePodObject};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use mycni_agent::cluster::{
    Cluster, Endpoint, Key, Protocol, allowed, namespace_from_k8s, pod_from_k8s, policy_from_k8s,
};
use mycni_lab::model::{Proto, SERVE_PORTS, serve_port_name};
use mycni_lab::netpol::suite::Phase;
use mycni_lab::netpol::{Case, Column, Via, World};
use mycni_lab::{Lab, Pod, pod_label};

use crate::common;

/// The agent's model of what a case leaves in the API.
fn cluster(world: &World) -> Result<Cluster> {
    let mut c = Cluster::default();
    for ns in world.namespaces.values() {
        let k: Namespace = serde_json::from_value(ns.clone())?;
        c.add_namespace(namespace_from_k8s(&k).map_err(|e| anyhow::anyhow!("{e}"))?);
    }
    for p in world.pods.values() {
        let k: KubePodObject = serde_json::from_value(p.clone())?;
        let conv = pod_from_k8s(&k).map_err(|e| anyhow::anyhow!("{e}"))?;
        ensure!(conv.dropped.is_empty(), "pod {p}: {:?}", conv.dropped);
        c.add_pod(conv.value);
    }
    for np in world.policies.values() {
        let k: NetworkPolicy = serde_json::from_value(np.clone())?;
        let conv = policy_from_k8s(&k).map_err(|e| anyhow::anyhow!("{e}"))?;
        ensure!(conv.dropped.is_empty(), "policy {np}: {:?}", conv.dropped);
        c.add_policy(conv.value);
    }
    Ok(c)
}

fn protocol(p: Proto) -> Protocol {
    match p {
        Proto::Tcp => Protocol::Tcp,
        Proto::Udp => Protocol::Udp,
        Proto::Sctp => Protocol::Sctp,
    }
}

/// Judges every step of `case` with `cluster::allowed` and fails on the
/// first cell where it and the case's expectation disagree.
fn cross_check(lab: &Lab, phase: &Phase, pods: &[Pod], case: &Case) -> Result<()> {
    let mut world = World::of_lab(&lab.spec, pods);
    let kube: Vec<&Pod> = pods.iter().filter(|p| p.kube.is_some()).collect();
    for (n, step) in case.steps.iter().enumerate() {
        for a in &step.actions {
            world.apply(a);
        }
        let c = cluster(&world)?;
        for family in lab.spec.stack.families() {
            let mut sources: Vec<(String, Endpoint)> = Vec::new();
            for p in &kube {
                let (Some(k), Some(ip)) = (&p.kube, p.addr(family)) else {
                    continue;
                };
                sources.push((
                    k.label(),
                    Endpoint::Pod {
                        pod: Key::new(&k.namespace, &k.name),
                        ip,
                    },
                ));
            }
            if phase.node_rows {
                for i in 1..=lab.spec.nodes {
                    sources.push((
                        format!("node{i}"),
                        Endpoint::Node {
                            node: lab.spec.node_name(i),
                            ip: lab.spec.node_addr(i),
                        },
                    ));
                }
            }
            for dst in &kube {
                let (Some(k), Some(dip)) = (&dst.kube, dst.addr(family)) else {
                    continue;
                };
                let to = Endpoint::Pod {
                    pod: Key::new(&k.namespace, &k.name),
                    ip: dip,
                };
                for (from, src) in &sources {
                    if *from == k.label() {
                        continue;
                    }
                    for proto in [Proto::Tcp, Proto::Udp] {
                        for port in SERVE_PORTS {
                            let number = k.resolve(&serve_port_name(port, proto), proto);
                            let judged =
                                allowed(&c, src, &to, protocol(proto), number.unwrap_or(port))
                                    .is_allowed();
                            let col = Column {
                                proto,
                                port,
                                family,
                                via: Via::PodIp,
                            };
                            let want = step.expect.get(&col).get(from, &k.label());
                            if judged != want {
                                bail!(
                                    "case {:?} step {}: {col} {from} -> {}: the case expects {}, \
                                     cluster::allowed says {}",
                                    case.name,
                                    n + 1,
                                    k.label(),
                                    if want { "allowed" } else { "denied" },
                                    if judged { "allowed" } else { "denied" }
                                );
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// A bulk echo through a Service to a pod on another node, per family:
/// once established, the flow's packets may take the fast path, which
/// must not skip the client node's un-DNAT of the replies.
fn service_bulk_across_nodes(lab: &Lab) -> Result<()> {
    let pods = lab.pods()?;
    let find = |who: &str| {
        pods.iter()
            .find(|p| pod_label(p) == who)
            .with_context(|| format!("no pod {who}"))
    };
    let (src, dst) = (find("x/a")?, find("x/b")?);
    ensure!(src.node != dst.node, "x/a and x/b on one node");
    let k = dst.kube.as_ref().context("x/b's Service")?;
    let bin = lab.spec.bins.lab.to_string_lossy().into_owned();
    for vip in [
        k.cluster_ip.map(std::net::IpAddr::V4),
        k.cluster_ip6.map(std::net::IpAddr::V6),
    ]
    .into_iter()
    .flatten()
    {
        let target = std::net::SocketAddr::new(vip, 80).to_string();
        let t0 = Instant::now();
        common::ns_sh(&src.ns, &bin, &["tcp-probe", &target, "--bulk", "4000000"])
            .with_context(|| format!("4 MB echo from x/a through x/b's Service {target}"))?;
        eprintln!(
            "service bulk x/a -> {target} (x/b on another node): 4 MB echoed in {} ms",
            t0.elapsed().as_millis()
        );
    }
    Ok(())
}

/// The whole suite on a lab whose agents run `datapath`.
pub fn run(tag: &str, datapath: &str) -> Result<()> {
    let t0 = Instant::now();
    let t = common::model_lab(tag, &["--datapath", datapath])?;
    let lab = &t.0;
    lab.check_datapath(datapath)?;
    eprintln!("model lab up in {} ms", t0.elapsed().as_millis());
    service_bulk_across_nodes(lab)?;
    let suite = Instant::now();
    let reports = lab.run_netpol_suite(&[], &mut |phase, pods, case| {
        cross_check(lab, phase, pods, case)
    })?;
    let steps: usize = reports.iter().map(|r| r.steps.len()).sum();
    let slowest = reports
        .iter()
        .flat_map(|r| r.steps.iter())
        .filter_map(|s| s.settled)
        .max()
        .unwrap_or_default();
    eprintln!(
        "{datapath}: {} cases ({steps} settled tables) in {:.1} s, slowest settle {:.2} s; \
         whole test {:.1} s",
        reports.len(),
        suite.elapsed().as_secs_f64(),
        slowest.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    let failed: Vec<String> = reports
        .iter()
        .filter(|r| !r.passed())
        .map(|r| r.name.clone())
        .collect();
    ensure!(
        failed.is_empty(),
        "{datapath}: {} of {} cases failed: {}",
        failed.len(),
        reports.len(),
        failed.join("; ")
    );
    // Up leaves no policy, and neither does the suite.
    let left = lab.kube_ok(
        mycni_lab::Method::Get,
        "/apis/networking.k8s.io/v1/networkpolicies",
        None,
    )?;
    ensure!(
        left["items"].as_array().is_none_or(Vec::is_empty),
        "policies left behind: {left}"
    );
    Ok(())
}
