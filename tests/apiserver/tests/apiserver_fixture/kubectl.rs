//! kubectl against the fixture, when it is installed.

use std::process::Command;

use mycni_apiserver::{node, node_field};
use serde_json::{Value, json};

use crate::{by_name, start};

pub(crate) fn kubectl() -> Option<String> {
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
