//! The HTTP side: routing, the Node endpoints, watch streams, discovery and
//! the server-side table kubectl prints.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use k8s_openapi::api::core::v1::Node;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::Shared;
use super::selector::{FieldSelector, LabelSelector, Selectors};
use super::store::{
    ApiError, Event, EventType, ListRequest, PatchKind, State, Stored, Target, now_secs,
};

pub(crate) type Body = UnsyncBoxBody<Bytes, Infallible>;

/// Default watch length when the client gives no timeoutSeconds (the real
/// server picks 30-60 minutes).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);
/// Bytes per chunk when a watch sends many events at once.
const CHUNK: usize = 256 * 1024;
/// Largest request body accepted (the real server's limit is 3 MiB).
const MAX_BODY: usize = 3 * 1024 * 1024;

/// Decoded query parameters.
#[derive(Debug, Default)]
pub(crate) struct Query(Vec<(String, String)>);

fn pct_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                match std::str::from_utf8(&b[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(v) => {
                        out.push(v);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Query {
    pub(crate) fn parse(q: Option<&str>) -> Self {
        Self(
            q.unwrap_or_default()
                .split('&')
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let (k, v) = p.split_once('=').unwrap_or((p, ""));
                    (pct_decode(k), pct_decode(v))
                })
                .collect(),
        )
    }

    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1"))
    }

    fn dry_run(&self) -> bool {
        self.get("dryRun") == Some("All")
    }

    fn selectors(&self) -> Result<Selectors, ApiError> {
        Ok(Selectors {
            labels: LabelSelector::parse(self.get("labelSelector").unwrap_or_default())
                .map_err(|e| ApiError::bad_request(&e))?,
            fields: FieldSelector::parse(self.get("fieldSelector").unwrap_or_default())
                .map_err(|e| ApiError::bad_request(&e))?,
        })
    }
}

fn full(code: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<Body> {
    let mut resp = Response::new(Full::new(body.into()).boxed_unsync());
    *resp.status_mut() = code;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp.headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-cache, private"));
    resp
}

fn json_bytes(code: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    full(code, "application/json", body)
}

fn json_value(code: StatusCode, v: &Value) -> Response<Body> {
    json_bytes(code, v.to_string())
}

fn error(e: &ApiError) -> Response<Body> {
    json_value(
        StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        &e.status(),
    )
}

fn media_type(req_header: Option<&str>) -> String {
    req_header
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

fn parse_json(body: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(&format!("error decoding request body: {e}")))
}

/// Entry point for every request.
pub(crate) async fn handle(
    shared: Arc<Shared>,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = match http_body_util::Limited::new(body, MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return Ok(error(&ApiError::bad_request(
                "the request body could not be read or is too large",
            )));
        }
    };
    let query = Query::parse(parts.uri.query());
    let header = |name: hyper::header::HeaderName| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let accept = header(hyper::header::ACCEPT).unwrap_or_default();
    let ctx = Ctx {
        shared: shared.clone(),
        query,
        table: accept.contains("as=Table"),
        content_type: media_type(header(CONTENT_TYPE).as_deref()),
        body,
    };
    let path = parts.uri.path().to_string();
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let m = &parts.method;
    let result = match segs.as_slice() {
        [] if m == Method::GET => Ok(ctx.root()),
        ["version"] if m == Method::GET => Ok(ctx.discovery(version())),
        ["healthz" | "livez" | "readyz"] if m == Method::GET => {
            Ok(full(StatusCode::OK, "text/plain; charset=utf-8", "ok"))
        }
        ["api"] if m == Method::GET => Ok(ctx.discovery(json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": shared.addr.to_string()}
            ]
        }))),
        ["apis"] if m == Method::GET => Ok(ctx.discovery(json!({
            "kind": "APIGroupList", "apiVersion": "v1", "groups": []
        }))),
        ["api", "v1"] if m == Method::GET => Ok(ctx.discovery(api_v1())),
        ["openapi", "v2"] if m == Method::GET => Ok(ctx.openapi_v2(&accept)),
        ["openapi", "v3"] if m == Method::GET => Ok(ctx.discovery(json!({
            "paths": {"api/v1": {"serverRelativeURL": format!("/openapi/v3/api/v1?hash={OPENAPI_HASH}")}}
        }))),
        ["openapi", "v3", "api", "v1"] if m == Method::GET => Ok(ctx.discovery(openapi_v3_api_v1())),
        ["api", "v1", "nodes"] => match *m {
            Method::GET if ctx.query.flag("watch") => ctx.watch(None),
            Method::GET => ctx.list(),
            Method::POST => ctx.create(),
            Method::DELETE => ctx.delete_collection(),
            _ => Err(ApiError::method_not_allowed()),
        },
        ["api", "v1", "watch", "nodes"] if m == Method::GET => ctx.watch(None),
        ["api", "v1", "watch", "nodes", name] if m == Method::GET => ctx.watch(Some(name)),
        ["api", "v1", "nodes", name] => match *m {
            Method::GET if ctx.query.flag("watch") => ctx.watch(Some(name)),
            Method::GET => ctx.get(name),
            Method::PUT => ctx.update(name, Target::Main),
            Method::PATCH => ctx.patch(name, Target::Main),
            Method::DELETE => ctx.delete(name),
            _ => Err(ApiError::method_not_allowed()),
        },
        ["api", "v1", "nodes", name, "status"] => match *m {
            Method::GET => ctx.get(name),
            Method::PUT => ctx.update(name, Target::Status),
            Method::PATCH => ctx.patch(name, Target::Status),
            _ => Err(ApiError::method_not_allowed()),
        },
        ["_fixture", "compact"] if m == Method::POST => {
            shared.compact();
            Ok(json_value(StatusCode::OK, &json!({"compacted": true})))
        }
        ["_fixture", "outage"] if m == Method::POST => Ok(ctx.outage()),
        ["_fixture", "counters"] if m == Method::GET => {
            Ok(json_value(StatusCode::OK, &json!(shared.counters())))
        }
        _ => Err(ApiError::no_route()),
    };
    let resp = result.unwrap_or_else(|e| error(&e));
    if shared.log {
        eprintln!(
            "mycni-apiserver: {peer} {} {} -> {}",
            parts.method,
            parts.uri,
            resp.status().as_u16()
        );
    }
    Ok(resp)
}

struct Ctx {
    shared: Arc<Shared>,
    query: Query,
    table: bool,
    content_type: String,
    body: Bytes,
}

fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": "v1.33.0",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-04-23T00:00:00Z",
        "goVersion": "go1.24.2",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

const OPENAPI_HASH: &str = "6D7E3F2A1B0C9D8E";

/// Just enough OpenAPI v3 for kubectl: the Node PATCH operation accepts
/// `fieldValidation`, so kubectl leaves validation to the server (which
/// this fixture does not do) instead of downloading the v2 schema.
fn openapi_v3_api_v1() -> Value {
    let gvk = json!({"group": "", "version": "v1", "kind": "Node"});
    let params = json!([
        {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
        {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
        {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}}
    ]);
    let op = |id: &str, action: &str| {
        json!({"operationId": id, "tags": ["core_v1"], "parameters": params,
               "responses": {"200": {"description": "OK"}},
               "x-kubernetes-action": action, "x-kubernetes-group-version-kind": gvk})
    };
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": {
            "/api/v1/nodes": {"post": op("createCoreV1Node", "post")},
            "/api/v1/nodes/{name}": {
                "put": op("replaceCoreV1Node", "put"),
                "patch": op("patchCoreV1Node", "patch")
            },
            "/api/v1/nodes/{name}/status": {
                "put": op("replaceCoreV1NodeStatus", "put"),
                "patch": op("patchCoreV1NodeStatus", "patch")
            }
        },
        "components": {}
    })
}

fn api_v1() -> Value {
    json!({
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [
            {
                "name": "nodes",
                "singularName": "node",
                "namespaced": false,
                "kind": "Node",
                "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
                "shortNames": ["no"],
                "storageVersionHash": "XwShjMxG9Fs="
            },
            {
                "name": "nodes/status",
                "singularName": "",
                "namespaced": false,
                "kind": "Node",
                "verbs": ["get", "patch", "update"]
            }
        ]
    })
}

fn node_list(rv: u64, items: &[Arc<Stored>], cont: Option<&str>, remaining: Option<u64>) -> Bytes {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Value::Object(m) = &mut meta {
        if let Some(c) = cont {
            m.insert("continue".into(), json!(c));
        }
        if let Some(r) = remaining {
            m.insert("remainingItemCount".into(), json!(r));
        }
    }
    let size: usize = items.iter().map(|i| i.item.len() + 1).sum();
    let mut out = Vec::with_capacity(size + 128);
    out.extend_from_slice(br#"{"kind":"NodeList","apiVersion":"v1","metadata":"#);
    out.extend_from_slice(meta.to_string().as_bytes());
    out.extend_from_slice(br#","items":["#);
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(&item.item);
    }
    out.extend_from_slice(b"]}");
    Bytes::from(out)
}

fn event_line(out: &mut Vec<u8>, kind: &str, obj: &[u8]) {
    out.extend_from_slice(br#"{"type":""#);
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(br#"","object":"#);
    out.extend_from_slice(obj);
    out.extend_from_slice(b"}\n");
}

fn bookmark_line(out: &mut Vec<u8>, rv: u64, initial_end: bool) {
    let mut meta = json!({"resourceVersion": rv.to_string(), "creationTimestamp": null});
    if initial_end && let Value::Object(m) = &mut meta {
        m.insert(
            "annotations".into(),
            json!({"k8s.io/initial-events-end": "true"}),
        );
    }
    let obj = json!({"kind": "Node", "apiVersion": "v1", "metadata": meta});
    event_line(out, "BOOKMARK", obj.to_string().as_bytes());
}

/// Appends the events after `cursor` that the selectors let through, with the
/// real watch cache's rules for objects entering or leaving the selection.
/// Returns `Err(oldest)` if the history no longer reaches back to `cursor`.
fn drain(
    st: &State,
    cursor: &mut u64,
    sel: &Selectors,
    table: Option<&TableMode>,
    out: &mut Vec<u8>,
) -> Result<(), u64> {
    let events = st.events_after(*cursor)?;
    for ev in events {
        write_event(ev, sel, table, out);
    }
    *cursor = (*cursor).max(st.rv);
    Ok(())
}

/// A watch for `kubectl get -w`: objects go out as one-row Tables.
#[derive(Debug, Clone)]
struct TableMode {
    include: Option<String>,
}

/// Writes one event, its object as JSON or, for table watches, as a Table.
fn object_line(out: &mut Vec<u8>, kind: &str, obj: &Arc<Stored>, table: Option<&TableMode>) {
    match table {
        None => event_line(out, kind, &obj.full),
        Some(t) => {
            let tbl = table_of(
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
    selectors: Selectors,
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
        selectors,
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
        bookmark_line(&mut buf, cursor, true);
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
            shared.with_state(|st| drain(st, &mut cursor, &selectors, table.as_ref(), &mut buf));
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
                bookmark_line(&mut buf, cursor, false);
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
    fn discovery(&self, v: Value) -> Response<Body> {
        self.shared.count("discovery");
        json_value(StatusCode::OK, &v)
    }

    /// An OpenAPI v2 document without definitions: kubectl's client-side
    /// validation finds no schema for Node and lets it through. kubectl asks
    /// for protobuf (gnostic `openapi_v2.Document`); field 1 is `swagger`.
    fn openapi_v2(&self, accept: &str) -> Response<Body> {
        self.shared.count("discovery");
        if accept.contains("protobuf") {
            return full(
                StatusCode::OK,
                "application/octet-stream",
                Bytes::from_static(b"\x0a\x032.0"),
            );
        }
        json_value(
            StatusCode::OK,
            &json!({"swagger": "2.0", "info": {"title": "Kubernetes", "version": "v1.33.0"},
                    "paths": {}, "definitions": {}}),
        )
    }

    fn root(&self) -> Response<Body> {
        self.discovery(json!({"paths": [
            "/api", "/api/v1", "/apis", "/healthz", "/livez", "/openapi/v2", "/openapi/v3",
            "/readyz", "/version"
        ]}))
    }

    fn list(&self) -> Result<Response<Body>, ApiError> {
        self.shared.count("list");
        let q = &self.query;
        let req = ListRequest {
            selectors: q.selectors()?,
            limit: q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(0),
            continue_token: q.get("continue").map(str::to_string),
            resource_version: q.get("resourceVersion").map(str::to_string),
            version_match: q.get("resourceVersionMatch").map(str::to_string),
        };
        let page = self.shared.with_state(|st| st.list(&req))?;
        if self.table {
            return Ok(json_value(
                StatusCode::OK,
                &table_of(
                    &page.items,
                    Some(page.rv),
                    page.continue_token.as_deref(),
                    self.query.get("includeObject"),
                ),
            ));
        }
        Ok(json_bytes(
            StatusCode::OK,
            node_list(
                page.rv,
                &page.items,
                page.continue_token.as_deref(),
                page.remaining,
            ),
        ))
    }

    fn watch(&self, name: Option<&str>) -> Result<Response<Body>, ApiError> {
        self.shared.count("watch");
        let q = &self.query;
        let mut selectors = q.selectors()?;
        if let Some(name) = name {
            // The legacy /watch/nodes/{name} path: a field selector on the name.
            let f = format!("metadata.name={name}");
            selectors.fields = FieldSelector::parse(&f).map_err(|e| ApiError::bad_request(&e))?;
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
            selectors,
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
                for obj in st.nodes.values() {
                    if spec.selectors.matches(obj) {
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

    fn get(&self, name: &str) -> Result<Response<Body>, ApiError> {
        self.shared.count("get");
        let obj = self.shared.with_state(|st| st.get(name))?;
        if self.table {
            return Ok(json_value(
                StatusCode::OK,
                &table_of(&[obj], None, None, self.query.get("includeObject")),
            ));
        }
        Ok(json_bytes(StatusCode::OK, obj.full.clone()))
    }

    fn json_body(&self) -> Result<Value, ApiError> {
        match self.content_type.as_str() {
            "" | "application/json" => parse_json(&self.body),
            other => Err(ApiError::unsupported_media(&format!(
                "the body of the request was in an unknown format - accepted media types include: application/json (got {other})"
            ))),
        }
    }

    fn create(&self) -> Result<Response<Body>, ApiError> {
        self.shared.count("create");
        let v = self.json_body()?;
        let dry = self.query.dry_run();
        let obj = self
            .shared
            .with_state(|st| st.create(v, Target::Main, dry))?;
        Ok(json_bytes(StatusCode::CREATED, obj.full.clone()))
    }

    fn update(&self, name: &str, target: Target) -> Result<Response<Body>, ApiError> {
        self.shared.count("update");
        let v = self.json_body()?;
        let dry = self.query.dry_run();
        let obj = self
            .shared
            .with_state(|st| st.update(name, v, target, dry))?;
        Ok(json_bytes(StatusCode::OK, obj.full.clone()))
    }

    fn patch(&self, name: &str, target: Target) -> Result<Response<Body>, ApiError> {
        self.shared.count("patch");
        let kind = match self.content_type.as_str() {
            "application/merge-patch+json" => PatchKind::Merge,
            "application/strategic-merge-patch+json" => PatchKind::Strategic,
            "application/json-patch+json" => PatchKind::Json,
            _ => {
                return Err(ApiError::unsupported_media(
                    "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json",
                ));
            }
        };
        let body = parse_json(&self.body)?;
        let dry = self.query.dry_run();
        let obj = self
            .shared
            .with_state(|st| st.patch(name, kind, &body, target, dry))?;
        Ok(json_bytes(StatusCode::OK, obj.full.clone()))
    }

    fn delete_options(&self) -> Result<(Option<String>, Option<String>, bool), ApiError> {
        let opts = if self.body.is_empty() {
            json!({})
        } else {
            parse_json(&self.body)?
        };
        let pre = |k: &str| {
            opts.pointer(&format!("/preconditions/{k}"))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let dry = self.query.dry_run()
            || opts
                .get("dryRun")
                .and_then(Value::as_array)
                .is_some_and(|a| a.iter().any(|v| v == "All"));
        Ok((pre("uid"), pre("resourceVersion"), dry))
    }

    fn delete(&self, name: &str) -> Result<Response<Body>, ApiError> {
        self.shared.count("delete");
        let (uid, rv, dry) = self.delete_options()?;
        let (obj, gone) = self
            .shared
            .with_state(|st| st.delete(name, uid.as_deref(), rv.as_deref(), dry))?;
        if !gone {
            return Ok(json_bytes(StatusCode::OK, obj.full.clone()));
        }
        Ok(json_value(StatusCode::OK, &success_status(&obj)))
    }

    fn delete_collection(&self) -> Result<Response<Body>, ApiError> {
        self.shared.count("deletecollection");
        let selectors = self.query.selectors()?;
        let (_, _, dry) = self.delete_options()?;
        let items = self.shared.with_state(|st| {
            let names: Vec<String> = st
                .nodes
                .values()
                .filter(|o| selectors.matches(o))
                .map(|o| o.name.clone())
                .collect();
            let mut deleted = Vec::new();
            for name in names {
                if let Ok((obj, _)) = st.delete(&name, None, None, dry) {
                    deleted.push(obj);
                }
            }
            (st.rv, deleted)
        });
        Ok(json_bytes(
            StatusCode::OK,
            node_list(items.0, &items.1, None, None),
        ))
    }

    fn outage(&self) -> Response<Body> {
        let secs: f64 = self
            .query
            .get("seconds")
            .and_then(|s| s.parse().ok())
            .unwrap_or(5.0);
        let shared = self.shared.clone();
        // From a plain thread: taking the listener down waits for this very
        // connection to close, which must not block the runtime.
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            shared.set_reachable(false);
            std::thread::sleep(Duration::from_secs_f64(secs.clamp(0.0, 3600.0)));
            shared.set_reachable(true);
        });
        json_value(StatusCode::ACCEPTED, &json!({"outageSeconds": secs}))
    }
}

fn success_status(obj: &Stored) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {
            "name": obj.name,
            "kind": "nodes",
            "uid": obj.value.pointer("/metadata/uid").cloned().unwrap_or(Value::Null)
        }
    })
}

/// `kubectl`'s age format.
fn human_age(secs: i64) -> String {
    let s = secs.max(0);
    match s {
        0..120 => format!("{s}s"),
        120..600 => format!("{}m{}s", s / 60, s % 60),
        600..10_800 => format!("{}m", s / 60),
        10_800..28_800 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        28_800..172_800 => format!("{}h", s / 3600),
        172_800..691_200 => format!("{}d{}h", s / 86_400, (s % 86_400) / 3600),
        691_200..63_072_000 => format!("{}d", s / 86_400),
        _ => format!("{}y{}d", s / 31_536_000, (s % 31_536_000) / 86_400),
    }
}

fn node_row(node: &Node, obj: &Stored, include: Option<&str>) -> Value {
    let status = node.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
    let mut state = match ready.map(|c| c.status.as_str()) {
        Some("True") => "Ready".to_string(),
        Some("False") => "NotReady".to_string(),
        _ => "Unknown".to_string(),
    };
    if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
        state.push_str(",SchedulingDisabled");
    }
    let mut roles: Vec<String> = obj
        .labels
        .iter()
        .filter_map(|(k, v)| {
            if let Some(r) = k.strip_prefix("node-role.kubernetes.io/") {
                (!r.is_empty()).then(|| r.to_string())
            } else if k == "kubernetes.io/role" && !v.is_empty() {
                Some(v.clone())
            } else {
                None
            }
        })
        .collect();
    roles.sort();
    roles.dedup();
    let roles = if roles.is_empty() {
        "<none>".to_string()
    } else {
        roles.join(",")
    };
    let age = node
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or("<unknown>".to_string(), |t| {
            human_age(now_secs() - t.0.as_second())
        });
    let info = status.and_then(|s| s.node_info.as_ref());
    let address = |kind: &str| {
        status
            .and_then(|s| s.addresses.as_ref())
            .and_then(|a| a.iter().find(|a| a.type_ == kind))
            .map_or("<none>".to_string(), |a| a.address.clone())
    };
    let or_unknown = |s: Option<&String>| {
        s.filter(|s| !s.is_empty())
            .cloned()
            .unwrap_or_else(|| "<unknown>".to_string())
    };
    let object = match include {
        Some("None") => Value::Null,
        Some("Object") => obj.value.clone(),
        _ => json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.value.get("metadata").cloned().unwrap_or(json!({}))
        }),
    };
    json!({
        "cells": [
            obj.name,
            state,
            roles,
            age,
            info.map(|i| i.kubelet_version.clone()).unwrap_or_default(),
            address("InternalIP"),
            address("ExternalIP"),
            or_unknown(info.map(|i| &i.os_image)),
            or_unknown(info.map(|i| &i.kernel_version)),
            or_unknown(info.map(|i| &i.container_runtime_version)),
        ],
        "object": object
    })
}

/// The `meta.k8s.io/v1` Table the real server renders for Nodes.
fn table_of(
    items: &[Arc<Stored>],
    rv: Option<u64>,
    cont: Option<&str>,
    include: Option<&str>,
) -> Value {
    let col = |name: &str, format: &str, priority: u8, description: &str| {
        json!({"name": name, "type": "string", "format": format,
               "description": description, "priority": priority})
    };
    let rows: Vec<Value> = items
        .iter()
        .filter_map(|o| o.node().map(|n| node_row(&n, o, include)))
        .collect();
    let mut meta = json!({});
    if let Value::Object(m) = &mut meta {
        if let Some(rv) = rv {
            m.insert("resourceVersion".into(), json!(rv.to_string()));
        }
        if let Some(c) = cont {
            m.insert("continue".into(), json!(c));
        }
    }
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": [
            col("Name", "name", 0, "Name must be unique within a namespace."),
            col("Status", "", 0, "The status of the node"),
            col("Roles", "", 0, "The roles of the node"),
            col("Age", "", 0, "CreationTimestamp is a timestamp representing the server time when this object was created."),
            col("Version", "", 0, "Kubelet Version reported by the node."),
            col("Internal-IP", "", 1, "List of addresses reachable to the node. Queried from cloud provider, if available."),
            col("External-IP", "", 1, "List of addresses reachable to the node. Queried from cloud provider, if available."),
            col("OS-Image", "", 1, "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy))."),
            col("Kernel-Version", "", 1, "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64)."),
            col("Container-Runtime", "", 1, "ContainerRuntime Version reported by the node through runtime remote API (e.g. containerd://1.4.2)."),
        ],
        "rows": rows
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_decoding() {
        let q = Query::parse(Some(
            "&labelSelector=a%3Db%2Cc&fieldSelector=metadata.name%3Dx&watch=1&x=a+b&bad=%zz&end=%4",
        ));
        assert_eq!(q.get("labelSelector"), Some("a=b,c"));
        assert_eq!(q.get("fieldSelector"), Some("metadata.name=x"));
        assert!(q.flag("watch"));
        assert_eq!(q.get("x"), Some("a b"));
        assert_eq!(q.get("bad"), Some("%zz"));
        assert_eq!(q.get("end"), Some("%4"));
    }

    #[test]
    fn ages() {
        assert_eq!(human_age(5), "5s");
        assert_eq!(human_age(150), "2m30s");
        assert_eq!(human_age(3600), "60m");
        assert_eq!(human_age(5 * 3600 + 60), "5h1m");
        assert_eq!(human_age(3 * 86_400), "3d0h");
    }
}
