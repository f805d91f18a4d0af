//! What the server does to a request body before storing it: kind checks,
//! decoding with the v1 conversion, validation, and the metadata it sets
//! itself (uid, timestamps).

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Map, Value, json};

use super::error::ApiError;

pub(crate) fn random_u64() -> u64 {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    RandomState::new().hash_one(SEQ.fetch_add(1, Ordering::Relaxed))
}

pub(super) fn new_uid() -> String {
    let (a, b) = (random_u64(), random_u64());
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        ((b >> 48) & 0x3fff) | 0x8000,
        b & 0xffff_ffff_ffff
    )
}

pub(crate) fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

pub(super) fn now_time() -> Value {
    let t = Time(Timestamp::from_second(now_secs()).unwrap_or(Timestamp::UNIX_EPOCH));
    serde_json::to_value(t).unwrap_or(Value::Null)
}

fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b.first() != Some(&b'-')
                && b.last() != Some(&b'-')
        })
}

fn is_cidr(s: &str) -> bool {
    let Some((ip, len)) = s.split_once('/') else {
        return false;
    };
    let Ok(len) = len.parse::<u8>() else {
        return false;
    };
    match ip.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => len <= 32,
        Ok(std::net::IpAddr::V6(_)) => len <= 128,
        Err(_) => false,
    }
}

pub(super) fn meta_mut(obj: &mut Map<String, Value>) -> &mut Map<String, Value> {
    let slot = obj
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !slot.is_object() {
        *slot = Value::Object(Map::new());
    }
    match slot {
        Value::Object(m) => m,
        _ => unreachable!("metadata was just made an object"),
    }
}

pub(super) fn check_type(obj: &Map<String, Value>) -> Result<(), ApiError> {
    if let Some(kind) = obj.get("kind").and_then(Value::as_str)
        && !kind.is_empty()
        && kind != "Node"
    {
        return Err(ApiError::bad_request(&format!(
            "the API version in the data (v1) does not match the expected API version (v1) or the kind {kind:?} does not match \"Node\""
        )));
    }
    if let Some(av) = obj.get("apiVersion").and_then(Value::as_str)
        && !av.is_empty()
        && av != "v1"
    {
        return Err(ApiError::bad_request(&format!(
            "the API version in the data ({av}) does not match the expected API version (v1)"
        )));
    }
    Ok(())
}

/// Decodes a Node the way the server does, then applies the v1 conversion
/// rule that keeps `spec.podCIDR` and `spec.podCIDRs[0]` in step.
pub(super) fn decode(mut value: Value) -> Result<Node, ApiError> {
    if let Value::Object(m) = &mut value {
        m.insert("apiVersion".into(), json!("v1"));
        m.insert("kind".into(), json!("Node"));
    }
    let mut node: Node = serde_json::from_value(value)
        .map_err(|e| ApiError::bad_request(&format!("unable to decode Node: {e}")))?;
    if let Some(spec) = &mut node.spec {
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
    Ok(node)
}

pub(super) fn validate(node: &Node, old: Option<&Node>) -> Result<(), ApiError> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let mut causes = Vec::new();
    if !is_dns_subdomain(&name) {
        causes.push((
            "metadata.name",
            format!(
                "Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
            ),
        ));
    }
    let cidrs = |n: &Node| {
        n.spec
            .as_ref()
            .and_then(|s| s.pod_cidrs.clone())
            .unwrap_or_default()
    };
    let new_cidrs = cidrs(node);
    for (i, c) in new_cidrs.iter().enumerate() {
        if !is_cidr(c) {
            causes.push((
                "spec.podCIDRs",
                format!("Invalid value: {c:?}: spec.podCIDRs[{i}] must be a valid CIDR"),
            ));
        }
    }
    if let Some(old) = old {
        let old_cidrs = cidrs(old);
        if !old_cidrs.is_empty() && old_cidrs != new_cidrs {
            causes.push((
                "spec.podCIDRs",
                "Forbidden: node updates may not change podCIDR except from \"\" to valid".into(),
            ));
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        let causes: Vec<(&str, String)> = causes;
        Err(ApiError::invalid(&name, &causes))
    }
}
