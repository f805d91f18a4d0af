//! What the tracepoint costs the kernel, measured by hand.

use super::*;

/// The tracepoint's cost per call (the kernel's BPF run-time statistics,
/// turned on for the measurement) on three paths: drops on an interface
/// nobody watches (the filter every other drop of the machine takes),
/// repeats of one watched flow (folded), and distinct watched flows (one
/// event each). Run by hand: `-- --ignored --nocapture`.
#[test]
#[ignore = "a measurement, not a check"]
fn cost_of_the_tracepoint() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let bpffs = BpfFs::new()?;
    let net = VethPair::new("10.235.0.1", "10.235.0.2")?;
    net.pin_neighbours("10.235.0.1", "10.235.0.2")?;
    rp_filter(&net.node, &net.host_if)?;
    net.pod
        .exec("ip", &["addr", "add", "10.77.7.9/32", "dev", "eth0"])?;
    let ifindex = net.host_ifindex()?;
    let mut w = Watch::new(&net.node, &bpffs, &[ifindex])?;
    let prev = std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled")?;
    std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "1")?;
    let r = (|| -> Result<()> {
        let dst: SocketAddr = "10.235.0.1:9".parse()?;
        let lo = |port| SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port);
        let spoofed = |port| SocketAddr::new([10, 77, 7, 9].into(), port);
        let phases: [(&str, &PacketOf<'_>); 3] = [
            // A closed port on the pod's loopback: NO_SOCKET on `lo`.
            ("unwatched (lo, NO_SOCKET)", &|_| (lo(40000), lo(9))),
            ("watched, one flow (folded)", &|_| (spoofed(40000), dst)),
            ("watched, distinct flows (an event each)", &|i| {
                (spoofed(20000 + i), dst)
            }),
        ];
        // What the rest of the machine frees with a reason meanwhile.
        let idle = Duration::from_secs(10);
        let before = prog_stats()?;
        std::thread::sleep(idle);
        let after = prog_stats()?;
        eprintln!(
            "idle: {} runs in {idle:?} (every kfree_skb of the kernel), {:.0} ns a run",
            after.0 - before.0,
            (after.1 - before.1) as f64 / (after.0 - before.0).max(1) as f64
        );
        let n: u16 = 20_000;
        for (what, flow) in &phases {
            let before = prog_stats()?;
            net.pod.run_in(|| -> Result<()> {
                for i in 0..n {
                    let (src, to) = flow(i);
                    let s = UdpSocket::bind(src)?;
                    // A closed port answers with ICMP, which the next
                    // send may report as an error: not ours to count.
                    let _ = s.send_to(b"kdrop", to);
                }
                Ok(())
            })??;
            std::thread::sleep(Duration::from_millis(200));
            let after = prog_stats()?;
            let (runs, ns) = (after.0 - before.0, after.1 - before.1);
            let events = w.events(
                &Flow {
                    ifindex: 0,
                    src: dst,
                    dst,
                    proto: 0,
                },
                usize::MAX,
                QUIET,
            );
            ensure!(events.is_empty(), "no event has ifindex 0");
            let read = w.seen.len();
            eprintln!(
                "{what}: {n} packets, {runs} runs, {:.0} ns a run, {read} events read; \
                 stats so far (emitted, lost, suppressed): {:?}; first: {}",
                ns as f64 / runs.max(1) as f64,
                w.dp.flow_stats()?,
                w.show(&w.seen[..read.min(3)])
            );
            w.seen.clear();
        }
        Ok(())
    })();
    std::fs::write("/proc/sys/kernel/bpf_stats_enabled", prev.trim())?;
    r
}

/// Packet `i`'s source and destination.
type PacketOf<'a> = dyn Fn(u16) -> (SocketAddr, SocketAddr) + Sync + 'a;

/// (run_cnt, run_time_ns) of the newest `mycni_kfree_skb` on the kernel:
/// this test's (it loads last).
fn prog_stats() -> Result<(u64, u64)> {
    let out = mycni_testkit::sh(
        "bpftool",
        &["-j", "prog", "show", "name", "mycni_kfree_skb"],
    )?;
    // One object per program, or a list: take the highest id.
    let v: serde_json::Value = serde_json::from_str(&out)?;
    let progs = match v {
        serde_json::Value::Array(a) => a,
        o => vec![o],
    };
    let p = progs
        .iter()
        .max_by_key(|p| p["id"].as_u64())
        .context("no mycni_kfree_skb loaded")?;
    Ok((
        p["run_cnt"].as_u64().unwrap_or(0),
        p["run_time_ns"].as_u64().unwrap_or(0),
    ))
}
