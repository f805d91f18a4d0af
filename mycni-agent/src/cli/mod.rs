//! The agent's command line: the subcommands, one file each, and the
//! dispatch. `run`'s flags are grouped by room, each group in the file of
//! its subject; their names come from the library's settings table
//! (`mycni_agent::settings`), which the error text, `check-config` and the
//! deploy tests read too.

mod check_config;
mod datapath;
mod explain;
mod flows;
mod http;
mod inspect;
mod install_cni;
mod order;
mod overlay;
mod policy;
mod run;
#[cfg(test)]
mod tests;
mod values;

use anyhow::Result;
use clap::{Parser, Subcommand};

use run::RunArgs;

#[derive(Parser)]
#[command(
    name = "mycni-agent",
    version,
    about = "mycni node agent: VXLAN overlay, peer reconcile, CNI handover"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the agent (the default).
    Run(RunArgs),
    /// Copy the plugin binary into the host's CNI bin dir atomically (init container).
    InstallCni(install_cni::InstallCniArgs),
    /// Print the fast path's pinned state: attachments, peers, local
    /// endpoints and counters (works while the agent is down); or, with
    /// `policy`, what NetworkPolicy enforces for one pod.
    Inspect(inspect::InspectArgs),
    /// The flows of this node (every connection and drop the datapath and
    /// nftables reported, with pods, policies and reasons), from the
    /// agent running here; with a kubeconfig, every node's.
    Flows(mycni_agent::flows::cli::FlowsArgs),
    /// Why <src> may or may not reach <dst> on <port>/<protocol>: the
    /// policies selecting each side, the verdict with the rules that
    /// decide it, and what this node's datapath last saw between them
    /// (with a kubeconfig: what the datapaths of both ends' nodes saw).
    /// Each end is <namespace>/<pod> or an address.
    Explain(explain::ExplainArgs),
    /// Remove the conflist, ready marker, masquerade rules, the fast path and the VXLAN device.
    Uninstall(RunArgs),
    /// Check the configuration (flags, and the environment the ConfigMap
    /// fills) as `run` would, print it and what this kernel offers the fast
    /// path, and exit: a bad value fails here with the setting's name.
    CheckConfig(RunArgs),
}

/// Parses the command line and runs what it asks for.
pub fn main() -> Result<()> {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    match cli.cmd {
        Some(Cmd::InstallCni(a)) => install_cni::run(&a),
        Some(Cmd::Inspect(a)) => inspect::run(a),
        Some(Cmd::Flows(a)) => flows::run(&rt, &a),
        Some(Cmd::Explain(a)) => explain::run(&rt, a),
        Some(Cmd::Uninstall(a)) => run::uninstall(&rt, a),
        Some(Cmd::CheckConfig(a)) => check_config::run(a),
        Some(Cmd::Run(a)) => run::run(&rt, a),
        None => run::run(&rt, cli.run),
    }
}
