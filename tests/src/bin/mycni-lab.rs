//! `mycni-lab`: the local multi-node lab (run through `cargo xtask lab`),
//! plus the small tools its pods and nodes run.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use mycni_tests::lab::{self, Bins, Lab, Spec};

#[derive(Parser)]
#[command(
    name = "mycni-lab",
    about = "mycni's local multi-node lab in network namespaces"
)]
struct Cli {
    /// Directory with mycni, mycni-agent, mycni-apiserver (default: this binary's).
    #[arg(long, global = true)]
    bin_dir: Option<PathBuf>,
    #[arg(long, global = true, default_value = "/run/mycni-lab")]
    root: PathBuf,
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

fn spec(cli: &Cli, agent_args: Vec<String>) -> Result<Spec> {
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
    Ok(Spec {
        prefix: "mycni".into(),
        nodes: cli.nodes,
        pods: cli.pods,
        root: cli.root.clone(),
        bins,
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
        Cmd::EchoServer { port } => lab::echo_server(*port),
        Cmd::TcpProbe { addr } => lab::tcp_probe(addr),
        Cmd::HttpGet { addr, path } => {
            println!("{}", lab::http_get(addr, path)?);
            Ok(())
        }
    }
}
