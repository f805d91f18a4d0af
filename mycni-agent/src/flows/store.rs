//! The node's recent flows: a bounded history (the oldest goes first) and
//! a live feed for followers, with the filters `/flows` and
//! `mycni-agent flows` take.
//!
//! Decisions outlive traffic: besides the history of everything, the last
//! verdicts and drops (nftables' and the kernel's, far rarer than the
//! programs' connection events) are kept in a history of their own, so a
//! busy node's new connections do not push out the drop someone is
//! looking for.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::broadcast;

use super::enrich::{Names, Record, What};
use super::record::Line;

/// Hubble keeps 4,095 flows per node by default; so do we.
pub const DEFAULT_HISTORY: usize = 4095;
/// What a follower may fall behind by before it is told it lost some.
const FOLLOW_BACKLOG: usize = 4096;

pub struct Store {
    node: String,
    capacity: usize,
    history: Mutex<Histories>,
    live: broadcast::Sender<Arc<Record>>,
    names: Arc<dyn Names + Send + Sync>,
}

impl Store {
    pub fn new(node: String, capacity: usize, names: Arc<dyn Names + Send + Sync>) -> Self {
        let (live, _) = broadcast::channel(FOLLOW_BACKLOG);
        Store {
            node,
            capacity: capacity.max(1),
            history: Mutex::new(Histories::default()),
            live,
            names,
        }
    }

    pub fn push(&self, r: Record) {
        let r = Arc::new(r);
        if let Ok(mut h) = self.history.lock() {
            h.seq += 1;
            let entry = (h.seq, r.clone());
            if h.all.len() == self.capacity {
                h.all.pop_front();
            }
            h.all.push_back(entry.clone());
            if !matches!(r.what, What::Datapath { .. }) || r.is_drop() {
                if h.decided.len() == self.capacity.div_ceil(4) {
                    h.decided.pop_front();
                }
                h.decided.push_back(entry);
            }
        }
        // Nobody following: nothing to send (and nothing to count).
        if self.live.receiver_count() > 0 {
            let _ = self.live.send(r);
        }
    }

    pub fn line(&self, r: &Record) -> Line {
        r.line(&self.node, self.names.as_ref())
    }

    /// The held lines that match `f`, oldest first, at most `f.last`.
    pub fn matching(&self, f: &Filter) -> Vec<Line> {
        let held: Vec<Arc<Record>> = match self.history.lock() {
            Ok(h) => h.merged(),
            Err(_) => Vec::new(),
        };
        let mut lines: Vec<Line> = held
            .iter()
            .map(|r| self.line(r))
            .filter(|l| f.matches(l))
            .collect();
        if let Some(n) = f.last
            && lines.len() > n
        {
            lines.drain(..lines.len() - n);
        }
        lines
    }

    /// New lines matching `f` as they come; a follower that falls behind
    /// gets a line saying how many it missed.
    pub fn follow(self: &Arc<Self>, f: Filter) -> BoxStream<'static, String> {
        let rx = self.live.subscribe();
        let store = self.clone();
        futures::stream::unfold((rx, store, f), |(mut rx, store, f)| async move {
            loop {
                match rx.recv().await {
                    Ok(r) => {
                        let line = store.line(&r);
                        if f.matches(&line) {
                            let text = json_line(&line);
                            return Some((text, (rx, store, f)));
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        let text = format!("{{\"lost_events\":{n}}}\n");
                        return Some((text, (rx, store, f)));
                    }
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        })
        .boxed()
    }

    pub fn held(&self) -> usize {
        self.history.lock().map(|h| h.len()).unwrap_or(0)
    }
}

/// Everything, and the decisions apart (a quarter of the capacity), each
/// record numbered in arrival order.
#[derive(Default)]
struct Histories {
    seq: u64,
    all: VecDeque<(u64, Arc<Record>)>,
    decided: VecDeque<(u64, Arc<Record>)>,
}

impl Histories {
    /// How many records [`Self::merged`] gives, without building it: the
    /// decisions older than everything `all` still holds, plus `all`.
    fn len(&self) -> usize {
        let oldest = self.all.front().map_or(u64::MAX, |e| e.0);
        self.all.len() + self.decided.iter().filter(|e| e.0 < oldest).count()
    }

    /// Both histories in arrival order, each record once.
    fn merged(&self) -> Vec<Arc<Record>> {
        let (mut a, mut d) = (self.all.iter().peekable(), self.decided.iter().peekable());
        let mut out = Vec::with_capacity(self.all.len() + self.decided.len());
        loop {
            let next = match (a.peek(), d.peek()) {
                (Some(x), Some(y)) if x.0 == y.0 => {
                    d.next();
                    a.next()
                }
                (Some(x), Some(y)) if x.0 < y.0 => a.next(),
                (Some(_), Some(_)) | (None, Some(_)) => d.next(),
                (Some(_), None) => a.next(),
                (None, None) => break,
            };
            if let Some((_, r)) = next {
                out.push(r.clone());
            }
        }
        out
    }
}

pub(crate) fn json_line(l: &Line) -> String {
    let mut s = serde_json::to_string(l).unwrap_or_default();
    s.push('\n');
    s
}

/// What a reader asks for; every field set must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// `ns/name`, or a name in any namespace: either end.
    pub pod: Option<String>,
    /// Either end's namespace.
    pub namespace: Option<String>,
    /// FORWARDED or DROPPED.
    pub verdict: Option<String>,
    /// The drop reason or the path's reason (`POLICY_DENIED`,
    /// `kernel_tcp_control`), case-insensitive.
    pub reason: Option<String>,
    /// A policy named by the flow (allowing or denying): `ns/name` or a name.
    pub policy: Option<String>,
    /// Either end's port.
    pub port: Option<u16>,
    /// tcp, udp, sctp, icmpv4, icmpv6.
    pub protocol: Option<String>,
    /// Only the last this many held lines.
    pub last: Option<usize>,
    pub follow: bool,
}

impl Filter {
    /// From a URL query (`pod=x/a&verdict=DROPPED&follow=true`).
    pub(crate) fn from_query(q: &str) -> Result<Self, String> {
        let mut f = Filter::default();
        for (k, v) in form_urlencoded::parse(q.as_bytes()) {
            let v = v.into_owned();
            match &*k {
                "pod" => f.pod = Some(v),
                "namespace" => f.namespace = Some(v),
                "verdict" => f.verdict = Some(v),
                "reason" => f.reason = Some(v),
                "policy" => f.policy = Some(v),
                "port" => {
                    f.port = Some(
                        v.parse()
                            .map_err(|_| format!("port {v:?} is not a number from 0 to 65535"))?,
                    )
                }
                "protocol" => f.protocol = Some(v),
                "last" => {
                    f.last = Some(
                        v.parse()
                            .map_err(|_| format!("last {v:?} is not a count"))?,
                    )
                }
                "follow" => f.follow = matches!(&*v, "" | "1" | "true"),
                other => return Err(format!("unknown filter {other:?}")),
            }
        }
        Ok(f)
    }

    /// The query `from_query` reads back.
    pub(crate) fn to_query(&self) -> String {
        let mut q = form_urlencoded::Serializer::new(String::new());
        let mut put = |k: &str, v: &Option<String>| {
            if let Some(v) = v {
                q.append_pair(k, v);
            }
        };
        put("pod", &self.pod);
        put("namespace", &self.namespace);
        put("verdict", &self.verdict);
        put("reason", &self.reason);
        put("policy", &self.policy);
        put("port", &self.port.map(|p| p.to_string()));
        put("protocol", &self.protocol);
        put("last", &self.last.map(|n| n.to_string()));
        if self.follow {
            q.append_pair("follow", "true");
        }
        q.finish()
    }

    pub fn matches(&self, l: &Line) -> bool {
        let f = &l.flow;
        let ends = [&f.source, &f.destination];
        if let Some(p) = &self.pod {
            let hit = ends.iter().any(|e| match p.split_once('/') {
                Some((ns, name)) => e.namespace == ns && e.pod_name == name,
                None => e.pod_name == *p,
            });
            if !hit {
                return false;
            }
        }
        if let Some(ns) = &self.namespace
            && !ends.iter().any(|e| e.namespace == *ns)
        {
            return false;
        }
        if let Some(v) = &self.verdict
            && !f.verdict.eq_ignore_ascii_case(v)
        {
            return false;
        }
        if let Some(r) = &self.reason {
            let hit = [&f.drop_reason_desc, &f.path_reason, &f.path]
                .iter()
                .any(|x| x.as_deref().is_some_and(|x| x.eq_ignore_ascii_case(r)));
            if !hit {
                return false;
            }
        }
        if let Some(p) = &self.policy {
            let hit = f.policies().any(|x| match p.split_once('/') {
                Some((ns, name)) => x.namespace == ns && x.name == name,
                None => x.name == *p,
            });
            if !hit {
                return false;
            }
        }
        if let Some(port) = self.port
            && !f.ports().is_some_and(|(s, d)| s == port || d == port)
        {
            return false;
        }
        if let Some(p) = &self.protocol
            && !f.protocol().eq_ignore_ascii_case(p)
        {
            return false;
        }
        true
    }
}
