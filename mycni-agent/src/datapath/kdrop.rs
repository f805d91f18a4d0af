//! The kernel's own drops on the node's pod and overlay interfaces: the
//! `kfree_skb` tracepoint of mycni-ebpf (`kdrop.rs`), loaded and attached
//! with the tc programs, and the interfaces it watches.
//!
//! It only observes: it is attached when the fast path loads and only when
//! the kernel can run it (BTF for the tracepoint, a `reason` argument);
//! otherwise a warning and `mycni_flow_kernel_drops_unavailable_total`
//! say why, and the datapath runs as without it. Its events go to the ring
//! the tc programs write to (`mycni_flows`).
//!
//! Its link is not pinned: it is detached when the agent's programs are
//! dropped (the agent exits, or the node runs the kernel datapath), as
//! nobody would read its events meanwhile. The interfaces it watches are
//! recomputed each pass from the attachments the datapath wants (every
//! pod veth, `vxlan.1`, `vxlan6.1`; not the underlay, whose drops are not
//! the pods') and written as a whole difference, like every map.

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use aya::Btf;
use aya::maps::{HashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::BtfTracePoint;
use mycni_common::flow::{DROP_IFACES_MAP, DropIface, FLOW_STATS_LEN, FLOW_STATS_MAP, FLOWS_MAP};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use thiserror::Error;

use super::{Datapath, Prog};
use crate::metrics::Metrics;

/// The tracepoint program's name in the object.
pub(crate) const PROG_KFREE_SKB: &str = "mycni_kfree_skb";
/// The kernel tracepoint it attaches to.
const TRACEPOINT: &str = "kfree_skb";

/// Why the kernel's drops are not reported.
#[derive(Debug, Error)]
pub enum KernelDropsError {
    /// No kernel BTF: a tp_btf program cannot be loaded.
    #[error("the kernel has no BTF (/sys/kernel/btf/vmlinux): {0}")]
    NoBtf(#[source] aya::BtfError),
    #[error("program {PROG_KFREE_SKB} is missing from the eBPF object")]
    Missing,
    /// The verifier refused it: e.g. a kernel whose tracepoint has no
    /// `reason` argument (before 5.17).
    #[error("cannot load {PROG_KFREE_SKB}: {0}")]
    Load(#[source] aya::programs::ProgramError),
    #[error("cannot attach {PROG_KFREE_SKB} to {TRACEPOINT}: {0}")]
    Attach(#[source] aya::programs::ProgramError),
    #[error("map {DROP_IFACES_MAP}: {0}")]
    Map(#[from] aya::maps::MapError),
    #[error("cannot read this thread's network namespace: {0}")]
    Netns(#[source] std::io::Error),
}

impl KernelDropsError {
    /// The `reason` label of `mycni_flow_kernel_drops_unavailable_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NoBtf(_) => "no_btf",
            Self::Missing => "missing_program",
            Self::Load(_) => "load",
            Self::Attach(_) => "attach",
            Self::Map(_) | Self::Netns(_) => "map",
        }
    }
}

/// The interfaces whose drops are reported, for the attachments the
/// datapath wants in the network namespace `netns`: pod veths and the VXLAN
/// devices, not the underlay.
pub fn watched(attachments: &BTreeSet<(Prog, u32)>, netns: u32) -> BTreeSet<DropIface> {
    attachments
        .iter()
        .filter(|(p, _)| matches!(p, Prog::FromPod | Prog::FromVxlan))
        .map(|&(_, ifindex)| DropIface { ifindex, netns })
        .collect()
}

/// The inode number of the calling thread's network namespace: the
/// kernel's `net->ns.inum`, which the tracepoint compares. The thread's,
/// not the process's: tests enter namespaces per thread.
pub fn current_netns() -> Result<u32, KernelDropsError> {
    let m = std::fs::metadata("/proc/thread-self/ns/net").map_err(KernelDropsError::Netns)?;
    // nsfs inode numbers are 32-bit (`ns_common::inum`).
    Ok(m.ino() as u32)
}

impl Datapath {
    /// Loads the `kfree_skb` tracepoint and attaches it; it stays attached
    /// as long as `self` lives.
    pub fn attach_kernel_drops(&mut self) -> Result<(), KernelDropsError> {
        let btf = Btf::from_sys_fs().map_err(KernelDropsError::NoBtf)?;
        let prog: &mut BtfTracePoint = self
            .bpf
            .program_mut(PROG_KFREE_SKB)
            .ok_or(KernelDropsError::Missing)?
            .try_into()
            .map_err(KernelDropsError::Load)?;
        prog.load(TRACEPOINT, &btf)
            .map_err(KernelDropsError::Load)?;
        prog.attach().map_err(KernelDropsError::Attach)?;
        Ok(())
    }

    /// Whether the tracepoint was loaded (and so attached) by this process.
    pub fn kernel_drops_attached(&self) -> bool {
        self.bpf
            .program(PROG_KFREE_SKB)
            .and_then(|p| <&BtfTracePoint>::try_from(p).ok())
            .is_some_and(|p| p.fd().is_ok())
    }

    /// Makes `mycni_drop_ifaces` hold exactly `want`; returns (added,
    /// removed).
    pub fn sync_kernel_drops(
        &mut self,
        want: &BTreeSet<DropIface>,
    ) -> Result<(usize, usize), KernelDropsError> {
        let map = self
            .bpf
            .map_mut(DROP_IFACES_MAP)
            .ok_or(KernelDropsError::Missing)?;
        let mut map: HashMap<&mut MapData, DropIface, u8> = HashMap::try_from(map)?;
        // Keys that cannot be read are skipped: the next pass sees them.
        let have: BTreeSet<DropIface> = map.keys().filter_map(Result::ok).collect();
        let mut removed = 0;
        for k in have.difference(want) {
            match map.remove(k) {
                Ok(()) => removed += 1,
                // Gone meanwhile: what was wanted.
                Err(aya::maps::MapError::KeyNotFound) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let mut added = 0;
        for k in want.difference(&have) {
            map.insert(k, &1u8, 0)?;
            added += 1;
        }
        Ok((added, removed))
    }

    /// `mycni_flow_stats` summed over the CPUs, by `FLOW_STAT_*` slot:
    /// events emitted, lost, suppressed (all programs' together).
    pub fn flow_stats(&self) -> Result<[u64; FLOW_STATS_LEN as usize], KernelDropsError> {
        let map = self
            .bpf
            .map(FLOW_STATS_MAP)
            .ok_or(KernelDropsError::Missing)?;
        let stats: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(map)?;
        let mut out = [0; FLOW_STATS_LEN as usize];
        for (i, slot) in out.iter_mut().enumerate() {
            *slot = stats.get(&(i as u32), 0)?.iter().sum();
        }
        Ok(out)
    }

    /// The flow-event ring (`mycni_flows`), taken out of the object: its
    /// one reader (the flows room, or a test). None once taken.
    pub fn take_flow_ring(&mut self) -> Option<Result<RingBuf<MapData>, aya::maps::MapError>> {
        self.bpf.take_map(FLOWS_MAP).map(RingBuf::try_from)
    }
}

/// At load: attaches the tracepoint, or says why not (a warning and a
/// counted reason); the datapath goes on either way.
pub(super) fn start(dp: &mut Datapath, metrics: &Metrics) {
    let m = metrics.collector::<KernelDropMetrics>();
    match dp.attach_kernel_drops() {
        Ok(()) => {
            m.attached.store(1, Ordering::Relaxed);
            tracing::info!(
                "kernel drops on pod and overlay interfaces reported (kfree_skb tracepoint)"
            );
        }
        Err(e) => {
            m.unavailable(e.reason());
            tracing::warn!(error = %e, "kernel drops are not reported; the datapath runs without them");
        }
    }
}

/// Each pass with the pods read: the watched interfaces follow `want`, the
/// datapath's attachments. A failure is logged and retried next pass; it
/// never fails the datapath's pass.
pub(super) fn sync(dp: &mut Datapath, want: &BTreeSet<(Prog, u32)>, metrics: &Metrics) {
    if !dp.kernel_drops_attached() {
        return;
    }
    let m = metrics.collector::<KernelDropMetrics>();
    let r = current_netns().and_then(|netns| {
        let ifaces = watched(want, netns);
        let n = ifaces.len();
        dp.sync_kernel_drops(&ifaces).map(|st| (n, st))
    });
    match r {
        Ok((n, (added, removed))) => {
            m.watched.store(n as u64, Ordering::Relaxed);
            if added + removed > 0 {
                tracing::debug!(added, removed, watched = n, "synced {DROP_IFACES_MAP}");
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot sync the interfaces whose kernel drops are reported")
        }
    }
}

/// `mycni_flow_kernel_drops_attached`, `_watched_interfaces` and
/// `_unavailable_total`.
#[derive(Debug, Default)]
pub(crate) struct KernelDropMetrics {
    attached: AtomicU64,
    watched: AtomicU64,
    /// Failures to attach, by reason.
    failures: Mutex<Vec<(&'static str, u64)>>,
}

impl KernelDropMetrics {
    fn unavailable(&self, reason: &'static str) {
        let mut f = self
            .failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match f.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, n)) => *n += 1,
            None => f.push((reason, 1)),
        }
    }
}

impl Collector for KernelDropMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let m = e.encode_descriptor(
            "mycni_flow_kernel_drops_attached",
            "1 when the kfree_skb tracepoint reports the kernel's drops on pod and overlay interfaces.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(load(&self.attached) as i64).encode(m)?;
        let m = e.encode_descriptor(
            "mycni_flow_kernel_drops_watched_interfaces",
            "Interfaces whose kernel drops are reported (pod veths, vxlan.1, vxlan6.1).",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(load(&self.watched) as i64).encode(m)?;
        let mut m = e.encode_descriptor(
            "mycni_flow_kernel_drops_unavailable",
            "Times the kfree_skb tracepoint could not be attached, by reason (no_btf, load, attach, missing_program).",
            None,
            MetricType::Counter,
        )?;
        let failures = self.failures.lock().map(|f| f.clone()).unwrap_or_default();
        for (reason, n) in failures {
            ConstCounter::new(n).encode(m.encode_family(&[("reason", reason)])?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_and_vxlan_devices_are_watched_not_the_underlay() {
        let want: BTreeSet<(Prog, u32)> = [
            (Prog::FromVxlan, 3),
            (Prog::FromVxlan, 4),
            (Prog::FromUnderlay, 2),
            (Prog::FromPod, 10),
            (Prog::FromPod, 11),
        ]
        .into();
        let got: Vec<u32> = watched(&want, 7).iter().map(|d| d.ifindex).collect();
        assert_eq!(got, [3, 4, 10, 11]);
        assert!(watched(&want, 7).iter().all(|d| d.netns == 7));
    }

    #[test]
    fn a_failure_is_counted_by_reason() {
        use crate::metrics::Format;
        let m = Metrics::default();
        let k = m.collector::<KernelDropMetrics>();
        k.unavailable("no_btf");
        k.unavailable("no_btf");
        let t = m.render(Format::Prometheus).expect("render");
        assert!(
            t.contains("mycni_flow_kernel_drops_unavailable_total{reason=\"no_btf\"} 2"),
            "{t}"
        );
        assert!(t.contains("mycni_flow_kernel_drops_attached 0"), "{t}");
    }
}
