//! NetworkPolicy as the API server admits it: the v1 defaulting
//! (`SetDefaults_NetworkPolicy`, `SetDefaults_NetworkPolicyPort`) and
//! `ValidateNetworkPolicySpec` from pkg/apis/networking, with the real
//! field paths and messages, so the agent meets the objects a cluster
//! stores and a test can check each refusal by its cause.

use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::json;

use super::validation::{CIDR_MSG, Causes, label_selector, parse_cidr, strictly_contains};

const PROTOCOLS: [&str; 3] = ["TCP", "UDP", "SCTP"];
const POLICY_TYPES: [&str; 2] = ["Ingress", "Egress"];

/// The v1 defaults: `policyTypes` from the rules when empty, TCP for a port
/// without protocol, an empty pod selector when none. Peers and ports are
/// kept as given (no merging, no reordering), as the real server does.
pub(crate) fn default(np: &mut NetworkPolicy) {
    let spec = np.spec.get_or_insert_with(NetworkPolicySpec::default);
    if spec.pod_selector.is_none() {
        spec.pod_selector = Some(LabelSelector::default());
    }
    if spec.policy_types.as_ref().is_none_or(Vec::is_empty) {
        let mut types = vec!["Ingress".to_string()];
        if spec.egress.as_ref().is_some_and(|e| !e.is_empty()) {
            types.push("Egress".to_string());
        }
        spec.policy_types = Some(types);
    }
    let ingress_ports = spec.ingress.iter_mut().flatten().map(|r| &mut r.ports);
    let egress_ports = spec.egress.iter_mut().flatten().map(|r| &mut r.ports);
    for port in ingress_ports.chain(egress_ports).flatten().flatten() {
        if port.protocol.is_none() {
            port.protocol = Some("TCP".to_string());
        }
    }
}

/// `ValidatePortNum`'s message.
const PORT_RANGE_MSG: &str = "must be between 1 and 65535, inclusive";

/// `IsValidPortName`: an IANA service name.
fn port_name_errors(name: &str) -> Vec<&'static str> {
    let mut errs = Vec::new();
    if name.is_empty() || name.len() > 15 {
        errs.push("must be no more than 15 characters");
    }
    if !name
        .bytes()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
    {
        errs.push("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)");
    }
    if name.contains("--") {
        errs.push("must not contain consecutive hyphens");
    }
    if !name.bytes().any(|c| c.is_ascii_lowercase()) {
        errs.push("must contain at least one letter (a-z)");
    }
    if name.starts_with('-') || name.ends_with('-') {
        errs.push("must not begin or end with a hyphen");
    }
    errs
}

fn port(causes: &mut Causes, path: &str, p: &NetworkPolicyPort) {
    if let Some(proto) = &p.protocol
        && !PROTOCOLS.contains(&proto.as_str())
    {
        causes.not_supported(&format!("{path}.protocol"), &json!(proto), &PROTOCOLS);
    }
    let end_path = format!("{path}.endPort");
    match &p.port {
        Some(IntOrString::Int(n)) => {
            if !(1..=65535).contains(n) {
                causes.invalid(&format!("{path}.port"), &json!(n), PORT_RANGE_MSG);
            }
            if let Some(end) = p.end_port {
                if end < *n {
                    causes.invalid(
                        &end_path,
                        &json!(n),
                        "must be greater than or equal to `port`",
                    );
                }
                if !(1..=65535).contains(&end) {
                    causes.invalid(&end_path, &json!(end), PORT_RANGE_MSG);
                }
            }
        }
        Some(IntOrString::String(name)) => {
            if let Some(end) = p.end_port {
                causes.invalid(
                    &end_path,
                    &json!(end),
                    "may not be specified when `port` is non-numeric",
                );
            }
            for msg in port_name_errors(name) {
                causes.invalid(&format!("{path}.port"), &json!(name), msg);
            }
        }
        None => {
            if let Some(end) = p.end_port {
                causes.invalid(
                    &end_path,
                    &json!(end),
                    "may not be specified when `port` is not specified",
                );
            }
        }
    }
}

fn ip_block(causes: &mut Causes, path: &str, b: &IPBlock) {
    let cidr_path = format!("{path}.cidr");
    if b.cidr.is_empty() {
        causes.required(&cidr_path, "");
        return;
    }
    let Some(cidr) = parse_cidr(&b.cidr) else {
        causes.invalid(&cidr_path, &json!(b.cidr), CIDR_MSG);
        return;
    };
    for (i, e) in b.except.iter().flatten().enumerate() {
        let except_path = format!("{path}.except[{i}]");
        match parse_cidr(e) {
            None => causes.invalid(&except_path, &json!(e), CIDR_MSG),
            Some(except) if !strictly_contains(cidr, except) => {
                causes.invalid(&except_path, &json!(e), "must be a strict subset of `cidr`")
            }
            Some(_) => {}
        }
    }
}

fn peer(causes: &mut Causes, path: &str, p: &NetworkPolicyPeer) {
    let mut n = 0;
    if let Some(s) = &p.pod_selector {
        n += 1;
        label_selector(causes, &format!("{path}.podSelector"), s);
    }
    if let Some(s) = &p.namespace_selector {
        n += 1;
        label_selector(causes, &format!("{path}.namespaceSelector"), s);
    }
    if let Some(b) = &p.ip_block {
        n += 1;
        ip_block(causes, &format!("{path}.ipBlock"), b);
    }
    if n == 0 {
        causes.required(path, "must specify a peer");
    } else if n > 1 && p.ip_block.is_some() {
        causes.forbidden(path, "may not specify both ipBlock and another peer");
    }
}

/// `ValidateNetworkPolicySpec`, on a defaulted policy.
pub(crate) fn validate(causes: &mut Causes, np: &NetworkPolicy) {
    let Some(spec) = &np.spec else {
        return;
    };
    if let Some(s) = &spec.pod_selector {
        label_selector(causes, "spec.podSelector", s);
    }
    for (i, rule) in spec.ingress.iter().flatten().enumerate() {
        for (j, p) in rule.ports.iter().flatten().enumerate() {
            port(causes, &format!("spec.ingress[{i}].ports[{j}]"), p);
        }
        for (j, p) in rule.from.iter().flatten().enumerate() {
            peer(causes, &format!("spec.ingress[{i}].from[{j}]"), p);
        }
    }
    for (i, rule) in spec.egress.iter().flatten().enumerate() {
        for (j, p) in rule.ports.iter().flatten().enumerate() {
            port(causes, &format!("spec.egress[{i}].ports[{j}]"), p);
        }
        for (j, p) in rule.to.iter().flatten().enumerate() {
            peer(causes, &format!("spec.egress[{i}].to[{j}]"), p);
        }
    }
    let types = spec.policy_types.as_deref().unwrap_or_default();
    if types.len() > POLICY_TYPES.len() {
        causes.invalid(
            "spec.policyTypes",
            &json!(types),
            "may not specify more than two policyTypes",
        );
        return;
    }
    for (i, t) in types.iter().enumerate() {
        if !POLICY_TYPES.contains(&t.as_str()) {
            causes.not_supported(&format!("spec.policyTypes[{i}]"), &json!(t), &POLICY_TYPES);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_names() {
        assert!(port_name_errors("serve-80-tcp").is_empty());
        assert!(!port_name_errors("80").is_empty());
        assert!(!port_name_errors("a--b").is_empty());
        assert!(!port_name_errors("this-name-is-too-long").is_empty());
    }
}
