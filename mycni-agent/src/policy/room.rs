//! The policy room: its watch (Pods, Namespaces, NetworkPolicies), its
//! pure desired state (`compile` then `sets`), its apply step (`nft`) and
//! its metrics, in a task of its own beside the overlay's loop, so that
//! neither waits for the other.
//!
//! A pass: read the caches and this node's pod records, convert (what
//! cannot be read is logged and counted once, and fails closed: a bad rule
//! allows nothing, a policy whose selector cannot be read selects nothing
//! and so isolates nothing, which is the API server's own validation's
//! job to prevent), compile this node's pods, and write the sets'
//! difference in one nft transaction. Nothing is written before the
//! three lists are complete: a policy seen before the pods it allows would
//! cut them off.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use futures::StreamExt;
use mycni_common::contract::{POD_RECORDS_DIR, PodRecord};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::compile_node;
use super::counters::drop_counters;
use super::inspect::View;
use super::metrics::{PolicyMetrics, read_counters};
use super::nft::{
    FAMILY, TABLE, diff_script, full_script, parse_stamped_epoch, remove_script, settle_script,
    whole_is_cheaper,
};
use super::sets::{self, Desired};
use crate::cluster::Cluster;
use crate::cluster::convert::{Problem, WATCHED};
use crate::cluster::model::Key;
use crate::cluster::view::{Snapshot, Watch};
use crate::epoch::PolicyEpoch;
use crate::metrics::Metrics;
use crate::nft;

use mycni_common::POLICY_EPOCH_MAX;

/// Events closer together than this share a pass: `kubectl apply` of a
/// few objects, a pod's create then status.
const DEBOUNCE: Duration = Duration::from_millis(10);
/// How often the pod records' directory is looked at besides its inotify
/// watch (which wakes the room at once): a stat, so that a record is read
/// within this even where the watch failed or missed it.
const RECORDS_POLL: Duration = Duration::from_millis(100);
const RETRY_MIN: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(10);

pub struct PolicyRoom {
    node: String,
    records: PathBuf,
    /// Where the epoch goes for the fast path, which checks established
    /// flows' stamps against it (the loop's handle: `crate::epoch`).
    fast_epoch: Arc<dyn PolicyEpoch>,
    /// The policy epoch the table stamps connections with; a new one with
    /// every change written.
    epoch: u32,
    metrics: Arc<PolicyMetrics>,
    /// What the table holds, as last written; None: write it whole.
    applied: Option<Desired>,
    /// Problems already logged and counted, so a bad object is reported
    /// once, not at every pass.
    reported: BTreeSet<String>,
    /// Problems this pass found, by kind of object.
    found: BTreeMap<&'static str, u64>,
    /// What `inspect policy` answers from: the pods as last written.
    view: Arc<Mutex<View>>,
    /// The view of the pass being written, shown once it is.
    next_view: View,
    /// The cluster each pass read, for the flows room's attributions.
    published: watch::Sender<Arc<Cluster>>,
}

/// The oldest watch event no write has enforced yet (one stamp: a pass
/// enforces all of them at once, and the oldest is the latency).
type Pending = Arc<Mutex<Option<std::time::Instant>>>;

/// Stamps each watch event as it arrives, then wakes the room: the room
/// may be busy writing when one arrives, and a `Notify` permit keeps no
/// time.
async fn relay_events(changed: Arc<Notify>, pending: Pending, wake: Arc<Notify>) {
    loop {
        changed.notified().await;
        if let Ok(mut p) = pending.lock() {
            p.get_or_insert_with(std::time::Instant::now);
        }
        wake.notify_one();
    }
}

/// The room's settings.
#[derive(Debug, Clone)]
pub struct Section {
    /// This node's name: the room enforces for its pods only.
    pub node: String,
    /// Where the plugin leaves its pod records.
    pub state_dir: PathBuf,
    /// How often the table is checked for being there at all.
    pub resync: Duration,
}

/// What the room is handed by the agent.
pub struct Deps {
    pub client: kube::Client,
    pub metrics: Arc<Metrics>,
    /// Where the epoch goes for the fast path.
    pub fast_epoch: Arc<dyn PolicyEpoch>,
    /// Where each pass's cluster goes, for the flows room.
    pub published: watch::Sender<Arc<Cluster>>,
}

/// Starts the room; it writes nothing until the lists have synced.
pub fn spawn(section: &Section, deps: Deps) -> JoinHandle<()> {
    let Deps {
        client,
        metrics,
        fast_epoch,
        published: cluster,
    } = deps;
    let (node, resync) = (section.node.clone(), section.resync);
    // Past whatever epoch an earlier agent left (the pinned map; on the
    // kernel path only its table's stamp tells): every flow stamped under
    // it is judged again once.
    let left = fast_epoch
        .read()
        .into_iter()
        .chain(nft::list_chain(FAMILY, TABLE, "stamp").and_then(|l| parse_stamped_epoch(&l)))
        .max();
    let epoch = next_epoch(left.unwrap_or(0));
    let records = section.state_dir.join(POD_RECORDS_DIR);
    // Registered now, so its series (enforcing 0) are there while the
    // lists sync.
    let collector = metrics.collector::<PolicyMetrics>();
    let view: Arc<Mutex<View>> = Arc::default();
    let shown = view.clone();
    metrics.register_inspector(
        "policy",
        Arc::new(move |pod: &str| {
            // Read before the view is locked: nft is a process.
            let counters = read_counters().unwrap_or_default();
            let report = shown
                .lock()
                .map_err(|_| "the policy room's view is poisoned".to_string())?
                .report(pod, &counters)?;
            serde_json::to_string(&report).map_err(|e| e.to_string())
        }),
    );
    tokio::spawn(async move {
        let watch = Watch::start(client, &metrics, WATCHED).await;
        let mut room = PolicyRoom {
            node,
            records,
            fast_epoch,
            epoch,
            metrics: collector,
            applied: None,
            reported: BTreeSet::new(),
            found: BTreeMap::new(),
            view,
            next_view: View::default(),
            published: cluster,
        };
        room.run(watch, resync).await;
    })
}

/// Removes the table (`--network-policy=false`, uninstall) and tells the
/// fast path to check no stamp any more (nobody writes them now).
pub fn uninstall(fast_epoch: &dyn PolicyEpoch) -> Result<()> {
    nft::apply(&remove_script())?;
    fast_epoch.write(0)?;
    Ok(())
}

/// The epoch after `e`: 1..=POLICY_EPOCH_MAX, wrapping, never 0 (no check).
fn next_epoch(e: u32) -> u32 {
    if e >= POLICY_EPOCH_MAX { 1 } else { e + 1 }
}

impl PolicyRoom {
    async fn run(&mut self, watch: Watch, resync: Duration) {
        let mut check = tokio::time::interval_at(Instant::now() + resync, resync);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut retry: Option<Duration> = None;
        let mut records = tokio::time::interval(RECORDS_POLL);
        records.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut records_seen = dir_stamp(&self.records);
        let pending: Pending = Arc::default();
        let wake = Arc::new(Notify::new());
        let relay = tokio::spawn(relay_events(
            watch.changed.clone(),
            pending.clone(),
            wake.clone(),
        ));
        let _relay = AbortOnDrop(relay);
        let mut records_events = watch_records(&self.records);
        loop {
            let woke = Instant::now();
            // Taken before the caches are read: every event stamped by
            // now is in what this pass reads.
            let events = pending.lock().ok().and_then(|mut p| p.take());
            let snap = watch.snapshot();
            let want = self.desire(&snap);
            let ok = match self.apply(want).await {
                Ok(wrote) => {
                    let us = u64::try_from(woke.elapsed().as_micros()).unwrap_or(u64::MAX);
                    self.metrics.last_apply_us.store(us, Ordering::Relaxed);
                    self.metrics.enforcing.store(true, Ordering::Relaxed);
                    if wrote && let Some(t) = events {
                        self.metrics
                            .event_to_enforced
                            .observe(t.elapsed().as_secs_f64());
                    }
                    if let Ok(mut v) = self.view.lock() {
                        *v = std::mem::take(&mut self.next_view);
                    }
                    true
                }
                Err(e) => {
                    self.metrics.apply_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, "cannot write the NetworkPolicy table; retrying");
                    self.applied = None;
                    // Not enforced yet: they wait for the write that is.
                    if let (Some(t), Ok(mut p)) = (events, pending.lock()) {
                        *p = Some(p.map_or(t, |q| q.min(t)));
                    }
                    false
                }
            };
            retry = if ok {
                None
            } else {
                Some(retry.map_or(RETRY_MIN, |d| (d * 2).min(RETRY_MAX)))
            };
            // Waits for a reason to pass again: an API event, a record
            // written or removed, a retry, or the check of the table.
            loop {
                tokio::select! {
                    () = wake.notified() => tokio::time::sleep(DEBOUNCE).await,
                    event = async {
                        match records_events.as_mut() {
                            Some(s) => s.next().await,
                            None => std::future::pending().await,
                        }
                    } => {
                        if !matches!(event, Some(Ok(_))) {
                            tracing::warn!("the pod records' watch ended: looking every {RECORDS_POLL:?}");
                            records_events = None;
                        }
                        // The plugin's write and rename come as a burst.
                        tokio::time::sleep(DEBOUNCE).await;
                        records_seen = dir_stamp(&self.records);
                    }
                    _ = records.tick() => {
                        let stamp = dir_stamp(&self.records);
                        if stamp == records_seen {
                            continue;
                        }
                        records_seen = stamp;
                    }
                    () = async {
                        match retry {
                            Some(d) => tokio::time::sleep(d).await,
                            None => std::future::pending().await,
                        }
                    } => {}
                    _ = check.tick() => {
                        // Someone removed the table (a flush of the
                        // ruleset): write it whole again.
                        if table_exists().await {
                            continue;
                        }
                        tracing::warn!(table = TABLE, "the NetworkPolicy table was missing: writing it again");
                        self.applied = None;
                    }
                }
                break;
            }
        }
    }

    /// The sets this node's pods need now.
    pub(crate) fn desire(&mut self, snap: &Snapshot) -> Desired {
        self.metrics.passes.fetch_add(1, Ordering::Relaxed);
        let (mut cluster, unread) = Cluster::from_snapshot(snap);
        for u in unread {
            self.report(u.kind, u.name, u.problem, u.effect);
        }
        self.add_records(&mut cluster);
        let fail_closed = !cluster.policies.is_empty();
        let compiled = compile_node(&cluster, &self.node);
        let want = sets::desired(&compiled, fail_closed);
        let mut selected: BTreeMap<Key, u64> = BTreeMap::new();
        let mut view = View::default();
        for (key, pod) in compiled {
            let by: Vec<Key> = cluster
                .pods
                .get(&key)
                .into_iter()
                .flat_map(|p| cluster.policies_selecting(p))
                .map(|p| p.key.clone())
                .collect();
            for p in &by {
                *selected.entry(p.clone()).or_default() += 1;
            }
            view.pods.insert(key, (pod, by));
        }
        self.next_view = view;
        if let Ok(mut s) = self.metrics.selected.lock() {
            *s = selected;
        }
        if let Ok(mut p) = self.metrics.problems.lock() {
            *p = std::mem::take(&mut self.found);
        }
        self.metrics
            .policies
            .store(cluster.policies.len() as u64, Ordering::Relaxed);
        self.metrics
            .isolated_pods
            .store(want.isolated.len() as u64, Ordering::Relaxed);
        self.published.send_replace(Arc::new(cluster));
        want
    }

    /// A local pod whose status.podIPs has not reached the API yet still
    /// has its addresses: the plugin recorded them at ADD.
    fn add_records(&self, cluster: &mut Cluster) {
        for (key, ips) in read_records(&self.records) {
            if let Some(pod) = cluster.pods.get_mut(&key)
                && pod.node.as_deref() == Some(self.node.as_str())
                && ips.iter().any(|ip| !pod.ips.contains(ip))
            {
                // A copy of this pod for this pass alone: the cache's
                // stays as the API told it.
                let pod = Arc::make_mut(pod);
                for ip in ips {
                    if !pod.ips.contains(&ip) {
                        pod.ips.push(ip);
                    }
                }
            }
        }
    }

    fn report(&mut self, kind: &'static str, name: Option<&str>, p: &Problem, effect: &str) {
        *self.found.entry(kind).or_default() += 1;
        let name = name.unwrap_or("<unnamed>");
        if self.reported.insert(format!("{kind}/{name}: {p}")) {
            tracing::warn!(kind, name, problem = %p, effect, "cannot read part of an object");
            self.metrics
                .reject(&format!("{}:{}", kind, problem_label(p)));
        }
    }

    /// Writes the difference from what the table holds, or the whole
    /// table (the first time, after a failure, when it went missing); an
    /// incremental write the kernel refuses is retried whole at once.
    /// Whether anything was written.
    async fn apply(&mut self, want: Desired) -> Result<bool> {
        let epoch = next_epoch(self.epoch);
        let whole = match &self.applied {
            Some(old) if whole_is_cheaper(old, &want) => {
                tracing::info!(
                    from = old.len(),
                    to = want.len(),
                    "many set elements go: writing the policy table whole"
                );
                true
            }
            Some(_) => false,
            None => true,
        };
        let script = match &self.applied {
            Some(old) if !whole => match diff_script(old, &want, epoch) {
                None => return Ok(false),
                Some(s) => s,
            },
            _ => full_script(&want, epoch),
        };
        let incremental = !whole;
        let result = run_nft(script).await;
        let result = match result {
            Err(e) if incremental => {
                tracing::info!(error = %e, "incremental policy write refused; writing the table whole");
                self.metrics.full_writes.fetch_add(1, Ordering::Relaxed);
                run_nft(full_script(&want, epoch)).await
            }
            Ok(()) if !incremental => {
                self.metrics.full_writes.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            r => r,
        };
        result?;
        // Spent even if the settle fails: stamps of it may be wrong.
        self.epoch = epoch;
        let settled = next_epoch(epoch);
        run_nft(settle_script(settled)).await?;
        self.epoch = settled;
        // Only now: a flow stamped under the old epoch goes on fast until
        // the fast path checks for the new one, and the new stamps exist.
        self.fast_epoch.write(settled)?;
        self.metrics
            .set_elements
            .store(want.len() as u64, Ordering::Relaxed);
        let mut targets: HashMap<String, Vec<_>> = want
            .counters
            .iter()
            .map(|(name, c)| (name.clone(), c.series.clone()))
            .collect();
        targets.extend(drop_counters().into_iter().map(|(n, s)| (n, vec![s])));
        if let Ok(mut t) = self.metrics.tally.lock() {
            t.set_targets(targets);
        }
        self.applied = Some(want);
        Ok(true)
    }
}

/// The relay ends with the room.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `nft` is a process: off the async workers.
async fn run_nft(script: String) -> Result<()> {
    tokio::task::spawn_blocking(move || nft::apply(&script)).await?
}

async fn table_exists() -> bool {
    tokio::task::spawn_blocking(|| nft::table_exists(FAMILY, TABLE))
        .await
        .unwrap_or(false)
}

/// Events of the records directory, so that a pod's record (a rename into
/// it) is read at once: a pod under a default deny may talk to what it is
/// allowed within 100 ms of its ADD. The directory is made as the plugin
/// makes it, should no pod have been added yet. None where inotify is
/// unavailable; the stat poll covers that and anything missed.
fn watch_records(dir: &Path) -> Option<inotify::EventStream<Vec<u8>>> {
    use inotify::{Inotify, WatchMask};
    use std::os::unix::fs::DirBuilderExt;
    let made = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir);
    let watch = made.and_then(|()| {
        let ino = Inotify::init()?;
        ino.watches().add(
            dir,
            WatchMask::MOVED_TO
                | WatchMask::MOVED_FROM
                | WatchMask::DELETE
                | WatchMask::CLOSE_WRITE,
        )?;
        ino.into_event_stream(vec![0u8; 4096])
    });
    match watch {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot watch the pod records: looking every {RECORDS_POLL:?}");
            None
        }
    }
}

/// The records directory's modification time (and inode, should it be
/// made anew): a record written, renamed in or removed changes it.
fn dir_stamp(dir: &Path) -> Option<(std::time::SystemTime, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(dir).ok()?;
    Some((m.modified().ok()?, m.ino()))
}

/// The plugin's records on this node, by pod. Unreadable ones are skipped:
/// the API's status.podIPs still speaks for their pods.
fn read_records(dir: &Path) -> BTreeMap<Key, Vec<IpAddr>> {
    let mut out: BTreeMap<Key, Vec<IpAddr>> = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let Ok(body) = std::fs::read(entry.path()) else {
            continue;
        };
        if let Ok(r) = serde_json::from_slice::<PodRecord>(&body) {
            out.entry(Key::new(r.namespace, r.name))
                .or_default()
                .extend(r.ips);
        }
    }
    out
}

/// A bounded label for a problem: its kind's name without the values.
fn problem_label(p: &Problem) -> String {
    let debug = format!("{:?}", p.kind);
    debug
        .split(['(', ' ', '{'])
        .next()
        .unwrap_or_default()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plugin publishes a record by renaming it into the directory:
    /// the watch must wake on that, not at the next poll.
    #[tokio::test]
    async fn a_record_renamed_in_wakes_the_watch() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let records = dir.path().join("pods");
        let mut events = watch_records(&records).ok_or_else(|| anyhow::anyhow!("no watch"))?;
        std::fs::write(records.join(".tmp-mycni0"), b"{}")?;
        std::fs::rename(records.join(".tmp-mycni0"), records.join("mycni0"))?;
        let woke = tokio::time::timeout(Duration::from_secs(1), async {
            loop {
                match events.next().await {
                    Some(Ok(e)) if e.mask.contains(inotify::EventMask::MOVED_TO) => return true,
                    Some(Ok(_)) => continue,
                    _ => return false,
                }
            }
        })
        .await;
        anyhow::ensure!(woke == Ok(true), "no MOVED_TO event: {woke:?}");
        Ok(())
    }
}
