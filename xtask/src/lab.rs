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
    /// Datapath benchmarks side by side in one run: a direct veth, the
    /// underlay and overlay node to node (the floors), the kernel path and
    /// the eBPF fast path (node1 pod -> node2 pod), with and without a
    /// kube-proxy-sized iptables ruleset; prints a table with
    /// ratios and writes it to target/lab-bench.md. Brings up its own 2-node
    /// x 1-pod lab (mycnib-*, /run/mycni-bench-lab) and tears it down;
    /// --nodes/--pods do not apply.
    Bench(BenchArgs),
}

#[derive(Args, Clone)]
pub struct BenchArgs {
    /// Interleaved runs of every variant (the table shows medians).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Seconds per measure (latency, stream, small packets).
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Services (2 endpoints each) in the kube-proxy ruleset.
    #[arg(long, default_value_t = 2000)]
    services: usize,
    /// Non-matching filter FORWARD rules in the synthetic ruleset.
    #[arg(long, default_value_t = 2000)]
    synthetic_rules: usize,
    /// CPU both sockperf ends are pinned to, or `none`.
    #[arg(long, default_value = "1")]
    pin_cpu: String,
}

pub fn run(args: LabArgs) -> Result<()> {
    let root = workspace_root();
    if let Some(LabCmd::Bench(b)) = &args.cmd {
        return bench(b);
    }
    let cmds: Vec<&str> = match args.cmd {
        // The README's main job: a lab that is up and proven reachable.
        None => vec!["up", "test"],
        Some(LabCmd::Up) => vec!["up"],
        Some(LabCmd::Test) => vec!["test"],
        Some(LabCmd::Status) => vec!["status"],
        Some(LabCmd::Down) => vec!["down"],
        Some(LabCmd::Bench(_)) => vec![],
    };
    if cmds.contains(&"up") {
        setup::run()?;
        build_release()?;
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

pub fn build_release() -> Result<()> {
    Cmd::new("cargo")
        .args(["build", "--release", "--locked"])
        .args(["--package", "mycni-agent", "--package", "mycni-plugin"])
        .args(["--package", "mycni-tests", "--bins"])
        .toolchain(HOST_TOOLCHAIN)
        .cwd(&workspace_root())
        .run()
}

/// The bench measures the fast path, so the agent must embed a current eBPF
/// object: build it first (a no-op when nothing changed), then the binaries.
fn bench(b: &BenchArgs) -> Result<()> {
    let root = workspace_root();
    setup::run()?;
    crate::build_ebpf(true)?;
    build_release()?;
    Cmd::new(&root.join("target/release/mycni-lab").to_string_lossy())
        .arg("bench")
        .args(["--runs", &b.runs.to_string()])
        .args(["--seconds", &b.seconds.to_string()])
        .args(["--services", &b.services.to_string()])
        .args(["--synthetic-rules", &b.synthetic_rules.to_string()])
        .args(["--pin-cpu", &b.pin_cpu])
        .arg("--out")
        .arg(root.join("target/lab-bench.md"))
        .run()
}

/// `cargo xtask soak`: the long reliability cases, on labs of their own.
pub fn soak() -> Result<()> {
    let root = workspace_root();
    setup::run()?;
    crate::build_ebpf(true)?;
    build_release()?;
    Cmd::new(&root.join("target/release/mycni-lab").to_string_lossy())
        .arg("soak")
        .arg("--out")
        .arg(root.join("target/soak.md"))
        .run()
}
