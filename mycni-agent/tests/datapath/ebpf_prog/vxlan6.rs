//! Peers over the IPv6 underlay: their IPv6 podCIDRs are in `mycni_remote6`
//! flagged `REMOTE_VXLAN6`, and the fast path hands their traffic to
//! `vxlan6.1` (the peer's `vxlan6.1` MAC as destination, this node's as
//! source), which encapsulates in an IPv6 outer header; what `vxlan6.1`
//! decapsulates goes straight into the pod, counted apart from `vxlan.1`'s.

use super::encap::{packet_recv, packet_send, packet_socket};
use super::ipv6::{
    Flow6, TcpConn6, ensure_ct6, fast6, from_a6, listen6, tcp_conn6, tcp6, with_hop,
};
use super::*;

/// The peer's IPv6 podCIDR, reached over the IPv6 underlay.
fn remote6_over_vxlan6() -> BTreeMap<(Ipv6Addr, u8), RemoteNode> {
    remote6_map()
        .into_keys()
        .map(|k| {
            let peer = RemoteNode {
                vtep_mac: PEER_VTEP6_MAC,
                flags: mycni_common::REMOTE_VXLAN6,
                _pad: 0,
                host_ip: 0,
            };
            (k, peer)
        })
        .collect()
}

/// `base` with `vxlan6.1` (see [`Node::with_underlay6`]) in the config.
fn with_vxlan6(base: DpConfig) -> Result<DpConfig> {
    Ok(DpConfig {
        vxlan6_ifindex: ifindex("vxlan6.1")?,
        vtep6_mac: VTEP6_MAC,
        ..base
    })
}

const TO_PEER6: ([u8; 6], [u8; 6]) = (PEER_VTEP6_MAC, VTEP6_MAC);
/// As `vxlan6.1` decapsulates it: the peer's `vxlan6.1` to this one's.
fn from_peer_vtep6(ip: &[u8]) -> Vec<u8> {
    eth(VTEP6_MAC, PEER_VTEP6_MAC, ETH_P_IPV6, ip)
}

/// A frame from A on `conn` carrying `payload`, whose IPv6 packet is
/// `len` bytes long in all (40 of header, 20 of TCP).
fn a_r_of_len(conn: &TcpConn6, len: usize) -> Vec<u8> {
    from_a6(&tcp6(conn.flow, ACK, &vec![0x5a; len - 60]))
}

#[test]
fn vxlan6_peers_are_handed_to_vxlan6() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let node = Node::new("vxlan6")?.with_underlay()?.with_underlay6()?;
    node.run(|dp| {
        REMOTE6.sync(dp.pin, &remote6_over_vxlan6())?;
        let (at_r, at_b) = (listen6(POD_R6)?, listen6(POD_B6)?);
        let a_r = tcp_conn6(POD_A6, POD_R6, &at_r)?;
        let b_r = tcp_conn6(POD_B6, POD_R6, &at_r)?;
        let a_b = tcp_conn6(POD_A6, POD_B6, &at_b)?;
        for c in [&a_r, &b_r, &a_b] {
            ensure_ct6(c.flow, "ESTABLISHED")?;
        }
        let ar = from_a6(&tcp6(a_r.flow, ACK | PSH, b"GET /"));
        // Whether tc encapsulation is on or off (it has no IPv6 outer
        // header to build), and on a node without vxlan.1 at all.
        for (what, cfg) in [
            ("tc encap off", with_vxlan6(config())?),
            ("tc encap on", with_vxlan6(encap_config()?)?),
            (
                "no vxlan.1",
                DpConfig {
                    vxlan_ifindex: 0,
                    ..with_vxlan6(config())?
                },
            ),
        ] {
            dp.configure(&cfg)?;
            #[rustfmt::skip]
            let cases: Vec<FastCase> = vec![
                ("tcp6 A->R", POD, ar.clone(), DpPath::FastVxlan6, TO_PEER6),
                ("tcp6 B->R", POD, from_b6_of(&b_r), DpPath::FastVxlan6, TO_PEER6),
                ("tcp6 A->R hop limit 2", POD, with_hop(&ar, 2), DpPath::FastVxlan6, TO_PEER6),
                // vxlan6.1's MTU, exactly.
                ("tcp6 A->R, 1430 B", POD, a_r_of_len(&a_r, VXLAN6_MTU as usize), DpPath::FastVxlan6, TO_PEER6),
                // Local pods stay local.
                ("tcp6 A->B", POD, from_a6(&tcp6(a_b.flow, ACK, b"x")), DpPath::FastLocal, TO_B),
            ];
            for (case, prog, pkt, want, macs) in cases {
                fast6(dp, input(&format!("{what}: {case}"), prog, &pkt), want, macs)?;
            }
            let stranger = a_r.flow.with_sport(a_r.flow.src.port() ^ 0x0101);
            #[rustfmt::skip]
            let cases: Vec<KernelCase> = vec![
                // One byte over vxlan6.1's MTU: the kernel says "packet too big".
                ("tcp6 A->R, 1431 B", POD, a_r_of_len(&a_r, VXLAN6_MTU as usize + 1), DpPath::KernelVxlan6Mtu),
                // The same gates as every fast path.
                ("tcp6 A->R hop limit 1", POD, with_hop(&ar, 1), DpPath::KernelTtl),
                ("tcp6 A->R SYN", POD, from_a6(&tcp6(a_r.flow, SYN, b"")), DpPath::KernelTcpControl),
                ("tcp6 A->R FIN", POD, from_a6(&tcp6(a_r.flow, FIN | ACK, b"")), DpPath::KernelTcpControl),
                ("tcp6 A->R, no ct", POD, from_a6(&tcp6(stranger, ACK, b"")), DpPath::KernelNotEstablished),
            ];
            for (case, prog, pkt, want) in cases {
                dp.kernel(&format!("{what}: {case}"), prog, &pkt, want)?;
            }
            // A pod may only send as itself: B's flow from A's veth.
            dp.kernel_on(input(&format!("{what}: tcp6 as B from A's veth"), POD, &from_b6_of(&b_r)), 101, DpPath::KernelSourceNotPod)?;
        }

        // A flagged entry ahead of a config without vxlan6.1: the kernel's.
        dp.configure(&config())?;
        dp.kernel(
            "tcp6 A->R, no vxlan6.1 configured",
            POD,
            &ar,
            DpPath::KernelUnknownDest,
        )?;
        // A vxlan.1 peer on a node without vxlan.1 (a map the kernel cannot
        // back): not into ifindex 0.
        REMOTE6.sync(dp.pin, &remote6_map())?;
        dp.configure(&DpConfig {
            vxlan_ifindex: 0,
            ..with_vxlan6(config())?
        })?;
        dp.kernel(
            "tcp6 A->R, vxlan.1 peer, no vxlan.1",
            POD,
            &ar,
            DpPath::KernelUnknownDest,
        )?;

        // The program is family-blind: an IPv4 podCIDR flagged so (the
        // agent flags none: IPv4 pods never cross an IPv6 underlay) goes
        // the same way, TTL and checksum as a router leaves them.
        let v4: BTreeMap<(Ipv4Addr, u8), RemoteNode> = remote_map()
            .into_keys()
            .zip(remote6_over_vxlan6().into_values())
            .collect();
        REMOTE.sync(dp.pin, &v4)?;
        dp.configure(&with_vxlan6(config())?)?;
        let at_r4 = TcpListener::bind(SocketAddrV4::new(POD_R, SERVER_PORT))?;
        let a_r4 = tcp_conn(POD_A, SocketAddrV4::new(POD_R, SERVER_PORT), &at_r4)?;
        ensure_ct(a_r4.flow, &["ESTABLISHED"])?;
        dp.fast(input("tcp A->R, IPv4 over vxlan6.1", POD, &from_a(&tcp(a_r4.flow, ACK, b"v4"))), DpPath::FastVxlan6, TO_PEER6)?;
        Ok(())
    })
}

/// A frame from B on `conn`.
fn from_b6_of(conn: &TcpConn6) -> Vec<u8> {
    super::ipv6::from_b6(&tcp6(conn.flow, ACK, b"from B"))
}

/// What the program hands `vxlan6.1` is what the kernel's own forwarding
/// would: the device finds the peer in its FDB by the frame's destination
/// MAC and sends it to the peer's IPv6 host address, the frame unchanged
/// inside, with the UDP checksum IPv6 requires.
#[test]
fn vxlan6_sends_what_the_program_hands_it_to_the_peer() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let node = Node::new("vxlan6tx")?.with_underlay6()?;
    node.run(|dp| {
        dp.configure(&with_vxlan6(config())?)?;
        REMOTE6.sync(dp.pin, &remote6_over_vxlan6())?;
        let at_r = listen6(POD_R6)?;
        let a_r = tcp_conn6(POD_A6, POD_R6, &at_r)?;
        ensure_ct6(a_r.flow, "ESTABLISHED")?;
        let pkt = from_a6(&tcp6(a_r.flow, ACK | PSH, b"over the IPv6 underlay"));
        let (path, out) = dp.run(POD, &pkt)?;
        ensure!(
            path == DpPath::FastVxlan6 && out.retval == TC_ACT_REDIRECT,
            "{} with verdict {}",
            path.name(),
            out.retval
        );
        let cap = packet_socket("ul6p", Duration::from_secs(2))?;
        let into_vxlan6 = packet_socket("vxlan6.1", Duration::from_secs(2))?;
        packet_send(&into_vxlan6, &out.data)?;
        // Outer Ethernet + IPv6 (40) + UDP (8) + VXLAN (8), then the frame.
        const O_UDP6: usize = 14 + 40;
        const INNER6: usize = O_UDP6 + 16;
        let wire = packet_recv(&cap, |f| {
            f.len() > INNER6
                && f[12..14] == ETH_P_IPV6.to_be_bytes()
                && f[14 + 6] == IPPROTO_UDP
                && f[O_UDP6 + 2..O_UDP6 + 4] == VXLAN_PORT.to_be_bytes()
        })
        .context("nothing left vxlan6.1 for the peer")?;
        let ip6 = |off: usize| {
            let mut a = [0u8; 16];
            a.copy_from_slice(&wire[off..off + 16]);
            Ipv6Addr::from(a)
        };
        ensure!(
            wire[..6] == UL_PEER_MAC && ip6(14 + 8) == UL6_HOST && ip6(14 + 24) == UL6_PEER,
            "not to the peer's IPv6 host address: {}",
            hex(&wire[..INNER6])
        );
        ensure!(
            wire[O_UDP6 + 6..O_UDP6 + 8] != [0, 0],
            "no UDP checksum over IPv6"
        );
        ensure!(
            wire[O_UDP6 + 8] == 0x08 && wire[O_UDP6 + 12..O_UDP6 + 15] == [0, 0, 1],
            "VXLAN header {}",
            hex(&wire[O_UDP6 + 8..INNER6])
        );
        ensure!(
            wire[INNER6..] == out.data[..],
            "inner frame differs\n  want: {}\n  got:  {}",
            hex(&out.data),
            hex(&wire[INNER6..])
        );
        eprintln!(
            "ok  vxlan6.1 sent the program's frame to {UL6_PEER} ({} bytes on the wire, {} inside)",
            wire.len(),
            out.data.len()
        );
        Ok(())
    })
}

#[test]
fn vxlan6_decapsulated_goes_to_the_pod_counted_apart() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let node = Node::new("vxlan6rx")?.with_underlay6()?;
    node.run(|dp| {
        let cfg = with_vxlan6(config())?;
        dp.configure(&cfg)?;
        REMOTE6.sync(dp.pin, &remote6_over_vxlan6())?;
        let at_r = listen6(POD_R6)?;
        let a_r = tcp_conn6(POD_A6, POD_R6, &at_r)?;
        ensure_ct6(a_r.flow, "ESTABLISHED")?;
        let ra = from_peer_vtep6(&tcp6(a_r.flow.rev(), ACK, b"200 OK"));
        let stranger: Flow6 = a_r.flow.rev().with_sport(1);

        // Arrived on vxlan6.1 (the program tells the devices apart by it).
        dp.iif.set(Some(cfg.vxlan6_ifindex));
        let r = (|| -> Result<()> {
            fast6(dp, input("vxlan6: tcp6 R->A", VX, &ra), DpPath::FastVxlan6Decap, TO_A)?;
            #[rustfmt::skip]
            let cases: Vec<KernelCase> = vec![
                ("vxlan6: tcp6 R->A hop limit 1", VX, with_hop(&ra, 1), DpPath::KernelTtl),
                ("vxlan6: tcp6 R->A, no ct", VX, from_peer_vtep6(&tcp6(stranger, ACK, b"")), DpPath::KernelNotEstablished),
                ("vxlan6: tcp6 R->A SYN", VX, from_peer_vtep6(&tcp6(a_r.flow.rev(), SYN, b"")), DpPath::KernelTcpControl),
                // Only to pods here: nothing goes back out.
                ("vxlan6: tcp6 A->R", VX, from_peer_vtep6(&tcp6(a_r.flow, ACK, b"")), DpPath::KernelUnknownDest),
            ];
            for (what, prog, pkt, want) in cases {
                dp.kernel(what, prog, &pkt, want)?;
            }
            // The same device unnamed in the config: vxlan.1's path.
            dp.configure(&config())?;
            fast6(dp, input("vxlan6.1 not configured", VX, &ra), DpPath::FastDecap, TO_A)?;
            dp.configure(&cfg)
        })();
        dp.iif.set(None);
        r?;
        // Arrived on vxlan.1: counted as ever.
        dp.iif.set(Some(VXLAN_IFINDEX));
        let r = fast6(dp, input("vxlan: tcp6 R->A", VX, &ra), DpPath::FastDecap, TO_A);
        dp.iif.set(None);
        r
    })
}
