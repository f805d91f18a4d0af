//! What deploy/ promises, checked: the manifests without a cluster, the
//! config, probes, RBAC and capabilities of the DaemonSet with the real
//! agent in a lab node, and the monitoring against a real scrape.
//!
//! One module per former test binary; each test takes its module's turn
//! first (`mycni_testkit::turn`), so tests of two modules never overlap,
//! as when cargo ran them one binary after another.

#[path = "../common/mod.rs"]
mod common;

use mycni_testkit::turn::turn;

mod agent_caps;
mod deploy_config;
mod deploy_manifests;
mod deploy_probes;
mod deploy_rbac;
mod metrics;
mod metrics_surface;
