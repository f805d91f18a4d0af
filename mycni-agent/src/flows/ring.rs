//! The reader of `mycni_flows`, the ring the tc programs (and the
//! `kfree_skb` tracepoint) write [`FlowEvent`]s into: each event becomes an
//! [`Observation::Datapath`], its kernel timestamp turned to wall time, and
//! goes to the room through the [`Sink`] (which never waits).
//!
//! The ring is opened from its pin, not from the loaded object, so a
//! restarted agent reads on where the last one stopped (the consumer
//! position lives in the map) and the reader does not depend on the
//! datapath room's handle.

use std::mem::size_of;
use std::path::Path;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use aya::maps::{Map, MapData, RingBuf};
use mycni_common::flow::{FLOWS_MAP, FlowEvent};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::task::JoinHandle;

use super::{Observation, Sink};

/// How long the reader waits after draining the ring. The kernel wakes a
/// reader only when it had caught up, so a reader that drains and sleeps
/// is woken at most once per pause whatever the event rate (at 50,000
/// events a second, 500 per wakeup); the ring (~16,000 events) holds far
/// more than a pause's worth.
const PAUSE: Duration = Duration::from_millis(10);

/// Starts reading the ring pinned at `<pin_dir>/mycni_flows` into `sink`.
/// Must be called inside the tokio runtime. Fails when the ring is not
/// pinned (the kernel datapath, or programs not loaded yet). The task ends
/// only if polling the ring fails.
pub fn spawn(pin_dir: &Path, sink: Sink) -> Result<JoinHandle<()>> {
    let path = pin_dir.join(FLOWS_MAP);
    let data = MapData::from_pin(&path)
        .with_context(|| format!("opening the flow ring {}", path.display()))?;
    let ring = RingBuf::try_from(Map::RingBuf(data))
        .with_context(|| format!("mapping the flow ring {}", path.display()))?;
    // SAFETY: the ring owns its map's fd and keeps it open for as long as
    // the AsyncFd owns the ring.
    let fd = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
        .map_err(|e| e.into_parts().1)
        .with_context(|| format!("polling the flow ring {}", path.display()))?;
    Ok(tokio::spawn(read(fd, sink)))
}

async fn read(mut fd: AsyncFd<RingBuf<MapData>>, sink: Sink) {
    loop {
        let mut guard = match fd.readable_mut().await {
            Ok(g) => g,
            Err(e) => {
                tracing::error!(error = %e, "cannot poll the flow ring; no more datapath flow events");
                return;
            }
        };
        // Once per batch: cheap (vDSO), and follows a step of the wall clock.
        let clock = Clock::now();
        let ring = guard.get_inner_mut();
        while let Some(item) = ring.next() {
            match clock.observation(&item) {
                Some(o) => sink.send(o),
                None => tracing::debug!(len = item.len(), "flow ring record of unknown size"),
            }
        }
        guard.clear_ready();
        drop(guard);
        tokio::time::sleep(PAUSE).await;
    }
}

/// The offset from the programs' clock (`bpf_ktime_get_ns`:
/// CLOCK_MONOTONIC) to wall time (CLOCK_REALTIME), in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clock {
    realtime_minus_monotonic_ns: i128,
}

impl Clock {
    /// Reads both clocks now.
    pub fn now() -> Self {
        let mono = clock_ns(libc::CLOCK_MONOTONIC);
        let real = clock_ns(libc::CLOCK_REALTIME);
        Self {
            realtime_minus_monotonic_ns: real - mono,
        }
    }

    /// The clock of a test: `offset_ns` from monotonic to wall time.
    pub fn with_offset(offset_ns: i128) -> Self {
        Self {
            realtime_minus_monotonic_ns: offset_ns,
        }
    }

    /// `ts_ns` of the monotonic clock as wall time (the epoch if before it).
    pub fn wall(&self, ts_ns: u64) -> SystemTime {
        let ns = i128::from(ts_ns) + self.realtime_minus_monotonic_ns;
        let ns = u64::try_from(ns.max(0)).unwrap_or(u64::MAX);
        SystemTime::UNIX_EPOCH + Duration::from_nanos(ns)
    }

    /// One ring record as an observation; None for a record that is not
    /// one [`FlowEvent`] (a producer of another build).
    pub fn observation(&self, record: &[u8]) -> Option<Observation> {
        let event = parse_event(record)?;
        Some(Observation::Datapath {
            at: self.wall(event.ts_ns),
            event,
        })
    }
}

/// A ring record as a [`FlowEvent`], if it is exactly one.
pub fn parse_event(record: &[u8]) -> Option<FlowEvent> {
    if record.len() != size_of::<FlowEvent>() {
        return None;
    }
    // SAFETY: `record` holds exactly size_of::<FlowEvent>() bytes, read
    // unaligned; FlowEvent is plain old data (every bit pattern is valid).
    Some(unsafe { std::ptr::read_unaligned(record.as_ptr().cast::<FlowEvent>()) })
}

fn clock_ns(clock: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill; both clocks
    // exist on every Linux, so the call cannot fail on these ids.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mycni_common::flow::{FLOW_NEW, FlowSource};

    fn event() -> FlowEvent {
        FlowEvent {
            ts_ns: 5_000_000_123,
            src: [10, 244, 1, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            dst: [10, 244, 1, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            sport: 40000,
            dport: 80,
            ifindex: 7,
            count: 1,
            reason: 8,
            proto: 6,
            family: 4,
            tcp_flags: 0x02,
            source: FlowSource::Pod as u8,
            kind: FLOW_NEW,
            _pad: [0; 5],
        }
    }

    fn bytes(e: &FlowEvent) -> Vec<u8> {
        // SAFETY: a FlowEvent's bytes, all initialised (explicit padding).
        unsafe {
            std::slice::from_raw_parts(std::ptr::from_ref(e).cast::<u8>(), size_of::<FlowEvent>())
        }
        .to_vec()
    }

    #[test]
    fn a_record_becomes_an_observation_at_wall_time() {
        let clock = Clock::with_offset(1_700_000_000_000_000_000);
        let e = event();
        // Unaligned on purpose: the ring only promises 8, a Vec offset 1.
        let mut buf = vec![0u8];
        buf.extend(bytes(&e));
        let Some(Observation::Datapath { at, event }) = clock.observation(&buf[1..]) else {
            panic!("not a datapath observation");
        };
        assert_eq!(event, e);
        let want = SystemTime::UNIX_EPOCH + Duration::from_nanos(1_700_000_005_000_000_123);
        assert_eq!(at, want);
    }

    #[test]
    fn records_of_another_size_are_refused() {
        let b = bytes(&event());
        assert!(parse_event(&b[..63]).is_none());
        let mut longer = b.clone();
        longer.push(0);
        assert!(parse_event(&longer).is_none());
        assert!(parse_event(&b).is_some());
    }

    #[test]
    fn the_offset_is_wall_time_less_uptime() {
        let c = Clock::now();
        let now = SystemTime::now();
        let mono = clock_ns(libc::CLOCK_MONOTONIC);
        let at = c.wall(u64::try_from(mono).unwrap_or(0));
        let skew = match at.duration_since(now) {
            Ok(d) => d,
            Err(e) => e.duration(),
        };
        assert!(skew < Duration::from_millis(100), "{skew:?}");
        // Before the epoch (a nonsense timestamp) is the epoch, not a panic.
        assert_eq!(Clock::with_offset(-10).wall(5), SystemTime::UNIX_EPOCH);
    }
}
