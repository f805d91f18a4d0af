//! One measurement of one path: sockperf's TCP ping-pong, an iperf3 TCP
//! stream and 64-byte UDP, in the path's namespaces.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use mycni_testkit::sh;
use serde_json::Value;

use super::progs::{ProgRun, ProgWindow, Watched, prog_deltas, read_runs};
use super::{IPERF_PORT, Options, SOCKPERF_PORT, UDP_LEN, UDP_OMIT};
use crate::{VXLAN_DEV, check_interrupted};

/// A process started in a namespace; killed and reaped on drop.
pub(super) struct Proc {
    pub(super) child: Child,
    pub(super) what: String,
    pub(super) log: PathBuf,
}

impl Proc {
    pub(super) fn spawn(ns: &str, argv: &[String], log: &Path) -> Result<Proc> {
        let out =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .args(argv)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {} in {ns}", argv.join(" ")))?;
        Ok(Proc {
            child,
            what: format!("{} (in {ns})", argv.join(" ")),
            log: log.to_path_buf(),
        })
    }

    pub(super) fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the process to exit; kills it after `timeout` or on an
    /// interrupt. Returns its output; a non-zero exit is an error.
    pub(super) fn finish(mut self, timeout: Duration) -> Result<String> {
        let start = Instant::now();
        loop {
            // First: Ctrl-C reaches the measuring tools too, and their
            // failure would hide why they failed.
            check_interrupted()?;
            if let Some(status) = self.child.try_wait()? {
                let out = self.output();
                if !status.success() {
                    bail!("`{}` failed ({status}): {}", self.what, tail(&out, 15));
                }
                return Ok(out);
            }
            if start.elapsed() > timeout {
                bail!(
                    "`{}` still running after {timeout:?}: {}",
                    self.what,
                    tail(&self.output(), 15)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(super) fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.running() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

pub(super) fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Starts a server and waits until it listens on TCP `port`.
pub(super) fn server(ns: &str, argv: &[String], port: u16, log: &Path) -> Result<Proc> {
    let mut p = Proc::spawn(ns, argv, log)?;
    let start = Instant::now();
    let filter = format!("sport = :{port}");
    loop {
        let listening = sh("ip", &["netns", "exec", ns, "ss", "-Hltn", &filter])
            .map(|o| !o.trim().is_empty())
            .unwrap_or(false);
        if listening {
            return Ok(p);
        }
        check_interrupted()?;
        if !p.running() {
            bail!("`{}` exited: {}", p.what, tail(&p.output(), 15));
        }
        if start.elapsed() > Duration::from_secs(10) {
            bail!("`{}` does not listen on {port}", p.what);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub(super) fn argv(prefix: &[String], rest: &[&str]) -> Vec<String> {
    prefix
        .iter()
        .cloned()
        .chain(rest.iter().map(|s| s.to_string()))
        .collect()
}

// -------------------------------------------------------------- measurement

/// One run's figures for one variant.
#[derive(Debug, Clone, Default)]
pub(super) struct Sample {
    /// One-way latency (sockperf's RTT/2), microseconds.
    pub(super) p50_us: f64,
    pub(super) p99_us: f64,
    pub(super) stream_gbps: f64,
    /// UDP 64-byte datagrams per second the receiving program got,
    /// thousands (iperf3's own figure).
    pub(super) udp_kpps: f64,
    pub(super) udp_loss_pct: f64,
    /// UDP datagrams per second the path delivered to the receiver's UDP
    /// layer (read or dropped on a full socket), thousands.
    pub(super) udp_delivered_kpps: f64,
    /// UDP datagrams delivered per CPU-second the measure's own tasks
    /// (both iperf3 ends and ksoftirqd) ran, thousands: the per-packet
    /// cost of the path, whatever share of the CPU the tools got.
    pub(super) udp_kpps_per_cpu: f64,
    /// What the mycni programs ran during the same window, when the
    /// measure watched them (the fast columns).
    pub(super) progs: ProgWindow,
}

/// Client namespace -> server namespace and address.
pub(super) struct Pair {
    pub(super) client: String,
    pub(super) server: String,
    pub(super) ip: IpAddr,
}

pub(super) fn sockperf_percentile(out: &str, p: &str) -> Result<f64> {
    let key = format!("percentile {p} =");
    out.lines()
        .find_map(|l| l.split_once(&key).map(|(_, v)| v.trim().parse::<f64>()))
        .with_context(|| format!("no `{key}` in sockperf output: {}", tail(out, 20)))?
        .context("sockperf percentile")
}

pub(super) fn iperf_json(out: &str) -> Result<Value> {
    let v: Value = serde_json::from_str(out)
        .with_context(|| format!("iperf3 -J output is not JSON: {}", tail(out, 10)))?;
    if let Some(e) = v.get("error").and_then(Value::as_str) {
        bail!("iperf3: {e}");
    }
    Ok(v)
}

/// `taskset -c CPU`, or nothing.
pub(super) fn pin_prefix(o: &Options) -> Vec<String> {
    match o.pin_cpu {
        Some(c) => vec!["taskset".into(), "-c".into(), c.to_string()],
        None => vec![],
    }
}

/// One measure of `pair`: latency, stream, small packets, each for
/// `o.seconds`.
///
/// Both ends of every tool run on the one CPU `o.pin_cpu` when it is set.
/// Left to the scheduler on a 2-CPU machine, the two ends of a flow share a
/// CPU in some runs and not in others: the 5-run bench before this pinning
/// had the underlay's UDP rate at 85 or 115 kpps by run, nothing between.
/// Split on two CPUs on purpose, a TCP stream paid a cross-CPU wakeup per
/// batch and fell to half here; on one CPU the UDP rate's spread over five
/// runs went from 50-84 to 50-60 kpps (same machine, same load). On one
/// CPU all of a flow's work (both ends, and the softirq that carries the
/// packet between them) queues on that CPU, which is the per-packet cost a
/// datapath changes.
///
/// `progs`: the programs whose run time the UDP window also reads (none
/// for a column no program sees).
pub(super) fn measure(pair: &Pair, o: &Options, logs: &Path, progs: &[Watched]) -> Result<Sample> {
    let pin = pin_prefix(o);
    let setup = Setup {
        pair,
        seconds: o.seconds,
        pin: &pin,
        logs,
    };
    let mut s = Sample::default();
    (s.p50_us, s.p99_us) = latency(&setup)?;
    s.stream_gbps = stream(&setup)?;
    let udp = small_packets(&setup, progs)?;
    s.udp_kpps = udp.received_kpps;
    s.udp_loss_pct = udp.loss_pct;
    s.udp_delivered_kpps = udp.delivered_kpps;
    s.udp_kpps_per_cpu = udp.kpps_per_cpu;
    s.progs = udp.progs;
    Ok(s)
}

/// A second of ping-pong and of stream on `pair`, figures discarded.
pub(super) fn warm_up(pair: &Pair, o: &Options, logs: &Path) -> Result<()> {
    let pin = pin_prefix(o);
    let setup = Setup {
        pair,
        seconds: 1,
        pin: &pin,
        logs,
    };
    latency(&setup)?;
    stream(&setup)?;
    Ok(())
}

/// What every tool of one measure runs with: the pair, for how long, under
/// which CPU pinning prefix, and where its logs go.
struct Setup<'a> {
    pair: &'a Pair,
    seconds: u64,
    pin: &'a [String],
    logs: &'a Path,
}

/// How long a tool may run past its `seconds` before it counts as hung.
fn limit(seconds: u64) -> Duration {
    Duration::from_secs(seconds + UDP_OMIT + 20)
}

/// TCP ping-pong with 64-byte messages: one-way p50 and p99, microseconds.
/// sockperf for IPv4; for IPv6, `mycni-lab tcp-rr` against `mycni-lab
/// echo-server`, because sockperf 3.7 (Debian 12's) refuses an IPv6
/// address (`'-i' Invalid address: ::1`).
fn latency(setup: &Setup) -> Result<(f64, f64)> {
    let &Setup {
        pair,
        seconds,
        pin,
        logs,
    } = setup;
    check_interrupted()?;
    if pair.ip.is_ipv6() {
        return latency_rr(setup);
    }
    let ip = pair.ip.to_string();
    let secs = seconds.to_string();
    let sp = SOCKPERF_PORT.to_string();
    let srv = server(
        &pair.server,
        &argv(pin, &["sockperf", "sr", "--tcp", "-i", &ip, "-p", &sp]),
        SOCKPERF_PORT,
        &logs.join("sockperf-server.log"),
    )?;
    let out = Proc::spawn(
        &pair.client,
        &argv(
            pin,
            &[
                "sockperf",
                "ping-pong",
                "--tcp",
                "-i",
                &ip,
                "-p",
                &sp,
                "-t",
                &secs,
                "-m",
                "64",
            ],
        ),
        &logs.join("sockperf-client.log"),
    )?
    .finish(limit(seconds))?;
    drop(srv);
    Ok((
        sockperf_percentile(&out, "50.000")?,
        sockperf_percentile(&out, "99.000")?,
    ))
}

/// [`latency`] with the lab's own tools, the same shape as sockperf's:
/// one connection, 64-byte messages, one in flight, TCP_NODELAY, both ends
/// pinned alike, one-way = RTT/2.
fn latency_rr(setup: &Setup) -> Result<(f64, f64)> {
    let &Setup {
        pair,
        seconds,
        pin,
        logs,
    } = setup;
    // The bench runs inside mycni-lab, which is also the tool.
    let lab = std::env::current_exe().context("the path of mycni-lab")?;
    let lab = lab.to_string_lossy();
    let port = SOCKPERF_PORT.to_string();
    let srv = server(
        &pair.server,
        &argv(pin, &[&lab, "echo-server", &port]),
        SOCKPERF_PORT,
        &logs.join("tcp-rr-server.log"),
    )?;
    let target = std::net::SocketAddr::from((pair.ip, SOCKPERF_PORT)).to_string();
    let secs = seconds.to_string();
    let out = Proc::spawn(
        &pair.client,
        &argv(
            pin,
            &[&lab, "tcp-rr", &target, "--seconds", &secs, "--size", "64"],
        ),
        &logs.join("tcp-rr-client.log"),
    )?
    .finish(limit(seconds))?;
    drop(srv);
    crate::parse_tcp_rr(&out)
}

/// An iperf3 server for one test on the setup's pair, then its client with
/// `extra` arguments, running: (server, client), so that a caller can
/// sample the system while it sends.
fn iperf_spawn(setup: &Setup, extra: &[&str], name: &str) -> Result<(Proc, Proc)> {
    let &Setup {
        pair,
        seconds,
        pin,
        logs,
    } = setup;
    check_interrupted()?;
    let ip = pair.ip.to_string();
    let secs = seconds.to_string();
    let port = IPERF_PORT.to_string();
    let srv = server(
        &pair.server,
        &argv(pin, &["iperf3", "-s", "-1", "-p", &port]),
        IPERF_PORT,
        &logs.join(format!("iperf-{name}-server.log")),
    )?;
    let mut a = vec![
        "iperf3",
        "-c",
        &ip,
        "-p",
        &port,
        "-t",
        &secs,
        "-J",
        "--connect-timeout",
        "3000",
    ];
    a.extend_from_slice(extra);
    let client = Proc::spawn(
        &pair.client,
        &argv(pin, &a),
        &logs.join(format!("iperf-{name}-client.log")),
    )?;
    Ok((srv, client))
}

/// One TCP flow: the receiver's rate, Gbit/s.
fn stream(setup: &Setup) -> Result<f64> {
    let (srv, client) = iperf_spawn(setup, &[], "tcp")?;
    let out = client.finish(limit(setup.seconds))?;
    srv.finish(Duration::from_secs(5))?;
    let v = iperf_json(&out)?;
    Ok(v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .context("iperf3 TCP: no end.sum_received.bits_per_second")?
        / 1e9)
}

/// The small-packet figures of one run.
pub(super) struct Udp {
    pub(super) received_kpps: f64,
    pub(super) loss_pct: f64,
    pub(super) delivered_kpps: f64,
    pub(super) kpps_per_cpu: f64,
    pub(super) progs: ProgWindow,
}

/// Small packets: UDP, 64-byte payload, unlimited send rate.
///
/// The receiving program's rate alone (what iperf3 reports) swings by run
/// when both ends share one CPU: how the scheduler splits that CPU between
/// sender and receiver decides how many datagrams the receiver reads before
/// its socket overflows, and the datapath's work for the ones dropped there
/// is done all the same (runs of one build moved by 1.4x with the same CPU
/// time spent). So this also reads, over a window inside the measured
/// seconds, the datagrams that reached the receiver's UDP layer (its
/// netns's InDatagrams + RcvbufErrors) and the CPU time the measure's own
/// tasks ran (scheduler run time of both iperf3 processes and of ksoftirqd,
/// where the packets' softirq work runs when it is not in theirs): their
/// ratio is the path's cost per packet, which does not depend on who else
/// used the CPU.
fn small_packets(setup: &Setup, progs: &[Watched]) -> Result<Udp> {
    let len = UDP_LEN.to_string();
    let omit = UDP_OMIT.to_string();
    let (srv, client) = iperf_spawn(setup, &["-u", "-l", &len, "-b", "0", "-O", &omit], "udp")?;
    let window = udp_window(setup, &client, &srv, progs);
    let out = client.finish(limit(setup.seconds))?;
    srv.finish(Duration::from_secs(5))?;
    let (delivered_kpps, kpps_per_cpu, progs) = window?;
    let v = iperf_json(&out)?;
    let rx = &v["end"]["sum_received"];
    let bytes = rx["bytes"]
        .as_f64()
        .context("iperf3 UDP: no end.sum_received.bytes")?;
    let secs = rx["seconds"]
        .as_f64()
        .filter(|s| *s > 0.0)
        .context("iperf3 UDP: no end.sum_received.seconds")?;
    // From bytes, not iperf3's lost_packets: with --omit, iperf3 also
    // counts the omitted seconds' datagrams as lost.
    let sent = v["end"]["sum_sent"]["bytes"].as_f64().unwrap_or(0.0);
    let loss = if sent > 0.0 {
        (100.0 * (1.0 - bytes / sent)).max(0.0)
    } else {
        0.0
    };
    Ok(Udp {
        received_kpps: bytes / UDP_LEN as f64 / secs / 1e3,
        loss_pct: loss,
        delivered_kpps,
        kpps_per_cpu,
        progs,
    })
}

/// The CPU in a `taskset -c CPU` prefix.
fn pin_cpu(pin: &[String]) -> Option<usize> {
    match pin {
        [t, c, cpu] if t == "taskset" && c == "-c" => cpu.parse().ok(),
        _ => None,
    }
}

/// What the UDP window reads at each end.
struct UdpMark {
    at: Instant,
    /// The server netns's UDP InDatagrams + RcvbufErrors.
    delivered: u64,
    /// Scheduler run time of the measure's tasks, nanoseconds.
    cpu_ns: u64,
    /// The watched programs' bpf_stats, by program id.
    progs: BTreeMap<u32, ProgRun>,
}

/// Delivered kpps, kpps per CPU-second and what the watched programs ran,
/// over a window that starts after the omitted seconds (and the client's
/// start-up) and ends before the client stops sending.
fn udp_window(
    setup: &Setup,
    client: &Proc,
    srv: &Proc,
    progs: &[Watched],
) -> Result<(f64, f64, ProgWindow)> {
    let (seconds, cpu, ipv6) = (setup.seconds, pin_cpu(setup.pin), setup.pair.ip.is_ipv6());
    let start = Instant::now();
    let lead = Duration::from_secs(UDP_OMIT) + Duration::from_millis(300);
    let span = Duration::from_millis((seconds * 1000).saturating_sub(500).max(500));
    let softirqd = ksoftirqd(cpu);
    let pids = [client.child.id(), srv.child.id()];
    let server = srv.child.id();
    sleep_until(start + lead)?;
    // Run-time stats only inside the window: they cost two clock reads per
    // program run, which the latency and stream measures should not pay.
    // The kernel counts this fd as one more user of its stats switch and
    // drops it when the fd closes, however the bench ends; the
    // kernel.bpf_stats_enabled sysctl keeps its own value throughout.
    let _stats = if progs.is_empty() {
        None
    } else {
        Some(
            aya::sys::enable_stats(aya::sys::Stats::RunTime)
                .context("enabling the kernel's BPF run-time stats (BPF_ENABLE_STATS)")?,
        )
    };
    let a = udp_mark(server, &pids, &softirqd, ipv6, progs)?;
    sleep_until(a.at + span)?;
    let b = udp_mark(server, &pids, &softirqd, ipv6, progs)?;
    // The client must still have been sending: a window that ran past its
    // end would count idle time.
    if std::fs::metadata(format!("/proc/{}", client.child.id())).is_err() {
        bail!("the UDP client ended inside the measuring window");
    }
    let packets = b.delivered.saturating_sub(a.delivered) as f64;
    let secs = (b.at - a.at).as_secs_f64();
    let cpu_s = b.cpu_ns.saturating_sub(a.cpu_ns) as f64 / 1e9;
    if packets == 0.0 || cpu_s == 0.0 {
        bail!("no UDP datagram reached the server during the measuring window");
    }
    let window = ProgWindow {
        runs: prog_deltas(progs, &a.progs, &b.progs),
        datagrams: b.delivered.saturating_sub(a.delivered),
    };
    Ok((packets / secs / 1e3, packets / cpu_s / 1e3, window))
}

fn sleep_until(t: Instant) -> Result<()> {
    while Instant::now() < t {
        check_interrupted()?;
        std::thread::sleep((t - Instant::now()).min(Duration::from_millis(50)));
    }
    Ok(())
}

fn udp_mark(
    server: u32,
    pids: &[u32],
    softirqd: &[u32],
    ipv6: bool,
    progs: &[Watched],
) -> Result<UdpMark> {
    // IPv6 datagrams count in the UDP6 MIB (snmp6), never in snmp's Udp.
    let (file, parse): (&str, fn(&str) -> Option<u64>) = if ipv6 {
        ("snmp6", udp6_delivered)
    } else {
        ("snmp", udp_delivered)
    };
    let snmp = std::fs::read_to_string(format!("/proc/{server}/net/{file}"))
        .with_context(|| format!("reading the UDP server's /proc/PID/net/{file}"))?;
    let dev = std::fs::read_to_string(format!("/proc/{server}/net/dev"))
        .context("reading the UDP server's /proc/PID/net/dev")?;
    // A VXLAN datagram the kernel decapsulates counts as an InDatagram of
    // the namespace that holds the VXLAN socket: the overlay column's
    // server is that namespace, and would count every datagram twice.
    let delivered = parse(&snmp)
        .with_context(|| format!("no UDP InDatagrams/RcvbufErrors in {file}"))?
        .saturating_sub(rx_packets(&dev, VXLAN_DEV).unwrap_or(0));
    let mut cpu_ns = 0;
    for pid in pids.iter().chain(softirqd) {
        cpu_ns +=
            run_time_ns(*pid).with_context(|| format!("reading the run time of process {pid}"))?;
    }
    Ok(UdpMark {
        at: Instant::now(),
        delivered,
        cpu_ns,
        progs: read_runs(progs),
    })
}

/// InDatagrams + RcvbufErrors from /proc/net/snmp: the datagrams that made
/// it through the path to a socket, read or not.
pub(super) fn udp_delivered(snmp: &str) -> Option<u64> {
    let mut rows = snmp.lines().filter(|l| l.starts_with("Udp:"));
    let names: Vec<&str> = rows.next()?.split_whitespace().collect();
    let values: Vec<&str> = rows.next()?.split_whitespace().collect();
    let get = |name: &str| -> Option<u64> {
        let i = names.iter().position(|n| *n == name)?;
        values.get(i)?.parse().ok()
    };
    Some(get("InDatagrams")? + get("RcvbufErrors")?)
}

/// Udp6InDatagrams + Udp6RcvbufErrors from /proc/net/snmp6 (one `name
/// value` per line): [`udp_delivered`] for IPv6.
pub(super) fn udp6_delivered(snmp6: &str) -> Option<u64> {
    let get = |name: &str| -> Option<u64> {
        snmp6.lines().find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next()? == name).then(|| w.next()?.parse().ok())?
        })
    };
    Some(get("Udp6InDatagrams")? + get("Udp6RcvbufErrors")?)
}

/// Received packets of `ifname` in /proc/net/dev.
pub(super) fn rx_packets(dev: &str, ifname: &str) -> Option<u64> {
    dev.lines().find_map(|l| {
        let (name, rest) = l.split_once(':')?;
        (name.trim() == ifname).then(|| rest.split_whitespace().nth(1)?.parse().ok())?
    })
}

/// Sum of the scheduler run time (schedstat's first field) of every
/// thread of `pid`.
fn run_time_ns(pid: u32) -> Result<u64> {
    let mut ns = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let stat = std::fs::read_to_string(task?.path().join("schedstat"))?;
        ns += stat
            .split_whitespace()
            .next()
            .and_then(|f| f.parse::<u64>().ok())
            .context("schedstat without a run time")?;
    }
    Ok(ns)
}

/// ksoftirqd of `cpu`, or of every CPU when the tools are not pinned.
fn ksoftirqd(cpu: Option<usize>) -> Vec<u32> {
    let want = cpu.map(|c| format!("ksoftirqd/{c}"));
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            let comm = comm.trim();
            match &want {
                Some(w) => comm == w,
                None => comm.starts_with("ksoftirqd/"),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockperf_percentiles_parse() {
        let out = "sockperf: ---> percentile 99.000 =  413.916\nsockperf: ---> percentile 50.000 =   52.928\n";
        assert_eq!(sockperf_percentile(out, "50.000").expect("p50"), 52.928);
        assert_eq!(sockperf_percentile(out, "99.000").expect("p99"), 413.916);
        assert!(sockperf_percentile(out, "90.000").is_err());
    }

    #[test]
    fn udp_delivered_counts_read_and_overflowed() {
        let snmp = "Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\n\
                    Udp: 100 3 7 5 7 0\n\
                    UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\n\
                    UdpLite: 1 0 0 0 0 0\n";
        assert_eq!(udp_delivered(snmp), Some(107));
        assert_eq!(udp_delivered("Ip: 1 2\nIp: 3 4\n"), None);
        assert_eq!(
            pin_cpu(&["taskset".into(), "-c".into(), "1".into()]),
            Some(1)
        );
        assert_eq!(pin_cpu(&[]), None);
        let dev = "Inter-|   Receive                            |  Transmit\n \
                   face |bytes    packets errs drop fifo frame compressed multicast|bytes\n    \
                   lo:       0       0    0    0    0     0          0         0        0\n\
                   vxlan.1: 6400     100    0    0    0     0          0         0        0\n";
        assert_eq!(rx_packets(dev, "vxlan.1"), Some(100));
        assert_eq!(rx_packets(dev, "eth0"), None);
    }

    #[test]
    fn udp6_delivered_counts_read_and_overflowed() {
        let snmp6 = "Ip6InReceives                   \t5000\n\
                     Udp6InDatagrams                 \t200\n\
                     Udp6NoPorts                     \t1\n\
                     Udp6RcvbufErrors                \t30\n\
                     UdpLite6InDatagrams             \t9\n";
        assert_eq!(udp6_delivered(snmp6), Some(230));
        // IPv4's file has no UDP6 counters, and the reverse.
        assert_eq!(udp6_delivered("Udp: InDatagrams\nUdp: 5\n"), None);
        assert_eq!(udp_delivered(snmp6), None);
    }
}
