//! The connectivity matrix and the per-node datapath report after it.

use std::fmt::Write as _;
use std::process::{Command, Stdio};

use anyhow::{Context, Result};

use crate::daemon::ns_exec;
use crate::{
    Counters, ECHO_PORT, Lab, MATRIX_BULK_BYTES, NodeDatapath, PROBE_BULK_FAILED, PathShare,
    check_interrupted, describe_node, pod_label,
};

/// A matrix's table, its failed cells and, when counted, every node's
/// counters before it, after its pod rows and after its node rows.
#[derive(Debug, Default)]
pub struct MatrixRun {
    pub table: String,
    pub failed: usize,
    pub counters: Vec<Vec<Counters>>,
}

impl Lab {
    /// Connectivity matrix: every pod and node to every pod, by ping, a TCP
    /// round trip and a bulk echo over the same connection. Returns the
    /// printable table and the number of failed cells.
    pub fn matrix(&self) -> Result<(String, usize)> {
        let run = self.run_matrix(false)?;
        Ok((run.table, run.failed))
    }

    /// [`Lab::matrix`], with every node's counters read before it, after
    /// the pod rows and after the node rows, so the pod-to-pod cells get a
    /// fast share of their own (see [`Lab::datapath_report`]).
    pub fn matrix_counted(&self) -> Result<MatrixRun> {
        self.run_matrix(true)
    }

    fn run_matrix(&self, counted: bool) -> Result<MatrixRun> {
        const CELL: usize = 16;
        let pods = self.pods()?;
        let pod_rows: Vec<(String, String)> =
            pods.iter().map(|p| (pod_label(p), p.ns.clone())).collect();
        let node_rows: Vec<(String, String)> = (1..=self.spec.nodes)
            .map(|i| (format!("node{i}"), self.spec.node_name(i)))
            .collect();
        let mut run = MatrixRun::default();
        let _ = write!(run.table, "{:<8}", "from\\to");
        for p in &pods {
            let _ = write!(run.table, "{:>CELL$}", pod_label(p));
        }
        run.table.push('\n');
        let lab = self.spec.bins.lab.to_string_lossy();
        let bulk = MATRIX_BULK_BYTES.to_string();
        if counted {
            run.counters.push(self.all_counters());
        }
        for rows in [&pod_rows, &node_rows] {
            for (label, ns) in rows {
                check_interrupted()?;
                let _ = write!(run.table, "{label:<8}");
                for p in &pods {
                    if *ns == p.ns {
                        let _ = write!(run.table, "{:>CELL$}", "-");
                        continue;
                    }
                    let ping =
                        ns_exec(ns, "ping", &["-c", "1", "-W", "1", &p.ip.to_string()]).is_ok();
                    let target = format!("{}:{ECHO_PORT}", p.ip);
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
            if counted {
                run.counters.push(self.all_counters());
            }
        }
        Ok(run)
    }

    /// Per node, after [`Lab::matrix_counted`]: the datapath its agent runs
    /// and the share of the pod packets its programs saw that the fast path
    /// forwarded, for the pod-to-pod cells and for all cells.
    pub fn datapath_report(&self, run: &MatrixRun) -> String {
        let mut out = format!(
            "datapath per node, and the fast share: of the pod packets the node's programs saw \
             during the matrix (as the programs count them: a GSO batch of segments is one \
             packet, and a packet counts on each node whose program sees it; the node's own \
             underlay traffic is left out), those the fast path forwarded, and of those the \
             ones that still crossed vxlan.1. Pings and each connection's SYN and FIN take the \
             kernel path by design; each cell's {} KB echo is what the fast path can take. \
             Node rows add the nodes' own addresses, which are no pod's and stay on the kernel \
             path.\n",
            MATRIX_BULK_BYTES / 1024
        );
        let empty = Counters::new();
        let snap = |k: usize, i: usize| run.counters.get(k).and_then(|c| c.get(i - 1));
        for i in 1..=self.spec.nodes {
            // The routes, not the agent's encapsulation mode, say whether
            // peers are reached through VXLAN at all (`--direct-routing`).
            let routes = self.peer_routes(i).unwrap_or_default();
            let d = match self.datapath(i) {
                Ok(d @ NodeDatapath::Kernel(_)) => {
                    let _ = writeln!(
                        out,
                        "  {}: {}: no tc program attached, every packet takes the kernel path",
                        self.spec.node_name(i),
                        describe_node(&d, &routes)
                    );
                    continue;
                }
                Ok(d) => describe_node(&d, &routes),
                Err(e) => format!("unknown ({e:#})"),
            };
            let share = |from: usize, to: usize| {
                PathShare::between(
                    snap(from, i).unwrap_or(&empty),
                    snap(to, i).unwrap_or(&empty),
                )
            };
            let pods = share(0, 1);
            let all = share(0, 2);
            let _ = writeln!(
                out,
                "  {}: {d}\n    pod rows: {}\n    all rows: {}",
                self.spec.node_name(i),
                pods.describe(),
                all.describe()
            );
        }
        out
    }
}
