//! The datapath as a room of the loop's pass: it mirrors into its maps
//! what the overlay room left in the kernel ([`crate::topology::Output`]) and the
//! node's pods, and only when all of the overlay was applied.

use anyhow::{Context, Result};

use crate::kernel::Kernel;
use crate::metrics::{NetlinkOp, netlink_timed};

use super::DatapathRoom;

impl DatapathRoom {
    /// The pass's datapath step. Pods change only through the plugin:
    /// they are read when the kernel says so (`read_pods`) and on full
    /// passes, not on every Node event.
    pub async fn apply(
        &mut self,
        kernel: &Kernel,
        overlay: &crate::topology::Output<'_>,
        read_pods: bool,
    ) -> Result<()> {
        if overlay.failed != 0 || !self.active() {
            return Ok(());
        }
        let pods = if overlay.full || read_pods {
            Some(netlink_timed(NetlinkOp::PodEndpoints, kernel.pod_endpoints()).await?)
        } else {
            None
        };
        self.sync(overlay, pods.as_ref())
            .context("syncing the eBPF maps")
    }
}
