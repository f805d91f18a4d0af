//! What the policy bench puts in the cluster: the states it measures and,
//! for each, the NetworkPolicy objects in force. Pure, so the shapes the
//! report states are the ones its tests check.
//!
//! Every state with policies selects both bench pods and allows the pair:
//! a policy that selects nothing would leave the pods unisolated, and the
//! bench would measure the kernel's three set lookups for an unisolated pod
//! instead of a verdict.

use std::net::Ipv4Addr;

use serde_json::{Value, json};

use crate::labbench::{IPERF_PORT, SOCKPERF_PORT, thousands};
use crate::netpol::policy_object;

/// The Kubernetes namespace of the bench's pods and policies.
pub(super) const NAMESPACE: &str = "bench";
/// The label that tells the two bench pods apart.
pub(super) const ROLE: &str = "role";
pub(super) const CLIENT: &str = "client";
pub(super) const SERVER: &str = "server";

/// The pods' echo server, which the connect loop talks to.
pub(super) const ECHO_PORT: u16 = crate::ECHO_PORT;
/// The ports the measures use, which `allow-pair` opens: sockperf, iperf3
/// (its control connection and TCP data on TCP, its datagrams on UDP), and
/// the echo server.
const ALLOWED: [(u16, &str); 4] = [
    (SOCKPERF_PORT, "TCP"),
    (IPERF_PORT, "TCP"),
    (IPERF_PORT, "UDP"),
    (ECHO_PORT, "TCP"),
];
/// A port the server serves and no policy opens: reaching it would mean
/// the policies are not in force.
pub(super) const DENIED_PORT: u16 = 80;

/// What the cluster holds while a column is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum State {
    /// No policy and the agents' `--network-policy=false`: no
    /// `inet mycni_policy` table, the fast path's epoch 0 (no stamp
    /// check). The reference every ratio divides by.
    Off,
    /// Enforcement on, no policy: the table with every pod unisolated, and
    /// the fast path checking each flow's stamp.
    Open,
    /// `allow-pair` alone.
    Pair,
    /// `allow-pair` and 9 decoys.
    Ten,
    /// `allow-pair` and `policies - 1` decoys.
    Many,
    /// `allow-pair` and one policy whose ingress lists `prefixes` ipBlocks,
    /// one of them the client node's podCIDR.
    IpBlock,
}

impl State {
    /// The measuring order of an even run; odd runs go the other way.
    pub(super) const ALL: [State; 6] = [
        State::Off,
        State::Open,
        State::Pair,
        State::Ten,
        State::Many,
        State::IpBlock,
    ];

    /// Whether the established-flow measures (latency, stream, UDP) run in
    /// this state; the connect loop runs in every one. Ten and the ipBlock
    /// are about a connection's first packet (issue 26), and skipping
    /// their established measures keeps a run near 3 minutes.
    pub(super) fn established(self) -> bool {
        matches!(self, State::Off | State::Open | State::Pair | State::Many)
    }

    /// Whether the agents enforce NetworkPolicy (`--network-policy`).
    pub(super) fn enforcing(self) -> bool {
        self != State::Off
    }

    pub(super) fn label(self, s: &Shape) -> String {
        match self {
            State::Off => "no policy (enforcement off)".into(),
            State::Open => "enforcement on, 0 policies".into(),
            State::Pair => "1 policy".into(),
            State::Ten => "10 policies".into(),
            State::Many => format!("{} policies", thousands(s.policies)),
            State::IpBlock => format!("{}-prefix ipBlock", thousands(s.prefixes)),
        }
    }

    /// The policies in force, by name, with their objects.
    pub(super) fn policies(self, s: &Shape) -> Vec<(String, Value)> {
        let decoys = |n: usize| (1..n).map(|i| (decoy_name(i), decoy(i)));
        let mut out = match self {
            State::Off | State::Open => return vec![],
            State::Pair => vec![],
            State::Ten => decoys(10).collect(),
            State::Many => decoys(s.policies).collect(),
            State::IpBlock => vec![(IP_BLOCK.to_string(), ip_block(s))],
        };
        out.insert(0, (ALLOW_PAIR.to_string(), allow_pair()));
        out
    }
}

/// The sizes the bench uses (`--policies`, `--prefixes`) and the client
/// node's podCIDR, which the ipBlock policy allows.
#[derive(Debug, Clone)]
pub(super) struct Shape {
    pub(super) policies: usize,
    pub(super) prefixes: usize,
    pub(super) client_cidr: String,
}

/// The most decoy prefixes [`ip_block`] can draw: every other address of
/// 100.64.0.0/10.
pub(super) const MAX_PREFIXES: usize = 1 << 21;

const ALLOW_PAIR: &str = "allow-pair";
const IP_BLOCK: &str = "ip-block";

fn decoy_name(i: usize) -> String {
    format!("decoy-{i:05}")
}

fn ports(list: &[(u16, &str)]) -> Value {
    list.iter()
        .map(|(p, proto)| json!({"port": p, "protocol": proto}))
        .collect()
}

fn role(r: &str) -> Value {
    json!({"matchLabels": {ROLE: r}})
}

/// Selects both bench pods, isolates them both ways, and allows client ->
/// server on the measures' ports (and so their replies) and nothing else.
pub(super) fn allow_pair() -> Value {
    let spec = json!({
        "podSelector": {"matchExpressions": [
            {"key": ROLE, "operator": "In", "values": [CLIENT, SERVER]}]},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [{"from": [{"podSelector": role(CLIENT)}], "ports": ports(&ALLOWED)}],
        "egress": [{"to": [{"podSelector": role(SERVER)}], "ports": ports(&ALLOWED)}],
    });
    policy_object(NAMESPACE, ALLOW_PAIR, &spec)
}

/// Decoy `i` (1-based). One in eight selects the server and allows one
/// more /32 on one more port into it; one in eight selects the client and
/// allows it one more /32 and port out: both grow the bench pods' own allow
/// sets without matching the pair. The other six in eight select a label no
/// pod carries (`app: decoy-<i>`), as most of a real cluster's policies
/// select other pods.
pub(super) fn decoy(i: usize) -> Value {
    // Distinct per decoy for i < 65,536.
    let host = |net: u8| format!("172.{net}.{}.{}/32", (i >> 8) & 0xff, i & 0xff);
    let port = 20_000 + (i % 40_000) as u16;
    let spec = match i % 8 {
        0 => json!({
            "podSelector": role(SERVER),
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"ipBlock": {"cidr": host(16)}}],
                         "ports": ports(&[(port, "TCP")])}],
        }),
        4 => json!({
            "podSelector": role(CLIENT),
            "policyTypes": ["Egress"],
            "egress": [{"to": [{"ipBlock": {"cidr": host(17)}}],
                        "ports": ports(&[(port, "TCP")])}],
        }),
        _ => json!({
            "podSelector": {"matchLabels": {"app": format!("decoy-{i}")}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": format!("t{i}")}}}],
                         "ports": ports(&[(port, "TCP")])}],
        }),
    };
    policy_object(NAMESPACE, &decoy_name(i), &spec)
}

/// The `k`-th decoy prefix of [`ip_block`]: every other address of
/// 100.64.0.0/10, so no two are adjacent and none can be merged into a
/// wider range on the way to the kernel's set.
pub(super) fn decoy_prefix(k: usize) -> String {
    let base = u32::from(Ipv4Addr::new(100, 64, 0, 0));
    let k = (k % MAX_PREFIXES) as u32;
    format!("{}/32", Ipv4Addr::from(base + 2 * k))
}

/// Selects the server; its ingress lists `s.prefixes` ipBlock peers on the
/// echo port: the client node's podCIDR (which allows the pair) after
/// `prefixes - 1` decoy /32s.
pub(super) fn ip_block(s: &Shape) -> Value {
    let mut from: Vec<Value> = (0..s.prefixes.saturating_sub(1))
        .map(|k| json!({"ipBlock": {"cidr": decoy_prefix(k)}}))
        .collect();
    from.push(json!({"ipBlock": {"cidr": s.client_cidr}}));
    let spec = json!({
        "podSelector": role(SERVER),
        "policyTypes": ["Ingress"],
        "ingress": [{"from": from, "ports": ports(&[(ECHO_PORT, "TCP")])}],
    });
    policy_object(NAMESPACE, IP_BLOCK, &spec)
}

/// What changes the cluster from the policies `have` (by name) to `want`:
/// the names to delete, then the objects to create.
pub(super) fn diff<'a>(
    have: &[String],
    want: &'a [(String, Value)],
) -> (Vec<String>, Vec<&'a (String, Value)>) {
    let delete = have
        .iter()
        .filter(|h| !want.iter().any(|(n, _)| n == *h))
        .cloned()
        .collect();
    let create = want.iter().filter(|(n, _)| !have.contains(n)).collect();
    (delete, create)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn shape() -> Shape {
        Shape {
            policies: 1000,
            prefixes: 10_000,
            client_cidr: "10.244.1.0/24".into(),
        }
    }

    fn selects(policy: &Value, labels: &[(&str, &str)]) -> bool {
        let sel = &policy["spec"]["podSelector"];
        let has = |k: &str, v: &str| labels.iter().any(|(a, b)| *a == k && *b == v);
        let by_label = sel["matchLabels"]
            .as_object()
            .is_none_or(|m| m.iter().all(|(k, v)| has(k, v.as_str().unwrap_or(""))));
        let by_expr = sel["matchExpressions"]
            .as_array()
            .into_iter()
            .flatten()
            .all(|e| {
                let key = e["key"].as_str().unwrap_or("");
                e["values"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|v| has(key, v.as_str().unwrap_or("")))
            });
        by_label && by_expr
    }

    #[test]
    fn every_state_with_policies_selects_both_pods_and_allows_the_pair() {
        let s = shape();
        for st in State::ALL {
            let ps = st.policies(&s);
            let client = ps.iter().any(|(_, p)| selects(p, &[(ROLE, CLIENT)]));
            let server = ps.iter().any(|(_, p)| selects(p, &[(ROLE, SERVER)]));
            let enforced = !matches!(st, State::Off | State::Open);
            assert_eq!(client, enforced, "{st:?} selects the client");
            assert_eq!(server, enforced, "{st:?} selects the server");
            if enforced {
                assert_eq!(ps[0].0, ALLOW_PAIR);
            }
        }
        let pair = allow_pair();
        assert_eq!(pair["metadata"]["namespace"], NAMESPACE);
        assert_eq!(pair["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
        let allowed = &pair["spec"]["ingress"][0]["ports"];
        for (p, proto) in ALLOWED {
            assert!(
                allowed
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|x| x["port"] == p && x["protocol"] == proto)
            );
        }
        assert!(
            !allowed
                .as_array()
                .into_iter()
                .flatten()
                .any(|x| x["port"] == DENIED_PORT)
        );
    }

    #[test]
    fn counts_and_names() {
        let s = shape();
        assert_eq!(State::Pair.policies(&s).len(), 1);
        assert_eq!(State::Ten.policies(&s).len(), 10);
        let many = State::Many.policies(&s);
        assert_eq!(many.len(), 1000);
        let names: BTreeSet<&str> = many.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names.len(), 1000, "names are unique");
        assert_eq!(State::IpBlock.policies(&s).len(), 2);
        assert_eq!(State::Many.label(&s), "1,000 policies");
        assert_eq!(State::IpBlock.label(&s), "10,000-prefix ipBlock");
        assert_eq!(thousands(7), "7");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert!(State::Off.established() && !State::Ten.established());
        assert!(!State::Off.enforcing() && State::Open.enforcing());
    }

    #[test]
    fn most_decoys_select_other_labels_and_the_rest_grow_the_pairs_sets() {
        let s = shape();
        let many = State::Many.policies(&s);
        let decoys = &many[1..];
        let bench = decoys
            .iter()
            .filter(|(_, p)| selects(p, &[(ROLE, CLIENT)]) || selects(p, &[(ROLE, SERVER)]))
            .count();
        let quarter = (1..1000).filter(|i| i % 4 == 0).count();
        assert_eq!(bench, quarter, "one in four decoys selects a bench pod");
        // A decoy that selects a bench pod never allows the pair: it names
        // an address outside the cluster.
        for (_, p) in decoys {
            assert!(!p.to_string().contains("10.244."), "{p}");
        }
        let cidrs: BTreeSet<String> = decoys
            .iter()
            .filter_map(|(_, p)| {
                let r = p["spec"]["ingress"][0]["from"][0]["ipBlock"]["cidr"].as_str();
                let e = p["spec"]["egress"][0]["to"][0]["ipBlock"]["cidr"].as_str();
                r.or(e).map(str::to_string)
            })
            .collect();
        assert_eq!(cidrs.len(), quarter, "each one a distinct /32");
    }

    #[test]
    fn the_ip_block_has_its_prefixes_none_adjacent_and_the_pair_last() {
        let s = shape();
        let p = ip_block(&s);
        let from = p["spec"]["ingress"][0]["from"].as_array().cloned();
        let from = from.unwrap_or_default();
        assert_eq!(from.len(), 10_000);
        assert_eq!(from[9_999]["ipBlock"]["cidr"], "10.244.1.0/24");
        let addrs: BTreeSet<u32> = from[..9_999]
            .iter()
            .filter_map(|f| {
                f["ipBlock"]["cidr"]
                    .as_str()?
                    .strip_suffix("/32")?
                    .parse()
                    .ok()
            })
            .map(|a: Ipv4Addr| u32::from(a))
            .collect();
        assert_eq!(addrs.len(), 9_999);
        assert!(
            addrs
                .iter()
                .zip(addrs.iter().skip(1))
                .all(|(a, b)| b - a >= 2)
        );
        assert_eq!(decoy_prefix(0), "100.64.0.0/32");
        assert_eq!(decoy_prefix(1), "100.64.0.2/32");
        // The last one stays inside 100.64.0.0/10.
        assert_eq!(decoy_prefix(MAX_PREFIXES - 1), "100.127.255.254/32");
    }

    #[test]
    fn diff_deletes_what_goes_and_creates_what_comes() {
        let s = shape();
        let ten = State::Ten.policies(&s);
        let have: Vec<String> = ten.iter().map(|(n, _)| n.clone()).collect();
        let ip = State::IpBlock.policies(&s);
        let (delete, create) = diff(&have, &ip);
        assert_eq!(delete.len(), 9);
        assert!(!delete.contains(&ALLOW_PAIR.to_string()));
        assert_eq!(create.len(), 1);
        assert_eq!(create[0].0, IP_BLOCK);
        let (delete, create) = diff(&have, &[]);
        assert_eq!((delete.len(), create.len()), (10, 0));
    }
}
