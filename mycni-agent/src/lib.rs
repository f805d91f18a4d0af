//! mycni-agent: the node agent of the mycni CNI.
//!
//! The library holds everything the binary does, behind narrow seams, so
//! that tests drive the same code the DaemonSet runs. Its rooms:
//!
//! - `watch`: what the agent watches (the API's Nodes, the kernel's
//!   notifications); it only marks work;
//! - `overlay`: the VXLAN devices and what the agent owns on them for its
//!   peers: a pure desired state and diff, and its kernel adapter;
//! - `kernel`: the node's netlink handle, and the pods the datapath reads;
//! - `datapath`: the tc programs and their maps; `tables`: the node's
//!   nftables tables (masquerade, anti-spoofing, underlay filter);
//!   `metrics`: the registry they register their collectors in, and the
//!   HTTP endpoint;
//! - `nft`: the one runner every room's nftables table goes through;
//!   `verdict`: what those tables decide and how they log it (NFLOG's
//!   group, the prefixes and their parser, `Direction`, the drop reasons),
//!   which the policy room writes and the flows room reads; `epoch`: the
//!   handle through which the policy room publishes its epoch to the fast
//!   path;
//! - `agent`: start-up and the loop that runs each room in turn;
//! - `policy`: NetworkPolicy v1 semantics, pure (the evaluator and the
//!   per-pod compiled form); not yet a room of the loop.
//!
//! Node validation is `mycni_common::node`, the address and MAC types
//! `mycni_common::net`; what the agent shares with the plugin (route
//! protocols, veth aliases, the conflist, the ready file) is
//! `mycni_common::contract`.
//!
//! Exported: what `main.rs` and the tests use. `agent` (its [`agent::Config`],
//! [`agent::run`], [`agent::uninstall`]), `overlay` (its kernel adapter and
//! desired state, which the e2e tests drive in namespaces), the datapath
//! and metrics modules; the rest is the crate's own.

pub mod agent;
mod btf;
pub mod caps;
pub mod datapath;
mod epoch;
pub mod flows;
mod kernel;
pub mod kernel_check;
pub mod metrics;
mod nft;
pub mod overlay;
pub mod policy;
pub mod settings;
pub mod tables;
pub mod verdict;
mod watch;

pub use kernel::is_pod_veth;
