//! `cargo xtask soak`: the long reliability cases on a lab, each reporting
//! the load it held, the faults it injected, the longest traffic gap, the
//! leaks it found (must be 0) and the time the system took to repair.
//! Short versions of the same cases run in the normal test suite.

use std::fmt::Write as _;
use std::time::Duration;

pub mod churn;
pub mod faults;
pub mod flows;
pub mod policy;

/// One row of the soak table.
#[derive(Debug, Clone, Default)]
pub struct CaseResult {
    pub case: String,
    /// What kept running during the case (pods, flows).
    pub load: String,
    /// What was done to the system.
    pub faults: String,
    /// Longest gap between successful round trips of the long-lived flows.
    pub longest_gap: Option<Duration>,
    /// Leaked leases, veths, routes, neighbours, map entries; must be 0.
    pub leaks: usize,
    /// Longest time from a fault to the system being whole again.
    pub repair: Option<Duration>,
    /// Anything a reader needs to trust the row (what was leaked, ...).
    pub notes: String,
}

fn ms(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".to_owned(), |d| format!("{} ms", d.as_millis()))
}

/// The results as a markdown table.
pub fn table(results: &[CaseResult]) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "| case | load held | faults injected | longest gap | leaks | time to repair | notes |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|");
    for r in results {
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} |",
            r.case,
            r.load,
            r.faults,
            ms(r.longest_gap),
            r.leaks,
            ms(r.repair),
            r.notes
        );
    }
    o
}

/// How long the soak's cases run.
#[derive(Debug, Clone, Copy)]
pub struct Scale {
    pub churn_cycles: usize,
    pub agent_kills: usize,
    pub agent_absent: Duration,
    pub api_outage: Duration,
}

impl Scale {
    /// What `cargo xtask soak` runs (about 5 minutes here).
    pub const FULL: Scale = Scale {
        churn_cycles: 1000,
        agent_kills: 20,
        agent_absent: Duration::from_secs(10),
        api_outage: Duration::from_secs(60),
    };
}

/// A lab of the soak's own (`mycnis-*`), with the API fixture in this
/// process so cases can take it away, torn down on drop.
struct SoakLab(crate::Lab);

impl Drop for SoakLab {
    fn drop(&mut self) {
        self.0.down();
    }
}

fn soak_lab(
    bins: &crate::Bins,
    root: &std::path::Path,
    nodes: usize,
    pods: usize,
) -> anyhow::Result<SoakLab> {
    soak_lab_of(bins, root, nodes, pods, false)
}

/// [`soak_lab`], or with `model` the upstream NetworkPolicy model (3 x 3
/// pods in namespaces x, y, z, both families, Pod objects).
fn soak_lab_of(
    bins: &crate::Bins,
    root: &std::path::Path,
    nodes: usize,
    pods: usize,
    model: bool,
) -> anyhow::Result<SoakLab> {
    let spec = crate::Spec {
        prefix: "mycnis".into(),
        nodes,
        pods,
        root: root.to_path_buf(),
        bins: bins.clone(),
        // The agent's defaults: its full pass is 5 minutes away, so every
        // repair a case times comes from a watch event or a kernel
        // notification, as in a cluster.
        agent_args: vec![],
        in_process_api: true,
        // Its cases count IPv4 state (routes, map entries, leases); the
        // model's pods have both families.
        stack: if model {
            crate::Stack::Dual
        } else {
            crate::Stack::Ipv4Only
        },
        model,
    };
    // A soak that crashed earlier leaves its lab behind: clear it first.
    crate::Lab::attach(spec.clone()).down();
    Ok(SoakLab(crate::Lab::up(spec)?))
}

/// Runs every case whose name contains one of `only` (every case when
/// `only` is empty); a case that fails still gets its row (its error in the
/// notes, leaks counted as 1) so the table shows everything that ran.
pub fn run_all(
    bins: &crate::Bins,
    root: &std::path::Path,
    scale: Scale,
    only: &[String],
) -> Vec<CaseResult> {
    let wanted = |case: &str| only.is_empty() || only.iter().any(|o| case.contains(o.as_str()));
    let mut rows = vec![];
    let mut record = |case: &str, r: anyhow::Result<CaseResult>| {
        let row = r.unwrap_or_else(|e| CaseResult {
            case: case.to_string(),
            leaks: 1,
            notes: format!("FAILED: {e:#}").replace('\n', " "),
            ..Default::default()
        });
        eprintln!("soak: {}: done", row.case);
        rows.push(row);
    };
    if wanted("churn and leaks") {
        eprintln!("soak: churn and leaks ({} cycles)", scale.churn_cycles);
        record(
            "churn and leaks",
            soak_lab(bins, root, 1, 0)
                .and_then(|l| churn::churn(&l.0, 1, scale.churn_cycles, 0x636875726e)),
        );
    }
    type Case<'a> = (
        &'a str,
        Box<dyn Fn(&crate::Lab) -> anyhow::Result<CaseResult> + 'a>,
    );
    let faults: Vec<Case> = vec![
        (
            "agent SIGKILL mid-reconcile",
            Box::new(|l| faults::agent_kills(l, scale.agent_kills, 0x5eed)),
        ),
        (
            "agent absent",
            Box::new(|l| faults::agent_absent(l, scale.agent_absent)),
        ),
        (
            "API server unreachable",
            Box::new(|l| faults::api_outage(l, scale.api_outage)),
        ),
        ("kernel state removed", Box::new(faults::kernel_drift)),
        ("node host IP changed", Box::new(faults::host_ip_change)),
        (
            "upgrade with a changed map layout",
            Box::new(faults::upgrade_changed_layout),
        ),
    ];
    let faults: Vec<Case> = faults.into_iter().filter(|(c, _)| wanted(c)).collect();
    if !faults.is_empty() {
        eprintln!("soak: agent and kernel faults");
        match soak_lab(bins, root, 2, 1) {
            Ok(l) => {
                let l = &l.0;
                let _ = faults::wait_whole(l, Duration::from_secs(30));
                for (case, run) in &faults {
                    record(case, run(l));
                }
            }
            Err(e) => record("fault lab", Err(e)),
        }
    }
    if wanted("policy") {
        eprintln!("soak: policy under agent and API faults");
        match soak_lab_of(bins, root, 3, 3, true) {
            Ok(l) => {
                for (case, r) in policy::policy_faults(&l.0, scale) {
                    record(&case, r);
                }
            }
            Err(e) => record("policy lab", Err(e)),
        }
    }
    // Three nodes: node 2's pods lose their range, node 1 <-> 3 must not notice.
    if wanted("node re-added with a new podCIDR") {
        record(
            "node re-added with a new podCIDR",
            soak_lab(bins, root, 3, 1).and_then(|l| faults::node_readded(&l.0)),
        );
    }
    rows
}
