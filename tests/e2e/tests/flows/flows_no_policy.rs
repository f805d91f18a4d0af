//! Flows name the pods at both ends without NetworkPolicy (issue 40): with
//! `--network-policy=false` the fast path still reports connections (its
//! ring events), and `mycni-agent flows` must say which pods they are
//! between (`namespace/pod`), as it does with policy on. The flows room
//! reads the cluster from the ground floor's view when no policy room
//! publishes one; before, it named no pod then.

use crate::common;

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use mycni_agent::flows::record::Line;
use mycni_apiserver::namespace;
use mycni_lab::PodRequest;
use mycni_lab::model::{ContainerPort, Proto};
use mycni_testkit::in_netns;

const NS: &str = "fl";
const PORT: u16 = 80;

#[test]
fn flows_name_both_pods_without_network_policy() -> Result<()> {
    let _turn = crate::turn(module_path!());
    flows_name_both_pods(&["--network-policy", "false"])
}

/// A 2-node lab on the fast path with `agent_args`, pods `fl/client` on
/// node 1 and `fl/server` on node 2 (Pod objects, as a kubelet makes
/// them); client connects to server on TCP 80 until a flow record between
/// their addresses names both, for up to 20 s.
fn flows_name_both_pods(agent_args: &[&str]) -> Result<()> {
    let t = common::lab_with(2, 0, agent_args)?;
    let l = &t.0;
    l.check_datapath("ebpf")
        .context("flows come from the fast path's ring (cargo xtask build-ebpf)")?;
    let api = l.api.as_ref().context("the in-process API")?;
    api.create_namespace(namespace(NS, &[]))?;
    let add = |name: &str, node: usize| {
        l.add_kube_pod(&PodRequest {
            namespace: NS.into(),
            name: name.into(),
            node,
            labels: vec![("app".into(), name.into())],
            ports: vec![ContainerPort {
                name: format!("serve-{PORT}-tcp"),
                port: PORT,
                proto: Proto::Tcp,
            }],
        })
    };
    let client = add("client", 1)?;
    let server = add("server", 2)?;
    let to = SocketAddr::from((server.ip, PORT));
    let (src, dst) = (client.ip.to_string(), server.ip.to_string());

    let t0 = Instant::now();
    let mut between = Vec::new();
    while t0.elapsed() < Duration::from_secs(20) {
        // Each try a new connection: a new SYN, a new `new` event.
        let _ = in_netns(&client.ns, || {
            TcpStream::connect_timeout(&to, Duration::from_millis(500))
        });
        let out = l.flows_cli(&["-o", "json", "--last", "4000"])?;
        between = out
            .lines()
            .map(|t| serde_json::from_str::<Line>(t).with_context(|| format!("not a flow: {t}")))
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .filter(|x| x.flow.ip.source == src && x.flow.ip.destination == dst)
            .collect();
        if between.iter().any(|x| {
            let (s, d) = (&x.flow.source, &x.flow.destination);
            (s.namespace.as_str(), s.pod_name.as_str()) == (NS, "client")
                && (d.namespace.as_str(), d.pod_name.as_str()) == (NS, "server")
        }) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    if between.is_empty() {
        bail!("no flow from {src} (fl/client) to {dst} (fl/server) at all in 20 s");
    }
    let named = |e: &mycni_agent::flows::record::Endpoint| {
        if e.pod_name.is_empty() {
            "no pod".to_string()
        } else {
            format!("{}/{}", e.namespace, e.pod_name)
        }
    };
    let ends: std::collections::BTreeSet<String> = between
        .iter()
        .map(|x| {
            format!(
                "{} -> {}",
                named(&x.flow.source),
                named(&x.flow.destination)
            )
        })
        .collect();
    bail!(
        "no flow from {src} to {dst} names both pods (want {NS}/client -> {NS}/server): \
         {} records between their addresses name {ends:?}; the last few:\n{}",
        between.len(),
        between[between.len().saturating_sub(6)..]
            .iter()
            .map(Line::human)
            .collect::<Vec<_>>()
            .join("\n")
    )
}
