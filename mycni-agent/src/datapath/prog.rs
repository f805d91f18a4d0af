//! The programs of `mycni-ebpf` by name: what loading, attaching, the
//! maps' discovery and `inspect` all name (kept apart so none of them
//! imports another for it).

use super::error::DatapathError;

/// The programs, by the interface they run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Prog {
    /// Ingress of every pod's host-side veth.
    FromPod,
    /// Ingress of `vxlan.1` and of `vxlan6.1`.
    FromVxlan,
    /// Ingress of the underlay device (tc decapsulation).
    FromUnderlay,
}

impl Prog {
    pub const ALL: [Prog; 3] = [Prog::FromPod, Prog::FromVxlan, Prog::FromUnderlay];

    /// What aya says went wrong with this program, as the agent says it.
    pub(super) fn error(self) -> impl Fn(aya::programs::ProgramError) -> DatapathError + Copy {
        move |source| DatapathError::Program {
            name: self.name(),
            source,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Prog::FromPod => "mycni_from_pod",
            Prog::FromVxlan => "mycni_from_vxlan",
            Prog::FromUnderlay => "mycni_from_underlay",
        }
    }
}

/// Program attached on ingress of every pod's host-side veth.
pub const PROG_FROM_POD: &str = "mycni_from_pod";
