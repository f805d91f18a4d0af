//! The lab end to end: 3 nodes x 2 dual-stack pods made by the real agent
//! and plugin, every agent on the fast path it was asked for, every pod and
//! node reaches every pod by ping, TCP and a bulk echo over IPv4 and IPv6,
//! most pod-to-pod packets of each family take the fast path, and a TCP stream between pods on different nodes
//! survives restarting the agents on both ends with no reset.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use mycni_lab::{ECHO_PORT, IpFamily, Stack};

use crate::common;

#[test]
fn three_nodes_two_pods_all_reachable_and_streams_survive_agent_restarts() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let t0 = Instant::now();
    let t = common::lab_stack(3, 2, Stack::Dual, &[])?;
    eprintln!("lab up in {} ms", t0.elapsed().as_millis());
    let l = &t.0;
    // The agents' default: an agent built without the eBPF object, or whose
    // programs fail to load, would still come up on the kernel path.
    l.check_datapath("ebpf")?;
    let run = l.matrix_counted()?;
    let table = &run.table;
    eprintln!(
        "{table}matrix done at {} ms\n{}",
        t0.elapsed().as_millis(),
        l.datapath_report(&run)
    );
    assert_eq!(run.failed, 0, "unreachable pairs:\n{table}");
    assert_eq!(run.families, [IpFamily::V4, IpFamily::V6]);
    // Each pod-to-pod cell's echo is mostly fast-pathed; its ping, SYNs and
    // FINs are not, which keeps the share well short of 100% (about 80%
    // here, in each family). A share near 0 means the programs forward
    // nothing of that family.
    for f in [IpFamily::V4, IpFamily::V6] {
        for i in 1..=3 {
            let share = run.share(i, f, true).context("no counters")?;
            let fast = share.fast_pct().unwrap_or(0.0);
            assert!(fast >= 30.0, "node{i} {f}: {}", share.describe());
        }
    }

    let pods = l.pods()?;
    let src = pods.iter().find(|p| p.node == 1).context("pod on node 1")?;
    let dst = pods.iter().find(|p| p.node == 2).context("pod on node 2")?;
    let stop = Arc::new(AtomicBool::new(false));
    let stream = common::echo_stream(&src.ns, SocketAddr::from((dst.ip, ECHO_PORT)), stop.clone());
    std::thread::sleep(Duration::from_millis(500));
    l.restart_agent(1)?;
    l.restart_agent(2)?;
    eprintln!("agents restarted at {} ms", t0.elapsed().as_millis());
    std::thread::sleep(Duration::from_millis(1000));
    stop.store(true, Ordering::Relaxed);
    let (rounds, longest) = stream
        .join()
        .map_err(|_| anyhow::anyhow!("stream thread panicked"))??;
    eprintln!(
        "stream across both agent restarts: {rounds} round trips, longest gap {} ms",
        longest.as_millis()
    );
    assert!(rounds > 100, "only {rounds} round trips");
    assert!(longest < Duration::from_secs(1), "gap of {longest:?}");
    let (_, failed) = l.matrix()?;
    assert_eq!(failed, 0, "unreachable after restarts");
    Ok(())
}
