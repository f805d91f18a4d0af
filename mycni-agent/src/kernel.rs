//! The agent's kernel handle: one netlink connection in the node's
//! network namespace, shared by the subsystems. The overlay's adapter
//! (`overlay::OverlayKernel`) is built over it; what the datapath reads of
//! the node (its pods) is `pods`.

use mycni_common::netlink::{self, Link, Netlink};
use thiserror::Error;

mod pods;

pub use pods::is_pod_veth;
pub(crate) use pods::{PodEndpoint, PodEndpoints};

/// The agent's routes carry its own protocol so a restarted agent finds its
/// stale routes and nobody else's; the plugin's pod routes and host veths
/// are found by the plugin's marks. All of them are the contract's.
pub use mycni_common::contract::{RTPROT_MYCNI_AGENT, RTPROT_MYCNI_PLUGIN, VethAlias};

#[derive(Debug, Error)]
pub enum KernelError {
    #[error(transparent)]
    Netlink(#[from] netlink::Error),
    #[error("{0}")]
    Other(String),
}

/// A netlink connection in the namespace it was made in.
pub struct Kernel {
    pub(crate) nl: Netlink,
}

impl Kernel {
    /// A netlink handle in the calling thread's namespace; needs a tokio runtime.
    pub fn new() -> Result<Self, KernelError> {
        Ok(Self {
            nl: Netlink::current()?,
        })
    }

    pub async fn link(&self, name: &str) -> Result<Option<Link>, KernelError> {
        Ok(self.nl.link_by_name(name).await?)
    }

    pub(crate) async fn del_link(&self, index: u32) -> Result<(), KernelError> {
        Ok(self.nl.delete_link(index).await?)
    }
}
