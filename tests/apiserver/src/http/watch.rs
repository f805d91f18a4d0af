//! Watch streams: history replay, selector transitions, bookmarks,
//! `sendInitialEvents` and `410 Expired`, sent in chunks of whole events.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::Response;
use hyper::body::Frame;
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::table::table_of;
use super::{Body, Ctx, Route};
use crate::Shared;
use crate::store::{ApiError, Event, EventType, Kind, State, Stored};
use crate::store::{FieldSelector, Selectors};

/// Default watch length when the client gives no timeoutSeconds (the real
/// server picks 30-60 minutes).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);
/// Bytes per chunk when a watch sends many events at once.
const CHUNK: usize = 256 * 1024;

fn event_line(out: &mut Vec<u8>, kind: &str, obj: &[u8]) {
    out.extend_from_slice(br#"{"type":""#);
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(br#"","object":"#);
    out.extend_from_slice(obj);
    out.extend_from_slice(b"}\n");
}

fn bookmark_line(out: &mut Vec<u8>, kind: Kind, rv: u64, initial_end: bool) {
    let mut meta = json!({"resourceVersion": rv.to_string(), "creationTimestamp": null});
    if initial_end && let Value::Object(m) = &mut meta {
        m.insert(
            "annotations".into(),
            json!({"k8s.io/initial-events-end": "true"}),
        );
    }
    let obj = json!({"kind": kind.res().kind, "apiVersion": kind.api_version(), "metadata": meta});
    event_line(out, "BOOKMARK", obj.to_string().as_bytes());
}

/// Appends the events after `cursor` that the selectors let through, with the
/// real watch cache's rules for objects entering or leaving the selection.
/// Returns `Err(oldest)` if the history no longer reaches back to `cursor`.
fn drain(
    st: &State,
    cursor: &mut u64,
    scope: &Scope,
    table: Option<&TableMode>,
    out: &mut Vec<u8>,
) -> Result<(), u64> {
    let events = st.events_after(*cursor)?;
    for ev in events.filter(|ev| scope.holds(&ev.obj)) {
        write_event(ev, &scope.selectors, table, out);
    }
    *cursor = (*cursor).max(st.rv);
    Ok(())
}

/// What a watch sees: one kind, in one namespace or all, through its selectors.
struct Scope {
    kind: Kind,
    ns: Option<String>,
    selectors: Selectors,
}

impl Scope {
    /// Whether an event's object is of this watch's kind and namespace;
    /// the history holds every kind's events under the one resourceVersion.
    fn holds(&self, obj: &Stored) -> bool {
        obj.kind == self.kind && self.ns.as_deref().is_none_or(|n| obj.ns == n)
    }
}

/// A watch for `kubectl get -w`: objects go out as one-row Tables.
#[derive(Debug, Clone)]
pub(super) struct TableMode {
    include: Option<String>,
}

/// Writes one event, its object as JSON or, for table watches, as a Table.
pub(super) fn object_line(
    out: &mut Vec<u8>,
    kind: &str,
    obj: &Arc<Stored>,
    table: Option<&TableMode>,
) {
    match table {
        None => event_line(out, kind, &obj.full),
        Some(t) => {
            let tbl = table_of(
                obj.kind,
                std::slice::from_ref(obj),
                Some(obj.rv),
                None,
                t.include.as_deref(),
            );
            event_line(out, kind, tbl.to_string().as_bytes());
        }
    }
}

fn write_event(ev: &Event, sel: &Selectors, table: Option<&TableMode>, out: &mut Vec<u8>) {
    if sel.is_empty() {
        object_line(out, ev.kind.as_str(), &ev.obj, table);
        return;
    }
    let now = sel.matches(&ev.obj);
    match ev.kind {
        EventType::Added | EventType::Deleted => {
            if now {
                object_line(out, ev.kind.as_str(), &ev.obj, table);
            }
        }
        EventType::Modified => {
            let before = ev.prev.as_ref().is_none_or(|p| sel.matches(p));
            match (before, now) {
                (true, true) => object_line(out, "MODIFIED", &ev.obj, table),
                (false, true) => object_line(out, "ADDED", &ev.obj, table),
                (true, false) => {
                    // The previous content, at this event's version.
                    if let Some(gone) = ev.prev.as_ref().and_then(|p| p.with_rv(ev.rv).ok()) {
                        object_line(out, "DELETED", &Arc::new(gone), table);
                    }
                }
                (false, false) => {}
            }
        }
    }
}

fn expired_line(out: &mut Vec<u8>, want: u64, oldest: u64) {
    let status = ApiError::expired(format!("too old resource version: {want} ({oldest})")).status();
    event_line(out, "ERROR", status.to_string().as_bytes());
}

async fn send_chunks(tx: &mpsc::Sender<Bytes>, buf: Vec<u8>) -> bool {
    if buf.is_empty() {
        return true;
    }
    if buf.len() <= CHUNK {
        return tx.send(Bytes::from(buf)).await.is_ok();
    }
    let all = Bytes::from(buf);
    let mut start = 0;
    while start < all.len() {
        // Cut at line ends so each chunk holds whole events.
        let mut end = (start + CHUNK).min(all.len());
        if end < all.len()
            && let Some(nl) = all[start..end].iter().rposition(|&b| b == b'\n')
        {
            end = start + nl + 1;
        }
        if tx.send(all.slice(start..end)).await.is_err() {
            return false;
        }
        start = end;
    }
    true
}

struct WatchSpec {
    scope: Scope,
    table: Option<TableMode>,
    bookmarks: bool,
    timeout: Duration,
    initial: Vec<u8>,
    initial_end: bool,
    cursor: u64,
    gone: Option<(u64, u64)>,
}

async fn run_watch(shared: Arc<Shared>, spec: WatchSpec, tx: mpsc::Sender<Bytes>) {
    let WatchSpec {
        scope,
        table,
        bookmarks,
        timeout,
        initial,
        initial_end,
        mut cursor,
        gone,
    } = spec;
    let mut changed = shared.changed.subscribe();
    if !send_chunks(&tx, initial).await {
        return;
    }
    if initial_end {
        let mut buf = Vec::new();
        bookmark_line(&mut buf, scope.kind, cursor, true);
        if !send_chunks(&tx, buf).await {
            return;
        }
    }
    if let Some((want, oldest)) = gone {
        let mut buf = Vec::new();
        expired_line(&mut buf, want, oldest);
        let _ = send_chunks(&tx, buf).await;
        return;
    }
    let deadline = tokio::time::Instant::now() + timeout;
    let period = shared.bookmark_interval;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        changed.borrow_and_update();
        let mut buf = Vec::new();
        let from = cursor;
        let result =
            shared.with_state(|st| drain(st, &mut cursor, &scope, table.as_ref(), &mut buf));
        if let Err(oldest) = result {
            expired_line(&mut buf, from, oldest);
            let _ = send_chunks(&tx, buf).await;
            return;
        }
        if !send_chunks(&tx, buf).await {
            return;
        }
        tokio::select! {
            r = changed.changed() => if r.is_err() { return },
            _ = tick.tick(), if bookmarks => {
                let mut buf = Vec::new();
                bookmark_line(&mut buf, scope.kind, cursor, false);
                if !send_chunks(&tx, buf).await {
                    return;
                }
            }
            () = tokio::time::sleep_until(deadline) => return,
            () = tx.closed() => return,
        }
    }
}

impl Ctx {
    pub(super) fn watch(&self, r: &Route<'_>) -> Result<Response<Body>, ApiError> {
        self.shared.count("watch");
        let q = &self.query;
        let mut selectors = q.selectors(r.kind)?;
        if let Some(name) = r.name {
            // A watch of one object (the legacy /watch/{plural}/{name} path
            // included): a field selector on the name.
            let f = format!("metadata.name={name}");
            selectors.fields =
                FieldSelector::parse(r.kind, &f).map_err(|e| ApiError::bad_request(&e))?;
        }
        let bookmarks = q.flag("allowWatchBookmarks");
        let send_initial = q.get("sendInitialEvents").map(|v| v == "true" || v == "1");
        let version_match = q.get("resourceVersionMatch").filter(|s| !s.is_empty());
        let invalid = |field: &str, msg: &str| {
            ApiError::unprocessable(&format!(
                "ListOptions.meta.k8s.io \"\" is invalid: {field}: Forbidden: {msg}"
            ))
        };
        match send_initial {
            Some(true) if !bookmarks => {
                return Err(invalid(
                    "sendInitialEvents",
                    "sendInitialEvents is forbidden for watch unless allowWatchBookmarks=true",
                ));
            }
            Some(_) if version_match != Some("NotOlderThan") => {
                return Err(invalid(
                    "resourceVersionMatch",
                    "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                ));
            }
            None if version_match.is_some() => {
                return Err(invalid(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                ));
            }
            _ => {}
        }
        let timeout = q
            .get("timeoutSeconds")
            .and_then(|t| t.parse::<u64>().ok())
            .filter(|&t| t > 0)
            .map_or(DEFAULT_WATCH_TIMEOUT, Duration::from_secs);
        let rv = q.get("resourceVersion").filter(|s| !s.is_empty());
        let resume: Option<u64> =
            match rv {
                None | Some("0") => None,
                Some(s) => Some(s.parse().map_err(|_| {
                    ApiError::bad_request(&format!("invalid resource version: {s:?}"))
                })?),
            };
        let initial_events =
            send_initial == Some(true) || (send_initial.is_none() && resume.is_none());
        let mut spec = WatchSpec {
            scope: Scope {
                kind: r.kind,
                ns: r.ns.map(str::to_string),
                selectors,
            },
            table: self.table.then(|| TableMode {
                include: self.query.get("includeObject").map(str::to_string),
            }),
            bookmarks,
            timeout,
            initial: Vec::new(),
            initial_end: send_initial == Some(true),
            cursor: 0,
            gone: None,
        };
        self.shared.with_state(|st| {
            if initial_events {
                for obj in st.of_kind(r.kind, r.ns) {
                    if spec.scope.selectors.matches(obj) {
                        object_line(&mut spec.initial, "ADDED", obj, spec.table.as_ref());
                    }
                }
                spec.cursor = st.rv;
            } else {
                let want = resume.unwrap_or(st.rv);
                if want < st.oldest {
                    spec.gone = Some((want, st.oldest));
                }
                spec.cursor = want;
            }
        });
        let (tx, mut rx) = mpsc::channel::<Bytes>(16);
        tokio::spawn(run_watch(self.shared.clone(), spec, tx));
        let stream = futures::stream::poll_fn(move |cx| {
            rx.poll_recv(cx)
                .map(|o| o.map(|b| Ok::<_, Infallible>(Frame::data(b))))
        });
        let mut resp = Response::new(StreamBody::new(stream).boxed_unsync());
        resp.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        resp.headers_mut()
            .insert(CACHE_CONTROL, HeaderValue::from_static("no-cache, private"));
        Ok(resp)
    }
}
