//! The one place every packet is accounted, once, after its program
//! decided, and where flow events are emitted (`flow`).

use aya_ebpf::programs::TcContext;
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
    // Off unless the agent runs with --ebpf-log: AYA_LOG_LEVEL is then a
    // load-time 0 and the verifier prunes this call from the hot path.
    debug!(
        ctx,
        "from {} path {} len {} verdict {}", from as u32, path as u32, len, verdict
    );
}
