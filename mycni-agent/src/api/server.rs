//! The agent's HTTP API, served by axum: `/metrics`, the probes
//! (`/healthz`, `/readyz`), the rooms' `/inspect/...` answers and
//! `/flows` with its page.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use std::convert::Infallible;

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::StreamExt;
use tokio::net::TcpListener;

use crate::metrics::{Format, Metrics};

/// The endpoint's routes; separate from [`serve`] so tests can drive it
/// without a socket.
pub fn router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/metrics", get(scrape))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/inspect/{room}/{*what}", get(inspect))
        .route("/flows", get(flows))
        .route("/flows/map", get(flows_map))
        .fallback(|| async { (StatusCode::NOT_FOUND, "not found\n") })
        .with_state(metrics)
}

async fn scrape(State(m): State<Arc<Metrics>>, headers: HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let format = Format::negotiate(accept);
    // Off the async workers: the subsystems' collectors read pinned maps
    // and run `nft`.
    let rendered = tokio::task::spawn_blocking(move || m.render(format)).await;
    match rendered.unwrap_or(Err(std::fmt::Error)) {
        Ok(body) => ([(header::CONTENT_TYPE, format.content_type())], body).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding the metrics failed: {e}\n"),
        )
            .into_response(),
    }
}

/// A room's view of one object (`/inspect/policy/<ns>/<pod>`), in JSON:
/// what `mycni-agent inspect` prints.
async fn inspect(
    State(m): State<Arc<Metrics>>,
    Path((room, what)): Path<(String, String)>,
) -> Response {
    let answer = tokio::task::spawn_blocking(move || m.inspect(&room, &what)).await;
    match answer {
        Ok(Some(Ok(json))) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
        Ok(Some(Err(why))) => (StatusCode::NOT_FOUND, format!("{why}\n")).into_response(),
        Ok(None) => (StatusCode::NOT_FOUND, "no such room answers here\n").into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}

/// `/flows?<filters>`: newline-delimited JSON, the held flows that
/// match, then (with `follow=true`) new ones as they come.
async fn flows(State(m): State<Arc<Metrics>>, RawQuery(q): RawQuery) -> Response {
    let Some(feed) = m.feed() else {
        return (
            StatusCode::NOT_FOUND,
            "no flows here: the flows room is off\n",
        )
            .into_response();
    };
    match feed.open(q.as_deref().unwrap_or("")) {
        Ok((held, live)) => {
            let head = futures::stream::once(async move { held });
            let body = match live {
                Some(live) => Body::from_stream(head.chain(live).map(Ok::<_, Infallible>)),
                None => Body::from_stream(head.map(Ok::<_, Infallible>)),
            };
            ([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response()
        }
        Err(why) => (StatusCode::BAD_REQUEST, format!("{why}\n")).into_response(),
    }
}

/// The live service map of this node's flows, drawn from `/flows`.
async fn flows_map(State(m): State<Arc<Metrics>>) -> Response {
    match m.feed() {
        Some(feed) => (
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            feed.page(),
        )
            .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            "no flows here: the flows room is off\n",
        )
            .into_response(),
    }
}

/// 200 while the reconcile loop beats (see [`Liveness`]); 503 before its
/// first pass too, so the startup probe waits for it, and the liveness probe
/// (which Kubernetes starts only after the startup probe passed) restarts a
/// stuck loop.
async fn healthz(State(m): State<Arc<Metrics>>) -> Response {
    match m.liveness.check() {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        // What start-up waits for (podCIDR, the API) is in the detail.
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("unhealthy: {why} ({})\n", m.detail()),
        )
            .into_response(),
    }
}

async fn readyz(State(m): State<Arc<Metrics>>) -> Response {
    if m.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, format!("ready: {}\n", m.detail())).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}\n", m.detail()),
        )
            .into_response()
    }
}

/// Serves until the process ends. An address in use is tried again every
/// 250 ms, said once: a restarted agent can start while the one it
/// replaces still holds the port (the kubelet's probes and Prometheus
/// come through here, so giving up would leave the node unready for good).
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<()> {
    let mut said = false;
    let listener = loop {
        match TcpListener::bind(addr).await {
            Ok(l) => break l,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                if !said {
                    tracing::warn!(%addr, error = %e, "metrics address in use; trying again every 250 ms");
                    said = true;
                }
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            }
            Err(e) => return Err(e),
        }
    };
    tracing::info!(%addr, "serving /metrics, /healthz, /readyz");
    axum::serve(listener, router(metrics)).await
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn healthz_follows_the_loop_heartbeat() {
        let m = Arc::new(Metrics::default());
        m.set_not_ready("waiting for spec.podCIDR");
        let get = |m: Arc<Metrics>| async move {
            let resp = healthz(State(m)).await;
            let code = resp.status();
            let body = axum::body::to_bytes(resp.into_body(), 4096)
                .await
                .expect("body");
            (code, String::from_utf8_lossy(&body).into_owned())
        };
        let (code, body) = get(m.clone()).await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert!(
            body.contains("starting") && body.contains("podCIDR"),
            "{body}"
        );
        m.liveness.set_stale_after(Duration::from_millis(50));
        m.liveness.beat();
        assert_eq!(get(m.clone()).await, (StatusCode::OK, "ok\n".into()));
        tokio::time::sleep(Duration::from_millis(80)).await;
        let (code, body) = get(m.clone()).await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert!(body.contains("has not finished a pass"), "{body}");
        m.liveness.beat();
        assert_eq!(get(m).await.0, StatusCode::OK);
    }
}
