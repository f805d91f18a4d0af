//! Flow events: what the programs write into `mycni_flows`, path by path.
//! The ring is read from the test's own loaded object (by its pin), each
//! case checks that exactly the event it should came out (or none), field
//! by field, and the statistics map says the same.

use aya::maps::{Map, MapData, RingBuf};
use mycni_agent::datapath::{FlowStats, read_flow_stats};
use mycni_agent::flows::ring::parse_event;
use mycni_common::CFG_FLOW_EVENTS;
use mycni_common::flow::{FLOW_NEW, FLOW_PATH, FLOWS_MAP, FlowEvent, FlowSource};

use super::*;

/// The ring of the loaded object, and what has been read of it.
pub(crate) struct Ring {
    pub(crate) ring: RingBuf<MapData>,
    read: u64,
}

impl Ring {
    pub(crate) fn open(pin: &FsPath) -> Result<Self> {
        let data = MapData::from_pin(pin.join(FLOWS_MAP))?;
        Ok(Self {
            ring: RingBuf::try_from(Map::RingBuf(data))?,
            read: 0,
        })
    }

    /// Every event written since the last call.
    pub(crate) fn drain(&mut self) -> Result<Vec<FlowEvent>> {
        let mut out = vec![];
        while let Some(item) = self.ring.next() {
            out.push(parse_event(&item).with_context(|| {
                format!("a ring record of {} bytes, not a FlowEvent", item.len())
            })?);
        }
        self.read += out.len() as u64;
        Ok(out)
    }
}

/// What an event must say; the timestamp is checked to be recent only.
#[derive(Debug, Clone, Copy)]
struct Want {
    kind: u8,
    source: FlowSource,
    reason: DpPath,
    src: SocketAddrV4,
    dst: SocketAddrV4,
    proto: u8,
    tcp_flags: u8,
    ifindex: u32,
}

fn v4_bytes(a: Ipv4Addr) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..4].copy_from_slice(&a.octets());
    b
}

fn mono_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// `clock`'s reading, ns.
pub(crate) fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn check(what: &str, got: &[FlowEvent], want: Option<Want>) -> Result<()> {
    let Some(w) = want else {
        ensure!(got.is_empty(), "{what}: expected no event, got {got:#?}");
        eprintln!("ok  {what:<56} -> no event");
        return Ok(());
    };
    let [e] = got else {
        bail!("{what}: expected exactly one event, got {got:#?}");
    };
    let expected = FlowEvent {
        ts_ns: e.ts_ns,
        src: v4_bytes(*w.src.ip()),
        dst: v4_bytes(*w.dst.ip()),
        sport: w.src.port(),
        dport: w.dst.port(),
        ifindex: w.ifindex,
        count: 1,
        reason: w.reason as u16,
        proto: w.proto,
        family: 4,
        tcp_flags: w.tcp_flags,
        source: w.source as u8,
        kind: w.kind,
        _pad: [0; 5],
    };
    ensure!(
        *e == expected,
        "{what}: event differs\n  want: {expected:?}\n  got:  {e:?}"
    );
    let age = mono_ns().saturating_sub(e.ts_ns);
    ensure!(
        e.ts_ns != 0 && age < 60_000_000_000,
        "{what}: timestamp {} is not CLOCK_MONOTONIC of the last minute",
        e.ts_ns
    );
    eprintln!(
        "ok  {what:<56} -> {} {}",
        if w.kind == FLOW_NEW { "new" } else { "path" },
        w.reason.name()
    );
    Ok(())
}

/// Runs `prog` on `pkt` (counted once, as every case of this suite) and
/// checks the events it wrote against `want`.
fn expect(dp: &Dp, ring: &mut Ring, input: Input, want: Option<Want>) -> Result<()> {
    let Input { what, prog, pkt } = input;
    let (path, _) = dp.run(prog, pkt).with_context(|| what.to_string())?;
    if let Some(w) = want {
        ensure!(
            path == w.reason,
            "{what}: counted under {}, expected {}",
            path.name(),
            w.reason.name()
        );
    }
    check(what, &ring.drain()?, want)
}

pub(crate) fn with_events(cfg: DpConfig) -> DpConfig {
    DpConfig {
        flags: cfg.flags | CFG_FLOW_EVENTS,
        ..cfg
    }
}

fn stats(dp: &Dp) -> Result<FlowStats> {
    Ok(read_flow_stats(dp.pin)?)
}

#[test]
fn events_per_connection_from_pods() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let node = Node::new("fevpod")?;
    node.run(|dp| {
        dp.configure(&with_events(config()))?;
        let mut ring = Ring::open(dp.pin)?;
        let at_b = TcpListener::bind(SocketAddrV4::new(POD_B, SERVER_PORT))?;
        let a_b = tcp_conn(POD_A, SocketAddrV4::new(POD_B, SERVER_PORT), &at_b)?;
        ensure_ct(a_b.flow, &["ESTABLISHED"])?;
        let f = a_b.flow;
        let tcp_want = |kind, reason, flags, flow: Flow, ifindex| Want {
            kind,
            source: FlowSource::Pod,
            reason,
            src: flow.src,
            dst: flow.dst,
            proto: IPPROTO_TCP,
            tcp_flags: flags,
            ifindex,
        };

        // The connection's first packet, left to the kernel: new.
        let syn = from_a(&tcp(f, SYN, b""));
        let want = tcp_want(FLOW_NEW, DpPath::KernelTcpControl, SYN, f, 101);
        expect(dp, &mut ring, input("SYN A->B", POD, &syn), Some(want))?;
        // Established, fast: the connection changed path.
        let data = from_a(&tcp(f, ACK | PSH, b"hello"));
        let want = tcp_want(FLOW_PATH, DpPath::FastLocal, ACK | PSH, f, 101);
        expect(
            dp,
            &mut ring,
            input("data A->B, fast", POD, &data),
            Some(want),
        )?;
        // The same path again: nothing, however often.
        for _ in 0..3 {
            expect(dp, &mut ring, input("data A->B again", POD, &data), None)?;
        }
        let ack = from_a(&tcp(f, ACK, b""));
        expect(dp, &mut ring, input("bare ACK A->B", POD, &ack), None)?;
        // Its close goes to the kernel, as every close: not a new path.
        let fin = from_a(&tcp(f, FIN | ACK, b""));
        expect(dp, &mut ring, input("FIN A->B", POD, &fin), None)?;
        expect(
            dp,
            &mut ring,
            input("ACK A->B after the FIN", POD, &ack),
            None,
        )?;

        // The reply direction is a connection of its own to the program.
        let back = from_b(&tcp(f.rev(), ACK, b"world"));
        let want = tcp_want(FLOW_NEW, DpPath::FastLocal, ACK, f.rev(), 102);
        expect(
            dp,
            &mut ring,
            input("reply B->A, fast", POD, &back),
            Some(want),
        )?;

        // Refused before the L4 header is read: the ports are read for
        // the event alone.
        let to_world = Flow {
            src: SocketAddrV4::new(POD_A, 40_001),
            dst: SocketAddrV4::new(UNKNOWN, 53),
        };
        let dns = from_a(&udp(to_world, b"query"));
        let want = Want {
            kind: FLOW_NEW,
            source: FlowSource::Pod,
            reason: DpPath::KernelUnknownDest,
            src: to_world.src,
            dst: to_world.dst,
            proto: IPPROTO_UDP,
            tcp_flags: 0,
            ifindex: 101,
        };
        expect(dp, &mut ring, input("UDP A->world", POD, &dns), Some(want))?;
        expect(dp, &mut ring, input("UDP A->world again", POD, &dns), None)?;
        // The same connection on another path (TTL spent) and back:
        // changes, announced as they happen, three of them.
        let ttl1 = with_ttl(&from_a(&tcp(f, ACK, b"")), 1);
        let want = tcp_want(FLOW_PATH, DpPath::KernelTtl, ACK, f, 101);
        expect(
            dp,
            &mut ring,
            input("ACK A->B, TTL 1", POD, &ttl1),
            Some(want),
        )?;
        let want = tcp_want(FLOW_PATH, DpPath::FastLocal, ACK | PSH, f, 101);
        expect(
            dp,
            &mut ring,
            input("data A->B, fast again", POD, &data),
            Some(want),
        )?;
        // A connection whose path keeps changing: at most one a second;
        // the others counted, and the path announced last stands.
        let before = stats(dp)?;
        expect(
            dp,
            &mut ring,
            input("ACK A->B, TTL 1 again", POD, &ttl1),
            None,
        )?;
        expect(
            dp,
            &mut ring,
            input("data A->B, fast once more", POD, &data),
            None,
        )?;
        let after = stats(dp)?;
        ensure!(
            after.suppressed == before.suppressed + 1,
            "a fourth change within a second: {before:?} then {after:?}"
        );
        std::thread::sleep(Duration::from_millis(1_100));
        let want = tcp_want(FLOW_PATH, DpPath::KernelTtl, ACK, f, 101);
        expect(
            dp,
            &mut ring,
            input("ACK A->B, TTL 1, a second later", POD, &ttl1),
            Some(want),
        )?;

        // Without ports: one connection per pair and protocol.
        let ping = from_a(&icmp_echo(POD_A, POD_B));
        let want = Want {
            kind: FLOW_NEW,
            source: FlowSource::Pod,
            reason: DpPath::KernelNotTcpUdp,
            src: SocketAddrV4::new(POD_A, 0),
            dst: SocketAddrV4::new(POD_B, 0),
            proto: IPPROTO_ICMP,
            tcp_flags: 0,
            ifindex: 101,
        };
        expect(dp, &mut ring, input("ping A->B", POD, &ping), Some(want))?;

        // Never parsed: counted, no event.
        let arp = eth([0xff; 6], POD_A_MAC, ETH_P_ARP, &[0u8; 28]);
        expect(dp, &mut ring, input("ARP", POD, &arp), None)?;
        let options = from_a(&ipv4(IPPROTO_UDP, POD_A, POD_B, &[1, 1, 1, 1], &[0; 8]));
        expect(dp, &mut ring, input("IPv4 options", POD, &options), None)?;
        let short_tcp = from_a(&ipv4(IPPROTO_TCP, POD_A, POD_B, &[], &[0; 8]));
        expect(
            dp,
            &mut ring,
            input("TCP header cut short", POD, &short_tcp),
            None,
        )?;

        // Off: nothing, and nothing remembered either.
        dp.configure(&config())?;
        let later = Flow {
            src: SocketAddrV4::new(POD_A, 40_002),
            dst: SocketAddrV4::new(UNKNOWN, 53),
        };
        let dns2 = from_a(&udp(later, b"query"));
        expect(
            dp,
            &mut ring,
            input("events off: UDP A->world", POD, &dns2),
            None,
        )?;
        expect(
            dp,
            &mut ring,
            input("events off: SYN A->B", POD, &syn),
            None,
        )?;
        dp.configure(&with_events(config()))?;
        let want = Want {
            kind: FLOW_NEW,
            source: FlowSource::Pod,
            reason: DpPath::KernelUnknownDest,
            src: later.src,
            dst: later.dst,
            proto: IPPROTO_UDP,
            tcp_flags: 0,
            ifindex: 101,
        };
        expect(
            dp,
            &mut ring,
            input("events on again: new", POD, &dns2),
            Some(want),
        )?;

        let s = stats(dp)?;
        ensure!(
            s.emitted == ring.read && s.lost == 0,
            "stats {s:?}, {} events read",
            ring.read
        );
        Ok(())
    })
}

#[test]
fn events_of_decapsulated_packets_name_the_inner_connection() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let node = Node::new("fevdec")?.with_underlay()?;
    node.run(|dp| {
        dp.configure(&with_events(encap_config()?))?;
        let mut ring = Ring::open(dp.pin)?;
        let at_r = TcpListener::bind(SocketAddrV4::new(POD_R, SERVER_PORT))?;
        let a_r = tcp_conn(POD_A, SocketAddrV4::new(POD_R, SERVER_PORT), &at_r)?;
        ensure_ct(a_r.flow, &["ESTABLISHED"])?;
        let back = a_r.flow.rev();
        let ra = from_peer(&tcp(back, ACK, b"200 OK"));
        let ul0 = ifindex("ul0")?;

        // Unwrapped on the underlay: the inner tuple, the underlay device.
        dp.iif.set(Some(ul0));
        let want = Want {
            kind: FLOW_NEW,
            source: FlowSource::Underlay,
            reason: DpPath::FastTcDecap,
            src: back.src,
            dst: back.dst,
            proto: IPPROTO_TCP,
            tcp_flags: ACK,
            ifindex: ul0,
        };
        let wrapped_ra = wrapped(UL_PEER, &ra, |_| {});
        expect(
            dp,
            &mut ring,
            input("R->A over the underlay", UL, &wrapped_ra),
            Some(want),
        )?;
        expect(
            dp,
            &mut ring,
            input("R->A over the underlay again", UL, &wrapped_ra),
            None,
        )?;
        // The inner SYN of the same connection: not a new path.
        let syn = wrapped(UL_PEER, &from_peer(&tcp(back, SYN, b"")), |_| {});
        expect(dp, &mut ring, input("inner SYN R->A", UL, &syn), None)?;
        // VXLAN from a stranger: its inner packet was never looked at.
        let stranger = wrapped(UL_STRANGER, &ra, |_| {});
        expect(
            dp,
            &mut ring,
            input("VXLAN from no peer", UL, &stranger),
            None,
        )?;
        // The node's own traffic on the underlay: no event.
        let own = eth(
            [0; 6],
            UL_PEER_MAC,
            ETH_P_IP,
            &udp(
                Flow {
                    src: SocketAddrV4::new(UL_PEER, 999),
                    dst: SocketAddrV4::new(UL_HOST, 53),
                },
                b"x",
            ),
        );
        expect(dp, &mut ring, input("the host's own UDP", UL, &own), None)?;

        // The same connection decapsulated by vxlan.1: another program,
        // so a connection of its own.
        dp.iif.set(Some(VXLAN_IFINDEX));
        let want = Want {
            source: FlowSource::Vxlan,
            reason: DpPath::FastDecap,
            ifindex: VXLAN_IFINDEX,
            ..want
        };
        expect(
            dp,
            &mut ring,
            input("R->A from vxlan.1", VX, &ra),
            Some(want),
        )?;
        dp.iif.set(None);

        // From pod A, encapsulated in tc.
        let ar = from_a(&tcp(a_r.flow, ACK, b"GET /"));
        let want = Want {
            kind: FLOW_NEW,
            source: FlowSource::Pod,
            reason: DpPath::FastEncap,
            src: a_r.flow.src,
            dst: a_r.flow.dst,
            proto: IPPROTO_TCP,
            tcp_flags: ACK,
            ifindex: 101,
        };
        let (path, _) = dp.run(POD, &ar)?;
        ensure!(
            path == DpPath::FastEncap,
            "A->R counted under {}",
            path.name()
        );
        check("A->R, encapsulated", &ring.drain()?, Some(want))?;

        let s = stats(dp)?;
        ensure!(s.emitted == ring.read && s.lost == 0, "stats {s:?}");
        Ok(())
    })
}

/// IPv6: the same events, 16-byte addresses, family 6.
#[test]
fn ipv6_connections_are_announced_too() -> Result<()> {
    let _turn = crate::turn(module_path!());
    use super::ipv6::{from_a6, listen6, tcp_conn6, tcp6};
    let node = Node::new("fev6")?;
    node.run(|dp| {
        dp.configure(&with_events(config()))?;
        let mut ring = Ring::open(dp.pin)?;
        let at_b = listen6(POD_B6)?;
        let a_b = tcp_conn6(POD_A6, POD_B6, &at_b)?;
        let f = a_b.flow;
        for (what, flags, kind, reason) in [
            ("SYN6 A->B", SYN, Some(FLOW_NEW), DpPath::KernelTcpControl),
            (
                "data6 A->B, fast",
                ACK | PSH,
                Some(FLOW_PATH),
                DpPath::FastLocal,
            ),
            ("data6 A->B again", ACK | PSH, None, DpPath::FastLocal),
        ] {
            let (path, _) = dp.run(POD, &from_a6(&tcp6(f, flags, b"x")))?;
            ensure!(path == reason, "{what}: counted under {}", path.name());
            let got = ring.drain()?;
            match kind {
                None => ensure!(got.is_empty(), "{what}: {got:?}"),
                Some(kind) => {
                    let [e] = got[..] else {
                        bail!("{what}: expected one event, got {got:?}");
                    };
                    let want = FlowEvent {
                        ts_ns: e.ts_ns,
                        src: f.src.ip().octets(),
                        dst: f.dst.ip().octets(),
                        sport: f.src.port(),
                        dport: f.dst.port(),
                        ifindex: 101,
                        count: 1,
                        reason: reason as u16,
                        proto: IPPROTO_TCP,
                        family: 6,
                        tcp_flags: flags,
                        source: FlowSource::Pod as u8,
                        kind,
                        _pad: [0; 5],
                    };
                    ensure!(e == want, "{what}\n  want: {want:?}\n  got:  {e:?}");
                }
            }
            eprintln!("ok  {what:<56} -> {kind:?} {}", reason.name());
        }
        Ok(())
    })
}

/// A ring nobody reads fills up; what does not fit is counted lost, never
/// waited on, and what was written is intact.
#[test]
fn a_full_ring_counts_lost_events() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let node = Node::new("fevfull")?;
    node.run(|dp| {
        dp.configure(&with_events(config()))?;
        let prog = dp.dp.program_fd(POD)?;
        // More new connections than the ring holds (1 MiB of 72-byte
        // records: 64 bytes and the ring's 8-byte header).
        let n: u16 = 16_000;
        for port in 0..n {
            let flow = Flow {
                src: SocketAddrV4::new(POD_A, 10_000 + port),
                dst: SocketAddrV4::new(UNKNOWN, 53),
            };
            run_skb_from(prog, &from_a(&udp(flow, b"q")), 101)?;
        }
        let s = stats(dp)?;
        ensure!(
            s.emitted + s.lost == u64::from(n) && s.lost > 0,
            "{n} new connections: {s:?}"
        );
        let mut ring = Ring::open(dp.pin)?;
        let events = ring.drain()?;
        ensure!(
            events.len() as u64 == s.emitted,
            "{} events in the ring, {} emitted",
            events.len(),
            s.emitted
        );
        for (i, e) in events.iter().enumerate() {
            ensure!(
                e.kind == FLOW_NEW && e.sport == 10_000 + i as u16,
                "event {i} out of order or damaged: {e:?}"
            );
        }
        eprintln!("ok  {} emitted, {} lost", s.emitted, s.lost);
        // Read, the ring takes events again.
        let flow = Flow {
            src: SocketAddrV4::new(POD_A, 9_999),
            dst: SocketAddrV4::new(UNKNOWN, 53),
        };
        run_skb_from(prog, &from_a(&udp(flow, b"q")), 101)?;
        ensure!(ring.drain()?.len() == 1, "no event after the ring was read");
        Ok(())
    })
}

/// The agent's reader (`flows::ring::spawn`) on the pinned ring: an event
/// becomes an observation at wall time.
#[test]
fn the_agents_reader_hands_events_to_the_sink() -> Result<()> {
    let _turn = crate::turn(module_path!());
    use mycni_agent::flows::{Observation, Sink};
    let node = Node::new("fevread")?;
    node.run(|dp| {
        dp.configure(&with_events(config()))?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async {
            let (sink, mut rx) = Sink::new(16);
            let task = mycni_agent::flows::ring::spawn(dp.pin, sink)?;
            let flow = Flow {
                src: SocketAddrV4::new(POD_A, 40_003),
                dst: SocketAddrV4::new(UNKNOWN, 53),
            };
            let before = std::time::SystemTime::now();
            dp.run(POD, &from_a(&udp(flow, b"q")))?;
            let got = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
            task.abort();
            let Ok(Some(Observation::Datapath { at, event })) = got else {
                bail!("no observation from the reader: {got:?}");
            };
            ensure!(event.sport == 40_003 && event.kind == FLOW_NEW, "{event:?}");
            let skew = at.duration_since(before).unwrap_or_else(|e| e.duration());
            ensure!(
                skew < Duration::from_secs(2),
                "observed at {at:?}, sent at {before:?}"
            );
            eprintln!("ok  the reader's observation, {skew:?} after the send");
            Ok(())
        })
    })
}
