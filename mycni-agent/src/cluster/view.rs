//! The cluster as one value: the watched objects, converted, assembled
//! into a `Cluster` for whoever reads it. The policy room builds one each
//! pass; without it (`--network-policy=false`) `spawn` keeps one anyway,
//! so that flows still name the pods at their ends.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::Cluster;
use super::convert::{Problem, Read, WATCHED};
use super::model::{Namespace, Pod, Policy};
use crate::metrics::Metrics;
use crate::watch::{PolicySnapshot, PolicyWatch};

/// What the watch holds: every object as it was converted.
pub(crate) type Snapshot = PolicySnapshot<Read<Pod>, Read<Namespace>, Read<Policy>>;
/// The watch of Pods, Namespaces and NetworkPolicies, keeping the model.
pub type Watch = PolicyWatch<Read<Pod>, Read<Namespace>, Read<Policy>>;

/// Events closer together than this share one view: a pod's create then
/// its status.
const DEBOUNCE: Duration = Duration::from_millis(10);

/// Part of an object the conversion could not read, and what that means
/// for the whole object.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Unread<'a> {
    pub kind: &'static str,
    pub name: Option<&'a str>,
    pub problem: &'a Problem,
    pub effect: &'static str,
}

impl Cluster {
    /// The cluster a snapshot holds, and what of it could not be read.
    pub(crate) fn from_snapshot(snap: &Snapshot) -> (Cluster, Vec<Unread<'_>>) {
        let mut cluster = Cluster::default();
        let mut unread = Vec::new();
        for ns in &snap.namespaces {
            match &**ns {
                Ok(n) => cluster.add_namespace(n.value.clone()),
                Err(r) => unread.push(Unread {
                    kind: "Namespace",
                    name: r.name.as_deref(),
                    problem: &r.problem,
                    effect: "ignored",
                }),
            }
        }
        for pod in &snap.pods {
            match &**pod {
                Ok(c) => {
                    unread.extend(c.dropped.iter().map(|p| Unread {
                        kind: "Pod",
                        name: Some(&c.value.key.name),
                        problem: p,
                        effect: "field ignored",
                    }));
                    cluster.add_pod(c.value.clone());
                }
                Err(r) => unread.push(Unread {
                    kind: "Pod",
                    name: r.name.as_deref(),
                    problem: &r.problem,
                    effect: "ignored",
                }),
            }
        }
        for np in &snap.policies {
            match &**np {
                Ok(c) => {
                    unread.extend(c.dropped.iter().map(|p| Unread {
                        kind: "NetworkPolicy",
                        name: Some(&c.value.key.name),
                        problem: p,
                        effect: "rule allows nothing",
                    }));
                    cluster.add_policy(c.value.clone());
                }
                Err(r) => unread.push(Unread {
                    kind: "NetworkPolicy",
                    name: r.name.as_deref(),
                    problem: &r.problem,
                    effect: "policy ignored: it selects no pod",
                }),
            }
        }
        (cluster, unread)
    }
}

/// Keeps `published` at the watched Pods and Namespaces when no policy
/// room does. Policies are left out: none is enforced, so none may be
/// named as the reason a flow passed.
pub fn spawn(
    client: kube::Client,
    metrics: &Arc<Metrics>,
    published: watch::Sender<Arc<Cluster>>,
) -> JoinHandle<()> {
    let metrics = metrics.clone();
    tokio::spawn(async move {
        let watch = Watch::start(client, &metrics, WATCHED).await;
        loop {
            let (mut cluster, _) = Cluster::from_snapshot(&watch.snapshot());
            cluster.policies.clear();
            if published.send(Arc::new(cluster)).is_err() {
                return;
            }
            watch.changed.notified().await;
            tokio::time::sleep(DEBOUNCE).await;
        }
    })
}
