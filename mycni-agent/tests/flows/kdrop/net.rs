//! Namespaces set up to make the kernel drop, and packets to send.

use super::*;

pub(crate) fn sysctl(ns: &NetNs, key: &str, value: &str) -> Result<()> {
    ns.exec("sysctl", &["-qw", &format!("{key}={value}")])
        .map(drop)
}

/// One UDP datagram from `src` (an address the pod has) to `dst`.
pub(crate) fn udp(pod: &NetNs, src: SocketAddr, dst: SocketAddr) -> Result<()> {
    udp_n(pod, src, dst, 1)
}

/// `n` datagrams from one socket, back to back.
pub(crate) fn udp_n(pod: &NetNs, src: SocketAddr, dst: SocketAddr, n: usize) -> Result<()> {
    pod.run_in(|| -> Result<()> {
        let s = UdpSocket::bind(src).with_context(|| format!("bind {src}"))?;
        for _ in 0..n {
            s.send_to(b"kdrop", dst)
                .with_context(|| format!("send to {dst}"))?;
        }
        Ok(())
    })?
}

/// Strict reverse-path filtering on the node: its answer to a source
/// address must leave by the interface the packet came in on.
pub(crate) fn rp_filter(node: &NetNs, dev: &str) -> Result<()> {
    sysctl(node, "net.ipv4.conf.all.rp_filter", "1")?;
    sysctl(node, &format!("net.ipv4.conf.{dev}.rp_filter"), "1")
}

/// A veth from `node` into `pod` (named eth0 there), addressed and up.
pub(crate) fn add_pod(
    node: &NetNs,
    pod: &NetNs,
    veth: &str,
    node_ip: &str,
    pod_ip: &str,
) -> Result<()> {
    node.add_veth(veth, pod, None)?;
    setup_pod(node, pod, veth, node_ip, pod_ip)
}

/// Addresses, links up, and permanent neighbours both ways (no ARP).
pub(crate) fn setup_pod(
    node: &NetNs,
    pod: &NetNs,
    veth: &str,
    node_ip: &str,
    pod_ip: &str,
) -> Result<()> {
    node.exec(
        "ip",
        &["addr", "add", &format!("{node_ip}/24"), "dev", veth],
    )?;
    node.exec("ip", &["link", "set", veth, "up"])?;
    pod.exec(
        "ip",
        &["addr", "add", &format!("{pod_ip}/24"), "dev", "eth0"],
    )?;
    pod.exec("ip", &["link", "set", "eth0", "up"])?;
    let host_mac = node.exec("cat", &[&format!("/sys/class/net/{veth}/address")])?;
    pod.exec(
        "ip",
        &[
            "neigh",
            "replace",
            node_ip,
            "lladdr",
            host_mac.trim(),
            "dev",
            "eth0",
            "nud",
            "permanent",
        ],
    )?;
    Ok(())
}

pub(crate) fn ifindex_of(ns: &NetNs, dev: &str) -> Result<u32> {
    ns.exec("cat", &[&format!("/sys/class/net/{dev}/ifindex")])?
        .trim()
        .parse()
        .context("parse ifindex")
}

/// Loads an nftables ruleset into `ns`.
pub(crate) fn nft(ns: &NetNs, ruleset: &str) -> Result<()> {
    let file = tempfile::NamedTempFile::new()?;
    std::fs::write(file.path(), ruleset)?;
    ns.exec("nft", &["-f", &file.path().to_string_lossy()])
        .map(drop)
}

/// One TCP segment with `flags` and no payload, from `src` to `dst`,
/// written whole (IP header included) on a raw socket in `pod`: no TCP
/// stack would send SYN and FIN together.
pub(crate) fn raw_tcp(pod: &NetNs, src: SocketAddrV4, dst: SocketAddrV4, flags: u8) -> Result<()> {
    let mut tcp = [0u8; 20];
    tcp[0..2].copy_from_slice(&src.port().to_be_bytes());
    tcp[2..4].copy_from_slice(&dst.port().to_be_bytes());
    tcp[4..8].copy_from_slice(&0x1234_5678u32.to_be_bytes());
    tcp[12] = 5 << 4;
    tcp[13] = flags;
    tcp[14..16].copy_from_slice(&64240u16.to_be_bytes());
    let mut pseudo = Vec::with_capacity(32);
    pseudo.extend_from_slice(&src.ip().octets());
    pseudo.extend_from_slice(&dst.ip().octets());
    pseudo.extend_from_slice(&[0, PROTO_TCP, 0, 20]);
    pseudo.extend_from_slice(&tcp);
    tcp[16..18].copy_from_slice(&csum(&pseudo).to_be_bytes());
    let mut ip = vec![0x45, 0, 0, 40, 0x12, 0x34, 0x40, 0, 64, PROTO_TCP, 0, 0];
    ip.extend_from_slice(&src.ip().octets());
    ip.extend_from_slice(&dst.ip().octets());
    let c = csum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    ip.extend_from_slice(&tcp);
    pod.run_in(|| -> Result<()> {
        // SAFETY: plain socket(2); the fd is owned right after.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
        ensure!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
        // SAFETY: a fresh fd nobody else owns.
        let _sock = unsafe { OwnedFd::from_raw_fd(fd) };
        let to = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes(dst.ip().octets()),
            },
            sin_zero: [0; 8],
        };
        // SAFETY: `ip` and `to` are valid for the lengths given.
        let n = unsafe {
            libc::sendto(
                fd,
                ip.as_ptr().cast(),
                ip.len(),
                0,
                std::ptr::from_ref(&to).cast(),
                size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        ensure!(
            n == ip.len() as isize,
            "sendto: {}",
            std::io::Error::last_os_error()
        );
        Ok(())
    })?
}

pub(crate) use mycni_testkit::csum;
