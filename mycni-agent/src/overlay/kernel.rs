//! The overlay's kernel adapter: the node's kernel handle, and what the
//! overlay learns of the kernel once (nexthop objects or not) or keeps
//! between passes (nexthop IDs, `vxlan6.1`'s index). Its jobs are one
//! file each: `underlay` (finding the underlay), `device` (the VXLAN
//! devices), `dump` (reading the overlay state back), `apply` (writing a
//! diff).

use std::sync::atomic::{AtomicBool, AtomicU32};
use std::sync::{Mutex, OnceLock, PoisonError};

use crate::kernel::{Kernel, KernelError, RTPROT_MYCNI_AGENT};

use super::nexthop_ids::NexthopIds;

/// How peer routes hold their gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerRoutes {
    /// Through a nexthop object per peer (`dst nhid N`).
    Nexthops,
    /// Each route its own (`dst via gw dev vxlan.1 onlink`): the kernel
    /// has no nexthop objects.
    Onlink,
}

/// The overlay's kernel adapter: the node's [`Kernel`] handle and what
/// the overlay keeps between passes about the kernel's state.
pub struct OverlayKernel {
    kernel: Kernel,
    /// Decided at the first dump or apply, for the agent's life.
    pub(super) peer_routes: OnceLock<PeerRoutes>,
    /// The peer routes' nexthop IDs: rebuilt from the kernel at every
    /// dump, kept up to date by `apply` between dumps.
    pub(super) nexthop_ids: Mutex<NexthopIds>,
    /// Whether `nexthop_ids` has been read from the kernel yet: until
    /// then it knows no other program's IDs, and must not hand any out.
    pub(super) nexthop_ids_read: AtomicBool,
    /// `vxlan6.1`'s ifindex (0: none): its routes carry the agent's
    /// protocol too, and `vxlan.1`'s dumps must leave them to its own.
    pub(super) vxlan6_index: AtomicU32,
}

impl OverlayKernel {
    /// A netlink handle in the calling thread's namespace; needs a tokio runtime.
    pub fn new() -> Result<Self, KernelError> {
        Ok(Self {
            kernel: Kernel::new()?,
            peer_routes: OnceLock::new(),
            nexthop_ids: Mutex::new(NexthopIds::default()),
            nexthop_ids_read: AtomicBool::new(false),
            vxlan6_index: AtomicU32::new(0),
        })
    }

    /// [`OverlayKernel::new`], with `via … onlink` peer routes even where the
    /// kernel has nexthop objects: the fallback, for tests to run on any
    /// kernel.
    pub fn with_onlink_routes() -> Result<Self, KernelError> {
        let k = Self::new()?;
        let _ = k.peer_routes.set(PeerRoutes::Onlink);
        Ok(k)
    }

    /// How peer routes are made, asking the kernel the first time.
    pub async fn peer_routes(&self) -> Result<PeerRoutes, KernelError> {
        if let Some(m) = self.peer_routes.get() {
            return Ok(*m);
        }
        let m = if self.nl.nexthops_supported().await? {
            tracing::info!(
                "peer routes through nexthop objects, one per peer (ip nexthop list protocol {RTPROT_MYCNI_AGENT})"
            );
            PeerRoutes::Nexthops
        } else {
            tracing::warn!(
                "this kernel has no nexthop objects (Linux 5.3+): peer routes carry their gateway themselves (via … onlink), which the kernel inserts more slowly at thousands of peers"
            );
            PeerRoutes::Onlink
        };
        Ok(*self.peer_routes.get_or_init(|| m))
    }

    pub(super) fn ids(&self) -> std::sync::MutexGuard<'_, NexthopIds> {
        // The table is plain data, consistent after every statement: a
        // panic elsewhere while it was held leaves nothing half-done.
        self.nexthop_ids
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The node's kernel handle under the overlay's, for what is not the
    /// overlay's (the pods, links by name).
    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }
}

/// The overlay adapter is the node's kernel handle with bookkeeping on top:
/// links by name and the pods read through it as through the handle.
impl std::ops::Deref for OverlayKernel {
    type Target = Kernel;

    fn deref(&self) -> &Kernel {
        &self.kernel
    }
}
