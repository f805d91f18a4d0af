//! What flow events cost: the programs' ns per packet with events off and
//! on (the kernel's own timing of `BPF_PROG_TEST_RUN`), and the agent's
//! reader's CPU per event. Measurements, not checks: run them alone, as
//! `cargo test -p mycni-agent --test datapath -- --ignored --nocapture
//! --test-threads 1 ebpf_prog::flow_cost` (side by side they share the
//! CPUs they measure).

use super::flow_events::{Ring, with_events};
use super::*;

/// The kernel's own time for `repeat` runs of `prog` on `packet`
/// arriving on `iif`: ns per run.
fn run_repeat(
    prog: std::os::fd::BorrowedFd<'_>,
    packet: &[u8],
    iif: u32,
    repeat: u32,
) -> Result<u32> {
    mycni_testkit::testrun::run_skb_repeat(prog, packet, iif, repeat).map(|(_, ns)| ns)
}

/// The programs' cost per packet with events off and on (ns, the kernel's
/// own timing of `BPF_PROG_TEST_RUN`): an established connection on its
/// path (the hot path: one lookup more) and a new connection's first
/// packet (an event written). A measurement, not a check: run with
/// `--ignored --nocapture`.
#[test]
#[ignore]
fn cost_per_packet_with_events_on_and_off() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let node = Node::new("fevcost")?.with_underlay()?;
    node.run(|dp| {
        let base = encap_config()?;
        let at_b = TcpListener::bind(SocketAddrV4::new(POD_B, SERVER_PORT))?;
        let at_r = TcpListener::bind(SocketAddrV4::new(POD_R, SERVER_PORT))?;
        let a_b = tcp_conn(POD_A, SocketAddrV4::new(POD_B, SERVER_PORT), &at_b)?;
        let a_r = tcp_conn(POD_A, SocketAddrV4::new(POD_R, SERVER_PORT), &at_r)?;
        let udp_ab = UdpPair::new(POD_A, POD_B)?;
        udp_ab.exchange(true)?;
        // Conntrack assures a UDP flow only after traffic 2 s apart.
        std::thread::sleep(Duration::from_millis(2_100));
        udp_ab.exchange(true)?;
        dp.configure(&base)?;
        let (pod, ul) = (dp.dp.program_fd(POD)?, dp.dp.program_fd(UL)?);
        let ul0 = ifindex("ul0")?;
        // TTL 255: each repeat forwards the packet the last one rewrote,
        // one TTL less, so runs of 200 stay on the fast path. Wrapping and
        // unwrapping change the packet for good: those run once a call.
        let tcp_pkt = with_ttl(&from_a(&tcp(a_b.flow, ACK, &[0; 64])), 255);
        let udp_pkt = with_ttl(&from_a(&udp(udp_ab.flow, &[0; 64])), 255);
        let encap_pkt = from_a(&tcp(a_r.flow, ACK, &[0; 64]));
        let decap_pkt = wrapped(
            UL_PEER,
            &from_peer(&tcp(a_r.flow.rev(), ACK, &[0; 64])),
            |_| {},
        );
        for (prog, pkt, want) in [
            (POD, &tcp_pkt, DpPath::FastLocal),
            (POD, &udp_pkt, DpPath::FastLocal),
            (POD, &encap_pkt, DpPath::FastEncap),
        ] {
            let (p, _) = dp.run(prog, pkt)?;
            ensure!(p == want, "{} under {}", want.name(), p.name());
        }
        dp.iif.set(Some(ul0));
        let (p, _) = dp.run(UL, &decap_pkt)?;
        dp.iif.set(None);
        ensure!(p == DpPath::FastTcDecap, "decap under {}", p.name());
        // Off and on alternate in short turns, and each figure is the
        // median over its turns' runs: other work on the machine moves
        // both alike and single slow runs do not count.
        let mut runs: [[Vec<u32>; 5]; 2] = Default::default();
        let mut port = 20_000u16;
        for turn in 0..20 {
            // Which goes first alternates too: the second of a turn ran
            // ~10 ns slower even on an object without events.
            let order = if turn % 2 == 0 {
                [false, true]
            } else {
                [true, false]
            };
            for on in order {
                let cfg = if on { with_events(base) } else { base };
                dp.configure(&cfg)?;
                let r = &mut runs[usize::from(on)];
                for _ in 0..50 {
                    r[0].push(run_repeat(pod, &tcp_pkt, 101, 200)?);
                    r[1].push(run_repeat(pod, &udp_pkt, 101, 200)?);
                }
                for _ in 0..200 {
                    r[2].push(run_repeat(pod, &encap_pkt, 101, 1)?);
                    r[3].push(run_repeat(ul, &decap_pkt, ul0, 1)?);
                }
                // New connections: one packet each (an event with events on).
                let mut ring = Ring::open(dp.pin)?;
                for _ in 0..200 {
                    port = port.wrapping_add(1);
                    let flow = Flow {
                        src: SocketAddrV4::new(POD_A, port),
                        dst: SocketAddrV4::new(UNKNOWN, 53),
                    };
                    r[4].push(run_repeat(pod, &from_a(&udp(flow, b"q")), 101, 1)?);
                }
                ring.drain()?;
            }
        }
        let median = |v: &mut Vec<u32>| {
            v.sort_unstable();
            v[v.len() / 2]
        };
        for (i, what) in [
            "fast_local TCP, established (x200)",
            "fast_local UDP, established (x200)",
            "fast_encap TCP, established",
            "fast_tc_decap TCP, established",
            "new connection, kernel_unknown_dest",
        ]
        .into_iter()
        .enumerate()
        {
            let off = median(&mut runs[0][i]);
            let on = median(&mut runs[1][i]);
            eprintln!(
                "{what:<40} off {off:5} ns  on {on:5} ns  ({:+} ns)",
                i64::from(on) - i64::from(off)
            );
        }
        Ok(())
    })
}

/// What the next-hop cache saves: `mycni_from_pod`'s ns per encapsulated
/// packet with the cache off (generation 0: a FIB lookup each) and on
/// (a hit), alternating in turns, medians. A measurement:
/// `--ignored --nocapture --test-threads 1 nexthop_cost`.
#[test]
#[ignore]
fn nexthop_cost_per_encapsulated_packet() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let node = Node::new("nhcost")?.with_underlay()?;
    node.run(|dp| {
        dp.configure(&encap_config()?)?;
        let at_r = TcpListener::bind(SocketAddrV4::new(POD_R, SERVER_PORT))?;
        let a_r = tcp_conn(POD_A, SocketAddrV4::new(POD_R, SERVER_PORT), &at_r)?;
        let udp_ar = UdpPair::new(POD_A, POD_R)?;
        udp_ar.exchange(true)?;
        // Conntrack assures a UDP flow only after traffic 2 s apart.
        std::thread::sleep(Duration::from_millis(2_100));
        udp_ar.exchange(true)?;
        let pod = dp.dp.program_fd(POD)?;
        let generation = mycni_agent::datapath::NexthopGen::open(dp.pin)?;
        let data = aya::maps::MapData::from_pin(dp.pin.join(mycni_common::NEXTHOP_GEN_MAP))?;
        let mut raw: aya::maps::Array<_, u32> =
            aya::maps::Array::try_from(aya::maps::Map::Array(data))?;
        let pkts = [
            ("fast_encap TCP 64 B", from_a(&tcp(a_r.flow, ACK, &[0; 64]))),
            ("fast_encap UDP 64 B", from_a(&udp(udp_ar.flow, &[0; 64]))),
        ];
        for (what, p) in &pkts {
            let (path, _) = dp.run(POD, p)?;
            ensure!(path == DpPath::FastEncap, "{what}: {}", path.name());
        }
        let mut runs: [[Vec<u32>; 2]; 2] = Default::default();
        for turn in 0..20 {
            let order = if turn % 2 == 0 {
                [false, true]
            } else {
                [true, false]
            };
            for on in order {
                if on {
                    generation.bump()?;
                } else {
                    raw.set(0, &0, 0)?;
                }
                for (i, (_, p)) in pkts.iter().enumerate() {
                    for _ in 0..300 {
                        runs[usize::from(on)][i].push(run_repeat(pod, p, 101, 1)?);
                    }
                }
            }
        }
        let median = |v: &mut Vec<u32>| {
            v.sort_unstable();
            v[v.len() / 2]
        };
        for (i, (what, _)) in pkts.iter().enumerate() {
            let off = median(&mut runs[0][i]);
            let on = median(&mut runs[1][i]);
            eprintln!(
                "{what:<24} FIB each {off:5} ns  cached {on:5} ns  ({:+} ns, {:.2}x)",
                i64::from(on) - i64::from(off),
                f64::from(on) / f64::from(off)
            );
        }
        Ok(())
    })
}

/// The agent's side of an event: what the reader does with each record
/// of a full ring (convert to an observation at wall time, send to the
/// sink), in ns of CPU per event. A measurement: `--ignored --nocapture`.
#[test]
#[ignore]
fn reader_cost_per_event() -> Result<()> {
    let _turn = crate::turn(module_path!());
    use mycni_agent::flows::Sink;
    use mycni_agent::flows::ring::Clock;
    let node = Node::new("fevrcost")?;
    node.run(|dp| {
        dp.configure(&with_events(config()))?;
        let prog = dp.dp.program_fd(POD)?;
        let mut ring = Ring::open(dp.pin)?;
        let mut per_event = vec![];
        for round in 0..5u16 {
            for port in 0..14_000u16 {
                let flow = Flow {
                    src: SocketAddrV4::new(POD_A, 1_000 + port),
                    dst: SocketAddrV4::new(UNKNOWN, 1_000 + round),
                };
                run_skb_from(prog, &from_a(&udp(flow, b"q")), 101)?;
            }
            let (sink, mut rx) = Sink::new(16_384);
            let start = thread_cpu_ns();
            let clock = Clock::now();
            let mut n = 0u64;
            while let Some(item) = ring.ring.next() {
                if let Some(o) = clock.observation(&item) {
                    sink.send(o);
                    n += 1;
                }
            }
            let ns = (thread_cpu_ns() - start) as f64 / n as f64;
            ensure!(
                n == 14_000 && sink.lost() == 0,
                "{n} events, {} lost",
                sink.lost()
            );
            while rx.try_recv().is_ok() {}
            per_event.push(ns);
        }
        per_event.sort_by(f64::total_cmp);
        eprintln!(
            "reader: {:.0} ns of CPU per event (median of 5 full rings of 14,000)",
            per_event[2]
        );
        Ok(())
    })
}

/// The ring and the agent's reader at a given event rate: new connections
/// (one event each) written by the program at 10,000 and 50,000 a second
/// for 2 s, read by the agent's own reader task (`flows::ring::spawn`,
/// its 10 ms pause included) on a runtime thread of its own, into a sink
/// drained as the room would take it. Says what the ring lost (the
/// programs' `lost` count), what the sink lost, and the reader thread's CPU
/// as a share of one core. A measurement:
/// `--ignored --nocapture --test-threads 1 ring_rate`.
#[test]
#[ignore]
fn ring_rate_reader_keeps_up() -> Result<()> {
    let _turn = crate::turn(module_path!());
    use mycni_agent::flows::Sink;
    let node = Node::new("fevrate")?;
    node.run(|dp| {
        dp.configure(&with_events(config()))?;
        let prog = dp.dp.program_fd(POD)?;
        let mut port = 0u32;
        for rate in [10_000u32, 50_000] {
            let before = mycni_agent::datapath::read_flow_stats(dp.pin)?;
            let (sink, mut rx) = Sink::new(mycni_agent::flows::SINK_CAPACITY);
            let lost_sink = sink.clone();
            let pin = dp.pin.to_path_buf();
            let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
            let reader = std::thread::spawn(move || -> Result<(u64, f64)> {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                let (n, cpu) = rt.block_on(async move {
                    let t0 = thread_cpu_ns();
                    let task = mycni_agent::flows::ring::spawn(&pin, sink)?;
                    let count = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
                    let c = count.clone();
                    let drain = tokio::spawn(async move {
                        while rx.recv().await.is_some() {
                            c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    });
                    while stop_rx.try_recv().is_err() {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    task.abort();
                    drain.abort();
                    let n = count.load(std::sync::atomic::Ordering::Relaxed);
                    anyhow::Ok((n, thread_cpu_ns() - t0))
                })?;
                Ok((n, cpu as f64))
            });
            let t0 = Instant::now();
            let total = rate * 2;
            for i in 0..total {
                port += 1;
                let flow = Flow {
                    src: SocketAddrV4::new(POD_A, 1_024 + (port % 60_000) as u16),
                    dst: SocketAddrV4::new(UNKNOWN, 1_000 + (port / 60_000) as u16),
                };
                run_skb_from(prog, &from_a(&udp(flow, b"q")), 101)?;
                // Paced: event i is due at i / rate seconds.
                let due = Duration::from_secs_f64(f64::from(i + 1) / f64::from(rate));
                while t0.elapsed() < due {
                    std::hint::spin_loop();
                }
            }
            let took = t0.elapsed();
            std::thread::sleep(Duration::from_millis(200));
            stop_tx.send(()).ok();
            let (read, cpu_ns) = reader
                .join()
                .map_err(|_| anyhow::anyhow!("reader thread panicked"))??;
            let after = mycni_agent::datapath::read_flow_stats(dp.pin)?;
            let emitted = after.emitted - before.emitted;
            let lost = after.lost - before.lost;
            eprintln!(
                "{rate:>6}/s for {took:.2?}: emitted {emitted}, ring lost {lost}, read {read}, sink lost {}, reader CPU {:.2} % of a core",
                lost_sink.lost(),
                cpu_ns / took.as_secs_f64() / 1e7
            );
            ensure!(emitted == u64::from(total), "{emitted} of {total} emitted");
        }
        Ok(())
    })
}

/// The calling thread's CPU time, ns.
fn thread_cpu_ns() -> u64 {
    super::flow_events::clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}
