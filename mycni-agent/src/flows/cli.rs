//! `mycni-agent flows`: the flows of this node's agent, or with a
//! kubeconfig every node's (found through the Node objects), filtered,
//! as one line each or as the agents' JSON.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use tokio::sync::mpsc;

use super::record::Line;
use super::store::Filter;
use mycni_common::contract::{ANNOTATION_HOST_IP, ANNOTATION_HOST_IP6};

/// How lines are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// One line a flow: time, node, ends, protocol, flags, verdict, why.
    Human,
    /// The agents' JSON, a line each (Hubble's field names).
    Json,
}

/// `mycni-agent flows`'s flags.
#[derive(clap::Args)]
pub struct FlowsArgs {
    /// Keep printing new flows as they come.
    #[arg(short, long)]
    pub follow: bool,
    /// Flows from or to this pod: <namespace>/<pod>, or a pod name.
    #[arg(long)]
    pub pod: Option<String>,
    /// Flows from or to a pod of this namespace.
    #[arg(short, long)]
    pub namespace: Option<String>,
    /// FORWARDED or DROPPED.
    #[arg(long)]
    pub verdict: Option<String>,
    /// A drop reason (POLICY_DENIED, IP_RPFILTER, ...) or a path's reason
    /// (kernel_tcp_control, ...).
    #[arg(long)]
    pub reason: Option<String>,
    /// Flows a policy allowed or denied: <namespace>/<name>, or a name.
    #[arg(long)]
    pub policy: Option<String>,
    /// Either end's port.
    #[arg(long)]
    pub port: Option<u16>,
    /// tcp, udp, sctp, icmpv4, icmpv6.
    #[arg(long)]
    pub protocol: Option<String>,
    /// Only the last this many of the flows held (per query).
    #[arg(long, default_value_t = 20)]
    pub last: usize,
    #[arg(short, long, value_enum, default_value = "human")]
    pub output: Output,
    /// The local agent's metrics address (a wildcard one is asked on
    /// loopback).
    #[arg(long, env = "MYCNI_METRICS_ADDR", default_value = "127.0.0.1:9971")]
    pub agent: String,
    /// Ask every node's agent, found through the Node objects.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// The agents' metrics port, with --kubeconfig.
    #[arg(long, default_value_t = 9971)]
    pub agent_port: u16,
}

impl FlowsArgs {
    /// The filter the flags ask for.
    pub fn filter(&self) -> Filter {
        Filter {
            pod: self.pod.clone(),
            namespace: self.namespace.clone(),
            verdict: self.verdict.clone(),
            reason: self.reason.clone(),
            policy: self.policy.clone(),
            port: self.port,
            protocol: self.protocol.clone(),
            last: Some(self.last),
            follow: self.follow,
        }
    }
}

/// Where to ask.
pub enum Agents {
    /// One agent (this node's).
    One(SocketAddr),
    /// Every node's agent, on `port` of its host IP, found with `client`.
    Cluster { client: kube::Client, port: u16 },
}

/// Prints what the agents hold that matches `filter`, then, with
/// `filter.follow`, new flows until interrupted.
pub async fn run(agents: Agents, filter: Filter, output: Output) -> Result<()> {
    let targets = match agents {
        Agents::One(a) => vec![a],
        Agents::Cluster { client, port } => node_agents(client, port)
            .await?
            .into_iter()
            .map(|(_, a)| a)
            .collect(),
    };
    let query = format!("/flows?{}", filter.to_query());
    let (tx, mut rx) = mpsc::channel::<(SocketAddr, Result<String>)>(1024);
    for a in &targets {
        let (tx, q, a) = (tx.clone(), query.clone(), *a);
        tokio::spawn(async move {
            let sent = crate::api::client::lines(a, &q, |text| {
                let tx = tx.clone();
                async move { tx.send((a, Ok(text))).await.is_ok() }
            })
            .await;
            if let Err(e) = sent {
                let _ = tx.send((a, Err(e))).await;
            }
        });
    }
    drop(tx);
    let print = |text: &str| -> Result<()> {
        match output {
            Output::Json => println!("{text}"),
            Output::Human => match serde_json::from_str::<Line>(text) {
                Ok(l) => println!("{}", l.human()),
                // `{"lost_events":N}` and whatever a newer agent adds.
                Err(_) => println!("{text}"),
            },
        }
        Ok(())
    };
    let mut failed = 0;
    if filter.follow || targets.len() == 1 {
        while let Some((a, line)) = rx.recv().await {
            match line {
                Ok(text) => print(&text)?,
                Err(e) => {
                    failed += 1;
                    eprintln!("mycni-agent flows: {a}: {e:#}");
                }
            }
        }
    } else {
        // Several nodes' histories: merged by time, then cut to `last`.
        let mut lines = Vec::new();
        while let Some((a, line)) = rx.recv().await {
            match line {
                Ok(text) => {
                    let time = serde_json::from_str::<Line>(&text)
                        .map(|l| l.time)
                        .unwrap_or_default();
                    lines.push((time, text));
                }
                Err(e) => {
                    failed += 1;
                    eprintln!("mycni-agent flows: {a}: {e:#}");
                }
            }
        }
        lines.sort();
        let skip = filter.last.map_or(0, |n| lines.len().saturating_sub(n));
        for (_, text) in lines.into_iter().skip(skip) {
            print(&text)?;
        }
    }
    if failed == targets.len() {
        bail!("no agent answered");
    }
    Ok(())
}

/// Each Node's agent, by Node name: its mycni host IP (the agents listen
/// there in the DaemonSet, which runs on the host's network), else its
/// InternalIP.
pub async fn node_agents(client: kube::Client, port: u16) -> Result<Vec<(String, SocketAddr)>> {
    let nodes: Api<Node> = Api::all(client);
    let list = nodes
        .list(&ListParams::default())
        .await
        .context("listing the Nodes")?;
    let mut out = Vec::new();
    for n in list.items {
        let ann = n.metadata.annotations.unwrap_or_default();
        let internal = n
            .status
            .and_then(|s| s.addresses)
            .unwrap_or_default()
            .into_iter()
            .find(|a| a.type_ == "InternalIP")
            .map(|a| a.address);
        let ip = [
            ann.get(ANNOTATION_HOST_IP).cloned(),
            ann.get(ANNOTATION_HOST_IP6).cloned(),
            internal,
        ]
        .into_iter()
        .flatten()
        .find_map(|s| s.parse::<IpAddr>().ok());
        let name = n.metadata.name.unwrap_or_default();
        match ip {
            Some(ip) => out.push((name, SocketAddr::new(ip, port))),
            None => eprintln!("mycni-agent: node {name} has no address to reach its agent at"),
        }
    }
    if out.is_empty() {
        bail!("no Node with an address");
    }
    Ok(out)
}
