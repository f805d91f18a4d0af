//! `mycni-lab`: the local multi-node lab (run through `cargo xtask lab`),
//! plus the small tools its pods and nodes run.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use mycni_lab::{self as lab, Bins, Lab, Spec, labbench, soak};

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
    /// Brings the lab up; fails (and removes it) unless every agent runs
    /// the datapath asked for.
    Up {
        /// The agents' datapath: `ebpf` (the tc fast path) or `kernel`.
        #[arg(long, default_value = "ebpf", value_parser = ["ebpf", "kernel"])]
        datapath: String,
        /// With `--datapath ebpf`: encapsulate in tc (datapath v2), or hand
        /// remote traffic to vxlan.1 (`false`).
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
        tc_encap: bool,
        /// Extra agent arguments, e.g. `--resync 1s`.
        #[arg(long, allow_hyphen_values = true)]
        agent_arg: Vec<String>,
    },
    Test,
    Status,
    Down,
    /// Datapath benchmarks side by side: direct veth, underlay and overlay
    /// node to node, kernel path, fast path via vxlan.1 and with tc encap,
    /// with and without a kube-proxy-sized ruleset, in a 2-node x 1-pod lab
    /// of its own (mycnib-*), torn down at the end.
    Bench {
        /// Interleaved runs of every variant (the table shows medians and
        /// min-max).
        #[arg(long, default_value_t = labbench::DEFAULT_RUNS)]
        runs: usize,
        /// Seconds per measure.
        #[arg(long, default_value_t = labbench::DEFAULT_SECONDS)]
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
        /// Bytes to echo over the connection after the round trip.
        #[arg(long, default_value_t = 0)]
        bulk: usize,
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

/// The soak's lab state (its labs are `mycnis-*`, see soak::soak_lab).
const SOAK_ROOT: &str = "/run/mycni-soak-lab";
const SOAK_PREFIX: &str = "mycnis";

/// The soak's cases never look for an interrupt, so a Ctrl-C would leave
/// their lab behind: a watcher removes it (the largest the soak makes, and
/// any churn pod namespace) and ends the process. The soak's own in-process
/// API fixture goes with the process.
fn watch_soak_interrupts(bins: Bins, root: &std::path::Path) {
    lab::catch_interrupts();
    let root = root.to_path_buf();
    std::thread::spawn(move || {
        while !lab::interrupted() {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        eprintln!("soak: interrupted; removing its lab");
        Lab::attach(Spec {
            prefix: SOAK_PREFIX.into(),
            nodes: 3,
            pods: 2,
            root,
            bins,
            agent_args: vec![],
            in_process_api: false,
        })
        .down();
        if let Ok(list) = mycni_testkit::sh("ip", &["netns", "list"]) {
            let prefix = format!("{SOAK_PREFIX}-");
            for ns in list.lines().filter_map(|l| l.split_whitespace().next()) {
                if ns.starts_with(&prefix) {
                    let _ = mycni_testkit::sh("ip", &["netns", "del", ns]);
                }
            }
        }
        std::process::exit(130);
    });
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
        Cmd::Up {
            datapath,
            tc_encap,
            agent_arg,
        } => {
            // Ctrl-C while the lab comes up stops it at the next step and
            // removes what was made (Lab::up tears down on any error).
            lab::catch_interrupts();
            let mut args = vec![
                "--datapath".to_string(),
                datapath.clone(),
                "--tc-encap".to_string(),
                tc_encap.to_string(),
            ];
            args.extend(agent_arg.iter().cloned());
            let mut lab = Lab::up(spec(&cli, args)?)?;
            // An agent that cannot run the fast path falls back to the
            // kernel path and still comes up; a lab must not pass that off
            // as the datapath it was asked for.
            if let Err(e) = lab.check_datapath(datapath) {
                lab.down();
                return Err(e.context("lab up failed; the lab was removed"));
            }
            println!("lab up: {} nodes x {} pods", cli.nodes, cli.pods);
            print!("{}", lab.status()?);
            Ok(())
        }
        Cmd::Test => {
            let lab = Lab::attach(spec(&cli, vec![])?);
            let t0 = std::time::Instant::now();
            let run = lab.matrix_counted()?;
            let took = t0.elapsed();
            println!(
                "connectivity (ping / TCP round trip / {} KB echo over that connection), rows = source, columns = destination pod:",
                lab::MATRIX_BULK_BYTES / 1024
            );
            print!("{}", run.table);
            let pods: Vec<String> = lab
                .pods()?
                .iter()
                .map(|p| format!("{} {}", lab::pod_label(p), p.ip))
                .collect();
            println!("pods: {}", pods.join(", "));
            println!("matrix took {:.1} s", took.as_secs_f64());
            print!("{}", lab.datapath_report(&run));
            let failed = run.failed;
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
                bail!("soak uses its own labs in {SOAK_ROOT}");
            }
            let t0 = std::time::Instant::now();
            let bins = bins(&cli)?;
            let root = std::path::Path::new(SOAK_ROOT);
            watch_soak_interrupts(bins.clone(), root);
            let rows = soak::run_all(&bins, root, soak::Scale::FULL);
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
        Cmd::TcpProbe { addr, bulk } => match lab::tcp_probe(addr, *bulk) {
            Ok(()) => Ok(()),
            Err(lab::ProbeError::RoundTrip(e)) => Err(e),
            Err(lab::ProbeError::Bulk(e)) => {
                // Its own status, so the matrix tells a broken connection
                // from one that only fails with full-size segments.
                eprintln!("Error: {e:#}");
                std::process::exit(lab::PROBE_BULK_FAILED);
            }
        },
        Cmd::HttpGet { addr, path } => {
            println!("{}", lab::http_get(addr, path)?);
            Ok(())
        }
    }
}
