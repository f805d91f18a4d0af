//! `mycni-agent inspect`: the fast path's pinned state, or with `policy`
//! what NetworkPolicy enforces for one pod.

use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::{Args, Subcommand};
use mycni_agent::settings::METRICS_ADDR;
use mycni_common::contract::{DEFAULT_VXLAN_DEVICE, DEFAULT_VXLAN6_DEVICE};

// No doc comment here: the subcommand's about is its variant's in `Cmd`.
#[derive(Args)]
pub(super) struct InspectArgs {
    #[command(subcommand)]
    what: Option<InspectWhat>,
    /// bpffs mount; the state lives under <bpffs>/mycni. Without it,
    /// the state is found from the programs attached to the VXLAN
    /// device of this network namespace (else /sys/fs/bpf/mycni).
    #[arg(long, env = "MYCNI_BPFFS")]
    bpffs: Option<PathBuf>,
    /// The VXLAN device whose programs lead to the maps.
    #[arg(long, default_value = DEFAULT_VXLAN_DEVICE)]
    vxlan_device: String,
}

#[derive(Subcommand)]
enum InspectWhat {
    /// The rules in force for a pod of this node, both directions: open or
    /// isolated and by which policies, each allow rule with its peers and
    /// ports as the agent compiled them, the policies selecting it, and
    /// the table's counters. Asks the agent running on this node.
    Policy {
        /// <namespace>/<pod>
        pod: String,
        /// The agent's metrics address (a wildcard one is asked on
        /// loopback).
        #[arg(long, env = METRICS_ADDR.env, default_value = "127.0.0.1:9971")]
        agent: String,
        /// Print the agent's JSON report instead of text.
        #[arg(long)]
        json: bool,
    },
}

pub(super) fn run(a: InspectArgs) -> Result<()> {
    match a.what {
        Some(InspectWhat::Policy { pod, agent, json }) => {
            use mycni_agent::policy::inspect;
            let report = inspect::fetch(mycni_agent::api::client::agent_address(&agent)?, &pod)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", inspect::render(&report));
            }
        }
        None => {
            let out = match a.bpffs {
                Some(b) => mycni_agent::datapath::inspect::render(&b.join("mycni"))?,
                None => mycni_agent::datapath::inspect::render_attached(
                    &a.vxlan_device,
                    DEFAULT_VXLAN6_DEVICE,
                    Path::new("/sys/fs/bpf/mycni"),
                )?,
            };
            print!("{out}");
        }
    }
    Ok(())
}
