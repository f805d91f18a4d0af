//! `mycni-lab tcp-crr`: new connections per second, TCP_CRR-style (connect,
//! one byte echoed, close, again), and each connect's time, which is the
//! round trip of a connection's first packet: the SYN is the packet every
//! policy is judged on (the fast path never carries it), so its added
//! latency is what a policy costs a new connection.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::stats::percentile;

/// One connect loop's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Crr {
    pub connections: usize,
    pub per_sec: f64,
    /// connect()'s own time (SYN out to SYN-ACK in), microseconds.
    pub connect_p50_us: f64,
    pub connect_p99_us: f64,
}

/// Connects to the echo server at `addr` over and over for `seconds`.
/// A connection that fails fails the loop: a policy bench whose pair is
/// refused measured nothing.
pub fn tcp_crr(addr: &str, seconds: u64) -> Result<Crr> {
    let addr: SocketAddr = addr.parse()?;
    let mut connect_us: Vec<f64> = Vec::new();
    let start = Instant::now();
    let end = start + Duration::from_secs(seconds);
    let mut buf = [0u8; 1];
    while Instant::now() < end {
        let t = Instant::now();
        let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
            .with_context(|| format!("tcp-crr: connection {} to {addr}", connect_us.len() + 1))?;
        let connected = t.elapsed();
        c.set_nodelay(true)?;
        c.set_read_timeout(Some(Duration::from_secs(2)))?;
        c.write_all(b"x")?;
        c.read_exact(&mut buf).context("tcp-crr: no echo")?;
        // Dropped here: the client closes first, as netperf's TCP_CRR does.
        drop(c);
        connect_us.push(connected.as_secs_f64() * 1e6);
    }
    if connect_us.is_empty() {
        bail!("tcp-crr: no connection in {seconds} s");
    }
    Ok(Crr {
        connections: connect_us.len(),
        per_sec: connect_us.len() as f64 / start.elapsed().as_secs_f64(),
        connect_p50_us: percentile(&connect_us, 50),
        connect_p99_us: percentile(&connect_us, 99),
    })
}

/// The line `mycni-lab tcp-crr` prints.
pub fn format_crr(c: &Crr) -> String {
    format!(
        "tcp-crr {} connections {:.1}/s connect p50 {:.3} us p99 {:.3} us",
        c.connections, c.per_sec, c.connect_p50_us, c.connect_p99_us
    )
}

/// [`format_crr`]'s line back, from a tool's output.
pub fn parse_crr(out: &str) -> Result<Crr> {
    let line = out
        .lines()
        .find(|l| l.starts_with("tcp-crr "))
        .with_context(|| format!("no tcp-crr line in {out:?}"))?;
    let w: Vec<&str> = line.split_whitespace().collect();
    let after = |key: &str| -> Result<&str> {
        let i = w
            .iter()
            .position(|x| *x == key)
            .with_context(|| format!("no {key:?} in {line:?}"))?;
        w.get(i + 1)
            .copied()
            .with_context(|| format!("nothing after {key:?} in {line:?}"))
    };
    Ok(Crr {
        connections: after("tcp-crr")?.parse()?,
        per_sec: after("connections")?.trim_end_matches("/s").parse()?,
        connect_p50_us: after("p50")?.parse()?,
        connect_p99_us: after("p99")?.parse()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crr_lines_parse_back() {
        let c = Crr {
            connections: 3210,
            per_sec: 3210.5,
            connect_p50_us: 61.25,
            connect_p99_us: 140.5,
        };
        assert_eq!(
            parse_crr(&format!("noise\n{}\n", format_crr(&c))).ok(),
            Some(c)
        );
        assert!(parse_crr("tcp-rr one-way p50 1 us").is_err());
        assert!(parse_crr("tcp-crr x connections").is_err());
    }

    #[test]
    fn a_loop_against_a_local_echo_server() {
        let l = crate::pods::echo_listener(0).expect("a listener");
        let port = l.local_addr().expect("its address").port();
        std::thread::spawn(move || crate::pods::echo_on(l));
        let c = tcp_crr(&format!("127.0.0.1:{port}"), 1).expect("the loop runs");
        assert!(c.connections > 0 && c.per_sec > 0.0);
        assert!(c.connect_p50_us <= c.connect_p99_us);
        // Nobody listens on port 1 here.
        assert!(tcp_crr("127.0.0.1:1", 1).is_err());
    }
}
