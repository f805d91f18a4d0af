//! The datapath subsystem: the fast path's life in the agent. Load the
//! programs (or say why not), keep the maps an exact mirror of what the
//! kernel holds, attach to `vxlan.1` and every pod veth, detach from what
//! is gone.
//!
//! - [`desired`]: what the maps and attachments should hold, a pure
//!   function of the overlay state and the pods (tested without root).
//! - [`DatapathRoom::sync`]: the apply step, writing that into the maps.
//! - [`programs`]: load, attach, pin and detach the programs.
//! - [`maps`]: the pinned maps, typed, read and synced.
//! - [`counters`]: the collector `/metrics` reads the maps' sizes and the
//!   per-path counters through.
//! - [`inspect`]: `mycni-agent inspect`, the maps rendered for people.
//!
//! The agent, not the plugin, attaches to new pod veths: it is the single
//! writer of the maps, it already reconciles against kernel state, and the
//! plugin stays free of aya and of bpffs (its ADD path stays ~4 ms). It
//! hears of new pods from the kernel's notifications (`kwatch`), within
//! milliseconds of their ADD.
//!
//! With `--tc-encap` (the default) the programs encapsulate and decapsulate
//! VXLAN themselves: the config carries what `vxlan.1` is set up with (VNI,
//! port, local address, TTL, source port range) and the underlay device gets
//! the decapsulating program on its ingress.
//!
//! Peers over the IPv6 underlay are reached through `vxlan6.1` whatever
//! `--tc-encap` says (the programs build no IPv6 outer header): their IPv6
//! podCIDRs go into `mycni_remote6` flagged `REMOTE_VXLAN6`, mirrored from
//! `vxlan6.1`'s routes, neighbours and FDB entries, and `vxlan6.1` gets the
//! program `vxlan.1` has on its ingress.

use std::path::PathBuf;

pub mod attach;
pub mod counters;
pub mod desired;
mod error;
pub mod inspect;
pub mod kdrop;
pub mod kfuncs;
pub mod maps;
mod prog;
pub mod programs;
mod room;
pub mod shaping;

pub use counters::register_metrics;
pub use error::DatapathError;
pub(crate) use maps::PinnedEpoch;
pub use maps::{
    FlowStats, LOCAL, LOCAL6, NexthopGen, PEERS, REMOTE, REMOTE6, read_counters,
    read_family_counters, read_flow_stats, write_config, write_policy_epoch,
};
pub(crate) use programs::detach_all;
pub use programs::{Datapath, Prog, detach, embedded_object, pinned_links};
pub use room::DatapathRoom;

/// The datapath's settings.
#[derive(Debug, Clone)]
pub struct Section {
    pub mode: Mode,
    /// VXLAN encapsulated in tc (`--tc-encap`), not by `vxlan.1`.
    pub tc_encap: bool,
    /// The programs' log (`--ebpf-log`).
    pub log: bool,
    pub pin_dir: PathBuf,
    pub proc_sys: PathBuf,
}

/// `--datapath`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Ebpf,
    Kernel,
}

impl Mode {
    /// The capabilities running it takes (`caps::check` names the ones
    /// missing at start).
    pub fn required_caps(self) -> Vec<crate::caps::Cap> {
        use crate::caps::{BPF, NET_ADMIN, PERFMON};
        match self {
            Mode::Kernel => vec![NET_ADMIN],
            Mode::Ebpf => vec![NET_ADMIN, BPF, PERFMON],
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ebpf" => Ok(Mode::Ebpf),
            "kernel" => Ok(Mode::Kernel),
            _ => Err(format!("unknown datapath {s:?} (ebpf, kernel)")),
        }
    }
}
