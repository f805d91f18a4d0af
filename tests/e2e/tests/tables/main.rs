//! The agent's nftables on the kernel path: IPv6 anti-spoofing
//! (`ip6 mycni_antispoof`) and the underlay filter that lets only peers
//! tunnel in (`mycni_underlay`).
//!
//! One module per former test binary; each test takes its module's turn
//! first (`mycni_testkit::turn`), so tests of two modules never overlap,
//! as when cargo ran them one binary after another.

#[path = "../common/mod.rs"]
mod common;

use mycni_testkit::turn::turn;

mod antispoof6;
mod underlay_filter;
