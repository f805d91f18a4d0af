//! The fast share: what a node's programs saw over an interval, from two
//! reads of its counters, summed the ways the lab and the bench report it.

use std::fmt::Write as _;

use super::{Counters, FamilyCounters, VXLAN_DEV, family_label};
use crate::IpFamily;

fn path_named(name: &str) -> Option<mycni_common::DpPath> {
    mycni_common::DpPath::ALL
        .into_iter()
        .find(|p| p.name() == name)
}

/// What a node's programs saw over an interval, summed the ways a fast
/// share needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PathShare {
    /// Pod traffic (`DpPath::is_pod_traffic`): what a fast share is out of.
    /// The underlay program also sees the node's own traffic (the API, the
    /// metrics scrapes), which says nothing about pods.
    pub pod: u64,
    /// Of `pod`, the packets the programs forwarded (`DpPath::is_fast`).
    pub fast: u64,
    /// Of `fast`, those that still crossed `vxlan.1` (`DpPath::crossed_vxlan`).
    pub crossed_vxlan: u64,
    /// Pod packets left to the kernel, by path name.
    pub kernel: Counters,
    /// Of `fast`, by path name (`fast_local`, `fast_encap`, ...).
    pub fast_paths: Counters,
}

impl PathShare {
    /// From counters read before and after the interval. A path name this
    /// build does not know counts as pod traffic left to the kernel, so the
    /// share can only come out too low, never too high.
    pub fn between(before: &Counters, after: &Counters) -> PathShare {
        let mut s = PathShare::default();
        for (name, n) in after {
            let d = n.saturating_sub(before.get(name).copied().unwrap_or(0));
            if d == 0 {
                continue;
            }
            let path = path_named(name);
            if path.is_some_and(|p| !p.is_pod_traffic()) {
                continue;
            }
            s.pod += d;
            match path {
                Some(p) if p.is_fast() => {
                    s.fast += d;
                    *s.fast_paths.entry(name.clone()).or_default() += d;
                    if p.crossed_vxlan() {
                        s.crossed_vxlan += d;
                    }
                }
                _ => *s.kernel.entry(name.clone()).or_default() += d,
            }
        }
        s
    }

    /// [`Self::between`] for the packets of family `f` alone (what the
    /// programs counted under its `family` label: on the underlay, VXLAN
    /// counts under the family it carries).
    pub fn between_family(
        before: &FamilyCounters,
        after: &FamilyCounters,
        f: IpFamily,
    ) -> PathShare {
        let of = |c: &FamilyCounters| c.get(family_label(f)).cloned().unwrap_or_default();
        PathShare::between(&of(before), &of(after))
    }

    pub fn add(&mut self, o: &PathShare) {
        self.pod += o.pod;
        self.fast += o.fast;
        self.crossed_vxlan += o.crossed_vxlan;
        for (k, v) in &o.kernel {
            *self.kernel.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &o.fast_paths {
            *self.fast_paths.entry(k.clone()).or_default() += v;
        }
    }

    /// Fast packets per pod packet, in percent; None when no pod packet was seen.
    pub fn fast_pct(&self) -> Option<f64> {
        (self.pod > 0).then(|| 100.0 * self.fast as f64 / self.pod as f64)
    }

    /// Fast packets that crossed `vxlan.1`, in percent of the fast ones.
    pub fn crossed_pct(&self) -> Option<f64> {
        (self.fast > 0).then(|| 100.0 * self.crossed_vxlan as f64 / self.fast as f64)
    }

    /// `87.3% fast of 2345 pod packets, 0.0% of those through vxlan.1;
    /// kernel: kernel_tcp_control 300, ...`
    pub fn describe(&self) -> String {
        self.describe_as(false)
    }

    /// [`Self::describe`] with the fast packets by path, for a node without
    /// `vxlan.1` (an IPv6-only lab), where crossing it cannot happen and
    /// the paths say what matters: `40.0% fast of 1000 pod packets
    /// (fast_local 300, fast_vxlan6 100); kernel: ...`. A packet that
    /// crossed `vxlan.1` all the same is still named.
    pub fn describe_by_path(&self) -> String {
        self.describe_as(true)
    }

    fn describe_as(&self, by_path: bool) -> String {
        let Some(fast) = self.fast_pct() else {
            return "the programs saw no pod packets".into();
        };
        let mut s = format!("{fast:.1}% fast of {} pod packets", self.pod);
        if by_path && !self.fast_paths.is_empty() {
            let _ = write!(s, " ({})", largest_first(&self.fast_paths).join(", "));
        }
        match self.crossed_pct() {
            Some(c) if !by_path || self.crossed_vxlan > 0 => {
                let _ = write!(s, ", {c:.1}% of those through {VXLAN_DEV}");
            }
            _ => {}
        }
        let mut kernel = largest_first(&self.kernel);
        if !kernel.is_empty() {
            kernel.truncate(4);
            let _ = write!(s, "; kernel: {}", kernel.join(", "));
        }
        s
    }
}

/// `name count` of each counter, the largest count first.
fn largest_first(c: &Counters) -> Vec<String> {
    let mut v: Vec<(&String, &u64)> = c.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1));
    v.iter().map(|(k, n)| format!("{k} {n}")).collect()
}
