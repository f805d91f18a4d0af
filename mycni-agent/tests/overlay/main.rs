//! The overlay room's kernel adapter against the real kernel: what
//! `apply` programs `dump` reads back, and peer routes through nexthop
//! objects.
//!
//! Root only: each test makes its own network namespaces (and bpffs).
//! One module per former test binary of tests/e2e; each test takes its
//! module's turn first (`mycni_testkit::turn`), so tests of two modules
//! never overlap, as when cargo ran them one binary after another.

use mycni_testkit::turn::turn;

mod kernel;
mod nexthops;
