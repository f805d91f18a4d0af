//! `mycni_netlink_op_duration_seconds{op}`: how long each kind of netlink
//! request of the agent takes, timed where the request is made.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

use super::NETLINK_BUCKETS;

/// The netlink operations timed in `mycni_netlink_op_duration_seconds`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum NetlinkOp {
    /// Reading routes, neighbours and FDB entries of the overlay.
    Dump,
    /// Checking (and creating or fixing) `vxlan.1` and its address.
    EnsureVxlan,
    /// Reading the pods' routes and veths for the fast path.
    PodEndpoints,
    RouteSet,
    RouteDel,
    NeighbourSet,
    NeighbourDel,
    FdbSet,
    FdbDel,
}

impl NetlinkOp {
    pub const ALL: [NetlinkOp; 9] = [
        NetlinkOp::Dump,
        NetlinkOp::EnsureVxlan,
        NetlinkOp::PodEndpoints,
        NetlinkOp::RouteSet,
        NetlinkOp::RouteDel,
        NetlinkOp::NeighbourSet,
        NetlinkOp::NeighbourDel,
        NetlinkOp::FdbSet,
        NetlinkOp::FdbDel,
    ];

    /// The `op` label value.
    pub fn name(self) -> &'static str {
        match self {
            NetlinkOp::Dump => "dump",
            NetlinkOp::EnsureVxlan => "ensure_vxlan",
            NetlinkOp::PodEndpoints => "pod_endpoints",
            NetlinkOp::RouteSet => "route_set",
            NetlinkOp::RouteDel => "route_del",
            NetlinkOp::NeighbourSet => "neighbour_set",
            NetlinkOp::NeighbourDel => "neighbour_del",
            NetlinkOp::FdbSet => "fdb_set",
            NetlinkOp::FdbDel => "fdb_del",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OpLabels {
    pub(super) op: &'static str,
}

pub(super) type NetlinkFamily = Family<OpLabels, Histogram, fn() -> Histogram>;

/// Process-wide rather than in [`Metrics`]: the netlink calls live in
/// `kernel`, which has no handle on the agent's metrics and should not need
/// one to be timed.
pub(super) static NETLINK_OPS: LazyLock<NetlinkFamily> = LazyLock::new(|| {
    let family: NetlinkFamily = Family::new_with_constructor(|| Histogram::new(NETLINK_BUCKETS));
    // Every op is exported from the start: a series that appears only at
    // its first request makes rate() and the dashboards miss that request.
    for op in NetlinkOp::ALL {
        drop(family.get_or_create(&OpLabels { op: op.name() }));
    }
    family
});

/// Records one netlink request of kind `op` that took `took`.
pub(crate) fn observe_netlink(op: NetlinkOp, took: Duration) {
    NETLINK_OPS
        .get_or_create(&OpLabels { op: op.name() })
        .observe(took.as_secs_f64());
}

/// Awaits `f` and records how long it took as one `op` request.
pub(crate) async fn netlink_timed<T>(op: NetlinkOp, f: impl Future<Output = T>) -> T {
    let started = Instant::now();
    let out = f.await;
    observe_netlink(op, started.elapsed());
    out
}
