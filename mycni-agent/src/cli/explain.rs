//! `mycni-agent explain`: why one end may or may not reach another, from
//! the agent of this node or of both ends' nodes.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use mycni_agent::agent;
use mycni_agent::flows::{cli, explain};
use mycni_agent::settings::METRICS_ADDR;

// No doc comment here: the subcommand's about is its variant's in `Cmd`.
#[derive(Args)]
pub(super) struct ExplainArgs {
    src: String,
    dst: String,
    /// <port>/<protocol>, e.g. 80/tcp.
    port: String,
    /// The agent's metrics address (a wildcard one is asked on
    /// loopback).
    #[arg(long, env = METRICS_ADDR.env, default_value = "127.0.0.1:9971")]
    agent: String,
    /// Ask the agents of both ends' nodes, found through the Node
    /// objects, instead of this node's.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// The agents' metrics port, with --kubeconfig.
    #[arg(long, default_value_t = 9971)]
    agent_port: u16,
    /// Print the agent's JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub(super) fn run(rt: &tokio::runtime::Runtime, a: ExplainArgs) -> Result<()> {
    let e = match a.kubeconfig {
        Some(k) => {
            let agents = rt.block_on(async {
                cli::node_agents(agent::kube_client(Some(&k)).await?, a.agent_port).await
            })?;
            explain::fetch_cluster(&agents, &a.src, &a.dst, &a.port)?
        }
        None => {
            let agent = mycni_agent::api::client::agent_address(&a.agent)?;
            explain::fetch(agent, &a.src, &a.dst, &a.port)?
        }
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&e)?);
    } else {
        print!("{}", explain::render(&e));
    }
    Ok(())
}
