//! The netlink layer against the real kernel, in network namespaces that
//! exist only for the test.
//!
//! A namespace here is made by a helper thread that unshares one and opens
//! it (`/proc/thread-self/ns/net`); the kernel removes it once that file is
//! closed and nothing lives in it any more, so a failing or killed test
//! leaves nothing behind, and nothing here ever touches the namespace the
//! tests run in. Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN).

mod common;
use common::{ip, netns, v4};

use std::fs::File;
use std::net::Ipv6Addr;

use mycni_common::net::{Cidr, Mac};
use mycni_common::netlink::{FdbEntry, Neighbour, Netlink, Route, VxlanConfig, VxlanInfo};

const PROTO_A: u8 = 0x6d;
const PROTO_B: u8 = 0x6e;

/// Runs a command inside `ns` (a child inherits the namespaces of the
/// thread that starts it), for what the layer itself does not do.
fn sh_in(ns: &File, program: &str, args: &[&str]) {
    let out = std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setns(2) moves only this short-lived thread.
            assert_eq!(
                unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(ns), libc::CLONE_NEWNET) },
                0
            );
            std::process::Command::new(program)
                .args(args)
                .output()
                .expect("spawning")
        })
        .join()
        .expect("setns thread")
    });
    assert!(out.status.success(), "{program} {args:?}: {out:?}");
}

fn run<T>(f: impl AsyncFnOnce() -> T) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .expect("runtime")
        .block_on(f())
}

#[test]
fn links_and_a_veth_into_another_namespace() {
    let (node, pod) = (netns(), netns());
    run(async || {
        let nl = Netlink::in_netns(&node).expect("netlink in node");
        let lo = nl.link_by_name("lo").await.unwrap().expect("lo");
        assert!(!lo.up, "a new namespace's loopback starts down");
        nl.set_up(lo.index).await.unwrap();
        let lo = nl.link_by_index(lo.index).await.unwrap().expect("lo");
        assert!(lo.up);
        assert_eq!(lo.name, "lo");
        assert!(nl.link_by_name("nosuch0").await.unwrap().is_none());
        assert!(nl.link_by_index(999_999).await.unwrap().is_none());

        let host = nl.create_veth_in("h0", "p0", &pod, 1400).await.unwrap();
        assert_eq!((host.name.as_str(), host.mtu), ("h0", 1400));
        assert!(!host.up && host.alias.is_none(), "{host:?}");
        assert!(host.ethernet_mac().is_some_and(Mac::is_unicast));
        assert!(host.vxlan.is_none());
        let again = nl.create_veth_in("h0", "p1", &pod, 1400).await;
        assert!(again.as_ref().is_err_and(|e| e.is_exists()), "{again:?}");

        nl.set_alias_and_up(host.index, "mycni:test").await.unwrap();
        let host = nl.link_by_name("h0").await.unwrap().expect("h0");
        assert!(host.up);
        assert_eq!(host.alias.as_deref(), Some("mycni:test"));
        let names: Vec<String> = nl
            .links()
            .await
            .unwrap()
            .into_iter()
            .map(|l| l.name)
            .collect();
        assert_eq!(names, ["lo", "h0"]);

        // The peer is in the pod namespace only, and each end names the other.
        let in_pod = Netlink::in_netns(&pod).expect("netlink in pod");
        let peer = in_pod.link_by_name("p0").await.unwrap().expect("p0");
        assert_eq!(peer.mtu, 1400);
        assert_eq!(peer.peer_index, Some(host.index));
        assert_eq!(host.peer_index, Some(peer.index));
        assert!(nl.link_by_name("p0").await.unwrap().is_none());
        let nsid = host.peer_netns_id.expect("the peer's netns id");
        let seen = nl.link_in_peer_netns(nsid, peer.index).await.unwrap();
        assert_eq!(seen.map(|l| l.mac), Some(peer.mac.clone()));
        assert!(
            nl.link_in_peer_netns(nsid, 999_999)
                .await
                .unwrap()
                .is_none()
        );
        assert!(
            nl.link_in_peer_netns(4242, peer.index)
                .await
                .unwrap()
                .is_none()
        );

        // Deleting the host end takes the peer along; twice is fine.
        nl.delete_link(host.index).await.unwrap();
        nl.delete_link(host.index).await.unwrap();
        assert!(in_pod.link_by_name("p0").await.unwrap().is_none());
    });
}

#[test]
fn addresses_and_routes() {
    let (node, pod) = (netns(), netns());
    run(async || {
        let nl = Netlink::in_netns(&node).expect("netlink");
        let h = nl.create_veth_in("h0", "p0", &pod, 1500).await.unwrap();
        nl.set_up(h.index).await.unwrap();
        nl.add_address(h.index, v4("10.9.0.1/24")).await.unwrap();
        let twice = nl.add_address(h.index, v4("10.9.0.1/24")).await;
        assert!(twice.as_ref().is_err_and(|e| e.is_exists()), "{twice:?}");
        nl.add_address(h.index, v4("10.9.5.7/32")).await.unwrap();
        assert_eq!(
            nl.ipv4_addresses(h.index).await.unwrap(),
            [v4("10.9.0.1/24"), v4("10.9.5.7/32")]
        );

        let via = Route {
            dst: v4("10.20.0.0/16"),
            gateway: Some(ip(10, 9, 0, 2)),
            oif: Some(h.index),
            protocol: PROTO_A,
            onlink: false,
        };
        let onlink = Route {
            dst: v4("0.0.0.0/0"),
            gateway: Some(ip(169, 254, 1, 1)),
            oif: Some(h.index),
            protocol: PROTO_A,
            onlink: true,
        };
        let scope_link = Route {
            dst: v4("10.30.0.7/32"),
            gateway: None,
            oif: Some(h.index),
            protocol: PROTO_B,
            onlink: false,
        };
        for r in [via, onlink, scope_link] {
            nl.add_route(r).await.unwrap();
        }
        let dup = nl.add_route(via).await;
        assert!(dup.as_ref().is_err_and(|e| e.is_exists()), "{dup:?}");
        let mut ours = nl.routes_by_protocol(PROTO_A).await.unwrap();
        ours.sort_by_key(|r| r.dst.prefix());
        assert_eq!(ours, [onlink, via]);
        assert_eq!(nl.routes_by_protocol(PROTO_B).await.unwrap(), [scope_link]);
        let all = nl.ipv4_routes().await.unwrap();
        for r in [&via, &onlink, &scope_link] {
            assert!(all.contains(r), "{r:?} missing from {all:?}");
        }
        // The kernel's own: the connected subnet, and the local table's.
        assert!(
            all.iter()
                .any(|r| r.dst == v4("10.9.0.0/24") && r.oif == Some(h.index))
        );
        assert!(
            all.iter()
                .any(|r| r.dst == v4("10.9.5.7/32") && r.protocol == 2)
        );

        let moved = Route {
            gateway: Some(ip(10, 9, 0, 3)),
            ..via
        };
        nl.replace_route(moved).await.unwrap();
        let ours = nl.routes_by_protocol(PROTO_A).await.unwrap();
        assert!(ours.contains(&moved) && !ours.contains(&via), "{ours:?}");

        nl.delete_route(via.dst, PROTO_A).await.unwrap();
        nl.delete_route(via.dst, PROTO_A).await.unwrap();
        // Another protocol's route to the same place is not ours to delete.
        nl.delete_route(scope_link.dst, PROTO_A).await.unwrap();
        assert_eq!(nl.routes_by_protocol(PROTO_A).await.unwrap(), [onlink]);
        assert_eq!(nl.routes_by_protocol(PROTO_B).await.unwrap(), [scope_link]);
    });
}

#[test]
fn vxlan_neighbours_and_fdb() {
    let (node, peer) = (netns(), netns());
    run(async || {
        let nl = Netlink::in_netns(&node).expect("netlink");
        let u = nl.create_veth_in("u0", "u1", &peer, 1500).await.unwrap();
        nl.set_up(u.index).await.unwrap();
        nl.add_address(u.index, v4("192.168.77.1/24"))
            .await
            .unwrap();
        let mac = Mac([2, 0xaa, 0, 0, 0, 1]);
        let cfg = VxlanConfig {
            name: "vx0",
            vni: 7,
            dev: u.index,
            local: ip(192, 168, 77, 1).into(),
            port: 8472,
            learning: false,
            udp_csum: false,
            mtu: 1450,
            mac,
        };
        nl.create_vxlan(&cfg).await.unwrap();
        let again = nl.create_vxlan(&cfg).await;
        assert!(again.as_ref().is_err_and(|e| e.is_exists()), "{again:?}");
        let vx = nl.link_by_name("vx0").await.unwrap().expect("vx0");
        assert_eq!((vx.ethernet_mac(), vx.mtu, vx.up), (Some(mac), 1450, false));
        assert_eq!(
            vx.vxlan,
            Some(VxlanInfo {
                vni: Some(7),
                local: Some(ip(192, 168, 77, 1)),
                local6: None,
                port: Some(8472),
                learning: Some(false),
                dev: Some(u.index),
                udp_csum: Some(false),
            })
        );
        let mac2 = Mac([2, 0xaa, 0, 0, 0, 2]);
        nl.set_mac_mtu_and_up(vx.index, mac2, 1400).await.unwrap();
        let vx = nl.link_by_index(vx.index).await.unwrap().expect("vx0");
        assert_eq!((vx.ethernet_mac(), vx.mtu, vx.up), (Some(mac2), 1400, true));

        // Neighbours.
        let (gw, m1, m2) = (
            ip(10, 244, 1, 0),
            Mac([2, 0, 0, 0, 0, 1]),
            Mac([2, 0, 0, 0, 0, 2]),
        );
        assert_eq!(nl.permanent_neighbour(vx.index, gw).await.unwrap(), None);
        nl.replace_permanent_neighbour(vx.index, gw, m1)
            .await
            .unwrap();
        assert_eq!(
            nl.permanent_neighbour(vx.index, gw).await.unwrap(),
            Some(m1)
        );
        nl.replace_permanent_neighbour(vx.index, gw, m2)
            .await
            .unwrap();
        assert_eq!(
            nl.permanent_neighbour(vx.index, gw).await.unwrap(),
            Some(m2)
        );
        assert_eq!(
            nl.permanent_neighbours(vx.index).await.unwrap(),
            [Neighbour { ip: gw, mac: m2 }]
        );
        assert!(nl.permanent_neighbours(u.index).await.unwrap().is_empty());
        nl.delete_neighbour(vx.index, gw).await.unwrap();
        nl.delete_neighbour(vx.index, gw).await.unwrap();
        assert_eq!(nl.permanent_neighbour(vx.index, gw).await.unwrap(), None);
        assert!(nl.permanent_neighbours(vx.index).await.unwrap().is_empty());

        // FDB, next to the all-zeros default destination.
        let dst = ip(192, 168, 77, 2);
        assert!(!nl.has_fdb_entry(vx.index, m1).await.unwrap());
        // The kernel takes an all-zeros entry only appended, not replaced.
        sh_in(
            &node,
            "bridge",
            &[
                "fdb",
                "append",
                "00:00:00:00:00:00",
                "dev",
                "vx0",
                "dst",
                "192.168.77.9",
            ],
        );
        nl.replace_fdb_entry(vx.index, m1, ip(192, 168, 77, 3))
            .await
            .unwrap();
        nl.replace_fdb_entry(vx.index, m1, dst).await.unwrap();
        assert!(nl.has_fdb_entry(vx.index, m1).await.unwrap());
        assert_eq!(
            nl.fdb_entry(vx.index, m1)
                .await
                .unwrap()
                .and_then(|e| e.dst),
            Some(dst)
        );
        assert!(nl.has_fdb_entry(vx.index, Mac::ZERO).await.unwrap());
        assert_eq!(
            nl.fdb_entries(vx.index).await.unwrap(),
            [FdbEntry {
                mac: m1,
                dst: Some(dst),
                dst6: None,
            }]
        );
        nl.delete_fdb_entry(vx.index, m1).await.unwrap();
        nl.delete_fdb_entry(vx.index, m1).await.unwrap();
        assert!(!nl.has_fdb_entry(vx.index, m1).await.unwrap());
        assert!(nl.fdb_entries(vx.index).await.unwrap().is_empty());

        nl.delete_link(vx.index).await.unwrap();
        assert!(nl.link_by_name("vx0").await.unwrap().is_none());
    });
}

/// A VXLAN device over an IPv6 underlay, beside one over IPv4 on the same
/// UDP port: each opens a socket of its own family, so both bind 8472; its
/// FDB entries hold IPv6 destinations, and it refuses IPv4 ones.
#[test]
fn a_vxlan_device_over_ipv6_beside_one_over_ipv4() {
    let (node, peer) = (netns(), netns());
    run(async || {
        let nl = Netlink::in_netns(&node).expect("netlink");
        let u = nl.create_veth_in("u0", "u1", &peer, 1500).await.unwrap();
        nl.set_up(u.index).await.unwrap();
        nl.add_address(u.index, v4("192.168.77.1/24"))
            .await
            .unwrap();
        let local6: Ipv6Addr = "fd00:77::1".parse().unwrap();
        nl.add_ipv6_address_nodad(u.index, "fd00:77::1/64".parse().unwrap())
            .await
            .unwrap();
        let base = VxlanConfig {
            name: "vx0",
            vni: 1,
            dev: u.index,
            local: ip(192, 168, 77, 1).into(),
            port: 8472,
            learning: false,
            udp_csum: false,
            mtu: 1450,
            mac: Mac([2, 0xaa, 0, 0, 0, 1]),
        };
        nl.create_vxlan(&base).await.unwrap();
        nl.create_vxlan(&VxlanConfig {
            name: "vx6",
            local: local6.into(),
            mtu: 1430,
            mac: Mac([2, 0xaa, 0, 0, 0, 6]),
            ..base.clone()
        })
        .await
        .unwrap();
        let vx = nl.link_by_name("vx0").await.unwrap().expect("vx0");
        let vx6 = nl.link_by_name("vx6").await.unwrap().expect("vx6");
        // Up means both sockets are bound on the one port.
        nl.set_up(vx.index).await.unwrap();
        nl.set_up(vx6.index).await.unwrap();
        let info = vx6.vxlan.expect("vx6 is VXLAN");
        assert_eq!((info.local, info.local6), (None, Some(local6)));
        assert_eq!((info.vni, info.port), (Some(1), Some(8472)));

        let (m, dst6): (Mac, Ipv6Addr) = (Mac([2, 0, 0, 0, 6, 1]), "fd00:77::2".parse().unwrap());
        nl.replace_fdb_entry(vx6.index, m, dst6).await.unwrap();
        let e = nl.fdb_entry(vx6.index, m).await.unwrap().expect("entry");
        assert_eq!((e.dst, e.dst6), (None, Some(dst6)));
        assert_eq!(e.dst_ip(), Some(dst6.into()));
        assert_eq!(
            nl.fdb_entries(vx6.index).await.unwrap(),
            [FdbEntry {
                mac: m,
                dst: None,
                dst6: Some(dst6)
            }]
        );
        let wrong = nl
            .replace_fdb_entry(vx6.index, m, ip(192, 168, 77, 2))
            .await;
        assert!(
            wrong.is_err(),
            "an IPv4 destination on an IPv6 device: {wrong:?}"
        );
        // The IPv4 device's FDB knows nothing of it.
        assert!(nl.fdb_entries(vx.index).await.unwrap().is_empty());
        nl.delete_fdb_entry(vx6.index, m).await.unwrap();
        assert!(nl.fdb_entries(vx6.index).await.unwrap().is_empty());
    });
}

#[test]
fn current_is_the_calling_threads_namespace() {
    let (made_here, _other) = std::thread::spawn(|| {
        // SAFETY: unshare(2) moves only this thread.
        assert_eq!(
            unsafe { libc::unshare(libc::CLONE_NEWNET) },
            0,
            "needs root"
        );
        let here = File::open("/proc/thread-self/ns/net").expect("own netns");
        let other = netns();
        run(async || {
            let nl = Netlink::current().expect("netlink");
            let names: Vec<String> = nl
                .links()
                .await
                .unwrap()
                .into_iter()
                .map(|l| l.name)
                .collect();
            assert_eq!(names, ["lo"], "a fresh namespace has loopback only");
            nl.create_veth_in("h0", "p0", &other, 1500).await.unwrap();
        });
        // Both stay alive past this thread; a namespace's end takes its
        // veth end and the peer along.
        (here, other)
    })
    .join()
    .expect("thread");
    run(async || {
        let nl = Netlink::in_netns(&made_here).expect("netlink");
        assert!(nl.link_by_name("h0").await.unwrap().is_some());
    });
}

#[test]
fn errors_say_what_failed_and_why() {
    let node = netns();
    run(async || {
        let nl = Netlink::in_netns(&node).expect("netlink");
        let e = nl
            .add_address(999_999, v4("10.1.1.1/32"))
            .await
            .expect_err("no such link");
        assert_eq!(e.errno(), Some(libc::ENODEV));
        assert!(e.is_not_found() && !e.is_exists() && !e.is_interrupted());
        assert!(e.op().contains("10.1.1.1/32"), "{}", e.op());
        assert!(e.to_string().starts_with(e.op()), "{e}");
        let r = Route {
            dst: v4("10.2.0.0/16"),
            gateway: Some(ip(10, 3, 0, 1)),
            oif: None,
            protocol: PROTO_A,
            onlink: false,
        };
        // No route to the gateway.
        let e = nl.add_route(r).await.expect_err("unreachable gateway");
        assert_eq!(e.errno(), Some(libc::ENETUNREACH), "{e}");
    });
    // Not in a runtime: an error, not a panic.
    let e = Netlink::in_netns(&node).err().expect("needs a runtime");
    assert!(e.errno().is_none(), "{e}");
}

fn v6(s: &str) -> Cidr<Ipv6Addr> {
    s.parse().expect("test CIDR")
}

fn ip6(s: &str) -> Ipv6Addr {
    s.parse().expect("test address")
}

#[test]
fn ipv6_addresses_routes_and_neighbours() {
    let (node, pod) = (netns(), netns());
    run(async || {
        let nl = Netlink::in_netns(&node).expect("netlink");
        let h = nl.create_veth_in("h0", "p0", &pod, 1500).await.unwrap();
        // IPv6 routes need the device up (ENETDOWN otherwise).
        nl.set_up(h.index).await.unwrap();

        nl.add_ipv6_address_nodad(h.index, v6("fd00:9::1/128"))
            .await
            .unwrap();
        let twice = nl
            .add_ipv6_address_nodad(h.index, v6("fd00:9::1/128"))
            .await;
        assert!(twice.as_ref().is_err_and(|e| e.is_exists()), "{twice:?}");
        nl.add_address(h.index, v6("fd00:9::2/64")).await.unwrap();
        nl.add_ipv6_address_nodad(h.index, v6("fe80::1/64"))
            .await
            .unwrap();
        let addrs = nl.ipv6_addresses(h.index).await.unwrap();
        let find = |c: Cidr<Ipv6Addr>| {
            addrs
                .iter()
                .find(|a| a.cidr == c)
                .unwrap_or_else(|| panic!("{c} missing from {addrs:?}"))
        };
        let nodad = find(v6("fd00:9::1/128"));
        assert!(nodad.nodad && !nodad.tentative, "{nodad:?}");
        assert!(!find(v6("fd00:9::2/64")).nodad);
        assert!(find(v6("fe80::1/64")).nodad);
        // Each family lists only its own.
        assert!(nl.ipv4_addresses(h.index).await.unwrap().is_empty());
        let before = nl.ipv6_addresses(h.index).await.unwrap().len();
        nl.add_address(h.index, v4("10.9.0.1/24")).await.unwrap();
        assert_eq!(nl.ipv6_addresses(h.index).await.unwrap().len(), before);
        assert_eq!(
            nl.ipv4_addresses(h.index).await.unwrap(),
            [v4("10.9.0.1/24")]
        );

        // Not via fe80::1: the kernel refuses a gateway that is a local
        // address (the plugin's pods route via the host veth's from their
        // own namespace).
        let default = Route {
            dst: v6("::/0"),
            gateway: Some(ip6("fe80::9")),
            oif: Some(h.index),
            protocol: PROTO_A,
            onlink: true,
        };
        let via = Route {
            dst: v6("fd00:20::/64"),
            gateway: Some(ip6("fd00:9::5")),
            oif: Some(h.index),
            protocol: PROTO_A,
            onlink: false,
        };
        let direct = Route {
            dst: v6("fd00:30::7/128"),
            gateway: None,
            oif: Some(h.index),
            protocol: PROTO_B,
            onlink: false,
        };
        for r in [default, via, direct] {
            nl.add_route(r).await.unwrap();
        }
        let dup = nl.add_route(direct).await;
        assert!(dup.as_ref().is_err_and(|e| e.is_exists()), "{dup:?}");
        let mut ours = nl.ipv6_routes_by_protocol(PROTO_A).await.unwrap();
        ours.sort_by_key(|r| r.dst.prefix());
        assert_eq!(ours, [default, via]);
        assert_eq!(nl.ipv6_routes_by_protocol(PROTO_B).await.unwrap(), [direct]);
        // No IPv6 route is listed as an IPv4 one, and the other way round.
        assert!(nl.routes_by_protocol(PROTO_B).await.unwrap().is_empty());
        let v4_route = Route {
            dst: v4("10.40.0.0/16"),
            gateway: None,
            oif: Some(h.index),
            protocol: PROTO_B,
            onlink: false,
        };
        nl.add_route(v4_route).await.unwrap();
        assert_eq!(nl.ipv6_routes_by_protocol(PROTO_B).await.unwrap(), [direct]);
        let all = nl.ipv6_routes().await.unwrap();
        assert!(all.contains(&direct), "{all:?}");
        // The kernel's own: the connected /64.
        assert!(
            all.iter()
                .any(|r| r.dst == v6("fd00:9::/64") && r.oif == Some(h.index))
        );

        let moved = Route {
            gateway: Some(ip6("fd00:9::6")),
            ..via
        };
        nl.replace_route(moved).await.unwrap();
        let ours = nl.ipv6_routes_by_protocol(PROTO_A).await.unwrap();
        assert!(ours.contains(&moved) && !ours.contains(&via), "{ours:?}");
        nl.delete_route(via.dst, PROTO_A).await.unwrap();
        nl.delete_route(via.dst, PROTO_A).await.unwrap();
        // Another protocol's route to the same place is not ours to delete.
        nl.delete_route(direct.dst, PROTO_A).await.unwrap();
        assert_eq!(
            nl.ipv6_routes_by_protocol(PROTO_A).await.unwrap(),
            [default]
        );
        assert_eq!(nl.ipv6_routes_by_protocol(PROTO_B).await.unwrap(), [direct]);
        nl.delete_route(v4_route.dst, PROTO_B).await.unwrap();
        assert_eq!(nl.ipv6_routes_by_protocol(PROTO_B).await.unwrap(), [direct]);

        let gw = ip6("fe80::9");
        let (m1, m2): (Mac, Mac) = (
            "02:00:00:00:00:01".parse().unwrap(),
            "02:00:00:00:00:02".parse().unwrap(),
        );
        assert_eq!(nl.permanent_neighbour(h.index, gw).await.unwrap(), None);
        nl.replace_permanent_neighbour(h.index, gw, m1)
            .await
            .unwrap();
        assert_eq!(nl.permanent_neighbour(h.index, gw).await.unwrap(), Some(m1));
        nl.replace_permanent_neighbour(h.index, gw, m2)
            .await
            .unwrap();
        assert_eq!(nl.permanent_neighbour(h.index, gw).await.unwrap(), Some(m2));
        // The IPv4 list has no IPv6 neighbour.
        assert!(nl.permanent_neighbours(h.index).await.unwrap().is_empty());
        nl.delete_neighbour(h.index, gw).await.unwrap();
        nl.delete_neighbour(h.index, gw).await.unwrap();
        assert_eq!(nl.permanent_neighbour(h.index, gw).await.unwrap(), None);
    });
}
