//! The mycni programs' own cost during a measure: which programs the lab's
//! agents loaded, and their run time per run from the kernel's BPF
//! run-time stats, read before and after the UDP window.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use mycni_common::COUNTERS_MAP;

/// The tc programs whose run time the bench reads.
pub(super) const PROGRAMS: [&str; 3] =
    ["mycni_from_pod", "mycni_from_underlay", "mycni_from_vxlan"];

/// The full name of a mycni program from the name the kernel keeps (its
/// first 15 bytes: BPF_OBJ_NAME_LEN with the NUL).
pub(super) fn program_name(kernel: &str) -> Option<&'static str> {
    PROGRAMS
        .into_iter()
        .find(|p| p.get(..p.len().min(15)) == Some(kernel))
}

/// One program a lab node's agent loaded, by the kernel's id for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Watched {
    /// 1-based, as the lab names nodes.
    pub(super) node: usize,
    pub(super) program: &'static str,
    pub(super) id: u32,
}

/// A program's bpf_stats (cumulative while run-time stats are on), or the
/// difference of two reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct ProgRun {
    pub(super) run_time_ns: u64,
    pub(super) run_cnt: u64,
}

impl ProgRun {
    pub(super) fn ns_per_run(self) -> Option<f64> {
        (self.run_cnt > 0).then(|| self.run_time_ns as f64 / self.run_cnt as f64)
    }
}

/// What the programs ran during one UDP window: per (node, program) over
/// that node's instances of the program, and the datagrams the window
/// counted as delivered.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct ProgWindow {
    pub(super) runs: BTreeMap<(usize, &'static str), ProgRun>,
    pub(super) datagrams: u64,
}

impl ProgWindow {
    /// The run time of every program on every node per datagram delivered,
    /// nanoseconds: the programs' share of a datagram's cost.
    pub(super) fn ns_per_datagram(&self) -> Option<f64> {
        let ns: u64 = self.runs.values().map(|r| r.run_time_ns).sum();
        (self.datagrams > 0 && !self.runs.is_empty()).then(|| ns as f64 / self.datagrams as f64)
    }
}

/// The mycni programs the lab's agents loaded, by node: an agent's
/// programs are those using the counter map it pinned under its node's
/// pin directory (programs are not per network namespace; names alone
/// would also find other labs' and tests' programs). A program left from a
/// previous agent of the node counts with it: unattached, it runs no more.
pub(super) fn watch_programs(pin_dirs: &[(usize, PathBuf)]) -> Result<Vec<Watched>> {
    let mut counters = BTreeMap::new();
    for (node, dir) in pin_dirs {
        let path = dir.join(COUNTERS_MAP);
        let map = aya::maps::MapInfo::from_pin(&path)
            .with_context(|| format!("reading the map pinned at {}", path.display()))?;
        counters.insert(map.id(), *node);
    }
    let mut found = vec![];
    // A program unloaded while the list is read is skipped: it runs no more.
    for info in aya::programs::loaded_programs().flatten() {
        let Some(program) = info.name_as_str().and_then(program_name) else {
            continue;
        };
        let Ok(Some(maps)) = info.map_ids() else {
            continue;
        };
        if let Some(&node) = maps.iter().find_map(|m| counters.get(m)) {
            found.push(Watched {
                node,
                program,
                id: info.id(),
            });
        }
    }
    if found.is_empty() {
        bail!("no mycni program uses the counter maps pinned under {pin_dirs:?}");
    }
    found.sort_by_key(|w| (w.node, w.program, w.id));
    Ok(found)
}

/// The watched programs' bpf_stats now, by id; a program gone meanwhile is
/// absent.
pub(super) fn read_runs(progs: &[Watched]) -> BTreeMap<u32, ProgRun> {
    if progs.is_empty() {
        return BTreeMap::new();
    }
    aya::programs::loaded_programs()
        .flatten()
        .filter(|info| progs.iter().any(|w| w.id == info.id()))
        .map(|info| {
            let run = ProgRun {
                run_time_ns: u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX),
                run_cnt: info.run_count(),
            };
            (info.id(), run)
        })
        .collect()
}

/// Per (node, program): what its instances ran between two reads. An
/// instance missing from either read is left out (it was loaded or
/// unloaded inside the window, which an agent restart alone does).
pub(super) fn prog_deltas(
    progs: &[Watched],
    before: &BTreeMap<u32, ProgRun>,
    after: &BTreeMap<u32, ProgRun>,
) -> BTreeMap<(usize, &'static str), ProgRun> {
    let mut out: BTreeMap<(usize, &'static str), ProgRun> = BTreeMap::new();
    for w in progs {
        let (Some(a), Some(b)) = (before.get(&w.id), after.get(&w.id)) else {
            continue;
        };
        let d = out.entry((w.node, w.program)).or_default();
        d.run_time_ns += b.run_time_ns.saturating_sub(a.run_time_ns);
        d.run_cnt += b.run_cnt.saturating_sub(a.run_cnt);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_names_from_the_kernels_15_bytes() {
        assert_eq!(program_name("mycni_from_pod"), Some("mycni_from_pod"));
        assert_eq!(program_name("mycni_from_unde"), Some("mycni_from_underlay"));
        assert_eq!(program_name("mycni_from_vxla"), Some("mycni_from_vxlan"));
        // A prefix shorter than the kernel keeps is another program.
        assert_eq!(program_name("mycni_from"), None);
        assert_eq!(program_name("mycni_from_underlay"), None);
        assert_eq!(program_name("cil_from_contai"), None);
        assert_eq!(program_name(""), None);
    }

    #[test]
    fn prog_deltas_sum_a_nodes_instances_and_skip_what_came_or_went() {
        let w = |node, program, id| Watched { node, program, id };
        let progs = [
            w(1, "mycni_from_pod", 10),
            w(1, "mycni_from_underlay", 11),
            w(2, "mycni_from_underlay", 21),
            // An older instance of node2's program (an agent restart),
            // still attached for part of the window.
            w(2, "mycni_from_underlay", 20),
            // Loaded inside the window: no first read.
            w(2, "mycni_from_pod", 22),
        ];
        let run = |run_time_ns, run_cnt| ProgRun {
            run_time_ns,
            run_cnt,
        };
        let before = BTreeMap::from([
            (10, run(1_000, 10)),
            (11, run(500, 5)),
            (20, run(7_000, 70)),
            (21, run(0, 0)),
        ]);
        let after = BTreeMap::from([
            (10, run(9_900, 20)),
            (11, run(500, 5)),
            (20, run(7_600, 71)),
            (21, run(5_400, 9)),
            (22, run(1_000, 1)),
        ]);
        let d = prog_deltas(&progs, &before, &after);
        assert_eq!(d[&(1, "mycni_from_pod")], run(8_900, 10));
        assert_eq!(d[&(1, "mycni_from_underlay")], run(0, 0));
        assert_eq!(d[&(2, "mycni_from_underlay")], run(6_000, 10));
        assert!(!d.contains_key(&(2, "mycni_from_pod")));
        assert_eq!(d[&(1, "mycni_from_pod")].ns_per_run(), Some(890.0));
        assert_eq!(d[&(2, "mycni_from_underlay")].ns_per_run(), Some(600.0));
        assert_eq!(d[&(1, "mycni_from_underlay")].ns_per_run(), None);
        // A counter that went backwards (a new program under an old id
        // cannot happen, but a bad read must not wrap).
        let back = prog_deltas(&progs[..1], &after, &before);
        assert_eq!(back[&(1, "mycni_from_pod")], run(0, 0));

        let window = ProgWindow {
            runs: d,
            datagrams: 10,
        };
        assert_eq!(window.ns_per_datagram(), Some(1_490.0));
        let none = ProgWindow {
            datagrams: 10,
            ..Default::default()
        };
        assert_eq!(none.ns_per_datagram(), None);
        let idle = ProgWindow {
            datagrams: 0,
            ..window
        };
        assert_eq!(idle.ns_per_datagram(), None);
    }
}
