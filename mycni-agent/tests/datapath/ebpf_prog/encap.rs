//! Datapath v2: encapsulation and decapsulation in tc.

use mycni_common::net::Mac;

use super::*;

/// A raw AF_PACKET socket bound to `ifname` (receives every protocol).
pub(crate) fn packet_socket(ifname: &str, timeout: Duration) -> Result<OwnedFd> {
    let proto = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: plain socket creation; the fd is owned right away.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(proto)) };
    ensure!(
        fd >= 0,
        "AF_PACKET socket: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: fd is a fresh, valid descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: zeroed sockaddr_ll is valid; fields set below.
    let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sa.sll_family = libc::AF_PACKET as u16;
    sa.sll_protocol = proto;
    sa.sll_ifindex = i32::try_from(ifindex(ifname)?)?;
    use std::os::fd::AsRawFd;
    // SAFETY: sa is a valid sockaddr_ll of the size passed.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            &sa as *const libc::sockaddr_ll as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    ensure!(
        rc == 0,
        "bind to {ifname}: {}",
        std::io::Error::last_os_error()
    );
    let tv = libc::timeval {
        tv_sec: timeout.as_secs() as i64,
        tv_usec: 0,
    };
    // SAFETY: tv is a valid timeval of the size passed.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &tv as *const libc::timeval as *const libc::c_void,
            std::mem::size_of::<libc::timeval>() as u32,
        )
    };
    Ok(fd)
}

/// Sends `frame` out of `fd`'s interface as it is.
pub(crate) fn packet_send(fd: &OwnedFd, frame: &[u8]) -> Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: the buffer is valid for its length.
    let n = unsafe { libc::send(fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
    ensure!(
        n == frame.len() as isize,
        "send: {}",
        std::io::Error::last_os_error()
    );
    Ok(())
}

/// The next frame on `fd` that `want` accepts (until the receive timeout).
pub(crate) fn packet_recv(fd: &OwnedFd, want: impl Fn(&[u8]) -> bool) -> Result<Vec<u8>> {
    use std::os::fd::AsRawFd;
    let mut buf = vec![0u8; 65536];
    loop {
        // SAFETY: the buffer is valid for its length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        ensure!(n >= 0, "recv: {}", std::io::Error::last_os_error());
        let f = &buf[..n as usize];
        if want(f) {
            return Ok(f.to_vec());
        }
    }
}

pub(crate) fn is_vxlan(f: &[u8]) -> bool {
    f.len() > INNER
        && f[12..14] == ETH_P_IP.to_be_bytes()
        && f[14 + 9] == IPPROTO_UDP
        && f[O_UDP + 2..O_UDP + 4] == VXLAN_PORT.to_be_bytes()
}

#[test]
fn encap_sends_what_vxlan1_sends() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let node = Node::new("encap")?.with_underlay()?;
    node.run(|dp| {
        dp.configure(&encap_config()?)?;
        let at_r = TcpListener::bind(SocketAddrV4::new(POD_R, SERVER_PORT))?;
        let a_r = tcp_conn(POD_A, SocketAddrV4::new(POD_R, SERVER_PORT), &at_r)?;
        ensure_ct(a_r.flow, &["ESTABLISHED"])?;
        let cap = packet_socket("ul0p", Duration::from_secs(2))?;
        let into_vxlan = packet_socket("vxlan.1", Duration::from_secs(2))?;
        for (what, payload, tos) in [
            ("tcp A->R", &b"GET / HTTP/1.1"[..], 0u8),
            ("tcp A->R, 1400 B", &[0x5a; 1400][..], 0),
            ("tcp A->R, ECT(0)", &b"ecn"[..], 0x02),
            ("tcp A->R, CE, DSCP 46", &b"ce"[..], 0xbb),
        ] {
            let pkt = edit_ip(&from_a(&tcp(a_r.flow, ACK | PSH, payload)), |ip| {
                ip[1] = tos
            });
            let (path, out) = dp.run(POD, &pkt).with_context(|| what.to_string())?;
            ensure!(
                path == DpPath::FastEncap && out.retval == TC_ACT_REDIRECT,
                "{what}: {} with verdict {}",
                path.name(),
                out.retval
            );
            // The same inner frame, as the kernel forwards it into vxlan.1
            // (TTL already one less, VTEP MACs), through the real device.
            let inner = routed(&pkt, TO_PEER);
            packet_send(&into_vxlan, &inner)?;
            let wire = packet_recv(&cap, is_vxlan)?;

            ensure!(
                ip_csum_ok(&out.data),
                "{what}: bad outer checksum {}",
                hex(&out.data)
            );
            ensure!(
                out.data.len() == wire.len(),
                "{what}: {} bytes, vxlan.1 sent {}",
                out.data.len(),
                wire.len()
            );
            ensure!(
                out.data[INNER..] == inner[14..],
                "{what}: inner packet differs"
            );
            // The IP ID is the kernel's own hashed counter (and the
            // checksum follows it): the only bytes allowed to differ.
            let differ: Vec<usize> = (0..wire.len())
                .filter(|&i| out.data[i] != wire[i])
                .filter(|&i| !(O_IP_ID..O_IP_ID + 2).contains(&i))
                .filter(|&i| !(O_IP_CSUM..O_IP_CSUM + 2).contains(&i))
                .collect();
            ensure!(
                differ.is_empty(),
                "{what}: bytes {differ:?} differ\n  tc:      {}\n  vxlan.1: {}",
                hex(&out.data[..INNER]),
                hex(&wire[..INNER])
            );
            eprintln!(
                "ok  {what}: byte for byte as vxlan.1 but the IP ID (source port {})",
                u16::from_be_bytes([wire[O_UDP], wire[O_UDP + 1]])
            );
        }
        Ok(())
    })
}

#[test]
fn encap_falls_back_to_vxlan1_when_unsure() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let node = Node::new("encapfb")?.with_underlay()?;
    node.run(|dp| {
        let cfg = encap_config()?;
        dp.configure(&cfg)?;
        let at_r = TcpListener::bind(SocketAddrV4::new(POD_R, SERVER_PORT))?;
        let a_r = tcp_conn(POD_A, SocketAddrV4::new(POD_R, SERVER_PORT), &at_r)?;
        ensure_ct(a_r.flow, &["ESTABLISHED"])?;
        // 1451 B of IP: 1501 on the underlay, over its 1500 MTU.
        let big = from_a(&tcp(a_r.flow, ACK, &[1; 1451 - 40]));
        dp.fast(
            input("over the underlay MTU", POD, &big),
            DpPath::FastVxlanMtu,
            TO_PEER,
        )?;
        let fits = from_a(&tcp(a_r.flow, ACK, &[1; 1450 - 40]));
        let (path, _) = dp.run(POD, &fits)?;
        ensure!(path == DpPath::FastEncap, "1450 B: {}", path.name());
        dp.configure(&DpConfig { flags: 0, ..cfg })?;
        dp.fast(
            input("encap off", POD, &fits),
            DpPath::FastVxlanNoEncap,
            TO_PEER,
        )?;
        // A route to elsewhere does not count: the lookup, like vxlan.1's
        // own, is made out of the underlay device.
        dp.configure(&cfg)?;
        node_exec(&["route", "add", "192.168.0.2/32", "dev", "lo"])?;
        let (path, _) = dp.run(POD, &fits)?;
        ensure!(path == DpPath::FastEncap, "route via lo: {}", path.name());
        // The peer's host unreachable: not a plain unicast success.
        node_exec(&["route", "replace", "unreachable", "192.168.0.2/32"])?;
        dp.fast(
            input("peer unreachable", POD, &fits),
            DpPath::FastVxlanFib,
            TO_PEER,
        )?;
        Ok(())
    })
}

#[test]
fn encap_remembers_the_next_hop_until_the_kernel_may_have_changed() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let node = Node::new("encapnh")?.with_underlay()?;
    node.run(|dp| {
        // The cache is per CPU: every run on one.
        pin_to_cpu0()?;
        dp.configure(&encap_config()?)?;
        let at_r = TcpListener::bind(SocketAddrV4::new(POD_R, SERVER_PORT))?;
        let a_r = tcp_conn(POD_A, SocketAddrV4::new(POD_R, SERVER_PORT), &at_r)?;
        ensure_ct(a_r.flow, &["ESTABLISHED"])?;
        let pkt = from_a(&tcp(a_r.flow, ACK, b"x"));
        let dmac = |what: &str| -> Result<[u8; 6]> {
            let (path, out) = dp.run(POD, &pkt)?;
            ensure!(path == DpPath::FastEncap, "{what}: {}", path.name());
            Ok(out.data[..6].try_into()?)
        };
        let moved = [0x02, 0x55, 0, 0, 0, 0x99];
        let move_peer = |mac: [u8; 6]| {
            node_exec(&[
                "neigh",
                "replace",
                &UL_PEER.to_string(),
                "lladdr",
                &Mac(mac).to_string(),
                "dev",
                "ul0",
                "nud",
                "permanent",
            ])
        };
        // Generation 0 (no agent): every packet asks the FIB.
        ensure!(dmac("no cache")? == UL_PEER_MAC, "no cache");
        move_peer(moved)?;
        ensure!(dmac("no cache, moved")? == moved, "generation 0 cached");
        move_peer(UL_PEER_MAC)?;

        let generation = mycni_agent::datapath::NexthopGen::open(dp.pin)?;
        generation.bump()?;
        ensure!(dmac("filled")? == UL_PEER_MAC, "filled");
        move_peer(moved)?;
        // Not bumped: the copy answers (what the cache saves is this lookup).
        ensure!(
            dmac("cached")? == UL_PEER_MAC,
            "the second packet asked the FIB"
        );
        // Longer than the route's MTU: the FIB decides, as without a cache.
        let big = from_a(&tcp(a_r.flow, ACK, &[1; 1451 - 40]));
        dp.fast(
            input("over the MTU, cached", POD, &big),
            DpPath::FastVxlanMtu,
            TO_PEER,
        )?;
        // The agent bumps on the neighbour's notification.
        generation.bump()?;
        ensure!(dmac("bumped")? == moved, "a bump left the old next hop");
        // Without a bump (no agent), an entry ages out: 250 jiffies, 2.5 s
        // at the lowest HZ (100).
        move_peer(UL_PEER_MAC)?;
        ensure!(dmac("young")? == moved, "the cache was not used");
        std::thread::sleep(Duration::from_millis(2_600));
        ensure!(dmac("aged")? == UL_PEER_MAC, "an entry outlived its TTL");
        Ok(())
    })
}

/// Keeps the calling thread on CPU 0.
fn pin_to_cpu0() -> Result<()> {
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET writes inside it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: index 0 is within the set.
    unsafe { libc::CPU_SET(0, &mut set) };
    // SAFETY: the set is valid for its size; 0 is this thread.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    ensure!(
        rc == 0,
        "sched_setaffinity: {}",
        std::io::Error::last_os_error()
    );
    Ok(())
}

/// `ip` in the calling thread's namespace.
pub(crate) fn node_exec(args: &[&str]) -> Result<()> {
    let out = std::process::Command::new("ip").args(args).output()?;
    ensure!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

#[test]
fn decap_only_from_peers_for_local_pods() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let node = Node::new("decap")?.with_underlay()?;
    node.run(|dp| {
        dp.configure(&encap_config()?)?;
        let at_a = TcpListener::bind(SocketAddrV4::new(POD_A, SERVER_PORT))?;
        let at_r = TcpListener::bind(SocketAddrV4::new(POD_R, SERVER_PORT))?;
        let a_r = tcp_conn(POD_A, SocketAddrV4::new(POD_R, SERVER_PORT), &at_r)?;
        let b_a = tcp_conn(POD_B, SocketAddrV4::new(POD_A, SERVER_PORT), &at_a)?;
        ensure_ct(a_r.flow, &["ESTABLISHED"])?;
        let ra = from_peer(&tcp(a_r.flow.rev(), ACK, b"200 OK"));
        let ok = wrapped(UL_PEER, &ra, |_| {});

        // Unwrapped and delivered: exactly the inner packet, as a router
        // would hand it to pod A.
        let (path, out) = dp.run(UL, &ok)?;
        ensure!(
            path == DpPath::FastTcDecap && out.retval == TC_ACT_REDIRECT,
            "peer's VXLAN: {} verdict {}",
            path.name(),
            out.retval
        );
        ensure!(
            dp.family() == Some(DpFamily::Ipv4),
            "IPv4 unwrapped counted as {:?}",
            dp.family()
        );
        let want = routed(&ra, TO_A);
        ensure!(
            out.data == want,
            "decap\n  want: {}\n  got:  {}",
            hex(&want),
            hex(&out.data)
        );
        eprintln!("ok  {:<16} {:<48} -> fast_tc_decap", UL.name(), "peer's VXLAN");

        let syn = from_peer(&tcp(a_r.flow.rev(), SYN, b""));
        let new_flow = from_peer(&tcp(
            Flow {
                src: SocketAddrV4::new(POD_R, 1),
                dst: SocketAddrV4::new(POD_A, 2),
            },
            ACK,
            b"",
        ));
        // B -> A rides an established flow, but B is no pod of the peer.
        let spoofed = from_peer(&tcp(b_a.flow, ACK, b""));
        let to_unknown = from_peer(&udp(
            Flow {
                src: SocketAddrV4::new(POD_R, 1),
                dst: SocketAddrV4::new(UNKNOWN, 2),
            },
            b"",
        ));
        let arp = eth([0xff; 6], UL_PEER_MAC, ETH_P_ARP, &[0; 28]);
        #[rustfmt::skip]
        let cases: Vec<KernelCase> = vec![
            ("from a host that is no peer", UL, wrapped(UL_STRANGER, &ra, |_| {}), DpPath::KernelDecapNotPeer),
            ("VNI 2", UL, wrapped(UL_PEER, &ra, |f| f[O_UDP + 14] = 2), DpPath::KernelDecapHeader),
            ("VXLAN flags 0x0c", UL, wrapped(UL_PEER, &ra, |f| f[O_UDP + 8] = 0x0c), DpPath::KernelDecapHeader),
            ("a UDP checksum", UL, wrapped(UL_PEER, &ra, |f| f[O_UDP + 7] = 1), DpPath::KernelDecapHeader),
            ("UDP length lies", UL, wrapped(UL_PEER, &ra, |f| f[O_UDP + 5] ^= 4), DpPath::KernelDecapHeader),
            ("inner MAC not this VTEP's", UL, wrapped(UL_PEER, &ra, |f| f[50] ^= 1), DpPath::KernelDecapHeader),
            ("outer fragment (MF)", UL, wrapped(UL_PEER, &ra, |f| { f[20] = 0x20; fix_outer(f) }), DpPath::KernelDecapFragment),
            ("outer fragment (offset)", UL, wrapped(UL_PEER, &ra, |f| { f[21] = 0x10; fix_outer(f) }), DpPath::KernelDecapFragment),
            ("another UDP port", UL, wrapped(UL_PEER, &ra, |f| f[O_UDP + 3] ^= 1), DpPath::KernelUnderlayOther),
            ("to another host", UL, wrapped(UL_PEER, &ra, |f| { f[33] = 9; fix_outer(f) }), DpPath::KernelUnderlayOther),
            ("ARP", UL, arp, DpPath::KernelUnderlayOther),
            ("inner source not the peer's pod", UL, wrapped(UL_PEER, &spoofed, |_| {}), DpPath::KernelDecapInnerSource),
            ("inner to no local pod", UL, wrapped(UL_PEER, &to_unknown, |_| {}), DpPath::KernelUnknownDest),
            ("inner SYN", UL, wrapped(UL_PEER, &syn, |_| {}), DpPath::KernelTcpControl),
            ("inner flow unknown to conntrack", UL, wrapped(UL_PEER, &new_flow, |_| {}), DpPath::KernelNotEstablished),
            ("inner TTL 1", UL, wrapped(UL_PEER, &with_ttl(&ra, 1), |_| {}), DpPath::KernelTtl),
        ];
        for (what, prog, pkt, want) in cases {
            dp.kernel(what, prog, &pkt, want)?;
        }
        let arp = eth([0xff; 6], UL_PEER_MAC, ETH_P_ARP, &[0; 28]);
        dp.kernel_as(input("ARP", UL, &arp), DpPath::KernelUnderlayOther, DpFamily::Other)?;

        // Decapsulation off: everything stays with vxlan.1.
        dp.configure(&DpConfig {
            flags: CFG_TC_ENCAP,
            ..encap_config()?
        })?;
        dp.kernel("decap off", UL, &ok, DpPath::KernelUnderlayOther)?;
        Ok(())
    })
}
