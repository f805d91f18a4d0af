//! Nexthop objects (`ip nexthop`, Linux 5.3+): a gateway and a device held
//! once, under an ID, by any number of routes (`ip route add … nhid N`).
//! Replacing a nexthop updates every route through it in one operation;
//! deleting it deletes them.
//!
//! Hand-written, because netlink-packet-route has no RTM_*NEXTHOP
//! messages (rust-netlink/netlink-packet-route#225, which would have added
//! them, was closed unmerged; only the route's RTA_NH_ID attribute exists,
//! which `routes.rs` uses). `struct nhmsg` and the few NHA_* attributes a
//! nexthop with one gateway needs are built and parsed here, and travel on
//! a socket of their own: rtnetlink's connection carries only the crate's
//! message type. That socket lives in the [`Netlink`]'s namespace too; it
//! is opened on first use, so users of the layer that never touch a
//! nexthop (the plugin) pay nothing for it.
//!
//! Nexthop groups, blackholes and encapsulation are neither made nor
//! parsed: another program's nexthops are read only for their ID and
//! protocol, so their IDs are never taken.

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{FromRawFd, IntoRawFd};
use std::prelude::rust_2024::*;
use std::{format, vec};

use futures::StreamExt;
use rtnetlink::packet_core::{
    DecodeError, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST,
    NetlinkDeserializable, NetlinkHeader, NetlinkMessage, NetlinkPayload, NetlinkSerializable,
};
use rtnetlink::proto::{Connection, ConnectionHandle, NetlinkCodec, from_socket_with_codec};
use rtnetlink::sys::{Socket, SocketAddr, TokioSocket};

use super::request::{DUMP_ATTEMPTS, read_replies, socket_in};
use super::{Cause, Error, Netlink, Result, gone_is_ok};

// include/uapi/linux/rtnetlink.h and nexthop.h.
const RTM_NEWNEXTHOP: u16 = 104;
const RTM_DELNEXTHOP: u16 = 105;
const RTM_GETNEXTHOP: u16 = 106;
const NHA_ID: u16 = 1;
const NHA_OIF: u16 = 5;
const NHA_GATEWAY: u16 = 6;
const RTNH_F_ONLINK: u32 = 4;
/// The multicast group of nexthop notifications (RTNLGRP_NEXTHOP).
pub const RTNLGRP_NEXTHOP: u32 = 32;
const AF_UNSPEC: u8 = 0;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
/// `struct nhmsg`: family, scope, protocol, reserved, flags (u32).
const NHMSG_LEN: usize = 8;
const NLA_HEADER: usize = 4;
const NLA_TYPE_MASK: u16 = 0x3fff;

/// A nexthop with one gateway (or none: a device route), as listed and as
/// added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nexthop {
    /// Never 0 when adding: the kernel would pick one, and the caller
    /// could no longer find it.
    pub id: u32,
    /// A listed nexthop of another kind (group, blackhole) has none.
    pub gateway: Option<IpAddr>,
    /// The kernel requires one for every nexthop with a gateway.
    pub oif: Option<u32>,
    /// `nh_protocol`: who installed it, as a route's `rtm_protocol`.
    pub protocol: u8,
    /// RTNH_F_ONLINK: the gateway is taken as on the link even though no
    /// subnet of the device covers it.
    pub onlink: bool,
}

/// One RTM_*NEXTHOP message: the `nhmsg` header and its attributes, raw.
/// Public for subscribers to nexthop notifications ([`nexthop_events`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NexthopMessage {
    kind: u16,
    family: u8,
    scope: u8,
    protocol: u8,
    flags: u32,
    attributes: Vec<(u16, Vec<u8>)>,
}

impl NexthopMessage {
    fn new(kind: u16) -> Self {
        Self {
            kind,
            ..Self::default()
        }
    }

    fn with_u32(mut self, kind: u16, v: u32) -> Self {
        self.attributes.push((kind, v.to_ne_bytes().to_vec()));
        self
    }

    fn attribute(&self, kind: u16) -> Option<&[u8]> {
        self.attributes
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, v)| v.as_slice())
    }

    fn u32_attribute(&self, kind: u16) -> Option<u32> {
        Some(u32::from_ne_bytes(self.attribute(kind)?.try_into().ok()?))
    }

    /// A deletion (RTM_DELNEXTHOP), as notified when a nexthop goes, by
    /// request or with its device.
    pub fn is_delete(&self) -> bool {
        self.kind == RTM_DELNEXTHOP
    }

    /// The nexthop this message carries; None for one without an ID.
    pub fn nexthop(&self) -> Option<Nexthop> {
        let gateway = self.attribute(NHA_GATEWAY).and_then(|g| {
            if let Ok(o) = <[u8; 4]>::try_from(g) {
                Some(IpAddr::V4(Ipv4Addr::from(o)))
            } else if let Ok(o) = <[u8; 16]>::try_from(g) {
                Some(IpAddr::V6(Ipv6Addr::from(o)))
            } else {
                None
            }
        });
        Some(Nexthop {
            id: self.u32_attribute(NHA_ID)?,
            gateway,
            oif: self.u32_attribute(NHA_OIF),
            protocol: self.protocol,
            onlink: self.flags & RTNH_F_ONLINK != 0,
        })
    }
}

fn nla_align(len: usize) -> usize {
    (len + 3) & !3
}

// What `NetlinkMessage::from` needs to wrap a request.
impl From<NexthopMessage> for NetlinkPayload<NexthopMessage> {
    fn from(m: NexthopMessage) -> Self {
        NetlinkPayload::InnerMessage(m)
    }
}

impl NetlinkSerializable for NexthopMessage {
    fn message_type(&self) -> u16 {
        self.kind
    }

    fn buffer_len(&self) -> usize {
        NHMSG_LEN
            + self
                .attributes
                .iter()
                .map(|(_, v)| nla_align(NLA_HEADER + v.len()))
                .sum::<usize>()
    }

    fn serialize(&self, buffer: &mut [u8]) {
        // `buffer` is exactly `buffer_len()` long, zeroed: padding stays 0.
        buffer[0] = self.family;
        buffer[1] = self.scope;
        buffer[2] = self.protocol;
        buffer[4..NHMSG_LEN].copy_from_slice(&self.flags.to_ne_bytes());
        let mut at = NHMSG_LEN;
        for (kind, value) in &self.attributes {
            let len = NLA_HEADER + value.len();
            // Attribute values here are a few bytes; u16 cannot overflow.
            buffer[at..at + 2].copy_from_slice(&(len as u16).to_ne_bytes());
            buffer[at + 2..at + 4].copy_from_slice(&kind.to_ne_bytes());
            buffer[at + NLA_HEADER..at + len].copy_from_slice(value);
            at += nla_align(len);
        }
    }
}

impl NetlinkDeserializable for NexthopMessage {
    type Error = DecodeError;

    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<Self, DecodeError> {
        if !matches!(
            header.message_type,
            RTM_NEWNEXTHOP | RTM_DELNEXTHOP | RTM_GETNEXTHOP
        ) {
            return Err(DecodeError::from(format!(
                "message type {} is not a nexthop message",
                header.message_type
            )));
        }
        let Some(head) = payload.get(..NHMSG_LEN) else {
            return Err(DecodeError::from("nexthop message shorter than nhmsg"));
        };
        let mut m = NexthopMessage {
            kind: header.message_type,
            family: head[0],
            scope: head[1],
            protocol: head[2],
            flags: u32::from_ne_bytes([head[4], head[5], head[6], head[7]]),
            attributes: vec![],
        };
        let mut rest = &payload[NHMSG_LEN..];
        while rest.len() >= NLA_HEADER {
            let len = usize::from(u16::from_ne_bytes([rest[0], rest[1]]));
            let kind = u16::from_ne_bytes([rest[2], rest[3]]) & NLA_TYPE_MASK;
            let Some(value) = rest.get(NLA_HEADER..len).filter(|_| len >= NLA_HEADER) else {
                return Err(DecodeError::from(format!(
                    "nexthop attribute {kind}: length {len} in {} bytes",
                    rest.len()
                )));
            };
            m.attributes.push((kind, value.to_vec()));
            rest = rest.get(nla_align(len)..).unwrap_or_default();
        }
        Ok(m)
    }
}

/// The message that adds or replaces `nh`.
fn new_message(nh: &Nexthop) -> NexthopMessage {
    let mut m = NexthopMessage::new(RTM_NEWNEXTHOP).with_u32(NHA_ID, nh.id);
    m.protocol = nh.protocol;
    m.family = AF_INET;
    if nh.onlink {
        m.flags = RTNH_F_ONLINK;
    }
    if let Some(oif) = nh.oif {
        m = m.with_u32(NHA_OIF, oif);
    }
    match nh.gateway {
        Some(IpAddr::V4(g)) => m.attributes.push((NHA_GATEWAY, g.octets().to_vec())),
        Some(IpAddr::V6(g)) => {
            m.family = AF_INET6;
            m.attributes.push((NHA_GATEWAY, g.octets().to_vec()));
        }
        None => {}
    }
    m
}

/// The connection to a nexthop socket, as [`Netlink`] keeps it.
pub(super) type NexthopHandle = ConnectionHandle<NexthopMessage>;

fn connection(socket: Socket) -> Result<(Connection<NexthopMessage, TokioSocket>, NexthopHandle)> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(Error::new(
            "nexthop socket",
            Cause::Other("not inside a tokio runtime".into()),
        ));
    }
    // SAFETY: the descriptor comes from `into_raw_fd` and is owned by
    // nothing else; TokioSocket takes it over.
    let socket = unsafe { TokioSocket::from_raw_fd(socket.into_raw_fd()) };
    let (mut conn, handle, _) = from_socket_with_codec::<_, _, NetlinkCodec>(socket);
    // A dump's NLMSG_DONE may carry its only NLM_F_DUMP_INTR.
    conn.set_forward_done(true);
    Ok((conn, handle))
}

/// A nexthop socket in `netns`, connected.
pub(super) fn connect_in(netns: &File) -> Result<NexthopHandle> {
    let (conn, handle) = connection(socket_in(netns)?)?;
    tokio::spawn(conn);
    Ok(handle)
}

/// The stream of nexthop notifications [`nexthop_events`] returns.
pub type NexthopEvents =
    futures::channel::mpsc::UnboundedReceiver<(NetlinkMessage<NexthopMessage>, SocketAddr)>;

/// Nexthop notifications (RTNLGRP_NEXTHOP) of the calling thread's network
/// namespace: the connection, to be spawned, and the stream of messages.
/// Must be called inside a tokio runtime. rtnetlink's multicast connection
/// cannot carry them: it drops every message its crate cannot parse.
/// Deleting a nexthop deletes its routes without an RTM_DELROUTE for them;
/// this is where a watcher learns of it.
pub fn nexthop_events() -> Result<(Connection<NexthopMessage, TokioSocket>, NexthopEvents)> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(Error::new(
            "nexthop notification socket",
            Cause::Other("not inside a tokio runtime".into()),
        ));
    }
    let mut socket = Socket::new(rtnetlink::sys::protocols::NETLINK_ROUTE)
        .map_err(|e| Error::io("nexthop notification socket", &e))?;
    socket
        .bind(&SocketAddr::new(0, 0))
        .map_err(|e| Error::io("binding the nexthop notification socket", &e))?;
    socket
        .add_membership(RTNLGRP_NEXTHOP)
        .map_err(|e| Error::io("joining the nexthop notification group", &e))?;
    // SAFETY: as in `connection`.
    let socket = unsafe { TokioSocket::from_raw_fd(socket.into_raw_fd()) };
    let (conn, _handle, messages) = from_socket_with_codec::<_, _, NetlinkCodec>(socket);
    Ok((conn, messages))
}

impl Netlink {
    fn nexthop_handle(&self) -> Result<&NexthopHandle> {
        if let Some(h) = self.nexthops.get() {
            return Ok(h);
        }
        let netns = self.netns.as_ref().ok_or_else(|| {
            Error::new(
                "nexthop socket",
                Cause::Other("this connection's network namespace could not be opened".into()),
            )
        })?;
        // Two first uses at once each connect; one is kept, the other's
        // connection ends with its dropped handle.
        let _ = self.nexthops.set(connect_in(netns)?);
        self.nexthops
            .get()
            .ok_or_else(|| Error::new("nexthop socket", Cause::Other("connection vanished".into())))
    }

    /// One request on the nexthop socket: a change (acknowledged), a get
    /// or a dump (repeated while the kernel reports it interrupted).
    async fn nexthop_request(
        &self,
        op: &str,
        msg: NexthopMessage,
        flags: u16,
    ) -> Result<Vec<NexthopMessage>> {
        let handle = self.nexthop_handle()?;
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let attempts = if dump { DUMP_ATTEMPTS } else { 1 };
        for _ in 0..attempts {
            let mut req = NetlinkMessage::from(msg.clone());
            req.header.flags = NLM_F_REQUEST | flags;
            let mut replies = handle
                .request(req, SocketAddr::new(0, 0))
                .map_err(|e| Error::new(op, Cause::Other(format!("nexthop connection: {e}"))))?;
            if let Some(out) = read_replies(op, &mut replies).await? {
                return Ok(out);
            }
        }
        Err(Error::new(op, Cause::Interrupted))
    }

    async fn nexthop_dump(&self, op: &str, oif: Option<u32>) -> Result<Vec<Nexthop>> {
        // The kernel rejects a dump request whose header is not all zeros;
        // the device is the one filter it takes that is of use here.
        let mut req = NexthopMessage::new(RTM_GETNEXTHOP);
        req.family = AF_UNSPEC;
        if let Some(i) = oif {
            req = req.with_u32(NHA_OIF, i);
        }
        let msgs = self.nexthop_request(op, req, NLM_F_DUMP).await?;
        Ok(msgs
            .iter()
            .filter(|m| m.kind == RTM_NEWNEXTHOP)
            .filter_map(NexthopMessage::nexthop)
            .filter(|n| oif.is_none() || n.oif == oif)
            .collect())
    }

    /// Every nexthop of the namespace, of every protocol.
    pub async fn nexthops(&self) -> Result<Vec<Nexthop>> {
        self.nexthop_dump("listing nexthops", None).await
    }

    /// The nexthops installed with `protocol` (filtered here: the kernel
    /// filters nexthop dumps by device, not by protocol).
    pub async fn nexthops_by_protocol(&self, protocol: u8) -> Result<Vec<Nexthop>> {
        let mut v = self
            .nexthop_dump(&format!("listing nexthops of protocol {protocol}"), None)
            .await?;
        v.retain(|n| n.protocol == protocol);
        Ok(v)
    }

    /// The nexthops through link `oif` (filtered by the kernel).
    pub async fn nexthops_of_link(&self, oif: u32) -> Result<Vec<Nexthop>> {
        self.nexthop_dump(&format!("listing the nexthops of link {oif}"), Some(oif))
            .await
    }

    /// Whether this kernel has nexthop objects (Linux 5.3 and later): a
    /// kernel without them answers EOPNOTSUPP to any nexthop request.
    pub async fn nexthops_supported(&self) -> Result<bool> {
        match self.nexthops().await {
            Ok(_) => Ok(true),
            Err(e) if e.errno() == Some(libc::EOPNOTSUPP) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The nexthop `id`, if there is one.
    pub async fn nexthop(&self, id: u32) -> Result<Option<Nexthop>> {
        let req = NexthopMessage::new(RTM_GETNEXTHOP).with_u32(NHA_ID, id);
        match self
            .nexthop_request(&format!("looking up nexthop {id}"), req, 0)
            .await
        {
            Ok(v) => Ok(v.iter().find_map(NexthopMessage::nexthop)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Adds a nexthop; one with its ID already there is an error that
    /// [`Error::is_exists`].
    pub async fn add_nexthop(&self, nh: &Nexthop) -> Result<()> {
        self.nexthop_request(
            &format!("adding nexthop {}", nh.id),
            new_message(nh),
            NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        )
        .await
        .map(drop)
    }

    /// Adds a nexthop, or replaces the one with its ID, and with it the
    /// gateway and device of every route through it.
    pub async fn replace_nexthop(&self, nh: &Nexthop) -> Result<()> {
        self.nexthop_request(
            &format!("replacing nexthop {}", nh.id),
            new_message(nh),
            NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
        )
        .await
        .map(drop)
    }

    /// [`Netlink::replace_nexthop`] for many: sent `BATCH` to a datagram,
    /// which the kernel answers in one go, instead of one round trip each
    /// (thousands of peers at start-up). Returns the ones that failed, by
    /// ID; the others are in place.
    pub async fn replace_nexthops(&self, nhs: &[Nexthop]) -> Result<Vec<(u32, Error)>> {
        /// Small enough for the answers to fit the socket's receive buffer
        /// however many fail (each failure echoes its request).
        const BATCH: usize = 256;
        let handle = self.nexthop_handle()?;
        let mut failed = Vec::new();
        for chunk in nhs.chunks(BATCH) {
            let msgs = chunk.iter().map(|nh| {
                let mut m = NetlinkMessage::from(new_message(nh));
                m.header.flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE;
                m
            });
            let mut replies = handle
                .request_batch(msgs, SocketAddr::new(0, 0))
                .map_err(|e| {
                    Error::new(
                        "replacing nexthops",
                        Cause::Other(format!("nexthop connection: {e}")),
                    )
                })?;
            while let Some(m) = replies.next().await {
                let NetlinkPayload::Error(e) = m.payload else {
                    continue;
                };
                if e.raw_code() == 0 {
                    continue;
                }
                // The error echoes the request (header, then payload): its
                // NHA_ID says which one failed.
                let id = e
                    .header
                    .get(16..)
                    .and_then(|payload| {
                        let mut h = NetlinkHeader::default();
                        h.message_type = RTM_NEWNEXTHOP;
                        NexthopMessage::deserialize(&h, payload).ok()
                    })
                    .and_then(|m| m.u32_attribute(NHA_ID))
                    .unwrap_or(0);
                failed.push((
                    id,
                    Error::new(
                        format!("replacing nexthop {id}"),
                        Cause::Errno(-e.raw_code()),
                    ),
                ));
            }
        }
        Ok(failed)
    }

    /// Deletes the nexthop `id`, and with it every route through it; one
    /// already gone is success.
    pub async fn delete_nexthop(&self, id: u32) -> Result<()> {
        let req = NexthopMessage::new(RTM_DELNEXTHOP).with_u32(NHA_ID, id);
        gone_is_ok(
            self.nexthop_request(&format!("deleting nexthop {id}"), req, NLM_F_ACK)
                .await
                .map(drop),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(m: &NexthopMessage) -> NexthopMessage {
        let mut buf = vec![0u8; m.buffer_len()];
        m.serialize(&mut buf);
        let mut h = NetlinkHeader::default();
        h.message_type = m.kind;
        NexthopMessage::deserialize(&h, &buf).expect("parses")
    }

    #[test]
    fn a_nexthop_survives_its_own_encoding() {
        let nh = Nexthop {
            id: 4242,
            gateway: Some(IpAddr::V4(Ipv4Addr::new(10, 1, 2, 0))),
            oif: Some(7),
            protocol: 110,
            onlink: true,
        };
        let m = new_message(&nh);
        // nhmsg + three 8-byte attributes (4-byte values).
        assert_eq!(m.buffer_len(), 8 + 3 * 8);
        assert_eq!(roundtrip(&m).nexthop(), Some(nh));
        assert_eq!(roundtrip(&m).family, AF_INET);
        let v6 = Nexthop {
            gateway: Some(IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1))),
            onlink: false,
            ..nh
        };
        let m = new_message(&v6);
        assert_eq!(m.family, AF_INET6);
        assert_eq!(roundtrip(&m).nexthop(), Some(v6));
    }

    #[test]
    fn the_header_is_laid_out_as_nhmsg() {
        let m = new_message(&Nexthop {
            id: 1,
            gateway: None,
            oif: None,
            protocol: 110,
            onlink: true,
        });
        let mut buf = vec![0u8; m.buffer_len()];
        m.serialize(&mut buf);
        assert_eq!(&buf[..4], &[AF_INET, 0, 110, 0]);
        assert_eq!(&buf[4..8], &RTNH_F_ONLINK.to_ne_bytes());
        assert_eq!(&buf[8..10], &8u16.to_ne_bytes());
        assert_eq!(&buf[10..12], &NHA_ID.to_ne_bytes());
        assert_eq!(&buf[12..16], &1u32.to_ne_bytes());
    }

    #[test]
    fn malformed_messages_are_errors_not_panics() {
        let mut h = NetlinkHeader::default();
        h.message_type = RTM_NEWNEXTHOP;
        assert!(NexthopMessage::deserialize(&h, &[0; 4]).is_err());
        // An attribute claiming more bytes than there are.
        let mut buf = vec![0u8; 8];
        buf.extend_from_slice(&64u16.to_ne_bytes());
        buf.extend_from_slice(&NHA_ID.to_ne_bytes());
        buf.extend_from_slice(&[0; 4]);
        assert!(NexthopMessage::deserialize(&h, &buf).is_err());
        // One claiming fewer than its own header.
        let mut buf = vec![0u8; 8];
        buf.extend_from_slice(&2u16.to_ne_bytes());
        buf.extend_from_slice(&NHA_ID.to_ne_bytes());
        assert!(NexthopMessage::deserialize(&h, &buf).is_err());
        h.message_type = 24;
        assert!(NexthopMessage::deserialize(&h, &[0; 8]).is_err());
        // A nexthop without an ID is no nexthop to list.
        h.message_type = RTM_NEWNEXTHOP;
        let m = NexthopMessage::deserialize(&h, &[0; 8]).expect("header only");
        assert_eq!(m.nexthop(), None);
    }

    #[test]
    fn unpadded_last_attributes_and_flags_parse() {
        // A flag attribute (no value) last, as NHA_FDB or NHA_BLACKHOLE.
        let mut buf = vec![AF_INET, 0, 3, 0, 0, 0, 0, 0];
        buf.extend_from_slice(&8u16.to_ne_bytes());
        buf.extend_from_slice(&NHA_ID.to_ne_bytes());
        buf.extend_from_slice(&9u32.to_ne_bytes());
        buf.extend_from_slice(&4u16.to_ne_bytes());
        buf.extend_from_slice(&4u16.to_ne_bytes());
        let mut h = NetlinkHeader::default();
        h.message_type = RTM_DELNEXTHOP;
        let m = NexthopMessage::deserialize(&h, &buf).expect("parses");
        assert!(m.is_delete());
        let nh = m.nexthop().expect("has an id");
        assert_eq!((nh.id, nh.protocol, nh.gateway), (9, 3, None));
    }
}
