//! A deliberately naive second evaluator, written straight from the API
//! reference against the raw JSON of the objects: no model, no converter,
//! no shared helper with the module under test. The property test holds
//! the real evaluator and the compiled form to its answers.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde_json::Value;

pub(crate) type RawLabels = BTreeMap<String, String>;

#[derive(Debug, Clone)]
pub(crate) struct RawPod {
    pub ns: String,
    pub name: String,
    pub labels: RawLabels,
    pub ips: Vec<IpAddr>,
    /// (name, protocol as the API spells it, number)
    pub ports: Vec<(String, String, u16)>,
    pub host_network: bool,
    pub node: String,
}

#[derive(Debug, Clone)]
pub struct World {
    pub namespaces: BTreeMap<String, RawLabels>,
    pub pods: Vec<RawPod>,
    /// (namespace, spec as JSON)
    pub policies: Vec<(String, Value)>,
}

/// An end of a connection: a pod index, or a bare address.
#[derive(Debug, Clone, Copy)]
pub(crate) struct End {
    pub pod: Option<usize>,
    pub ip: IpAddr,
}

fn list<'a>(v: &'a Value, field: &str) -> Vec<&'a Value> {
    v.get(field)
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

fn selector_matches(sel: &Value, labels: &RawLabels) -> bool {
    let labels_ok = sel
        .get("matchLabels")
        .and_then(Value::as_object)
        .is_none_or(|m| {
            m.iter()
                .all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str())
        });
    let exprs_ok = list(sel, "matchExpressions").iter().all(|e| {
        let key = e["key"].as_str().unwrap_or_default();
        let values: Vec<&str> = list(e, "values")
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        let have = labels.get(key).map(String::as_str);
        match e["operator"].as_str() {
            Some("In") => have.is_some_and(|h| values.contains(&h)),
            Some("NotIn") => !have.is_some_and(|h| values.contains(&h)),
            Some("Exists") => have.is_some(),
            Some("DoesNotExist") => have.is_none(),
            _ => false,
        }
    });
    labels_ok && exprs_ok
}

fn bits(ip: IpAddr) -> (bool, u128) {
    match ip {
        IpAddr::V4(a) => (false, u128::from(u32::from(a)) << 96),
        IpAddr::V6(a) => (true, u128::from(a)),
    }
}

/// Its own prefix match, on purpose: the oracle shares no code with what
/// it checks (the workspace's one CIDR parser is `mycni_common::net`'s).
fn in_cidr(text: &str, ip: IpAddr) -> bool {
    let Some((addr, len)) = text.split_once('/') else {
        return false;
    };
    let (Ok(net), Ok(len)) = (addr.parse::<IpAddr>(), len.parse::<u32>()) else {
        return false;
    };
    // v4 addresses sit in the top 32 bits, so the prefix counts from the top
    // for both families.
    let ((v6a, a), (v6b, b)) = (bits(net), bits(ip));
    let mask = if len == 0 {
        0
    } else {
        u128::MAX << (128 - len)
    };
    v6a == v6b && (a & mask) == (b & mask)
}

impl World {
    fn ns_labels(&self, ns: &str) -> RawLabels {
        self.namespaces.get(ns).cloned().unwrap_or_else(|| {
            RawLabels::from([("kubernetes.io/metadata.name".to_string(), ns.to_string())])
        })
    }

    fn pod_net(&self, end: End) -> Option<&RawPod> {
        end.pod.map(|i| &self.pods[i]).filter(|p| !p.host_network)
    }

    fn types(spec: &Value) -> Vec<String> {
        let given: Vec<String> = list(spec, "policyTypes")
            .iter()
            .filter_map(|v| v.as_str().map(String::from))
            .collect();
        if !given.is_empty() {
            return given;
        }
        let mut t = vec!["Ingress".to_string()];
        if !list(spec, "egress").is_empty() {
            t.push("Egress".to_string());
        }
        t
    }

    fn peer_matches(&self, policy_ns: &str, peer: &Value, remote: End) -> bool {
        if let Some(block) = peer.get("ipBlock") {
            let cidr = block["cidr"].as_str().unwrap_or_default();
            let excepted = list(block, "except")
                .iter()
                .any(|e| in_cidr(e.as_str().unwrap_or_default(), remote.ip));
            return in_cidr(cidr, remote.ip) && !excepted;
        }
        let Some(pod) = self.pod_net(remote) else {
            return false;
        };
        let ns_ok = match peer.get("namespaceSelector") {
            Some(sel) => selector_matches(sel, &self.ns_labels(&pod.ns)),
            None => pod.ns == policy_ns,
        };
        let pod_ok = peer
            .get("podSelector")
            .is_none_or(|sel| selector_matches(sel, &pod.labels));
        ns_ok && pod_ok
    }

    fn port_matches(&self, rule: &Value, dst: End, proto: &str, port: u16) -> bool {
        let ports = list(rule, "ports");
        ports.is_empty()
            || ports.iter().any(|p| {
                let p_proto = p.get("protocol").and_then(Value::as_str).unwrap_or("TCP");
                if p_proto != proto {
                    return false;
                }
                match p.get("port") {
                    None => true,
                    Some(Value::String(name)) => self.pod_net(dst).is_some_and(|d| {
                        d.ports
                            .iter()
                            .any(|(n, pr, num)| n == name && pr == proto && *num == port)
                    }),
                    Some(v) => {
                        let start = v.as_u64().unwrap_or(0);
                        let end = p.get("endPort").and_then(Value::as_u64).unwrap_or(start);
                        (start..=end).contains(&u64::from(port))
                    }
                }
            })
    }

    /// Does `local` (a pod) let the connection to `(dst, proto, port)`
    /// through in `dir`?
    fn side_allows(
        &self,
        dir: &str,
        local: End,
        remote: End,
        (dst, proto, port): (End, &str, u16),
    ) -> bool {
        let Some(pod) = self.pod_net(local) else {
            return true;
        };
        let remote_is_own_node = match remote.pod.map(|i| &self.pods[i]) {
            Some(r) => r.host_network && r.node == pod.node,
            None => false,
        };
        if remote_is_own_node {
            return true;
        }
        let (rules_field, peers_field) = if dir == "Ingress" {
            ("ingress", "from")
        } else {
            ("egress", "to")
        };
        let mut isolated = false;
        for (ns, spec) in &self.policies {
            let selects = *ns == pod.ns
                && spec
                    .get("podSelector")
                    .is_none_or(|s| selector_matches(s, &pod.labels));
            if !selects || !World::types(spec).iter().any(|t| t == dir) {
                continue;
            }
            isolated = true;
            for rule in list(spec, rules_field) {
                let peers = list(rule, peers_field);
                let peer_ok =
                    peers.is_empty() || peers.iter().any(|p| self.peer_matches(ns, p, remote));
                if peer_ok && self.port_matches(rule, dst, proto, port) {
                    return true;
                }
            }
        }
        !isolated
    }

    pub fn allowed(&self, src: End, dst: End, proto: &str, port: u16) -> bool {
        if src.pod.is_some() && src.pod == dst.pod {
            return true;
        }
        self.side_allows("Egress", src, dst, (dst, proto, port))
            && self.side_allows("Ingress", dst, src, (dst, proto, port))
    }
}
