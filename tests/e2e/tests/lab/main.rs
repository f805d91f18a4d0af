//! The whole system in the lab: every pod reaching every pod, the short
//! fault and churn cases of the soak, and the lab `cargo xtask kernels`
//! runs in each of Debian's stock kernels (`kernel_matrix`).
//!
//! One module per former test binary; each test takes its module's turn
//! first (`mycni_testkit::turn`), so tests of two modules never overlap,
//! as when cargo ran them one binary after another.

#[path = "../common/mod.rs"]
mod common;

use mycni_testkit::turn::turn;

mod churn;
mod faults;
mod kernel_matrix;
mod lab;
