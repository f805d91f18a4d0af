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
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use aya::maps::{HashMap, Map, MapData, RingBuf};
use mycni_common::flow::{
    DROP_LIMIT_MAP, DropKey, DropLimit, FLOW_DROP, FLOWS_MAP, FlowEvent, FlowSource,
};
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
/// How often the reader reports the kernel drops folded after a flow's
/// last event: the tracepoint's rate limit (once a second per flow and
/// reason).
const FOLDED_EVERY: Duration = Duration::from_secs(1);
const SECOND_NS: u64 = 1_000_000_000;

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
    let folded = Folded {
        path: pin_dir.join(DROP_LIMIT_MAP),
        map: None,
        warned: false,
    };
    Ok(tokio::spawn(read(fd, sink, folded)))
}

async fn read(mut fd: AsyncFd<RingBuf<MapData>>, sink: Sink, mut folded: Folded) {
    let mut sweep = tokio::time::interval(FOLDED_EVERY);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let readable = tokio::select! {
            r = fd.readable_mut() => r,
            _ = sweep.tick() => {
                folded.sweep(&sink);
                continue;
            }
        };
        let mut guard = match readable {
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

/// The `kfree_skb` tracepoint's rate limit, from its pin. The program
/// reports a flow's folded drops only with that flow's next drop, so a
/// burst that stops would keep its count forever: once a flow's second
/// is over, the reader reports what it folded and removes its entry (the
/// flow's next drop then reports at once, as it would have). A drop on
/// another CPU between the reader's lookup and removal can be counted in
/// both reports, or in neither: a microsecond's window after a second of
/// silence.
struct Folded {
    path: PathBuf,
    /// None until the pin opens (programs of an older release pin no
    /// limit; the kernel datapath has no programs).
    map: Option<HashMap<MapData, DropKey, DropLimit>>,
    warned: bool,
}

impl Folded {
    fn sweep(&mut self, sink: &Sink) {
        if self.map.is_none() {
            match open_limit(&self.path) {
                Ok(m) => self.map = Some(m),
                Err(e) => {
                    if !self.warned {
                        tracing::debug!(error = %e, "no kernel drop limit to read; folded drops are reported with the flow's next drop only");
                        self.warned = true;
                    }
                    return;
                }
            }
        }
        let Some(map) = self.map.as_mut() else {
            return;
        };
        let events = take_folded(map);
        if events.is_empty() {
            return;
        }
        let clock = Clock::now();
        for event in events {
            sink.send(Observation::Datapath {
                at: clock.wall(event.ts_ns),
                event,
            });
        }
    }
}

/// The kernel drop limit pinned under `pin_dir`.
pub fn open_drop_limit(pin_dir: &Path) -> Result<HashMap<MapData, DropKey, DropLimit>> {
    open_limit(&pin_dir.join(DROP_LIMIT_MAP))
}

/// Removes from the drop limit every flow whose second is over, and
/// returns an event for each that had drops folded: what the program
/// would have reported with the flow's next drop.
pub fn take_folded(map: &mut HashMap<MapData, DropKey, DropLimit>) -> Vec<FlowEvent> {
    let now = u64::try_from(clock_ns(libc::CLOCK_MONOTONIC)).unwrap_or(0);
    let over: Vec<(DropKey, DropLimit)> = map
        .iter()
        .filter_map(Result::ok)
        .filter(|(_, limit)| second_over(limit, now))
        .collect();
    let mut events = Vec::new();
    for (key, limit) in over {
        // Gone already (evicted, or removed by another reader): nothing
        // of it is this reader's to report.
        if map.remove(&key).is_ok() && limit.folded > 0 {
            events.push(folded_event(&key, limit.folded, now));
        }
    }
    events
}

fn open_limit(path: &Path) -> Result<HashMap<MapData, DropKey, DropLimit>> {
    let data = MapData::from_pin(path)
        .with_context(|| format!("opening the drop limit {}", path.display()))?;
    HashMap::try_from(Map::LruHashMap(data))
        .with_context(|| format!("mapping the drop limit {}", path.display()))
}

/// Whether the program's once-a-second window of this flow is over: its
/// next drop would be reported, folded ones with it.
fn second_over(limit: &DropLimit, now_ns: u64) -> bool {
    now_ns.wrapping_sub(limit.last_ns) >= SECOND_NS
}

/// The drop event the program would have written with the flow's next
/// drop, for the `count` it folded (TCP flags unknown: those packets'
/// headers were not read).
fn folded_event(key: &DropKey, count: u64, now_ns: u64) -> FlowEvent {
    FlowEvent {
        ts_ns: now_ns,
        src: key.src,
        dst: key.dst,
        sport: key.sport,
        dport: key.dport,
        ifindex: key.ifindex,
        count: u32::try_from(count).unwrap_or(u32::MAX),
        reason: key.reason,
        proto: key.proto,
        family: key.family,
        tcp_flags: 0,
        source: FlowSource::KernelDrop as u8,
        kind: FLOW_DROP,
        _pad: [0; 5],
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

    /// What stays folded once a flow's second is over is reported as
    /// the program reports a drop, with the count it folded.
    #[test]
    fn a_fold_left_after_a_flows_last_drop_becomes_its_event() {
        let key = DropKey {
            src: event().src,
            dst: event().dst,
            sport: 40000,
            dport: 80,
            ifindex: 7,
            netns: 4026531840,
            reason: 2,
            proto: 17,
            family: 4,
        };
        let limit = DropLimit {
            last_ns: 10 * SECOND_NS,
            folded: 41,
        };
        assert!(!second_over(&limit, 10 * SECOND_NS + SECOND_NS - 1));
        assert!(second_over(&limit, 11 * SECOND_NS));
        let e = folded_event(&key, limit.folded, 11 * SECOND_NS);
        assert_eq!(
            (e.count, e.reason, e.proto, e.family, e.kind, e.source),
            (41, 2, 17, 4, FLOW_DROP, FlowSource::KernelDrop as u8)
        );
        assert_eq!(
            (e.src, e.dst, e.sport, e.dport, e.ifindex),
            (key.src, key.dst, 40000, 80, 7)
        );
        assert_eq!(folded_event(&key, u64::MAX, 0).count, u32::MAX);
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
