//! The order `run --help` lists the flags in: the one they had before they
//! were grouped by room, kept so that the help reads as it did. Each flag
//! gives its place as `display_order = Order::<Flag> as usize`.

#[derive(Clone, Copy)]
pub(super) enum Order {
    NodeName,
    PodName,
    PodNamespace,
    Kubeconfig,
    ClusterCidr,
    Iface,
    Mtu,
    VxlanName,
    Vxlan6Name,
    Underlay6,
    Vni,
    VxlanPort,
    CniConfDir,
    StateDir,
    DataDir,
    ProcSys,
    MetricsAddr,
    Resync,
    LivenessStaleAfter,
    Masquerade,
    NetworkPolicy,
    FlowHistory,
    FlowPodSeries,
    Bpffs,
    Datapath,
    EbpfLog,
    TcEncap,
    FlowEvents,
    DirectRouting,
    EbpfObject,
    IpamDataDir,
    PluginLogFile,
}
