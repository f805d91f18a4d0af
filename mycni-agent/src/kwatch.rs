//! Kernel notifications that pods came or went, so the fast path learns a
//! new pod within milliseconds instead of at the next full pass.
//!
//! The plugin's ADD ends with the pod's /32 host route (protocol 109), and
//! a pod's host veth carries the plugin's alias; DEL removes the veth, and
//! the kernel flushes its routes without a notification, so both routes
//! and links are watched. A burst of events (each veth change notifies;
//! 100 pods starting at once) wakes the reconcile loop once per debounce
//! window, and a pass still running when more come is followed by exactly
//! one more (a `Notify` holds at most one permit).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::LinkAttribute;
use netlink_packet_route::route::RouteProtocol;
use rtnetlink::MulticastGroup;
use rtnetlink::packet_core::{NetlinkMessage, NetlinkPayload};
use rtnetlink::sys::AsyncSocket;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::kernel::{RTPROT_MYCNI_PLUGIN, is_pod_veth};

/// How long events are collected after the first before waking the loop:
/// long enough to fold one plugin ADD's few notifications and a burst of
/// parallel ADDs into one pass, short next to the pass itself.
pub const DEBOUNCE: Duration = Duration::from_millis(5);

/// Above the 208 KB default: the kernel drops notifications (and says so
/// with ENOBUFS) when the socket buffer fills, e.g. while the runtime is
/// busy. A lost event only delays a pod until the next full pass, but an
/// overrun costs a pass of its own.
const RCVBUF: usize = 1 << 20;

/// Whether a notification can change what `Kernel::pod_endpoints` returns.
pub fn relevant(msg: &NetlinkMessage<RouteNetlinkMessage>) -> bool {
    match &msg.payload {
        NetlinkPayload::InnerMessage(
            RouteNetlinkMessage::NewRoute(r) | RouteNetlinkMessage::DelRoute(r),
        ) => r.header.protocol == RouteProtocol::Other(RTPROT_MYCNI_PLUGIN),
        NetlinkPayload::InnerMessage(
            RouteNetlinkMessage::NewLink(l) | RouteNetlinkMessage::DelLink(l),
        ) => l
            .attributes
            .iter()
            .any(|a| matches!(a, LinkAttribute::IfAlias(x) if is_pod_veth(x))),
        // Notifications were lost: any of them may have been a pod.
        NetlinkPayload::Overrun(_) => true,
        _ => false,
    }
}

/// Subscribes to link and IPv4 route notifications in the calling
/// thread's network namespace and notifies `wake` (debounced) whenever one
/// may concern a pod. Needs a tokio runtime. If the subscription ends, it
/// says so and the periodic full pass alone keeps pods in step.
pub fn spawn(wake: Arc<Notify>) -> std::io::Result<JoinHandle<()>> {
    let (mut conn, handle, mut messages) =
        rtnetlink::new_multicast_connection(&[MulticastGroup::Link, MulticastGroup::Ipv4Route])?;
    if let Err(e) = conn.socket_mut().socket_mut().set_rx_buf_sz(RCVBUF) {
        tracing::debug!(error = %e, "cannot enlarge the netlink notification buffer");
    }
    tokio::spawn(conn);
    Ok(tokio::spawn(async move {
        // The connection shuts down once its handle is gone.
        let _handle = handle;
        while let Some((msg, _)) = messages.next().await {
            if !relevant(&msg) {
                continue;
            }
            let until = tokio::time::Instant::now() + DEBOUNCE;
            while let Ok(Some(_)) = tokio::time::timeout_at(until, messages.next()).await {}
            wake.notify_one();
        }
        tracing::warn!(
            "kernel notifications ended; new pods reach the fast path at the next full pass"
        );
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_route::link::LinkMessage;
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

    #[test]
    fn pod_routes_and_pod_veths_wake_the_loop() {
        let pod = RouteProtocol::Other(RTPROT_MYCNI_PLUGIN);
        assert!(relevant(&msg(RouteNetlinkMessage::NewRoute(route(pod)))));
        assert!(relevant(&msg(RouteNetlinkMessage::DelRoute(route(pod)))));
        let veth = || link(Some("mycni:mycni0:abc:eth0"));
        assert!(relevant(&msg(RouteNetlinkMessage::NewLink(veth()))));
        assert!(relevant(&msg(RouteNetlinkMessage::DelLink(veth()))));
        assert!(relevant(&NetlinkMessage::new(
            Default::default(),
            NetlinkPayload::Overrun(vec![]),
        )));
    }

    #[test]
    fn other_routes_and_links_do_not() {
        for p in [
            RouteProtocol::Kernel,
            RouteProtocol::Boot,
            RouteProtocol::Other(crate::kernel::RTPROT_MYCNI_AGENT),
        ] {
            assert!(!relevant(&msg(RouteNetlinkMessage::NewRoute(route(p)))));
        }
        assert!(!relevant(&msg(RouteNetlinkMessage::NewLink(link(None)))));
        assert!(!relevant(&msg(RouteNetlinkMessage::DelLink(link(Some(
            "someone else's"
        ))))));
    }
}
