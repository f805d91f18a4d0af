//! The one netlink layer of mycni: the plugin, the agent and the tools
//! change and read links, addresses, routes, neighbours, FDB entries and
//! nexthop objects through [`Netlink`], each operation named for what it
//! does, over rtnetlink and netlink-packet-route messages (nexthops over
//! messages of their own, see `nexthops.rs`).
//!
//! A [`Netlink`] is bound to one network namespace for its whole life: the
//! socket for another namespace is opened on a short-lived OS thread that
//! entered it, so no thread of the caller ever changes namespace while
//! async work runs. Every operation needs a tokio runtime (with I/O).
//!
//! Reads go through one request path of their own rather than rtnetlink's
//! `get` builders, for two reasons: the socket asks the kernel to filter
//! dumps (`NETLINK_GET_STRICT_CHK`), which only works when the request's
//! header carries nothing but the filter, and a dump the kernel marks as
//! interrupted by a concurrent change (`NLM_F_DUMP_INTR`, on any message
//! including the final `NLMSG_DONE`, which rtnetlink's builders never show)
//! is repeated instead of handed back with entries missing or doubled.
//! Every filter is applied again on the answer, so kernels without strict
//! checking give the same result, only at a higher cost.
//!
//! Deleting something already gone is success everywhere: every caller
//! wants the thing absent, and it may have gone with its device or its
//! namespace.

use std::fs::File;
use std::prelude::rust_2024::*;
use std::sync::OnceLock;

use netlink_packet_route::RouteNetlinkMessage;
use rtnetlink::Handle;
use rtnetlink::sys::Socket;

// One `impl Netlink` per kind of object, each next to the message
// parsing only it needs; `request` holds what they all share.
mod addresses;
mod batch;
mod error;
mod links;
mod neighbours;
mod nexthops;
mod request;
mod routes;

pub use addresses::Ipv6Address;
pub use batch::Batch;
pub use error::{Cause, Error, Result};
pub use links::{Link, VxlanConfig, VxlanInfo};
pub use neighbours::{FdbEntry, Neighbour, Neighbour6};
pub use nexthops::{Nexthop, NexthopEvents, NexthopMessage, RTNLGRP_NEXTHOP, nexthop_events};
pub use routes::{NexthopRoute, Route, RouteFamily};

use error::gone_is_ok;
use request::{change, connect, request, socket_in};

/// A NETLINK_ROUTE connection bound to one network namespace.
pub struct Netlink {
    handle: Handle,
    /// The namespace, for the nexthop socket opened on first use; None if
    /// it could not be opened (nexthop operations then fail, nothing else).
    netns: Option<File>,
    nexthops: OnceLock<nexthops::NexthopHandle>,
    /// The socket batches of changes go on, opened on first use (see
    /// `batch.rs`), one datagram at a time; dropped after a datagram whose
    /// answers went missing, so the next one starts on a fresh socket.
    batches: futures::lock::Mutex<Option<batch::BatchConn>>,
}

impl Netlink {
    /// A connection in the calling thread's namespace. Must be called
    /// inside a tokio runtime.
    pub fn current() -> Result<Self> {
        let socket = Socket::new(rtnetlink::sys::protocols::NETLINK_ROUTE)
            .map_err(|e| Error::io("netlink socket", &e))?;
        Ok(Self {
            handle: connect(socket)?,
            // The thread's own, not the process's: a test may have moved it.
            netns: File::open("/proc/thread-self/ns/net").ok(),
            nexthops: OnceLock::new(),
            batches: futures::lock::Mutex::new(None),
        })
    }

    /// [`Netlink::current`] with the socket batches go on opened now, in
    /// the same namespace, instead of on first use through a helper thread
    /// that enters it: for a short-lived caller that sends a batch at once
    /// (the plugin's ADD, one per namespace).
    pub fn current_with_batches() -> Result<Self> {
        let nl = Self::current()?;
        let conn = batch::connect_here()?;
        Ok(Self {
            batches: futures::lock::Mutex::new(Some(conn)),
            ..nl
        })
    }

    /// A connection whose socket lives in the namespace `netns` (an open
    /// `/proc/<pid>/ns/net` or `/run/netns/<name>`). Must be called inside
    /// a tokio runtime.
    pub fn in_netns(netns: &File) -> Result<Self> {
        Ok(Self {
            handle: connect(socket_in(netns)?)?,
            netns: netns.try_clone().ok(),
            nexthops: OnceLock::new(),
            batches: futures::lock::Mutex::new(None),
        })
    }

    async fn get(&self, op: &str, msg: RouteNetlinkMessage) -> Result<Option<RouteNetlinkMessage>> {
        match request(&self.handle, op, msg, false).await {
            Ok(mut v) => Ok(v.pop()),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn dump(&self, op: &str, msg: RouteNetlinkMessage) -> Result<Vec<RouteNetlinkMessage>> {
        request(&self.handle, op, msg, true).await
    }

    async fn change(&self, op: &str, msg: RouteNetlinkMessage, flags: u16) -> Result<()> {
        change(&self.handle, op, msg, flags).await
    }
}
