//! The connectivity matrix, one table per address family the pods have,
//! and the per-node datapath report after it, with each family's fast share.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::process::{Command, Stdio};

use anyhow::{Context, Result};

use crate::daemon::ns_exec;
use crate::{
    ECHO_PORT, FamilyCounters, IpFamily, Lab, MATRIX_BULK_BYTES, NodeDatapath, PROBE_BULK_FAILED,
    PathShare, Stack, VXLAN_DEV, VXLAN6_DEV, check_interrupted, describe_node,
    describe_node_routes, pod_label,
};

/// A matrix's tables, one per address family, its failed cells and, when
/// counted, every node's counters (by family) before it and after each
/// family's pod rows and node rows. Each family's cells run in intervals
/// of their own, and its fast share counts the packets of that family in
/// them (the programs count every packet under its family: ARP under
/// `other`, VXLAN on the underlay under the family it carries).
#[derive(Debug, Default)]
pub struct MatrixRun {
    /// Every family's table under a line naming it.
    pub table: String,
    pub failed: usize,
    /// The families in the order they ran.
    pub families: Vec<IpFamily>,
    /// Snapshots of every node's counters: `[0]` before the matrix, then
    /// for the `k`-th family `[2k+1]` after its pod rows and `[2k+2]` after
    /// its node rows (so `[0]..[1]` is the first family's pod rows).
    pub counters: Vec<Vec<FamilyCounters>>,
}

/// One family's cells in a [`MatrixRun`].
#[derive(Debug, Default)]
pub struct FamilyRun {
    pub table: String,
    pub failed: usize,
}

impl MatrixRun {
    /// Node `i`'s fast share over family `f`'s pod rows (`pod_rows`) or all
    /// its rows; None without counters for it.
    pub fn share(&self, i: usize, f: IpFamily, pod_rows: bool) -> Option<PathShare> {
        let k = self.families.iter().position(|x| *x == f)?;
        let snap = |n: usize| self.counters.get(n).and_then(|c| c.get(i.checked_sub(1)?));
        let before = snap(2 * k)?;
        let after = snap(2 * k + if pod_rows { 1 } else { 2 })?;
        Some(PathShare::between_family(before, after, f))
    }
}

impl Lab {
    /// The families the lab's pods have addresses of, IPv4 first: each
    /// one some pod has (a pod without one fails its cells), or without
    /// pods the lab's stack.
    pub fn families(&self) -> Result<Vec<IpFamily>> {
        let pods = self.pods()?;
        if pods.is_empty() {
            return Ok(self.spec.stack.families());
        }
        Ok([IpFamily::V4, IpFamily::V6]
            .into_iter()
            .filter(|f| pods.iter().any(|p| p.addr(*f).is_some()))
            .collect())
    }

    /// Connectivity matrix: every pod and node to every pod, by ping, a TCP
    /// round trip and a bulk echo over the same connection, for each family
    /// the pods have. Returns the printable tables and the number of failed
    /// cells.
    pub fn matrix(&self) -> Result<(String, usize)> {
        let run = self.run_matrix(false)?;
        Ok((run.table, run.failed))
    }

    /// [`Lab::matrix`], with every node's counters read before it and
    /// after each family's pod rows and node rows, so the pod-to-pod cells
    /// of each family get a fast share of their own (see
    /// [`Lab::datapath_report`]).
    pub fn matrix_counted(&self) -> Result<MatrixRun> {
        self.run_matrix(true)
    }

    fn run_matrix(&self, counted: bool) -> Result<MatrixRun> {
        let mut run = MatrixRun {
            families: self.families()?,
            ..MatrixRun::default()
        };
        if counted {
            run.counters.push(self.all_family_counters());
        }
        for f in run.families.clone() {
            let part = self.family_matrix(f, counted.then_some(&mut run.counters))?;
            let _ = writeln!(run.table, "{f}:");
            run.table.push_str(&part.table);
            run.failed += part.failed;
        }
        Ok(run)
    }

    /// One family's table; with `counters`, every node's counters are
    /// pushed after its pod rows and after its node rows.
    fn family_matrix(
        &self,
        f: IpFamily,
        mut counters: Option<&mut Vec<Vec<FamilyCounters>>>,
    ) -> Result<FamilyRun> {
        const CELL: usize = 16;
        let pods = self.pods()?;
        let pod_rows: Vec<(String, String)> =
            pods.iter().map(|p| (pod_label(p), p.ns.clone())).collect();
        let node_rows: Vec<(String, String)> = (1..=self.spec.nodes)
            .map(|i| (format!("node{i}"), self.spec.node_name(i)))
            .collect();
        let mut run = FamilyRun::default();
        let _ = write!(run.table, "{:<8}", "from\\to");
        for p in &pods {
            let _ = write!(run.table, "{:>CELL$}", pod_label(p));
        }
        run.table.push('\n');
        let lab = self.spec.bins.lab.to_string_lossy();
        let bulk = MATRIX_BULK_BYTES.to_string();
        let ping_family = match f {
            IpFamily::V4 => "-4",
            IpFamily::V6 => "-6",
        };
        for rows in [&pod_rows, &node_rows] {
            for (label, ns) in rows {
                check_interrupted()?;
                let _ = write!(run.table, "{label:<8}");
                for p in &pods {
                    if *ns == p.ns {
                        let _ = write!(run.table, "{:>CELL$}", "-");
                        continue;
                    }
                    let Some(addr) = p.addr(f) else {
                        // Its family's other pods have one: this pod
                        // cannot be reached over it.
                        let _ = write!(run.table, "{:>CELL$}", "no address");
                        run.failed += 1;
                        continue;
                    };
                    let ping = ns_exec(
                        ns,
                        "ping",
                        &[ping_family, "-c", "1", "-W", "1", &addr.to_string()],
                    )
                    .is_ok();
                    let target = SocketAddr::from((addr, ECHO_PORT)).to_string();
                    let probe = Command::new("ip")
                        .args(["netns", "exec", ns, &lab, "tcp-probe", &target])
                        .args(["--bulk", &bulk])
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .status()
                        .with_context(|| format!("running {lab} tcp-probe in {ns}"))?;
                    let (tcp, transfer) = match probe.code() {
                        Some(0) => ("tcp", "bulk"),
                        Some(PROBE_BULK_FAILED) => ("tcp", "BULK!"),
                        // The round trip failed: no transfer was tried.
                        _ => ("TCP!", "-"),
                    };
                    if !ping || probe.code() != Some(0) {
                        run.failed += 1;
                    }
                    let cell = format!("{}/{tcp}/{transfer}", if ping { "ping" } else { "PING!" });
                    let _ = write!(run.table, "{cell:>CELL$}");
                }
                run.table.push('\n');
            }
            if let Some(c) = counters.as_deref_mut() {
                c.push(self.all_family_counters());
            }
        }
        Ok(run)
    }

    /// Per node, after [`Lab::matrix_counted`]: the datapath its agent runs
    /// and the share of the pod packets its programs saw that the fast path
    /// forwarded, for the pod-to-pod cells and for all cells.
    pub fn datapath_report(&self, run: &MatrixRun) -> String {
        // An IPv6-only lab has no vxlan.1 to cross: its share lines name the
        // fast paths instead (local delivery, and to and from vxlan6.1).
        let ipv6_only = self.spec.stack == Stack::Ipv6Only;
        let which = if ipv6_only {
            format!("by the path they took (to and from {VXLAN6_DEV}: fast_vxlan6*)")
        } else {
            format!("and of those the ones that still crossed {VXLAN_DEV}")
        };
        let mut out = format!(
            "datapath per node, and the fast share: of the pod packets the node's programs saw \
             during the matrix (as the programs count them: a GSO batch of segments is one \
             packet, and a packet counts on each node whose program sees it; the node's own \
             underlay traffic is left out), those the fast path forwarded, {which}. Pings and \
             each connection's SYN and FIN take the \
             kernel path by design; each cell's {} KB echo is what the fast path can take. \
             Node rows add the nodes' own addresses, which are no pod's and stay on the kernel \
             path. Each family's cells ran in an interval of their own, and its share counts \
             the packets of that family (by the programs' family label) in it.\n",
            MATRIX_BULK_BYTES / 1024
        );
        for i in 1..=self.spec.nodes {
            // The routes, not the agent's encapsulation mode, say whether
            // peers are reached through VXLAN at all (`--direct-routing`).
            let routes = self.peer_routes(i).unwrap_or_default();
            let r6 = self.peer_routes6(i).unwrap_or_default();
            let d = match self.datapath(i) {
                Ok(d @ NodeDatapath::Kernel(_)) => {
                    let _ = writeln!(
                        out,
                        "  {}: {}: no tc program attached, every packet takes the kernel path",
                        self.spec.node_name(i),
                        if ipv6_only {
                            describe_node_routes(&d, &routes, &r6)
                        } else {
                            describe_node(&d, &routes)
                        }
                    );
                    continue;
                }
                Ok(d) => describe_node_routes(&d, &routes, &r6),
                Err(e) => format!("unknown ({e:#})"),
            };
            let _ = writeln!(out, "  {}: {d}", self.spec.node_name(i));
            for f in &run.families {
                let describe = |pod_rows| {
                    run.share(i, *f, pod_rows).map_or_else(
                        || "not counted".to_string(),
                        |s| {
                            if ipv6_only {
                                s.describe_by_path()
                            } else {
                                s.describe()
                            }
                        },
                    )
                };
                let _ = writeln!(
                    out,
                    "    {f} pod rows: {}\n    {f} all rows: {}",
                    describe(true),
                    describe(false)
                );
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_familys_share_comes_from_its_own_interval() {
        // IPv4 fast packets count n, IPv6 ones 2n: each family's share
        // must read its own label.
        let c = |n: u64| -> Vec<FamilyCounters> {
            let fam = |k: u64| -> crate::Counters { [("fast_encap".to_string(), k)].into() };
            vec![
                [
                    ("ipv4".to_string(), fam(n)),
                    ("ipv6".to_string(), fam(2 * n)),
                ]
                .into(),
            ]
        };
        // Before, IPv4 pods, IPv4 nodes, IPv6 pods, IPv6 nodes.
        let run = MatrixRun {
            families: vec![IpFamily::V4, IpFamily::V6],
            counters: vec![c(0), c(10), c(15), c(115), c(135)],
            ..MatrixRun::default()
        };
        let fast = |f, pods| run.share(1, f, pods).map(|s| s.fast);
        assert_eq!(fast(IpFamily::V4, true), Some(10));
        assert_eq!(fast(IpFamily::V4, false), Some(15));
        assert_eq!(fast(IpFamily::V6, true), Some(200));
        assert_eq!(fast(IpFamily::V6, false), Some(240));
        // No node 2, no node 0, no counters: no share.
        assert_eq!(run.share(2, IpFamily::V4, true), None);
        assert_eq!(run.share(0, IpFamily::V4, true), None);
        assert_eq!(MatrixRun::default().share(1, IpFamily::V4, true), None);
    }
}
