//! kubectl on Namespaces, Pods and NetworkPolicies, with no extra flags:
//! `apply -f` (default validation), `get` (tables, `-o wide`, `-A`),
//! `label`, `patch --subresource=status` and `delete`, and the errors it
//! prints for an invalid policy and a missing namespace.

use std::path::Path;
use std::process::{Command, Output};

use mycni_apiserver::ApiServer;
use serde_json::{Value, json};

use crate::kubectl::kubectl;
use crate::start;

const MANIFEST: &str = "\
apiVersion: v1
kind: Namespace
metadata:
  name: x
  labels:
    ns: x
---
apiVersion: v1
kind: Pod
metadata:
  name: a
  namespace: x
  labels:
    pod: a
spec:
  nodeName: node-1
  containers:
  - name: c
    image: pause
    ports:
    - name: serve-80-tcp
      containerPort: 80
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: allow-a
  namespace: x
spec:
  podSelector:
    matchLabels:
      pod: a
  ingress:
  - from:
    - namespaceSelector:
        matchLabels:
          ns: \"y\"  # unquoted, YAML 1.1 reads y as true
    ports:
    - port: serve-80-tcp
";

const INVALID: &str = "\
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: bad
  namespace: x
spec:
  podSelector: {}
  ingress:
  - ports:
    - port: 90
      endPort: 80
";

struct Kubectl {
    bin: String,
    dir: tempfile::TempDir,
}

impl Kubectl {
    fn new(bin: String, server: &ApiServer) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        server
            .write_kubeconfig(&dir.path().join("kubeconfig"))
            .expect("kubeconfig");
        Self { bin, dir }
    }

    fn output(&self, args: &[&str]) -> Output {
        Command::new(&self.bin)
            .arg("--kubeconfig")
            .arg(self.dir.path().join("kubeconfig"))
            .args(args)
            .env("HOME", self.dir.path())
            .output()
            .expect("run kubectl")
    }

    fn run(&self, args: &[&str]) -> String {
        let out = self.output(args);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn fails(&self, args: &[&str]) -> String {
        let out = self.output(args);
        assert!(!out.status.success(), "kubectl {args:?} succeeded");
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    fn file(&self, name: &str, text: &str) -> String {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).expect("write manifest");
        path_str(&p)
    }
}

fn path_str(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn rows(table: &str) -> Vec<Vec<String>> {
    table
        .lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

#[test]
fn kubectl_applies_gets_labels_patches_and_deletes_each_kind() {
    let Some(bin) = kubectl() else {
        eprintln!("SKIP: kubectl not installed (apt-get install kubernetes-client)");
        return;
    };
    let server = start();
    let k = Kubectl::new(bin, &server);
    let manifest = k.file("all.yaml", MANIFEST);
    let out = k.run(&["apply", "-f", &manifest]);
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "namespace/x created",
            "pod/a created",
            "networkpolicy.networking.k8s.io/allow-a created"
        ]
    );
    // Applying again finds them and patches (the policy's defaulted port
    // list differs from the file's, as on a real server).
    let out = k.run(&["apply", "-f", &manifest]);
    assert!(out.contains("namespace/x unchanged"), "{out}");
    assert!(out.contains("pod/a unchanged"), "{out}");

    let ns = rows(&k.run(&["get", "namespaces"]));
    assert_eq!(ns[0], ["NAME", "STATUS", "AGE"]);
    assert!(ns.iter().any(|r| r[..2] == ["x", "Active"]), "{ns:?}");
    let labels = k.run(&["get", "ns", "x", "-o", "jsonpath={.metadata.labels}"]);
    let labels: Value = serde_json::from_str(&labels).expect("labels");
    assert_eq!(
        labels,
        json!({"kubernetes.io/metadata.name": "x", "ns": "x"})
    );

    let pods = rows(&k.run(&["get", "pods", "-A", "-o", "wide"]));
    assert_eq!(
        pods[0],
        [
            "NAMESPACE",
            "NAME",
            "READY",
            "STATUS",
            "RESTARTS",
            "AGE",
            "IP",
            "NODE",
            "NOMINATED",
            "NODE",
            "READINESS",
            "GATES"
        ]
    );
    assert_eq!(pods[1][..5], ["x", "a", "0/1", "Pending", "0"]);
    assert_eq!(pods[1][6..8], ["<none>", "node-1"]);

    let pols = rows(&k.run(&["get", "networkpolicies", "-n", "x"]));
    assert_eq!(pols[0], ["NAME", "POD-SELECTOR", "AGE"]);
    assert_eq!(pols[1][..2], ["allow-a", "pod=a"]);
    let policy: Value =
        serde_json::from_str(&k.run(&["get", "netpol", "-n", "x", "allow-a", "-o", "json"]))
            .expect("json");
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress"]));
    assert_eq!(
        policy["spec"]["ingress"][0]["ports"][0]["protocol"],
        json!("TCP")
    );

    // label on each kind, selected by label afterwards.
    k.run(&["label", "ns", "x", "team=blue"]);
    k.run(&["label", "pod", "-n", "x", "a", "team=blue"]);
    k.run(&["label", "netpol", "-n", "x", "allow-a", "team=blue"]);
    assert_eq!(
        k.run(&["get", "ns", "-l", "team=blue", "-o", "name"])
            .trim(),
        "namespace/x"
    );
    assert_eq!(
        k.run(&["get", "pods", "-A", "-l", "team=blue", "-o", "name"])
            .trim(),
        "pod/a"
    );
    assert_eq!(
        k.run(&["get", "netpol", "-A", "-l", "team=blue", "-o", "name"])
            .trim(),
        "networkpolicy.networking.k8s.io/allow-a"
    );

    // A kubelet's status write, through the status subresource.
    k.run(&[
        "patch",
        "pod",
        "a",
        "-n",
        "x",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"phase":"Running","podIP":"10.244.1.5","podIPs":[{"ip":"10.244.1.5"}]}}"#,
    ]);
    let pods = rows(&k.run(&["get", "pod", "a", "-n", "x", "-o", "wide"]));
    assert_eq!(pods[1][2], "Running");
    assert_eq!(pods[1][5..7], ["10.244.1.5", "node-1"]);
    assert_eq!(
        k.run(&[
            "get",
            "pods",
            "-A",
            "--field-selector",
            "spec.nodeName=node-1",
            "-o",
            "name"
        ])
        .trim(),
        "pod/a"
    );
    // The main resource does not take status.
    k.run(&[
        "patch",
        "pod",
        "a",
        "-n",
        "x",
        "--type=merge",
        "-p",
        r#"{"status":{"phase":"Failed"}}"#,
    ]);
    let pod = server.get_pod("x", "a").expect("pod");
    assert_eq!(pod.status.and_then(|s| s.phase).as_deref(), Some("Running"));

    // Refusals, worded as kubectl words the real server's.
    let invalid = k.file("bad.yaml", INVALID);
    let err = k.fails(&["apply", "-f", &invalid]);
    assert!(
        err.contains("spec.ingress[0].ports[0].endPort: Invalid value: 90: must be greater than or equal to `port`"),
        "{err}"
    );
    let orphan = k.file(
        "orphan.yaml",
        &MANIFEST
            .split("---\n")
            .nth(1)
            .unwrap_or_default()
            .replace("namespace: x", "namespace: nope"),
    );
    let err = k.fails(&["apply", "-f", &orphan]);
    assert!(err.contains("namespaces \"nope\" not found"), "{err}");

    k.run(&["delete", "netpol", "-n", "x", "allow-a"]);
    assert!(server.network_policies(None).is_empty());
    k.run(&["apply", "-f", &manifest]);
    k.run(&["delete", "pod", "-n", "x", "a"]);
    assert!(server.get_pod("x", "a").is_none());
    k.run(&["apply", "-f", &manifest]);
    // The namespace takes what is left in it.
    k.run(&["delete", "ns", "x"]);
    assert!(server.get_namespace("x").is_none());
    assert!(server.pods(None).is_empty() && server.network_policies(None).is_empty());
}
