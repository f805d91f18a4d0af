//! Many changes (neighbours, FDB entries, routes) a datagram at a time.
//!
//! One change per request costs a round trip through the connection task
//! and the kernel each (~17 us at thousands of peers, most of it wake-ups,
//! not the kernel's work). A [`Batch`] puts up to [`BATCH`] requests, each
//! with NLM_F_ACK, in one datagram: the kernel handles them in order
//! within that one `sendmsg` and queues one answer per request, each with
//! the request's sequence number, so every change keeps its own result
//! (deleting what is gone is success, as for one change). The requests
//! are the ones the single operations send (`set_neighbour_message`, ...),
//! built in one place.
//!
//! The batches travel on a socket of their own: rtnetlink's handle sends
//! one message per request and has no batch call. That socket asks for
//! acknowledgements without the echoed request (NETLINK_CAP_ACK), so a
//! whole batch's answers stay small (< 1 KiB each, as the kernel accounts
//! them) and fit the receive buffer: the kernel drops an answer that does
//! not, and a batch would then wait for it forever.

use std::fmt;
use std::net::IpAddr;
use std::os::fd::{FromRawFd, IntoRawFd};
use std::prelude::rust_2024::*;
use std::sync::PoisonError;
use std::{format, vec};

use futures::StreamExt;
use netlink_packet_route::RouteNetlinkMessage;
use rtnetlink::packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_REPLACE, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload,
};
use rtnetlink::proto::{ConnectionHandle, NetlinkCodec, from_socket_with_codec};
use rtnetlink::sys::{Socket, SocketAddr, TokioSocket};

use super::neighbours::{
    delete_fdb_message, delete_neighbour_message, set_fdb_message, set_neighbour_message,
};
use super::request::socket_in;
use super::routes::{delete_route_message, nexthop_route_message, route_message};
use super::{Cause, Error, Netlink, NexthopRoute, Result, Route, RouteFamily, gone_is_ok};
use crate::net::{Cidr, Mac};

/// Requests per datagram: 128 answers of < 1 KiB each stay well inside a
/// default receive buffer (208 KiB), even if it cannot be enlarged.
pub const BATCH: usize = 128;

/// The receive buffer asked for (best effort: the kernel caps it at
/// `net.core.rmem_max` without CAP_NET_ADMIN).
const RCVBUF: usize = 1 << 20;

pub(super) type BatchHandle = ConnectionHandle<RouteNetlinkMessage>;

/// What one request of a batch does, for its error's text (made only when
/// it fails: a batch at start-up holds thousands).
#[derive(Debug, Clone, Copy)]
enum What {
    SetNeighbour(u32, IpAddr),
    DelNeighbour(u32, IpAddr),
    SetFdb(u32, Mac),
    DelFdb(u32, Mac),
    SetRoute(IpAddr, u8),
    SetNexthopRoute(IpAddr, u8, u32),
    DelRoute(IpAddr, u8),
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

/// A batch socket in `netns`, connected: acknowledgements forwarded (each
/// request's result is its own), without the echoed request.
fn connect_in(netns: &std::fs::File) -> Result<BatchHandle> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(Error::new(
            "netlink batch socket",
            Cause::Other("not inside a tokio runtime".into()),
        ));
    }
    let socket: Socket = socket_in(netns)?;
    socket
        .set_cap_ack(true)
        .map_err(|e| Error::io("netlink batch socket: NETLINK_CAP_ACK", &e))?;
    // Best effort: a smaller buffer still holds a batch's answers.
    let _ = socket.set_ext_ack(false);
    let _ = socket.set_rx_buf_sz(RCVBUF);
    // SAFETY: the descriptor comes from `into_raw_fd` and is owned by
    // nothing else; TokioSocket takes it over.
    let socket = unsafe { TokioSocket::from_raw_fd(socket.into_raw_fd()) };
    let (mut conn, handle, _) =
        from_socket_with_codec::<RouteNetlinkMessage, _, NetlinkCodec>(socket);
    conn.set_forward_ack(true);
    tokio::spawn(conn);
    Ok(handle)
}

/// The results of a chunk from its answers, `(sequence number, errno)`
/// (0: done). Requests get consecutive sequence numbers in their order
/// (netlink-proto numbers a batch's messages one by one) and each exactly
/// one answer: with all `n` answers there, the lowest is the first
/// request's (lowest as offsets from any one of them, which keeps it
/// right across the numbers' wrap). Any other set of answers (some lost, the connection gone)
/// places none: every request of the chunk is then failed, never guessed.
fn place(n: usize, answers: &[(u32, i32)]) -> Option<Vec<i32>> {
    if answers.len() != n {
        return None;
    }
    let any = answers.first()?.0;
    // Offsets as i32: a chunk's numbers lie within 2^31 of each other.
    let low = answers.iter().map(|a| a.0.wrapping_sub(any) as i32).min()?;
    let first = any.wrapping_add_signed(low);
    let mut out = vec![None; n];
    for &(seq, errno) in answers {
        let slot = out.get_mut(usize::try_from(seq.wrapping_sub(first)).ok()?)?;
        if slot.is_some() {
            return None;
        }
        *slot = Some(errno);
    }
    out.into_iter().collect()
}

impl Netlink {
    fn batch_handle(&self) -> Result<BatchHandle> {
        let mut h = self.batches.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(h) = h.as_ref() {
            return Ok(h.clone());
        }
        let netns = self.netns.as_ref().ok_or_else(|| {
            Error::new(
                "netlink batch socket",
                Cause::Other("this connection's network namespace could not be opened".into()),
            )
        })?;
        let handle = connect_in(netns)?;
        *h = Some(handle.clone());
        Ok(handle)
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
        let handle = self.batch_handle()?;
        let msgs = chunk.into_iter().map(|(m, flags, _)| {
            let mut m = NetlinkMessage::from(m);
            m.header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
            m
        });
        let mut replies = handle
            .request_batch(msgs, SocketAddr::new(0, 0))
            .map_err(|e| Error::new("netlink batch", Cause::Other(format!("connection: {e}"))))?;
        let mut answers = Vec::with_capacity(n);
        while let Some(m) = replies.next().await {
            if let NetlinkPayload::Error(e) = m.payload {
                answers.push((m.header.sequence_number, -e.raw_code()));
            }
        }
        place(n, &answers).ok_or_else(|| {
            // The socket is in doubt: the next batch opens another.
            *self.batches.lock().unwrap_or_else(PoisonError::into_inner) = None;
            Error::new(
                "netlink batch",
                Cause::Other(format!("{} answers to {n} requests", answers.len())),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::place;
    use std::vec;

    #[test]
    fn answers_are_placed_by_sequence_number_whatever_their_order() {
        assert_eq!(
            place(3, &[(11, 0), (10, 0), (12, 17)]),
            Some(vec![0, 0, 17])
        );
        // Across the wrap of the sequence numbers.
        assert_eq!(place(2, &[(0, 0), (u32::MAX, 2)]), Some(vec![2, 0]));
    }

    #[test]
    fn missing_doubled_or_scattered_answers_place_none() {
        assert_eq!(place(3, &[(10, 0), (11, 0)]), None);
        assert_eq!(place(2, &[(10, 0), (10, 0)]), None);
        assert_eq!(place(2, &[(10, 0), (12, 0)]), None);
        assert_eq!(place(0, &[]), None);
    }
}
