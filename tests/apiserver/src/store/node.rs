//! The Node rules: the v1 conversion that keeps `spec.podCIDR` and
//! `spec.podCIDRs[0]` in step, and the validation that refuses a bad CIDR
//! or a podCIDR change (what makes an IPAM bug visible in tests).

use k8s_openapi::api::core::v1::Node;
use serde_json::json;

use super::validation::{Causes, parse_cidr};

/// The v1 conversion rule: `podCIDR` wins over a `podCIDRs` that
/// disagrees, and fills `podCIDR` from `podCIDRs` when it is empty.
pub(crate) fn convert(node: &mut Node) {
    let Some(spec) = &mut node.spec else {
        return;
    };
    let cidrs = spec.pod_cidrs.clone().unwrap_or_default();
    match spec.pod_cidr.as_deref() {
        Some(c) if !c.is_empty() => {
            if cidrs.first().map(String::as_str) != Some(c) {
                spec.pod_cidrs = Some(vec![c.to_string()]);
            }
        }
        _ => {
            if let Some(first) = cidrs.first() {
                spec.pod_cidr = Some(first.clone());
            }
        }
    }
}

fn cidrs(n: &Node) -> Vec<String> {
    n.spec
        .as_ref()
        .and_then(|s| s.pod_cidrs.clone())
        .unwrap_or_default()
}

/// `ValidateNode` (the CIDRs) and, given the old Node, `ValidateNodeUpdate`
/// (podCIDRs only go from empty to set).
pub(crate) fn validate(causes: &mut Causes, node: &Node, old: Option<&Node>) {
    let new_cidrs = cidrs(node);
    for (i, c) in new_cidrs.iter().enumerate() {
        if parse_cidr(c).is_none() {
            causes.invalid(
                "spec.podCIDRs",
                &json!(c),
                &format!("spec.podCIDRs[{i}] must be a valid CIDR"),
            );
        }
    }
    if let Some(old) = old {
        let old_cidrs = cidrs(old);
        if !old_cidrs.is_empty() && old_cidrs != new_cidrs {
            causes.forbidden(
                "spec.podCIDRs",
                "node updates may not change podCIDR except from \"\" to valid",
            );
        }
    }
}
