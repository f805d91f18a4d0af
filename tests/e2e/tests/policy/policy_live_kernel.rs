//! NetworkPolicy on live connections and from a pod's first packet on
//! `--datapath kernel` (see `policy_live_suite`).

use anyhow::Result;

use crate::policy_live_suite;

#[test]
fn live_connections_and_first_packets_follow_policy_on_the_kernel_datapath() -> Result<()> {
    let _turn = crate::turn(module_path!());
    policy_live_suite::run("mycni-t-plk", "kernel")
}
