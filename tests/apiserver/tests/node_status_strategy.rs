//! What the node status strategy of the real API server lets through the
//! `nodes/status` subresource and what it resets, and the fixture's RBAC
//! mode that refuses writes to `nodes` itself: together they are what
//! mycni-agent's ClusterRole (deploy/base/rbac.yaml: `patch` on
//! `nodes/status` only) leaves it, so a test against the fixture proves the
//! agent would work against the real thing.

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use mycni_apiserver::{ApiServer, node};
use serde_json::json;

fn start() -> ApiServer {
    ApiServer::start("127.0.0.1:0".parse().expect("addr")).expect("start fixture")
}

fn api(server: &ApiServer) -> Api<Node> {
    Api::all(server.kube_client().expect("kube client"))
}

#[tokio::test]
async fn status_patch_keeps_metadata_and_status_and_resets_spec() {
    let server = start();
    server
        .create_node(node("n", Some("10.244.3.0/24")))
        .expect("create");
    let api = api(&server);
    let pp = PatchParams::default();
    // Everything a caller could try through status at once: annotations and
    // a condition (what mycni-agent writes), and spec changes (what its
    // role must not be able to make).
    let patched = api
        .patch_status(
            "n",
            &pp,
            &Patch::Merge(json!({
                "metadata": {"annotations": {"mycni.dev/vtep-mac": "02:00:00:00:03:01"},
                             "labels": {"l": "v"}},
                "spec": {"podCIDR": "10.244.99.0/24", "unschedulable": true,
                         "taints": [{"key": "k", "effect": "NoSchedule"}]},
                "status": {"conditions": [{"type": "NetworkUnavailable", "status": "False"}]}
            })),
        )
        .await
        .expect("status patch");
    let stored = server.get_node("n").expect("n");
    assert_eq!(patched, stored);
    let ann = stored.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        ann.get("mycni.dev/vtep-mac").map(String::as_str),
        Some("02:00:00:00:03:01")
    );
    assert_eq!(
        stored
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("l"))
            .map(String::as_str),
        Some("v")
    );
    let spec = stored.spec.clone().unwrap_or_default();
    assert_eq!(
        spec.pod_cidr.as_deref(),
        Some("10.244.3.0/24"),
        "spec reset"
    );
    assert_eq!(spec.unschedulable, None, "spec reset");
    assert_eq!(spec.taints, None, "spec reset");
    let conds = stored.status.and_then(|s| s.conditions).unwrap_or_default();
    assert!(
        conds
            .iter()
            .any(|c| c.type_ == "NetworkUnavailable" && c.status == "False")
    );

    // A spec-only change through status is no change at all.
    let before = server.get_node("n").expect("n");
    let same = api
        .patch_status(
            "n",
            &pp,
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .expect("spec-only status patch");
    assert_eq!(
        same.metadata.resource_version,
        before.metadata.resource_version
    );
}

#[tokio::test]
async fn forbidden_node_writes_get_403_and_status_still_works() {
    let server = start();
    server
        .create_node(node("n", Some("10.244.4.0/24")))
        .expect("create");
    server.forbid_node_writes(true);
    let api = api(&server);
    let pp = PatchParams::default();
    let code = |e: kube::Error| match e {
        kube::Error::Api(s) => (s.code, s.reason.clone()),
        other => panic!("not an API error: {other}"),
    };
    let merge = Patch::Merge(json!({"metadata": {"annotations": {"a": "b"}}}));
    assert_eq!(
        code(api.patch("n", &pp, &merge).await.expect_err("patch")),
        (403, "Forbidden".to_string())
    );
    let mut n = server.get_node("n").expect("n");
    n.spec.get_or_insert_default().taints = Some(vec![Taint {
        key: "k".into(),
        effect: "NoSchedule".into(),
        ..Taint::default()
    }]);
    assert_eq!(
        code(
            api.replace("n", &PostParams::default(), &n)
                .await
                .expect_err("update")
        )
        .0,
        403
    );
    assert_eq!(
        code(
            api.create(&PostParams::default(), &node("m", None))
                .await
                .expect_err("create")
        )
        .0,
        403
    );
    assert_eq!(
        code(
            api.delete("n", &DeleteParams::default())
                .await
                .expect_err("delete")
        )
        .0,
        403
    );
    // Reads and the status subresource are untouched.
    api.get("n").await.expect("get");
    let patched = api
        .patch_status("n", &pp, &merge)
        .await
        .expect("status patch");
    assert_eq!(
        patched
            .metadata
            .annotations
            .unwrap_or_default()
            .get("a")
            .map(String::as_str),
        Some("b")
    );
    server.forbid_node_writes(false);
    api.patch("n", &pp, &merge).await.expect("allowed again");
}
