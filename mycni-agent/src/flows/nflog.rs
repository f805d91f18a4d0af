//! Verdicts nftables decided, through NFLOG: the agent's tables log the
//! packets they judge to one group ([`GROUP`]), the rule's meaning in the
//! prefix (`crate::verdict` writes and reads it: one grammar),
//! and [`spawn`] reads the group and hands each packet to the room.
//!
//! What logs, and how often (the rules are in `policy/nft.rs` and
//! `tables/underlay_filter.rs`): every new connection of an isolated pod
//! a policy admits, once (`ct state new`); a flow's first drop of the
//! policy table and the underlay filter (a dynamic set with a per-element
//! limit in front of the log: a flood of one flow never hides another's),
//! and its repeats up to a rate per node. The reader folds a flow's
//! repeats ([`Fold`]): the room gets a drop at most once a second per
//! flow, with the packets it stands for. The packet header is what the
//! agent gets, not the whole packet ([`COPY_RANGE`]).
//!
//! One socket can bind a group per network namespace: a second agent (or
//! `nfct`/`ulogd` on group 1717) in the same namespace fails to bind, and
//! says so.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use netlink_packet_core::{NetlinkMessage, NetlinkPayload};
use netlink_packet_netfilter::nflog::{
    ConfigCmd, ConfigMode, PacketNla, Timeout, ULogMessage, config_request,
};
use netlink_packet_netfilter::{NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily};
use netlink_sys::{Socket, constants::NETLINK_NETFILTER};

use super::{NftLog, Observation, Sink};
use crate::verdict::{NFLOG_GROUP as GROUP, NftVerdict, parse_log_prefix};
/// Bytes of each packet copied to the agent: an IPv6 header (40) and a
/// TCP header with options (60) fit.
pub(crate) const COPY_RANGE: u32 = 128;
/// How long the kernel may hold logged packets to batch them (its default
/// is a second): a drop shows up in `flows` within this.
pub(crate) const FLUSH: Duration = Duration::from_millis(20);

/// The headers of a logged packet (`payload` starts at the IP header).
fn headers(payload: &[u8]) -> Option<(IpAddr, IpAddr, u8, &[u8])> {
    match payload.first()? >> 4 {
        4 => {
            let ihl = usize::from(payload.first()? & 0x0f) * 4;
            let src: [u8; 4] = payload.get(12..16)?.try_into().ok()?;
            let dst: [u8; 4] = payload.get(16..20)?.try_into().ok()?;
            let proto = *payload.get(9)?;
            let l4 = payload.get(ihl..).unwrap_or_default();
            Some((
                Ipv4Addr::from(src).into(),
                Ipv4Addr::from(dst).into(),
                proto,
                l4,
            ))
        }
        6 => {
            let src: [u8; 16] = payload.get(8..24)?.try_into().ok()?;
            let dst: [u8; 16] = payload.get(24..40)?.try_into().ok()?;
            let proto = *payload.get(6)?;
            let l4 = payload.get(40..).unwrap_or_default();
            Some((
                Ipv6Addr::from(src).into(),
                Ipv6Addr::from(dst).into(),
                proto,
                l4,
            ))
        }
        _ => None,
    }
}

/// One logged packet as the room takes it; None when it is not one of
/// mycni's or its headers are cut short.
pub(crate) fn log_of(nlas: &[PacketNla], at: SystemTime) -> Option<NftLog> {
    let mut verdict = None;
    let (mut payload, mut in_ifindex, mut out_ifindex) = (None, 0, 0);
    for nla in nlas {
        match nla {
            PacketNla::Prefix(p) => verdict = parse_log_prefix(p.to_str().ok()?),
            PacketNla::Payload(p) => payload = Some(p.as_slice()),
            PacketNla::IfIndexInDev(i) => in_ifindex = *i,
            PacketNla::IfIndexOutDev(i) => out_ifindex = *i,
            _ => {}
        }
    }
    let (src, dst, proto, l4) = headers(payload?)?;
    let port = |at: usize| {
        l4.get(at..at + 2)
            .map_or(0, |b| u16::from_be_bytes([b[0], b[1]]))
    };
    let ported = matches!(proto, 6 | 17 | 132);
    Some(NftLog {
        at,
        verdict: verdict?,
        src,
        dst,
        sport: if ported { port(0) } else { 0 },
        dport: if ported { port(2) } else { 0 },
        proto,
        tcp_flags: if proto == 6 {
            l4.get(13).copied().unwrap_or(0)
        } else {
            0
        },
        in_ifindex,
        out_ifindex,
        count: 1,
    })
}

/// How long a flow's repeated drops are held and counted before they are
/// reported: the second the ring's kernel drops are folded by too.
pub const FOLD: Duration = Duration::from_secs(1);
/// Flows folded at once; past it a drop is reported alone (count 1), so
/// the count stays exact and only the rate grows.
const FOLD_FLOWS: usize = 65_536;
/// How often the reader wakes without a log to report what it held.
const TICK: Duration = Duration::from_millis(250);

/// Repeated drops of one flow (verdict, addresses, protocol, destination
/// port: the tables' per-flow key), reported at most once a [`FOLD`]
/// with their count: a drop is passed on when its flow had no report in
/// the last second, else held and counted; [`Fold::due`] passes on what
/// a flow held once its second is over, as the last held packet with the
/// count of all. Admissions pass unchanged (one per connection already).
#[derive(Debug, Default)]
pub(crate) struct Fold {
    flows: HashMap<FoldKey, Held>,
}

type FoldKey = (NftVerdict, IpAddr, IpAddr, u8, u16);

#[derive(Debug)]
struct Held {
    reported: Instant,
    count: u32,
    last: Option<NftLog>,
}

impl Fold {
    /// `log` as it arrives: what to pass on now, if anything.
    pub fn take(&mut self, log: NftLog, now: Instant) -> Option<NftLog> {
        if !log.verdict.is_drop() {
            return Some(log);
        }
        let key = (log.verdict, log.src, log.dst, log.proto, log.dport);
        match self.flows.get_mut(&key) {
            Some(h) if now.duration_since(h.reported) < FOLD => {
                h.count = h.count.saturating_add(log.count);
                h.last = Some(log);
                None
            }
            Some(h) => {
                let count = log.count.saturating_add(std::mem::take(&mut h.count));
                h.reported = now;
                h.last = None;
                Some(NftLog { count, ..log })
            }
            None => {
                if self.flows.len() < FOLD_FLOWS {
                    let held = Held {
                        reported: now,
                        count: 0,
                        last: None,
                    };
                    self.flows.insert(key, held);
                }
                Some(log)
            }
        }
    }

    /// What flows whose second is over held; forgets the quiet ones.
    pub fn due(&mut self, now: Instant) -> Vec<NftLog> {
        let mut out = Vec::new();
        self.flows.retain(|_, h| {
            if now.duration_since(h.reported) < FOLD {
                return true;
            }
            let Some(last) = h.last.take() else {
                return false;
            };
            out.push(NftLog {
                count: std::mem::take(&mut h.count),
                ..last
            });
            h.reported = now;
            true
        });
        out
    }
}

/// What the reader could not read.
#[derive(Debug, Default)]
pub struct NflogCounts {
    /// Messages that did not parse, or packets whose headers were cut.
    pub unreadable: AtomicU64,
    /// Times the socket's buffer overflowed (the kernel dropped logs).
    pub overflows: AtomicU64,
}

fn request(sock: &Socket, msg: NetlinkMessage<NetfilterMessage>, what: &str) -> Result<()> {
    let mut buf = vec![0; msg.header.length as usize];
    msg.serialize(&mut buf[..]);
    sock.send(&buf, 0)
        .with_context(|| format!("NFLOG {what}"))?;
    let mut rx = vec![0u8; 4096];
    let n = sock
        .recv(&mut &mut rx[..], 0)
        .with_context(|| format!("NFLOG {what}: no answer"))?;
    let answer = <NetlinkMessage<NetfilterMessage>>::deserialize(&rx[..n])
        .map_err(|e| anyhow::anyhow!("NFLOG {what}: {e}"))?;
    if let NetlinkPayload::Error(e) = answer.payload
        && let Some(code) = e.code
    {
        bail!(
            "NFLOG {what} refused: {} (is another program bound to group {GROUP}?)",
            std::io::Error::from_raw_os_error(-code.get())
        );
    }
    Ok(())
}

/// Binds group [`GROUP`] in the calling thread's network namespace and
/// reads it on a thread of its own, sending each of mycni's logged
/// packets to `sink` (never waiting on it).
pub fn spawn(sink: Sink, counts: Arc<NflogCounts>) -> Result<std::thread::JoinHandle<()>> {
    let mut sock = Socket::new(NETLINK_NETFILTER).context("an NFLOG socket")?;
    sock.bind_auto().context("binding the NFLOG socket")?;
    // Room for bursts: a full buffer loses logs (counted), it never blocks
    // the kernel.
    let _ = sock.set_rx_buf_sz(4 << 20);
    request(
        &sock,
        config_request(
            NetfilterProtoFamily::Unspec,
            GROUP,
            vec![
                ConfigCmd::Bind.into(),
                ConfigMode::new_packet(COPY_RANGE).into(),
                Timeout::from(FLUSH).into(),
            ],
        ),
        "bind",
    )?;
    set_tick(&sock)?;
    let t = std::thread::Builder::new()
        .name("mycni-nflog".into())
        .spawn(move || read(&sock, &sink, &counts))?;
    Ok(t)
}

/// Wakes a blocking `recv` every [`TICK`], so held drops are reported
/// when their flow goes quiet.
fn set_tick(sock: &Socket) -> Result<()> {
    use std::os::fd::AsRawFd;
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: libc::suseconds_t::try_from(TICK.as_micros()).unwrap_or(250_000),
    };
    // SAFETY: a valid socket and a timeval of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            std::ptr::from_ref(&tv).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("SO_RCVTIMEO on the NFLOG socket");
    }
    Ok(())
}

fn read(sock: &Socket, sink: &Sink, counts: &NflogCounts) {
    let mut rx = vec![0u8; 1 << 16];
    let mut fold = Fold::default();
    let mut next_due = Instant::now() + TICK;
    loop {
        let now = Instant::now();
        if now >= next_due {
            for log in fold.due(now) {
                sink.send(Observation::Nft(log));
            }
            next_due = now + TICK;
        }
        let n = match sock.recv(&mut &mut rx[..], 0) {
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                counts.overflows.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock
                ) =>
            {
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "NFLOG socket failed; nftables verdicts no longer reach flows");
                return;
            }
        };
        // One clock read of each kind per datagram: the kernel batches logs.
        let (at, arrived) = (SystemTime::now(), Instant::now());
        let mut off = 0;
        while off < n {
            let Ok(msg) = <NetlinkMessage<NetfilterMessage>>::deserialize(&rx[off..n]) else {
                counts.unreadable.fetch_add(1, Ordering::Relaxed);
                break;
            };
            let len = msg.header.length as usize;
            if let NetlinkPayload::InnerMessage(NetfilterMessage {
                inner: NetfilterMessageInner::ULog(ULogMessage::Packet(nlas)),
                ..
            }) = &msg.payload
            {
                match log_of(nlas, at) {
                    Some(log) => {
                        if let Some(log) = fold.take(log, arrived) {
                            sink.send(Observation::Nft(log));
                        }
                    }
                    None => {
                        counts.unreadable.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            if len == 0 {
                break;
            }
            // Messages are 4-byte aligned in a datagram.
            off += (len + 3) & !3;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::{Direction, Reason, log_prefix};

    #[test]
    fn a_logged_tcp_syn_becomes_its_log() {
        // IPv4, TCP 10.0.0.1:40000 -> 10.0.0.2:80, SYN.
        let mut p = vec![0u8; 40];
        p[0] = 0x45;
        p[9] = 6;
        p[12..16].copy_from_slice(&[10, 0, 0, 1]);
        p[16..20].copy_from_slice(&[10, 0, 0, 2]);
        p[20..22].copy_from_slice(&40000u16.to_be_bytes());
        p[22..24].copy_from_slice(&80u16.to_be_bytes());
        p[33] = 0x02;
        let nlas = vec![
            PacketNla::Prefix(
                std::ffi::CString::new(log_prefix(NftVerdict::PolicyDrop {
                    direction: Direction::Ingress,
                    reason: Reason::Denied,
                }))
                .expect("no NUL"),
            ),
            PacketNla::IfIndexInDev(7),
            PacketNla::Payload(p.clone()),
        ];
        let log = log_of(&nlas, SystemTime::UNIX_EPOCH).expect("a log");
        assert_eq!(log.src, IpAddr::from([10, 0, 0, 1]));
        assert_eq!(log.dst, IpAddr::from([10, 0, 0, 2]));
        assert_eq!(
            (log.sport, log.dport, log.proto, log.tcp_flags),
            (40000, 80, 6, 0x02)
        );
        assert_eq!(log.in_ifindex, 7);
        // Cut short: no log, not a wrong one.
        let short = vec![nlas[0].clone(), PacketNla::Payload(p[..10].to_vec())];
        assert_eq!(log_of(&short, SystemTime::UNIX_EPOCH), None);
    }

    fn drop_log(dport: u16, sport: u16) -> NftLog {
        NftLog {
            at: SystemTime::UNIX_EPOCH + Duration::from_secs(u64::from(sport)),
            verdict: NftVerdict::PolicyDrop {
                direction: Direction::Ingress,
                reason: Reason::Denied,
            },
            src: IpAddr::from([10, 0, 0, 1]),
            dst: IpAddr::from([10, 0, 0, 2]),
            sport,
            dport,
            proto: 6,
            tcp_flags: 0x02,
            in_ifindex: 7,
            out_ifindex: 0,
            count: 1,
        }
    }

    #[test]
    fn a_flows_repeats_are_reported_once_a_second_with_their_count() {
        let mut fold = Fold::default();
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        // The first drop at once; its repeats within the second held.
        assert_eq!(fold.take(drop_log(80, 1), t0).map(|l| l.count), Some(1));
        for (i, at) in [100, 400, 900].into_iter().enumerate() {
            assert_eq!(fold.take(drop_log(80, 2 + i as u16), ms(at)), None);
        }
        // Another flow (port) is its own.
        assert_eq!(
            fold.take(drop_log(81, 9), ms(500)).map(|l| l.count),
            Some(1)
        );
        assert!(fold.due(ms(950)).is_empty(), "reported within the second");
        // The second over: the held three as the last of them.
        let due = fold.due(ms(1000));
        assert_eq!(due.len(), 1, "{due:?}");
        assert_eq!((due[0].count, due[0].sport, due[0].dport), (3, 4, 80));
        // A repeat past the report's second goes at once, with what was
        // held since.
        assert_eq!(fold.take(drop_log(80, 5), ms(1500)), None);
        let now = fold
            .take(drop_log(80, 6), ms(2100))
            .expect("its second is over");
        assert_eq!((now.count, now.sport), (2, 6));
        // Quiet flows are forgotten; what they held never counts twice.
        assert!(fold.due(ms(3200)).is_empty());
        assert!(fold.flows.is_empty(), "{:?}", fold.flows);
        // Admissions are never held.
        let mut allow = drop_log(80, 7);
        allow.verdict = NftVerdict::PolicyAllow {
            direction: Direction::Ingress,
        };
        for _ in 0..3 {
            assert!(fold.take(allow.clone(), ms(3300)).is_some());
        }
    }
}
