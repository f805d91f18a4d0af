//! Lists and gets, through kube-rs and on the wire: selectors, pagination,
//! errors, and the exact bytes the real server sends.

use k8s_openapi::api::core::v1::Node;
use kube::api::ListParams;
use mycni_apiserver::node;
use serde_json::json;

use crate::{api, api_status, by_name, raw, raw_json, start, watch_lines};

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
    let (code, v) = raw_json(addr, "GET", "/api/v1/services", None, "");
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
