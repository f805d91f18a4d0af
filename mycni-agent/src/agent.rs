//! The agent's life, in two phases: start-up (`startup`: find its Node,
//! bring the overlay up, load the programs, publish itself), then the loop
//! (`run_loop`: reconcile peers from a watch on all Nodes, at start, on
//! every change, and periodically, so kernel drift and missed deletes heal).
//! What both phases share has a home of its own: `config` (what the
//! agent is configured with), `client` (the API client, the Node it runs
//! on), `publish` (the conflist, the ready marker, the Node condition).

mod client;
mod config;
mod publish;
mod run_loop;
mod startup;

use std::sync::Arc;

use anyhow::Result;

use crate::metrics::Metrics;
use crate::overlay::OverlayKernel;

pub use client::kube_client;
pub use config::Config;
pub use mycni_common::contract::{CONFLIST_NAME, NETWORK_NAME};
pub use publish::{conflist, ready_file, write_atomic};

/// Runs the agent until `shutdown` resolves. The datapath stays in place
/// when it returns; only the ready marker goes, so the plugin's STATUS
/// reports the node not ready while no agent runs.
pub async fn run(
    cfg: Config,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    if let Some(addr) = cfg.metrics_addr {
        let m = metrics.clone();
        tokio::spawn(async move {
            if let Err(e) = crate::api::serve(addr, m).await {
                tracing::error!(error = %e, "metrics endpoint failed");
            }
        });
    }
    tokio::pin!(shutdown);
    tokio::select! {
        r = start_then_loop(&cfg, metrics.clone()) => r,
        () = &mut shutdown => {
            tracing::info!("shutting down; the datapath stays in place");
            let _ = std::fs::remove_file(ready_file(&cfg));
            Ok(())
        }
    }
}

/// Start-up once, then the loop. Returns only with an error: the loop has
/// no end of its own, `run` ends it at shutdown.
async fn start_then_loop(cfg: &Config, metrics: Arc<Metrics>) -> Result<()> {
    let started = startup::start(cfg, &metrics).await?;
    run_loop::run(cfg, metrics, started).await
}

/// Removes what `run` leaves on a node for good: the conflist, the ready
/// marker, the masquerade, underlay filter, anti-spoofing and policy tables and
/// the VXLAN devices (with every route, neighbour and FDB entry on them). Used
/// by `mycni-agent uninstall`.
pub async fn uninstall(cfg: &Config) -> Result<()> {
    let _ = std::fs::remove_file(cfg.cni_conf_dir.join(CONFLIST_NAME));
    let _ = std::fs::remove_file(ready_file(cfg));
    crate::tables::masq::uninstall()?;
    crate::tables::underlay_filter::uninstall()?;
    crate::tables::antispoof::uninstall()?;
    crate::policy::room::uninstall(&crate::datapath::PinnedEpoch(cfg.pin_dir.clone()))?;
    match crate::datapath::detach_all(&cfg.pin_dir) {
        Ok(n) => tracing::info!(links = n, "detached the fast path"),
        Err(e) => tracing::warn!(error = %e, "cannot detach the fast path"),
    }
    let kernel = OverlayKernel::new()?;
    for name in [&cfg.vxlan_name, &cfg.vxlan6_name] {
        if let Some(l) = kernel.link(name).await? {
            kernel.del_link(l.index).await?;
        }
    }
    // vxlan.1's nexthops (and their routes) went with it; direct-routing
    // peers' nexthops sit on the underlay, and deleting them deletes the
    // routes through them.
    kernel.delete_nexthops().await?;
    Ok(())
}
