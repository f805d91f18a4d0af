//! What the server does to any request body before storing it: kind
//! checks, decoding into the kind's type, and the metadata it sets itself
//! (uid, timestamps).

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use super::error::ApiError;
use super::resource::Kind;

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

/// Refuses a body of another kind or version than the URL names.
pub(super) fn check_type(kind: Kind, obj: &Map<String, Value>) -> Result<(), ApiError> {
    let want_av = kind.api_version();
    let want_kind = kind.res().kind;
    let av = obj
        .get("apiVersion")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty());
    if let Some(k) = obj.get("kind").and_then(Value::as_str)
        && !k.is_empty()
        && k != want_kind
    {
        return Err(ApiError::bad_request(&format!(
            "the API version in the data ({}) does not match the expected API version ({want_av}) or the kind {k:?} does not match {want_kind:?}",
            av.unwrap_or(&want_av)
        )));
    }
    if let Some(av) = av
        && av != want_av
    {
        return Err(ApiError::bad_request(&format!(
            "the API version in the data ({av}) does not match the expected API version ({want_av})"
        )));
    }
    Ok(())
}

/// Decodes a body as `kind`'s type: a body that does not fit is a 400, as
/// the real server's decoder answers.
pub(super) fn decode<T: DeserializeOwned>(kind: Kind, mut value: Value) -> Result<T, ApiError> {
    if let Value::Object(m) = &mut value {
        m.insert("apiVersion".into(), json!(kind.api_version()));
        m.insert("kind".into(), json!(kind.res().kind));
    }
    serde_json::from_value(value)
        .map_err(|e| ApiError::bad_request(&format!("unable to decode {}: {e}", kind.res().kind)))
}

/// Encodes a typed object back to the JSON the store keeps.
pub(super) fn encode<T: Serialize>(obj: &T) -> Result<Value, ApiError> {
    serde_json::to_value(obj).map_err(|e| ApiError::internal(&e.to_string()))
}
