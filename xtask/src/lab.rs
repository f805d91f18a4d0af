//! `cargo xtask lab`: the local multi-node cluster (see tests/src/lab.rs).
//!
//! xtask builds the release binaries and hands over to `mycni-lab`, which
//! does the work so the lab tests drive exactly the same code.

use anyhow::Result;
use clap::{Args, Subcommand};

use crate::util::{Cmd, workspace_root};
use crate::{HOST_TOOLCHAIN, setup};

#[derive(Args, Clone)]
pub struct LabArgs {
    #[command(subcommand)]
    cmd: Option<LabCmd>,
    /// Number of nodes.
    #[arg(long, default_value_t = 3, global = true)]
    nodes: usize,
    /// Pods per node.
    #[arg(long, default_value_t = 2, global = true)]
    pods: usize,
}

#[derive(Subcommand, Clone)]
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

pub fn run(args: LabArgs) -> Result<()> {
    let root = workspace_root();
    let cmds: Vec<&str> = match args.cmd {
        // The README's main job: a lab that is up and proven reachable.
        None => vec!["up", "test"],
        Some(LabCmd::Up) => vec!["up"],
        Some(LabCmd::Test) => vec!["test"],
        Some(LabCmd::Status) => vec!["status"],
        Some(LabCmd::Down) => vec!["down"],
    };
    if cmds.contains(&"up") {
        setup::run()?;
        Cmd::new("cargo")
            .args(["build", "--release", "--locked"])
            .args(["--package", "mycni-agent", "--package", "mycni-plugin"])
            .args(["--package", "mycni-tests", "--bins"])
            .toolchain(HOST_TOOLCHAIN)
            .cwd(&root)
            .run()?;
    }
    let lab = root.join("target/release/mycni-lab");
    for c in cmds {
        Cmd::new(&lab.to_string_lossy())
            .args([
                "--nodes",
                &args.nodes.to_string(),
                "--pods",
                &args.pods.to_string(),
            ])
            .arg(c)
            .run()?;
    }
    Ok(())
}
