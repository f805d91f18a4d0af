//! The sockets and the one read path every `get` and dump goes through
//! (see the module documentation of [`super`]).

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
use std::prelude::rust_2024::*;

use futures::StreamExt;
use netlink_packet_route::RouteNetlinkMessage;
use rtnetlink::Handle;
use rtnetlink::packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload,
};
use rtnetlink::sys::{Socket, TokioSocket};

use super::{Cause, Error, Result};

/// Whether `netns` is the calling thread's network namespace: the same
/// nsfs inode, as `ip netns identify` compares them.
fn is_current_netns(netns: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (
        netns.metadata(),
        std::fs::metadata("/proc/thread-self/ns/net"),
    ) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

/// How often a dump interrupted by concurrent changes is tried in all.
/// Each attempt takes about a millisecond per thousand entries; five
/// interruptions in a row mean changes faster than a dump can be read.
pub(super) const DUMP_ATTEMPTS: usize = 5;

/// A socket of the calling thread's namespace, made asynchronous. Strict
/// checking is best effort: kernels before 4.20 lack it and ignore the
/// filters, which are applied again on the answers anyway.
pub(super) fn connect(socket: Socket) -> Result<Handle> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(Error::new(
            "netlink connection",
            Cause::Other("not inside a tokio runtime".into()),
        ));
    }
    let _ = socket.set_netlink_get_strict_chk(true);
    // SAFETY: the descriptor comes from `into_raw_fd` and is owned by
    // nothing else; TokioSocket takes it over (and needs the runtime's
    // reactor, which `tokio::spawn` below needs too).
    let socket = unsafe { TokioSocket::from_raw_fd(socket.into_raw_fd()) };
    let (mut conn, handle, _) = rtnetlink::from_socket(socket);
    // NLMSG_DONE may carry the only NLM_F_DUMP_INTR of a dump. Every read
    // goes through `Netlink::request`, which expects it; the change
    // requests only ever see acknowledgements.
    conn.set_forward_done(true);
    tokio::spawn(conn);
    Ok(handle)
}

/// The one request path of every read: a single get, or a dump repeated
/// while the kernel reports it interrupted.
pub(super) async fn request(
    handle: &Handle,
    op: &str,
    msg: RouteNetlinkMessage,
    dump: bool,
) -> Result<Vec<RouteNetlinkMessage>> {
    let attempts = if dump { DUMP_ATTEMPTS } else { 1 };
    for _ in 0..attempts {
        let mut req = NetlinkMessage::from(msg.clone());
        req.header.flags = NLM_F_REQUEST | if dump { NLM_F_DUMP } else { 0 };
        let mut replies = handle
            .clone()
            .request(req)
            .map_err(|e| Error::rtnl(op, e))?;
        if let Some(out) = read_replies(op, &mut replies).await? {
            return Ok(out);
        }
    }
    Err(Error::new(op, Cause::Interrupted))
}

/// One change, acknowledged: `flags` (NLM_F_CREATE, NLM_F_REPLACE, ...)
/// on top of NLM_F_REQUEST | NLM_F_ACK. The messages are those a
/// [`super::Batch`] sends, so one change and many are the same request.
pub(super) async fn change(
    handle: &Handle,
    op: &str,
    msg: RouteNetlinkMessage,
    flags: u16,
) -> Result<()> {
    let mut req = NetlinkMessage::from(msg);
    req.header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
    let mut replies = handle
        .clone()
        .request(req)
        .map_err(|e| Error::rtnl(op, e))?;
    read_replies(op, &mut replies).await.map(drop)
}

/// The inner messages of one request's replies, or None when the kernel
/// marked the dump interrupted (`NLM_F_DUMP_INTR`, on any message
/// including the final `NLMSG_DONE`): the caller asks again. The first
/// error the kernel answers with ends it. Shared by the rtnetlink
/// connection and the nexthops' own.
pub(super) async fn read_replies<T>(
    op: &str,
    replies: &mut (impl futures::Stream<Item = NetlinkMessage<T>> + Unpin),
) -> Result<Option<Vec<T>>> {
    let mut out = Vec::new();
    let mut interrupted = false;
    while let Some(m) = replies.next().await {
        interrupted |= m.header.flags & NLM_F_DUMP_INTR != 0;
        match m.payload {
            NetlinkPayload::InnerMessage(inner) => out.push(inner),
            NetlinkPayload::Error(e) if e.raw_code() != 0 => {
                return Err(Error::new(op, Cause::Errno(-e.raw_code())));
            }
            _ => {}
        }
    }
    Ok((!interrupted).then_some(out))
}

/// A NETLINK_ROUTE socket inside the namespace `netns`, opened from a
/// throwaway thread, so the caller's thread never leaves its namespace;
/// here when the caller is in `netns` already (the agent's own sockets):
/// setns(2) needs CAP_SYS_ADMIN even into the namespace a thread is in,
/// and the agent holds none once its programs are loaded.
pub(super) fn socket_in(netns: &File) -> Result<Socket> {
    if is_current_netns(netns) {
        return Socket::new(rtnetlink::sys::protocols::NETLINK_ROUTE)
            .map_err(|e| Error::io("netlink socket", &e));
    }
    let ns_fd = netns.as_raw_fd();
    std::thread::scope(|s| {
        s.spawn(|| -> Result<Socket> {
            // SAFETY: setns(2) with a descriptor we borrow for the call;
            // it moves only this short-lived thread.
            if unsafe { libc::setns(ns_fd, libc::CLONE_NEWNET) } != 0 {
                return Err(Error::io(
                    "entering the network namespace",
                    &std::io::Error::last_os_error(),
                ));
            }
            Socket::new(rtnetlink::sys::protocols::NETLINK_ROUTE)
                .map_err(|e| Error::io("netlink socket in the network namespace", &e))
        })
        .join()
        .map_err(|_| {
            Error::new(
                "entering the network namespace",
                Cause::Other("thread panicked".into()),
            )
        })?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_own_namespace_is_recognised_and_needs_no_setns() {
        let own = File::open("/proc/thread-self/ns/net").expect("own netns");
        assert!(is_current_netns(&own));
        let other = File::open("/proc/self/status").expect("a file");
        assert!(!is_current_netns(&other));
        // Here no thread enters anything: this works without CAP_SYS_ADMIN.
        socket_in(&own).expect("a socket in the own namespace");
    }
}
