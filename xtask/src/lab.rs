//! `cargo xtask lab`: the local multi-node cluster (see tests/lab/src/lib.rs).
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
    /// The agents' datapath: `ebpf` (the tc fast path) or `kernel`. `up`
    /// fails when an agent runs another one (e.g. built without the eBPF
    /// object), naming the reason it gives.
    #[arg(long, default_value = "ebpf", value_parser = ["ebpf", "kernel"], global = true)]
    datapath: String,
    /// With `--datapath ebpf`: encapsulate in tc (datapath v2), or hand
    /// remote traffic to vxlan.1 (`false`).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, global = true)]
    tc_encap: bool,
    /// Route peers on the underlay's own subnet (every node of the lab)
    /// without VXLAN: the agents' `--direct-routing`.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, global = true)]
    direct_routing: bool,
}

#[derive(Subcommand, Clone)]
pub enum LabCmd {
    /// Build everything (the eBPF object first, which the agent embeds),
    /// start N node netns on an underlay bridge, each with the real agent
    /// against the API fixture, and P pods per node.
    Up,
    /// Print the connectivity matrix (ping, TCP, a bulk echo) of a running
    /// lab, then per node its datapath and the fast share of pod traffic.
    Test,
    /// Show nodes, pods, agent readiness and metrics endpoints.
    Status,
    /// Remove every namespace, process and file the lab created.
    Down,
    /// Datapath benchmarks side by side in one run: a direct veth, the
    /// underlay and overlay node to node (the floors), the kernel path, the
    /// eBPF fast path via vxlan.1 and with tc encap (node1 pod -> node2
    /// pod), with and without a kube-proxy-sized iptables ruleset; prints a
    /// table with medians, min-max, ratios against the targets and the fast
    /// share from the counters, and writes it to target/lab-bench.md. Brings
    /// up its own 2-node x 1-pod lab (mycnib-*, /run/mycni-bench-lab) and
    /// tears it down; --nodes/--pods/--datapath/--tc-encap/--direct-routing do not apply.
    Bench(BenchArgs),
}

#[derive(Args, Clone)]
pub struct BenchArgs {
    /// Interleaved runs of every variant (the table shows medians and
    /// min-max). The default bench takes about a quarter of an hour.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Seconds per measure (latency, stream, small packets).
    #[arg(long, default_value_t = 4)]
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
        // The agent embeds the object at build time: without it every node
        // would come up on the kernel path.
        crate::build_ebpf(true)?;
        build_release()?;
    }
    let lab = root.join("target/release/mycni-lab");
    for c in cmds {
        let mut cmd = Cmd::new(&lab.to_string_lossy())
            .args([
                "--nodes",
                &args.nodes.to_string(),
                "--pods",
                &args.pods.to_string(),
            ])
            .arg(c);
        if c == "up" {
            cmd = cmd
                .args(["--datapath", &args.datapath])
                .args(["--tc-encap", &args.tc_encap.to_string()]);
            if args.direct_routing {
                cmd = cmd.args(["--agent-arg=--direct-routing", "--agent-arg=true"]);
            }
        }
        cmd.run_interruptible()?;
    }
    Ok(())
}

pub fn build_release() -> Result<()> {
    Cmd::new("cargo")
        .args(["build", "--release", "--locked"])
        .args(["--package", "mycni-agent", "--package", "mycni-plugin"])
        .args(["--package", "mycni-lab", "--package", "mycni-apiserver"])
        .arg("--bins")
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
        .run_interruptible()
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
        .run_interruptible()
}
