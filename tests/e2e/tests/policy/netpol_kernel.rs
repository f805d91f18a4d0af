//! NetworkPolicy on `--datapath kernel`: the same truth tables as
//! `netpol.rs` (see `netpol_suite`), on a lab of its own.

use anyhow::Result;

use crate::netpol_suite;

#[test]
fn upstream_truth_tables_on_the_kernel_datapath() -> Result<()> {
    let _turn = crate::turn(module_path!());
    netpol_suite::run("mycni-t-npk", "kernel")
}
