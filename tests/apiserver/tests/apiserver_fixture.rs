//! The Kubernetes API fixture (`mycni_apiserver`) against the clients
//! that use it: kube-rs as the agent does (Api, watcher, reflector, patches),
//! raw HTTP for the wire format, and kubectl.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use mycni_apiserver::{ApiServer, node, node_field};
use serde_json::{Value, json};

fn start() -> ApiServer {
    ApiServer::start("127.0.0.1:0".parse().expect("addr")).expect("start fixture")
}

fn api(server: &ApiServer) -> Api<Node> {
    Api::all(server.kube_client().expect("kube client"))
}

fn rv(n: &Node) -> String {
    n.metadata.resource_version.clone().unwrap_or_default()
}

fn by_name(nodes: impl IntoIterator<Item = Node>) -> BTreeMap<String, String> {
    nodes
        .into_iter()
        .map(|n| (n.metadata.name.clone().unwrap_or_default(), rv(&n)))
        .collect()
}

fn store_state(store: &Store<Node>) -> BTreeMap<String, String> {
    by_name(store.state().iter().map(|n| (**n).clone()))
}

/// Polls `f` until it holds, for at most `limit`.
async fn eventually(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn api_status(err: kube::Error) -> kube::core::Status {
    match err {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// A raw HTTP/1.1 exchange with `Connection: close`; returns status, headers
/// (lower-cased names) and the body, de-chunked.
fn raw(
    addr: SocketAddr,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: &str,
) -> (u16, BTreeMap<String, String>, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(ct) = content_type {
        req.push_str(&format!("Content-Type: {ct}\r\n"));
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    s.write_all(req.as_bytes()).expect("send");
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).expect("status line");
    let code: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status code");
    let mut headers = BTreeMap::new();
    loop {
        line.clear();
        r.read_line(&mut line).expect("header");
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let mut out = Vec::new();
    if headers.get("transfer-encoding").map(String::as_str) == Some("chunked") {
        loop {
            line.clear();
            r.read_line(&mut line).expect("chunk size");
            let size = usize::from_str_radix(line.trim(), 16).expect("chunk size hex");
            if size == 0 {
                break;
            }
            let mut chunk = vec![0; size + 2];
            r.read_exact(&mut chunk).expect("chunk");
            out.extend_from_slice(&chunk[..size]);
        }
    } else {
        r.read_to_end(&mut out).expect("body");
    }
    (code, headers, String::from_utf8(out).expect("utf-8 body"))
}

fn raw_json(
    addr: SocketAddr,
    method: &str,
    path: &str,
    ct: Option<&str>,
    body: &str,
) -> (u16, Value) {
    let (code, _, text) = raw(addr, method, path, ct, body);
    (
        code,
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")),
    )
}

fn watch_lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn condition(type_: &str, status: &str) -> NodeCondition {
    NodeCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(format!("{type_}Reason")),
        ..NodeCondition::default()
    }
}

#[tokio::test]
async fn list_get_selectors_and_not_found() {
    let server = start();
    let mut labelled = node("n1", Some("10.244.1.0/24"));
    labelled.metadata.labels = Some([("role".to_string(), "edge".to_string())].into());
    server.create_node(labelled).expect("create n1");
    server
        .create_node(node("n2", Some("10.244.2.0/24")))
        .expect("create n2");
    server.create_node(node("n3", None)).expect("create n3");
    let api = api(&server);

    let all = api.list(&ListParams::default()).await.expect("list");
    assert_eq!(by_name(all.items.clone()).len(), 3);
    assert_eq!(
        all.metadata.resource_version,
        Some(server.resource_version().to_string())
    );
    let n1 = &all.items[0];
    assert_eq!(n1.metadata.name.as_deref(), Some("n1"));
    assert!(n1.metadata.uid.as_ref().is_some_and(|u| u.len() == 36));
    assert!(n1.metadata.creation_timestamp.is_some());
    assert_eq!(
        n1.spec.as_ref().and_then(|s| s.pod_cidrs.clone()),
        Some(vec!["10.244.1.0/24".to_string()])
    );

    let names = |l: kube::core::ObjectList<Node>| -> Vec<String> {
        l.items
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect()
    };
    let lp = |s: &str| ListParams::default().labels(s);
    assert_eq!(
        names(api.list(&lp("role=edge")).await.expect("list")),
        ["n1"]
    );
    assert_eq!(
        names(api.list(&lp("role!=edge")).await.expect("list")),
        ["n2", "n3"]
    );
    assert_eq!(names(api.list(&lp("role")).await.expect("list")), ["n1"]);
    assert_eq!(
        names(api.list(&lp("!role")).await.expect("list")),
        ["n2", "n3"]
    );
    let by_field = ListParams::default().fields("metadata.name=n2");
    assert_eq!(names(api.list(&by_field).await.expect("list")), ["n2"]);
    let bad = ListParams::default().fields("status.phase=Running");
    let err = api_status(api.list(&bad).await.expect_err("unsupported field"));
    assert_eq!((err.code, err.reason.as_str()), (400, "BadRequest"));

    let paged = api
        .list(&ListParams::default().limit(2))
        .await
        .expect("page 1");
    let token = paged.metadata.continue_.clone().expect("continue token");
    assert_eq!(paged.items.len(), 2);
    assert_eq!(paged.metadata.remaining_item_count, Some(1));
    let rest = api
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .expect("page 2");
    assert_eq!(names(rest.clone()), ["n3"]);
    assert!(
        rest.metadata
            .continue_
            .as_deref()
            .unwrap_or_default()
            .is_empty()
    );
    assert_eq!(
        rest.metadata.resource_version,
        paged.metadata.resource_version
    );

    // Pages come from one snapshot: a delete between pages does not show.
    let first = api
        .list(&ListParams::default().limit(1))
        .await
        .expect("page 1");
    server.delete_node("n3").expect("delete n3");
    let token = first.metadata.continue_.clone().expect("continue token");
    let rest = api
        .list(&ListParams::default().limit(5).continue_token(&token))
        .await
        .expect("page 2");
    assert_eq!(names(rest.clone()), ["n2", "n3"]);
    assert_eq!(
        rest.metadata.resource_version,
        first.metadata.resource_version
    );
    // A compaction expires the token, as etcd's does.
    server.compact();
    let err = api_status(
        api.list(&ListParams::default().limit(5).continue_token(&token))
            .await
            .expect_err("expired continue"),
    );
    assert_eq!((err.code, err.reason.as_str()), (410, "Expired"));

    let got = api.get("n2").await.expect("get");
    assert_eq!(got, server.get_node("n2").expect("n2"));
    let err = api_status(api.get("nope").await.expect_err("404"));
    assert_eq!((err.code, err.reason.as_str()), (404, "NotFound"));
    assert_eq!(err.message, "nodes \"nope\" not found");
    let details = err.details.expect("details");
    assert_eq!(
        (details.name.as_str(), details.kind.as_str()),
        ("nope", "nodes")
    );
    assert_eq!(api.get_opt("nope").await.expect("get_opt"), None);
    assert!(server.request_count("list") >= 10);
    assert_eq!(server.request_count("get"), 3);
}

#[tokio::test]
async fn wire_format_matches_the_api_server() {
    let server = start();
    server
        .create_node(node("a", Some("10.244.1.0/24")))
        .expect("create");
    let addr = server.addr();

    // 404 Status, exactly as the real server words it.
    let (code, v) = raw_json(addr, "GET", "/api/v1/nodes/zz", None, "");
    assert_eq!(code, 404);
    assert_eq!(
        v,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": "nodes \"zz\" not found", "reason": "NotFound",
               "details": {"name": "zz", "kind": "nodes"}, "code": 404})
    );
    let (code, v) = raw_json(addr, "GET", "/api/v1/pods", None, "");
    assert_eq!((code, v["reason"].as_str()), (404, Some("NotFound")));

    // Lists: NodeList with a resourceVersion; items without apiVersion/kind.
    let (code, v) = raw_json(addr, "GET", "/api/v1/nodes", None, "");
    assert_eq!(code, 200);
    assert_eq!(
        (v["kind"].as_str(), v["apiVersion"].as_str()),
        (Some("NodeList"), Some("v1"))
    );
    assert_eq!(
        v["metadata"]["resourceVersion"],
        json!(server.resource_version().to_string())
    );
    assert!(v["items"][0].get("kind").is_none());
    assert_eq!(v["items"][0]["spec"]["podCIDR"], json!("10.244.1.0/24"));
    let (_, one) = raw_json(addr, "GET", "/api/v1/nodes/a", None, "");
    assert_eq!(
        (one["kind"].as_str(), one["apiVersion"].as_str()),
        (Some("Node"), Some("v1"))
    );

    // Patch content types.
    let body = r#"{"metadata":{"labels":{"x":"y"}}}"#;
    let (code, v) = raw_json(
        addr,
        "PATCH",
        "/api/v1/nodes/a",
        Some("application/apply-patch+yaml"),
        body,
    );
    assert_eq!(
        (code, v["reason"].as_str()),
        (415, Some("UnsupportedMediaType"))
    );
    let (code, _) = raw_json(addr, "PATCH", "/api/v1/nodes/a", Some("text/plain"), body);
    assert_eq!(code, 415);
    let (code, v) = raw_json(
        addr,
        "PATCH",
        "/api/v1/nodes/a",
        Some("application/merge-patch+json"),
        "{oops",
    );
    assert_eq!((code, v["reason"].as_str()), (400, Some("BadRequest")));

    // A watch: chunked JSON lines; initial ADDED events without a resourceVersion.
    let (code, headers, text) = raw(
        addr,
        "GET",
        "/api/v1/nodes?watch=1&timeoutSeconds=1",
        None,
        "",
    );
    assert_eq!(code, 200);
    assert_eq!(
        headers.get("content-type").map(String::as_str),
        Some("application/json")
    );
    assert_eq!(
        headers.get("transfer-encoding").map(String::as_str),
        Some("chunked")
    );
    let events = watch_lines(&text);
    assert_eq!(events.len(), 1, "{text}");
    assert_eq!(events[0]["type"], json!("ADDED"));
    assert_eq!(events[0]["object"]["kind"], json!("Node"));

    // After a compaction, a watch from before it gets a 410 ERROR event (in a 200).
    let old = server.resource_version();
    server
        .update_node("a", |n| {
            n.metadata.annotations = Some([("k".to_string(), "v".to_string())].into());
        })
        .expect("update");
    server.compact();
    let (code, _, text) = raw(
        addr,
        "GET",
        &format!("/api/v1/nodes?watch=true&resourceVersion={old}"),
        None,
        "",
    );
    assert_eq!(code, 200);
    let events = watch_lines(&text);
    assert_eq!(events.len(), 1, "{text}");
    assert_eq!(events[0]["type"], json!("ERROR"));
    assert_eq!(
        events[0]["object"],
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": format!("too old resource version: {old} ({})", server.resource_version()),
               "reason": "Expired", "code": 410})
    );

    // Delete returns a Success Status naming the object.
    let uid = server
        .get_node("a")
        .and_then(|n| n.metadata.uid)
        .expect("uid");
    let (code, v) = raw_json(addr, "DELETE", "/api/v1/nodes/a", None, "");
    assert_eq!(code, 200);
    assert_eq!(
        v,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
               "details": {"name": "a", "kind": "nodes", "uid": uid}})
    );
    assert!(server.get_node("a").is_none());
}

#[tokio::test]
async fn bookmarks_and_timeout() {
    let server = start();
    server.create_node(node("a", None)).expect("create");
    let rv = server.resource_version();
    let addr = server.addr();
    let t = Instant::now();
    let path = format!(
        "/api/v1/nodes?watch=true&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=2"
    );
    let (_, _, text) = tokio::task::spawn_blocking(move || raw(addr, "GET", &path, None, ""))
        .await
        .expect("join");
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(4),
        "timeoutSeconds=2 ended the watch after {took:?}"
    );
    let events = watch_lines(&text);
    assert!(!events.is_empty(), "no bookmark in 2 s");
    for e in &events {
        assert_eq!(e["type"], json!("BOOKMARK"), "{e}");
        assert_eq!(
            e["object"]["metadata"]["resourceVersion"],
            json!(rv.to_string())
        );
    }
    // No bookmarks unless asked for.
    let path = format!("/api/v1/nodes?watch=true&resourceVersion={rv}&timeoutSeconds=1");
    let (_, _, text) = tokio::task::spawn_blocking(move || raw(addr, "GET", &path, None, ""))
        .await
        .expect("join");
    assert_eq!(text, "");
}

#[tokio::test]
async fn watcher_sees_creates_updates_and_deletes() {
    let server = start();
    server
        .create_node(node("first", Some("10.244.0.0/24")))
        .expect("create");
    let mut events = watcher(api(&server), watcher::Config::default()).boxed();
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(5), events.try_next())
            .await
            .expect("watch event within 5 s")
            .expect("watch ok")
            .expect("stream open")
    };
    assert!(matches!(next().await, watcher::Event::Init));
    assert!(
        matches!(next().await, watcher::Event::InitApply(n) if n.metadata.name.as_deref() == Some("first"))
    );
    assert!(matches!(next().await, watcher::Event::InitDone));

    let created = server
        .create_node(node("second", Some("10.244.1.0/24")))
        .expect("create");
    match next().await {
        watcher::Event::Apply(n) => assert_eq!(n, created),
        other => panic!("expected Apply, got {other:?}"),
    }
    server
        .update_node("second", |n| {
            n.metadata.annotations = Some(
                [(
                    "mycni.dev/vtep-mac".to_string(),
                    "02:00:00:00:00:01".to_string(),
                )]
                .into(),
            );
        })
        .expect("update");
    match next().await {
        watcher::Event::Apply(n) => assert_eq!(
            node_field(&n, "/metadata/annotations/mycni.dev~1vtep-mac"),
            Some(json!("02:00:00:00:00:01"))
        ),
        other => panic!("expected Apply, got {other:?}"),
    }
    // A change that changes nothing is no event and no new version.
    let before = server.resource_version();
    server.update_node("second", |_| {}).expect("no-op update");
    assert_eq!(server.resource_version(), before);
    server.delete_node("first").expect("delete");
    match next().await {
        watcher::Event::Delete(n) => {
            assert_eq!(n.metadata.name.as_deref(), Some("first"));
            assert_eq!(rv(&n), server.resource_version().to_string());
        }
        other => panic!("expected Delete, got {other:?}"),
    }
    assert_eq!(server.request_count("list"), 1);
    assert_eq!(server.request_count("watch"), 1);
}

#[tokio::test]
async fn streaming_list_watcher() {
    let server = start();
    for i in 0..3 {
        server
            .create_node(node(&format!("s{i}"), None))
            .expect("create");
    }
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(
        writer,
        watcher(api(&server), watcher::Config::default().streaming_lists()),
    )
    .default_backoff()
    .applied_objects();
    let task = tokio::spawn(stream.for_each(|_| async {}));
    tokio::time::timeout(Duration::from_secs(5), store.wait_until_ready())
        .await
        .expect("ready within 5 s")
        .expect("writer alive");
    assert_eq!(store_state(&store), by_name(server.nodes()));
    assert_eq!(
        server.request_count("list"),
        0,
        "a streaming list needs no list call"
    );
    server.create_node(node("s3", None)).expect("create");
    eventually(Duration::from_secs(5), "s3 in the store", || {
        store_state(&store) == by_name(server.nodes())
    })
    .await;
    task.abort();

    // The wire: ADDED for each object, then the initial-events-end bookmark.
    let (_, _, text) = raw(
        server.addr(),
        "GET",
        "/api/v1/nodes?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&resourceVersion=0&timeoutSeconds=1",
        None,
        "",
    );
    let events = watch_lines(&text);
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(
        &kinds[..5],
        ["ADDED", "ADDED", "ADDED", "ADDED", "BOOKMARK"]
    );
    assert_eq!(
        events[4]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        json!("true")
    );
    let (code, _) = raw_json(
        server.addr(),
        "GET",
        "/api/v1/nodes?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan",
        None,
        "",
    );
    assert_eq!(code, 422, "sendInitialEvents without bookmarks is invalid");
}

#[tokio::test]
async fn watcher_reflector_lists_5000_nodes() {
    let server = start();
    let t = Instant::now();
    for i in 0..5000u32 {
        let cidr = format!("10.{}.{}.0/24", 100 + i / 256, i % 256);
        server
            .create_node(node(&format!("node-{i:04}"), Some(&cidr)))
            .expect("create");
    }
    let created = t.elapsed();
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api(&server), watcher::Config::default()))
        .default_backoff()
        .applied_objects();
    let t = Instant::now();
    let task = tokio::spawn(stream.for_each(|_| async {}));
    tokio::time::timeout(Duration::from_secs(10), store.wait_until_ready())
        .await
        .expect("ready within 10 s")
        .expect("writer alive");
    let listed = t.elapsed();
    println!(
        "5000 nodes: created in {created:?}, listed through watcher+reflector in {listed:?} ({} list pages)",
        server.request_count("list")
    );
    assert_eq!(store.len(), 5000);
    assert_eq!(server.request_count("list"), 10, "limit=500 pages");
    assert_eq!(store_state(&store), by_name(server.nodes()));
    // Debug builds are slow; a release build takes a fraction of this.
    assert!(
        listed < Duration::from_secs(5),
        "listing 5000 nodes took {listed:?}"
    );
    task.abort();
}

#[tokio::test]
async fn watcher_recovers_from_outage_and_compaction() {
    let server = start();
    for i in 0..20 {
        server
            .create_node(node(&format!("r{i}"), None))
            .expect("create");
    }
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api(&server), watcher::Config::default()))
        .default_backoff()
        .applied_objects();
    let task = tokio::spawn(stream.for_each(|_| async {}));
    tokio::time::timeout(Duration::from_secs(5), store.wait_until_ready())
        .await
        .expect("ready")
        .expect("writer alive");
    eventually(Duration::from_secs(5), "the initial set", || {
        store_state(&store) == by_name(server.nodes())
    })
    .await;
    let lists = server.request_count("list");

    server.set_reachable(false);
    assert!(!server.is_reachable());
    assert!(
        TcpStream::connect(server.addr()).is_err(),
        "listener still open"
    );
    // Changes the watcher cannot see, then the history that would replay them goes.
    for i in 0..5 {
        server.delete_node(&format!("r{i}")).expect("delete");
    }
    server.create_node(node("late", None)).expect("create");
    server
        .update_node("r10", |n| {
            n.metadata.labels = Some([("x".to_string(), "y".to_string())].into())
        })
        .expect("update");
    server.compact();
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.set_reachable(true);

    eventually(Duration::from_secs(15), "the store to converge", || {
        store_state(&store) == by_name(server.nodes())
    })
    .await;
    assert!(
        server.request_count("list") > lists,
        "the watcher must re-list after 410 Gone"
    );
    // And it keeps watching after the re-list.
    server.create_node(node("after", None)).expect("create");
    eventually(
        Duration::from_secs(5),
        "a node created after recovery",
        || store_state(&store) == by_name(server.nodes()),
    )
    .await;
    task.abort();
}

#[tokio::test]
async fn unreachable_closes_open_watches() {
    let server = start();
    let addr = server.addr();
    let reader = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let req = format!(
            "GET /api/v1/nodes?watch=true&timeoutSeconds=30 HTTP/1.1\r\nHost: {addr}\r\n\r\n"
        );
        s.write_all(req.as_bytes()).expect("send");
        let t = Instant::now();
        let mut buf = [0u8; 4096];
        // Until the server closes (EOF) or resets the connection.
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 {
                break;
            }
        }
        t.elapsed()
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.set_reachable(false);
    let took = tokio::task::spawn_blocking(move || reader.join().expect("reader"))
        .await
        .expect("join");
    assert!(
        took < Duration::from_secs(5),
        "watch survived the outage ({took:?})"
    );
    server.set_reachable(true);
    assert!(
        TcpStream::connect(addr).is_ok(),
        "listener not back on the same port"
    );
    let (code, _) = raw_json(addr, "GET", "/api/v1/nodes", None, "");
    assert_eq!(code, 200);
}

#[tokio::test]
async fn watch_with_selector_sees_objects_enter_and_leave() {
    let server = start();
    server.create_node(node("w", None)).expect("create");
    let cfg = watcher::Config::default().labels("mycni.dev/peer=true");
    let mut events = watcher(api(&server), cfg).boxed();
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(5), events.try_next())
            .await
            .expect("event within 5 s")
            .expect("watch ok")
            .expect("stream open")
    };
    assert!(matches!(next().await, watcher::Event::Init));
    assert!(matches!(next().await, watcher::Event::InitDone));
    let set = |on: bool| {
        server
            .update_node("w", |n| {
                n.metadata.labels =
                    on.then(|| [("mycni.dev/peer".to_string(), "true".to_string())].into());
            })
            .expect("update");
    };
    set(true);
    assert!(
        matches!(next().await, watcher::Event::Apply(n) if n.metadata.name.as_deref() == Some("w"))
    );
    set(false);
    match next().await {
        watcher::Event::Delete(n) => assert_eq!(rv(&n), server.resource_version().to_string()),
        other => panic!("expected Delete, got {other:?}"),
    }
}

#[tokio::test]
async fn patches_merge_strategic_and_json() {
    let server = start();
    let mut n = node("p", Some("10.244.7.0/24"));
    n.status = Some(NodeStatus {
        conditions: Some(vec![
            condition("Ready", "True"),
            condition("MemoryPressure", "False"),
        ]),
        ..NodeStatus::default()
    });
    server.create_node(n).expect("create");
    let api = api(&server);
    let pp = PatchParams::default();

    // Merge patch of annotations on the main resource.
    let merged = api
        .patch(
            "p",
            &pp,
            &Patch::Merge(json!({"metadata": {"annotations": {
            "mycni.dev/vtep-mac": "02:aa:bb:cc:dd:ee", "mycni.dev/host-ip": "192.0.2.7"}}})),
        )
        .await
        .expect("merge patch");
    assert_eq!(
        node_field(&merged, "/metadata/annotations/mycni.dev~1host-ip"),
        Some(json!("192.0.2.7"))
    );
    assert_eq!(merged, server.get_node("p").expect("p"));

    // Strategic patch of the status subresource: conditions merge by type.
    let unavailable = json!({"status": {"conditions": [{
        "type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated",
        "message": "mycni is up", "lastTransitionTime": "2025-01-01T00:00:00Z"}]}});
    let patched = api
        .patch_status("p", &pp, &Patch::Strategic(unavailable))
        .await
        .expect("strategic status patch");
    let conds = |n: &Node| -> Vec<(String, String)> {
        n.status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|c| (c.type_, c.status))
            .collect()
    };
    let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
    assert_eq!(
        conds(&patched),
        [
            pair("Ready", "True"),
            pair("MemoryPressure", "False"),
            pair("NetworkUnavailable", "False")
        ]
    );
    let flipped = api
        .patch_status(
            "p",
            &pp,
            &Patch::Strategic(json!({"status": {"conditions": [{"type": "NetworkUnavailable", "status": "True"}]}})),
        )
        .await
        .expect("strategic status patch");
    assert_eq!(
        conds(&flipped),
        [
            pair("Ready", "True"),
            pair("MemoryPressure", "False"),
            pair("NetworkUnavailable", "True")
        ]
    );
    let unavailable = flipped
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "NetworkUnavailable"))
        .expect("condition");
    assert_eq!(
        unavailable.reason.as_deref(),
        Some("RouteCreated"),
        "unpatched fields stay"
    );

    // The main resource ignores status; the status subresource ignores the rest.
    let ignored = api
        .patch(
            "p",
            &pp,
            &Patch::Merge(json!({"status": {"conditions": null}})),
        )
        .await
        .expect("merge patch of status on main resource");
    assert_eq!(conds(&ignored).len(), 3);
    assert_eq!(rv(&ignored), rv(&flipped), "ignored change is no change");
    let ignored = api
        .patch_status(
            "p",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .expect("merge patch of metadata on status");
    assert!(ignored.metadata.labels.is_none());

    // JSON patch with an escaped pointer, guarded by a test op.
    let ops = json!([
        {"op": "test", "path": "/metadata/annotations/mycni.dev~1vtep-mac", "value": "02:aa:bb:cc:dd:ee"},
        {"op": "replace", "path": "/metadata/annotations/mycni.dev~1vtep-mac", "value": "02:11:22:33:44:55"},
        {"op": "remove", "path": "/metadata/annotations/mycni.dev~1host-ip"}
    ]);
    let jp = api
        .patch(
            "p",
            &pp,
            &Patch::Json::<()>(serde_json::from_value(ops).expect("ops")),
        )
        .await
        .expect("json patch");
    assert_eq!(
        jp.metadata.annotations,
        Some(
            [(
                "mycni.dev/vtep-mac".to_string(),
                "02:11:22:33:44:55".to_string()
            )]
            .into()
        )
    );
    let failing = json!([{"op": "test", "path": "/metadata/annotations/mycni.dev~1vtep-mac", "value": "nope"}]);
    let err = api_status(
        api.patch(
            "p",
            &pp,
            &Patch::Json::<()>(serde_json::from_value(failing).expect("ops")),
        )
        .await
        .expect_err("failed test op"),
    );
    assert_eq!(err.code, 422);

    // A patch that changes nothing keeps the version.
    let before = server.resource_version();
    let same = api
        .patch(
            "p",
            &pp,
            &Patch::Merge(
                json!({"metadata": {"annotations": {"mycni.dev/vtep-mac": "02:11:22:33:44:55"}}}),
            ),
        )
        .await
        .expect("no-op patch");
    assert_eq!(server.resource_version(), before);
    assert_eq!(rv(&same), rv(&jp));

    // podCIDR cannot change once set, as on a real cluster.
    let err = api_status(
        api.patch(
            "p",
            &pp,
            &Patch::Merge(json!({"spec": {"podCIDR": "10.244.8.0/24"}})),
        )
        .await
        .expect_err("podCIDR change"),
    );
    assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));
}

#[tokio::test]
async fn stale_resource_version_conflicts() {
    let server = start();
    let created = server.create_node(node("c", None)).expect("create");
    let api = api(&server);
    let stale = rv(&created);
    server
        .update_node("c", |n| {
            n.metadata.labels = Some([("v".to_string(), "2".to_string())].into())
        })
        .expect("update");

    let pp = PatchParams::default();
    let guarded = |rv: &str| {
        Patch::Merge(json!({"metadata": {"resourceVersion": rv, "annotations": {"a": "b"}}}))
    };
    let err = api_status(
        api.patch("c", &pp, &guarded(&stale))
            .await
            .expect_err("stale rv"),
    );
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    assert!(
        err.message.contains("the object has been modified"),
        "{}",
        err.message
    );
    let err = api_status(
        api.patch_status(
            "c",
            &pp,
            &Patch::Strategic(json!({"metadata": {"resourceVersion": stale}, "status": {}})),
        )
        .await
        .expect_err("stale rv on status"),
    );
    assert_eq!(err.code, 409);
    let current = server.resource_version().to_string();
    let ok = api
        .patch("c", &pp, &guarded(&current))
        .await
        .expect("fresh rv");
    assert_eq!(node_field(&ok, "/metadata/annotations/a"), Some(json!("b")));

    // Replace (PUT) with a stale object; create of an existing name.
    let err = api_status(
        api.replace("c", &PostParams::default(), &created)
            .await
            .expect_err("stale replace"),
    );
    assert_eq!(err.code, 409);
    let mut fresh = api.get("c").await.expect("get");
    fresh.metadata.labels = Some([("v".to_string(), "3".to_string())].into());
    let replaced = api
        .replace("c", &PostParams::default(), &fresh)
        .await
        .expect("replace");
    assert_eq!(
        node_field(&replaced, "/metadata/labels/v"),
        Some(json!("3"))
    );
    let err = api_status(
        api.create(&PostParams::default(), &node("c", None))
            .await
            .expect_err("exists"),
    );
    assert_eq!((err.code, err.reason.as_str()), (409, "AlreadyExists"));

    // Delete with a stale precondition, then for real.
    let dp = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            resource_version: Some(stale),
            uid: None,
        }),
        ..DeleteParams::default()
    };
    assert_eq!(
        api_status(api.delete("c", &dp).await.expect_err("stale delete")).code,
        409
    );
    let gone = api
        .delete("c", &DeleteParams::default())
        .await
        .expect("delete");
    assert!(gone.is_right(), "a deleted Node comes back as a Status");
    assert!(server.get_node("c").is_none());
}

fn kubectl() -> Option<String> {
    let bin = std::env::var("MYCNI_KUBECTL").unwrap_or_else(|_| "kubectl".into());
    Command::new(&bin)
        .args(["version", "--client"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| bin)
}

#[test]
fn kubectl_gets_annotates_labels_and_deletes() {
    let Some(kubectl) = kubectl() else {
        eprintln!("SKIP: kubectl not installed (apt-get install kubernetes-client)");
        return;
    };
    let server = start();
    server
        .create_node(node("k1", Some("10.244.1.0/24")))
        .expect("create");
    server
        .create_node(node("k2", Some("10.244.2.0/24")))
        .expect("create");
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let run = |args: &[&str]| -> String {
        let out = Command::new(&kubectl)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(args)
            .env("HOME", dir.path())
            .output()
            .expect("run kubectl");
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let table = run(&["get", "nodes"]);
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0],
        ["NAME", "STATUS", "ROLES", "AGE", "VERSION"],
        "{table}"
    );
    assert_eq!(rows.len(), 3, "{table}");
    assert_eq!(rows[1][..3], ["k1", "Unknown", "<none>"], "{table}");

    let json: Value =
        serde_json::from_str(&run(&["get", "node", "k1", "-o", "json"])).expect("json");
    assert_eq!(json["spec"]["podCIDR"], json!("10.244.1.0/24"));

    run(&[
        "annotate",
        "node",
        "k1",
        "mycni.dev/vtep-mac=02:00:00:00:00:09",
    ]);
    let k1 = server.get_node("k1").expect("k1");
    assert_eq!(
        node_field(&k1, "/metadata/annotations/mycni.dev~1vtep-mac"),
        Some(json!("02:00:00:00:00:09"))
    );
    run(&["label", "node", "k2", "node-role.kubernetes.io/worker="]);
    let listed = run(&[
        "get",
        "nodes",
        "-l",
        "node-role.kubernetes.io/worker",
        "-o",
        "name",
    ]);
    assert_eq!(listed.trim(), "node/k2");
    let table = run(&["get", "node", "k2"]);
    assert!(table.contains("worker"), "{table}");

    run(&["delete", "node", "k1"]);
    assert!(server.get_node("k1").is_none());
    assert_eq!(
        by_name(server.nodes()).into_keys().collect::<Vec<_>>(),
        ["k2"]
    );
    assert!(server.request_count("patch") >= 2);
    assert!(server.request_count("delete") >= 1);
}

#[tokio::test]
async fn finalizers_delay_deletion() {
    let server = start();
    let mut n = node("f", None);
    n.metadata.finalizers = Some(vec!["mycni.dev/cleanup".into()]);
    server.create_node(n).expect("create");
    let api = api(&server);
    let pending = api
        .delete("f", &DeleteParams::default())
        .await
        .expect("delete");
    let marked = pending
        .left()
        .expect("a Node with finalizers comes back as the object");
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert!(server.get_node("f").is_some());
    let before = server.resource_version();
    api.patch(
        "f",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("drop finalizer");
    assert!(
        server.get_node("f").is_none(),
        "removing the last finalizer deletes"
    );
    assert_eq!(server.resource_version(), before + 1);
}
