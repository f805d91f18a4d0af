//! The lab end to end: 3 nodes x 2 pods made by the real agent and plugin,
//! every pod and node reaches every pod by ping and TCP, and a TCP stream
//! between pods on different nodes survives restarting the agents on both
//! ends with no reset.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use mycni_tests::in_netns;
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
    let stop2 = stop.clone();
    let addr = SocketAddr::from((dst.ip, ECHO_PORT));
    let ns = src.ns.clone();
    // A steady echo stream from node 1's pod to node 2's: any reset or
    // stall shows up as an error or as the longest gap between round trips.
    let stream = std::thread::spawn(move || -> Result<(u64, Duration)> {
        in_netns(&ns, move || -> Result<(u64, Duration)> {
            let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
            c.set_read_timeout(Some(Duration::from_secs(10)))?;
            let buf = [0x5au8; 1024];
            let mut back = [0u8; 1024];
            let (mut rounds, mut longest) = (0u64, Duration::ZERO);
            let mut last = Instant::now();
            while !stop2.load(Ordering::Relaxed) {
                c.write_all(&buf)?;
                c.read_exact(&mut back)?;
                anyhow::ensure!(back == buf, "corrupted echo");
                rounds += 1;
                longest = longest.max(last.elapsed());
                last = Instant::now();
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok((rounds, longest))
        })?
    });
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
