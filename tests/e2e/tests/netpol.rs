//! NetworkPolicy on the eBPF datapath (the agents' default): the upstream
//! truth tables on the model lab (see `netpol_suite`). The kernel datapath
//! runs the same suite in `netpol_kernel.rs`, a binary of its own so the
//! two labs never run at once.

use anyhow::Result;

mod common;
mod netpol_suite;

#[test]
fn upstream_truth_tables_on_the_ebpf_datapath() -> Result<()> {
    netpol_suite::run("mycni-t-np", "ebpf")
}
