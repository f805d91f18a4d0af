//! The datapath room: the programs loaded (or detached) at its start, and
//! each pass mirroring into the maps what the overlay room left in the
//! kernel ([`crate::topology::Output`]) and the node's pods, only when all
//! of the overlay was applied. `mod.rs` is the face: its settings and what
//! the rest of the agent uses.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::{Context, Result};
use mycni_common::{
    CFG_FLOW_EVENTS, CFG_TC_DECAP, CFG_TC_ENCAP, DpConfig, LocalEndpoint, PeerNode, RemoteNode,
};

use mycni_common::net::Mac;

use crate::kernel::{Kernel, PodEndpoints};
use crate::metrics::{Metrics, NetlinkOp, netlink_timed};
use crate::topology::{Output, OverlayState, VxlanSpec};

use super::counters::DatapathMetrics;
use super::error::DatapathError;
use super::maps::*;
use super::programs::*;
use super::{Mode, Section, attach, desired, kdrop, shaping};

/// `vxlan6.1` as a reconcile pass leaves it: its ifindex, its MAC and what
/// the agent holds on it (`Kernel::dump_vxlan6` with the pass's changes
/// applied), for [`DatapathRoom::sync`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Vxlan6State<'a> {
    pub ifindex: u32,
    pub mac: Mac,
    pub overlay: &'a OverlayState,
}

pub struct DatapathRoom {
    pin_dir: PathBuf,
    dp: Option<Datapath>,
    /// Why the node runs on the kernel path (None while the fast path runs).
    why_not: Option<String>,
    /// Attachments this process made or adopted (swapped its program into).
    attached: BTreeSet<(Prog, u32)>,
    /// Attachments the last full pass wanted and could not make, and why:
    /// those interfaces run on the kernel path, the rest of the node does
    /// not (the node stays ready; `/metrics` and `inspect` say which).
    /// Pods another tool shapes are here too, never attached
    /// (`shaping.rs`).
    attach_failed: BTreeMap<(Prog, u32), String>,
    /// When this process first saw each pod veth: a legacy attach waits
    /// for the CNI chain to finish (`attach::LEGACY_SETTLE`).
    first_seen: BTreeMap<u32, Instant>,
    /// Wakes a pods pass once a waiting legacy attach may be made.
    pods_wake: Option<Arc<tokio::sync::Notify>>,
    /// What this process last wrote to `mycni_remote`; event passes diff
    /// against it, full passes re-read the map to catch drift.
    remote_written: Option<BTreeMap<(Ipv4Addr, u8), RemoteNode>>,
    /// The same for `mycni_remote6`.
    remote6_written: Option<BTreeMap<(Ipv6Addr, u8), RemoteNode>>,
    /// The same for `mycni_peers`.
    peers_written: Option<BTreeMap<Ipv4Addr, PeerNode>>,
    local: BTreeMap<Ipv4Addr, LocalEndpoint>,
    local6: BTreeMap<Ipv6Addr, LocalEndpoint>,
    /// Encapsulate and decapsulate in tc (else through `vxlan.1`).
    tc_encap: bool,
    /// The programs emit flow events (`--flow-events`).
    flow_events: bool,
    /// The last pass had no `vxlan.1` (an IPv6-only node): every remote pod
    /// is through `vxlan6.1`, and nothing is encapsulated in tc.
    vxlan6_only: bool,
    proc_sys: PathBuf,
    metrics: Arc<Metrics>,
    /// What this datapath exports at scrape.
    exported: Arc<DatapathMetrics>,
}

impl DatapathRoom {
    /// Loads the programs for `Mode::Ebpf`, or detaches everything mycni
    /// attached for `Mode::Kernel`. Never fails: a node that cannot run the
    /// fast path runs the kernel path, and says why in logs, readiness
    /// detail and metrics.
    pub fn start(section: &Section, object: Option<&[u8]>, metrics: Arc<Metrics>) -> Self {
        let Section {
            mode,
            tc_encap,
            log,
            ref pin_dir,
            ref proc_sys,
        } = *section;
        let mut fp = DatapathRoom {
            pin_dir: pin_dir.to_path_buf(),
            dp: None,
            why_not: None,
            attached: BTreeSet::new(),
            attach_failed: BTreeMap::new(),
            first_seen: BTreeMap::new(),
            pods_wake: None,
            remote_written: None,
            remote6_written: None,
            peers_written: None,
            local: BTreeMap::new(),
            local6: BTreeMap::new(),
            tc_encap,
            flow_events: false,
            vxlan6_only: false,
            proc_sys: proc_sys.to_path_buf(),
            exported: metrics.collector::<DatapathMetrics>(),
            metrics,
        };
        let why = match (mode, object) {
            (Mode::Kernel, _) => "--datapath kernel".to_owned(),
            (Mode::Ebpf, None) => {
                "this agent was built without the eBPF object (cargo xtask build-ebpf --release)"
                    .to_owned()
            }
            (Mode::Ebpf, Some(obj)) => match load(obj, pin_dir, log) {
                Ok(mut dp) => {
                    if log {
                        spawn_log_reader(&mut dp);
                    }
                    kdrop::start(&mut dp, &fp.metrics);
                    fp.dp = Some(dp);
                    if let Err(e) = fp.prepare_conntrack() {
                        tracing::warn!(error = %format!("{e:#}"), "cannot set conntrack sysctls; TCP flows closed after fast-pathed data may be seen as INVALID");
                    }
                    tracing::info!(pin_dir = %pin_dir.display(), "eBPF fast path loaded");
                    fp.metrics.datapath_ebpf.store(true, Ordering::Relaxed);
                    if let Ok(mut p) = fp.exported.pin_dir.lock() {
                        *p = Some(pin_dir.to_path_buf());
                    }
                    return fp;
                }
                Err(e) => {
                    fp.metrics
                        .ebpf_load_failures
                        .fetch_add(1, Ordering::Relaxed);
                    // aya's error carries the verifier log when there is one.
                    tracing::error!(error = %e, "cannot load the eBPF fast path; running the kernel path");
                    format!("eBPF load failed: {}", first_line(&e.to_string()))
                }
            },
        };
        // Programs a previous agent left attached would keep forwarding from
        // maps nobody maintains any more: the kernel path must be alone.
        match detach_all(pin_dir) {
            Ok(0) => {}
            Ok(n) => tracing::info!(links = n, "detached the fast path left by a previous agent"),
            Err(e) => tracing::warn!(error = %e, "cannot detach previous fast-path programs"),
        }
        tracing::info!(reason = %why, "datapath: kernel (routes, ARP, FDB)");
        fp.why_not = Some(why);
        fp
    }

    /// Whether the programs emit flow events into `mycni_flows` (off
    /// until set; written into the config at the next sync).
    pub(crate) fn with_flow_events(mut self, on: bool) -> Self {
        self.flow_events = on;
        self
    }

    /// What to notify for a pods pass (the kernel watch's signal), when a
    /// legacy attach waited (`attach::LEGACY_SETTLE`) and may now be made.
    pub(crate) fn with_pods_wake(mut self, wake: Arc<tokio::sync::Notify>) -> Self {
        self.pods_wake = Some(wake);
        self
    }

    pub fn active(&self) -> bool {
        self.dp.is_some()
    }

    /// One phrase for readiness detail.
    pub fn describe(&self) -> String {
        match &self.why_not {
            None => format!(
                "datapath ebpf, {} ({} local pods, {} remote podCIDRs; IPv6: {} and {}; {} attach{})",
                if self.vxlan6_only {
                    "via vxlan6.1"
                } else if self.tc_encap {
                    "tc encap"
                } else {
                    "via vxlan.1"
                },
                self.local.len(),
                self.remote_written.as_ref().map_or(0, BTreeMap::len),
                self.local6.len(),
                self.remote6_written.as_ref().map_or(0, BTreeMap::len),
                self.dp.as_ref().map_or("no", |dp| dp.attach_mode().name()),
                match self.attach_failed.iter().next() {
                    None => String::new(),
                    Some(((p, ifindex), why)) => format!(
                        "; {} interface(s) on the kernel path, e.g. {} on ifindex {ifindex}: {why}",
                        self.attach_failed.len(),
                        p.name()
                    ),
                }
            ),
            Some(why) => format!("datapath kernel: {why}"),
        }
    }

    /// A fast-pathed TCP flow's packets bypass conntrack's window tracking,
    /// so the FIN or RST the kernel sees at the end lies beyond the window it
    /// last saw; with strict tracking it is INVALID, and kube-proxy drops
    /// INVALID in FORWARD: the connection could not close. The kernel's own
    /// flowtable fast path marks offloaded connections liberal for the same
    /// reason; a tc program cannot set that per-connection flag, so the
    /// node-wide sysctls do it (kube-proxy's --conntrack-tcp-be-liberal sets
    /// the first). Left set when switching to the kernel path: flows
    /// fast-pathed until then still have stale windows.
    fn prepare_conntrack(&self) -> Result<()> {
        for key in [
            "net/netfilter/nf_conntrack_tcp_be_liberal",
            "net/netfilter/nf_conntrack_tcp_ignore_invalid_rst",
        ] {
            let p = self.proc_sys.join(key);
            std::fs::write(&p, "1").with_context(|| format!("writing 1 to {}", p.display()))?;
        }
        Ok(())
    }

    /// Brings maps and attachments in line with the kernel. `out` is what
    /// the overlay holds on `vxlan.1` (and on `vxlan6.1`, on a node with an
    /// IPv6 underlay) after this pass; `pods` (read on full passes) the
    /// pods the plugin set up. A node without `vxlan.1` (IPv6-only) has no
    /// `out.vxlan`, and its `out.state` is empty.
    pub fn sync(
        &mut self,
        out: &Output<'_>,
        pods: Option<&PodEndpoints>,
    ) -> Result<(), DatapathError> {
        let (vxlan, vx, overlay) = (out.index, out.vxlan, out.state);
        let vxlan6 = out.vxlan6.map(|(ifindex, mac, overlay)| Vxlan6State {
            ifindex,
            mac,
            overlay,
        });
        let cfg = self.config(vxlan, vx, vxlan6.as_ref());
        self.vxlan6_only = vx.is_none();
        let Some(dp) = self.dp.as_mut() else {
            return Ok(());
        };
        let pin = self.pin_dir.clone();
        let repinned = dp.repin_missing_maps()?;
        if !repinned.is_empty() {
            tracing::warn!(maps = ?repinned, "pinned maps were removed from bpffs; pinned them again");
        }
        write_config(&pin, &cfg)?;

        let want = desired::remote_maps(overlay, vxlan6.map(|v| v.overlay));
        let full = pods.is_some();
        sync_peers(&pin, &mut self.peers_written, want.peers, full)?;
        sync_remote(&pin, REMOTE, &mut self.remote_written, want.remote, full)?;
        sync_remote(&pin, REMOTE6, &mut self.remote6_written, want.remote6, full)?;

        if let Some(pods) = pods {
            // A shaped pod is neither attached to nor in the local maps, so
            // no program redirects past its qdiscs (shaping.rs).
            let shaped = shaped_pods(pods);
            let fast = without(pods, &shaped);
            self.local = sync_local(&pin, LOCAL, &fast.v4)?;
            self.local6 = sync_local(&pin, LOCAL6, &fast.v6)?;

            let want = desired::attachments(
                vx.map(|v| (vxlan, v.underlay_index)),
                self.tc_encap,
                vxlan6.map(|v| v.ifindex),
                &fast,
            );
            kdrop::sync(dp, &want, &self.metrics);
            self.attach_failed.retain(|a, _| want.contains(a));
            let pinned: BTreeSet<(Prog, u32)> = pinned_links(&pin)?.into_iter().collect();
            let now = Instant::now();
            let veths = pods.veths();
            self.first_seen.retain(|i, _| veths.contains(i));
            for i in veths {
                self.first_seen.entry(i).or_insert(now);
            }
            let waiting = if dp.attach_mode() == attach::AttachMode::Legacy {
                let have: BTreeSet<(Prog, u32)> = pinned.union(&self.attached).copied().collect();
                let (waiting, next) = attach::settling(&want, &have, &self.first_seen, now);
                if let Some(after) = next {
                    wake_after(self.pods_wake.clone(), after);
                }
                waiting
            } else {
                BTreeSet::new()
            };
            self.exported
                .attach_waiting
                .store(waiting.len() as u64, Ordering::Relaxed);
            for &(p, ifindex) in want.difference(&self.attached.clone()) {
                if waiting.contains(&(p, ifindex)) {
                    tracing::debug!(
                        ifindex,
                        "legacy attach waits for the pod's CNI chain to finish"
                    );
                    continue;
                }
                match dp.attach(p, ifindex) {
                    Ok(fresh) => {
                        tracing::debug!(prog = p.name(), ifindex, fresh, "attached");
                        self.attached.insert((p, ifindex));
                        self.attach_failed.remove(&(p, ifindex));
                    }
                    // The veth may be going away under us; the next pass
                    // retries. Until then this interface alone is on the
                    // kernel path, and says why.
                    Err(e) => {
                        tracing::warn!(prog = p.name(), ifindex, error = %e, "cannot attach; this interface runs on the kernel path");
                        self.attach_failed
                            .insert((p, ifindex), first_line(&e.to_string()).to_owned());
                    }
                }
            }
            for (ifindex, why) in &shaped {
                if self
                    .attach_failed
                    .insert((Prog::FromPod, *ifindex), why.clone())
                    .is_none()
                {
                    tracing::info!(ifindex, "{why}");
                }
            }
            self.exported
                .attach_failed
                .store(self.attach_failed.len() as u64, Ordering::Relaxed);
            for (p, ifindex) in pinned_links(&pin)? {
                if !want.contains(&(p, ifindex)) {
                    detach(&pin, p, ifindex)?;
                    self.attached.remove(&(p, ifindex));
                    if shaped.contains_key(&ifindex) {
                        tracing::info!(prog = p.name(), ifindex, "detached from a shaped pod");
                    } else {
                        tracing::info!(prog = p.name(), ifindex, "detached from a gone interface");
                    }
                }
            }
            self.attached.retain(|a| want.contains(a));
        }
        let m = &self.exported;
        // Entries of both families: a dual-stack pod counts twice.
        m.local.store(
            (self.local.len() + self.local6.len()) as u64,
            Ordering::Relaxed,
        );
        m.remote.store(
            (self.remote_written.as_ref().map_or(0, BTreeMap::len)
                + self.remote6_written.as_ref().map_or(0, BTreeMap::len)) as u64,
            Ordering::Relaxed,
        );
        Ok(())
    }
}

/// The pod veths another tool shapes, with the reason each is left to the
/// kernel path. A failed read of the qdiscs shapes none (the fast path as
/// before), and says so.
fn shaped_pods(pods: &PodEndpoints) -> BTreeMap<u32, String> {
    let veths = pods.veths();
    match shaping::qdiscs() {
        Ok(qs) => shaping::shaped(&qs, &veths)
            .into_iter()
            .map(|(i, s)| (i, s.reason(&shaping::ifname(i))))
            .collect(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the qdiscs; pods another tool shapes may lose their shaping to the fast path");
            BTreeMap::new()
        }
    }
}

/// `pods` but those on `shaped` veths.
fn without(pods: &PodEndpoints, shaped: &BTreeMap<u32, String>) -> PodEndpoints {
    let keep = |p: &crate::kernel::PodEndpoint| !shaped.contains_key(&p.ifindex);
    PodEndpoints {
        v4: pods
            .v4
            .iter()
            .filter(|(_, p)| keep(p))
            .map(|(a, p)| (*a, *p))
            .collect(),
        v6: pods
            .v6
            .iter()
            .filter(|(_, p)| keep(p))
            .map(|(a, p)| (*a, *p))
            .collect(),
    }
}

/// Notifies `wake` after `after`, from a task of the runtime this pass runs
/// on (none in a test that syncs by hand: its next sync is the pass).
fn wake_after(wake: Option<Arc<tokio::sync::Notify>>, after: std::time::Duration) {
    let (Some(wake), Ok(rt)) = (wake, tokio::runtime::Handle::try_current()) else {
        return;
    };
    rt.spawn(async move {
        tokio::time::sleep(after).await;
        wake.notify_one();
    });
}

/// Writes one family's podCIDR trie when it differs from what this process
/// last wrote, and on full passes whatever it holds (another writer, a
/// lost entry: drift, said as such).
fn sync_remote<A: MapAddr>(
    pin: &Path,
    map: TrieMap<A>,
    written: &mut Option<BTreeMap<(A, u8), RemoteNode>>,
    want: BTreeMap<(A, u8), RemoteNode>,
    full: bool,
) -> Result<(), DatapathError> {
    let same = written.as_ref() == Some(&want);
    if !full && same {
        return Ok(());
    }
    // Taken first: a write that fails half-way leaves the map unknown,
    // and the next pass reads it again.
    let st = match written.take() {
        // An event pass: only the difference from what this process
        // last wrote, not a read of every entry (5,000 peers: ~10,000
        // system calls).
        Some(have) if !full => map.sync_from(pin, &have, &want)?,
        _ => map.sync(pin, &want)?,
    };
    if full && same && st.set + st.removed > 0 {
        tracing::warn!(
            set = st.set,
            removed = st.removed,
            "repaired drift in {}",
            map.name()
        );
    }
    *written = Some(want);
    Ok(())
}

/// Makes `mycni_peers` hold `want`, as [`sync_remote`] does its map.
fn sync_peers(
    pin: &Path,
    written: &mut Option<BTreeMap<Ipv4Addr, PeerNode>>,
    want: BTreeMap<Ipv4Addr, PeerNode>,
    full: bool,
) -> Result<(), DatapathError> {
    if !full && written.as_ref() == Some(&want) {
        return Ok(());
    }
    match written.take() {
        Some(have) if !full => PEERS.sync_from(pin, &have, &want)?,
        _ => PEERS.sync(pin, &want)?,
    };
    *written = Some(want);
    Ok(())
}

/// Makes one family's local endpoint map hold the pods the kernel has.
fn sync_local<A: MapAddr>(
    pin: &Path,
    map: HashMapOf<A, LocalEndpoint>,
    pods: &BTreeMap<A, crate::kernel::PodEndpoint>,
) -> Result<BTreeMap<A, LocalEndpoint>, DatapathError> {
    let local = desired::local_map(pods);
    let st = map.sync(pin, &local)?;
    if st.set + st.removed > 0 {
        tracing::info!(
            set = st.set,
            removed = st.removed,
            pods = local.len(),
            "synced {}",
            map.name()
        );
    }
    Ok(local)
}

impl DatapathRoom {
    /// What the programs need to know of this node. The encapsulation
    /// fields are those `vxlan.1` sends with: VNI, port and local address
    /// from its spec; TTL and source ports from the sysctls the device
    /// falls back to when it sets neither (the agent sets neither). No
    /// `vxlan.1` (an IPv6-only node): no encapsulation, no IPv4 host, and
    /// every packet for a remote pod that `vxlan6.1` does not take is the
    /// kernel's.
    fn config(&self, vxlan: u32, vx: Option<&VxlanSpec>, vxlan6: Option<&Vxlan6State>) -> DpConfig {
        let (port_min, port_max) = read_port_range(&self.proc_sys);
        let ttl = std::fs::read_to_string(self.proc_sys.join("net/ipv4/ip_default_ttl"))
            .ok()
            .and_then(|s| s.trim().parse::<u8>().ok())
            .unwrap_or(64);
        DpConfig {
            vxlan_ifindex: vxlan,
            // The timeouts the kernel itself would renew these flows with.
            tcp_timeout_ms: read_ms(
                &self.proc_sys,
                "net/netfilter/nf_conntrack_tcp_timeout_established",
            ),
            udp_timeout_ms: read_ms(
                &self.proc_sys,
                "net/netfilter/nf_conntrack_udp_timeout_stream",
            ),
            vtep_mac: vx.map_or([0; 6], |v| v.mac.0),
            _pad: [0; 2],
            underlay_ifindex: match vx {
                Some(v) if self.tc_encap => v.underlay_index,
                _ => 0,
            },
            host_ip: vx.map_or(0, |v| u32::from_ne_bytes(v.local_ip.octets())),
            vni: vx.map_or(0, |v| v.vni),
            vxlan_port: vx.map_or(0, |v| v.port),
            port_min,
            port_max,
            ttl,
            flags: if self.tc_encap && vx.is_some() {
                CFG_TC_ENCAP | CFG_TC_DECAP
            } else {
                0
            } | if self.flow_events { CFG_FLOW_EVENTS } else { 0 },
            vxlan6_ifindex: vxlan6.map_or(0, |v| v.ifindex),
            vtep6_mac: vxlan6.map_or([0; 6], |v| v.mac.0),
            _pad6: [0; 2],
        }
    }
}

/// `net.ipv4.ip_local_port_range`, as vxlan.1 reads it for source ports;
/// the kernel's default when unreadable.
fn read_port_range(proc_sys: &Path) -> (u16, u16) {
    std::fs::read_to_string(proc_sys.join("net/ipv4/ip_local_port_range"))
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(str::parse::<u16>);
            match (it.next(), it.next()) {
                (Some(Ok(lo)), Some(Ok(hi))) if lo < hi => Some((lo, hi)),
                _ => None,
            }
        })
        .unwrap_or((32768, 60999))
}

/// A sysctl in seconds, as milliseconds; 0 (no renewal) when unreadable.
fn read_ms(proc_sys: &Path, key: &str) -> u32 {
    std::fs::read_to_string(proc_sys.join(key))
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .map_or(0, |secs| secs.saturating_mul(1000))
}

/// Loads the object; when pinned maps from an older layout block the load,
/// moves them aside and loads once more with fresh maps. Links keep running
/// the old programs (with the old maps) until the first sync swaps the new
/// ones in, after filling the new maps: forwarding never stops.
fn load(object: &[u8], pin_dir: &Path, log: bool) -> Result<Datapath, DatapathError> {
    match Datapath::load_with_log(object, pin_dir, log) {
        Ok(dp) => Ok(dp),
        Err(DatapathError::Load(e)) if MAPS.iter().any(|m| pin_dir.join(m).exists()) => {
            tracing::warn!(error = %e, "cannot reuse the pinned maps (layout changed?); rebuilding them");
            for m in MAPS {
                let _ = std::fs::remove_file(pin_dir.join(m));
            }
            Datapath::load_with_log(object, pin_dir, log)
        }
        Err(e) => Err(e),
    }
}

/// Forwards the programs' aya-log records (--ebpf-log) to the agent's log.
/// Every packet logs a line: for debugging only.
fn spawn_log_reader(dp: &mut Datapath) {
    let Some(logger) = dp.take_logger() else {
        tracing::warn!("--ebpf-log: the eBPF object has no log map");
        return;
    };
    tracing::warn!(
        "--ebpf-log: every packet the fast path sees is logged at debug level (MYCNI_LOG=debug); not for production"
    );
    tokio::spawn(async move {
        // SAFETY: the logger owns the ring buffer's fd and keeps it open
        // for as long as the AsyncFd owns the logger.
        let registered = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE)
        };
        let mut fd = match registered {
            Ok(fd) => fd,
            Err(e) => {
                tracing::warn!(error = %e.into_parts().1, "cannot poll the eBPF log ring buffer");
                return;
            }
        };
        loop {
            let Ok(mut guard) = fd.readable_mut().await else {
                return;
            };
            guard.get_inner_mut().flush();
            guard.clear_ready();
        }
    });
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s)
}

impl DatapathRoom {
    /// The pass's datapath step. Pods change only through the plugin:
    /// they are read when the kernel says so (`read_pods`) and on full
    /// passes, not on every Node event.
    pub async fn apply(
        &mut self,
        kernel: &Kernel,
        overlay: &crate::topology::Output<'_>,
        read_pods: bool,
    ) -> Result<()> {
        if overlay.failed != 0 || !self.active() {
            return Ok(());
        }
        let pods = if overlay.full || read_pods {
            Some(netlink_timed(NetlinkOp::PodEndpoints, kernel.pod_endpoints()).await?)
        } else {
            None
        };
        self.sync(overlay, pods.as_ref())
            .context("syncing the eBPF maps")
    }
}
