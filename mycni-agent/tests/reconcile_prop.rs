//! Property tests of the agent's pure core (Node validation, desired state,
//! diff): whatever sequence of Node events arrives, and whatever someone
//! else does to the kernel in between, one pass brings the kernel to
//! exactly what a fresh start computes from the final Nodes; the result
//! does not depend on the order Nodes are listed in; and every programmed
//! podCIDR, of either family, leads to the host of the Node that owns it.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use mycni_agent::overlay::{apply, desired, diff};
use mycni_agent::topology::OverlayState;
use mycni_common::contract::{ANNOTATION_HOST_IP, ANNOTATION_VTEP_MAC};
use mycni_common::net::{Cidr4, Cidr6, ClusterCidrs, Mac, PodCidrs};
use mycni_common::node::{NodeView, parse_peer, select_peers};
use proptest::prelude::*;

const OWN: &str = "node-0";

fn cluster() -> ClusterCidrs {
    ClusterCidrs {
        v4: Some(Cidr4::parse_network("10.244.0.0/16").expect("valid")),
        v6: Cidr6::parse_network("fd00:10:244::/56").ok(),
    }
}

/// Small pools so that collisions (same podCIDR, same MAC, overlapping
/// ranges, garbage) happen often.
fn node_strategy() -> impl Strategy<Value = NodeView> {
    let name = (0u8..8).prop_map(|i| format!("node-{i}"));
    let cidr = prop_oneof![
        6 => (1u8..7).prop_map(|i| Some(format!("10.244.{i}.0/24"))),
        1 => Just(Some("10.244.0.0/23".to_string())),
        1 => Just(Some("10.245.1.0/24".to_string())),
        1 => Just(Some("garbage".to_string())),
        1 => Just(None),
    ];
    let mac = prop_oneof![
        6 => (1u8..7).prop_map(|i| Some(format!("02:00:00:00:00:{i:02x}"))),
        1 => Just(Some("ff:ff:ff:ff:ff:ff".to_string())),
        1 => Just(Some("zz".to_string())),
        1 => Just(None),
    ];
    let cidr6 = prop_oneof![
        4 => (1u8..7).prop_map(|i| Some(format!("fd00:10:244:{i}::/64"))),
        1 => Just(Some("fd00:10:244:2::/63".to_string())),
        1 => Just(Some("fd00:10:244::/64".to_string())),
        1 => Just(Some("fd00:99::/64".to_string())),
        1 => Just(Some("fd00::zz/64".to_string())),
        3 => Just(None),
    ];
    let ip = prop_oneof![
        6 => (1u8..7).prop_map(|i| Some(format!("192.168.0.{i}"))),
        1 => Just(Some("0.0.0.0".to_string())),
        1 => Just(Some("not-an-ip".to_string())),
        1 => Just(None),
    ];
    (name, cidr, cidr6, mac, ip).prop_map(|(name, pod_cidr, cidr6, mac, ip)| {
        let mut annotations = BTreeMap::new();
        if let Some(m) = mac {
            annotations.insert(ANNOTATION_VTEP_MAC.to_string(), m);
        }
        if let Some(i) = ip {
            annotations.insert(ANNOTATION_HOST_IP.to_string(), i);
        }
        // A dual-stack Node lists both in podCIDRs (IPv6 first half the
        // time); a single-stack one has podCIDR alone, as older ones do.
        let pod_cidrs = match (&pod_cidr, cidr6) {
            (Some(c4), Some(c6)) if c4.len() % 2 == 0 => vec![c6, c4.clone()],
            (Some(c4), Some(c6)) => vec![c4.clone(), c6],
            (None, Some(c6)) => vec![c6],
            (_, None) => vec![],
        };
        NodeView {
            name,
            pod_cidr,
            pod_cidrs,
            annotations,
        }
    })
}

/// A cluster snapshot: Nodes by name (the API has one object per name).
fn snapshot() -> impl Strategy<Value = Vec<NodeView>> {
    prop::collection::vec(node_strategy(), 0..10).prop_map(|v| {
        let by_name: BTreeMap<String, NodeView> =
            v.into_iter().map(|n| (n.name.clone(), n)).collect();
        by_name.into_values().collect()
    })
}

fn own() -> PodCidrs {
    PodCidrs {
        v4: Cidr4::parse_network("10.244.0.0/24").ok(),
        v6: Cidr6::parse_network("fd00:10:244::/64").ok(),
    }
}

fn want(nodes: &[NodeView]) -> OverlayState {
    desired(&select_peers(nodes, OWN, own(), cluster()).0)
}

/// Someone else's hand on the kernel: entries deleted, bogus ones added.
fn drift() -> impl Strategy<Value = (Vec<usize>, Vec<(u8, u8)>)> {
    (
        prop::collection::vec(0usize..64, 0..4),
        prop::collection::vec((1u8..250, 1u8..250), 0..3),
    )
}

fn apply_drift(k: &mut OverlayState, (dels, adds): &(Vec<usize>, Vec<(u8, u8)>)) {
    for d in dels {
        if let Some(c) = k.routes.keys().nth(d % 8).copied() {
            k.routes.remove(&c);
        }
        if let Some(ip) = k.neighbours.keys().nth(d % 5).copied() {
            k.neighbours.remove(&ip);
        }
        if let Some(m) = k.fdb.keys().nth(d % 3).copied() {
            k.fdb.remove(&m);
        }
        if let Some(c) = k.routes6.keys().nth(d % 4).copied() {
            k.routes6.remove(&c);
        }
        if let Some(ip) = k.neighbours6.keys().nth(d % 6).copied() {
            k.neighbours6.remove(&ip);
        }
    }
    for (a, b) in adds {
        let c = Cidr4::parse_network(&format!("10.99.{a}.0/24")).expect("valid");
        k.routes.insert(c, Ipv4Addr::new(10, 99, *a, 0));
        k.neighbours
            .insert(Ipv4Addr::new(10, 98, *a, *b), Mac([2, 0, 0, 0, *a, *b]));
        k.fdb
            .insert(Mac([2, 1, 0, 0, *a, *b]), Ipv4Addr::new(172, 16, *a, *b));
        let gw6 = Ipv6Addr::new(0xfd99, u16::from(*a), 0, 0, 0, 0, 0, 0);
        k.routes6.insert(Cidr6::new(gw6, 64).expect("valid"), gw6);
        k.neighbours6.insert(gw6, Mac([2, 2, 0, 0, *a, *b]));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn any_event_sequence_converges_to_a_fresh_start(
        steps in prop::collection::vec((snapshot(), drift()), 1..8)
    ) {
        let mut kernel = OverlayState::default();
        for (nodes, d) in &steps {
            apply_drift(&mut kernel, d);
            let w = want(nodes);
            let actions = diff(&w, &kernel);
            apply(&mut kernel, &actions);
            // One pass is enough, and a second one has nothing to do.
            prop_assert_eq!(&kernel, &w);
            prop_assert!(diff(&w, &kernel).is_empty());
        }
        let last = &steps[steps.len() - 1].0;
        let mut fresh = OverlayState::default();
        let fresh_actions = diff(&want(last), &fresh);
        apply(&mut fresh, &fresh_actions);
        prop_assert_eq!(kernel, fresh);
    }

    #[test]
    fn the_order_nodes_arrive_in_does_not_matter(nodes in snapshot(), seed in any::<u64>()) {
        let mut shuffled = nodes.clone();
        let mut s = seed | 1;
        for i in (1..shuffled.len()).rev() {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            shuffled.swap(i, (s % (i as u64 + 1)) as usize);
        }
        prop_assert_eq!(want(&nodes), want(&shuffled));
    }

    #[test]
    fn every_programmed_range_leads_to_its_owner(nodes in snapshot()) {
        let w = want(&nodes);
        for (cidr, gw) in &w.routes {
            let mac = w.neighbours.get(gw);
            prop_assert!(mac.is_some(), "route {} via {} has no neighbour", cidr, gw);
            let host = mac.and_then(|m| w.fdb.get(m));
            // The valid Nodes (other than this one) that claim exactly this
            // range: there must be one, and traffic must go to its host.
            let owners: Vec<Ipv4Addr> = nodes
                .iter()
                .filter(|n| n.name != OWN)
                .filter_map(|n| parse_peer(n, cluster()).ok())
                .filter(|p| p.pod_cidr == *cidr)
                .map(|p| p.host_ip)
                .collect();
            prop_assert_eq!(owners.len(), 1, "{} claimed by {:?}", cidr, owners);
            let owner_ip = owners.first().copied();
            prop_assert_eq!(host.copied(), owner_ip, "traffic for {} would go to another host", cidr);
        }
        let whole: Vec<String> = select_peers(&nodes, OWN, own(), cluster())
            .1
            .into_iter()
            .filter(|(_, r)| !r.ipv6_side_only())
            .map(|(n, _)| n)
            .collect();
        for (cidr, gw) in &w.routes6 {
            let mac = w.neighbours6.get(gw);
            prop_assert!(mac.is_some(), "route {} via {} has no neighbour", cidr, gw);
            let host = mac.and_then(|m| w.fdb.get(m));
            let owners: Vec<Ipv4Addr> = nodes
                .iter()
                .filter(|n| n.name != OWN)
                .filter_map(|n| parse_peer(n, cluster()).ok())
                // A Node rejected as a whole (its IPv4 range or MAC
                // contested) claims nothing.
                .filter(|p| !whole.contains(&p.name))
                .filter(|p| p.pod_cidr6 == Some(*cidr))
                .map(|p| p.host_ip)
                .collect();
            prop_assert_eq!(owners.len(), 1, "{} claimed by {:?}", cidr, owners);
            prop_assert_eq!(host.copied(), owners.first().copied(), "traffic for {} would go to another host", cidr);
        }
    }
}
