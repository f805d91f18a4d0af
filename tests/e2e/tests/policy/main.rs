//! NetworkPolicy end to end: the upstream truth tables on the model lab
//! on both datapaths, live connections and first packets, the policy room
//! in a running agent, and `inspect policy`.
//!
//! One module per former test binary; each test takes its module's turn
//! first (`mycni_testkit::turn`), so tests of two modules never overlap,
//! as when cargo ran them one binary after another.

#[path = "../common/mod.rs"]
mod common;

use mycni_testkit::turn::turn;

mod netpol_suite;
mod policy_live_suite;

mod agent_policy;
mod netpol;
mod netpol_kernel;
mod policy_inspect;
mod policy_live;
mod policy_live_kernel;
