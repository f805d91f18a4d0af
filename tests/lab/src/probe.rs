//! What runs inside a pod for the truth tables: `mycni-lab serve` (TCP and
//! UDP echo servers on the pod's container ports) and `mycni-lab probe`
//! (every target of one source at once, a short timeout each, JSON out).

use std::io::{Read, Write};
use std::net::{Ipv6Addr, SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::model::Proto;
use crate::pods::{echo_listener, echo_on};

/// `mycni-lab serve PORT/PROTO...`: an echo server per port, TCP and UDP,
/// forever, over both families (one `[::]` socket takes IPv4 too, as
/// v4-mapped addresses; where IPv6 is off, an IPv4 one).
pub fn serve(ports: &[(u16, Proto)]) -> Result<()> {
    let mut threads = Vec::new();
    for &(port, proto) in ports {
        match proto {
            Proto::Tcp => {
                let l = echo_listener(port).with_context(|| format!("tcp port {port}"))?;
                threads.push(std::thread::spawn(move || echo_on(l)));
            }
            Proto::Udp => {
                let s = UdpSocket::bind((Ipv6Addr::UNSPECIFIED, port))
                    .or_else(|_| UdpSocket::bind(("0.0.0.0", port)))
                    .with_context(|| format!("udp port {port}"))?;
                threads.push(std::thread::spawn(move || {
                    let mut buf = [0u8; 65536];
                    loop {
                        if let Ok((n, from)) = s.recv_from(&mut buf) {
                            let _ = s.send_to(&buf[..n], from);
                        }
                    }
                }));
            }
            // No SCTP sockets on this kernel (CONFIG_IP_SCTP is off): the
            // port is declared on the Pod, nothing listens.
            Proto::Sctp => {}
        }
    }
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}

/// One probe: a connection (TCP: connect, then one byte echoed; UDP: an
/// echo back) to `addr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub id: usize,
    pub addr: SocketAddr,
    pub proto: Proto,
    /// The UDP source port (0: the kernel's choice). A UDP flow's
    /// conntrack entry outlives its socket (30 s, 120 s once answered): a
    /// probe that happened onto an earlier allowed probe's 5-tuple would
    /// ride that entry past a policy written since, and read as a false
    /// allow. The caller gives each probe a port no recent one used.
    pub sport: u16,
}

impl Target {
    pub fn to_json(&self) -> Value {
        json!({"id": self.id, "addr": self.addr.to_string(), "proto": self.proto.lower(),
               "sport": self.sport})
    }

    pub fn from_json(v: &Value) -> Result<Target> {
        Ok(Target {
            id: v["id"].as_u64().context("id")? as usize,
            addr: v["addr"].as_str().context("addr")?.parse()?,
            proto: v["proto"]
                .as_str()
                .and_then(Proto::parse)
                .context("proto")?,
            sport: v["sport"].as_u64().unwrap_or(0) as u16,
        })
    }
}

/// A probe's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub id: usize,
    pub ok: bool,
    pub ms: f64,
}

/// Probes every target at once (a thread each), each within `timeout`.
pub fn probe_all(targets: &[Target], timeout: Duration) -> Vec<Outcome> {
    std::thread::scope(|s| {
        let handles: Vec<_> = targets
            .iter()
            .map(|t| {
                s.spawn(move || {
                    let t0 = Instant::now();
                    let ok = match t.proto {
                        Proto::Tcp => tcp_once(t.addr, timeout).is_ok(),
                        Proto::Udp => udp_once(t.addr, t.sport, timeout).is_ok(),
                        Proto::Sctp => false,
                    };
                    Outcome {
                        id: t.id,
                        ok,
                        ms: t0.elapsed().as_secs_f64() * 1e3,
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .zip(targets)
            .map(|(h, t)| {
                h.join().unwrap_or(Outcome {
                    id: t.id,
                    ok: false,
                    ms: 0.0,
                })
            })
            .collect()
    })
}

fn tcp_once(addr: SocketAddr, timeout: Duration) -> Result<()> {
    let t0 = Instant::now();
    let mut c = TcpStream::connect_timeout(&addr, timeout)?;
    let left = timeout
        .saturating_sub(t0.elapsed())
        .max(Duration::from_millis(1));
    c.set_read_timeout(Some(left))?;
    c.write_all(b"p")?;
    let mut b = [0u8; 1];
    c.read_exact(&mut b)?;
    Ok(())
}

/// A datagram, sent again every 100 ms until an echo comes back or
/// `timeout`: one lost datagram must not read as a denial.
fn udp_once(addr: SocketAddr, sport: u16, timeout: Duration) -> Result<()> {
    let local: SocketAddr = if addr.is_ipv4() {
        "0.0.0.0:0".parse()?
    } else {
        "[::]:0".parse()?
    };
    let s =
        UdpSocket::bind(SocketAddr::new(local.ip(), sport)).or_else(|_| UdpSocket::bind(local))?;
    s.connect(addr)?;
    let t0 = Instant::now();
    let mut buf = [0u8; 16];
    while t0.elapsed() < timeout {
        s.send(b"probe")?;
        let left = timeout.saturating_sub(t0.elapsed());
        s.set_read_timeout(Some(
            left.clamp(Duration::from_millis(1), Duration::from_millis(100)),
        ))?;
        match s.recv(&mut buf) {
            Ok(n) if &buf[..n] == b"probe" => return Ok(()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            // ICMP unreachable: refused, as a closed port is.
            Err(e) => return Err(e.into()),
        }
    }
    bail!("no echo from {addr} in {timeout:?}")
}

/// `mycni-lab probe --timeout-ms N`: targets as a JSON array on stdin,
/// outcomes as a JSON array on stdout.
pub fn probe_command(timeout: Duration) -> Result<()> {
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input)?;
    let v: Value = serde_json::from_str(&input).context("probe: targets JSON")?;
    let targets = v
        .as_array()
        .context("probe: want an array")?
        .iter()
        .map(Target::from_json)
        .collect::<Result<Vec<_>>>()?;
    let out: Vec<Value> = probe_all(&targets, timeout)
        .into_iter()
        .map(|o| json!({"id": o.id, "ok": o.ok, "ms": o.ms}))
        .collect();
    println!("{}", Value::Array(out));
    Ok(())
}

/// Parses `probe`'s output.
pub fn parse_outcomes(s: &str) -> Result<Vec<Outcome>> {
    let v: Value = serde_json::from_str(s.trim()).context("probe output")?;
    v.as_array()
        .context("probe output: want an array")?
        .iter()
        .map(|o| {
            Ok(Outcome {
                id: o["id"].as_u64().context("id")? as usize,
                ok: o["ok"].as_bool().context("ok")?,
                ms: o["ms"].as_f64().unwrap_or(0.0),
            })
        })
        .collect()
}

/// `80/tcp` (the `serve` command's arguments).
pub fn parse_port_proto(s: &str) -> Result<(u16, Proto)> {
    let (port, proto) = s.split_once('/').unwrap_or((s, "tcp"));
    Ok((
        port.parse().with_context(|| format!("port in {s:?}"))?,
        Proto::parse(proto).with_context(|| format!("protocol in {s:?}"))?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn probes_find_servers_and_time_out_on_silence() {
        // Loopback: a TCP and a UDP echo on ephemeral ports.
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let tcp = l.local_addr().expect("addr");
        std::thread::spawn(move || {
            for mut c in l.incoming().flatten() {
                let mut b = [0u8; 1];
                if c.read_exact(&mut b).is_ok() {
                    let _ = c.write_all(&b);
                }
            }
        });
        let u = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let udp = u.local_addr().expect("addr");
        std::thread::spawn(move || {
            let mut b = [0u8; 64];
            while let Ok((n, from)) = u.recv_from(&mut b) {
                let _ = u.send_to(&b[..n], from);
            }
        });
        // A bound UDP socket that never answers: silence, not refusal.
        let silent = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let targets = vec![
            Target {
                id: 1,
                addr: tcp,
                proto: Proto::Tcp,
                sport: 0,
            },
            Target {
                id: 2,
                addr: udp,
                proto: Proto::Udp,
                sport: 0,
            },
            Target {
                id: 3,
                addr: silent.local_addr().expect("addr"),
                proto: Proto::Udp,
                sport: 0,
            },
        ];
        let t0 = Instant::now();
        let out = probe_all(&targets, Duration::from_millis(300));
        assert!(t0.elapsed() < Duration::from_secs(1));
        let oks: Vec<bool> = out.iter().map(|o| o.ok).collect();
        assert_eq!(oks, [true, true, false]);
        let json: Vec<Value> = targets.iter().map(Target::to_json).collect();
        assert_eq!(Target::from_json(&json[1]).ok(), Some(targets[1].clone()));
        assert_eq!(parse_port_proto("81/udp").ok(), Some((81, Proto::Udp)));
        assert_eq!(
            parse_outcomes(r#"[{"id":3,"ok":true,"ms":1.5}]"#)
                .ok()
                .map(|v| v[0].ok),
            Some(true)
        );
    }
}
