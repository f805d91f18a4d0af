//! An incremental pass yields exactly what a full one would: random Node
//! churn (podCIDRs that overlap, VTEP MACs that repeat, IPv6 sides and
//! underlays, incomplete Nodes, this node itself, adds and deletes),
//! each step's [`Desire::update`] compared with [`desire`] over the same
//! Nodes, and its `touched` keys with the whole diff.

use std::net::Ipv4Addr;
use std::sync::Arc;

use mycni_common::contract::{
    ANNOTATION_HOST_IP, ANNOTATION_HOST_IP6, ANNOTATION_VTEP_MAC, ANNOTATION_VTEP_MAC6,
};
use mycni_common::net::{Cidr4, ClusterCidrs, PodCidrs};
use mycni_common::node::NodeView;

use super::desired::{diff, diff_within};
use super::incremental::{Desire, Update};
use super::room::desire;

/// A small deterministic generator (xorshift): the same churn every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A random Node `i`. Its podCIDRs, VTEP MACs and IPv6 side are its own
/// unless `rare`: then each is drawn on its own from a small pool shared
/// by all, with wider prefixes now and then, so podCIDRs of either family
/// overlap each other's or this node's, and MACs repeat, independently.
fn node(rng: &mut Rng, i: u64, rare: bool) -> NodeView {
    let mut draw = |own: u64, pool: u64| if rare { rng.below(pool) } else { own };
    let c4 = draw(16 + i, 8);
    let c6 = draw(16 + i, 8);
    let m4 = draw(16 + i, 8);
    let m6 = draw(16 + i, 8);
    let wide = if rare { rng.below(4) } else { 3 };
    let prefix = [22, 23, 24, 24][wide as usize % 4];
    let prefix6 = [56, 60, 64, 64][rng.below(4) as usize];
    let prefix6 = if rare { prefix6 } else { 64 };
    // The rare ones in 10.244.0-127, each Node's own /26 above.
    let v4 = if rare {
        format!("10.244.{}.0/{prefix}", (c4 * 4) % 128)
    } else {
        format!("10.244.{}.{}/26", 128 + i / 4, (i % 4) * 64)
    };
    let mut cidrs = vec![v4];
    let ipv6_only = rng.below(6) == 0;
    if ipv6_only || rng.below(if rare { 2 } else { 3 }) == 0 {
        // Pool 0 is this node's own /64's neighbourhood (fd00:ff::/64).
        let at = if c6 == 0 { 0xff } else { c6 << 8 };
        cidrs.push(format!("fd00:{at:x}::/{prefix6}"));
    }
    let mut annotations = vec![
        (
            ANNOTATION_VTEP_MAC,
            format!("02:00:00:00:{:02x}:{:02x}", m4 >> 8, m4 & 0xff),
        ),
        (
            ANNOTATION_HOST_IP,
            format!("192.168.{}.{}", i / 200, 1 + i % 200),
        ),
    ];
    if ipv6_only || rng.below(if rare { 2 } else { 3 }) == 0 {
        annotations.push((
            ANNOTATION_VTEP_MAC6,
            format!("02:00:00:01:{:02x}:{:02x}", m6 >> 8, m6 & 0xff),
        ));
        annotations.push((ANNOTATION_HOST_IP6, format!("fd10::{:x}", i + 1)));
    }
    if rng.below(10) == 0 {
        // Incomplete: no VTEP MAC yet.
        annotations.remove(0);
    }
    if ipv6_only {
        // No IPv4 host, no IPv4 podCIDR: reached over the IPv6 underlay.
        annotations.retain(|(k, _)| *k != ANNOTATION_HOST_IP);
        cidrs.remove(0);
    }
    NodeView {
        name: format!("n{i:03}"),
        pod_cidr: None,
        pod_cidrs: cidrs,
        annotations: annotations
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
    }
}

fn me() -> NodeView {
    NodeView {
        name: "me".into(),
        pod_cidr: Some("10.244.250.0/24".into()),
        pod_cidrs: vec![],
        annotations: Default::default(),
    }
}

fn own() -> PodCidrs {
    PodCidrs {
        v4: Some("10.244.250.0/24".parse().expect("cidr")),
        v6: Some("fd00:ff::/64".parse().expect("cidr")),
    }
}

fn cluster() -> ClusterCidrs {
    ClusterCidrs {
        v4: Some("10.244.0.0/16".parse().expect("cidr")),
        v6: Some("fd00::/8".parse().expect("cidr")),
    }
}

fn update(
    d: &mut Desire<NodeView>,
    nodes: &[Arc<NodeView>],
    direct: &[Cidr4],
    full: bool,
) -> Update {
    d.update(
        nodes,
        (|n: &NodeView| n.name.as_str(), NodeView::clone),
        super::Inputs {
            own_name: "me".into(),
            own: own(),
            cluster: cluster(),
            direct: direct.to_vec(),
        },
        full,
    )
}

/// Runs `steps` of churn from `seed`; how many passes were incremental.
fn churn(seed: u64, size: u64, steps: usize, rare_every: u64, direct: &[Cidr4]) -> usize {
    let mut rng = Rng(seed);
    let mut nodes: Vec<Arc<NodeView>> = (0..size)
        .map(|i| Arc::new(node(&mut rng, i, false)))
        .collect();
    nodes.push(Arc::new(me()));
    let mut d = Desire::default();
    let mut next = size;
    let mut incremental = 0;
    let mut last_want = None;
    for step in 0..steps {
        let full = step == 0 || rng.below(20) == 0;
        let u = update(&mut d, &nodes, direct, full);
        let views: Vec<NodeView> = nodes.iter().map(|n| (**n).clone()).collect();
        let whole = desire(&views, "me", own(), cluster(), direct);
        assert_eq!(u.desired, whole, "step {step} (seed {seed})");
        if let (Some(keys), Some(was)) = (&u.touched, &last_want) {
            incremental += 1;
            assert_eq!(
                diff_within(&u.desired.want, was, keys),
                diff(&u.desired.want, was),
                "step {step}: a change outside the touched keys"
            );
        }
        if full {
            assert!(u.touched.is_none());
        }
        last_want = Some(u.desired.want.clone());
        // A failed pass (now and then) keeps nothing: the next is whole.
        if rng.below(12) == 0 {
            last_want = None;
        } else {
            d.keep(u.desired);
        }
        // Churn: change, add or delete a Node or two, or this node's own.
        for _ in 0..1 + rng.below(2) {
            let k = rng.below(nodes.len() as u64) as usize;
            let rare = rare_every > 0 && rng.below(rare_every) == 0;
            match rng.below(10) {
                0 if nodes[k].name != "me" => {
                    nodes.remove(k);
                }
                1 => {
                    nodes.push(Arc::new(node(&mut rng, next, rare)));
                    next += 1;
                }
                2 => {
                    // The same content in a new object: no change at all.
                    nodes[k] = Arc::new((*nodes[k]).clone());
                }
                _ if nodes[k].name == "me" => {
                    let mut n = (*nodes[k]).clone();
                    n.annotations.insert("mycni.dev/x".into(), step.to_string());
                    nodes[k] = Arc::new(n);
                }
                _ => {
                    let i: u64 = nodes[k].name[1..].parse().expect("n<i>");
                    nodes[k] = Arc::new(node(&mut rng, i, rare));
                }
            }
        }
        // Mostly the watch's order; shuffled now and then (a relist).
        if rng.below(25) == 0 {
            let a = rng.below(nodes.len() as u64) as usize;
            nodes.swap(0, a);
        }
    }
    eprintln!("seed {seed}: {incremental} incremental passes of {steps}");
    incremental
}

#[test]
fn incremental_passes_equal_full_ones_on_a_clean_cluster() {
    for seed in [1, 7, 42, 1234] {
        let n = churn(seed, 40, 300, 0, &[]);
        assert!(n > 150, "seed {seed}: only {n} incremental passes");
    }
}

#[test]
fn incremental_passes_equal_full_ones_through_conflicts() {
    // Overlaps and shared MACs come and go: passes fall back to whole
    // ones while they last, and must still be exact throughout.
    for seed in [3, 99, 2024] {
        let n = churn(seed, 40, 400, 12, &[]);
        assert!(n > 30, "seed {seed}: only {n} incremental passes");
    }
    // A few Nodes, most changes drawing from the shared pools: conflicts
    // start and end often, each start in an incremental pass.
    for seed in 1..=12 {
        let n = churn(seed, 10, 500, 2, &[]);
        assert!(n > 10, "seed {seed}: only {n} incremental passes");
    }
}

#[test]
fn incremental_passes_equal_full_ones_under_direct_routing() {
    let direct: Vec<Cidr4> = vec![Cidr4::new(Ipv4Addr::new(192, 168, 0, 0), 24).expect("cidr")];
    let n = churn(5, 40, 300, 12, &direct);
    assert!(n > 30, "only {n} incremental passes");
}

#[test]
fn other_inputs_changing_means_a_whole_pass() {
    let mut rng = Rng(11);
    let nodes: Vec<Arc<NodeView>> = (0..10)
        .map(|i| Arc::new(node(&mut rng, i, false)))
        .collect();
    let mut d = Desire::default();
    let u = update(&mut d, &nodes, &[], false);
    assert!(u.touched.is_none(), "the first pass is whole");
    d.keep(u.desired);
    let u = update(&mut d, &nodes, &[], false);
    assert_eq!(u.touched, Some(Default::default()), "nothing changed");
    assert!(u.desired.want.routes.len() > 5);
    d.keep(u.desired);
    // Direct routing's subnets changed: whole, and exact.
    let direct = [Cidr4::new(Ipv4Addr::new(192, 168, 0, 0), 24).expect("cidr")];
    let u = update(&mut d, &nodes, &direct, false);
    assert!(u.touched.is_none());
    let views: Vec<NodeView> = nodes.iter().map(|n| (**n).clone()).collect();
    assert_eq!(u.desired, desire(&views, "me", own(), cluster(), &direct));
    // A full pass over an unchanged state says so (drift, if it acts).
    d.keep(u.desired);
    let u = update(&mut d, &nodes, &direct, true);
    assert!(u.touched.is_none() && u.same_as_last);
}

/// The Nodes in the same places but one removed and another added in
/// its place (as many as before): the gone one's share leaves, the new
/// one's comes, exactly as a whole computation has it. Then many places
/// at once (a relist's order) and a Node moved to another place.
#[test]
fn nodes_replaced_in_place_are_found_by_their_places() {
    let mut rng = Rng(17);
    let mut nodes: Vec<Arc<NodeView>> = (0..30)
        .map(|i| Arc::new(node(&mut rng, i, false)))
        .collect();
    nodes.push(Arc::new(me()));
    let whole = |nodes: &[Arc<NodeView>]| {
        let views: Vec<NodeView> = nodes.iter().map(|n| (**n).clone()).collect();
        desire(&views, "me", own(), cluster(), &[])
    };
    let mut d = Desire::default();
    let u = update(&mut d, &nodes, &[], false);
    d.keep(u.desired);
    // n003 gone, n100 in its place.
    let gone = nodes[3].name.clone();
    nodes[3] = Arc::new(node(&mut rng, 100, false));
    let u = update(&mut d, &nodes, &[], false);
    assert!(u.touched.is_some(), "one Node out, one in: incremental");
    assert_eq!(u.desired, whole(&nodes));
    assert!(!u.desired.peers.iter().any(|p| p.name == gone));
    d.keep(u.desired);
    // Two Nodes trade places, unchanged: nothing to do.
    nodes.swap(5, 9);
    let u = update(&mut d, &nodes, &[], false);
    assert_eq!(u.touched, Some(Default::default()));
    assert_eq!(u.desired, whole(&nodes));
    d.keep(u.desired);
    // Every place differs, the same Nodes (a relist's order): nothing
    // changed, and exact.
    nodes.reverse();
    let u = update(&mut d, &nodes, &[], false);
    assert_eq!(u.desired, whole(&nodes));
    d.keep(u.desired);
    // And places kept from there on.
    let i: u64 = nodes[7].name[1..].parse().expect("n<i>");
    nodes[7] = Arc::new(node(&mut rng, i, false));
    let u = update(&mut d, &nodes, &[], false);
    assert!(u.touched.is_some());
    assert_eq!(u.desired, whole(&nodes));
}
