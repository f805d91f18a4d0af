//! Many changes (neighbours, FDB entries, routes, addresses, links) a
//! datagram at a time.
//!
//! One change per request costs a round trip through the connection task
//! and the kernel each (~17 us at thousands of peers, most of it wake-ups
//! and the answer's own read, not the kernel's work). A [`Batch`] puts up
//! to [`BATCH`] requests in one datagram, which the kernel handles in
//! order within that one `sendmsg`. Only the last asks for an
//! acknowledgement (NLM_F_ACK): the kernel answers a request that fails
//! whether it was asked to or not, with its sequence number, so once the
//! last one's answer is in, every failure of the datagram is in too, each
//! placed by its number, and every change keeps its own result (deleting
//! what is gone is success, as for one change). A success costs no
//! answer, no read and no wake-up. The requests are the ones the single
//! operations send (`set_neighbour_message`, ...), built in one place.
//!
//! The batches travel on a socket of their own: rtnetlink's handle sends
//! one message per request and has no batch call, and the failures of the
//! requests that asked for no answer arrive as unsolicited messages,
//! which that socket's connection keeps for the batch that is waiting
//! (one at a time). It asks for answers without the echoed request
//! (NETLINK_CAP_ACK), so even a datagram of failures stays small (< 1 KiB
//! each, as the kernel accounts them) and fits the receive buffer.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{FromRawFd, IntoRawFd};
use std::prelude::rust_2024::*;
use std::{format, vec};

use futures::StreamExt;
use futures::channel::mpsc::UnboundedReceiver;
use netlink_packet_route::RouteNetlinkMessage;
use rtnetlink::packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST, NetlinkMessage,
    NetlinkPayload,
};
use rtnetlink::proto::{ConnectionHandle, NetlinkCodec, ReplyExpectation, from_socket_with_codec};
use rtnetlink::sys::{Socket, SocketAddr, TokioSocket};

use super::addresses::add_address_message;
use super::links::up_message;
use super::neighbours::{
    delete_fdb_message, delete_neighbour_message, set_fdb_message, set_neighbour_message,
};
use super::request::socket_in;
use super::routes::{delete_route_message, nexthop_route_message, route_message};
use super::{Cause, Error, Netlink, NexthopRoute, Result, Route, RouteFamily, gone_is_ok};
use crate::net::{Cidr, Mac};

/// Requests per datagram: even if all fail, 128 answers of < 1 KiB each
/// stay well inside a default receive buffer (208 KiB).
pub const BATCH: usize = 128;

/// The receive buffer asked for (best effort: the kernel caps it at
/// `net.core.rmem_max` without CAP_NET_ADMIN).
const RCVBUF: usize = 1 << 20;

/// A batch socket's connection: its handle, and the answers no request
/// waits for (the failures of all but a datagram's last request).
pub(super) struct BatchConn {
    handle: ConnectionHandle<RouteNetlinkMessage>,
    unsolicited: UnboundedReceiver<(NetlinkMessage<RouteNetlinkMessage>, SocketAddr)>,
}

/// What one request of a batch does, for its error's text (made only when
/// it fails: a batch at start-up holds thousands).
#[derive(Debug, Clone, Copy)]
enum What {
    SetNeighbour(u32, IpAddr),
    DelNeighbour(u32, IpAddr),
    SetFdb(u32, Mac),
    DelFdb(u32, Mac),
    SetRoute(IpAddr, u8),
    AddRoute(IpAddr, u8),
    SetNexthopRoute(IpAddr, u8, u32),
    DelRoute(IpAddr, u8),
    AddAddress(u32, IpAddr, u8),
    SetUp(u32),
}

impl What {
    fn is_delete(self) -> bool {
        matches!(
            self,
            What::DelNeighbour(..) | What::DelFdb(..) | What::DelRoute(..)
        )
    }
}

impl fmt::Display for What {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            What::SetNeighbour(i, ip) => write!(f, "setting neighbour {ip} on link {i}"),
            What::DelNeighbour(i, ip) => write!(f, "deleting neighbour {ip} on link {i}"),
            What::SetFdb(i, mac) => write!(f, "setting FDB entry {mac} on link {i}"),
            What::DelFdb(i, mac) => write!(f, "deleting FDB entry {mac} on link {i}"),
            What::SetRoute(a, p) => write!(f, "replacing route {a}/{p}"),
            What::AddRoute(a, p) => write!(f, "adding route {a}/{p}"),
            What::AddAddress(i, a, p) => write!(f, "adding {a}/{p} to link {i}"),
            What::SetUp(i) => write!(f, "setting link {i} up"),
            What::SetNexthopRoute(a, p, id) => write!(f, "replacing route {a}/{p} nhid {id}"),
            What::DelRoute(a, p) => write!(f, "deleting route {a}/{p}"),
        }
    }
}

/// Changes to send together, in order, each with its own result
/// ([`Netlink::apply_batch`]). The same requests as the single operations
/// of the same names.
#[derive(Debug, Default)]
pub struct Batch {
    entries: Vec<(RouteNetlinkMessage, u16, What)>,
}

impl Batch {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// [`Netlink::replace_permanent_neighbour`].
    pub fn replace_permanent_neighbour(&mut self, index: u32, ip: impl Into<IpAddr>, mac: Mac) {
        let ip = ip.into();
        self.entries.push((
            RouteNetlinkMessage::NewNeighbour(set_neighbour_message(index, ip, mac)),
            NLM_F_CREATE | NLM_F_REPLACE,
            What::SetNeighbour(index, ip),
        ));
    }

    /// [`Netlink::delete_neighbour`].
    pub fn delete_neighbour(&mut self, index: u32, ip: impl Into<IpAddr>) {
        let ip = ip.into();
        self.entries.push((
            RouteNetlinkMessage::DelNeighbour(delete_neighbour_message(index, ip)),
            0,
            What::DelNeighbour(index, ip),
        ));
    }

    /// [`Netlink::replace_fdb_entry`].
    pub fn replace_fdb_entry(&mut self, index: u32, mac: Mac, dst: impl Into<IpAddr>) {
        self.entries.push((
            RouteNetlinkMessage::NewNeighbour(set_fdb_message(index, mac, dst.into())),
            NLM_F_CREATE | NLM_F_REPLACE,
            What::SetFdb(index, mac),
        ));
    }

    /// [`Netlink::delete_fdb_entry`].
    pub fn delete_fdb_entry(&mut self, index: u32, mac: Mac) {
        self.entries.push((
            RouteNetlinkMessage::DelNeighbour(delete_fdb_message(index, mac)),
            0,
            What::DelFdb(index, mac),
        ));
    }

    /// [`Netlink::replace_route`].
    pub fn replace_route<A: RouteFamily>(&mut self, route: Route<A>) {
        self.entries.push((
            RouteNetlinkMessage::NewRoute(route_message(&route)),
            NLM_F_CREATE | NLM_F_REPLACE,
            What::SetRoute(route.dst.addr().into(), route.dst.prefix()),
        ));
    }

    /// [`Netlink::add_route`]: one to the same destination already there is
    /// an error.
    pub fn add_route<A: RouteFamily>(&mut self, route: Route<A>) {
        self.entries.push((
            RouteNetlinkMessage::NewRoute(route_message(&route)),
            NLM_F_CREATE | NLM_F_EXCL,
            What::AddRoute(route.dst.addr().into(), route.dst.prefix()),
        ));
    }

    /// [`Netlink::add_address`] of an IPv4 address.
    pub fn add_ipv4_address(&mut self, index: u32, address: Cidr<Ipv4Addr>) {
        self.add_address(index, address.addr().into(), address.prefix(), false);
    }

    /// [`Netlink::add_ipv6_address_nodad`].
    pub fn add_ipv6_address_nodad(&mut self, index: u32, address: Cidr<Ipv6Addr>) {
        self.add_address(index, address.addr().into(), address.prefix(), true);
    }

    fn add_address(&mut self, index: u32, ip: IpAddr, prefix: u8, nodad: bool) {
        self.entries.push((
            RouteNetlinkMessage::NewAddress(add_address_message(index, ip, prefix, nodad)),
            NLM_F_CREATE | NLM_F_EXCL,
            What::AddAddress(index, ip, prefix),
        ));
    }

    /// [`Netlink::set_up`].
    pub fn set_up(&mut self, index: u32) {
        self.entries.push((
            RouteNetlinkMessage::SetLink(up_message(index, None)),
            0,
            What::SetUp(index),
        ));
    }

    /// [`Netlink::set_alias_and_up`].
    pub fn set_alias_and_up(&mut self, index: u32, alias: &str) {
        self.entries.push((
            RouteNetlinkMessage::SetLink(up_message(index, Some(alias))),
            0,
            What::SetUp(index),
        ));
    }

    /// [`Netlink::replace_nexthop_route`].
    pub fn replace_nexthop_route<A: RouteFamily>(&mut self, r: NexthopRoute<A>) {
        self.entries.push((
            RouteNetlinkMessage::NewRoute(nexthop_route_message(&r)),
            NLM_F_CREATE | NLM_F_REPLACE,
            What::SetNexthopRoute(r.dst.addr().into(), r.dst.prefix(), r.nhid),
        ));
    }

    /// [`Netlink::delete_route`].
    pub fn delete_route<A: RouteFamily>(&mut self, dst: Cidr<A>, protocol: u8) {
        self.entries.push((
            RouteNetlinkMessage::DelRoute(delete_route_message(dst, protocol)),
            0,
            What::DelRoute(dst.addr().into(), dst.prefix()),
        ));
    }
}

/// A batch socket in `netns`, connected: the last request's
/// acknowledgement forwarded, answers without the echoed request.
fn connect_in(netns: &std::fs::File) -> Result<BatchConn> {
    connect(socket_in(netns)?)
}

/// A batch socket in the calling thread's namespace, connected.
pub(super) fn connect_here() -> Result<BatchConn> {
    connect(
        Socket::new(rtnetlink::sys::protocols::NETLINK_ROUTE)
            .map_err(|e| Error::io("netlink batch socket", &e))?,
    )
}

fn connect(socket: Socket) -> Result<BatchConn> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(Error::new(
            "netlink batch socket",
            Cause::Other("not inside a tokio runtime".into()),
        ));
    }
    socket
        .set_cap_ack(true)
        .map_err(|e| Error::io("netlink batch socket: NETLINK_CAP_ACK", &e))?;
    // Best effort: a smaller buffer still holds a batch's answers.
    let _ = socket.set_ext_ack(false);
    let _ = socket.set_rx_buf_sz(RCVBUF);
    // SAFETY: the descriptor comes from `into_raw_fd` and is owned by
    // nothing else; TokioSocket takes it over.
    let socket = unsafe { TokioSocket::from_raw_fd(socket.into_raw_fd()) };
    let (mut conn, handle, unsolicited) =
        from_socket_with_codec::<RouteNetlinkMessage, _, NetlinkCodec>(socket);
    conn.set_forward_ack(true);
    tokio::spawn(conn);
    Ok(BatchConn {
        handle,
        unsolicited,
    })
}

/// The errno of each of a datagram's `n` requests (0: done) from its last
/// request's answer (`last`: its sequence number and errno) and the
/// failures before it (`failed`). Requests get consecutive sequence
/// numbers in their order (netlink-proto numbers a datagram's messages one
/// by one), so the last one's tells every other's; a failure outside the
/// datagram's numbers is not one of its own and is left out.
fn place(n: usize, last: (u32, i32), failed: &[(u32, i32)]) -> Vec<i32> {
    let mut out = vec![0; n];
    let Some(end) = out.last_mut() else {
        return out;
    };
    *end = last.1;
    // n <= BATCH: no overflow.
    let first = last.0.wrapping_sub(n as u32 - 1);
    for &(seq, errno) in failed {
        if let Some(slot) = usize::try_from(seq.wrapping_sub(first))
            .ok()
            .filter(|i| *i + 1 < n)
            .and_then(|i| out.get_mut(i))
        {
            *slot = errno;
        }
    }
    out
}

impl Netlink {
    /// The batch connection, opened on first use.
    fn batch_conn<'a>(&self, slot: &'a mut Option<BatchConn>) -> Result<&'a mut BatchConn> {
        if slot.is_none() {
            let netns = self.netns.as_ref().ok_or_else(|| {
                Error::new(
                    "netlink batch socket",
                    Cause::Other("this connection's network namespace could not be opened".into()),
                )
            })?;
            *slot = Some(connect_in(netns)?);
        }
        slot.as_mut().ok_or_else(|| {
            Error::new(
                "netlink batch socket",
                Cause::Other("connection vanished".into()),
            )
        })
    }

    /// Sends `batch`, [`BATCH`] requests to a datagram, and returns one
    /// result per change, in the batch's order: a change that failed
    /// fails alone, the others are in place. A delete of what is already
    /// gone is success.
    pub async fn apply_batch(&self, batch: Batch) -> Vec<Result<()>> {
        let mut out = Vec::with_capacity(batch.len());
        let mut entries = batch.entries.into_iter().peekable();
        while entries.peek().is_some() {
            let chunk: Vec<_> = entries.by_ref().take(BATCH).collect();
            let whats: Vec<What> = chunk.iter().map(|e| e.2).collect();
            match self.send_chunk(chunk).await {
                Ok(errnos) => {
                    for (what, errno) in whats.into_iter().zip(errnos) {
                        let r = if errno == 0 {
                            Ok(())
                        } else {
                            Err(Error::new(what.to_string(), Cause::Errno(errno)))
                        };
                        out.push(if what.is_delete() { gone_is_ok(r) } else { r });
                    }
                }
                Err(e) => {
                    for what in whats {
                        out.push(Err(Error::new(
                            what.to_string(),
                            Cause::Other(e.to_string()),
                        )));
                    }
                }
            }
        }
        out
    }

    /// One datagram of requests; the errno of each (0: done).
    async fn send_chunk(&self, chunk: Vec<(RouteNetlinkMessage, u16, What)>) -> Result<Vec<i32>> {
        let n = chunk.len();
        // One datagram at a time on the connection: the failures waiting
        // in `unsolicited` are then this one's.
        let mut slot = self.batches.lock().await;
        let conn = self.batch_conn(&mut slot)?;
        let msgs = chunk.into_iter().enumerate().map(|(i, (m, flags, _))| {
            let mut m = NetlinkMessage::from(m);
            let last = i + 1 == n;
            m.header.flags = NLM_F_REQUEST | flags | if last { NLM_F_ACK } else { 0 };
            let expect = if last {
                ReplyExpectation::Expected
            } else {
                ReplyExpectation::NotExpected
            };
            (m, expect)
        });
        let mut replies = conn
            .handle
            .request_batch_with_expectation(msgs, SocketAddr::new(0, 0))
            .map_err(|e| Error::new("netlink batch", Cause::Other(format!("connection: {e}"))))?;
        let mut last = None;
        while let Some(m) = replies.next().await {
            if let NetlinkPayload::Error(e) = m.payload {
                last = Some((m.header.sequence_number, -e.raw_code()));
            }
        }
        // The connection forwards what no request waits for before the
        // answers it was read with: every failure before the last
        // request's answer is in the channel now.
        let mut failed = Vec::new();
        let mut overrun = false;
        while let Ok((m, _)) = conn.unsolicited.try_recv() {
            match m.payload {
                NetlinkPayload::Error(e) if e.raw_code() != 0 => {
                    failed.push((m.header.sequence_number, -e.raw_code()));
                }
                NetlinkPayload::Overrun(_) => overrun = true,
                _ => {}
            }
        }
        match last {
            Some(last) if !overrun => Ok(place(n, last, &failed)),
            _ => {
                // Answers lost, or the connection gone: the socket is in
                // doubt, and the next datagram opens another.
                *slot = None;
                Err(Error::new(
                    "netlink batch",
                    Cause::Other(if overrun {
                        "answers lost (receive buffer overrun)".into()
                    } else {
                        "no answer".into()
                    }),
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::place;
    use std::vec;

    #[test]
    fn failures_are_placed_by_sequence_number() {
        assert_eq!(place(3, (12, 0), &[(11, 17)]), vec![0, 17, 0]);
        assert_eq!(place(3, (12, 2), &[(10, 17), (11, 22)]), vec![17, 22, 2]);
        // Across the wrap of the sequence numbers.
        assert_eq!(place(3, (1, 0), &[(u32::MAX, 2)]), vec![2, 0, 0]);
        assert_eq!(place(1, (5, 0), &[]), vec![0]);
    }

    #[test]
    fn failures_of_other_datagrams_are_left_out() {
        assert_eq!(place(2, (11, 0), &[(9, 17), (11, 22), (12, 1)]), vec![0, 0]);
        assert!(place(0, (0, 0), &[(0, 1)]).is_empty());
    }
}
