//! The one place every packet is accounted, once, after its program
//! decided, and where flow events are emitted (`flow`).

use aya_ebpf::programs::TcContext;
#[cfg(feature = "packet-log")]
use aya_log_ebpf::debug;
use mycni_common::{DpFamily, DpPath, counter_index};

use crate::flow;
use crate::gate::From;
use crate::maps::COUNTERS;
use crate::parse::Tuple;

/// Counts a packet of `len` bytes (as it arrived) under the path it took or
/// the reason it was left to the kernel, in the row of `family`; with flow
/// events on (`flow`: the connection's tuple), announces its connection
/// when new or on another path.
#[inline(always)]
pub(crate) fn account(
    ctx: &TcContext,
    from: From,
    family: DpFamily,
    path: DpPath,
    len: u32,
    verdict: i32,
    flow: Option<&mut Tuple>,
) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter_index(family, path)) {
        // SAFETY: the slot is this CPU's own; no other program instance
        // touches it concurrently, so plain adds are race-free.
        unsafe {
            (*slot).packets += 1;
            (*slot).bytes += u64::from(len);
        }
    }
    if let Some(t) = flow {
        flow::observe(ctx, from, t, path);
    }
    // Only in an object built with the `packet-log` feature, and off there
    // unless the agent runs with --ebpf-log (AYA_LOG_LEVEL is then a
    // load-time 0 and the verifier prunes the call). Not in the default
    // object: aya-log's record writer is a subprogram, and verifiers
    // before 6.12 count its minimal 32-byte frame on top of
    // mycni_from_underlay's 488 (544 > 512: Debian 12's 6.1 rejects it).
    #[cfg(feature = "packet-log")]
    debug!(
        ctx,
        "from {} path {} len {} verdict {}", from as u32, path as u32, len, verdict
    );
    #[cfg(not(feature = "packet-log"))]
    let _ = verdict;
}
