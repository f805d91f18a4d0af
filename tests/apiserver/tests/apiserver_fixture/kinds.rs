//! Namespaces, Pods and NetworkPolicies through kube-rs, as mycni-agent
//! watches them (`Api::all`, page size 100): lists, events and resume for
//! each kind, one resourceVersion across kinds, the pod and namespace
//! strategies, and a namespace's deletion taking its contents along.

use std::fmt::Debug;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicySpec};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use mycni_apiserver::{
    ApiServer, NAMESPACE_NAME_LABEL, namespace, network_policy, node, pod, pod_status,
};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::{api_status, raw, start, watch_lines};

fn client(server: &ApiServer) -> kube::Client {
    server.kube_client().expect("kube client")
}

fn rv_of<K: Resource>(k: &K) -> u64 {
    k.meta()
        .resource_version
        .as_deref()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Runs kube-rs's watcher over every object of `K` (as the agent does, a
/// page size small enough that the initial list takes several pages) and
/// checks it lists `initial`, then sees `create` as an Apply and `delete`
/// as a Delete.
async fn watch_one_kind<K>(
    server: &ApiServer,
    initial: &[&str],
    create: impl FnOnce(),
    delete: impl FnOnce(),
    created: &str,
) where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + 'static,
{
    let api: Api<K> = Api::all(client(server));
    let mut events = watcher(api, watcher::Config::default().page_size(2)).boxed();
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(5), events.try_next())
            .await
            .expect("watch event within 5 s")
            .expect("watch ok")
            .expect("stream open")
    };
    assert!(matches!(next().await, watcher::Event::Init));
    let mut listed = Vec::new();
    loop {
        match next().await {
            watcher::Event::InitApply(o) => listed.push(o.name_any()),
            watcher::Event::InitDone => break,
            other => panic!("expected InitApply or InitDone, got {other:?}"),
        }
    }
    assert_eq!(listed, initial);
    create();
    match next().await {
        watcher::Event::Apply(o) => assert_eq!(o.name_any(), created),
        other => panic!("expected Apply, got {other:?}"),
    }
    delete();
    match next().await {
        watcher::Event::Delete(o) => {
            assert_eq!(o.name_any(), created);
            assert_eq!(rv_of(&o), server.resource_version());
        }
        other => panic!("expected Delete, got {other:?}"),
    }
}

fn two_namespaces(server: &ApiServer) {
    for ns in ["x", "y"] {
        server
            .create_namespace(namespace(ns, &[("ns", ns)]))
            .expect("namespace");
    }
}

#[tokio::test]
async fn watcher_lists_and_follows_each_kind() {
    let server = start();
    two_namespaces(&server);
    // Namespaces: the four every cluster has, and ours.
    watch_one_kind::<Namespace>(
        &server,
        &[
            "default",
            "kube-node-lease",
            "kube-public",
            "kube-system",
            "x",
            "y",
        ],
        || {
            server.create_namespace(namespace("z", &[])).expect("z");
        },
        || server.delete_namespace("z").expect("delete z"),
        "z",
    )
    .await;
    // Pods and policies across namespaces, listed in namespace order.
    for (ns, name) in [("y", "a"), ("x", "b"), ("x", "a")] {
        server.create_pod(pod(ns, name, &[], None)).expect("pod");
        server
            .create_network_policy(network_policy(ns, name, NetworkPolicySpec::default()))
            .expect("policy");
    }
    watch_one_kind::<Pod>(
        &server,
        &["a", "b", "a"],
        || {
            server
                .create_pod(pod("y", "c", &[], Some("n1")))
                .expect("c");
        },
        || server.delete_pod("y", "c").expect("delete c"),
        "c",
    )
    .await;
    watch_one_kind::<NetworkPolicy>(
        &server,
        &["a", "b", "a"],
        || {
            server
                .create_network_policy(network_policy("x", "c", NetworkPolicySpec::default()))
                .expect("c");
        },
        || server.delete_network_policy("x", "c").expect("delete c"),
        "c",
    )
    .await;
    // The agent's page size is 100: the lists above took 3 and 2 pages.
    assert!(server.request_count("list") >= 3 + 2 + 2);
}

#[tokio::test]
async fn one_resource_version_across_kinds_and_resume() {
    let server = start();
    let before = server.resource_version();
    let ns = server.create_namespace(namespace("x", &[])).expect("ns");
    let p = server.create_pod(pod("x", "a", &[], None)).expect("pod");
    let np = server
        .create_network_policy(network_policy("x", "p", NetworkPolicySpec::default()))
        .expect("policy");
    let n = server.create_node(node("n1", None)).expect("node");
    // Each write of any kind is the next version, as etcd's one revision.
    assert_eq!(
        [rv_of(&ns), rv_of(&p), rv_of(&np), rv_of(&n)],
        [before + 1, before + 2, before + 3, before + 4]
    );
    // Every kind's list is at the latest version, whatever changed last.
    let c = client(&server);
    let lp = ListParams::default();
    let pods = Api::<Pod>::all(c.clone()).list(&lp).await.expect("pods");
    let pols = Api::<NetworkPolicy>::all(c.clone())
        .list(&lp)
        .await
        .expect("policies");
    let nss = Api::<Namespace>::all(c.clone())
        .list(&lp)
        .await
        .expect("namespaces");
    for v in [&pods.metadata, &pols.metadata, &nss.metadata] {
        assert_eq!(v.resource_version, Some((before + 4).to_string()));
    }
    // A pod watch resumed from the namespace's version sees the pod's
    // events only, none of the other kinds'.
    server
        .update_pod("x", "a", |p| {
            p.labels_mut().insert("l".into(), "v".into());
        })
        .expect("label");
    let path = format!(
        "/api/v1/pods?watch=true&resourceVersion={}&timeoutSeconds=1",
        rv_of(&ns)
    );
    let (_, _, text) = raw(server.addr(), "GET", &path, None, "");
    let events: Vec<(String, String)> = watch_lines(&text)
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap_or_default().to_string(),
                e["object"]["kind"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(
        events,
        [
            ("ADDED".into(), "Pod".into()),
            ("MODIFIED".into(), "Pod".into())
        ]
    );
    // The same in one namespace through kube-rs, then 410 Gone once the
    // history is compacted.
    let api: Api<Pod> = Api::namespaced(c, "x");
    let wp = WatchParams::default().timeout(1);
    let got: Vec<_> = api
        .watch(&wp, &rv_of(&np).to_string())
        .await
        .expect("watch")
        .try_filter(|e| std::future::ready(!matches!(e, WatchEvent::Bookmark(_))))
        .try_collect()
        .await
        .expect("events");
    assert!(
        matches!(got.as_slice(), [WatchEvent::Modified(p)] if p.labels().get("l").is_some()),
        "{got:?}"
    );
    server.compact();
    let got: Vec<_> = api
        .watch(&wp, &rv_of(&np).to_string())
        .await
        .expect("watch")
        .try_filter(|e| std::future::ready(!matches!(e, WatchEvent::Bookmark(_))))
        .try_collect()
        .await
        .expect("events");
    assert!(
        matches!(got.as_slice(), [WatchEvent::Error(e)] if e.code == 410),
        "{got:?}"
    );
}

#[tokio::test]
async fn namespace_deletion_takes_its_pods_and_policies() {
    let server = start();
    two_namespaces(&server);
    for ns in ["x", "y"] {
        server.create_pod(pod(ns, "a", &[], None)).expect("pod");
        server
            .create_network_policy(network_policy(ns, "p", NetworkPolicySpec::default()))
            .expect("policy");
    }
    let from = server.resource_version();
    let api: Api<Namespace> = Api::all(client(&server));
    api.delete("x", &DeleteParams::default())
        .await
        .expect("delete x");
    assert!(server.get_namespace("x").is_none());
    assert_eq!(server.pods(None).len(), 1);
    assert_eq!(server.pods(Some("y")).len(), 1);
    assert_eq!(server.network_policies(None).len(), 1);
    // Contents go first, each its own DELETED event, then the namespace.
    let mut deleted = Vec::new();
    for path in [
        "/api/v1/pods",
        "/apis/networking.k8s.io/v1/networkpolicies",
        "/api/v1/namespaces",
    ] {
        let q = format!("{path}?watch=true&resourceVersion={from}&timeoutSeconds=1");
        let (_, _, text) = raw(server.addr(), "GET", &q, None, "");
        for e in watch_lines(&text) {
            assert_eq!(e["type"], json!("DELETED"), "{e}");
            let rv: u64 = e["object"]["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|s| s.parse().ok())
                .expect("rv");
            deleted.push((
                rv,
                e["object"]["kind"].as_str().unwrap_or_default().to_string(),
            ));
        }
    }
    deleted.sort();
    let kinds: Vec<&str> = deleted.iter().map(|(_, k)| k.as_str()).collect();
    assert_eq!(kinds, ["Pod", "NetworkPolicy", "Namespace"]);
    // A namespace that is gone takes no new pods.
    let pods: Api<Pod> = Api::namespaced(client(&server), "x");
    let err = pods
        .create(&PostParams::default(), &pod("x", "b", &[], None))
        .await
        .expect_err("namespace gone");
    let s = api_status(err);
    assert_eq!(
        (s.code, s.message.as_str()),
        (404, "namespaces \"x\" not found")
    );
}

#[tokio::test]
async fn pod_strategy_main_resource_and_status() {
    let server = start();
    let api: Api<Pod> = Api::namespaced(client(&server), "default");
    let pp = PostParams::default();
    // Create ignores a status: the server starts every Pod Pending.
    let mut p = pod("default", "a", &[("app", "web")], Some("n1"));
    p.status = Some(pod_status(&["10.244.1.5"], None));
    let created = api.create(&pp, &p).await.expect("create");
    let status = created.status.clone().unwrap_or_default();
    assert_eq!(
        (
            status.phase.as_deref(),
            status.pod_ip.as_deref(),
            status.qos_class.as_deref()
        ),
        (Some("Pending"), None, Some("BestEffort"))
    );
    let err = api.create(&pp, &p).await.expect_err("exists");
    assert_eq!(api_status(err).reason, "AlreadyExists");
    // The status subresource writes status (and metadata) but not spec.
    let patched = api
        .patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({
                "spec": {"nodeName": "elsewhere"},
                "status": {"phase": "Running", "podIP": "10.244.1.5", "podIPs": [{"ip": "10.244.1.5"}]}
            })),
        )
        .await
        .expect("status patch");
    assert_eq!(
        patched.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some("n1")
    );
    assert_eq!(
        patched.status.as_ref().and_then(|s| s.pod_ip.as_deref()),
        Some("10.244.1.5")
    );
    // The main resource writes spec and metadata, never status.
    let mut changed = patched.clone();
    changed.labels_mut().insert("tier".into(), "1".into());
    changed.status = Some(pod_status(&["10.9.9.9"], None));
    let replaced = api.replace("a", &pp, &changed).await.expect("replace");
    assert_eq!(replaced.labels().get("tier").map(String::as_str), Some("1"));
    assert_eq!(
        replaced.status.as_ref().and_then(|s| s.pod_ip.as_deref()),
        Some("10.244.1.5")
    );
    // A stale resourceVersion conflicts.
    let err = api.replace("a", &pp, &changed).await.expect_err("stale");
    assert_eq!(api_status(err).code, 409);
    // What a kubelet does through the fixture's own API.
    let written = server
        .set_pod_status(
            "default",
            "a",
            pod_status(&["10.244.1.6", "fd00::6"], Some("192.168.77.2")),
        )
        .expect("set status");
    let ips: Vec<String> = written
        .status
        .and_then(|s| s.pod_ips)
        .unwrap_or_default()
        .into_iter()
        .map(|i| i.ip)
        .collect();
    assert_eq!(ips, ["10.244.1.6", "fd00::6"]);
    // generateName picks a free name.
    let mut g = pod("default", "", &[], None);
    g.metadata.name = None;
    g.metadata.generate_name = Some("gen-".into());
    let made = api.create(&pp, &g).await.expect("generateName");
    assert!(made.name_any().starts_with("gen-") && made.name_any().len() == 9);
}

#[tokio::test]
async fn namespace_name_label_is_the_servers() {
    let server = start();
    let api: Api<Namespace> = Api::all(client(&server));
    let created = api
        .create(&PostParams::default(), &namespace("x", &[("ns", "x")]))
        .await
        .expect("create");
    let label = |n: &Namespace| n.labels().get(NAMESPACE_NAME_LABEL).cloned();
    assert_eq!(label(&created), Some("x".into()));
    assert_eq!(
        created.status.and_then(|s| s.phase).as_deref(),
        Some("Active")
    );
    // Neither removed nor changed by a client.
    for value in [json!(null), json!("other")] {
        let patched = api
            .patch(
                "x",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {NAMESPACE_NAME_LABEL: value}}})),
            )
            .await
            .expect("patch");
        assert_eq!(label(&patched), Some("x".into()));
    }
    let again = server
        .update_namespace("x", |n| {
            n.labels_mut().clear();
        })
        .expect("update");
    assert_eq!(label(&again), Some("x".into()));
}

#[tokio::test]
async fn pod_selectors_and_pages_across_namespaces() {
    let server = start();
    two_namespaces(&server);
    for (ns, name, node_name) in [
        ("x", "a", "n1"),
        ("x", "b", "n2"),
        ("y", "a", "n1"),
        ("y", "b", "n2"),
    ] {
        server
            .create_pod(pod(ns, name, &[("pod", name)], Some(node_name)))
            .expect("pod");
    }
    let all: Api<Pod> = Api::all(client(&server));
    let names = |l: Vec<Pod>| -> Vec<String> {
        l.iter()
            .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
            .collect()
    };
    let on_n1 = all
        .list(&ListParams::default().fields("spec.nodeName=n1"))
        .await
        .expect("list");
    assert_eq!(names(on_n1.items), ["x/a", "y/a"]);
    let in_y = all
        .list(
            &ListParams::default()
                .fields("metadata.namespace=y")
                .labels("pod=b"),
        )
        .await
        .expect("list");
    assert_eq!(names(in_y.items), ["y/b"]);
    // Pages of one, continuing across the namespace boundary.
    let mut seen = Vec::new();
    let mut lp = ListParams::default().limit(1);
    loop {
        let page = all.list(&lp).await.expect("page");
        seen.extend(names(page.items));
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
            _ => break,
        }
    }
    assert_eq!(seen, ["x/a", "x/b", "y/a", "y/b"]);
    // Field labels a kind does not have are refused, as by the real server.
    let pols: Api<NetworkPolicy> = Api::all(client(&server));
    let err = pols
        .list(&ListParams::default().fields("spec.nodeName=n1"))
        .await
        .expect_err("no such field label");
    assert_eq!(api_status(err).code, 400);
}
