//! mycni-agent: the node agent of the mycni CNI.
//!
//! The library holds everything the binary does, behind narrow seams, so that
//! tests drive the same code the DaemonSet runs: `peers` and `reconcile` are
//! pure, `kernel` (and `kwatch`) talk netlink, `agent` talks to the
//! Kubernetes API and runs the reconcile loop, `fastpath` and `ebpf` own the
//! programs and maps. What the agent shares with the plugin (route
//! protocols, veth aliases, the conflist, the ready file) is
//! `mycni_common::contract`.

pub mod agent;
pub mod antispoof;
pub mod caps;
pub mod ebpf;
pub mod fastpath;
pub mod inspect;
pub mod kernel;
pub mod kwatch;
pub mod masq;
pub mod metrics;
pub mod peers;
pub mod policy;
pub mod reconcile;
pub mod underlay_filter;
