//! Responses: the headers every answer carries, errors as `Status`
//! objects, and the list bodies assembled from pre-encoded items.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use hyper::{Response, StatusCode};
use serde_json::{Value, json};

use super::Body;
use crate::store::{ApiError, Kind, Stored};

pub(super) fn full(
    code: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Body> {
    let mut resp = Response::new(Full::new(body.into()).boxed_unsync());
    *resp.status_mut() = code;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp.headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-cache, private"));
    resp
}

pub(super) fn json_bytes(code: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    full(code, "application/json", body)
}

pub(super) fn json_value(code: StatusCode, v: &Value) -> Response<Body> {
    json_bytes(code, v.to_string())
}

pub(super) fn error(e: &ApiError) -> Response<Body> {
    json_value(
        StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        &e.status(),
    )
}

pub(super) fn media_type(req_header: Option<&str>) -> String {
    req_header
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

pub(super) fn parse_json(body: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(&format!("error decoding request body: {e}")))
}

pub(super) fn list_body(
    kind: Kind,
    rv: u64,
    items: &[Arc<Stored>],
    cont: Option<&str>,
    remaining: Option<u64>,
) -> Bytes {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Value::Object(m) = &mut meta {
        if let Some(c) = cont {
            m.insert("continue".into(), json!(c));
        }
        if let Some(r) = remaining {
            m.insert("remainingItemCount".into(), json!(r));
        }
    }
    let size: usize = items.iter().map(|i| i.item.len() + 1).sum();
    let mut out = Vec::with_capacity(size + 128);
    out.extend_from_slice(
        format!(
            r#"{{"kind":"{}List","apiVersion":"{}","metadata":"#,
            kind.res().kind,
            kind.api_version()
        )
        .as_bytes(),
    );
    out.extend_from_slice(meta.to_string().as_bytes());
    out.extend_from_slice(br#","items":["#);
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(&item.item);
    }
    out.extend_from_slice(b"]}");
    Bytes::from(out)
}

pub(super) fn success_status(obj: &Stored) -> Value {
    let mut details = json!({
        "name": obj.name,
        "kind": obj.kind.res().plural,
        "uid": obj.value.pointer("/metadata/uid").cloned().unwrap_or(Value::Null)
    });
    if !obj.kind.res().group.is_empty()
        && let Value::Object(m) = &mut details
    {
        m.insert("group".into(), json!(obj.kind.res().group));
    }
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": details
    })
}
