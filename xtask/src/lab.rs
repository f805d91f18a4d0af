//! `cargo xtask lab`: the local multi-node cluster.

use anyhow::{Result, bail};
use clap::Subcommand;

#[derive(Subcommand, Clone, Copy)]
pub enum LabCmd {
    /// Build everything, start N node netns on an underlay bridge, each with
    /// the real agent against the API fixture, and P pods per node.
    Up,
    /// Print the connectivity matrix (ping and TCP) of a running lab.
    Test,
    /// Show nodes, pods, agent readiness and metrics endpoints.
    Status,
    /// Remove every namespace, process and file the lab created.
    Down,
}

pub fn run(cmd: LabCmd) -> Result<()> {
    let name = match cmd {
        LabCmd::Up => "up",
        LabCmd::Test => "test",
        LabCmd::Status => "status",
        LabCmd::Down => "down",
    };
    bail!("`cargo xtask lab {name}` needs the agent (issue 4) and is not built yet")
}
