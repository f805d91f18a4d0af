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

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Result;
use mycni_common::contract::{POD_RECORDS_DIR, PodRecord};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::convert::{Problem, namespace_from_k8s, pod_from_k8s, policy_from_k8s};
use super::metrics::PolicyMetrics;
use super::model::Key;
use super::nft::{FAMILY, TABLE, diff_script, full_script, remove_script};
use super::sets::{self, Desired};
use super::{Cluster, compile_node};
use crate::metrics::Metrics;
use crate::tables::nft;
use crate::watch::{PolicySnapshot, PolicyWatch};

/// Events closer together than this share a pass: `kubectl apply` of a
/// few objects, a pod's create then status.
const DEBOUNCE: Duration = Duration::from_millis(10);
const RETRY_MIN: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(10);

pub struct Room {
    node: String,
    records: PathBuf,
    metrics: Arc<PolicyMetrics>,
    /// What the table holds, as last written; None: write it whole.
    applied: Option<Desired>,
    /// Problems already logged and counted, so a bad object is reported
    /// once, not at every pass.
    reported: BTreeSet<String>,
}

/// Starts the room; it writes nothing until the lists have synced.
pub fn spawn(
    client: kube::Client,
    node: String,
    state_dir: &Path,
    metrics: &Arc<Metrics>,
    resync: Duration,
) -> JoinHandle<()> {
    let metrics = metrics.clone();
    let records = state_dir.join(POD_RECORDS_DIR);
    // Registered now, so its series (enforcing 0) are there while the
    // lists sync.
    let collector = metrics.collector::<PolicyMetrics>();
    tokio::spawn(async move {
        let watch = PolicyWatch::start(client, &metrics).await;
        let mut room = Room {
            node,
            records,
            metrics: collector,
            applied: None,
            reported: BTreeSet::new(),
        };
        room.run(watch, resync).await;
    })
}

/// Removes the table (`--network-policy=false`, uninstall).
pub fn uninstall() -> Result<()> {
    nft::apply(&remove_script())
}

impl Room {
    async fn run(&mut self, watch: PolicyWatch, resync: Duration) {
        let mut check = tokio::time::interval_at(Instant::now() + resync, resync);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut retry: Option<Duration> = None;
        loop {
            let woke = Instant::now();
            let snap = watch.snapshot();
            let want = self.desire(&snap);
            let ok = match self.apply(want).await {
                Ok(()) => {
                    let us = u64::try_from(woke.elapsed().as_micros()).unwrap_or(u64::MAX);
                    self.metrics.last_apply_us.store(us, Ordering::Relaxed);
                    self.metrics.enforcing.store(true, Ordering::Relaxed);
                    true
                }
                Err(e) => {
                    self.metrics.apply_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, "cannot write the NetworkPolicy table; retrying");
                    self.applied = None;
                    false
                }
            };
            retry = if ok {
                None
            } else {
                Some(retry.map_or(RETRY_MIN, |d| (d * 2).min(RETRY_MAX)))
            };
            tokio::select! {
                () = watch.changed.notified() => tokio::time::sleep(DEBOUNCE).await,
                () = async {
                    match retry {
                        Some(d) => tokio::time::sleep(d).await,
                        None => std::future::pending().await,
                    }
                } => {}
                _ = check.tick() => {
                    // Someone removed the table (a flush of the ruleset):
                    // write it whole again.
                    if !table_exists().await {
                        tracing::warn!(table = TABLE, "the NetworkPolicy table was missing: writing it again");
                        self.applied = None;
                    }
                }
            }
        }
    }

    /// The sets this node's pods need now.
    pub fn desire(&mut self, snap: &PolicySnapshot) -> Desired {
        self.metrics.passes.fetch_add(1, Ordering::Relaxed);
        let mut cluster = Cluster::default();
        for ns in &snap.namespaces {
            match namespace_from_k8s(ns) {
                Ok(n) => cluster.add_namespace(n),
                Err(p) => self.report("Namespace", &ns.metadata.name, &p, "ignored"),
            }
        }
        for pod in &snap.pods {
            match pod_from_k8s(pod) {
                Ok(c) => {
                    for p in &c.dropped {
                        self.report("Pod", &pod.metadata.name, p, "field ignored");
                    }
                    cluster.add_pod(c.value);
                }
                Err(p) => self.report("Pod", &pod.metadata.name, &p, "ignored"),
            }
        }
        for np in &snap.policies {
            match policy_from_k8s(np) {
                Ok(c) => {
                    for p in &c.dropped {
                        self.report("NetworkPolicy", &np.metadata.name, p, "rule allows nothing");
                    }
                    cluster.add_policy(c.value);
                }
                Err(p) => self.report(
                    "NetworkPolicy",
                    &np.metadata.name,
                    &p,
                    "policy ignored: it selects no pod",
                ),
            }
        }
        self.add_records(&mut cluster);
        let want = sets::desired(&compile_node(&cluster, &self.node));
        self.metrics
            .policies
            .store(cluster.policies.len() as u64, Ordering::Relaxed);
        self.metrics
            .isolated_pods
            .store(want.isolated.len() as u64, Ordering::Relaxed);
        want
    }

    /// A local pod whose status.podIPs has not reached the API yet still
    /// has its addresses: the plugin recorded them at ADD.
    fn add_records(&self, cluster: &mut Cluster) {
        for (key, ips) in read_records(&self.records) {
            if let Some(pod) = cluster.pods.get_mut(&key)
                && pod.node.as_deref() == Some(self.node.as_str())
            {
                for ip in ips {
                    if !pod.ips.contains(&ip) {
                        pod.ips.push(ip);
                    }
                }
            }
        }
    }

    fn report(&mut self, kind: &str, name: &Option<String>, p: &Problem, effect: &str) {
        let name = name.as_deref().unwrap_or("<unnamed>");
        if self.reported.insert(format!("{kind}/{name}: {p}")) {
            tracing::warn!(kind, name, problem = %p, effect, "cannot read part of an object");
            self.metrics
                .reject(&format!("{}:{}", kind, problem_label(p)));
        }
    }

    /// Writes the difference from what the table holds, or the whole
    /// table (the first time, after a failure, when it went missing); an
    /// incremental write the kernel refuses is retried whole at once.
    async fn apply(&mut self, want: Desired) -> Result<()> {
        let script = match &self.applied {
            Some(old) => match diff_script(old, &want) {
                None => return Ok(()),
                Some(s) => s,
            },
            None => full_script(&want),
        };
        let incremental = self.applied.is_some();
        let result = run_nft(script).await;
        let result = match result {
            Err(e) if incremental => {
                tracing::info!(error = %e, "incremental policy write refused; writing the table whole");
                self.metrics.full_writes.fetch_add(1, Ordering::Relaxed);
                run_nft(full_script(&want)).await
            }
            Ok(()) if !incremental => {
                self.metrics.full_writes.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            r => r,
        };
        result?;
        self.metrics
            .set_elements
            .store(want.len() as u64, Ordering::Relaxed);
        self.applied = Some(want);
        Ok(())
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
