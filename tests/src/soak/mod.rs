//! `cargo xtask soak`: the long reliability cases on a lab, each reporting
//! the load it held, the faults it injected, the longest traffic gap, the
//! leaks it found (must be 0) and the time the system took to repair.
//! Short versions of the same cases run in the normal test suite.

use std::fmt::Write as _;
use std::time::Duration;

pub mod churn;
pub mod faults;
pub mod flows;

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
