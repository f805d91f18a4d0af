//! Kernel notifications, so the agent acts within milliseconds instead of
//! at the next full pass: pods that came or went (the fast path learns
//! them), and the agent's own overlay state removed under it (drift,
//! repaired at once).
//!
//! Pods: the plugin's ADD ends with the pod's /32 host route (protocol
//! 109), and a pod's host veth carries the plugin's alias; DEL removes the
//! veth, and the kernel flushes its routes without a notification, so both
//! routes and links are watched.
//!
//! Drift: the agent's routes (protocol 110) deleted, a permanent neighbour
//! or FDB entry deleted (the agent makes only permanent ones, on the VXLAN
//! device), the VXLAN device deleted. Only deletions: the agent's own
//! additions notify too, and waking a full pass for each would double the
//! work of every change; its own deletions (a peer leaving) cost one
//! extra pass that finds nothing to do.
//!
//! A burst of events (each veth change notifies; 100 pods starting at
//! once) wakes the reconcile loop once per debounce window, and a pass
//! still running when more come is followed by exactly one more (a
//! `Notify` holds at most one permit).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures::StreamExt;
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::LinkAttribute;
use netlink_packet_route::neighbour::NeighbourState;
use netlink_packet_route::route::RouteProtocol;
use rtnetlink::MulticastGroup;
use rtnetlink::packet_core::{NetlinkMessage, NetlinkPayload};
use rtnetlink::sys::AsyncSocket;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::kernel::{RTPROT_MYCNI_AGENT, RTPROT_MYCNI_PLUGIN, is_pod_veth};

/// How long events are collected after the first before waking the loop:
/// long enough to fold one plugin ADD's few notifications and a burst of
/// parallel ADDs into one pass, short next to the pass itself.
pub const DEBOUNCE: Duration = Duration::from_millis(5);

/// Above the 208 KB default: the kernel drops notifications (and says so
/// with ENOBUFS) when the socket buffer fills, e.g. while the runtime is
/// busy. A lost event only delays a pod until the next full pass, but an
/// overrun costs a pass of its own.
const RCVBUF: usize = 1 << 20;

/// What a notification may concern.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Wake {
    /// What `Kernel::pod_endpoints` returns.
    pub pods: bool,
    /// The agent's routes, neighbours, FDB entries or VXLAN device.
    pub overlay: bool,
}

impl Wake {
    fn any(self) -> bool {
        self.pods || self.overlay
    }
    fn or(self, o: Wake) -> Wake {
        Wake {
            pods: self.pods || o.pods,
            overlay: self.overlay || o.overlay,
        }
    }
}

/// Which passes a notification calls for. `vxlan` is the VXLAN device's
/// name, `vxlan_index` its ifindex (0 before the first pass).
pub fn classify(msg: &NetlinkMessage<RouteNetlinkMessage>, vxlan: &str, vxlan_index: u32) -> Wake {
    let pods = |b| Wake {
        pods: b,
        overlay: false,
    };
    let overlay = |b| Wake {
        pods: false,
        overlay: b,
    };
    let NetlinkPayload::InnerMessage(m) = &msg.payload else {
        // Notifications were lost: any of them may have mattered.
        return if matches!(msg.payload, NetlinkPayload::Overrun(_)) {
            Wake {
                pods: true,
                overlay: true,
            }
        } else {
            Wake::default()
        };
    };
    match m {
        RouteNetlinkMessage::NewRoute(r) | RouteNetlinkMessage::DelRoute(r)
            if r.header.protocol == RouteProtocol::Other(RTPROT_MYCNI_PLUGIN) =>
        {
            pods(true)
        }
        RouteNetlinkMessage::DelRoute(r) => {
            overlay(r.header.protocol == RouteProtocol::Other(RTPROT_MYCNI_AGENT))
        }
        RouteNetlinkMessage::NewLink(l) | RouteNetlinkMessage::DelLink(l)
            if l.attributes
                .iter()
                .any(|a| matches!(a, LinkAttribute::IfAlias(x) if is_pod_veth(x))) =>
        {
            pods(true)
        }
        RouteNetlinkMessage::DelLink(l) => overlay(
            l.attributes
                .iter()
                .any(|a| matches!(a, LinkAttribute::IfName(n) if n == vxlan)),
        ),
        // `ip neigh del` fails the entry before removing it, so the
        // notification no longer says PERMANENT; FDB removals still do.
        RouteNetlinkMessage::DelNeighbour(n) => overlay(
            n.header.state == NeighbourState::Permanent
                || (vxlan_index != 0 && n.header.ifindex == vxlan_index),
        ),
        _ => Wake::default(),
    }
}

/// Subscribes to link, IPv4 route and neighbour (incl. FDB) notifications in
/// the calling thread's network namespace and notifies `pods` or `overlay`
/// (debounced) whenever one may concern them. Needs a tokio runtime. If the
/// subscription ends, it says so and the periodic full pass alone keeps the
/// kernel in step.
pub fn spawn(
    pods: Arc<Notify>,
    overlay: Arc<Notify>,
    vxlan: String,
    vxlan_index: Arc<AtomicU32>,
) -> std::io::Result<JoinHandle<()>> {
    let (mut conn, handle, mut messages) = rtnetlink::new_multicast_connection(&[
        MulticastGroup::Link,
        MulticastGroup::Ipv4Route,
        MulticastGroup::Neigh,
    ])?;
    if let Err(e) = conn.socket_mut().socket_mut().set_rx_buf_sz(RCVBUF) {
        tracing::debug!(error = %e, "cannot enlarge the netlink notification buffer");
    }
    tokio::spawn(conn);
    Ok(tokio::spawn(async move {
        // The connection shuts down once its handle is gone.
        let _handle = handle;
        while let Some((msg, _)) = messages.next().await {
            let index = vxlan_index.load(Ordering::Relaxed);
            let mut wake = classify(&msg, &vxlan, index);
            if !wake.any() {
                continue;
            }
            let until = tokio::time::Instant::now() + DEBOUNCE;
            while let Ok(Some((msg, _))) = tokio::time::timeout_at(until, messages.next()).await {
                wake = wake.or(classify(&msg, &vxlan, index));
            }
            if wake.pods {
                pods.notify_one();
            }
            if wake.overlay {
                overlay.notify_one();
            }
        }
        tracing::warn!(
            "kernel notifications ended; pods and drift are caught at the next full pass"
        );
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_route::link::LinkMessage;
    use netlink_packet_route::neighbour::NeighbourMessage;
    use netlink_packet_route::route::RouteMessage;

    fn msg(m: RouteNetlinkMessage) -> NetlinkMessage<RouteNetlinkMessage> {
        NetlinkMessage::from(m)
    }

    fn route(proto: RouteProtocol) -> RouteMessage {
        let mut r = RouteMessage::default();
        r.header.protocol = proto;
        r
    }

    fn link(alias: Option<&str>) -> LinkMessage {
        let mut l = LinkMessage::default();
        l.attributes.push(LinkAttribute::IfName("x".into()));
        if let Some(a) = alias {
            l.attributes.push(LinkAttribute::IfAlias(a.into()));
        }
        l
    }

    const PODS: Wake = Wake {
        pods: true,
        overlay: false,
    };
    const OVERLAY: Wake = Wake {
        pods: false,
        overlay: true,
    };

    fn wake(m: RouteNetlinkMessage) -> Wake {
        classify(&msg(m), "vxlan.1", 7)
    }

    fn neigh(state: NeighbourState) -> NeighbourMessage {
        let mut n = NeighbourMessage::default();
        n.header.state = state;
        n
    }

    #[test]
    fn pod_routes_and_pod_veths_wake_the_pods_pass() {
        let pod = RouteProtocol::Other(RTPROT_MYCNI_PLUGIN);
        assert_eq!(wake(RouteNetlinkMessage::NewRoute(route(pod))), PODS);
        assert_eq!(wake(RouteNetlinkMessage::DelRoute(route(pod))), PODS);
        let veth = || link(Some("mycni:mycni0:abc:eth0"));
        assert_eq!(wake(RouteNetlinkMessage::NewLink(veth())), PODS);
        assert_eq!(wake(RouteNetlinkMessage::DelLink(veth())), PODS);
        let lost = NetlinkMessage::new(Default::default(), NetlinkPayload::Overrun(vec![]));
        assert_eq!(
            classify(&lost, "vxlan.1", 7),
            Wake {
                pods: true,
                overlay: true
            }
        );
    }

    #[test]
    fn the_agents_state_deleted_wakes_a_drift_pass() {
        let agent = RouteProtocol::Other(RTPROT_MYCNI_AGENT);
        assert_eq!(wake(RouteNetlinkMessage::DelRoute(route(agent))), OVERLAY);
        assert_eq!(
            wake(RouteNetlinkMessage::DelNeighbour(neigh(
                NeighbourState::Permanent
            ))),
            OVERLAY
        );
        // As `ip neigh del` reports it: failed first, on vxlan.1.
        let mut failed = neigh(NeighbourState::Failed);
        failed.header.ifindex = 7;
        assert_eq!(wake(RouteNetlinkMessage::DelNeighbour(failed)), OVERLAY);
        let mut vx = LinkMessage::default();
        vx.attributes.push(LinkAttribute::IfName("vxlan.1".into()));
        assert_eq!(wake(RouteNetlinkMessage::DelLink(vx)), OVERLAY);
    }

    #[test]
    fn other_changes_and_the_agents_own_additions_do_not() {
        for p in [
            RouteProtocol::Kernel,
            RouteProtocol::Boot,
            RouteProtocol::Other(RTPROT_MYCNI_AGENT),
        ] {
            assert_eq!(
                wake(RouteNetlinkMessage::NewRoute(route(p))),
                Wake::default()
            );
        }
        assert_eq!(
            wake(RouteNetlinkMessage::DelRoute(route(RouteProtocol::Boot))),
            Wake::default()
        );
        assert_eq!(
            wake(RouteNetlinkMessage::NewLink(link(None))),
            Wake::default()
        );
        assert_eq!(
            wake(RouteNetlinkMessage::DelLink(link(Some("someone else's")))),
            Wake::default()
        );
        assert_eq!(
            wake(RouteNetlinkMessage::DelNeighbour(neigh(
                NeighbourState::Reachable
            ))),
            Wake::default()
        );
        assert_eq!(
            wake(RouteNetlinkMessage::NewNeighbour(neigh(
                NeighbourState::Permanent
            ))),
            Wake::default()
        );
    }
}
