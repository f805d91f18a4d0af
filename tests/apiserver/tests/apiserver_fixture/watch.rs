//! Watches through kube-rs's watcher and reflector and on the wire:
//! bookmarks, streaming lists, selectors, outages and compaction.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use mycni_apiserver::{node, node_field};
use serde_json::json;

use crate::{api, by_name, eventually, raw, raw_json, rv, start, store_state, watch_lines};

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
