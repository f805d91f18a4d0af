//! Peer routes through nexthop objects, against the real kernel in a test
//! namespace: one nexthop per peer, IDs that survive a restart, routes
//! taken over from `via … onlink` and back, a direct peer's host IP moved
//! by its nexthop alone, and another program's nexthops left alone.

use std::net::Ipv4Addr;

use mycni_agent::overlay::{self, NEXTHOP_ID_BASE, OverlayKernel, PeerRoutes};
use mycni_agent::topology::{OverlayState, VxlanSpec};
use mycni_common::net::{Cidr4, Cidr6, Mac};
use mycni_common::node::Peer;
use mycni_testkit::NetNs;

fn peer(name: &str, cidr: &str, mac: u8, ip: u8) -> Peer {
    Peer {
        name: name.into(),
        pod_cidr: Cidr4::parse_network(cidr).expect("test CIDR"),
        pod_cidr6: None,
        vtep_mac: Mac([2, 0, 0, 0, 0, mac]),
        host_ip: Ipv4Addr::new(192, 168, 55, ip),
        underlay6: None,
    }
}

fn node() -> NetNs {
    let ns = NetNs::new("agnh").expect("netns");
    for args in [
        &[
            "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p",
        ][..],
        &["addr", "add", "192.168.55.1/24", "dev", "eth0"],
        &["link", "set", "eth0", "up"],
        &["link", "set", "eth0p", "up"],
    ] {
        ns.exec("ip", args).expect("ip");
    }
    ns
}

/// Runs `f` with a fresh `OverlayKernel` (as a restarted agent has) inside `ns`:
/// `onlink` makes it the fallback's.
fn in_node<T: Send>(
    ns: &NetNs,
    onlink: bool,
    f: impl AsyncFnOnce(OverlayKernel, VxlanSpec, u32) -> T + Send,
) -> T {
    ns.run_in(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let k = if onlink {
                OverlayKernel::with_onlink_routes()
            } else {
                OverlayKernel::new()
            }
            .expect("netlink");
            let u = k.underlay(Some("eth0")).await.expect("underlay");
            let spec = VxlanSpec {
                name: "vxlan.1".into(),
                vni: 1,
                port: 8472,
                underlay_index: u.index,
                local_ip: u.ip,
                mtu: u.mtu - 50,
                mac: Mac([2, 0xaa, 0, 0, 0, 1]),
                address: Ipv4Addr::new(10, 244, 0, 0),
                address6: None,
            };
            f(k, spec, u.index).await
        })
    })
    .expect("thread in netns")
}

/// One pass, as the loop runs it: dump, diff, apply; what it changed.
async fn pass(k: &OverlayKernel, vx: u32, underlay: u32, want: &OverlayState) -> usize {
    let have = k.dump(vx, underlay).await.expect("dump");
    let acts = overlay::diff(want, &have);
    assert_eq!(k.apply(vx, underlay, &acts).await, 0, "{acts:?}");
    acts.len()
}

fn nexthops(ns: &NetNs) -> String {
    ns.exec("ip", &["nexthop", "list", "protocol", "110"])
        .expect("ip nexthop")
}

fn routes(ns: &NetNs) -> String {
    ns.exec("ip", &["route", "show", "proto", "110"])
        .expect("ip route")
}

fn two() -> OverlayState {
    overlay::desired(&[
        peer("a", "10.244.1.0/24", 1, 2),
        peer("b", "10.244.2.0/24", 2, 3),
    ])
}

#[test]
fn one_nexthop_per_peer_and_a_restart_changes_nothing() {
    let _turn = crate::turn(module_path!());
    let ns = node();
    let want = two();
    in_node(&ns, false, async |k, spec, _| {
        assert_eq!(k.peer_routes().await.unwrap(), PeerRoutes::Nexthops);
        let (vx, _) = k.ensure_vxlan(&spec).await.unwrap();
        assert_eq!(pass(&k, vx, 0, &want).await, 6);
        assert_eq!(pass(&k, vx, 0, &want).await, 0);
    });
    let nh = nexthops(&ns);
    assert_eq!(nh.lines().count(), 2, "{nh}");
    assert!(
        nh.contains(&format!(
            "id {NEXTHOP_ID_BASE} via 10.244.1.0 dev vxlan.1 scope link proto 110 onlink"
        )),
        "{nh}"
    );
    let r = routes(&ns);
    assert!(
        r.contains(&format!(
            "10.244.2.0/24 nhid {} via 10.244.2.0",
            NEXTHOP_ID_BASE + 1
        )),
        "{r}"
    );
    // A new agent reads back what the old one left: nothing to do, the
    // same IDs.
    in_node(&ns, false, async |k, spec, _| {
        let (vx, created) = k.ensure_vxlan(&spec).await.unwrap();
        assert!(!created);
        assert_eq!(pass(&k, vx, 0, &want).await, 0);
    });
    assert_eq!(nexthops(&ns), nh);
    assert_eq!(routes(&ns), r);
}

#[test]
fn onlink_routes_are_taken_over_and_the_fallback_keeps_working() {
    let _turn = crate::turn(module_path!());
    let ns = node();
    let want = two();
    // The fallback: routes hold their gateway, no nexthops.
    in_node(&ns, true, async |k, spec, _| {
        assert_eq!(k.peer_routes().await.unwrap(), PeerRoutes::Onlink);
        let (vx, _) = k.ensure_vxlan(&spec).await.unwrap();
        assert_eq!(pass(&k, vx, 0, &want).await, 6);
        assert_eq!(pass(&k, vx, 0, &want).await, 0);
    });
    assert!(nexthops(&ns).trim().is_empty());
    let r = routes(&ns);
    assert!(
        r.contains("10.244.1.0/24 via 10.244.1.0 dev vxlan.1 onlink") && !r.contains("nhid"),
        "{r}"
    );
    // An agent on a kernel with nexthops moves them over, once.
    in_node(&ns, false, async |k, spec, _| {
        let (vx, _) = k.ensure_vxlan(&spec).await.unwrap();
        assert_eq!(pass(&k, vx, 0, &want).await, 2, "both routes");
        assert_eq!(pass(&k, vx, 0, &want).await, 0);
    });
    let r = routes(&ns);
    assert_eq!(r.lines().filter(|l| l.contains("nhid")).count(), 2, "{r}");
    assert_eq!(nexthops(&ns).lines().count(), 2);
    // The fallback reads routes through nexthops as in place (the kernel
    // shows their gateway on them), and deletes them like its own.
    in_node(&ns, true, async |k, spec, _| {
        let (vx, _) = k.ensure_vxlan(&spec).await.unwrap();
        assert_eq!(pass(&k, vx, 0, &want).await, 0);
        assert_eq!(pass(&k, vx, 0, &OverlayState::default()).await, 6);
    });
    assert!(routes(&ns).trim().is_empty(), "{}", routes(&ns));
}

#[test]
fn a_direct_peers_new_host_ip_is_its_nexthop_replaced() {
    let _turn = crate::turn(module_path!());
    let ns = node();
    let lan = Cidr4::parse_network("192.168.55.0/24").expect("cidr");
    let a = peer("a", "10.244.1.0/24", 1, 2);
    let moved = Peer {
        host_ip: Ipv4Addr::new(192, 168, 55, 9),
        ..a.clone()
    };
    let before = overlay::desired_direct(std::slice::from_ref(&a), &[lan]);
    let after = overlay::desired_direct(std::slice::from_ref(&moved), &[lan]);
    in_node(&ns, false, async |k, spec, eth0| {
        let (vx, _) = k.ensure_vxlan(&spec).await.unwrap();
        assert_eq!(pass(&k, vx, eth0, &before).await, 2, "route and FDB entry");
    });
    let id = format!("nhid {NEXTHOP_ID_BASE} via 192.168.55.2 dev eth0");
    assert!(routes(&ns).contains(&id), "{}", routes(&ns));
    in_node(&ns, false, async |k, spec, eth0| {
        let (vx, _) = k.ensure_vxlan(&spec).await.unwrap();
        assert_eq!(pass(&k, vx, eth0, &after).await, 2, "route and FDB entry");
        assert_eq!(pass(&k, vx, eth0, &after).await, 0);
    });
    // Same ID, new gateway: the nexthop was replaced, not the route.
    let id = format!("nhid {NEXTHOP_ID_BASE} via 192.168.55.9 dev eth0");
    assert!(routes(&ns).contains(&id), "{}", routes(&ns));
    assert_eq!(nexthops(&ns).lines().count(), 1, "{}", nexthops(&ns));
}

#[test]
fn routes_deleted_under_their_nexthops_come_back_through_them() {
    let _turn = crate::turn(module_path!());
    let ns = node();
    let want = two();
    in_node(&ns, false, async |k, spec, _| {
        let (vx, _) = k.ensure_vxlan(&spec).await.unwrap();
        pass(&k, vx, 0, &want).await;
    });
    let nh = nexthops(&ns);
    // One by one: iproute2 6.1's `ip route flush` echoes a route through a
    // nexthop with the nexthop's gateway and device next to its ID (which
    // `nexthop_compat_mode`, on by default, adds to dumps), and the kernel
    // refuses the pair with EINVAL.
    for dst in ["10.244.1.0/24", "10.244.2.0/24"] {
        ns.exec("ip", &["route", "del", dst, "proto", "110"])
            .expect("ip route del");
    }
    assert_eq!(nexthops(&ns), nh, "the nexthops outlive their routes");
    in_node(&ns, false, async |k, spec, _| {
        let (vx, _) = k.ensure_vxlan(&spec).await.unwrap();
        assert_eq!(pass(&k, vx, 0, &want).await, 2, "the routes alone");
    });
    assert_eq!(nexthops(&ns), nh);
    assert_eq!(
        routes(&ns).lines().filter(|l| l.contains("nhid")).count(),
        2
    );
    // Deleting a nexthop takes its route along; the next pass makes both.
    ns.exec(
        "ip",
        &["nexthop", "del", "id", &NEXTHOP_ID_BASE.to_string()],
    )
    .expect("ip nexthop del");
    assert_eq!(routes(&ns).lines().count(), 1, "{}", routes(&ns));
    in_node(&ns, false, async |k, spec, _| {
        let (vx, _) = k.ensure_vxlan(&spec).await.unwrap();
        assert_eq!(pass(&k, vx, 0, &want).await, 1);
        assert_eq!(pass(&k, vx, 0, &want).await, 0);
    });
    assert_eq!(nexthops(&ns).lines().count(), 2);
}

#[test]
fn another_programs_nexthops_are_neither_taken_nor_touched() {
    let _turn = crate::turn(module_path!());
    let ns = node();
    in_node(&ns, false, async |k, spec, _| {
        k.ensure_vxlan(&spec).await.unwrap();
    });
    // Someone else's nexthop at the agent's first ID, and one of the
    // agent's own that no route goes through (left by a crash).
    let base = NEXTHOP_ID_BASE.to_string();
    let stray = (NEXTHOP_ID_BASE + 5).to_string();
    for (id, proto) in [(&base, "99"), (&stray, "110")] {
        ns.exec(
            "ip",
            &[
                "nexthop", "add", "id", id, "via", "10.9.9.9", "dev", "vxlan.1", "onlink",
                "protocol", proto,
            ],
        )
        .expect("ip nexthop add");
    }
    let want = two();
    in_node(&ns, false, async |k, spec, _| {
        let (vx, _) = k.ensure_vxlan(&spec).await.unwrap();
        assert_eq!(pass(&k, vx, 0, &want).await, 6);
        assert_eq!(pass(&k, vx, 0, &want).await, 0);
    });
    let ours = nexthops(&ns);
    assert!(
        ours.contains(&format!("id {} via 10.244.1.0", NEXTHOP_ID_BASE + 1))
            && ours.contains(&format!("id {} via 10.244.2.0", NEXTHOP_ID_BASE + 2))
            && !ours.contains(&format!("id {stray} ")),
        "{ours}"
    );
    in_node(&ns, false, async |k, spec, _| {
        let (vx, _) = k.ensure_vxlan(&spec).await.unwrap();
        assert_eq!(pass(&k, vx, 0, &OverlayState::default()).await, 6);
    });
    assert!(nexthops(&ns).trim().is_empty(), "{}", nexthops(&ns));
    let all = ns.exec("ip", &["nexthop", "list"]).expect("ip nexthop");
    assert!(
        all.contains(&format!("id {base} via 10.9.9.9 dev vxlan.1")),
        "{all}"
    );
}

fn routes6(ns: &NetNs) -> String {
    ns.exec("ip", &["-6", "route", "show", "proto", "110"])
        .expect("ip -6 route")
}

fn neighbours6(ns: &NetNs) -> String {
    ns.exec("ip", &["-6", "neigh", "show", "dev", "vxlan.1"])
        .expect("ip -6 neigh")
}

/// Two dual-stack peers: their IPv6 podCIDRs next to the IPv4 ones.
fn two_dual() -> OverlayState {
    let dual = |name: &str, cidr: &str, cidr6: &str, mac: u8, ip: u8| Peer {
        pod_cidr6: Some(Cidr6::parse_network(cidr6).expect("test CIDR")),
        ..peer(name, cidr, mac, ip)
    };
    overlay::desired(&[
        dual("a", "10.244.1.0/24", "fd00:10:244:1::/64", 1, 2),
        dual("b", "10.244.2.0/24", "fd00:10:244:2::/64", 2, 3),
    ])
}

/// IPv6 peers over the same vxlan.1 and FDB entries, in both route modes:
/// the node's own IPv6 VTEP address, a route and a permanent neighbour per
/// peer, read back as made (a second pass does nothing), moved from one
/// mode to the other, and all gone with the peers.
#[test]
fn ipv6_peers_get_a_route_and_neighbour_in_either_mode() {
    let _turn = crate::turn(module_path!());
    let ns = node();
    let want = two_dual();
    let own6: std::net::Ipv6Addr = "fd00:10:244::".parse().expect("ip");
    // Onlink routes, moved to nexthops, then a restarted agent: the
    // changes each first pass makes.
    for (onlink, changes) in [(true, 10), (false, 4), (false, 0)] {
        in_node(&ns, onlink, async |k, spec, _| {
            let spec = VxlanSpec {
                address6: Some(own6),
                ..spec
            };
            let (vx, _) = k.ensure_vxlan(&spec).await.unwrap();
            // Fresh: 2 FDB + 2x2 neighbours + 2x2 routes; after the other
            // mode: the 4 routes move; restarted: nothing.
            assert_eq!(pass(&k, vx, 0, &want).await, changes);
            assert_eq!(pass(&k, vx, 0, &want).await, 0, "read back as made");
        });
        let r = routes6(&ns);
        for (dst, gw) in [
            ("fd00:10:244:1::/64", "fd00:10:244:1::"),
            ("fd00:10:244:2::/64", "fd00:10:244:2::"),
        ] {
            let line = r.lines().find(|l| l.starts_with(dst)).unwrap_or_default();
            assert!(
                line.contains(&format!("via {gw} dev vxlan.1")) && line.contains("onlink"),
                "{r}"
            );
            assert_eq!(line.contains("nhid"), !onlink, "{r}");
        }
        let n = neighbours6(&ns);
        assert!(
            n.contains("fd00:10:244:1:: lladdr 02:00:00:00:00:01 PERMANENT")
                && n.contains("fd00:10:244:2:: lladdr 02:00:00:00:00:02 PERMANENT"),
            "{n}"
        );
    }
    let nh = nexthops(&ns);
    assert!(
        nh.lines()
            .filter(|l| l.contains("via fd00:10:244:"))
            .count()
            == 2,
        "one IPv6 nexthop per IPv6 route: {nh}"
    );
    let addr = ns
        .exec("ip", &["-6", "addr", "show", "dev", "vxlan.1"])
        .expect("ip addr");
    assert!(addr.contains("fd00:10:244::/128"), "{addr}");
    // Another IPv6 podCIDR (the node made again): the old VTEP address
    // goes, the link-local one stays.
    in_node(&ns, false, async |k, spec, _| {
        let spec = VxlanSpec {
            address6: "fd00:10:244:9::".parse().ok(),
            ..spec
        };
        k.ensure_vxlan(&spec).await.unwrap();
    });
    let addr = ns
        .exec("ip", &["-6", "addr", "show", "dev", "vxlan.1"])
        .expect("ip addr");
    assert!(
        addr.contains("fd00:10:244:9::/128")
            && !addr.contains("fd00:10:244::/128")
            && addr.contains("fe80::"),
        "{addr}"
    );
    in_node(&ns, false, async |k, spec, _| {
        let (vx, _) = k.ensure_vxlan(&spec).await.unwrap();
        assert_eq!(pass(&k, vx, 0, &OverlayState::default()).await, 10);
    });
    assert!(routes6(&ns).trim().is_empty(), "{}", routes6(&ns));
    assert!(
        !neighbours6(&ns).contains("PERMANENT"),
        "{}",
        neighbours6(&ns)
    );
    assert!(nexthops(&ns).trim().is_empty(), "{}", nexthops(&ns));
}
