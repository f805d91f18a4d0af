//! Pods: the plugin run as the runtime runs it, and what runs in a pod
//! (the echo server, the probes the matrix sends it).

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use mycni_testkit::sh;

use crate::daemon::{ns_exec, spawn_daemon};
use crate::{ECHO_PORT, IpFamily, Lab, Pod, Stack};

/// A pod sandbox as the runtime names it to the plugin: its container id,
/// its network namespace's path and its pod (`<namespace>/<name>`, or a
/// name alone in namespace `lab`).
#[derive(Debug, Clone, Copy)]
pub struct Sandbox<'a> {
    pub cid: &'a str,
    pub netns: &'a str,
    pub pod: &'a str,
}

impl<'a> Sandbox<'a> {
    pub fn new(cid: &'a str, netns: &'a str, pod: &'a str) -> Self {
        Self { cid, netns, pod }
    }
}

impl Lab {
    /// The runtime's part: plugin ADD with the network from the agent's
    /// conflist, for the pod `names` (namespace, name) if it has a
    /// Kubernetes side, else the anonymous `lab/pod<j>`.
    pub(crate) fn add_pod(&self, i: usize, j: usize, names: Option<(&str, &str)>) -> Result<Pod> {
        let s = &self.spec;
        let ns = s.pod_ns(i, j);
        sh("ip", &["netns", "add", &ns])?;
        ns_exec(&ns, "ip", &["link", "set", "lo", "up"])?;
        let result = self.cni(
            i,
            "ADD",
            Sandbox::new(
                &format!("lab-{i}-{j}"),
                &format!("/run/netns/{ns}"),
                &crate::kubelet::cni_pod_arg(names, j),
            ),
        )?;
        let addrs: Vec<IpAddr> = result["ips"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|ip| ip["address"].as_str()?.split('/').next()?.parse().ok())
            .collect();
        let ip = addrs.iter().find_map(|a| match a {
            IpAddr::V4(a) => Some(*a),
            IpAddr::V6(_) => None,
        });
        let ip6 = addrs.iter().find_map(|a| match a {
            IpAddr::V6(a) => Some(*a),
            IpAddr::V4(_) => None,
        });
        // A dual-stack lab whose pod got one family would test half of it
        // and call that green; an IPv6-only lab whose pod got an IPv4
        // address would not be IPv6-only.
        for (f, got) in [(IpFamily::V4, ip.is_some()), (IpFamily::V6, ip6.is_some())] {
            match (s.stack.has(f), got) {
                (true, false) => bail!(
                    "no {f} address in ADD result {result}, though node {i} has an {f} podCIDR"
                ),
                (false, true) if s.stack == Stack::Ipv6Only => bail!(
                    "an {f} address in ADD result {result} in an IPv6-only lab (node {i} has \
                     no {f} podCIDR)"
                ),
                _ => {}
            }
        }
        let pod_dir = s.node_dir(i).join(format!("pod{j}"));
        std::fs::create_dir_all(&pod_dir)?;
        spawn_daemon(
            &ns,
            &s.bins.lab,
            &["echo-server".into(), ECHO_PORT.to_string()],
            &pod_dir.join("echo.log"),
            &pod_dir.join("echo.pid"),
        )?;
        Ok(Pod {
            node: i,
            index: j,
            ns,
            ip: ip.unwrap_or(Ipv4Addr::UNSPECIFIED),
            ip6,
            kube: None,
        })
    }

    /// The config the runtime passes the plugin on node `i`: the conflist's
    /// single plugin config, with its `name` and the version a current
    /// runtime picks (libcni 1.2 and later: the highest of `cniVersion` and
    /// `cniVersions`; the list's own `cniVersion` is 1.0.0 for older
    /// runtimes, which have no STATUS or GC).
    pub fn plugin_conf(&self, i: usize) -> Result<Value> {
        let conflist: Value = serde_json::from_slice(&std::fs::read(
            self.spec.node_dir(i).join("net.d/00-mycni.conflist"),
        )?)?;
        let mut conf = conflist["plugins"][0].clone();
        conf["cniVersion"] = highest_version(&conflist)
            .context("the conflist names no CNI version")?
            .into();
        conf["name"] = conflist["name"].clone();
        Ok(conf)
    }

    /// The plugin on node `i` as the runtime starts it for `sandbox`
    /// (interface `eth0`), stdin, stdout and stderr piped: the caller
    /// writes the config to stdin, and may kill the child.
    pub fn cni_command(&self, i: usize, command: &str, sandbox: Sandbox<'_>) -> Result<Command> {
        let Sandbox { cid, netns, pod } = sandbox;
        let s = &self.spec;
        let bin_dir = s.bins.plugin.parent().context("plugin path")?;
        let (pod_ns, pod_name) = pod.split_once('/').unwrap_or(("lab", pod));
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &s.node_name(i)])
            .arg(&s.bins.plugin)
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", cid)
            .env("CNI_NETNS", netns)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", bin_dir)
            .env(
                "CNI_ARGS",
                format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={pod_ns};K8S_POD_NAME={pod_name}"),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        Ok(cmd)
    }

    /// Runs the plugin on node `i` as the runtime would, with the conflist's
    /// single plugin config.
    pub fn cni(&self, i: usize, command: &str, sandbox: Sandbox<'_>) -> Result<Value> {
        let conf = self.plugin_conf(i)?;
        let mut child = self.cni_command(i, command, sandbox)?.spawn()?;
        if let Some(mut w) = child.stdin.take() {
            w.write_all(conf.to_string().as_bytes())?;
        }
        let out = child.wait_with_output()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!("plugin {command} on node {i} failed: {stdout}");
        }
        Ok(if stdout.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&stdout)?
        })
    }

    pub fn pods(&self) -> Result<Vec<Pod>> {
        let v: Vec<Value> =
            serde_json::from_slice(&std::fs::read(self.spec.pods_file()).context("no lab is up")?)?;
        v.iter().map(crate::kubelet::pod_from_json).collect()
    }

    /// The pods `labels` name (`<namespace>/<name>`, as the model's `x/a`),
    /// in that order.
    pub fn pods_named<const N: usize>(&self, labels: [&str; N]) -> Result<[Pod; N]> {
        let pods = self.pods()?;
        let mut out = Vec::with_capacity(N);
        for label in labels {
            let p = pods
                .iter()
                .find(|p| p.kube.as_ref().is_some_and(|k| k.label() == label))
                .with_context(|| format!("no pod {label} in the lab"))?;
            out.push(p.clone());
        }
        out.try_into()
            .map_err(|_| anyhow::anyhow!("pods_named: {N} labels, another count of pods"))
    }
}

/// `mycni-lab echo-server PORT`: echoes every connection, forever, over
/// both families: an IPv6 socket on `::` takes IPv4 too (as v4-mapped
/// addresses, with the default `bindv6only=0`), so one listener serves a
/// dual-stack pod; where IPv6 is off, an IPv4 one.
pub fn echo_server(port: u16) -> Result<()> {
    echo_on(echo_listener(port)?);
    Ok(())
}

/// The listener [`echo_server`] serves: `[::]:port`, or `0.0.0.0:port`
/// where IPv6 is off.
pub(crate) fn echo_listener(port: u16) -> std::io::Result<TcpListener> {
    TcpListener::bind((Ipv6Addr::UNSPECIFIED, port))
        .or_else(|_| TcpListener::bind(("0.0.0.0", port)))
}

/// Echoes every connection `l` accepts, each on a thread of its own,
/// forever.
pub(crate) fn echo_on(l: TcpListener) {
    for conn in l.incoming() {
        let Ok(mut c) = conn else { continue };
        // One small message in flight at a time (`tcp-rr`): no batching.
        let _ = c.set_nodelay(true);
        std::thread::spawn(move || {
            let mut buf = [0u8; 65536];
            while let Ok(n) = c.read(&mut buf) {
                if n == 0 || c.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        });
    }
}

/// `mycni-lab tcp-probe`'s exit status when the round trip worked but the
/// bulk echo after it did not (an MTU or encapsulation problem, typically).
pub const PROBE_BULK_FAILED: i32 = 3;

/// Why a `tcp-probe` failed.
#[derive(Debug)]
pub enum ProbeError {
    /// No connection, or no round trip through it.
    RoundTrip(anyhow::Error),
    /// The round trip worked, the bulk echo after it did not.
    Bulk(anyhow::Error),
}

/// `mycni-lab tcp-probe IP:PORT [--bulk N]`: one round trip through the
/// echo server, then, with `bulk` > 0, `bulk` bytes echoed over the same
/// (by then established) connection.
pub fn tcp_probe(addr: &str, bulk: usize) -> std::result::Result<(), ProbeError> {
    let round_trip = || -> Result<TcpStream> {
        let addr: SocketAddr = addr.parse()?;
        let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        c.set_read_timeout(Some(Duration::from_secs(2)))?;
        c.write_all(b"mycni\n")?;
        let mut buf = [0u8; 6];
        c.read_exact(&mut buf)?;
        if &buf != b"mycni\n" {
            bail!("echo mismatch");
        }
        Ok(c)
    };
    let c = round_trip().map_err(ProbeError::RoundTrip)?;
    if bulk > 0 {
        echo_bulk(c, bulk).map_err(ProbeError::Bulk)?;
    }
    Ok(())
}

/// `mycni-lab tcp-rr ADDR --seconds N --size B`: TCP request/response
/// against an echo server for `seconds`, one `size`-byte message in flight,
/// as `sockperf ping-pong --tcp` does (the bench's IPv6 latency, which
/// sockperf 3.7 cannot measure). Returns one-way (RTT/2) p50 and p99 in
/// microseconds and the number of round trips.
pub fn tcp_rr(addr: &str, seconds: u64, size: usize) -> Result<(f64, f64, usize)> {
    let addr: SocketAddr = addr.parse()?;
    let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(3))?;
    c.set_nodelay(true)?;
    c.set_read_timeout(Some(Duration::from_secs(2)))?;
    let msg = vec![0x5au8; size.max(1)];
    let mut buf = vec![0u8; msg.len()];
    let mut rtts: Vec<Duration> = Vec::new();
    let end = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < end {
        let t = Instant::now();
        c.write_all(&msg)?;
        c.read_exact(&mut buf).context("tcp-rr: no echo")?;
        rtts.push(t.elapsed());
    }
    if rtts.is_empty() {
        bail!("tcp-rr: no round trip in {seconds} s");
    }
    rtts.sort_unstable();
    let one_way = |q: f64| {
        let k = ((rtts.len() as f64 * q).ceil() as usize).clamp(1, rtts.len()) - 1;
        rtts[k].as_secs_f64() * 1e6 / 2.0
    };
    Ok((one_way(0.50), one_way(0.99), rtts.len()))
}

/// What `mycni-lab tcp-rr` prints.
pub fn format_tcp_rr(p50: f64, p99: f64, n: usize) -> String {
    format!("tcp-rr one-way p50 {p50:.3} us p99 {p99:.3} us over {n} round trips")
}

/// p50 and p99 back from [`format_tcp_rr`]'s line in a tool's output.
pub fn parse_tcp_rr(out: &str) -> Result<(f64, f64)> {
    let line = out
        .lines()
        .find(|l| l.starts_with("tcp-rr one-way"))
        .with_context(|| format!("no tcp-rr line in {out:?}"))?;
    let after = |key: &str| -> Result<f64> {
        let rest = line
            .split_once(key)
            .with_context(|| format!("no {key:?} in {line:?}"))?
            .1;
        Ok(rest.split_whitespace().next().unwrap_or_default().parse()?)
    };
    Ok((after(" p50 ")?, after(" p99 ")?))
}

/// Byte `i` of a bulk echo: a pattern that is not periodic in any power of
/// two, so a reordered or repeated segment shows as a mismatch.
fn bulk_byte(i: usize) -> u8 {
    (i % 251) as u8
}

/// Sends `n` bytes and reads them back at the same time: written first and
/// read after, the echo server's writes would stall once every buffer on
/// the way is full, and both ends would wait on each other.
fn echo_bulk(mut c: TcpStream, n: usize) -> Result<()> {
    let mut w = c.try_clone()?;
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        let mut buf = vec![0u8; 64 * 1024];
        let mut sent = 0;
        while sent < n {
            let k = (n - sent).min(buf.len());
            for (j, b) in buf[..k].iter_mut().enumerate() {
                *b = bulk_byte(sent + j);
            }
            w.write_all(&buf[..k])?;
            sent += k;
        }
        Ok(())
    });
    let mut got = 0;
    let mut buf = vec![0u8; 64 * 1024];
    while got < n {
        let k = c
            .read(&mut buf)
            .with_context(|| format!("bulk echo: read after {got} of {n} bytes"))?;
        if k == 0 {
            bail!("bulk echo: connection closed after {got} of {n} bytes");
        }
        if let Some(j) = (0..k).find(|j| buf[*j] != bulk_byte(got + j)) {
            bail!("bulk echo: byte {} differs", got + j);
        }
        got += k;
    }
    writer
        .join()
        .map_err(|_| anyhow::anyhow!("bulk echo: writer thread panicked"))?
        .context("bulk echo: write")?;
    Ok(())
}

/// `mycni-lab http-get HOST:PORT PATH`: prints status line and body.
pub fn http_get(addr: &str, path: &str) -> Result<String> {
    let addr: SocketAddr = addr.parse()?;
    let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    c.set_read_timeout(Some(Duration::from_secs(2)))?;
    c.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )?;
    let mut s = String::new();
    c.read_to_string(&mut s)?;
    let status = s.lines().next().unwrap_or_default().to_string();
    let body = s.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
    Ok(format!("{status} {body}"))
}

/// The highest of a conflist's `cniVersion` and `cniVersions`, as libcni
/// 1.2+ chooses (versions compare by their numeric parts).
fn highest_version(conflist: &Value) -> Option<String> {
    let parts = |v: &str| -> Vec<u64> { v.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    conflist["cniVersions"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(std::iter::once(&conflist["cniVersion"]))
        .filter_map(Value::as_str)
        .max_by_key(|v| parts(v))
        .map(str::to_string)
}

#[cfg(test)]
mod version_tests {
    use super::*;

    #[test]
    fn tcp_rr_lines_parse_back() {
        let line = format_tcp_rr(12.25, 30.5, 1000);
        assert_eq!(
            parse_tcp_rr(&format!("x\n{line}\n")).ok(),
            Some((12.25, 30.5))
        );
        assert!(parse_tcp_rr("sockperf: nothing").is_err());
    }

    #[test]
    fn picks_the_highest_listed_version() {
        let c =
            serde_json::json!({"cniVersion": "1.0.0", "cniVersions": ["0.3.1", "1.1.0", "0.4.0"]});
        assert_eq!(highest_version(&c).as_deref(), Some("1.1.0"));
        let c = serde_json::json!({"cniVersion": "0.4.0"});
        assert_eq!(highest_version(&c).as_deref(), Some("0.4.0"));
        assert_eq!(highest_version(&serde_json::json!({})), None);
    }
}
