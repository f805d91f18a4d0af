//! The rtnetlink notification socket and the task that reads it.

use std::sync::Arc;

use rtnetlink::sys::{AsyncSocket, AsyncSocketExt, TokioSocket, protocols::NETLINK_ROUTE};
use tokio::task::JoinHandle;

use mycni_common::netlink::RTNLGRP_NEXTHOP;

use super::DEBOUNCE;
use super::classify::classify_datagram;
use super::watched::{Signals, Wake, Watched};

/// Above the 208 KB default: the kernel drops notifications (and says so
/// with ENOBUFS) when the socket buffer fills, e.g. while a flush of
/// thousands of routes notifies. A loss wakes every kind of pass, which
/// re-reads everything, so nothing is missed, but it costs a full pass.
const RCVBUF: usize = 4 << 20;

// rtnetlink multicast groups (linux/rtnetlink.h).
const RTNLGRP_LINK: u32 = 1;
const RTNLGRP_NEIGH: u32 = 3;
const RTNLGRP_TC: u32 = 4;
const RTNLGRP_IPV4_IFADDR: u32 = 5;
const RTNLGRP_IPV4_ROUTE: u32 = 7;
const RTNLGRP_IPV6_IFADDR: u32 = 9;
const RTNLGRP_IPV6_ROUTE: u32 = 11;

/// Subscribes to link, IPv4 and IPv6 address and route, neighbour (incl. FDB),
/// qdisc (a pod shaped by another tool) and nexthop notifications in the calling thread's network namespace and
/// raises `signals` (debounced) whenever one may concern them. Needs a
/// tokio runtime. The task ends (and says so) only if the socket fails;
/// the loop then subscribes again.
pub fn spawn(signals: Signals, watched: Arc<Watched>) -> std::io::Result<JoinHandle<()>> {
    let mut sock = TokioSocket::new(NETLINK_ROUTE)?;
    let s = sock.socket_mut();
    s.bind_auto()?;
    for g in [
        RTNLGRP_LINK,
        RTNLGRP_NEIGH,
        RTNLGRP_TC,
        RTNLGRP_IPV4_IFADDR,
        RTNLGRP_IPV4_ROUTE,
    ] {
        s.add_membership(g)?;
    }
    for g in [RTNLGRP_IPV6_IFADDR, RTNLGRP_IPV6_ROUTE] {
        if let Err(e) = s.add_membership(g) {
            // A kernel without IPv6 has no IPv6 state to drift.
            tracing::debug!(error = %e, group = g, "no IPv6 notifications");
        }
    }
    if let Err(e) = s.add_membership(RTNLGRP_NEXTHOP) {
        // Kernels before 5.3 have no nexthop objects, so no routes use them.
        tracing::debug!(error = %e, "no nexthop notifications");
    }
    if let Err(e) = s.set_rx_buf_sz(RCVBUF) {
        tracing::debug!(error = %e, "cannot enlarge the netlink notification buffer");
    }
    Ok(tokio::spawn(async move {
        loop {
            let mut wake = match recv(&sock, &watched).await {
                Ok(w) => w,
                Err(e) => {
                    tracing::warn!(error = %e, "kernel notifications failed");
                    return;
                }
            };
            if !wake.any() {
                continue;
            }
            let until = tokio::time::Instant::now() + DEBOUNCE;
            while let Ok(r) = tokio::time::timeout_at(until, recv(&sock, &watched)).await {
                match r {
                    Ok(w) => wake = wake.or(w),
                    Err(e) => {
                        signals.raise(wake);
                        tracing::warn!(error = %e, "kernel notifications failed");
                        return;
                    }
                }
            }
            signals.raise(wake);
        }
    }))
}

/// One datagram, classified; an overrun (ENOBUFS) is every kind of wake.
async fn recv(sock: &TokioSocket, watched: &Watched) -> std::io::Result<Wake> {
    match sock.recv_from_full().await {
        Ok((buf, _)) => {
            watched.notified();
            Ok(classify_datagram(&buf, &watched.snapshot()))
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
            watched.notified();
            tracing::debug!("kernel notifications overran the socket buffer");
            Ok(Wake::ALL)
        }
        Err(e) => Err(e),
    }
}
