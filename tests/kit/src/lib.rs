//! Helpers for mycni's privileged tests.
//!
//! Every test that touches the kernel does so inside network namespaces it
//! creates here and that are removed on drop, also when the test fails.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, Result, bail};

pub mod cni;
pub mod testrun;
pub mod turn;

/// Runs a command to completion; a non-zero exit is an error with its stderr.
pub fn sh(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("cannot start {program}"))?;
    check(program, args, out)
}

fn check(program: &str, args: &[&str], out: Output) -> Result<String> {
    if !out.status.success() {
        bail!(
            "`{program} {}` failed ({}): {}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A unique short name: tests run in parallel and interface names are capped at 15 bytes.
pub fn unique(prefix: &str) -> String {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}{}x{}",
        std::process::id() % 100_000,
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// A named network namespace (`ip netns add`), deleted on drop.
pub struct NetNs {
    name: String,
}

impl NetNs {
    /// Creates `mycni-t-<tag>-<unique>` with loopback up.
    pub fn new(tag: &str) -> Result<Self> {
        let name = unique(&format!("mycni-t-{tag}-"));
        sh("ip", &["netns", "add", &name])?;
        let ns = Self { name };
        ns.exec("ip", &["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn path(&self) -> PathBuf {
        Path::new("/run/netns").join(&self.name)
    }

    /// A veth pair: `host_if` here (with ifindex `index`, if given), its
    /// peer `eth0` in `peer`, both down and unaddressed.
    pub fn add_veth(&self, host_if: &str, peer: &NetNs, index: Option<u32>) -> Result<()> {
        let index = index.map(|i| i.to_string());
        let mut args = vec!["link", "add", host_if];
        if let Some(i) = &index {
            args.extend(["index", i.as_str()]);
        }
        args.extend(["type", "veth", "peer", "name", "eth0", "netns", peer.name()]);
        self.exec("ip", &args).map(drop)
    }

    /// Runs a program inside the namespace (`ip netns exec`).
    pub fn exec(&self, program: &str, args: &[&str]) -> Result<String> {
        let mut full = vec!["netns", "exec", self.name.as_str(), program];
        full.extend_from_slice(args);
        sh("ip", &full)
    }

    /// Runs `f` on a fresh OS thread that has entered this namespace, so the
    /// caller's thread (and any async runtime) never changes namespace.
    pub fn run_in<T: Send, F: FnOnce() -> T + Send>(&self, f: F) -> Result<T> {
        in_netns(&self.name, f)
    }
}

/// Runs `f` on a fresh OS thread inside the named namespace. Sockets and
/// threads `f` creates belong to that namespace.
pub fn in_netns<T: Send, F: FnOnce() -> T + Send>(name: &str, f: F) -> Result<T> {
    let path = Path::new("/run/netns").join(name);
    let file = File::open(&path).with_context(|| format!("open {}", path.display()))?;
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setns on this thread only; the fd is valid for the call.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            if rc != 0 {
                bail!("setns {name}: {}", std::io::Error::last_os_error());
            }
            Ok(f())
        })
        .join()
        .map_err(|_| anyhow::anyhow!("thread in {name} panicked"))?
    })
}

impl Drop for NetNs {
    fn drop(&mut self) {
        // Deleting the namespace destroys every interface in it, and a veth's
        // peer with it, so this is the whole cleanup.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// A private bpffs mount in a temporary directory, unmounted on drop, so a
/// test's pinned maps and links never mix with the host's /sys/fs/bpf.
pub struct BpfFs {
    dir: tempfile::TempDir,
}

impl BpfFs {
    pub fn new() -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("mycni-bpffs-").tempdir()?;
        let path = dir.path().to_string_lossy().into_owned();
        sh("mount", &["-t", "bpf", "bpf", &path])?;
        Ok(Self { dir })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for BpfFs {
    fn drop(&mut self) {
        // Unmounting drops the pins; links and maps go once no fd holds them.
        let _ = Command::new("umount").arg(self.dir.path()).output();
    }
}

/// A "node" namespace and a "pod" namespace joined by a veth, the pod end
/// named eth0 with `pod_ip/24`, the node end `host_if` with `node_ip/24`.
pub struct VethPair {
    pub node: NetNs,
    pub pod: NetNs,
    pub host_if: String,
}

impl VethPair {
    pub fn new(node_ip: &str, pod_ip: &str) -> Result<Self> {
        let node = NetNs::new("node")?;
        let pod = NetNs::new("pod")?;
        let host_if = unique("vh");
        node.add_veth(&host_if, &pod, None)?;
        node.exec(
            "ip",
            &["addr", "add", &format!("{node_ip}/24"), "dev", &host_if],
        )?;
        node.exec("ip", &["link", "set", &host_if, "up"])?;
        pod.exec(
            "ip",
            &["addr", "add", &format!("{pod_ip}/24"), "dev", "eth0"],
        )?;
        pod.exec("ip", &["link", "set", "eth0", "up"])?;
        Ok(Self { node, pod, host_if })
    }

    /// Permanent neighbour entries on both ends (the pod's for `node_ip`,
    /// the node's for `pod_ip`), so neither sends ARP: tests that count
    /// packets count only what they send.
    pub fn pin_neighbours(&self, node_ip: &str, pod_ip: &str) -> Result<()> {
        let host_mac = self.node.exec(
            "cat",
            &[&format!("/sys/class/net/{}/address", self.host_if)],
        )?;
        let pod_mac = self.pod.exec("cat", &["/sys/class/net/eth0/address"])?;
        for (ns, ip, mac, dev) in [
            (&self.pod, node_ip, host_mac.trim(), "eth0"),
            (&self.node, pod_ip, pod_mac.trim(), self.host_if.as_str()),
        ] {
            ns.exec(
                "ip",
                &[
                    "neigh",
                    "replace",
                    ip,
                    "lladdr",
                    mac,
                    "dev",
                    dev,
                    "nud",
                    "permanent",
                ],
            )?;
        }
        Ok(())
    }

    /// The ifindex of the node end, inside the node namespace.
    pub fn host_ifindex(&self) -> Result<u32> {
        let out = self.node.exec(
            "cat",
            &[&format!("/sys/class/net/{}/ifindex", self.host_if)],
        )?;
        out.trim().parse().context("parse ifindex")
    }
}

/// The Internet checksum: ones' complement sum over `data`, folded and
/// inverted (RFC 1071), for packets tests make byte by byte.
pub fn csum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}
