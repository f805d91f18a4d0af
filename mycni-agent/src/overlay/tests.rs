//! The overlay's desired state, diff and nexthop IDs, without a kernel.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use mycni_common::net::{Cidr4, Cidr6, Mac};
use mycni_common::node::Peer;

use super::desired::*;
use super::nexthop_ids::*;
use crate::topology::*;

fn peer(name: &str, cidr: &str, mac: u8, ip: u8) -> Peer {
    Peer {
        name: name.into(),
        pod_cidr: Cidr4::parse_network(cidr).unwrap(),
        pod_cidr6: None,
        vtep_mac: Mac([2, 0, 0, 0, 0, mac]),
        host_ip: Ipv4Addr::new(192, 168, 0, ip),
        underlay6: None,
    }
}

#[test]
fn fresh_node_adds_everything_in_dependency_order() {
    let want = desired(&[peer("a", "10.244.1.0/24", 1, 2)]);
    let acts = diff(&want, &OverlayState::default());
    assert_eq!(
        acts,
        vec![
            Action::SetFdb(
                Mac([2, 0, 0, 0, 0, 1]),
                Ipv4Addr::new(192, 168, 0, 2).into()
            ),
            Action::SetNeighbour(Ipv4Addr::new(10, 244, 1, 0), Mac([2, 0, 0, 0, 0, 1])),
            Action::SetRoute(
                Cidr4::parse_network("10.244.1.0/24").unwrap(),
                Ipv4Addr::new(10, 244, 1, 0)
            ),
        ]
    );
}

#[test]
fn direct_peers_are_routed_to_their_host_without_a_neighbour() {
    let lan = Cidr4::parse_network("192.168.0.0/24").unwrap();
    let a = peer("a", "10.244.1.0/24", 1, 2);
    let mut far = peer("b", "10.244.2.0/24", 2, 3);
    far.host_ip = Ipv4Addr::new(172, 16, 0, 3);
    let want = desired_direct(&[a.clone(), far.clone()], &[lan]);
    assert_eq!(want.routes[&a.pod_cidr], a.host_ip);
    assert!(!via_vxlan(a.pod_cidr, a.host_ip));
    assert_eq!(want.routes[&far.pod_cidr], far.gateway());
    assert!(via_vxlan(far.pod_cidr, far.gateway()));
    assert_eq!(want.neighbours.len(), 1);
    assert_eq!(want.fdb.len(), 2);
    // Turning direct routing on replaces the route and drops the
    // neighbour; off again restores both.
    let vxlan = desired(std::slice::from_ref(&a));
    let direct = desired_direct(std::slice::from_ref(&a), &[lan]);
    let mut s = vxlan.clone();
    apply(&mut s, &diff(&direct, &vxlan));
    assert_eq!(s, direct);
    apply(&mut s, &diff(&vxlan, &direct));
    assert_eq!(s, vxlan);
}

#[test]
fn in_sync_means_no_actions() {
    let want = desired(&[
        peer("a", "10.244.1.0/24", 1, 2),
        peer("b", "10.244.2.0/24", 2, 3),
    ]);
    assert!(diff(&want, &want.clone()).is_empty());
}

#[test]
fn changes_of_mac_host_ip_and_cidr() {
    let old = desired(&[peer("a", "10.244.1.0/24", 1, 2)]);
    // Host IP changed: only the FDB entry is replaced.
    let new_ip = desired(&[peer("a", "10.244.1.0/24", 1, 9)]);
    assert_eq!(
        diff(&new_ip, &old),
        vec![Action::SetFdb(
            Mac([2, 0, 0, 0, 0, 1]),
            Ipv4Addr::new(192, 168, 0, 9).into()
        )]
    );
    // MAC changed: old FDB entry deleted, neighbour replaced, new FDB.
    let new_mac = desired(&[peer("a", "10.244.1.0/24", 7, 2)]);
    let acts = diff(&new_mac, &old);
    assert!(acts.contains(&Action::DelFdb(Mac([2, 0, 0, 0, 0, 1]))));
    assert!(acts.contains(&Action::SetNeighbour(
        Ipv4Addr::new(10, 244, 1, 0),
        Mac([2, 0, 0, 0, 0, 7])
    )));
    // podCIDR changed: old route and neighbour go, new ones come.
    let new_cidr = desired(&[peer("a", "10.244.5.0/24", 1, 2)]);
    let acts = diff(&new_cidr, &old);
    assert!(acts.contains(&Action::DelRoute(
        Cidr4::parse_network("10.244.1.0/24").unwrap()
    )));
    assert!(acts.contains(&Action::DelNeighbour(Ipv4Addr::new(10, 244, 1, 0))));
    assert!(acts[0].is_delete());
    let mut s = old.clone();
    apply(&mut s, &acts);
    assert_eq!(s, new_cidr);
}

/// A state follows another within the keys where they differ (a
/// changed peer's entries before and after, as an incremental pass
/// touches them): equal after, and said changed only when it was.
#[test]
fn follow_within_touched_keys_makes_states_equal() {
    let a = peer("a", "10.244.1.0/24", 1, 2);
    let b = peer("b", "10.244.2.0/24", 2, 3);
    let old = desired(&[a.clone(), b.clone()]);
    for b2 in [
        peer("b", "10.244.2.0/24", 7, 3),
        peer("b", "10.244.2.0/24", 2, 9),
        peer("b", "10.244.6.0/24", 2, 3),
    ] {
        let new = desired(&[a.clone(), b2.clone()]);
        let mut keys = desired(std::slice::from_ref(&b));
        let after = desired(std::slice::from_ref(&b2));
        keys.routes.extend(after.routes);
        keys.neighbours.extend(after.neighbours);
        keys.fdb.extend(after.fdb);
        let mut s = old.clone();
        assert!(s.follow_within(&new, &keys));
        assert_eq!(s, new);
        assert!(!s.follow_within(&new, &keys), "nothing left to change");
    }
    // Only the keys are read: what differs elsewhere stays.
    let mut s = old.clone();
    let none = OverlayState::default();
    assert!(!s.follow_within(&desired(&[a]), &none));
    assert_eq!(s, old);
}

#[test]
fn deleted_nodes_lose_everything() {
    let old = desired(&[
        peer("a", "10.244.1.0/24", 1, 2),
        peer("b", "10.244.2.0/24", 2, 3),
    ]);
    let want = desired(&[peer("a", "10.244.1.0/24", 1, 2)]);
    let acts = diff(&want, &old);
    assert_eq!(acts.len(), 3);
    assert!(acts.iter().all(Action::is_delete));
}

#[test]
fn any_start_state_converges_in_one_pass() {
    // A small exhaustive-ish property: from every subset of a universe
    // of entries, one diff+apply reaches the desired state.
    let peers = [
        peer("a", "10.244.1.0/24", 1, 2),
        peer("b", "10.244.2.0/24", 2, 3),
    ];
    let want = desired(&peers[..1]);
    let universe = desired(&[
        peers[0].clone(),
        peers[1].clone(),
        peer("a", "10.244.1.0/24", 9, 9),
    ]);
    let routes: Vec<_> = universe.routes.iter().collect();
    let neighs: Vec<_> = universe.neighbours.iter().collect();
    let fdbs: Vec<_> = universe.fdb.iter().collect();
    for mask in 0u32..(1 << (routes.len() + neighs.len() + fdbs.len())) {
        let mut have = OverlayState::default();
        let mut bit = 0;
        for (k, v) in &routes {
            if mask & (1 << bit) != 0 {
                have.routes.insert(**k, **v);
            }
            bit += 1;
        }
        for (k, v) in &neighs {
            if mask & (1 << bit) != 0 {
                have.neighbours.insert(**k, **v);
            }
            bit += 1;
        }
        for (k, v) in &fdbs {
            if mask & (1 << bit) != 0 {
                have.fdb.insert(**k, **v);
            }
            bit += 1;
        }
        let acts = diff(&want, &have);
        apply(&mut have, &acts);
        assert_eq!(have, want, "mask {mask:b}");
    }
}

fn cidr(s: &str) -> Cidr4 {
    Cidr4::parse_network(s).unwrap()
}

fn vx(c: &str) -> Hop {
    let c = cidr(c);
    Hop::of_route(c, c.network())
}

#[test]
fn a_restarted_agent_keeps_every_nexthop_id() {
    let (a, b) = (cidr("10.244.1.0/24"), cidr("10.244.2.0/24"));
    let direct = Hop::of_route(b, Ipv4Addr::new(192, 168, 0, 3));
    assert!(direct.direct && !vx("10.244.1.0/24").direct);
    let mut t = NexthopIds::new(
        [(7, Some(vx("10.244.1.0/24"))), (9, Some(direct))],
        [],
        [(a, 7), (b, 9)],
    );
    let none = |id| NexthopPlan {
        id,
        set_nexthop: false,
        set_route: false,
    };
    assert_eq!(t.plan(a, vx("10.244.1.0/24")), none(7));
    assert_eq!(t.plan(b, direct), none(9));
    assert!(t.take_unused().is_empty());
    // The peer's host IP changed: its nexthop alone, same ID.
    let moved = Hop::of_route(b, Ipv4Addr::new(192, 168, 0, 9));
    assert_eq!(
        t.plan(b, moved),
        NexthopPlan {
            id: 9,
            set_nexthop: true,
            set_route: false
        }
    );
}

#[test]
fn new_routes_get_the_lowest_ids_nobody_holds() {
    let base = NEXTHOP_ID_BASE;
    let mut t = NexthopIds::new::<Cidr4>([(base + 1, Some(vx("10.244.9.0/24")))], [base], []);
    let c = |i: u8| cidr(&format!("10.244.{i}.0/24"));
    let hop = |i: u8| vx(&format!("10.244.{i}.0/24"));
    // base is another program's, base + 1 the agent's (unused, other hop).
    let p = t.plan(c(1), hop(1));
    assert_eq!((p.id, p.set_nexthop, p.set_route), (base + 2, true, true));
    assert_eq!(t.plan(c(2), hop(2)).id, base + 3);
    // Released IDs are handed out again, lowest first.
    assert_eq!(t.release(c(1)), Some(base + 2));
    assert_eq!(t.release(c(1)), None);
    assert_eq!(t.take_unused(), vec![base + 1]);
    assert_eq!(t.plan(c(3), hop(3)).id, base + 1);
    assert_eq!(t.plan(c(4), hop(4)).id, base + 2);
    assert_eq!(t.plan(c(5), hop(5)).id, base + 4);
}

#[test]
fn routes_through_what_is_not_theirs_get_a_nexthop_of_their_own() {
    let (a, b, c) = (
        cidr("10.244.1.0/24"),
        cidr("10.244.2.0/24"),
        cidr("10.244.3.0/24"),
    );
    let mut t = NexthopIds::new(
        [(5, Some(vx("10.244.1.0/24"))), (6, None)],
        [3],
        // b through another program's nexthop; c through a's.
        [(a, 5), (b, 3), (c, 5)],
    );
    assert_eq!(t.route(a), Some((5, Some(vx("10.244.1.0/24")))));
    assert_eq!(t.route(b), None);
    assert_eq!(t.route(c), None);
    let p = t.plan(b, vx("10.244.2.0/24"));
    assert!(p.set_nexthop && p.set_route && ![3, 5, 6].contains(&p.id));
    let q = t.plan(c, vx("10.244.3.0/24"));
    assert!(q.set_nexthop && q.set_route && q.id != p.id);
    // 6 holds something the agent would not make and nobody uses it.
    assert_eq!(t.take_unused(), vec![6]);
}

#[test]
fn a_route_deleted_under_its_nexthop_is_set_through_it_again() {
    let a = cidr("10.244.1.0/24");
    let mut t = NexthopIds::new::<Cidr4>(
        [
            (5, Some(vx("10.244.1.0/24"))),
            (8, Some(vx("10.244.7.0/24"))),
        ],
        [],
        [],
    );
    assert_eq!(
        t.plan(a, vx("10.244.1.0/24")),
        NexthopPlan {
            id: 5,
            set_nexthop: false,
            set_route: true
        }
    );
    assert_eq!(t.take_unused(), vec![8]);
    assert!(t.take_unused().is_empty());
}

fn peer6(name: &str, cidr: &str, cidr6: &str, mac: u8, ip: u8) -> Peer {
    Peer {
        pod_cidr6: Some(Cidr6::parse_network(cidr6).unwrap()),
        ..peer(name, cidr, mac, ip)
    }
}

fn c6(s: &str) -> Cidr6 {
    Cidr6::parse_network(s).unwrap()
}

fn ip6(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

#[test]
fn ipv6_side_is_a_route_and_neighbour_over_the_same_fdb_entry() {
    let lan = Cidr4::parse_network("192.168.0.0/24").unwrap();
    let p = peer6("a", "10.244.1.0/24", "fd00:10:244:1::/64", 1, 2);
    let mac = Mac([2, 0, 0, 0, 0, 1]);
    // Direct routing does not apply to IPv6: no IPv6 on the underlay.
    for want in [
        desired(std::slice::from_ref(&p)),
        desired_direct(std::slice::from_ref(&p), &[lan]),
    ] {
        assert_eq!(want.routes6.len(), 1);
        assert_eq!(
            want.routes6[&c6("fd00:10:244:1::/64")],
            ip6("fd00:10:244:1::")
        );
        assert!(via_vxlan(c6("fd00:10:244:1::/64"), ip6("fd00:10:244:1::")));
        assert_eq!(want.neighbours6[&ip6("fd00:10:244:1::")], mac);
        assert_eq!(want.fdb.len(), 1, "one FDB entry for both families");
    }
    let acts = diff(&desired(std::slice::from_ref(&p)), &OverlayState::default());
    assert_eq!(
        acts,
        vec![
            Action::SetFdb(mac, Ipv4Addr::new(192, 168, 0, 2).into()),
            Action::SetNeighbour(Ipv4Addr::new(10, 244, 1, 0), mac),
            Action::SetNeighbour6(ip6("fd00:10:244:1::"), mac),
            Action::SetRoute(cidr("10.244.1.0/24"), Ipv4Addr::new(10, 244, 1, 0)),
            Action::SetRoute6(c6("fd00:10:244:1::/64"), ip6("fd00:10:244:1::")),
        ]
    );
    // What the fast path mirrors: only what the kernel backs whole.
    let mut have = desired(std::slice::from_ref(&p));
    assert_eq!(
        have.remotes6(),
        vec![Remote {
            pod_cidr: c6("fd00:10:244:1::/64"),
            vtep_mac: mac,
            host_ip: Ipv4Addr::new(192, 168, 0, 2),
        }]
    );
    have.neighbours6.clear();
    assert!(have.remotes6().is_empty());
}

#[test]
fn a_node_gaining_and_losing_its_ipv6_podcidr() {
    let v4 = desired(&[peer("a", "10.244.1.0/24", 1, 2)]);
    let dual = desired(&[peer6("a", "10.244.1.0/24", "fd00:10:244:1::/64", 1, 2)]);
    let gain = diff(&dual, &v4);
    assert_eq!(
        gain,
        vec![
            Action::SetNeighbour6(ip6("fd00:10:244:1::"), Mac([2, 0, 0, 0, 0, 1])),
            Action::SetRoute6(c6("fd00:10:244:1::/64"), ip6("fd00:10:244:1::")),
        ]
    );
    let lose = diff(&v4, &dual);
    assert_eq!(
        lose,
        vec![
            Action::DelRoute6(c6("fd00:10:244:1::/64")),
            Action::DelNeighbour6(ip6("fd00:10:244:1::")),
        ]
    );
    // A moved IPv6 podCIDR: old route and neighbour go first.
    let moved = desired(&[peer6("a", "10.244.1.0/24", "fd00:10:244:9::/64", 1, 2)]);
    let acts = diff(&moved, &dual);
    assert!(acts[0].is_delete() && acts[1].is_delete());
    let mut s = dual.clone();
    apply(&mut s, &acts);
    assert_eq!(s, moved);
    // The deleted node takes both families along.
    let gone = diff(&OverlayState::default(), &dual);
    assert_eq!(gone.len(), 5);
    assert!(gone.iter().all(Action::is_delete));
}

#[test]
fn ipv6_routes_share_the_nexthop_table() {
    let a = c6("fd00:10:244:1::/64");
    let hop = Hop::of_route(a, ip6("fd00:10:244:1::"));
    assert!(!hop.direct);
    assert_eq!(hop.gateway, IpAddr::V6(ip6("fd00:10:244:1::")));
    let v4 = cidr("10.244.1.0/24");
    let mut t = NexthopIds::new::<AnyCidr>([], [], []);
    let p4 = t.plan(v4, vx("10.244.1.0/24"));
    let p6 = t.plan(a, hop);
    assert_ne!(p4.id, p6.id, "one nexthop per route, whatever its family");
    assert!(p6.set_nexthop && p6.set_route);
    assert_eq!(t.route(a), Some((p6.id, Some(hop))));
    assert_eq!(t.release(a), Some(p6.id));
    // A restarted agent reads the IPv6 route's nexthop back.
    let t = NexthopIds::new([(p6.id, Some(hop))], [], [(AnyCidr::from(a), p6.id)]);
    assert_eq!(t.route(a), Some((p6.id, Some(hop))));
}

#[test]
fn ipv6_underlay_peers_are_a_route_neighbour_and_fdb_entry_on_vxlan6() {
    use mycni_common::node::{Peer6, Underlay6};
    let p = |n: u8| Peer6 {
        name: format!("p{n}"),
        pod_cidr6: Cidr6::parse_network(&format!("fd00:10:244:{n}::/64")).unwrap(),
        underlay6: Underlay6 {
            host_ip: format!("fd00:77::{n}").parse().unwrap(),
            vtep_mac: Mac([2, 0, 0, 0, 6, n]),
        },
    };
    let want = desired_underlay6(&[p(1), p(2)]);
    let gw: Ipv6Addr = "fd00:10:244:1::".parse().unwrap();
    assert_eq!(want.routes6[&p(1).pod_cidr6], gw);
    assert_eq!(want.neighbours6[&gw], Mac([2, 0, 0, 0, 6, 1]));
    assert_eq!(
        want.fdb6[&Mac([2, 0, 0, 0, 6, 1])],
        "fd00:77::1".parse::<Ipv6Addr>().unwrap()
    );
    // Nothing of vxlan.1's IPv4 side.
    assert!(want.routes.is_empty() && want.neighbours.is_empty() && want.fdb.is_empty());
    let acts = diff(&want, &OverlayState::default());
    assert!(acts.contains(&Action::SetFdb(
        Mac([2, 0, 0, 0, 6, 2]),
        "fd00:77::2".parse::<Ipv6Addr>().unwrap().into()
    )));
    // FDB before neighbour before route, as on vxlan.1.
    let pos = |f: fn(&Action) -> bool| acts.iter().position(f).unwrap();
    assert!(
        pos(|a| matches!(a, Action::SetFdb(..))) < pos(|a| matches!(a, Action::SetNeighbour6(..)))
    );
    assert!(
        pos(|a| matches!(a, Action::SetNeighbour6(..)))
            < pos(|a| matches!(a, Action::SetRoute6(..)))
    );
    let mut have = OverlayState::default();
    apply(&mut have, &acts);
    assert_eq!(have, want);
    // A moved host address is one FDB replace; a peer gone, three deletes.
    let mut moved = p(2);
    moved.underlay6.host_ip = "fd00:77::99".parse().unwrap();
    let acts = diff(&desired_underlay6(&[p(1), moved]), &have);
    assert_eq!(
        acts,
        [Action::SetFdb(
            Mac([2, 0, 0, 0, 6, 2]),
            "fd00:77::99".parse::<Ipv6Addr>().unwrap().into()
        )]
    );
    let acts = diff(&desired_underlay6(&[p(1)]), &have);
    assert_eq!(acts.len(), 3, "{acts:?}");
    assert!(acts.iter().all(Action::is_delete));
    apply(&mut have, &acts);
    assert_eq!(have, desired_underlay6(&[p(1)]));
}

#[test]
fn the_overlays_desire_is_the_selection_and_both_devices_states() {
    use mycni_common::contract::{ANNOTATION_HOST_IP, ANNOTATION_VTEP_MAC};
    use mycni_common::net::{ClusterCidrs, PodCidrs};
    use mycni_common::node::NodeView;

    use super::room::desire;

    let node = |name: &str, c: &str, n: u8| NodeView {
        name: name.into(),
        pod_cidr: Some(c.into()),
        pod_cidrs: vec![],
        annotations: [
            (ANNOTATION_VTEP_MAC, format!("02:00:00:00:00:{n:02x}")),
            (ANNOTATION_HOST_IP, format!("192.168.0.{n}")),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect(),
    };
    let nodes = [
        node("me", "10.244.0.0/24", 1),
        node("a", "10.244.1.0/24", 2),
        NodeView {
            name: "b".into(),
            ..NodeView::default()
        },
    ];
    let d = desire(
        &nodes,
        "me",
        PodCidrs::from(cidr("10.244.0.0/24")),
        ClusterCidrs::from(cidr("10.244.0.0/16")),
        &[],
    );
    assert_eq!(d.peers, [peer("a", "10.244.1.0/24", 2, 2)]);
    assert_eq!(d.want, desired(&d.peers));
    assert_eq!(d.want6, OverlayState::default());
    let rejected: Vec<(&str, &str)> = d
        .rejected
        .iter()
        .map(|(n, r)| (n.as_str(), r.reason()))
        .collect();
    assert_eq!(rejected, [("b", "incomplete")]);
    assert_eq!(
        d.hosts().collect::<Vec<_>>(),
        [Ipv4Addr::new(192, 168, 0, 2)]
    );
    assert_eq!(d.hosts6().count(), 0);
}
