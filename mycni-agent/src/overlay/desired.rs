//! Desired overlay state from the peers, and the diff against what the
//! kernel holds, as pure functions: the only place that decides what to
//! add, replace or delete.

use std::collections::BTreeMap;
use std::net::IpAddr;

use mycni_common::net::Cidr4;
use mycni_common::node::{Peer, Peer6};

use crate::topology::{Action, OverlayState};

pub fn desired(peers: &[Peer]) -> OverlayState {
    desired_direct(peers, &[])
}

/// [`desired`] under direct routing (flannel's DirectRouting, Calico's
/// CrossSubnet): a peer whose host IP lies in one of `direct` (the
/// underlay's own subnets) is routed straight to its host IP. Its FDB entry
/// stays, so VXLAN it still sends (a peer not in direct mode) is accepted.
pub fn desired_direct(peers: &[Peer], direct: &[Cidr4]) -> OverlayState {
    let mut s = OverlayState::default();
    for p in peers {
        if direct.iter().any(|d| d.contains(p.host_ip)) {
            s.routes.insert(p.pod_cidr, p.host_ip);
        } else {
            s.routes.insert(p.pod_cidr, p.gateway());
            s.neighbours.insert(p.gateway(), p.vtep_mac);
        }
        if let Some(c6) = p.pod_cidr6 {
            s.routes6.insert(c6, c6.network());
            s.neighbours6.insert(c6.network(), p.vtep_mac);
        }
        s.fdb.insert(p.vtep_mac, p.host_ip);
    }
    s
}

/// What the agent owns on `vxlan6.1` for the peers reached over the IPv6
/// underlay: per peer, its IPv6 podCIDR `via` its first address `onlink`,
/// a permanent neighbour for that address to its `vxlan6.1` MAC, and the
/// FDB entry sending that MAC to its IPv6 host address: `vxlan.1`'s IPv6
/// side, over the other device.
pub(crate) fn desired_underlay6(peers: &[Peer6]) -> OverlayState {
    let mut s = OverlayState::default();
    for p in peers {
        let gw = p.pod_cidr6.network();
        s.routes6.insert(p.pod_cidr6, gw);
        s.neighbours6.insert(gw, p.underlay6.vtep_mac);
        s.fdb6.insert(p.underlay6.vtep_mac, p.underlay6.host_ip);
    }
    s
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
        |m, ip| Action::SetFdb(m, ip.into()),
        &mut out,
    );
    diff_map(
        &want.fdb6,
        &have.fdb6,
        Action::DelFdb,
        |m, ip| Action::SetFdb(m, ip.into()),
        &mut out,
    );
    diff_map(
        &want.routes6,
        &have.routes6,
        Action::DelRoute6,
        Action::SetRoute6,
        &mut out,
    );
    diff_map(
        &want.neighbours6,
        &have.neighbours6,
        Action::DelNeighbour6,
        Action::SetNeighbour6,
        &mut out,
    );
    out.sort();
    out
}

/// [`diff`] of only the entries whose keys `keys` has (its values are not
/// read): what an incremental pass compares, when nothing else can differ.
pub(crate) fn diff_within(
    want: &OverlayState,
    have: &OverlayState,
    keys: &OverlayState,
) -> Vec<Action> {
    diff(&within(want, keys), &within(have, keys))
}

/// The entries of `s` whose keys `keys` has.
fn within(s: &OverlayState, keys: &OverlayState) -> OverlayState {
    fn pick<K: Ord + Clone, V: Clone, W>(
        m: &BTreeMap<K, V>,
        keys: &BTreeMap<K, W>,
    ) -> BTreeMap<K, V> {
        keys.keys()
            .filter_map(|k| Some((k.clone(), m.get(k)?.clone())))
            .collect()
    }
    OverlayState {
        routes: pick(&s.routes, &keys.routes),
        neighbours: pick(&s.neighbours, &keys.neighbours),
        fdb: pick(&s.fdb, &keys.fdb),
        routes6: pick(&s.routes6, &keys.routes6),
        neighbours6: pick(&s.neighbours6, &keys.neighbours6),
        fdb6: pick(&s.fdb6, &keys.fdb6),
    }
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
                state.fdb6.remove(m);
            }
            Action::SetFdb(m, IpAddr::V4(ip)) => {
                state.fdb.insert(*m, *ip);
            }
            Action::SetFdb(m, IpAddr::V6(ip)) => {
                state.fdb6.insert(*m, *ip);
            }
            Action::SetNeighbour(ip, m) => {
                state.neighbours.insert(*ip, *m);
            }
            Action::SetRoute(c, gw) => {
                state.routes.insert(*c, *gw);
            }
            Action::DelRoute6(c) => {
                state.routes6.remove(c);
            }
            Action::DelNeighbour6(ip) => {
                state.neighbours6.remove(ip);
            }
            Action::SetNeighbour6(ip, m) => {
                state.neighbours6.insert(*ip, *m);
            }
            Action::SetRoute6(c, gw) => {
                state.routes6.insert(*c, *gw);
            }
        }
    }
}
