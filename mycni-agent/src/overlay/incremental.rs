//! A Node event as an incremental pass: the desired state is kept between
//! passes, and an event pass recomputes only the Nodes whose object the
//! watch's cache replaced, instead of all of them (~8 ms at 5,000).
//!
//! Exactness is the rule: an incremental pass yields exactly the
//! [`Desired`] a full [`desire`] over the same Nodes would (tested against
//! it in `tests_incremental.rs`). Peer selection is per Node except for
//! the checks across Nodes (overlapping podCIDRs, shared VTEP MACs, and an
//! IPv6-only peer overlapping this node, which still takes part in them),
//! so a changed Node's share is what [`desire`] makes of it alone, as long
//! as none of those checks fires: when one did at the last full
//! computation, or would for a changed Node against the others, or the
//! inputs besides the Nodes changed (podCIDRs, cluster ranges, direct
//! routing's subnets), or many Nodes changed at once (a relist), the whole
//! state is computed again. So is it after any pass that failed: the
//! state is handed out for a pass and kept only when the pass succeeded.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use mycni_common::net::{Cidr4, ClusterCidrs, PodCidrs};
use mycni_common::node::{NodeView, Peer, Peer6, Reject, Selection, select_all};

use super::desired::{desired_direct, desired_underlay6};
use super::room::{Desired, desire};
use crate::topology::OverlayState;

/// More changed Nodes than this in one pass (a relist, a mass relabel):
/// computing all of them again is as cheap, and simpler.
const MAX_CHANGED: usize = 64;

/// What a pass's desired state was computed from, besides the Nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Inputs {
    pub own_name: String,
    pub own: PodCidrs,
    pub cluster: ClusterCidrs,
    /// The underlay's subnets under direct routing.
    pub direct: Vec<Cidr4>,
}

/// The overlay's desired state between passes, and the Nodes it was
/// computed from.
pub(crate) struct Desire<N> {
    /// Each Node as the last pass saw it, held so that the watch's cache
    /// replacing it (a new `Arc`) is what tells a change: an address alone
    /// could be reused by a later version once the old one is freed.
    seen: HashMap<String, Arc<N>>,
    /// The same Nodes in the order the last call was given them. The
    /// watch's cache keeps an unchanged Node in its place, so comparing
    /// pointers place by place finds the replaced ones without reading
    /// (and hashing) every Node's name: at 5,000 Nodes that read was
    /// ~1 ms of cache misses per pass.
    order: Vec<Arc<N>>,
    /// The last good pass's state and inputs; None after a failed pass,
    /// a full one being due.
    last: Option<(Inputs, Desired)>,
    /// The inputs of the state handed out, until it is kept.
    pending: Option<Inputs>,
}

/// A pass's desired state, as [`Desire::update`] hands it out.
#[derive(Debug)]
pub struct Update {
    pub desired: Desired,
    /// Which entries of `vxlan.1`'s state may differ from the last pass's:
    /// those of the changed Nodes' peers, before and after (only the keys
    /// matter). None: any (computed whole).
    pub touched: Option<OverlayState>,
    /// Computed whole, and `vxlan.1`'s state is the last good pass's: any
    /// change a full pass makes is drift.
    pub same_as_last: bool,
}

impl<N> Default for Desire<N> {
    fn default() -> Self {
        Desire {
            seen: HashMap::new(),
            order: Vec::new(),
            last: None,
            pending: None,
        }
    }
}

/// Whether `why` comes from a check across Nodes (or lets a rejected
/// Node take part in one): such a state is never updated incrementally.
fn across_nodes(why: &Reject) -> bool {
    matches!(
        why,
        Reject::OverlapsPeer(_)
            | Reject::OverlapsPeer6(_)
            | Reject::DuplicateVtepMac(_)
            | Reject::DuplicateVtepMac6(_)
            | Reject::OverlapsOwn6(_)
    )
}

impl<N> Desire<N> {
    /// The desired state for `nodes` (`name` and `view` read one) and
    /// `inputs`, and which entries may have changed since the last pass.
    /// `full`: a full pass, computed whole. Hand it back with
    /// [`Desire::keep`] once the pass succeeded.
    pub fn update(
        &mut self,
        nodes: &[Arc<N>],
        (name, view): (impl Fn(&N) -> &str, impl Fn(&N) -> NodeView),
        inputs: Inputs,
        full: bool,
    ) -> Update {
        let Inputs {
            ref own_name,
            own,
            cluster,
            ref direct,
        } = inputs;
        self.pending = Some(inputs.clone());
        let changed = self.changes(nodes, &name);
        let last = self.last.take();
        let last_want = match last {
            Some((was, desired))
                if !full
            && was == inputs
            && was == inputs
            && changed.len() <= MAX_CHANGED
            // The IPv6-only cluster's selection has checks of its own.
            && cluster.v4.is_some() =>
            {
                let changed: Vec<(String, Option<NodeView>)> = changed
                    .into_iter()
                    .map(|n| {
                        let v = self.seen.get(&n).map(|node| view(node));
                        (n, v)
                    })
                    .collect();
                match incremental(desired, &changed, &inputs) {
                    Some((desired, touched)) => {
                        return Update {
                            desired,
                            touched: Some(touched),
                            same_as_last: false,
                        };
                    }
                    // Not a full pass: no drift to tell apart.
                    None => None,
                }
            }
            Some((was, desired)) => (was == inputs).then_some(desired.want),
            None => None,
        };
        let views: Vec<NodeView> = nodes.iter().map(|n| view(n)).collect();
        let desired = desire(&views, own_name, own, cluster, direct);
        Update {
            same_as_last: last_want.as_ref() == Some(&desired.want),
            desired,
            touched: None,
        }
    }

    /// Keeps `desired`, the state of a pass that succeeded, for the next
    /// one (with the inputs [`Desire::update`] was given).
    pub fn keep(&mut self, desired: Desired) {
        if let Some(inputs) = self.pending.take() {
            self.last = Some((inputs, desired));
        }
    }

    /// The names of the Nodes added, replaced or gone since the last call,
    /// which from now on sees `nodes`.
    fn changes(&mut self, nodes: &[Arc<N>], name: &impl Fn(&N) -> &str) -> Vec<String> {
        if let Some(changed) = self.changes_in_place(nodes, name) {
            return changed;
        }
        let changed = self.changes_by_name(nodes, name);
        self.order = nodes.to_vec();
        changed
    }

    /// [`Desire::changes`] when `nodes` are as many as last time, in the
    /// same places but for a few (a Node replaced, or a few): only those
    /// places are read. None: too many places differ (a relist, Nodes
    /// added or gone), ask [`Desire::changes_by_name`].
    ///
    /// Names are unique in each call's Nodes. A place whose pointer is
    /// the same holds the same Node as last time. So a Node that left a
    /// differing place is still present exactly when its name is among
    /// those now in the differing places (it cannot be in an unchanged
    /// place, whose Node kept its own name): otherwise it is gone.
    fn changes_in_place(
        &mut self,
        nodes: &[Arc<N>],
        name: &impl Fn(&N) -> &str,
    ) -> Option<Vec<String>> {
        if self.order.len() != nodes.len() {
            return None;
        }
        let mut places = Vec::new();
        for (i, (was, n)) in self.order.iter().zip(nodes).enumerate() {
            if !Arc::ptr_eq(was, n) {
                if places.len() == MAX_CHANGED {
                    return None;
                }
                places.push(i);
            }
        }
        let mut changed = Vec::new();
        if places.is_empty() {
            return Some(changed);
        }
        let now: HashSet<&str> = places.iter().map(|&i| name(&nodes[i])).collect();
        for &i in &places {
            let left = name(&self.order[i]);
            if !now.contains(left) && self.seen.remove(left).is_some() {
                changed.push(left.to_string());
            }
        }
        for &i in &places {
            let n = &nodes[i];
            let key = name(n);
            self.note(key, n, &mut changed);
            self.order[i] = n.clone();
        }
        Some(changed)
    }

    /// Keeps `n` as the Node named `key`, and names it in `changed` when it
    /// is new or another object than the one kept.
    fn note(&mut self, key: &str, n: &Arc<N>, changed: &mut Vec<String>) {
        match self.seen.get_mut(key) {
            Some(was) if Arc::ptr_eq(was, n) => {}
            Some(was) => {
                *was = n.clone();
                changed.push(key.to_string());
            }
            None => {
                self.seen.insert(key.to_string(), n.clone());
                changed.push(key.to_string());
            }
        }
    }

    /// [`Desire::changes`] by each Node's name: every Node read.
    fn changes_by_name(&mut self, nodes: &[Arc<N>], name: &impl Fn(&N) -> &str) -> Vec<String> {
        let mut changed = Vec::new();
        for n in nodes {
            let key = name(n);
            self.note(key, n, &mut changed);
        }
        // Names are unique: more seen than present means some are gone.
        if self.seen.len() > nodes.len() {
            let present: HashSet<&str> = nodes.iter().map(|n| name(n)).collect();
            let gone: Vec<String> = self
                .seen
                .keys()
                .filter(|k| !present.contains(k.as_str()))
                .cloned()
                .collect();
            for g in gone {
                self.seen.remove(&g);
                changed.push(g);
            }
        }
        changed
    }
}

/// `desired` with the `changed` Nodes' shares (each its view now, None:
/// gone) taken out and made again, and the entries touched; None when a
/// check across Nodes makes that unsafe.
fn incremental(
    mut desired: Desired,
    changed: &[(String, Option<NodeView>)],
    inputs: &Inputs,
) -> Option<(Desired, OverlayState)> {
    if desired.rejected.iter().any(|(_, why)| across_nodes(why)) {
        return None;
    }
    let mut touched = OverlayState::default();
    // Every old share out first: two Nodes swapping a podCIDR in one
    // pass must not be seen to overlap.
    for (name, _) in changed {
        if let Ok(i) = desired.peers.binary_search_by(|p| p.name.cmp(name)) {
            let p = desired.peers.remove(i);
            let share = desired_direct(std::slice::from_ref(&p), &inputs.direct);
            remove(&mut desired.want, &share);
            merge(&mut touched, share);
        }
        if let Ok(i) = desired.peers6.binary_search_by(|p| p.name.cmp(name)) {
            let p = desired.peers6.remove(i);
            remove(
                &mut desired.want6,
                &desired_underlay6(std::slice::from_ref(&p)),
            );
        }
    }
    let names: HashSet<&str> = changed.iter().map(|(n, _)| n.as_str()).collect();
    desired
        .rejected
        .retain(|(n, _)| !names.contains(n.as_str()));
    for (_, view) in changed {
        let Some(view) = view else { continue };
        let Selection {
            peers,
            peers6,
            rejected,
        } = select_all(
            std::slice::from_ref(view),
            &inputs.own_name,
            inputs.own,
            inputs.cluster,
        );
        if rejected.iter().any(|(_, why)| across_nodes(why)) {
            return None;
        }
        for p in peers {
            if conflicts(&desired, &p) {
                return None;
            }
            let share = desired_direct(std::slice::from_ref(&p), &inputs.direct);
            add(&mut desired.want, &share);
            merge(&mut touched, share);
            let at = desired.peers.partition_point(|q| q.name < p.name);
            desired.peers.insert(at, p);
        }
        for p in peers6 {
            if conflicts6(&desired, &p) {
                return None;
            }
            add(
                &mut desired.want6,
                &desired_underlay6(std::slice::from_ref(&p)),
            );
            let at = desired.peers6.partition_point(|q| q.name < p.name);
            desired.peers6.insert(at, p);
        }
        for r in rejected {
            let at = desired.rejected.partition_point(|(n, _)| *n <= r.0);
            desired.rejected.insert(at, r);
        }
    }
    Some((desired, touched))
}

/// Whether peer `p` would fail a check across Nodes against the peers of
/// `d`: a podCIDR of either family overlapping, or a VTEP MAC shared.
fn conflicts(d: &Desired, p: &Peer) -> bool {
    let mac6 = p.underlay6.map(|u| u.vtep_mac);
    d.peers.iter().any(|q| {
        q.pod_cidr.overlaps(p.pod_cidr)
            || q.vtep_mac == p.vtep_mac
            || matches!((q.pod_cidr6, p.pod_cidr6), (Some(a), Some(b)) if a.overlaps(b))
            || (mac6.is_some() && q.underlay6.map(|u| u.vtep_mac) == mac6)
    }) || d.peers6.iter().any(|q| {
        p.pod_cidr6.is_some_and(|c| c.overlaps(q.pod_cidr6)) || mac6 == Some(q.underlay6.vtep_mac)
    })
}

/// [`conflicts`] for a peer over the IPv6 underlay only.
fn conflicts6(d: &Desired, p: &Peer6) -> bool {
    let mac6 = Some(p.underlay6.vtep_mac);
    d.peers.iter().any(|q| {
        q.pod_cidr6.is_some_and(|c| c.overlaps(p.pod_cidr6))
            || q.underlay6.map(|u| u.vtep_mac) == mac6
    }) || d
        .peers6
        .iter()
        .any(|q| q.pod_cidr6.overlaps(p.pod_cidr6) || q.underlay6.vtep_mac == p.underlay6.vtep_mac)
}

/// Takes a peer's entries (`share`) out of a state. Keys are one peer's
/// alone: the checks across Nodes keep them apart.
fn remove(s: &mut OverlayState, share: &OverlayState) {
    for k in share.routes.keys() {
        s.routes.remove(k);
    }
    for k in share.neighbours.keys() {
        s.neighbours.remove(k);
    }
    for k in share.fdb.keys() {
        s.fdb.remove(k);
    }
    for k in share.routes6.keys() {
        s.routes6.remove(k);
    }
    for k in share.neighbours6.keys() {
        s.neighbours6.remove(k);
    }
    for k in share.fdb6.keys() {
        s.fdb6.remove(k);
    }
}

/// Puts a peer's entries into a state.
fn add(s: &mut OverlayState, share: &OverlayState) {
    merge(s, share.clone());
}

fn merge(s: &mut OverlayState, share: OverlayState) {
    s.routes.extend(share.routes);
    s.neighbours.extend(share.neighbours);
    s.fdb.extend(share.fdb);
    s.routes6.extend(share.routes6);
    s.neighbours6.extend(share.neighbours6);
    s.fdb6.extend(share.fdb6);
}
