//! The plugin as runtimes run it: containerd over CRI, podman on its CNI
//! backend, the reference `bandwidth` plugin chained after it, and the
//! node-level contract between the plugin and the agent.
//!
//! One module per former test binary; each test takes its module's turn
//! first (`mycni_testkit::turn`), so tests of two modules never overlap,
//! as when cargo ran them one binary after another.

#[path = "../common/mod.rs"]
mod common;

use mycni_testkit::turn::turn;

mod bandwidth_chain;
mod containerd_cri;
mod contract;
mod podman;
