//! NetworkPolicy on `--datapath kernel`: the same truth tables as
//! `netpol.rs` (see `netpol_suite`), on a lab of its own.

use anyhow::Result;

mod common;
mod netpol_suite;

#[test]
fn upstream_truth_tables_on_the_kernel_datapath() -> Result<()> {
    netpol_suite::run("mycni-t-npk", "kernel")
}
