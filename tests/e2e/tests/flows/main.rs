//! Flows as a user reads them on the model lab: `mycni-agent flows` and
//! `mycni-agent explain` against what the probes saw.
//!
//! One module per former test binary; each test takes its module's turn
//! first (`mycni_testkit::turn`), so tests of two modules never overlap,
//! as when cargo ran them one binary after another.

#[path = "../common/mod.rs"]
mod common;

use mycni_testkit::turn::turn;

mod flows;
mod flows_explain;
mod flows_no_policy;
