//! `mycni-bench plugin`: ADD and DEL latency of the mycni plugin (built-in
//! IPAM, and host-local delegation) against the reference ptp + host-local,
//! interleaved run by run so machine noise hits all alike. Run through
//! `cargo xtask bench plugin`.
//!
//! `mycni-bench agent`: the node agent's convergence with N peer Nodes (time
//! from the initial list to all routes, neighbours and FDB entries
//! programmed, per-event latency, peak RSS) against `ip -batch` programming
//! the same entries. Run through `cargo xtask bench agent`.
//!
//! `mycni-bench policy`: what NetworkPolicy costs the datapath, as ratios
//! to no policy in one run (established flows, new connections, the first
//! packet, the programs' own time), in a 2-node lab of its own. Run
//! through `cargo xtask bench policy`.
//!
//! `mycni-bench policy-scale`: NetworkPolicy create -> enforced on every
//! node, seen by probes, in a 2-node lab alone and with the API holding
//! 10,000 pods and 1,000 policies, and the agents' memory per cluster pod
//! at 100,000. Run through `cargo xtask bench policy-scale`.
//!
//! Each prints its report and, with `--out` (which `cargo xtask bench`
//! sets), writes it there with its figures as an SVG chart beside it.

// A binary's root resolves modules next to itself; these live in a
// directory of their own so the bin directory keeps one file per binary.
#[path = "mycni-bench/agent.rs"]
mod agent;
#[path = "mycni-bench/overlay.rs"]
mod overlay;
#[path = "mycni-bench/plugin.rs"]
mod plugin;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::Parser;
use mycni_lab::Bins;
use mycni_lab::labbench::{policy, policy_scale};

/// Benchmarks that print figures side by side with the reference. Run
/// through `cargo xtask bench …`, which builds what each one runs first;
/// this binary owns every flag and default.
#[derive(Parser)]
#[command(name = "cargo xtask bench", bin_name = "cargo xtask bench")]
enum Cli {
    /// CNI ADD/DEL latency: mycni (built-in IPAM, host-local delegation)
    /// interleaved with the reference ptp + host-local; medians and ratios.
    Plugin {
        /// Measured runs per variant.
        #[arg(long, default_value_t = 200)]
        runs: usize,
        /// The mycni plugin binary [default: `mycni` next to this binary;
        /// `cargo xtask bench` sets the one that ships, built by `cargo
        /// xtask build-plugin`].
        #[arg(long, env = "MYCNI_BENCH_PLUGIN")]
        mycni: Option<PathBuf>,
        /// Another mycni plugin binary (a base build) to run interleaved
        /// with the first, in both of its variants: before/after ratios
        /// from one run.
        #[arg(long)]
        base: Option<PathBuf>,
        /// Also write the markdown report here, and its chart beside it as
        /// SVG (`cargo xtask bench` sets target/bench-plugin.md).
        #[arg(long, env = "MYCNI_BENCH_PLUGIN_OUT")]
        out: Option<PathBuf>,
    },
    /// Node agent convergence with N peer Nodes in a 1-node lab: list
    /// complete -> routes, neighbours and FDB programmed, per-event latency,
    /// peak RSS, against `ip -batch` programming the same entries.
    Agent {
        /// Peer Nodes to create.
        #[arg(long, default_value_t = 5000)]
        nodes: usize,
        /// Where mycni-agent and mycni-apiserver are [default: this
        /// binary's directory].
        #[arg(long)]
        bin_dir: Option<PathBuf>,
        /// Create every Node with all fields a kubelet sets (slower API).
        #[arg(long)]
        full_nodes: bool,
        /// Also write the markdown report here, and its chart beside it as
        /// SVG (`cargo xtask bench` sets target/bench-agent.md).
        #[arg(long, env = "MYCNI_BENCH_AGENT_OUT")]
        out: Option<PathBuf>,
    },
    /// NetworkPolicy's cost on the datapath, as ratios to no policy from
    /// one run, in a 2-node lab of its own (mycnipb-*,
    /// /run/mycni-policy-bench-lab): latency, one stream and 64-byte UDP
    /// per CPU-second with 1 and N policies, new connections per second
    /// and connect() time with 0, 1, 10, N policies and a K-prefix
    /// ipBlock, the programs' ns per packet with the generation check off
    /// (`--network-policy=false`) and on; eBPF (tc encap) and kernel
    /// datapaths. Every policy column selects both pods and allows the
    /// pair (checked before it is measured).
    Policy {
        /// Interleaved runs of every column.
        #[arg(long, default_value_t = policy::DEFAULT_RUNS)]
        runs: usize,
        /// Seconds per measure.
        #[arg(long, default_value_t = policy::DEFAULT_SECONDS)]
        seconds: u64,
        /// One run of 1 s measures: the report's shape, not figures to
        /// quote (overrides --runs and --seconds).
        #[arg(long)]
        quick: bool,
        /// Policies in the many-policies column (one allows the pair, the
        /// rest are decoys).
        #[arg(long, default_value_t = policy::DEFAULT_POLICIES)]
        policies: usize,
        /// Prefixes in the ipBlock column's policy.
        #[arg(long, default_value_t = policy::DEFAULT_PREFIXES)]
        prefixes: usize,
        /// CPU both ends of every measure run on, or `none`.
        #[arg(long, default_value = "1")]
        pin_cpu: String,
        /// Also write the markdown report here, and its chart beside it as
        /// SVG (`cargo xtask bench` sets target/bench-policy.md).
        #[arg(long, env = "MYCNI_BENCH_POLICY_OUT")]
        out: Option<PathBuf>,
    },
    /// NetworkPolicy create -> enforced on every node, seen by probes (a
    /// new connection every interval each way between the 2 nodes of a lab
    /// of its own, mycnips-*, /run/mycni-policy-scale-lab), in the lab
    /// alone and with the API holding N cluster pods and P policies; and
    /// each agent's memory per cluster pod once it listed M pods.
    PolicyScale {
        /// Creates measured per phase, each followed by its delete.
        #[arg(long, default_value_t = policy_scale::DEFAULT_CYCLES)]
        cycles: usize,
        /// Cluster pods in the API for the scale measure.
        #[arg(long, default_value_t = policy_scale::DEFAULT_PODS)]
        pods: usize,
        /// Cluster policies in the API for the scale measure and after.
        #[arg(long, default_value_t = policy_scale::DEFAULT_POLICIES)]
        policies: usize,
        /// Cluster pods for the memory figure (0: skip it).
        #[arg(long, default_value_t = policy_scale::DEFAULT_RSS_PODS)]
        rss_pods: usize,
        /// Creates measured at --rss-pods too (0: none).
        #[arg(long, default_value_t = 0)]
        rss_cycles: usize,
        /// Milliseconds between probes, each direction.
        #[arg(long, default_value_t = policy_scale::DEFAULT_INTERVAL_MS)]
        interval_ms: u64,
        /// Milliseconds after which an unanswered probe counts as dropped.
        #[arg(long, default_value_t = policy_scale::DEFAULT_TIMEOUT_MS)]
        timeout_ms: u64,
        /// Run the agents under heaptrack and keep their profiles here
        /// (`heaptrack_print` reads them); the memory figures then include
        /// heaptrack's own.
        #[arg(long)]
        heaptrack: Option<PathBuf>,
        /// Also write the markdown report here (`cargo xtask bench` sets
        /// target/bench-policy-scale.md).
        #[arg(long, env = "MYCNI_BENCH_POLICY_SCALE_OUT")]
        out: Option<PathBuf>,
    },
    /// The datapath side by side in a 2-node lab: `mycni-lab bench` (see
    /// `cargo xtask bench datapath --help`).
    #[command(disable_help_flag = true)]
    Datapath {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn own_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("finding this binary")?;
    Ok(exe.parent().unwrap_or(Path::new(".")).to_path_buf())
}

fn main() -> Result<()> {
    match Cli::parse() {
        Cli::Plugin {
            runs,
            mycni,
            base,
            out,
        } => {
            let mycni = match mycni {
                Some(m) => m,
                None => own_dir()?.join("mycni"),
            };
            plugin::bench(runs, &mycni, base.as_deref(), out.as_deref())
        }
        Cli::Agent {
            nodes,
            bin_dir,
            full_nodes,
            out,
        } => {
            let dir = match bin_dir {
                Some(d) => d,
                None => own_dir()?,
            };
            agent::bench(&dir, nodes, full_nodes, out.as_deref())
        }
        Cli::Policy {
            runs,
            seconds,
            quick,
            policies,
            prefixes,
            pin_cpu,
            out,
        } => {
            let bins = Bins::in_dir(&own_dir()?, "run through `cargo xtask bench policy`")?;
            let pin_cpu = match pin_cpu.as_str() {
                "none" => None,
                c => Some(c.parse().context("--pin-cpu: a CPU number or `none`")?),
            };
            let (runs, seconds) = if quick { (1, 1) } else { (runs, seconds) };
            policy::run(
                bins,
                &policy::Options {
                    runs,
                    seconds,
                    policies,
                    prefixes,
                    pin_cpu,
                    out,
                },
            )
        }
        Cli::PolicyScale {
            cycles,
            pods,
            policies,
            rss_pods,
            rss_cycles,
            interval_ms,
            timeout_ms,
            heaptrack,
            out,
        } => {
            let bins = Bins::in_dir(&own_dir()?, "run through `cargo xtask bench policy-scale`")?;
            policy_scale::run(
                bins,
                &policy_scale::Options {
                    cycles,
                    pods,
                    policies,
                    rss_pods,
                    rss_cycles,
                    interval: std::time::Duration::from_millis(interval_ms),
                    timeout: std::time::Duration::from_millis(timeout_ms),
                    heaptrack,
                    out,
                },
            )
        }
        Cli::Datapath { args } => {
            let status = Command::new(own_dir()?.join("mycni-lab"))
                .arg("bench")
                .args(args)
                .status()
                .context("running mycni-lab bench")?;
            if !status.success() {
                bail!("mycni-lab bench: {status}");
            }
            Ok(())
        }
    }
}
