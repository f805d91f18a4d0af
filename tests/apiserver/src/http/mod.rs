//! The HTTP side: routing, the resource endpoints (the same for every kind
//! in `store::Kind`), watch streams, discovery and the server-side tables
//! kubectl prints.

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
use crate::store::{ApiError, Kind};

mod discovery;
mod objects;
mod query;
mod response;
mod rows;
mod table;
mod watch;

use discovery::{
    api_group, api_group_list, api_resource_list, openapi_v3, openapi_v3_index, version,
};
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
        ["apis"] if m == Method::GET => Ok(ctx.discovery(api_group_list())),
        ["api", "v1"] if m == Method::GET => Ok(ctx.discovery(api_resource_list("", "v1"))),
        ["apis", group] if m == Method::GET => api_group(group)
            .map(|g| ctx.discovery(g))
            .ok_or_else(ApiError::no_route),
        ["apis", group, version]
            if m == Method::GET && Kind::of_group(group, version).next().is_some() =>
        {
            Ok(ctx.discovery(api_resource_list(group, version)))
        }
        ["openapi", "v2"] if m == Method::GET => Ok(ctx.openapi_v2(&accept)),
        ["openapi", "v3"] if m == Method::GET => Ok(ctx.discovery(openapi_v3_index())),
        ["openapi", "v3", "api", "v1"] if m == Method::GET => {
            Ok(ctx.discovery(openapi_v3("", "v1")))
        }
        ["openapi", "v3", "apis", group, version]
            if m == Method::GET && Kind::of_group(group, version).next().is_some() =>
        {
            Ok(ctx.discovery(openapi_v3(group, version)))
        }
        ["_fixture", "compact"] if m == Method::POST => {
            shared.compact();
            Ok(json_value(StatusCode::OK, &json!({"compacted": true})))
        }
        ["_fixture", "outage"] if m == Method::POST => Ok(ctx.outage()),
        ["_fixture", "counters"] if m == Method::GET => {
            Ok(json_value(StatusCode::OK, &json!(shared.counters())))
        }
        _ => match Route::parse(&segs) {
            Some(route) => ctx.serve(&route, m),
            None => Err(ApiError::no_route()),
        },
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

/// A request for a resource: `/api/v1/...` or `/apis/{group}/{version}/...`,
/// optionally under the legacy `watch/` prefix, then `{plural}[/{name}[/status]]`
/// for cluster-scoped kinds, `namespaces/{ns}/{plural}[/{name}[/status]]`
/// for namespaced ones (whose bare `{plural}` lists all namespaces).
#[derive(Debug, Clone, Copy)]
struct Route<'a> {
    kind: Kind,
    ns: Option<&'a str>,
    name: Option<&'a str>,
    status: bool,
    /// Came through the legacy `/watch/` path: a watch whatever the query says.
    watch_path: bool,
}

impl<'a> Route<'a> {
    fn parse(segs: &[&'a str]) -> Option<Self> {
        let (group, version, rest) = match segs {
            ["api", "v1", rest @ ..] => ("", "v1", rest),
            ["apis", g, v, rest @ ..] => (*g, *v, rest),
            _ => return None,
        };
        let (watch_path, rest) = match rest {
            ["watch", r @ ..] => (true, r),
            r => (false, r),
        };
        let (ns, rest) = match rest {
            ["namespaces", ns, plural, ..]
                if Kind::find(group, version, plural).is_some_and(|k| k.res().namespaced) =>
            {
                (Some(*ns), rest.get(2..)?)
            }
            r => (None, r),
        };
        let (plural, name, sub) = match rest {
            [p] => (*p, None, None),
            [p, n] => (*p, Some(*n), None),
            [p, n, s] => (*p, Some(*n), Some(*s)),
            _ => return None,
        };
        let kind = Kind::find(group, version, plural)?;
        // A namespaced kind's objects are only addressed inside their
        // namespace; without one, only its collection (all namespaces).
        if kind.res().namespaced && ns.is_none() && name.is_some() {
            return None;
        }
        let status = match sub {
            None => false,
            Some("status") if kind.res().status && !watch_path => true,
            Some(_) => return None,
        };
        Some(Self {
            kind,
            ns,
            name,
            status,
            watch_path,
        })
    }
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
