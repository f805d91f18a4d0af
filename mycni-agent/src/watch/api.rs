//! The Kubernetes side: each kind of object the agent reads is watched
//! into a cache of its own, trimmed to what the agent reads; every event
//! of any kind wakes the loop, whose pass reads one [`Snapshot`] of all.
//! Watching another kind is a `Kind` and one line in a watch's `start`
//! (and its RBAC), as `policy.rs` does for the policy room.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;

use crate::metrics::Metrics;

use super::cache::{Cache, cache};
use super::kind::Kind;
use super::nodes::NODES;

/// The objects the subsystems read, as the API last told them: a pass
/// reads one snapshot, whatever arrives meanwhile.
pub(crate) struct Snapshot {
    pub nodes: Vec<Arc<Node>>,
}

/// The API's watches, each into its cache, and the one signal every event
/// of any raises.
pub(crate) struct ApiWatch {
    nodes: Store<Node>,
    /// Raised by every event, and once each initial list is complete.
    pub changed: Arc<Notify>,
}

impl ApiWatch {
    /// Starts every watch; returns once each initial list is complete.
    pub async fn start(client: kube::Client, metrics: &Arc<Metrics>) -> Self {
        let changed = Arc::new(Notify::new());
        let nodes = watch(Api::all(client), &NODES, metrics, &changed).await;
        ApiWatch { nodes, changed }
    }

    /// What every cache holds now.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            nodes: self.nodes.state(),
        }
    }
}

/// Starts the watch of `api` and returns its cache once the initial list
/// is complete. Every event raises `changed`.
pub(super) async fn watch<K>(
    api: Api<K>,
    kind: &'static Kind<K>,
    metrics: &Arc<Metrics>,
    changed: &Arc<Notify>,
) -> Store<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    let (reader, writer) = reflector::store::<K>();
    let count = reader.clone();
    let stream = watcher(api, config())
        .default_backoff()
        .modify(kind.trim)
        .reflect(writer);
    drive(stream, kind, metrics, changed, move || count.state().len()).await;
    reader
}

/// As [`watch`], but the cache keeps each object's `convert`ed form
/// instead of the object (see [`cache`](super::cache)).
pub(super) async fn watch_converted<K, T>(
    api: Api<K>,
    kind: &'static Kind<K>,
    convert: fn(&K) -> T,
    metrics: &Arc<Metrics>,
    changed: &Arc<Notify>,
) -> Cache<T>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
    T: Send + Sync + 'static,
{
    let (reader, mut writer) = cache(convert);
    let count = reader.clone();
    let stream = watcher(api, config())
        .default_backoff()
        .modify(kind.trim)
        .inspect(move |ev| {
            if let Ok(ev) = ev {
                writer.apply(ev);
            }
        });
    drive(stream, kind, metrics, changed, move || count.len()).await;
    reader
}

/// Small pages bound the list's peak memory; trimming every object to
/// what the agent reads keeps the cache small (a Node: ~1 KB instead of
/// the ~40 KB a kubelet-maintained one weighs with its managedFields and
/// status images; 5,000 real Nodes would otherwise cost ~250 MB).
fn config() -> watcher::Config {
    watcher::Config::default().page_size(100)
}

/// Runs a watch's stream (whose cache is written as it goes) in a task of
/// its own; returns once the initial list is complete. Every event raises
/// `changed`; `cached` tells the list's size.
async fn drive<K, S>(
    stream: S,
    kind: &'static Kind<K>,
    metrics: &Arc<Metrics>,
    changed: &Arc<Notify>,
    cached: impl Fn() -> usize + Send + 'static,
) where
    K: Send + 'static,
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
{
    let watch_changed = changed.clone();
    let synced = Arc::new(Notify::new());
    let watch_synced = synced.clone();
    let metrics = metrics.clone();
    tokio::spawn(async move {
        tokio::pin!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(watcher::Event::InitDone) => {
                    (kind.listed)(cached());
                    if kind.reachability {
                        metrics.api_reachable.store(true, Ordering::Relaxed);
                    }
                    watch_synced.notify_one();
                    watch_changed.notify_one();
                }
                Ok(_) => {
                    if kind.reachability {
                        metrics.api_reachable.store(true, Ordering::Relaxed);
                    }
                    (kind.event)(&metrics);
                    watch_changed.notify_one();
                }
                Err(e) => {
                    // The last known state stays programmed: an unreachable
                    // API must not tear down the datapath.
                    if kind.reachability {
                        metrics.api_reachable.store(false, Ordering::Relaxed);
                    }
                    tracing::warn!(error = %e, "{} watch failed; retrying with backoff, keeping the datapath as it is", kind.name);
                }
            }
        }
    });
    synced.notified().await;
}
