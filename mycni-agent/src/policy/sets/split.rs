//! One pod's allows of one direction and family, made into the disjoint
//! elements of the two maps that admit (the ported map, checked first,
//! and the any map), each element naming the first rule that admits it.
//!
//! Rules overlap freely (a /32 inside an allowed /16, port 80 inside
//! 53-90, the same peer allowed by two policies); interval map elements
//! must not. The allowed prefixes nest or are disjoint, so they form a
//! tree: every address falls in one innermost prefix, and what is allowed
//! there (the any rules and the port ranges of every prefix on the way
//! up) decides it. A prefix whose decision and first rules equal its
//! parent's adds no element of its own; every other one is carved out of
//! its parent. Within a region, port ranges are cut where the first rule
//! changes, and a range whose first rule comes after the region's any
//! rule is left to the any map (the packet reaches it next and is counted
//! there, under the earlier rule). What is admitted is the union of the
//! allows, whatever the rules' order; only the counting depends on it.

use std::collections::BTreeMap;

use crate::cluster::eval::RuleRef;
use crate::cluster::model::{Cidr, IpBlock, Protocol};

/// A (prefix, protocol, first port, last port) allow of `rule`.
pub(crate) type Ported<'a> = (Cidr, Protocol, u16, u16, &'a RuleRef);

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Split<'a> {
    pub any: Vec<(Cidr, &'a RuleRef)>,
    pub ported: Vec<Ported<'a>>,
}

type Segments<'a> = BTreeMap<Protocol, Vec<(u16, u16, &'a RuleRef)>>;

/// A prefix's own allows: its first any rule, its port ranges.
type Own<'a> = (Option<&'a RuleRef>, Vec<(Protocol, u16, u16, &'a RuleRef)>);

/// What a region admits: on every port, from the first such rule on;
/// and the port segments whose first rule comes before that.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Signature<'a> {
    any: Option<&'a RuleRef>,
    ports: Segments<'a>,
}

pub fn split<'a>(any: &[(Cidr, &'a RuleRef)], ported: &[Ported<'a>]) -> Split<'a> {
    let mut own: BTreeMap<Cidr, Own<'a>> = BTreeMap::new();
    for (c, r) in any {
        let e = own.entry(*c).or_default();
        e.0 = first(e.0, Some(*r));
    }
    for (c, p, s, e, r) in ported {
        own.entry(*c).or_default().1.push((*p, *s, *e, *r));
    }
    // In (address, length) order a prefix comes after every prefix that
    // contains it: one sweep with a stack of containers finds parents.
    let prefixes: Vec<Cidr> = own.keys().copied().collect();
    let mut parent: Vec<Option<usize>> = Vec::with_capacity(prefixes.len());
    let mut acc_any: Vec<Option<&'a RuleRef>> = Vec::with_capacity(prefixes.len());
    let mut acc_ports: Vec<Vec<(Protocol, u16, u16, &'a RuleRef)>> = Vec::new();
    let mut sig: Vec<Signature<'a>> = Vec::with_capacity(prefixes.len());
    let mut stack: Vec<usize> = Vec::new();
    for (i, q) in prefixes.iter().enumerate() {
        while let Some(&top) = stack.last() {
            if prefixes[top].strictly_contains(q) {
                break;
            }
            stack.pop();
        }
        let up = stack.last().copied();
        let (mut a, mut ports) = match up {
            Some(p) => (acc_any[p], acc_ports[p].clone()),
            None => (None, Vec::new()),
        };
        let (own_any, own_ports) = &own[q];
        a = first(a, *own_any);
        ports.extend(own_ports.iter().copied());
        sig.push(signature(a, &ports));
        parent.push(up);
        acc_any.push(a);
        acc_ports.push(ports);
        stack.push(i);
    }
    let kept: Vec<bool> = (0..prefixes.len())
        .map(|i| parent[i].is_none_or(|p| sig[p] != sig[i]))
        .collect();
    // Each kept prefix's region is itself minus the kept prefixes whose
    // nearest kept container it is.
    let mut carved: Vec<Vec<Cidr>> = vec![Vec::new(); prefixes.len()];
    for i in 0..prefixes.len() {
        if !kept[i] {
            continue;
        }
        let mut up = parent[i];
        while let Some(p) = up {
            if kept[p] {
                carved[p].push(prefixes[i]);
                break;
            }
            up = parent[p];
        }
    }
    let mut out = Split::default();
    for (i, q) in prefixes.iter().enumerate() {
        if !kept[i] {
            continue;
        }
        let region = IpBlock {
            cidr: *q,
            except: std::mem::take(&mut carved[i]),
        };
        for piece in region.prefixes() {
            if let Some(r) = sig[i].any {
                out.any.push((piece, r));
            }
            for (proto, segs) in &sig[i].ports {
                out.ported
                    .extend(segs.iter().map(|(s, e, r)| (piece, *proto, *s, *e, *r)));
            }
        }
    }
    out
}

fn first<'a>(a: Option<&'a RuleRef>, b: Option<&'a RuleRef>) -> Option<&'a RuleRef> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

fn signature<'a>(
    any: Option<&'a RuleRef>,
    ports: &[(Protocol, u16, u16, &'a RuleRef)],
) -> Signature<'a> {
    let mut by: BTreeMap<Protocol, Vec<(u16, u16, &'a RuleRef)>> = BTreeMap::new();
    for (p, s, e, r) in ports {
        by.entry(*p).or_default().push((*s, *e, *r));
    }
    let mut out = Segments::new();
    for (p, list) in by {
        let mut segs = segments(&list);
        segs.retain(|(_, _, r)| any.is_none_or(|a| *r < a));
        if !segs.is_empty() {
            out.insert(p, segs);
        }
    }
    Signature { any, ports: out }
}

/// Inclusive port ranges cut into disjoint segments, each with the first
/// rule covering it, neighbours of the same rule merged.
fn segments<'a>(list: &[(u16, u16, &'a RuleRef)]) -> Vec<(u16, u16, &'a RuleRef)> {
    let mut cuts: Vec<u32> = list
        .iter()
        .flat_map(|(s, e, _)| [u32::from(*s), u32::from(*e) + 1])
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut out: Vec<(u16, u16, &'a RuleRef)> = Vec::new();
    for w in cuts.windows(2) {
        let (lo, hi) = (w[0], w[1] - 1);
        let best = list
            .iter()
            .filter(|(s, e, _)| u32::from(*s) <= lo && hi <= u32::from(*e))
            .map(|(_, _, r)| *r)
            .min();
        let (Some(r), Ok(lo16), Ok(hi16)) = (best, u16::try_from(lo), u16::try_from(hi)) else {
            continue;
        };
        match out.last_mut() {
            Some((_, end, last)) if *last == r && u32::from(*end) + 1 == lo => *end = hi16,
            _ => out.push((lo16, hi16, r)),
        }
    }
    out
}

#[cfg(test)]
mod tests;
