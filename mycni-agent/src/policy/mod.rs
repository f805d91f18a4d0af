//! NetworkPolicy (networking.k8s.io/v1) enforced on this node. Its meaning
//! is on the ground floor (`crate::cluster`: model, conversion, the
//! reference evaluator), shared with the flows room that explains it.
//!
//! - `compile`: the per-pod form (isolation per direction, peer
//!   addresses/prefixes x protocol x port ranges), selectors and named
//!   ports already resolved.
//! - The room (`room`): its watch (`crate::watch::PolicyWatch`), its
//!   desired state (`sets`: the members of the nftables sets, disjoint, as
//!   text), its apply step (`nft`: the fixed ruleset of `inet mycni_policy`
//!   in the forward hook, then set members only) and its series
//!   (`metrics`).
//!
//! The API only speaks of TCP, UDP and SCTP: ARP never reaches an `inet`
//! table, neighbour discovery and ICMP errors pass first, and other
//! protocols (ICMP echo) pass only where a rule without `ports` admits the
//! peer.

pub mod compile;
pub mod counters;
pub mod inspect;
pub mod metrics;
pub mod nft;
pub mod room;
pub mod sets;

#[cfg(test)]
pub(crate) mod tests;

pub use compile::compile_node;
#[cfg(test)]
pub(crate) use compile::{CompiledPod, DirectionRules, PeerSet, PortRange, PortSet, compile_pod};
