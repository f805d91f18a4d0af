//! `mycni-lab`: the local multi-node lab (run through `cargo xtask lab`),
//! plus the small tools its pods and nodes run.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use mycni_tests::lab::{self, Bins, Lab, Spec};
use mycni_tests::{labbench, soak};

#[derive(Parser)]
#[command(
    name = "mycni-lab",
    about = "mycni's local multi-node lab in network namespaces"
)]
struct Cli {
    /// Directory with mycni, mycni-agent, mycni-apiserver (default: this binary's).
    #[arg(long, global = true)]
    bin_dir: Option<PathBuf>,
    /// Lab state directory (default /run/mycni-lab; `bench` uses its own
    /// lab, always in /run/mycni-bench-lab).
    #[arg(long, global = true)]
    root: Option<PathBuf>,
    #[arg(long, global = true, default_value_t = 3)]
    nodes: usize,
    #[arg(long, global = true, default_value_t = 2)]
    pods: usize,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    Up {
        /// Extra agent arguments, e.g. `--datapath kernel`.
        #[arg(long, allow_hyphen_values = true)]
        agent_arg: Vec<String>,
    },
    Test,
    Status,
    Down,
    /// Datapath benchmarks side by side: direct veth, underlay and overlay
    /// node to node, kernel path, fast path, with and without a
    /// kube-proxy-sized ruleset, in a 2-node x
    /// 1-pod lab of its own (mycnib-*), torn down at the end.
    Bench {
        /// Interleaved runs of every variant (the table shows medians).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Seconds per measure.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
        /// Services (2 endpoints each) in the kube-proxy ruleset.
        #[arg(long, default_value_t = 2000)]
        services: usize,
        /// Non-matching filter FORWARD rules in the synthetic ruleset.
        #[arg(long, default_value_t = 2000)]
        synthetic_rules: usize,
        /// CPU both sockperf ends run on, or `none`. On a VM a cross-CPU
        /// wakeup can cost more than the whole datapath.
        #[arg(long, default_value = "1")]
        pin_cpu: String,
        /// Also write the markdown report here.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// The long reliability cases (issue 6) on labs of their own
    /// (mycnis-*, /run/mycni-soak-lab): pod churn with SIGKILLed plugins,
    /// agent and kernel faults under long-lived flows, an upgrade with a
    /// changed map layout. Prints the table; fails on any leak or failure.
    Soak {
        /// Also write the markdown table here.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    #[command(hide = true)]
    EchoServer {
        port: u16,
    },
    #[command(hide = true)]
    TcpProbe {
        addr: String,
    },
    #[command(hide = true)]
    HttpGet {
        addr: String,
        path: String,
    },
}

fn bins(cli: &Cli) -> Result<Bins> {
    let bin_dir = match &cli.bin_dir {
        Some(d) => d.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("exe dir")?
            .to_path_buf(),
    };
    let bins = Bins {
        agent: bin_dir.join("mycni-agent"),
        plugin: bin_dir.join("mycni"),
        apiserver: bin_dir.join("mycni-apiserver"),
        lab: bin_dir.join("mycni-lab"),
    };
    for b in [&bins.agent, &bins.plugin, &bins.apiserver, &bins.lab] {
        if !b.exists() {
            bail!("{} is missing: build with `cargo xtask lab`", b.display());
        }
    }
    Ok(bins)
}

fn spec(cli: &Cli, agent_args: Vec<String>) -> Result<Spec> {
    Ok(Spec {
        prefix: "mycni".into(),
        nodes: cli.nodes,
        pods: cli.pods,
        root: cli
            .root
            .clone()
            .unwrap_or_else(|| PathBuf::from("/run/mycni-lab")),
        bins: bins(cli)?,
        agent_args,
        in_process_api: false,
    })
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match &cli.cmd {
        Cmd::Up { agent_arg } => {
            let lab = Lab::up(spec(&cli, agent_arg.clone())?)?;
            println!("lab up: {} nodes x {} pods", cli.nodes, cli.pods);
            print!("{}", lab.status()?);
            Ok(())
        }
        Cmd::Test => {
            let lab = Lab::attach(spec(&cli, vec![])?);
            let (table, failed) = lab.matrix()?;
            println!("connectivity (ping/tcp), rows = source, columns = destination pod:");
            print!("{table}");
            if failed > 0 {
                bail!("{failed} source/destination pairs unreachable");
            }
            println!("all pairs reachable");
            Ok(())
        }
        Cmd::Status => {
            print!("{}", Lab::attach(spec(&cli, vec![])?).status()?);
            Ok(())
        }
        Cmd::Down => {
            Lab::attach(spec(&cli, vec![])?).down();
            println!("lab down");
            Ok(())
        }
        Cmd::Bench {
            runs,
            seconds,
            services,
            synthetic_rules,
            pin_cpu,
            out,
        } => {
            if cli.root.is_some() {
                bail!("bench uses its own lab in {}", labbench::ROOT);
            }
            let pin_cpu = match pin_cpu.as_str() {
                "none" => None,
                c => Some(c.parse().context("--pin-cpu: a CPU number or `none`")?),
            };
            let opts = labbench::Options {
                runs: *runs,
                seconds: *seconds,
                services: *services,
                synthetic_rules: *synthetic_rules,
                pin_cpu,
                out: out.clone(),
            };
            labbench::run(bins(&cli)?, &opts)
        }
        Cmd::Soak { out } => {
            if cli.root.is_some() {
                bail!("soak uses its own labs in /run/mycni-soak-lab");
            }
            let t0 = std::time::Instant::now();
            let rows = soak::run_all(
                &bins(&cli)?,
                std::path::Path::new("/run/mycni-soak-lab"),
                soak::Scale::FULL,
            );
            let table = soak::table(&rows);
            println!("{table}");
            println!("soak finished in {} s", t0.elapsed().as_secs());
            if let Some(o) = out {
                std::fs::write(o, &table).with_context(|| format!("writing {}", o.display()))?;
            }
            let bad: Vec<&str> = rows
                .iter()
                .filter(|r| r.leaks > 0)
                .map(|r| r.case.as_str())
                .collect();
            if !bad.is_empty() {
                bail!("soak cases with leaks or failures: {}", bad.join(", "));
            }
            Ok(())
        }
        Cmd::EchoServer { port } => lab::echo_server(*port),
        Cmd::TcpProbe { addr } => lab::tcp_probe(addr),
        Cmd::HttpGet { addr, path } => {
            println!("{}", lab::http_get(addr, path)?);
            Ok(())
        }
    }
}
