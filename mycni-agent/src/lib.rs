//! mycni-agent: the node agent of the mycni CNI.
//!
//! The library holds everything the binary does, behind narrow seams, so that
//! tests drive the same code the DaemonSet runs: `peers` and `reconcile` are
//! pure, `kernel` talks netlink, `node` talks to the Kubernetes API.

pub mod agent;
pub mod caps;
pub mod ebpf;
pub mod fastpath;
pub mod inspect;
pub mod kernel;
pub mod kwatch;
pub mod masq;
pub mod metrics;
pub mod peers;
pub mod reconcile;
pub mod underlay_filter;
