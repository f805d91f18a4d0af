//! The HTTP side: routing, the Node endpoints, watch streams, discovery and
//! the server-side table kubectl prints.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;
use hyper::header::CONTENT_TYPE;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::json;

use crate::Shared;
use crate::store::{ApiError, Target};

mod discovery;
mod nodes;
mod query;
mod response;
mod table;
mod watch;

use discovery::{OPENAPI_HASH, api_v1, openapi_v3_api_v1, version};
pub(crate) use query::Query;
use response::{error, full, json_value, media_type};

pub(crate) type Body = UnsyncBoxBody<Bytes, Infallible>;

/// Largest request body accepted (the real server's limit is 3 MiB).
const MAX_BODY: usize = 3 * 1024 * 1024;

/// Entry point for every request.
pub(crate) async fn handle(
    shared: Arc<Shared>,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = match http_body_util::Limited::new(body, MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return Ok(error(&ApiError::bad_request(
                "the request body could not be read or is too large",
            )));
        }
    };
    let query = Query::parse(parts.uri.query());
    let header = |name: hyper::header::HeaderName| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let accept = header(hyper::header::ACCEPT).unwrap_or_default();
    let ctx = Ctx {
        shared: shared.clone(),
        query,
        table: accept.contains("as=Table"),
        content_type: media_type(header(CONTENT_TYPE).as_deref()),
        body,
    };
    let path = parts.uri.path().to_string();
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let m = &parts.method;
    let forbidden = |verb: &str, name: &str| Err(ApiError::forbidden(verb, "nodes", name));
    let writes_forbidden = shared
        .node_writes_forbidden
        .load(std::sync::atomic::Ordering::SeqCst);
    let result = match segs.as_slice() {
        [] if m == Method::GET => Ok(ctx.root()),
        ["version"] if m == Method::GET => Ok(ctx.discovery(version())),
        ["healthz" | "livez" | "readyz"] if m == Method::GET => {
            Ok(full(StatusCode::OK, "text/plain; charset=utf-8", "ok"))
        }
        ["api"] if m == Method::GET => Ok(ctx.discovery(json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": shared.addr.to_string()}
            ]
        }))),
        ["apis"] if m == Method::GET => Ok(ctx.discovery(json!({
            "kind": "APIGroupList", "apiVersion": "v1", "groups": []
        }))),
        ["api", "v1"] if m == Method::GET => Ok(ctx.discovery(api_v1())),
        ["openapi", "v2"] if m == Method::GET => Ok(ctx.openapi_v2(&accept)),
        ["openapi", "v3"] if m == Method::GET => Ok(ctx.discovery(json!({
            "paths": {"api/v1": {"serverRelativeURL": format!("/openapi/v3/api/v1?hash={OPENAPI_HASH}")}}
        }))),
        ["openapi", "v3", "api", "v1"] if m == Method::GET => Ok(ctx.discovery(openapi_v3_api_v1())),
        ["api", "v1", "nodes"] => match *m {
            Method::GET if ctx.query.flag("watch") => ctx.watch(None),
            Method::GET => ctx.list(),
            Method::POST if writes_forbidden => forbidden("create", ""),
            Method::DELETE if writes_forbidden => forbidden("deletecollection", ""),
            Method::POST => ctx.create(),
            Method::DELETE => ctx.delete_collection(),
            _ => Err(ApiError::method_not_allowed()),
        },
        ["api", "v1", "watch", "nodes"] if m == Method::GET => ctx.watch(None),
        ["api", "v1", "watch", "nodes", name] if m == Method::GET => ctx.watch(Some(name)),
        ["api", "v1", "nodes", name] => match *m {
            Method::GET if ctx.query.flag("watch") => ctx.watch(Some(name)),
            Method::GET => ctx.get(name),
            Method::PUT if writes_forbidden => forbidden("update", name),
            Method::PATCH if writes_forbidden => forbidden("patch", name),
            Method::DELETE if writes_forbidden => forbidden("delete", name),
            Method::PUT => ctx.update(name, Target::Main),
            Method::PATCH => ctx.patch(name, Target::Main),
            Method::DELETE => ctx.delete(name),
            _ => Err(ApiError::method_not_allowed()),
        },
        ["api", "v1", "nodes", name, "status"] => match *m {
            Method::GET => ctx.get(name),
            Method::PUT => ctx.update(name, Target::Status),
            Method::PATCH => ctx.patch(name, Target::Status),
            _ => Err(ApiError::method_not_allowed()),
        },
        ["_fixture", "compact"] if m == Method::POST => {
            shared.compact();
            Ok(json_value(StatusCode::OK, &json!({"compacted": true})))
        }
        ["_fixture", "outage"] if m == Method::POST => Ok(ctx.outage()),
        ["_fixture", "counters"] if m == Method::GET => {
            Ok(json_value(StatusCode::OK, &json!(shared.counters())))
        }
        _ => Err(ApiError::no_route()),
    };
    let resp = result.unwrap_or_else(|e| error(&e));
    if shared.log {
        eprintln!(
            "mycni-apiserver: {peer} {} {} -> {}",
            parts.method,
            parts.uri,
            resp.status().as_u16()
        );
    }
    Ok(resp)
}

struct Ctx {
    shared: Arc<Shared>,
    query: Query,
    table: bool,
    content_type: String,
    body: Bytes,
}

impl Ctx {
    fn outage(&self) -> Response<Body> {
        let secs: f64 = self
            .query
            .get("seconds")
            .and_then(|s| s.parse().ok())
            .unwrap_or(5.0);
        let shared = self.shared.clone();
        // From a plain thread: taking the listener down waits for this very
        // connection to close, which must not block the runtime.
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            shared.set_reachable(false);
            std::thread::sleep(Duration::from_secs_f64(secs.clamp(0.0, 3600.0)));
            shared.set_reachable(true);
        });
        json_value(StatusCode::ACCEPTED, &json!({"outageSeconds": secs}))
    }
}
