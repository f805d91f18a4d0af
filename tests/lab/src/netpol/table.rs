//! Observed truth tables, their comparison with the expected ones, and how
//! both print: rows from, columns to, `.` reachable, `X` not, the diagonal
//! `-` (never probed: a pod reaching itself is not NetworkPolicy's).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::{Column, Expect};

/// Every probe's outcome: (column, from, to) -> reached.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observed(pub BTreeMap<(Column, String, String), bool>);

/// A cell that differs from the expectation.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Wrong {
    pub column: Column,
    pub from: String,
    pub to: String,
}

/// The differences between an observed table and an expectation.
#[derive(Debug, Clone, Default)]
pub struct Comparison {
    pub probes: usize,
    /// Reached though expected denied.
    pub false_allows: Vec<Wrong>,
    /// Not reached though expected allowed.
    pub false_denies: Vec<Wrong>,
}

impl Comparison {
    pub fn matches(&self) -> bool {
        self.false_allows.is_empty() && self.false_denies.is_empty()
    }

    pub fn summary(&self) -> String {
        format!(
            "{} probes, {} false allows, {} false denies",
            self.probes,
            self.false_allows.len(),
            self.false_denies.len()
        )
    }
}

impl Observed {
    pub fn compare(&self, expect: &Expect) -> Comparison {
        let mut c = Comparison {
            probes: self.0.len(),
            ..Comparison::default()
        };
        for ((col, from, to), reached) in &self.0 {
            let want = expect.get(col).get(from, to);
            let wrong = Wrong {
                column: *col,
                from: from.clone(),
                to: to.clone(),
            };
            match (want, *reached) {
                (false, true) => c.false_allows.push(wrong),
                (true, false) => c.false_denies.push(wrong),
                _ => {}
            }
        }
        c
    }

    /// The sources and destinations, in the order they first appear
    /// (sorted: `node*` rows after the pods).
    fn ends(&self) -> (Vec<String>, Vec<String>) {
        let mut from: Vec<String> = Vec::new();
        let mut to: Vec<String> = Vec::new();
        for (_, f, t) in self.0.keys() {
            if !from.contains(f) {
                from.push(f.clone());
            }
            if !to.contains(t) {
                to.push(t.clone());
            }
        }
        let key = |s: &String| (s.starts_with("node"), s.clone());
        from.sort_by_key(key);
        to.sort_by_key(key);
        (from, to)
    }

    /// One column's table, observed (`expect` None) or expected.
    pub fn render(&self, col: &Column, expect: Option<&Expect>) -> String {
        let (from, to) = self.ends();
        let mut out = String::new();
        let _ = write!(out, "{:<7}", "");
        for t in &to {
            let _ = write!(out, "{t:>5}");
        }
        out.push('\n');
        for f in &from {
            let _ = write!(out, "{f:<7}");
            for t in &to {
                let cell = match self.0.get(&(*col, f.clone(), t.clone())) {
                    None => "-",
                    Some(reached) => {
                        let v = match expect {
                            Some(e) => e.get(col).get(f, t),
                            None => *reached,
                        };
                        if v { "." } else { "X" }
                    }
                };
                let _ = write!(out, "{cell:>5}");
            }
            out.push('\n');
        }
        out
    }

    /// Every column the probes covered.
    pub fn columns(&self) -> Vec<Column> {
        let mut cols: Vec<Column> = self.0.keys().map(|(c, _, _)| *c).collect();
        cols.dedup();
        cols.sort();
        cols.dedup();
        cols
    }

    /// The tables, columns with the same table printed once under all
    /// their names; with `expect`, each group's expected table beside the
    /// observed one when they differ, and the wrong cells named.
    pub fn report(&self, expect: Option<&Expect>) -> String {
        let mut groups: Vec<(String, String, Vec<Column>)> = Vec::new();
        for col in self.columns() {
            let observed = self.render(&col, None);
            let expected = expect
                .map(|e| self.render(&col, Some(e)))
                .unwrap_or_default();
            match groups
                .iter_mut()
                .find(|(o, e, _)| *o == observed && *e == expected)
            {
                Some(g) => g.2.push(col),
                None => groups.push((observed, expected, vec![col])),
            }
        }
        let mut out = String::new();
        let all = self.columns();
        for (observed, expected, cols) in groups {
            let _ = writeln!(out, "{}:", name_columns(&cols, &all));
            if expect.is_some() && observed != expected {
                let _ = writeln!(out, "  observed:");
                out.push_str(&indent(&observed));
                let _ = writeln!(out, "  expected:");
                out.push_str(&indent(&expected));
            } else {
                out.push_str(&indent(&observed));
            }
        }
        if let Some(e) = expect {
            let c = self.compare(e);
            for (what, list) in [
                ("false allows", &c.false_allows),
                ("false denies", &c.false_denies),
            ] {
                if list.is_empty() {
                    continue;
                }
                let mut pairs: Vec<String> = list
                    .iter()
                    .map(|w| format!("{}->{}", w.from, w.to))
                    .collect();
                pairs.sort();
                pairs.dedup();
                let _ = writeln!(
                    out,
                    "{what}: {} cells, pairs: {}",
                    list.len(),
                    pairs.join(" ")
                );
            }
        }
        out
    }
}

/// A group's name: `TCP/80, UDP/81 (IPv4 and IPv6, by pod IP and by
/// Service)` when each protocol/port in it has every family and path the
/// tables have, else every column by name.
fn name_columns(cols: &[Column], all: &[Column]) -> String {
    let ways = |proto, port, within: &[Column]| -> Vec<(crate::IpFamily, super::Via)> {
        within
            .iter()
            .filter(|c| c.proto == proto && c.port == port)
            .map(|c| (c.family, c.via))
            .collect()
    };
    let mut ports: Vec<(crate::model::Proto, u16)> =
        cols.iter().map(|c| (c.proto, c.port)).collect();
    ports.dedup();
    let whole = ports
        .iter()
        .all(|(proto, port)| ways(*proto, *port, cols) == ways(*proto, *port, all));
    if !whole {
        return cols
            .iter()
            .map(Column::to_string)
            .collect::<Vec<_>>()
            .join(", ");
    }
    let mut families: Vec<crate::IpFamily> = all.iter().map(|c| c.family).collect();
    families.sort_unstable();
    families.dedup();
    let families: Vec<String> = families.iter().map(|f| f.to_string()).collect();
    let mut vias: Vec<super::Via> = all.iter().map(|c| c.via).collect();
    vias.sort_unstable();
    vias.dedup();
    let vias: Vec<&str> = vias.iter().map(|v| v.label()).collect();
    let names: Vec<String> = ports
        .iter()
        .map(|(proto, port)| format!("{}/{port}", proto.api()))
        .collect();
    format!(
        "{} ({}, by {})",
        names.join(", "),
        families.join(" and "),
        vias.join(" and by ")
    )
}

fn indent(s: &str) -> String {
    s.lines().map(|l| format!("  {l}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IpFamily;
    use crate::model::Proto;
    use crate::netpol::{Reach, Via};

    #[test]
    fn compare_and_render() {
        let col = |via| Column {
            proto: Proto::Tcp,
            port: 80,
            family: IpFamily::V4,
            via,
        };
        let mut o = Observed::default();
        for via in [Via::PodIp, Via::Service] {
            for (f, t, r) in [("x/a", "x/b", true), ("x/b", "x/a", true)] {
                o.0.insert((col(via), f.into(), t.into()), r);
            }
        }
        let e: Expect = Reach::all(true).expect("*", "x/a", false).into();
        let c = o.compare(&e);
        assert_eq!(c.false_allows.len(), 2);
        assert!(c.false_denies.is_empty());
        assert_eq!(c.probes, 4);
        let r = o.report(Some(&e));
        // Both paths in one group: the same tables.
        assert!(
            r.starts_with("TCP/80 (IPv4, by pod IP and by Service):\n"),
            "{r}"
        );
        let mut both = o.clone();
        for ((c, f, t), r) in o.0.iter() {
            let c6 = Column {
                family: IpFamily::V6,
                ..*c
            };
            both.0.insert((c6, f.clone(), t.clone()), *r);
        }
        assert!(
            both.report(None)
                .starts_with("TCP/80 (IPv4 and IPv6, by pod IP and by Service):\n"),
            "{}",
            both.report(None)
        );
        let mut partial = o.clone();
        partial
            .0
            .insert((col(Via::PodIp), "x/a".into(), "x/b".into()), false);
        assert!(
            partial
                .report(None)
                .starts_with("TCP/80 IPv4 via pod IP:\n"),
            "{}",
            partial.report(None)
        );
        assert!(r.contains("false allows: 2 cells, pairs: x/b->x/a"), "{r}");
        let table = o.render(&col(Via::PodIp), None);
        assert_eq!(table.lines().nth(1), Some("x/a        -    ."));
    }
}
