//! `run`'s datapath flags: which datapath, its eBPF object, bpffs, tc's
//! encapsulation and the programs' packet log.

use std::path::PathBuf;

use clap::Args;
use mycni_agent::datapath::Mode;
use mycni_agent::settings::DATAPATH;

use super::order::Order;

#[derive(Args, Clone)]
pub(super) struct DatapathArgs {
    /// bpffs mount; pinned maps and links live under <bpffs>/mycni.
    #[arg(long, env = "MYCNI_BPFFS", default_value = "/sys/fs/bpf", display_order = Order::Bpffs as usize)]
    pub bpffs: PathBuf,
    /// `ebpf`: the tc fast path, with the kernel's routes, ARP and FDB as
    /// the fallback (used alone if the programs cannot load); `kernel`:
    /// routes, ARP and FDB only, and anything mycni attached is detached.
    #[arg(long = DATAPATH.flag, env = DATAPATH.env, default_value = "ebpf", value_parser = parse_datapath, display_order = Order::Datapath as usize)]
    pub datapath: Mode,
    /// Log every packet the tc programs see (aya-log, debug level; also set
    /// MYCNI_LOG=debug), with an --ebpf-object built with mycni-ebpf's
    /// `packet-log` feature. A ring-buffer write per packet: debugging only.
    #[arg(long, env = "MYCNI_EBPF_LOG", display_order = Order::EbpfLog as usize)]
    pub ebpf_log: bool,
    /// With --datapath ebpf: encapsulate traffic to remote pods in tc and
    /// send it out of the underlay, and decapsulate VXLAN from peers at the
    /// underlay's ingress (datapath v2). `false` hands remote traffic to
    /// `vxlan.1` instead (the kernel encapsulates), as agents before v2 did.
    #[arg(long, env = "MYCNI_TC_ENCAP", default_value_t = true, action = clap::ArgAction::Set, display_order = Order::TcEncap as usize)]
    pub tc_encap: bool,
    /// Load this eBPF object instead of the one built into the agent.
    #[arg(long, env = "MYCNI_EBPF_OBJECT", display_order = Order::EbpfObject as usize)]
    pub ebpf_object: Option<PathBuf>,
}

fn parse_datapath(s: &str) -> Result<Mode, String> {
    DATAPATH.check(s.trim().parse())
}
