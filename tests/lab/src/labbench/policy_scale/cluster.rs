//! What the policy-scale bench puts in the API fixture besides the lab:
//! Pods of Deployments on nodes that do not exist, their Namespaces, and
//! NetworkPolicies over them; and the lab's own probe namespace, pods and
//! the two policies the measure turns on and off. Pure, so the shape the
//! report states is the one its tests check.
//!
//! The cluster pods look like a Deployment's pods as the API serves them
//! (managedFields included, since a list carries them and the agent only
//! drops them after decoding): `app`, `pod-template-hash`, `tier` and
//! `version` labels, a ReplicaSet owner reference, two annotations, one
//! container with two named ports, requests and limits, an env var and the
//! service-account volume, the default tolerations, and a Running status
//! with its conditions and container status. Pod `i` lives on fake node
//! `i % 1000`, whose podCIDR is `10.(100 + n / 256).(n % 256).0/24`, at
//! address `.(i / 1000 + 2)` in it: the first 10,000 pods keep their
//! identity when the bench grows the cluster to 100,000.

use serde_json::{Value, json};

use crate::netpol::policy_object;

/// The Kubernetes namespace of the lab's probe pods and policies.
pub(super) const PROBE_NS: &str = "probe";
pub(super) const ROLE: &str = "role";
pub(super) const CLIENT: &str = "client";
pub(super) const SERVER: &str = "server";
/// The port the probe servers serve and the probes connect to.
pub(super) const PROBE_PORT: u16 = 80;
/// Isolates the probe servers (ingress only from the cluster's `web`
/// pods, on 8080): the state every measure starts from, denying the probes.
pub(super) const ISOLATE: &str = "isolate-servers";
/// Allows the probe clients into the servers: the policy the measure
/// creates (the probes flip to open) and deletes (they flip back).
pub(super) const ALLOW: &str = "allow-probes";

/// Fake nodes the cluster pods are spread over: 100 pods each at 100,000.
pub(super) const FAKE_NODES: usize = 1000;
/// Pods per namespace: 10 Deployments of 10 replicas.
const PODS_PER_NS: usize = 100;
const REPLICAS: usize = 10;
const APPS: [&str; 10] = [
    "web", "api", "worker", "cache", "auth", "search", "billing", "cart", "feed", "mail",
];

/// Namespace `k`'s name.
pub(super) fn namespace_name(k: usize) -> String {
    format!("team-{k:04}")
}

/// The namespaces pods `0..pods` live in.
pub(super) fn namespaces_for(pods: usize) -> usize {
    pods.div_ceil(PODS_PER_NS)
}

/// Namespace `k` with a team and an environment label, as real clusters
/// label them for namespaceSelectors.
pub(super) fn namespace(k: usize) -> Value {
    let env = if k.is_multiple_of(4) {
        "staging"
    } else {
        "prod"
    };
    json!({"apiVersion": "v1", "kind": "Namespace",
           "metadata": {"name": namespace_name(k),
                        "labels": {"team": format!("t{}", k % 20), "env": env}}})
}

/// A short stable hash, for names that look like a ReplicaSet's.
fn fnv(parts: &[usize]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// `n` characters of the alphabet Kubernetes' name generators use.
fn k8s_chars(mut h: u64, n: usize) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..n)
        .map(|_| {
            let c = ALPHABET[(h % ALPHABET.len() as u64) as usize];
            h /= ALPHABET.len() as u64;
            char::from(c)
        })
        .collect()
}

/// A UUID-shaped uid from a seed.
fn uid(seed: u64) -> String {
    let h = format!("{:016x}{:016x}", seed, fnv(&[seed as usize, 7]));
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Fake node `n`'s name.
pub(super) fn fake_node(n: usize) -> String {
    format!("fake-node-{n:04}")
}

/// Fake node `n`'s podCIDR.
#[cfg(test)]
pub(super) fn fake_pod_cidr(n: usize) -> String {
    format!("10.{}.{}.0/24", 100 + n / 256, n % 256)
}

/// Cluster pod `i`'s address: in its fake node's podCIDR.
pub(super) fn pod_ip(i: usize) -> String {
    let n = i % FAKE_NODES;
    format!("10.{}.{}.{}", 100 + n / 256, n % 256, i / FAKE_NODES + 2)
}

/// Cluster pod `i`'s namespace, ReplicaSet, and name.
fn pod_names(i: usize) -> (String, String, String) {
    let k = i / PODS_PER_NS;
    let d = (i % PODS_PER_NS) / REPLICAS;
    let rs = format!("{}-{}", APPS[d], k8s_chars(fnv(&[k, d]), 10));
    let name = format!("{rs}-{}", k8s_chars(fnv(&[i, 1]), 5));
    (namespace_name(k), rs, name)
}

/// Cluster pod `i` (0-based), as the API would serve it.
pub(super) fn pod(i: usize) -> Value {
    let k = i / PODS_PER_NS;
    let d = (i % PODS_PER_NS) / REPLICAS;
    let (ns, rs, name) = pod_names(i);
    let app = APPS[d];
    let hash = k8s_chars(fnv(&[k, d]), 10);
    let n = i % FAKE_NODES;
    let ip = pod_ip(i);
    let host_ip = format!("172.20.{}.{}", n / 256, n % 256);
    let tier = if d < 2 { "frontend" } else { "backend" };
    let image = format!("registry.example.com/{ns}/{app}:1.4.2");
    let sa_volume = format!("kube-api-access-{}", k8s_chars(fnv(&[i, 2]), 5));
    let t = "2026-12-01T10:00:00Z";
    let container_id = format!("containerd://{:016x}{:016x}", fnv(&[i, 3]), fnv(&[i, 4]));
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": ns, "generateName": format!("{rs}-"),
            "uid": uid(i as u64),
            "creationTimestamp": t,
            "labels": {"app": app, "pod-template-hash": hash, "tier": tier, "version": "v1"},
            "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "9090"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs,
                                 "uid": uid(fnv(&[k, d, 5])), "controller": true,
                                 "blockOwnerDeletion": true}],
            "managedFields": [
                {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
                 "time": t, "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:metadata": {"f:generateName": {}, "f:labels": {".": {},
                   "f:app": {}, "f:pod-template-hash": {}, "f:tier": {}, "f:version": {}},
                   "f:ownerReferences": {".": {}, "k:{\"uid\":\"x\"}": {}}},
                   "f:spec": {"f:containers": {"k:{\"name\":\"app\"}": {".": {}, "f:env": {},
                     "f:image": {}, "f:name": {}, "f:ports": {}, "f:resources": {}}}}}},
                {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": t,
                 "fieldsType": "FieldsV1", "subresource": "status",
                 "fieldsV1": {"f:status": {"f:conditions": {}, "f:containerStatuses": {},
                   "f:hostIP": {}, "f:phase": {}, "f:podIP": {}, "f:podIPs": {},
                   "f:startTime": {}}}}
            ]
        },
        "spec": {
            "nodeName": fake_node(n),
            "serviceAccountName": "default",
            "restartPolicy": "Always", "dnsPolicy": "ClusterFirst",
            "schedulerName": "default-scheduler", "terminationGracePeriodSeconds": 30,
            "enableServiceLinks": true, "priority": 0,
            "containers": [{
                "name": "app", "image": image, "imagePullPolicy": "IfNotPresent",
                "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"},
                          {"name": "metrics", "containerPort": 9090, "protocol": "TCP"}],
                "env": [{"name": "LOG_LEVEL", "value": "info"}],
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                              "limits": {"memory": "256Mi"}},
                "volumeMounts": [{"name": sa_volume, "readOnly": true,
                                  "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File"
            }],
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                 "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                 "effect": "NoExecute", "tolerationSeconds": 300}
            ],
            "volumes": [{"name": sa_volume, "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt",
                               "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace",
                                            "fieldRef": {"apiVersion": "v1",
                                                         "fieldPath": "metadata.namespace"}}]}}
            ]}}]
        },
        "status": {
            "phase": "Running", "qosClass": "Burstable",
            "podIP": ip, "podIPs": [{"ip": ip}],
            "hostIP": host_ip, "hostIPs": [{"ip": host_ip}],
            "startTime": t,
            "conditions": [
                {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": t},
                {"type": "Initialized", "status": "True", "lastTransitionTime": t},
                {"type": "Ready", "status": "True", "lastTransitionTime": t},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": t},
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": t}
            ],
            "containerStatuses": [{
                "name": "app", "ready": true, "started": true, "restartCount": 0,
                "image": image, "imageID": format!("{image}@sha256:{:016x}", fnv(&[d, 6])),
                "containerID": container_id,
                "state": {"running": {"startedAt": t}}
            }]
        }
    })
}

/// Cluster policy `k` (0-based), in namespace `k / 10`: it selects one
/// Deployment's pods and admits its caller in the namespace on the named
/// port `http`, and the frontends of every prod namespace on `metrics`;
/// one in five also limits egress to the namespace's cache and HTTPS
/// outside the cluster. None selects a lab pod.
pub(super) fn policy(k: usize) -> Value {
    let ns = namespace_name(k / 10);
    let app = APPS[k % 10];
    let caller = APPS[(k + 9) % 10];
    let mut spec = json!({
        "podSelector": {"matchLabels": {"app": app}},
        "policyTypes": ["Ingress"],
        "ingress": [
            {"from": [{"podSelector": {"matchLabels": {"app": caller}}}],
             "ports": [{"port": "http", "protocol": "TCP"}]},
            {"from": [{"namespaceSelector": {"matchLabels": {"env": "prod"}},
                       "podSelector": {"matchLabels": {"tier": "frontend"}}}],
             "ports": [{"port": "metrics", "protocol": "TCP"}]}
        ]
    });
    if k.is_multiple_of(5) {
        spec["policyTypes"] = json!(["Ingress", "Egress"]);
        spec["egress"] = json!([
            {"to": [{"podSelector": {"matchLabels": {"app": "cache"}}}],
             "ports": [{"port": 6379, "protocol": "TCP"}]},
            {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}}],
             "ports": [{"port": 443, "protocol": "TCP"}]}
        ]);
    }
    policy_object(&ns, &format!("{app}-policy-{k:04}"), &spec)
}

/// The namespaces the first `policies` cluster policies live in.
pub(super) fn namespaces_for_policies(policies: usize) -> usize {
    policies.div_ceil(10)
}

/// Isolates the probe servers: ingress only from the cluster's `web`
/// pods in any namespace on 8080, which no probe is. With the cluster
/// loaded, every node's server allows as many addresses as there are web
/// pods (a tenth of them).
pub(super) fn isolate_servers() -> Value {
    let spec = json!({
        "podSelector": {"matchLabels": {ROLE: SERVER}},
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"namespaceSelector": {},
                               "podSelector": {"matchLabels": {"app": "web"}}}],
                     "ports": [{"port": 8080, "protocol": "TCP"}]}]
    });
    policy_object(PROBE_NS, ISOLATE, &spec)
}

/// Admits the probe clients into the servers on the probe port.
pub(super) fn allow_probes() -> Value {
    let spec = json!({
        "podSelector": {"matchLabels": {ROLE: SERVER}},
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"podSelector": {"matchLabels": {ROLE: CLIENT}}}],
                     "ports": [{"port": PROBE_PORT, "protocol": "TCP"}]}]
    });
    policy_object(PROBE_NS, ALLOW, &spec)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::net::Ipv4Addr;

    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use mycni_common::net::Cidr;

    use super::*;

    /// Whether `ip` is in the network `cidr` (a podCIDR: no host bits).
    fn in_cidr(ip: &str, cidr: &str) -> bool {
        match (ip.parse::<Ipv4Addr>(), Cidr::parse_network(cidr)) {
            (Ok(ip), Ok(net)) => net.contains(ip),
            _ => false,
        }
    }

    #[test]
    fn pods_decode_and_have_the_stated_shape() {
        for i in [0, 1, 99, 100, 9_999, 99_999] {
            let v = pod(i);
            let p: Pod = serde_json::from_value(v.clone()).expect("a Pod");
            let labels = p.metadata.labels.clone().unwrap_or_default();
            for l in ["app", "pod-template-hash", "tier", "version"] {
                assert!(labels.contains_key(l), "{i}: {l}");
            }
            let owners = p.metadata.owner_references.clone().unwrap_or_default();
            assert_eq!(owners.len(), 1);
            assert_eq!(owners[0].kind, "ReplicaSet");
            assert_eq!(owners[0].controller, Some(true));
            let spec = p.spec.clone().unwrap_or_default();
            let ports = spec.containers[0].ports.clone().unwrap_or_default();
            assert_eq!(ports[0].name.as_deref(), Some("http"));
            let status = p.status.clone().unwrap_or_default();
            let ip = status.pod_ip.unwrap_or_default();
            let node: usize = spec
                .node_name
                .unwrap_or_default()
                .trim_start_matches("fake-node-")
                .parse()
                .unwrap_or(usize::MAX);
            assert!(in_cidr(&ip, &fake_pod_cidr(node)), "{i}: {ip}");
            // The size a list carries per pod: a real Deployment pod's,
            // less its longer env and managedFields.
            let bytes = v.to_string().len();
            assert!((2_500..5_000).contains(&bytes), "{i}: {bytes} bytes");
        }
    }

    #[test]
    fn names_and_addresses_are_unique_and_stable_as_the_cluster_grows() {
        let n = 100_000;
        let names: BTreeSet<(String, String)> = (0..n)
            .map(|i| {
                let (ns, _, name) = pod_names(i);
                (ns, name)
            })
            .collect();
        assert_eq!(names.len(), n);
        let p = pod(12_345);
        let (ns, rs, name) = pod_names(12_345);
        assert_eq!(p["metadata"]["namespace"], ns.as_str());
        assert_eq!(p["metadata"]["name"], name.as_str());
        assert_eq!(p["metadata"]["ownerReferences"][0]["name"], rs.as_str());
        let ips: BTreeSet<String> = (0..n).map(pod_ip).collect();
        assert_eq!(ips.len(), n);
        assert_eq!(namespaces_for(10_000), 100);
        assert_eq!(namespaces_for(100_000), 1000);
        assert_eq!(pod_ip(0), "10.100.0.2");
        assert_eq!(pod_ip(99_999), "10.103.231.101");
        assert_eq!(fake_pod_cidr(999), "10.103.231.0/24");
    }

    #[test]
    fn policies_decode_live_in_loaded_namespaces_and_never_select_a_lab_pod() {
        let policies: Vec<Value> = (0..1000).map(policy).collect();
        let names: BTreeSet<&str> = policies
            .iter()
            .filter_map(|p| p["metadata"]["name"].as_str())
            .collect();
        assert_eq!(names.len(), 1000);
        assert_eq!(namespaces_for_policies(1000), 100);
        for p in policies.iter().chain([&isolate_servers(), &allow_probes()]) {
            let np: NetworkPolicy = serde_json::from_value(p.clone()).expect("a NetworkPolicy");
            let ns = np.metadata.namespace.unwrap_or_default();
            if ns != PROBE_NS {
                assert!(ns.as_str() < namespace_name(100).as_str(), "{ns}");
                assert!(!p["spec"]["podSelector"].to_string().contains(ROLE));
            }
        }
        let egress = policies
            .iter()
            .filter(|p| p["spec"]["egress"].is_array())
            .count();
        assert_eq!(egress, 200);
    }
}
