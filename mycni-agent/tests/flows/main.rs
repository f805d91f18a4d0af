//! The flows room against the real kernel: the kernel's own drops, from
//! the `kfree_skb` tracepoint of the agent's object to folded events.
//!
//! Root only: each test makes its own network namespaces (and bpffs).
//! One module per former test binary of tests/e2e; each test takes its
//! module's turn first (`mycni_testkit::turn`), so tests of two modules
//! never overlap, as when cargo ran them one binary after another.

use mycni_testkit::turn::turn;

mod kdrop;
