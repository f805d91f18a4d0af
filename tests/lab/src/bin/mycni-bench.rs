//! `mycni-bench plugin`: ADD and DEL latency of the mycni plugin (built-in
//! IPAM, and host-local delegation) against the reference ptp + host-local,
//! interleaved run by run so machine noise hits all alike. Run through
//! `cargo xtask bench plugin`.
//!
//! `mycni-bench agent`: the node agent's convergence with N peer Nodes (time
//! from the initial list to all routes, neighbours and FDB entries
//! programmed, per-event latency, peak RSS) against `ip -batch` programming
//! the same entries. Run through `cargo xtask bench agent`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use mycni_testkit::NetNs;
use mycni_testkit::cni::REFERENCE_PLUGINS;
use serde_json::{Value, json};

struct Variant {
    label: &'static str,
    bin: PathBuf,
    conf: Value,
    add: Vec<Duration>,
    del: Vec<Duration>,
}

fn invoke(
    bin: &Path,
    cmd: &str,
    cid: &str,
    netns: &str,
    conf: &Value,
    cni_path: &str,
) -> Result<Duration> {
    let stdin = conf.to_string();
    let start = Instant::now();
    let mut child = Command::new(bin)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", cmd)
        .env("CNI_CONTAINERID", cid)
        .env("CNI_NETNS", netns)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", cni_path)
        .env(
            "CNI_ARGS",
            format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME={cid}"),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("spawn {}", bin.display()))?;
    if let Some(mut s) = child.stdin.take() {
        s.write_all(stdin.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    let took = start.elapsed();
    ensure!(
        out.status.success(),
        "{} {cmd}: {}{}",
        bin.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(took)
}

fn median(v: &mut [Duration]) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e3
}

fn p90(v: &mut [Duration]) -> f64 {
    v.sort();
    v[(v.len() * 9) / 10].as_secs_f64() * 1e3
}

fn plugin_bench(runs: usize, mycni: &Path) -> Result<()> {
    let node = NetNs::new("bench")?;
    let dir = tempfile::Builder::new().prefix("mycni-bench-").tempdir()?;
    // This process is the "runtime": it lives in the node namespace, so the
    // plugins' host side is the node and nothing touches the real host.
    let f = std::fs::File::open(node.path())?;
    // SAFETY: single-threaded at this point; setns on the main thread is intended.
    if unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&f), libc::CLONE_NEWNET) } != 0 {
        bail!("setns: {}", std::io::Error::last_os_error());
    }
    let d = dir.path();
    let log = d.join("plugin.log");
    let mut variants = [
        Variant {
            label: "mycni + built-in IPAM",
            bin: mycni.to_path_buf(),
            conf: json!({"cniVersion": "1.0.0", "name": "benchA", "type": "mycni", "logFile": log,
                "ipam": {"type": "mycni-ipam", "subnet": "10.201.0.0/16", "dataDir": d.join("a")}}),
            add: vec![],
            del: vec![],
        },
        Variant {
            label: "mycni + host-local",
            bin: mycni.to_path_buf(),
            conf: json!({"cniVersion": "1.0.0", "name": "benchB", "type": "mycni", "logFile": log,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.202.0.0/16"}]], "dataDir": d.join("b")}}),
            add: vec![],
            del: vec![],
        },
        Variant {
            label: "ptp + host-local (reference)",
            bin: Path::new(REFERENCE_PLUGINS).join("ptp"),
            conf: json!({"cniVersion": "1.0.0", "name": "benchC", "type": "ptp", "mtu": 1450,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.203.0.0/16"}]], "dataDir": d.join("c")}}),
            add: vec![],
            del: vec![],
        },
    ];
    // Warm caches (page cache of the binaries) before measuring.
    for i in 0..runs + 3 {
        for v in variants.iter_mut() {
            let pod = NetNs::new("bp")?;
            let p = pod.path().to_string_lossy().into_owned();
            let cid = format!("bench{i}");
            let add = invoke(&v.bin, "ADD", &cid, &p, &v.conf, REFERENCE_PLUGINS)?;
            let del = invoke(&v.bin, "DEL", &cid, &p, &v.conf, REFERENCE_PLUGINS)?;
            if i >= 3 {
                v.add.push(add);
                v.del.push(del);
            }
        }
    }
    println!("CNI plugin ADD/DEL, {runs} interleaved runs each, sequential, 2-core machine");
    println!("| variant | ADD median ms | ADD p90 ms | DEL median ms | DEL p90 ms |");
    println!("|---|---|---|---|---|");
    let mut med = Vec::new();
    for v in variants.iter_mut() {
        let (am, ap, dm, dp) = (
            median(&mut v.add),
            p90(&mut v.add),
            median(&mut v.del),
            p90(&mut v.del),
        );
        println!("| {} | {am:.2} | {ap:.2} | {dm:.2} | {dp:.2} |", v.label);
        med.push((am, dm));
    }
    let (ptp_add, ptp_del) = med[2];
    println!();
    println!("ratios against ptp + host-local (higher = mycni faster):");
    for (i, v) in variants.iter().enumerate().take(2) {
        println!(
            "  {}: ADD {:.1}x, DEL {:.1}x",
            v.label,
            ptp_add / med[i].0,
            ptp_del / med[i].1
        );
    }
    Ok(())
}

const USAGE: &str = "usage: mycni-bench plugin <mycni binary> [runs] | mycni-bench agent <bin dir> [nodes] [--full-nodes]";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("plugin") => {
            let mycni = PathBuf::from(args.get(2).context(USAGE)?);
            let runs = args.get(3).map(|r| r.parse()).transpose()?.unwrap_or(200);
            plugin_bench(runs, &mycni)
        }
        Some("agent") => {
            let dir = PathBuf::from(args.get(2).context(USAGE)?);
            let nodes = args.get(3).map(|r| r.parse()).transpose()?.unwrap_or(5000);
            let full = match args.get(4).map(String::as_str) {
                None => false,
                Some("--full-nodes") => true,
                Some(_) => bail!("{USAGE}"),
            };
            agent::bench(&dir, nodes, full)
        }
        _ => bail!("{USAGE}"),
    }
}

/// Just enough rtnetlink to poll the overlay cheaply from inside the node
/// namespace: filtered dumps that only count, and single-entry gets.
mod nl {
    use std::io;
    use std::net::Ipv4Addr;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    const RTM_GETROUTE: u16 = 26;
    const RTM_GETNEIGH: u16 = 30;
    const NLMSG_ERROR: u16 = 2;
    const NLMSG_DONE: u16 = 3;
    const NLM_F_REQUEST: u16 = 0x1;
    const NLM_F_DUMP_INTR: u16 = 0x10;
    const NLM_F_DUMP: u16 = 0x300;
    const NDA_DST: u16 = 1;
    const NDA_LLADDR: u16 = 2;
    const NDA_IFINDEX: u16 = 8;
    const NUD_PERMANENT: u16 = 0x80;
    const NTF_SELF: u8 = 0x02;
    const AF_INET: u8 = libc::AF_INET as u8;
    const AF_BRIDGE: u8 = libc::AF_BRIDGE as u8;
    /// The kernel filters dumps by the request's header and attributes.
    const NETLINK_GET_STRICT_CHK: libc::c_int = 12;

    pub struct Sock {
        fd: OwnedFd,
        seq: u32,
        buf: Vec<u8>,
    }

    fn attrs(mut b: &[u8], mut f: impl FnMut(u16, &[u8])) {
        while b.len() >= 4 {
            let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
            let ty = u16::from_ne_bytes([b[2], b[3]]) & 0x3fff;
            if len < 4 || len > b.len() {
                return;
            }
            f(ty, &b[4..len]);
            b = &b[((len + 3) & !3).min(b.len())..];
        }
    }

    fn push_attr(m: &mut Vec<u8>, ty: u16, data: &[u8]) {
        m.extend_from_slice(&((4 + data.len()) as u16).to_ne_bytes());
        m.extend_from_slice(&ty.to_ne_bytes());
        m.extend_from_slice(data);
        while !m.len().is_multiple_of(4) {
            m.push(0);
        }
    }

    /// `struct ndmsg`.
    fn ndmsg(family: u8, ifindex: u32, flags: u8) -> Vec<u8> {
        let mut m = vec![0u8; 12];
        m[0] = family;
        m[4..8].copy_from_slice(&ifindex.to_ne_bytes());
        m[10] = flags;
        m
    }

    fn lladdr(payload: &[u8]) -> Option<[u8; 6]> {
        let mut mac = None;
        attrs(payload.get(12..)?, |ty, d| {
            if ty == NDA_LLADDR && d.len() == 6 {
                let mut m = [0u8; 6];
                m.copy_from_slice(d);
                mac = Some(m);
            }
        });
        mac
    }

    impl Sock {
        /// A NETLINK_ROUTE socket in the calling thread's namespace.
        pub fn open() -> io::Result<Sock> {
            // SAFETY: plain socket(2); the fd is owned right after.
            let fd = unsafe {
                libc::socket(
                    libc::AF_NETLINK,
                    libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                    libc::NETLINK_ROUTE,
                )
            };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: fd is a fresh descriptor nobody else owns.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            let one: libc::c_int = 1;
            // SAFETY: setsockopt with a valid int option value.
            let rc = unsafe {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_NETLINK,
                    NETLINK_GET_STRICT_CHK,
                    (&one as *const libc::c_int).cast(),
                    size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: all-zero sockaddr_nl is valid; family set below.
            let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
            sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
            // SAFETY: bind with a properly sized sockaddr_nl.
            let rc = unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    (&sa as *const libc::sockaddr_nl).cast(),
                    size_of::<libc::sockaddr_nl>() as libc::socklen_t,
                )
            };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(Sock {
                fd,
                seq: 0,
                buf: vec![0; 1 << 20],
            })
        }

        /// Sends one request and calls `f(payload)` for every message of the
        /// reply. Returns whether a dump was interrupted by a concurrent
        /// change (its result may be inconsistent); a kernel error is an Err.
        fn call(
            &mut self,
            ty: u16,
            flags: u16,
            body: &[u8],
            mut f: impl FnMut(&[u8]),
        ) -> io::Result<bool> {
            self.seq = self.seq.wrapping_add(1);
            let seq = self.seq;
            let mut m = Vec::with_capacity(16 + body.len());
            m.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
            m.extend_from_slice(&ty.to_ne_bytes());
            m.extend_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
            m.extend_from_slice(&seq.to_ne_bytes());
            m.extend_from_slice(&0u32.to_ne_bytes());
            m.extend_from_slice(body);
            // SAFETY: send(2) of an initialised buffer on our socket.
            let n = unsafe { libc::send(self.fd.as_raw_fd(), m.as_ptr().cast(), m.len(), 0) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
            let mut intr = false;
            loop {
                // SAFETY: recv(2) into our own buffer of that length.
                let n = unsafe {
                    libc::recv(
                        self.fd.as_raw_fd(),
                        self.buf.as_mut_ptr().cast(),
                        self.buf.len(),
                        0,
                    )
                };
                if n < 0 {
                    let e = io::Error::last_os_error();
                    if e.kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    return Err(e);
                }
                let b = &self.buf[..n as usize];
                let mut off = 0;
                while off + 16 <= b.len() {
                    let len =
                        u32::from_ne_bytes(b[off..off + 4].try_into().unwrap_or_default()) as usize;
                    let mty = u16::from_ne_bytes([b[off + 4], b[off + 5]]);
                    let mflags = u16::from_ne_bytes([b[off + 6], b[off + 7]]);
                    let mseq =
                        u32::from_ne_bytes(b[off + 8..off + 12].try_into().unwrap_or_default());
                    if len < 16 || off + len > b.len() {
                        break;
                    }
                    let payload = &b[off + 16..off + len];
                    off += (len + 3) & !3;
                    if mseq != seq {
                        continue;
                    }
                    intr |= mflags & NLM_F_DUMP_INTR != 0;
                    match mty {
                        NLMSG_DONE => return Ok(intr),
                        NLMSG_ERROR => {
                            let code = payload
                                .get(..4)
                                .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
                                .unwrap_or(-libc::EIO);
                            return if code == 0 {
                                Ok(intr)
                            } else {
                                Err(io::Error::from_raw_os_error(-code))
                            };
                        }
                        _ => {
                            f(payload);
                            if !dump {
                                return Ok(intr);
                            }
                        }
                    }
                }
            }
        }

        /// IPv4 routes with protocol `proto` (all tables); None when the
        /// dump was interrupted by a concurrent change.
        pub fn count_routes(&mut self, proto: u8) -> io::Result<Option<usize>> {
            let mut rtm = vec![0u8; 12];
            rtm[0] = AF_INET;
            rtm[5] = proto;
            let mut n = 0;
            let intr = self.call(RTM_GETROUTE, NLM_F_DUMP, &rtm, |p| {
                if p.get(5) == Some(&proto) {
                    n += 1;
                }
            })?;
            Ok((!intr).then_some(n))
        }

        /// Permanent IPv4 neighbours on `ifindex`.
        pub fn count_neighbours(&mut self, ifindex: u32) -> io::Result<Option<usize>> {
            let mut m = ndmsg(AF_INET, 0, 0);
            push_attr(&mut m, NDA_IFINDEX, &ifindex.to_ne_bytes());
            let mut n = 0;
            let intr = self.call(RTM_GETNEIGH, NLM_F_DUMP, &m, |p| {
                if p.len() >= 12
                    && u32::from_ne_bytes([p[4], p[5], p[6], p[7]]) == ifindex
                    && u16::from_ne_bytes([p[8], p[9]]) & NUD_PERMANENT != 0
                {
                    n += 1;
                }
            })?;
            Ok((!intr).then_some(n))
        }

        /// Permanent `self` FDB entries on `ifindex`, the all-zeros one excluded.
        pub fn count_fdb(&mut self, ifindex: u32) -> io::Result<Option<usize>> {
            let m = ndmsg(AF_BRIDGE, ifindex, 0);
            let mut n = 0;
            let intr = self.call(RTM_GETNEIGH, NLM_F_DUMP, &m, |p| {
                if p.len() >= 12
                    && u32::from_ne_bytes([p[4], p[5], p[6], p[7]]) == ifindex
                    && u16::from_ne_bytes([p[8], p[9]]) & NUD_PERMANENT != 0
                    && p[10] & NTF_SELF != 0
                    && lladdr(p).is_some_and(|m| m != [0; 6])
                {
                    n += 1;
                }
            })?;
            Ok((!intr).then_some(n))
        }

        /// The MAC of the neighbour `ip` on `ifindex`, if there is one.
        pub fn neighbour(&mut self, ifindex: u32, ip: Ipv4Addr) -> io::Result<Option<[u8; 6]>> {
            let mut m = ndmsg(AF_INET, ifindex, 0);
            push_attr(&mut m, NDA_DST, &ip.octets());
            let mut mac = None;
            match self.call(RTM_GETNEIGH, 0, &m, |p| mac = lladdr(p)) {
                Ok(_) => Ok(mac),
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
                Err(e) => Err(e),
            }
        }

        /// Whether the `self` FDB entry for `mac` exists on `ifindex`.
        pub fn has_fdb(&mut self, ifindex: u32, mac: [u8; 6]) -> io::Result<bool> {
            let mut m = ndmsg(AF_BRIDGE, ifindex, NTF_SELF);
            push_attr(&mut m, NDA_LLADDR, &mac);
            match self.call(RTM_GETNEIGH, 0, &m, |_| {}) {
                Ok(_) => Ok(true),
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
                Err(e) => Err(e),
            }
        }
    }
}

/// `mycni-bench agent`.
mod agent {
    use std::collections::BTreeMap;
    use std::net::Ipv4Addr;
    use std::path::{Path, PathBuf};
    use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

    use anyhow::{Context, Result, bail, ensure};
    use k8s_openapi::api::core::v1::Node;
    use mycni_apiserver::node;
    use mycni_lab::{Bins, Lab, Spec};
    use mycni_testkit::{in_netns, sh, unique};
    use serde_json::{Value, json};

    use crate::nl::Sock;

    /// The agent's route protocol (`RTPROT_MYCNI_AGENT`).
    const PROTO: u8 = 110;
    const VXLAN: &str = "vxlan.1";
    const POLL: Duration = Duration::from_millis(20);
    const UPDATES: usize = 20;
    /// The brief's targets for 5,000 nodes.
    const TARGET_CONVERGE_S: f64 = 1.0;
    const TARGET_RSS_MB: f64 = 50.0;

    /// Peer `i` (0-based): podCIDR outside 10.244.0.0/16 (the lab's own
    /// nodes), unique locally administered MAC, an unused host IP.
    struct Peer {
        name: String,
        cidr: String,
        gw: Ipv4Addr,
        mac: [u8; 6],
        host_ip: Ipv4Addr,
    }

    fn peer(i: usize) -> Peer {
        let gw = Ipv4Addr::new(10, 1 + (i / 256) as u8, (i % 256) as u8, 0);
        let k = i + 1;
        Peer {
            name: format!("peer-{:05}", i + 1),
            cidr: format!("{gw}/24"),
            gw,
            mac: [0x02, 0, 0, (k >> 16) as u8, (k >> 8) as u8, k as u8],
            host_ip: Ipv4Addr::new(192, 168, 100 + (i / 250) as u8, 1 + (i % 250) as u8),
        }
    }

    fn fmt_mac(m: &[u8; 6]) -> String {
        m.iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":")
    }

    fn peer_node(p: &Peer, full: bool) -> Result<Node> {
        let mut n = node(&p.name, Some(&p.cidr));
        n.metadata.annotations = Some(BTreeMap::from([
            ("mycni.dev/vtep-mac".to_string(), fmt_mac(&p.mac)),
            ("mycni.dev/host-ip".to_string(), p.host_ip.to_string()),
        ]));
        if full {
            kubelet_fields(&mut n, p)?;
        }
        Ok(n)
    }

    /// What a kubelet-managed Node carries besides mycni's fields (about
    /// 10 KB of JSON): labels, status with 25 images, conditions and
    /// nodeInfo, and managedFields, so the agent's memory is measured
    /// against Nodes as a real cluster has them.
    fn kubelet_fields(n: &mut Node, p: &Peer) -> Result<()> {
        let name = &p.name;
        n.metadata.labels = Some(serde_json::from_value(json!({
            "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
            "node.kubernetes.io/instance-type": "m5.xlarge",
            "topology.kubernetes.io/region": "eu-west-1", "topology.kubernetes.io/zone": "eu-west-1a",
        }))?);
        let ann = n.metadata.annotations.get_or_insert_default();
        ann.insert("node.alpha.kubernetes.io/ttl".into(), "0".into());
        ann.insert(
            "volumes.kubernetes.io/controller-managed-attach-detach".into(),
            "true".into(),
        );
        let images: Vec<Value> = (0..25)
            .map(|j| {
                json!({"names": [
                    format!("registry.k8s.io/project/image-{j}@sha256:{:064x}", j * 7919 + 1),
                    format!("registry.k8s.io/project/image-{j}:v1.{j}.0"),
                ], "sizeBytes": 12_345_678 + j})
            })
            .collect();
        let cond = |t: &str, st: &str, r: &str, m: &str| {
            json!({"type": t, "status": st, "reason": r, "message": m,
                "lastHeartbeatTime": "2026-08-01T10:00:00Z",
                "lastTransitionTime": "2026-08-01T10:00:00Z"})
        };
        n.status = Some(serde_json::from_value(json!({
            "capacity": {"cpu": "4", "ephemeral-storage": "81106868Ki", "hugepages-2Mi": "0",
                "memory": "16069436Ki", "pods": "110"},
            "allocatable": {"cpu": "4", "ephemeral-storage": "74748089130", "hugepages-2Mi": "0",
                "memory": "15967036Ki", "pods": "110"},
            "conditions": [
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                cond("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
                cond("NetworkUnavailable", "False", "MycniIsUp", "mycni-agent has the overlay up on this node"),
            ],
            "addresses": [{"type": "InternalIP", "address": p.host_ip.to_string()},
                {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": "ec2a3b4c5d6e7f8091a2b3c4d5e6f708",
                "systemUUID": "ec2a3b4c-5d6e-7f80-91a2-b3c4d5e6f708",
                "bootID": "4f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b",
                "kernelVersion": "6.1.0-18-cloud-amd64", "osImage": "Debian GNU/Linux 12 (bookworm)",
                "containerRuntimeVersion": "containerd://1.7.13", "kubeletVersion": "v1.33.1",
                "kubeProxyVersion": "v1.33.1", "operatingSystem": "linux", "architecture": "amd64"},
            "images": images,
        }))?);
        let fields = json!({
            "f:metadata": {"f:annotations": {".": {}, "f:node.alpha.kubernetes.io/ttl": {},
                "f:volumes.kubernetes.io/controller-managed-attach-detach": {}},
                "f:labels": {".": {}, "f:beta.kubernetes.io/arch": {}, "f:beta.kubernetes.io/os": {},
                    "f:kubernetes.io/arch": {}, "f:kubernetes.io/hostname": {}, "f:kubernetes.io/os": {}}},
            "f:status": {"f:conditions": {
                "k:{\"type\":\"DiskPressure\"}": {"f:lastHeartbeatTime": {}},
                "k:{\"type\":\"MemoryPressure\"}": {"f:lastHeartbeatTime": {}},
                "k:{\"type\":\"PIDPressure\"}": {"f:lastHeartbeatTime": {}},
                "k:{\"type\":\"Ready\"}": {"f:lastHeartbeatTime": {}, "f:message": {},
                    "f:reason": {}, "f:status": {}}},
                "f:images": {}, "f:nodeInfo": {"f:bootID": {}}},
        });
        let managed: Vec<Value> = [
            "kubelet",
            "kube-controller-manager",
            "mycni-agent",
            "kubectl",
        ]
        .iter()
        .map(|m| {
            json!({"manager": m, "operation": "Update", "apiVersion": "v1",
                    "time": "2026-08-01T10:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": fields})
        })
        .collect();
        n.metadata.managed_fields = Some(serde_json::from_value(Value::Array(managed))?);
        Ok(())
    }

    /// Tears the lab down however the bench ends.
    struct Guard(Lab);

    impl Drop for Guard {
        fn drop(&mut self) {
            self.0.down();
        }
    }

    fn ifindex(ns: &str, name: &str) -> Result<u32> {
        let c = std::ffi::CString::new(name)?;
        // SAFETY: if_nametoindex on a NUL-terminated name.
        let i = in_netns(ns, || unsafe { libc::if_nametoindex(c.as_ptr()) })?;
        ensure!(i != 0, "no {name} in {ns}");
        Ok(i)
    }

    /// `(routes, neighbours, fdb)` of the overlay; None if a dump raced.
    fn counts(s: &mut Sock, vx: u32) -> Result<Option<(usize, usize, usize)>> {
        let r = s.count_routes(PROTO)?;
        let n = s.count_neighbours(vx)?;
        let f = s.count_fdb(vx)?;
        Ok(match (r, n, f) {
            (Some(r), Some(n), Some(f)) => Some((r, n, f)),
            _ => None,
        })
    }

    fn proc_status(pid: u32, key: &str) -> Result<f64> {
        let s = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let line = s
            .lines()
            .find(|l| l.starts_with(key))
            .with_context(|| format!("no {key} in /proc/{pid}/status"))?;
        let kb: f64 = line
            .split_whitespace()
            .nth(1)
            .context("status value")?
            .parse()?;
        Ok(kb / 1024.0)
    }

    /// User and system CPU seconds of `pid` so far.
    fn cpu(pid: u32) -> Result<(f64, f64)> {
        let s = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        let rest = s.rsplit_once(')').context("stat")?.1;
        let f: Vec<&str> = rest.split_whitespace().collect();
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        // After ")": state is field 3, utime 14 and stime 15 (1-based).
        let ut: f64 = f.get(11).context("utime")?.parse()?;
        let st: f64 = f.get(12).context("stime")?.parse()?;
        Ok((ut / hz, st / hz))
    }

    fn strip_ansi(s: &str) -> String {
        let mut out = String::with_capacity(s.len());
        let mut it = s.chars().peekable();
        while let Some(c) = it.next() {
            if c == '\u{1b}' {
                if it.peek() == Some(&'[') {
                    it.next();
                    for d in it.by_ref() {
                        if d.is_ascii_alphabetic() {
                            break;
                        }
                    }
                }
                continue;
            }
            out.push(c);
        }
        out
    }

    /// One line of the agent's log: its timestamp and text.
    struct LogLine {
        at: SystemTime,
        text: String,
    }

    fn agent_log(path: &Path) -> Result<Vec<LogLine>> {
        let raw = std::fs::read_to_string(path)?;
        let mut out = Vec::new();
        for l in raw.lines() {
            let l = strip_ansi(l);
            let Some((ts, _)) = l.split_once(' ') else {
                continue;
            };
            let Ok(t) = ts.parse::<k8s_openapi::jiff::Timestamp>() else {
                continue;
            };
            let at = UNIX_EPOCH + Duration::from_nanos(t.as_nanosecond() as u64);
            out.push(LogLine {
                at,
                text: l.to_string(),
            });
        }
        Ok(out)
    }

    fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
        let pat = format!("{name}=");
        let start = line.find(&pat)? + pat.len();
        line[start..].split_whitespace().next()
    }

    fn secs_between(a: SystemTime, b: SystemTime) -> f64 {
        match b.duration_since(a) {
            Ok(d) => d.as_secs_f64(),
            Err(e) => -e.duration().as_secs_f64(),
        }
    }

    fn ms(d: Duration) -> f64 {
        d.as_secs_f64() * 1e3
    }

    fn percentile(v: &[Duration], p: usize) -> Duration {
        let mut s = v.to_vec();
        s.sort();
        s[((s.len() * p) / 100).min(s.len() - 1)]
    }

    /// `ip -batch` / `bridge -batch` programming the same 3N entries into
    /// a fresh namespace with a VXLAN device like the agent's.
    fn ip_batch_reference(n: usize) -> Result<Duration> {
        let ns = mycni_testkit::NetNs::new("ref")?;
        let dir = tempfile::Builder::new()
            .prefix("mycni-bench-ref-")
            .tempdir()?;
        // No dummy module here: a veth pair stands in for the underlay.
        ns.exec(
            "ip",
            &[
                "link", "add", "eth0", "type", "veth", "peer", "name", "eth1",
            ],
        )?;
        ns.exec("ip", &["link", "set", "eth1", "up"])?;
        ns.exec("ip", &["addr", "add", "192.168.77.11/24", "dev", "eth0"])?;
        ns.exec("ip", &["link", "set", "eth0", "up"])?;
        ns.exec(
            "ip",
            &[
                "link",
                "add",
                VXLAN,
                "type",
                "vxlan",
                "id",
                "1",
                "dstport",
                "8472",
                "local",
                "192.168.77.11",
                "dev",
                "eth0",
                "nolearning",
            ],
        )?;
        ns.exec("ip", &["addr", "add", "10.244.1.0/32", "dev", VXLAN])?;
        ns.exec("ip", &["link", "set", VXLAN, "up"])?;
        let (mut fdb, mut neigh, mut route) = (String::new(), String::new(), String::new());
        for i in 0..n {
            let p = peer(i);
            let mac = fmt_mac(&p.mac);
            fdb.push_str(&format!(
                "fdb add {mac} dev {VXLAN} dst {} self permanent\n",
                p.host_ip
            ));
            neigh.push_str(&format!(
                "neigh add {} lladdr {mac} dev {VXLAN} nud permanent\n",
                p.gw
            ));
            route.push_str(&format!(
                "route add {} via {} dev {VXLAN} onlink proto {PROTO}\n",
                p.cidr, p.gw
            ));
        }
        let files: Vec<PathBuf> = ["fdb", "neigh", "route"]
            .iter()
            .map(|f| dir.path().join(f))
            .collect();
        std::fs::write(&files[0], fdb)?;
        std::fs::write(&files[1], neigh)?;
        std::fs::write(&files[2], route)?;
        let s = |p: &PathBuf| p.to_string_lossy().into_owned();
        let start = Instant::now();
        sh("bridge", &["-n", ns.name(), "-batch", &s(&files[0])])?;
        sh("ip", &["-n", ns.name(), "-batch", &s(&files[1])])?;
        sh("ip", &["-n", ns.name(), "-batch", &s(&files[2])])?;
        let took = start.elapsed();
        let vx = ifindex(ns.name(), VXLAN)?;
        let mut sock = in_netns(ns.name(), Sock::open)??;
        let c = counts(&mut sock, vx)?;
        ensure!(
            c == Some((n, n, n)),
            "ip -batch reference programmed {c:?} entries, not {n} each"
        );
        Ok(took)
    }

    pub fn bench(bin_dir: &Path, n: usize, full: bool) -> Result<()> {
        ensure!(
            (1..=38_000).contains(&n),
            "nodes must be 1..=38000 (podCIDRs stay below 10.244.0.0/16, host IPs in 192.168.100-251)"
        );
        let bins = Bins {
            agent: bin_dir.join("mycni-agent"),
            plugin: bin_dir.join("mycni"),
            apiserver: bin_dir.join("mycni-apiserver"),
            lab: bin_dir.join("mycni-lab"),
        };
        for b in [&bins.agent, &bins.apiserver, &bins.lab] {
            ensure!(b.exists(), "{} is not built", b.display());
        }

        eprintln!(
            "mycni-bench: ip -batch reference, 3 runs of {} entries",
            3 * n
        );
        let mut refs = Vec::new();
        for _ in 0..3 {
            refs.push(ip_batch_reference(n)?);
        }
        let prefix = unique("mycni-bench");
        let root = std::env::temp_dir().join(&prefix);
        eprintln!("mycni-bench: 1-node lab {prefix} under {}", root.display());
        let lab = Guard(Lab::up(Spec {
            prefix,
            nodes: 1,
            pods: 0,
            root,
            bins,
            agent_args: vec!["--cluster-cidr".into(), "10.0.0.0/8".into()],
            in_process_api: true,
        })?);
        let r = run(&lab.0, n, full, &refs);
        if r.is_err() {
            let log = lab.0.spec.node_dir(1).join("agent.log");
            if let Ok(s) = std::fs::read_to_string(&log) {
                let tail: Vec<&str> = s.lines().rev().take(15).collect();
                eprintln!(
                    "agent log tail:\n{}",
                    strip_ansi(&tail.into_iter().rev().collect::<Vec<_>>().join("\n"))
                );
            }
        }
        r
    }

    fn run(lab: &Lab, n: usize, full: bool, refs: &[Duration]) -> Result<()> {
        let reference = percentile(refs, 50);
        let api = lab.api.as_ref().context("in-process API fixture")?;
        let ns = lab.spec.node_name(1);
        let dir = lab.spec.node_dir(1);
        lab.stop_agent(1);

        let t = Instant::now();
        let peers: Vec<Peer> = (0..n).map(peer).collect();
        for p in &peers {
            api.create_node(peer_node(p, full)?)?;
        }
        eprintln!(
            "mycni-bench: created {n} peer Nodes in {:.2} s",
            t.elapsed().as_secs_f64()
        );

        let vx = ifindex(&ns, VXLAN)?;
        let mut sock = in_netns(&ns, Sock::open)??;
        ensure!(
            counts(&mut sock, vx)? == Some((0, 0, 0)),
            "the overlay is not empty before the agent starts"
        );

        // (a) Convergence from a cold start with N peers.
        let started_wall = SystemTime::now();
        let started = Instant::now();
        lab.start_agent(1)?;
        let pid: u32 = std::fs::read_to_string(dir.join("agent.pid"))?
            .trim()
            .parse()?;
        let mut polls = 0u32;
        let (converged_wall, converged) = loop {
            if started.elapsed() > Duration::from_secs(300) {
                bail!("not converged within 300 s: {:?}", counts(&mut sock, vx)?);
            }
            polls += 1;
            // Routes are the agent's last phase: count them alone until complete.
            if sock.count_routes(PROTO)? == Some(n) && counts(&mut sock, vx)? == Some((n, n, n)) {
                break (SystemTime::now(), started.elapsed());
            }
            std::thread::sleep(POLL);
        };
        let (cpu_user, cpu_sys) = cpu(pid)?;
        let hwm_converged = proc_status(pid, "VmHWM:")?;
        let rss_converged = proc_status(pid, "VmRSS:")?;

        // The agent's own view: when the list completed, and its passes.
        let mut lines = Vec::new();
        for _ in 0..100 {
            lines = agent_log(&dir.join("agent.log"))?;
            if lines.iter().any(|l| l.text.contains("reconciled overlay")) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let listed = lines
            .iter()
            .find(|l| l.text.contains("initial Node list complete"))
            .context("no \"initial Node list complete\" line in the agent log")?;
        let listed_nodes = field(&listed.text, "nodes").unwrap_or("?").to_string();
        let list_to_programmed = secs_between(listed.at, converged_wall);
        let passes: Vec<&LogLine> = lines
            .iter()
            .filter(|l| l.text.contains("reconciled overlay"))
            .collect();

        // Idle cost at N peers: resync passes (full dumps) every 2 s.
        std::thread::sleep(Duration::from_secs(2));
        let m0 = metrics(lab)?;
        let c0 = cpu(pid)?;
        let idle = Duration::from_secs(10);
        std::thread::sleep(idle);
        let m1 = metrics(lab)?;
        let c1 = cpu(pid)?;
        let runs = m1.get("mycni_reconcile_runs_total").copied().unwrap_or(0.0)
            - m0.get("mycni_reconcile_runs_total").copied().unwrap_or(0.0);
        let pass_secs = m1
            .get("mycni_reconcile_duration_seconds_sum")
            .copied()
            .unwrap_or(0.0)
            - m0.get("mycni_reconcile_duration_seconds_sum")
                .copied()
                .unwrap_or(0.0);
        let idle_cpu = (c1.0 + c1.1 - c0.0 - c0.1) / idle.as_secs_f64();

        // (b) One Node update at a time: a new VTEP MAC, until the
        // neighbour carries it.
        let mut macs: Vec<[u8; 6]> = peers.iter().map(|p| p.mac).collect();
        let mut updates = Vec::new();
        for u in 0..UPDATES {
            let k = (u * 997 + 13) % n;
            let new = [
                0x02,
                0x01,
                u as u8,
                (k >> 16) as u8,
                (k >> 8) as u8,
                k as u8,
            ];
            let t = Instant::now();
            api.update_node(&peers[k].name, |node| {
                node.metadata
                    .annotations
                    .get_or_insert_default()
                    .insert("mycni.dev/vtep-mac".into(), fmt_mac(&new));
            })?;
            loop {
                if sock.neighbour(vx, peers[k].gw)? == Some(new) {
                    break;
                }
                if t.elapsed() > Duration::from_secs(30) {
                    bail!("update of {} not applied within 30 s", peers[k].name);
                }
                std::thread::sleep(Duration::from_micros(500));
            }
            updates.push(t.elapsed());
            macs[k] = new;
            // Let the pass finish (old FDB entry out, new in) before the next.
            let t2 = Instant::now();
            while sock.has_fdb(vx, peers[k].mac)? || !sock.has_fdb(vx, new)? {
                ensure!(
                    t2.elapsed() < Duration::from_secs(30),
                    "FDB of {} not updated",
                    peers[k].name
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(250));
        }

        // One Node delete: until its neighbour and FDB entry are gone
        // (the route goes first, in the same pass).
        let k = n / 2;
        let t = Instant::now();
        api.delete_node(&peers[k].name)?;
        loop {
            if sock.neighbour(vx, peers[k].gw)?.is_none() && !sock.has_fdb(vx, macs[k])? {
                break;
            }
            ensure!(
                t.elapsed() < Duration::from_secs(30),
                "delete of {} not applied within 30 s",
                peers[k].name
            );
            std::thread::sleep(Duration::from_micros(500));
        }
        let delete = t.elapsed();
        std::thread::sleep(Duration::from_millis(200));
        let after = counts(&mut sock, vx)?;
        ensure!(
            after == Some((n - 1, n - 1, n - 1)),
            "after the delete the overlay holds {after:?}"
        );
        let hwm_end = proc_status(pid, "VmHWM:")?;
        let rss_end = proc_status(pid, "VmRSS:")?;

        // Keep the log for a closer look.
        let kept = std::env::temp_dir().join(format!("mycni-bench-agent-{n}.log"));
        let _ = std::fs::copy(dir.join("agent.log"), &kept);

        let upd_med = percentile(&updates, 50);
        let upd_p90 = percentile(&updates, 90);
        let rss_peak = hwm_converged.max(hwm_end);
        let scale = n as f64 / 5000.0;
        let conv_target = TARGET_CONVERGE_S * scale;

        println!();
        let node_bytes = serde_json::to_vec(&api.get_node(&peers[0].name))?.len();
        println!(
            "mycni-agent convergence, {n} peer Nodes ({}, {node_bytes} B of JSON each), 1-node lab, in-process API fixture, {} CPUs",
            if full {
                "kubelet-like: status, labels, managedFields"
            } else {
                "minimal: podCIDR and mycni annotations"
            },
            std::thread::available_parallelism().map_or(0, |p| p.get())
        );
        println!("| measure | mycni-agent | target | agent/target | ip -batch | agent/ip -batch |");
        println!("|---|---|---|---|---|---|");
        println!("| nodes | {n} | | | | |");
        println!(
            "| list-complete -> programmed (s) | {list_to_programmed:.3} | {conv_target:.2} | {:.2} | {:.3} | {:.2} |",
            list_to_programmed / conv_target,
            reference.as_secs_f64(),
            list_to_programmed / reference.as_secs_f64()
        );
        println!(
            "| start -> programmed (s) | {:.3} | | | {:.3} | {:.2} |",
            converged.as_secs_f64(),
            reference.as_secs_f64(),
            converged.as_secs_f64() / reference.as_secs_f64()
        );
        println!(
            "| update latency median / p90 (ms, {UPDATES} runs) | {:.1} / {:.1} | | | | |",
            ms(upd_med),
            ms(upd_p90)
        );
        println!("| delete latency (ms) | {:.1} | | | | |", ms(delete));
        println!(
            "| peak RSS, VmHWM (MB) | {rss_peak:.1} | {TARGET_RSS_MB:.0} | {:.2} | | |",
            rss_peak / TARGET_RSS_MB
        );
        println!();
        println!("details:");
        println!(
            "  convergence polled every {} ms ({polls} polls); the agent logged its list complete with nodes={listed_nodes}, {:.3} s after start",
            POLL.as_millis(),
            secs_between(started_wall, listed.at)
        );
        for p in passes.iter().take(8) {
            let text = p.text.split("reconciled overlay").nth(1).unwrap_or("");
            println!(
                "  pass logged at list+{:.3} s:{text}",
                secs_between(listed.at, p.at)
            );
        }
        println!(
            "  agent CPU until converged: {cpu_user:.2} s user + {cpu_sys:.2} s system (wall {:.2} s)",
            converged.as_secs_f64()
        );
        println!(
            "  RSS: VmHWM {hwm_converged:.1} MB / VmRSS {rss_converged:.1} MB at convergence; VmHWM {hwm_end:.1} MB / VmRSS {rss_end:.1} MB after updates and delete"
        );
        println!(
            "  idle at {n} peers: {runs:.0} reconcile passes in {} s, {:.1} ms each on average, agent CPU {:.1} %",
            idle.as_secs(),
            if runs > 0.0 {
                pass_secs * 1e3 / runs
            } else {
                0.0
            },
            idle_cpu * 100.0
        );
        let mut sorted = updates.clone();
        sorted.sort();
        println!(
            "  update latencies (ms): {}",
            sorted
                .iter()
                .map(|d| format!("{:.1}", ms(*d)))
                .collect::<Vec<_>>()
                .join(" ")
        );
        println!("  ip -batch reference runs (s): {}", refs_fmt(refs));
        println!("  agent log kept at {}", kept.display());
        Ok(())
    }

    fn refs_fmt(v: &[Duration]) -> String {
        v.iter()
            .map(|d| format!("{:.3}", d.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The agent's metrics as name -> value (unlabelled series only).
    fn metrics(lab: &Lab) -> Result<BTreeMap<String, f64>> {
        let text = lab.metrics(1)?;
        Ok(text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.contains('{'))
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                Some((k.to_string(), v.trim().parse().ok()?))
            })
            .collect())
    }
}
