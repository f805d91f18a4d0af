//! The lab end to end: 3 nodes x 2 pods made by the real agent and plugin,
//! every pod and node reaches every pod by ping and TCP, and a TCP stream
//! between pods on different nodes survives restarting the agents on both
//! ends with no reset.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use mycni_tests::lab::ECHO_PORT;

mod common;

#[test]
fn three_nodes_two_pods_all_reachable_and_streams_survive_agent_restarts() -> Result<()> {
    let t0 = Instant::now();
    let t = common::lab(3, 2)?;
    eprintln!("lab up in {} ms", t0.elapsed().as_millis());
    let l = &t.0;
    let (table, failed) = l.matrix()?;
    eprintln!("{table}matrix done at {} ms", t0.elapsed().as_millis());
    assert_eq!(failed, 0, "unreachable pairs:\n{table}");

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
