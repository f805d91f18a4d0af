//! `mycni-agent flows` (its flags are the flows room's `FlowsArgs`), and
//! `run`'s flow flags: the history held, the pods with series of their
//! own, the tc programs' flow events.

use anyhow::Result;
use clap::Args;
use mycni_agent::agent;
use mycni_agent::flows::cli::{self, FlowsArgs};
use mycni_agent::settings::{FLOW_EVENTS, FLOW_HISTORY, FLOW_POD_SERIES};

use super::order::Order;
use super::values::{parse_bool, parse_count};

#[derive(Args, Clone)]
pub(super) struct FlowSettings {
    /// Flow records the agent holds for `/flows` and `mycni-agent flows`
    /// (the oldest goes first).
    #[arg(long = FLOW_HISTORY.flag, env = FLOW_HISTORY.env, default_value_t = mycni_agent::flows::store::DEFAULT_HISTORY, value_parser = parse_flow_history, display_order = Order::FlowHistory as usize)]
    pub flow_history: usize,
    /// Local pods with series of their own in `mycni_flow_pod_drops_total`
    /// (the rest count under pod="_other"): the metric's cardinality bound.
    #[arg(long = FLOW_POD_SERIES.flag, env = FLOW_POD_SERIES.env, default_value_t = 100, value_parser = parse_flow_pod_series, display_order = Order::FlowPodSeries as usize)]
    pub flow_pod_series: usize,
    /// With --datapath ebpf: the tc programs emit a flow event for the
    /// first packet of each connection and when its path changes, into the
    /// ring `mycni_flows` (a few ns per packet; never an event per packet).
    #[arg(long = FLOW_EVENTS.flag, env = FLOW_EVENTS.env, default_value_t = true, action = clap::ArgAction::Set, value_parser = parse_flow_events, display_order = Order::FlowEvents as usize)]
    pub flow_events: bool,
}

fn parse_flow_events(s: &str) -> Result<bool, String> {
    FLOW_EVENTS.check(parse_bool(s))
}

fn parse_flow_history(s: &str) -> Result<usize, String> {
    FLOW_HISTORY.check(parse_count(s))
}

fn parse_flow_pod_series(s: &str) -> Result<usize, String> {
    FLOW_POD_SERIES.check(parse_count(s))
}

/// Prints the flows of this node's agent, or with a kubeconfig every
/// node's.
pub(super) fn run(rt: &tokio::runtime::Runtime, a: &FlowsArgs) -> Result<()> {
    rt.block_on(async {
        let agents = match &a.kubeconfig {
            Some(k) => cli::Agents::Cluster {
                client: agent::kube_client(Some(k)).await?,
                port: a.agent_port,
            },
            None => cli::Agents::One(mycni_agent::api::client::agent_address(&a.agent)?),
        };
        cli::run(agents, a.filter(), a.output).await
    })
}
