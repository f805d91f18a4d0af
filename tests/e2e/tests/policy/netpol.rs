//! NetworkPolicy on the eBPF datapath (the agents' default): the upstream
//! truth tables on the model lab (see `netpol_suite`). The kernel datapath
//! runs the same suite in `netpol_kernel.rs`, a module of its own so the
//! two labs never run at once (see `mycni_testkit::turn`).

use anyhow::Result;

use crate::netpol_suite;

#[test]
fn upstream_truth_tables_on_the_ebpf_datapath() -> Result<()> {
    let _turn = crate::turn(module_path!());
    netpol_suite::run("mycni-t-np", "ebpf")
}
