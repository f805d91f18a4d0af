//! mycni-agent: the node agent of the mycni CNI.
//!
//! The library holds everything the binary does, behind narrow seams, so
//! that tests drive the same code the DaemonSet runs. Three floors, each
//! importing only the ones below it (`cargo xtask shape` checks it):
//!
//! - the top: `agent` (start-up, the loop that runs each room in turn,
//!   uninstall) and `kernel_check`;
//! - the rooms, which never import each other: `overlay` (the VXLAN
//!   devices and what the agent owns on them for its peers), `datapath`
//!   (the tc programs and their maps), `policy` (NetworkPolicy enforced in
//!   nftables), `flows` (what the node's packets did, and why), `tables`
//!   (the node's other nftables tables: masquerade, anti-spoofing, the
//!   underlay filter);
//! - the ground floor, what several rooms speak: `watch` (the API's and
//!   the kernel's notifications; it only marks work), `kernel` (the
//!   node's netlink handle and its pods), `topology` (what the overlay
//!   publishes: device specs, its state, the underlay's selection),
//!   `cluster` (the watched Pods, Namespaces and NetworkPolicies, and
//!   NetworkPolicy's meaning over them), `verdict` (what the nftables
//!   tables decide and how they log it), `nft` (the one runner of `nft`),
//!   `epoch` (the policy epoch's handle), `settings` (each setting's flag,
//!   env var and ConfigMap key, declared once), `caps`, `btf`, `metrics` (the
//!   registry the rooms' collectors join) and `api` (the HTTP API that
//!   serves them, and the CLI's client of it).
//!
//! Node validation is `mycni_common::node`, the address and MAC types
//! `mycni_common::net`; what the agent shares with the plugin (route
//! protocols, veth aliases, the conflist, the ready file) is
//! `mycni_common::contract`.
//!
//! Exported: what the binary (`main.rs`, `cli/`) and the tests use; every
//! other item is `pub(crate)`.

pub mod agent;
pub mod api;
mod btf;
pub mod caps;
pub mod cluster;
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
pub mod topology;
pub mod verdict;
mod watch;

pub use kernel::is_pod_veth;
