//! The policy room's table (`inet mycni_policy`) on the real kernel,
//! written from the room's own desired state, without an agent.
//!
//! Root only: each test makes its own network namespaces (and bpffs).
//! One module per former test binary of tests/e2e; each test takes its
//! module's turn first (`mycni_testkit::turn`), so tests of two modules
//! never overlap, as when cargo ran them one binary after another.

use mycni_testkit::turn::turn;

mod nft;
