//! The overlay end to end: the real agent in lab nodes against the API
//! fixture, peers as Node events come and go (IPv4, IPv6 over an IPv4
//! underlay, IPv6-only nodes, an IPv6 underlay), hostile Nodes, drift
//! repaired, incremental passes matching a full one.
//!
//! One module per former test binary; each test takes its module's turn
//! first (`mycni_testkit::turn`), so tests of two modules never overlap,
//! as when cargo ran them one binary after another.

#[path = "../common/mod.rs"]
mod common;

use mycni_testkit::turn::turn;

mod agent;
mod agent_incremental;
mod agent_ipv6;
mod agent_ipv6_only;
mod agent_underlay6;
