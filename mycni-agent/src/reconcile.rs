//! Desired overlay state from the peers, and the diff against what the
//! kernel holds, as pure functions: the only place that decides what to
//! add, replace or delete.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use crate::peers::{Cidr, Mac, Peer};

/// What the agent owns on `vxlan.1` for its peers. Routes are keyed by
/// destination, neighbours by IP, FDB entries by MAC: one value each, so a
/// changed MAC, host IP or podCIDR shows up as a replace or delete+add.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OverlayState {
    /// podCIDR -> gateway: podCIDR.0 `onlink` via vxlan.1, or, for a peer
    /// on a directly connected underlay subnet under direct routing, the
    /// peer's host IP via the underlay device (no encapsulation).
    pub routes: BTreeMap<Cidr, Ipv4Addr>,
    /// gateway -> VTEP MAC, permanent.
    pub neighbours: BTreeMap<Ipv4Addr, Mac>,
    /// VTEP MAC -> host IP, permanent `self` FDB entry.
    pub fdb: BTreeMap<Mac, Ipv4Addr>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Action {
    // Deletes sort first: a podCIDR moving between nodes must free the old
    // entries before the new ones claim them.
    DelRoute(Cidr),
    DelNeighbour(Ipv4Addr),
    DelFdb(Mac),
    /// Add or replace (NLM_F_REPLACE semantics).
    SetFdb(Mac, Ipv4Addr),
    SetNeighbour(Ipv4Addr, Mac),
    SetRoute(Cidr, Ipv4Addr),
}

impl Action {
    pub fn is_delete(&self) -> bool {
        matches!(
            self,
            Action::DelRoute(_) | Action::DelNeighbour(_) | Action::DelFdb(_)
        )
    }
}

pub fn desired(peers: &[Peer]) -> OverlayState {
    desired_direct(peers, &[])
}

/// [`desired`] under direct routing (flannel's DirectRouting, Calico's
/// CrossSubnet): a peer whose host IP lies in one of `direct` (the
/// underlay's own subnets) is routed straight to its host IP. Its FDB entry
/// stays, so VXLAN it still sends (a peer not in direct mode) is accepted.
pub fn desired_direct(peers: &[Peer], direct: &[Cidr]) -> OverlayState {
    let mut s = OverlayState::default();
    for p in peers {
        if direct.iter().any(|d| d.contains(p.host_ip)) {
            s.routes.insert(p.pod_cidr, p.host_ip);
        } else {
            s.routes.insert(p.pod_cidr, p.gateway());
            s.neighbours.insert(p.gateway(), p.vtep_mac);
        }
        s.fdb.insert(p.vtep_mac, p.host_ip);
    }
    s
}

/// Whether a route of [`OverlayState::routes`] goes through `vxlan.1`
/// (gateway podCIDR.0) rather than straight over the underlay.
pub fn via_vxlan(cidr: Cidr, gw: Ipv4Addr) -> bool {
    gw == cidr.network()
}

fn diff_map<K: Ord + Clone, V: PartialEq + Clone>(
    want: &BTreeMap<K, V>,
    have: &BTreeMap<K, V>,
    del: impl Fn(K) -> Action,
    set: impl Fn(K, V) -> Action,
    out: &mut Vec<Action>,
) {
    for k in have.keys() {
        if !want.contains_key(k) {
            out.push(del(k.clone()));
        }
    }
    for (k, v) in want {
        if have.get(k) != Some(v) {
            out.push(set(k.clone(), v.clone()));
        }
    }
}

/// The actions that turn `have` into `want`, deletes first, FDB before
/// neighbours before routes on the way in (the route's gateway resolves
/// through the neighbour, whose MAC resolves through the FDB).
pub fn diff(want: &OverlayState, have: &OverlayState) -> Vec<Action> {
    let mut out = Vec::new();
    diff_map(
        &want.routes,
        &have.routes,
        Action::DelRoute,
        Action::SetRoute,
        &mut out,
    );
    diff_map(
        &want.neighbours,
        &have.neighbours,
        Action::DelNeighbour,
        Action::SetNeighbour,
        &mut out,
    );
    diff_map(
        &want.fdb,
        &have.fdb,
        Action::DelFdb,
        Action::SetFdb,
        &mut out,
    );
    out.sort();
    out
}

/// Applies actions to a state, as the kernel would: used by tests to check
/// that a diff converges.
pub fn apply(state: &mut OverlayState, actions: &[Action]) {
    for a in actions {
        match a {
            Action::DelRoute(c) => {
                state.routes.remove(c);
            }
            Action::DelNeighbour(ip) => {
                state.neighbours.remove(ip);
            }
            Action::DelFdb(m) => {
                state.fdb.remove(m);
            }
            Action::SetFdb(m, ip) => {
                state.fdb.insert(*m, *ip);
            }
            Action::SetNeighbour(ip, m) => {
                state.neighbours.insert(*ip, *m);
            }
            Action::SetRoute(c, gw) => {
                state.routes.insert(*c, *gw);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(name: &str, cidr: &str, mac: u8, ip: u8) -> Peer {
        Peer {
            name: name.into(),
            pod_cidr: Cidr::parse_network(cidr).unwrap(),
            vtep_mac: Mac([2, 0, 0, 0, 0, mac]),
            host_ip: Ipv4Addr::new(192, 168, 0, ip),
        }
    }

    #[test]
    fn fresh_node_adds_everything_in_dependency_order() {
        let want = desired(&[peer("a", "10.244.1.0/24", 1, 2)]);
        let acts = diff(&want, &OverlayState::default());
        assert_eq!(
            acts,
            vec![
                Action::SetFdb(Mac([2, 0, 0, 0, 0, 1]), Ipv4Addr::new(192, 168, 0, 2)),
                Action::SetNeighbour(Ipv4Addr::new(10, 244, 1, 0), Mac([2, 0, 0, 0, 0, 1])),
                Action::SetRoute(
                    Cidr::parse_network("10.244.1.0/24").unwrap(),
                    Ipv4Addr::new(10, 244, 1, 0)
                ),
            ]
        );
    }

    #[test]
    fn direct_peers_are_routed_to_their_host_without_a_neighbour() {
        let lan = Cidr::parse_network("192.168.0.0/24").unwrap();
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
                Ipv4Addr::new(192, 168, 0, 9)
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
            Cidr::parse_network("10.244.1.0/24").unwrap()
        )));
        assert!(acts.contains(&Action::DelNeighbour(Ipv4Addr::new(10, 244, 1, 0))));
        assert!(acts[0].is_delete());
        let mut s = old.clone();
        apply(&mut s, &acts);
        assert_eq!(s, new_cidr);
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
}
