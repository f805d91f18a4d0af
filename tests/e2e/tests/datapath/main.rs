//! The datapath end to end: the eBPF fast path in the lab with real agents
//! (IPv4 and IPv6, datapath v2 and direct routing, the legacy tc attach),
//! and new pods in the fast-path maps at once. `cargo xtask test` runs
//! `fastpath`, `agent_fastpath6`, `datapath_v2` and `legacy_tc` a second
//! time with `MYCNI_TC_ATTACH=legacy`.
//!
//! One module per former test binary; each test takes its module's turn
//! first (`mycni_testkit::turn`), so tests of two modules never overlap,
//! as when cargo ran them one binary after another.

#[path = "../common/mod.rs"]
mod common;

use mycni_testkit::turn::turn;

mod agent_fastpath6;
mod datapath_v2;
mod fastpath;
mod legacy_tc;
mod pod_events;
