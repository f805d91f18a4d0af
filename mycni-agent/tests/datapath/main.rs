//! The datapath room against the real kernel: the tc programs verdict by
//! verdict (`BPF_PROG_TEST_RUN`), the loader against the kernel's BTF
//! (kfuncs in vmlinux or a module), the object loaded and attached over
//! TCX, and IPv6 through the fast path of two namespaces with no agent.
//! `cargo xtask kernels` runs `kfunc_module` and `ebpf_prog` in each of
//! Debian's stock kernels; `cargo xtask test` runs `fastpath6` a second
//! time with `MYCNI_TC_ATTACH=legacy`.
//!
//! Root only: each test makes its own network namespaces (and bpffs).
//! One module per former test binary of tests/e2e; each test takes its
//! module's turn first (`mycni_testkit::turn`), so tests of two modules
//! never overlap, as when cargo ran them one binary after another.

use mycni_testkit::turn::turn;

mod ebpf_prog;
mod ebpf_slice;
mod fastpath6;
mod kfunc_module;
