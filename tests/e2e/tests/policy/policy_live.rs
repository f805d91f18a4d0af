//! NetworkPolicy on live connections and from a pod's first packet, on the
//! eBPF datapath (see `policy_live_suite`); `policy_live_kernel.rs` runs
//! the same on `--datapath kernel`, a module of its own so the two model
//! labs never run at once (see `mycni_testkit::turn`).

use anyhow::Result;

use crate::policy_live_suite;

#[test]
fn live_connections_and_first_packets_follow_policy_on_the_ebpf_datapath() -> Result<()> {
    let _turn = crate::turn(module_path!());
    policy_live_suite::run("mycni-t-pl", "ebpf")
}
