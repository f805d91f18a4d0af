//! A test fixture that speaks the Kubernetes API wire protocol for Nodes,
//! Namespaces, Pods and NetworkPolicies.
//!
//! No API server can run where mycni is developed, so the agent's kube-rs
//! code is tested against this: a plain-HTTP server for `core/v1` Nodes,
//! Namespaces and Pods and `networking.k8s.io/v1` NetworkPolicies with the
//! real server's list (selectors, `limit`/`continue` pagination,
//! `resourceVersion` semantics, all-namespaces lists), watch (one
//! resourceVersion across kinds, history replay, `410 Expired` after
//! compaction, bookmarks, `sendInitialEvents` streaming lists, timeouts),
//! get, create, update, delete, deletecollection, the status subresources,
//! merge / strategic / JSON patches with resourceVersion preconditions, the
//! kinds' defaulting and validation (NetworkPolicy's in full), discovery,
//! OpenAPI enough for `kubectl apply`, and the tables `kubectl get` prints.
//! It is a fixture, not an API server: four kinds, no authentication, no
//! admission beyond the kinds' own rules, no controllers (a Namespace's
//! deletion deletes its contents at once), no persistence.
//!
//! Tests drive it through [`ApiServer`]'s methods, which change the state
//! exactly as API calls would (a new resourceVersion and a watch event per
//! change), and inject faults with [`ApiServer::set_reachable`] and
//! [`ApiServer::compact`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use k8s_openapi::api::core::v1::{Node, NodeSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;
use tokio::sync::watch;

mod http;
mod patch;
mod store;
mod typed;

pub use store::NAMESPACE_NAME_LABEL;
use store::{Key, Kind, State, Target, WriteMode};
pub use typed::{namespace, network_policy, pod, pod_status};

/// The namespaces a new cluster has; Pods and NetworkPolicies can only be
/// created in a namespace that exists.
pub const DEFAULT_NAMESPACES: [&str; 4] =
    ["default", "kube-node-lease", "kube-public", "kube-system"];

/// How often a watch that asked for bookmarks gets one.
const BOOKMARK_INTERVAL: Duration = Duration::from_secs(1);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The listener and the connections it accepted.
struct Net {
    up: bool,
    accept: Option<tokio::task::JoinHandle<()>>,
    /// Disconnects when the accept task (and its listener) is gone.
    accept_gone: Option<std::sync::mpsc::Receiver<()>>,
    /// Bumped to close every open connection.
    generation: watch::Sender<u64>,
}

pub(crate) struct Shared {
    state: Mutex<State>,
    /// The latest resourceVersion; watches wait on it.
    changed: watch::Sender<u64>,
    counters: Mutex<BTreeMap<String, u64>>,
    net: Mutex<Net>,
    handle: tokio::runtime::Handle,
    addr: SocketAddr,
    connections: AtomicUsize,
    bookmark_interval: Duration,
    /// Print every connection and request to stderr (`MYCNI_APISERVER_LOG=1`).
    log: bool,
    /// Refuse every write to `nodes` itself (403), as mycni-agent's
    /// ClusterRole does: only `nodes/status` may be patched.
    node_writes_forbidden: std::sync::atomic::AtomicBool,
}

/// Sends nothing; dropping it tells `set_reachable(false)` the listener is closed.
struct DropSignal(#[allow(dead_code)] std::sync::mpsc::Sender<()>);

struct ConnectionGuard(Arc<Shared>);

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Shared {
    /// Runs `f` on the state, then wakes the watches if it changed anything.
    fn with_state<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let mut st = lock(&self.state);
        let before = st.rv;
        let r = f(&mut st);
        let after = st.rv;
        drop(st);
        if after != before {
            self.changed.send_replace(after);
        }
        r
    }

    fn count(&self, verb: &str) {
        *lock(&self.counters).entry(verb.to_string()).or_default() += 1;
    }

    fn counters(&self) -> BTreeMap<String, u64> {
        lock(&self.counters).clone()
    }

    fn compact(&self) {
        self.with_state(State::compact);
    }

    /// Serves on `listener`; the caller holds the `net` lock.
    fn serve(self: &Arc<Self>, net: &mut Net, listener: std::net::TcpListener) -> Result<()> {
        listener.set_nonblocking(true)?;
        let listener = {
            let _guard = self.handle.enter();
            tokio::net::TcpListener::from_std(listener)?
        };
        let (gone_tx, gone_rx) = std::sync::mpsc::channel();
        let generation = net.generation.subscribe();
        let task = self.handle.spawn(accept_loop(
            self.clone(),
            listener,
            generation,
            DropSignal(gone_tx),
        ));
        net.accept = Some(task);
        net.accept_gone = Some(gone_rx);
        net.up = true;
        Ok(())
    }

    fn set_reachable(self: &Arc<Self>, up: bool) {
        let mut net = lock(&self.net);
        if net.up == up {
            return;
        }
        if up {
            // The port was ours a moment ago, and std sets SO_REUSEADDR, so
            // only another process taking it meanwhile can make this fail.
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                match std::net::TcpListener::bind(self.addr) {
                    Ok(l) => {
                        if let Err(e) = self.serve(&mut net, l) {
                            eprintln!("mycni-apiserver: cannot listen again on {}: {e}", self.addr);
                        }
                        return;
                    }
                    Err(e) if Instant::now() > deadline => {
                        eprintln!("mycni-apiserver: cannot bind {} again: {e}", self.addr);
                        return;
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
        net.up = false;
        net.generation.send_modify(|g| *g += 1);
        if let Some(task) = net.accept.take() {
            task.abort();
        }
        if let Some(gone) = net.accept_gone.take() {
            let _ = gone.recv_timeout(Duration::from_secs(5));
        }
        // Every connection task saw the generation change; wait until they
        // have dropped their sockets.
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.connections.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

async fn accept_loop(
    shared: Arc<Shared>,
    listener: tokio::net::TcpListener,
    generation: watch::Receiver<u64>,
    gone: DropSignal,
) {
    // Dropped with this future, after the listener (locals drop in reverse order).
    let _gone = gone;
    let listener = listener;
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        shared.connections.fetch_add(1, Ordering::SeqCst);
        let guard = ConnectionGuard(shared.clone());
        let mut generation = generation.clone();
        let svc_shared = shared.clone();
        let log = shared.log;
        if log {
            eprintln!("mycni-apiserver: {peer} connected");
        }
        tokio::spawn(async move {
            let _guard = guard;
            let service = service_fn(move |req| http::handle(svc_shared.clone(), peer, req));
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .serve_connection(TokioIo::new(stream), service);
            // Logged so a client's unanswered request can be told apart: a
            // request that never reached this socket ends its keep-alive
            // connection with hyper's 30 s header read timeout.
            let end = tokio::select! {
                r = conn => r.map_or_else(|e| format!("closed: {e}"), |()| "closed".to_string()),
                _ = generation.changed() => "closed by the fixture (outage or drop)".to_string(),
            };
            if log {
                eprintln!("mycni-apiserver: {peer} {end}");
            }
        });
    }
}

/// The fixture. Runs on its own tokio runtime, so it works from sync and
/// async tests alike; dropping it stops it.
pub struct ApiServer {
    shared: Arc<Shared>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer")
            .field("url", &self.url())
            .finish()
    }
}

impl ApiServer {
    /// Listens on `addr` (port 0 picks a free one) over plain HTTP.
    pub fn start(addr: SocketAddr) -> Result<ApiServer> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("mycni-apiserver")
            .enable_all()
            .build()
            .context("apiserver runtime")?;
        let listener = std::net::TcpListener::bind(addr).with_context(|| format!("bind {addr}"))?;
        let addr = listener.local_addr()?;
        let mut state = State::new();
        // The namespaces every cluster has from the start.
        for ns in DEFAULT_NAMESPACES {
            let value = serde_json::to_value(namespace(ns, &[]))?;
            state.create(
                Kind::Namespace,
                None,
                value,
                WriteMode::stored(Target::Direct),
            )?;
        }
        let (changed, _) = watch::channel(state.rv);
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            changed,
            counters: Mutex::default(),
            net: Mutex::new(Net {
                up: false,
                accept: None,
                accept_gone: None,
                generation: watch::channel(0).0,
            }),
            handle: runtime.handle().clone(),
            addr,
            connections: AtomicUsize::new(0),
            bookmark_interval: BOOKMARK_INTERVAL,
            log: std::env::var_os("MYCNI_APISERVER_LOG").is_some_and(|v| v != "0" && !v.is_empty()),
            node_writes_forbidden: std::sync::atomic::AtomicBool::new(false),
        });
        {
            let mut net = lock(&shared.net);
            shared.serve(&mut net, listener)?;
        }
        Ok(ApiServer {
            shared,
            runtime: Some(runtime),
        })
    }

    /// `http://ip:port`.
    pub fn url(&self) -> String {
        format!("http://{}", self.shared.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// A kubeconfig for this server: cluster, user (no credentials) and
    /// current context all named `fixture`.
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\n\
             kind: Config\n\
             clusters:\n\
             - name: fixture\n  cluster:\n    server: {}\n\
             users:\n\
             - name: fixture\n  user: {{}}\n\
             contexts:\n\
             - name: fixture\n  context:\n    cluster: fixture\n    user: fixture\n\
             current-context: fixture\n\
             preferences: {{}}\n",
            self.url()
        )
    }

    pub fn write_kubeconfig(&self, path: &Path) -> Result<()> {
        std::fs::write(path, self.kubeconfig()).with_context(|| format!("write {}", path.display()))
    }

    /// A kube-rs configuration pointing at this server.
    pub fn kube_config(&self) -> Result<kube::Config> {
        Ok(kube::Config::new(self.url().parse()?))
    }

    /// A kube-rs client for this server. Call it inside a tokio runtime (the
    /// client spawns its connection machinery there).
    pub fn kube_client(&self) -> Result<kube::Client> {
        Ok(kube::Client::try_from(self.kube_config()?)?)
    }

    /// Creates a Node as `POST /api/v1/nodes` would (uid, creationTimestamp
    /// and resourceVersion set by the server; a resourceVersion in `node` is
    /// ignored). Status is kept, as the real server does for Nodes.
    pub fn create_node(&self, node: Node) -> Result<Node> {
        self.create_as(Kind::Node, &node)
    }

    /// Changes a Node, spec, metadata and status alike (unlike the API, also
    /// `spec.podCIDR`, so tests can simulate a re-created node). A change
    /// that changes nothing keeps the resourceVersion and sends no event.
    pub fn update_node(&self, name: &str, f: impl FnOnce(&mut Node)) -> Result<Node> {
        self.update_as(&Key::new(Kind::Node, "", name), f)
    }

    /// Deletes a Node as `DELETE` would (with finalizers it is only marked).
    pub fn delete_node(&self, name: &str) -> Result<()> {
        self.delete_key(&Key::new(Kind::Node, "", name))
    }

    pub fn get_node(&self, name: &str) -> Option<Node> {
        self.get_as(&Key::new(Kind::Node, "", name))
    }

    /// Every Node, by name.
    pub fn nodes(&self) -> Vec<Node> {
        self.list_as(Kind::Node, None)
    }

    /// The latest resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.with_state(|st| st.rv)
    }

    /// `false` closes the listener and every open connection, watches
    /// included (clients see connection refused or reset); `true` listens on
    /// the same port again. Returns once the change is in effect.
    pub fn set_reachable(&self, up: bool) {
        self.shared.set_reachable(up);
    }

    /// `true`: every create, update, patch and delete of `nodes` itself
    /// gets 403 Forbidden, as deploy/base/rbac.yaml grants mycni-agent; the
    /// status subresource and the fixture's own methods still write.
    pub fn forbid_node_writes(&self, forbid: bool) {
        self.shared
            .node_writes_forbidden
            .store(forbid, Ordering::SeqCst);
    }

    pub fn is_reachable(&self) -> bool {
        lock(&self.shared.net).up
    }

    /// Forgets the event history up to now: a watch from an older
    /// resourceVersion gets `410 Expired`, and outstanding `continue`
    /// tokens expire.
    pub fn compact(&self) {
        self.shared.compact();
    }

    /// Requests served, by verb: `list`, `watch`, `get`, `create`, `update`,
    /// `patch`, `delete`, `deletecollection`, and `discovery` for the rest.
    pub fn request_count(&self, verb: &str) -> u64 {
        lock(&self.shared.counters).get(verb).copied().unwrap_or(0)
    }

    /// All request counters.
    pub fn request_counts(&self) -> BTreeMap<String, u64> {
        self.shared.counters()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        {
            let mut net = lock(&self.shared.net);
            net.generation.send_modify(|g| *g += 1);
            if let Some(task) = net.accept.take() {
                task.abort();
            }
            net.up = false;
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// A minimal Node: a name and, if given, `spec.podCIDR` (and `podCIDRs`).
pub fn node(name: &str, pod_cidr: Option<&str>) -> Node {
    node_with_cidrs(name, pod_cidr.as_slice())
}

/// A minimal Node with `spec.podCIDRs` as given (a dual-stack Node has one
/// per family) and `spec.podCIDR` their first, as the API keeps them; no
/// spec when `pod_cidrs` is empty.
pub fn node_with_cidrs(name: &str, pod_cidrs: &[&str]) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..ObjectMeta::default()
        },
        spec: pod_cidrs.first().map(|first| NodeSpec {
            pod_cidr: Some(first.to_string()),
            pod_cidrs: Some(pod_cidrs.iter().map(|c| c.to_string()).collect()),
            ..NodeSpec::default()
        }),
        status: None,
    }
}

/// Reads a JSON value at a pointer of a Node, for tests: `node_field(&n, "/metadata/annotations/x")`.
pub fn node_field(node: &Node, pointer: &str) -> Option<Value> {
    serde_json::to_value(node).ok()?.pointer(pointer).cloned()
}
