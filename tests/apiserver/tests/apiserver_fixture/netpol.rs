//! NetworkPolicy admission: the API server's defaulting and each of its
//! validation errors, on create and on update, with the real field paths.

use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicySpec};
use kube::api::{Api, PostParams};
use mycni_apiserver::network_policy;
use serde_json::{Value, json};

use crate::{raw_json, start};

const POLICIES: &str = "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies";

fn body(name: &str, spec: Value) -> String {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"name": name}, "spec": spec})
    .to_string()
}

#[test]
fn defaulting_as_the_api_server() {
    let server = start();
    let post = |name: &str, spec: Value| {
        let (code, v) = raw_json(
            server.addr(),
            "POST",
            POLICIES,
            Some("application/json"),
            &body(name, spec),
        );
        assert_eq!(code, 201, "{v}");
        v["spec"].clone()
    };
    // Egress rules make it an egress policy too; ports get TCP; peers and
    // ports stay as given, in order, duplicates included.
    let spec = post(
        "both",
        json!({
            "podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{
                "from": [{"podSelector": {}}, {"namespaceSelector": {}}, {"podSelector": {}}],
                "ports": [{"port": 80}, {"port": "serve-81-udp", "protocol": "UDP"},
                          {"port": 81, "endPort": 90}, {"port": 80}]
            }],
            "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}]}]
        }),
    );
    assert_eq!(spec["policyTypes"], json!(["Ingress", "Egress"]));
    assert_eq!(
        spec["ingress"][0]["ports"],
        json!([{"port": 80, "protocol": "TCP"}, {"port": "serve-81-udp", "protocol": "UDP"},
               {"port": 81, "endPort": 90, "protocol": "TCP"}, {"port": 80, "protocol": "TCP"}])
    );
    assert_eq!(
        spec["ingress"][0]["from"],
        json!([{"podSelector": {}}, {"namespaceSelector": {}}, {"podSelector": {}}])
    );
    // No egress rules (or an empty list): ingress only; no pod selector:
    // the empty one (every pod of the namespace).
    assert_eq!(
        post("in", json!({"egress": []})),
        json!({"podSelector": {}, "policyTypes": ["Ingress"], "egress": []})
    );
    // Given policyTypes are kept, even without rules.
    assert_eq!(
        post("out", json!({"podSelector": {}, "policyTypes": ["Egress"]}))["policyTypes"],
        json!(["Egress"])
    );
    // The fixture's own API defaults too.
    let np = server
        .create_network_policy(network_policy(
            "default",
            "lib",
            NetworkPolicySpec::default(),
        ))
        .expect("create");
    let spec = np.spec.expect("spec");
    assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]));
    assert!(spec.pod_selector.is_some());
}

/// Each case: a spec with one mistake, the field and reason the real
/// server names.
fn invalid_cases() -> Vec<(Value, &'static str, &'static str)> {
    let ingress_ports = |ports: Value| json!({"podSelector": {}, "ingress": [{"ports": ports}]});
    let ingress_from = |from: Value| json!({"podSelector": {}, "ingress": [{"from": from}]});
    let pod_selector = |sel: Value| json!({"podSelector": sel});
    vec![
        (
            ingress_ports(json!([{"endPort": 90}])),
            "spec.ingress[0].ports[0].endPort",
            "FieldValueInvalid",
        ),
        (
            ingress_ports(json!([{"port": "http", "endPort": 90}])),
            "spec.ingress[0].ports[0].endPort",
            "FieldValueInvalid",
        ),
        (
            ingress_ports(json!([{"port": 90, "endPort": 80}])),
            "spec.ingress[0].ports[0].endPort",
            "FieldValueInvalid",
        ),
        (
            ingress_ports(json!([{"port": 80, "endPort": 70000}])),
            "spec.ingress[0].ports[0].endPort",
            "FieldValueInvalid",
        ),
        (
            ingress_ports(json!([{"port": 0}])),
            "spec.ingress[0].ports[0].port",
            "FieldValueInvalid",
        ),
        (
            ingress_ports(json!([{"port": "no--dashes"}])),
            "spec.ingress[0].ports[0].port",
            "FieldValueInvalid",
        ),
        (
            ingress_ports(json!([{"port": 53, "protocol": "ICMP"}])),
            "spec.ingress[0].ports[0].protocol",
            "FieldValueNotSupported",
        ),
        (
            ingress_from(json!([{"ipBlock": {"cidr": "10.0.0.0/33"}}])),
            "spec.ingress[0].from[0].ipBlock.cidr",
            "FieldValueInvalid",
        ),
        (
            ingress_from(json!([{"ipBlock": {"cidr": ""}}])),
            "spec.ingress[0].from[0].ipBlock.cidr",
            "FieldValueRequired",
        ),
        (
            ingress_from(json!([{"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.1.0.0/24"]}}])),
            "spec.ingress[0].from[0].ipBlock.except[0]",
            "FieldValueInvalid",
        ),
        (
            ingress_from(json!([{"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.0.0/16"]}}])),
            "spec.ingress[0].from[0].ipBlock.except[0]",
            "FieldValueInvalid",
        ),
        (
            ingress_from(json!([{"ipBlock": {"cidr": "10.0.0.0/16", "except": ["fd00::/64"]}}])),
            "spec.ingress[0].from[0].ipBlock.except[0]",
            "FieldValueInvalid",
        ),
        (
            ingress_from(json!([{"ipBlock": {"cidr": "10.0.0.0/16"}, "podSelector": {}}])),
            "spec.ingress[0].from[0]",
            "FieldValueForbidden",
        ),
        (
            ingress_from(json!([{}])),
            "spec.ingress[0].from[0]",
            "FieldValueRequired",
        ),
        (
            json!({"podSelector": {}, "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.1"}}]}]}),
            "spec.egress[0].to[0].ipBlock.cidr",
            "FieldValueInvalid",
        ),
        (
            json!({"podSelector": {}, "egress": [{"ports": [{"endPort": 5}]}]}),
            "spec.egress[0].ports[0].endPort",
            "FieldValueInvalid",
        ),
        (
            json!({"podSelector": {}, "policyTypes": ["Ingress", "Sideways"]}),
            "spec.policyTypes[1]",
            "FieldValueNotSupported",
        ),
        (
            json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress", "Ingress"]}),
            "spec.policyTypes",
            "FieldValueInvalid",
        ),
        (
            pod_selector(
                json!({"matchExpressions": [{"key": "a", "operator": "Equals", "values": ["b"]}]}),
            ),
            "spec.podSelector.matchExpressions[0].operator",
            "FieldValueInvalid",
        ),
        (
            pod_selector(json!({"matchExpressions": [{"key": "a", "operator": "In"}]})),
            "spec.podSelector.matchExpressions[0].values",
            "FieldValueRequired",
        ),
        (
            pod_selector(
                json!({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["b"]}]}),
            ),
            "spec.podSelector.matchExpressions[0].values",
            "FieldValueForbidden",
        ),
        (
            pod_selector(
                json!({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["not ok"]}]}),
            ),
            "spec.podSelector.matchExpressions[0].values[0]",
            "FieldValueInvalid",
        ),
        (
            pod_selector(json!({"matchLabels": {"a": "not ok!"}})),
            "spec.podSelector.matchLabels",
            "FieldValueInvalid",
        ),
        (
            ingress_from(
                json!([{"namespaceSelector": {"matchExpressions": [{"key": "-bad", "operator": "Exists"}]}}]),
            ),
            "spec.ingress[0].from[0].namespaceSelector.matchExpressions[0].key",
            "FieldValueInvalid",
        ),
        (
            ingress_ports(json!([{"port": 80, "endPort": 80}, {"port": 70000}])),
            "spec.ingress[0].ports[1].port",
            "FieldValueInvalid",
        ),
    ]
}

#[test]
fn each_validation_error_on_create_and_update() {
    let server = start();
    let addr = server.addr();
    let (code, _) = raw_json(
        addr,
        "POST",
        POLICIES,
        Some("application/json"),
        &body("ok", json!({})),
    );
    assert_eq!(code, 201);
    for (spec, field, reason) in invalid_cases() {
        let (code, v) = raw_json(
            addr,
            "POST",
            POLICIES,
            Some("application/json"),
            &body("bad", spec.clone()),
        );
        assert_eq!(
            (code, v["reason"].as_str()),
            (422, Some("Invalid")),
            "create {spec}: {v}"
        );
        assert_eq!(
            v["details"]["causes"],
            json!([{"field": field, "reason": reason, "message": v["details"]["causes"][0]["message"]}]),
            "create {spec}: {v}"
        );
        assert_eq!(v["details"]["group"], json!("networking.k8s.io"));
        assert_eq!(v["details"]["kind"], json!("NetworkPolicy"));
        // The same on update, and the stored object stays as it was.
        let (code, v) = raw_json(
            addr,
            "PUT",
            &format!("{POLICIES}/ok"),
            Some("application/json"),
            &body("ok", spec.clone()),
        );
        assert_eq!(code, 422, "update {spec}: {v}");
        assert_eq!(
            v["details"]["causes"][0]["field"],
            json!(field),
            "update {spec}: {v}"
        );
    }
    let (code, v) = raw_json(addr, "GET", POLICIES, None, "");
    assert_eq!(code, 200);
    assert_eq!(
        v["items"].as_array().map(Vec::len),
        Some(1),
        "nothing invalid stored: {v}"
    );
    // The message as kubectl prints it.
    let (_, v) = raw_json(
        addr,
        "POST",
        POLICIES,
        Some("application/json"),
        &body(
            "bad",
            json!({"ingress": [{"ports": [{"port": 90, "endPort": 80}]}]}),
        ),
    );
    assert_eq!(
        v["message"],
        json!(
            "NetworkPolicy.networking.k8s.io \"bad\" is invalid: spec.ingress[0].ports[0].endPort: Invalid value: 90: must be greater than or equal to `port`"
        )
    );
    // The fixture's own API refuses too.
    let err = server
        .update_network_policy("default", "ok", |np| {
            np.spec.get_or_insert_default().policy_types = Some(vec!["Both".into()]);
        })
        .expect_err("invalid update");
    assert!(err.to_string().contains("spec.policyTypes[0]"), "{err}");
}

#[tokio::test]
async fn kube_rs_sees_the_defaulted_policy() {
    let server = start();
    let api: Api<NetworkPolicy> = Api::namespaced(server.kube_client().expect("client"), "default");
    let created = api
        .create(
            &PostParams::default(),
            &network_policy(
                "default",
                "p",
                NetworkPolicySpec {
                    egress: Some(vec![Default::default()]),
                    ..NetworkPolicySpec::default()
                },
            ),
        )
        .await
        .expect("create");
    let spec = created.spec.expect("spec");
    assert_eq!(
        spec.policy_types,
        Some(vec!["Ingress".into(), "Egress".into()])
    );
}
