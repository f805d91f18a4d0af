//! Writes: the three patch types, resourceVersion preconditions and
//! finalizers.

use k8s_openapi::api::core::v1::{Node, NodeStatus};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use mycni_apiserver::{node, node_field};
use serde_json::json;

use crate::{api, api_status, condition, rv, start};

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

    // The main resource ignores status; the status subresource ignores spec
    // and takes metadata (tests/node_status_strategy.rs has the details).
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
    assert_eq!(
        node_field(&ignored, "/metadata/labels/a"),
        Some(json!("b")),
        "labels through status are kept, as by the real status strategy"
    );

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
