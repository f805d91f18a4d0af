//! The Kubernetes API fixture (`mycni_apiserver`) against the clients
//! that use it: kube-rs as the agent does (Api, watcher, reflector, patches),
//! raw HTTP for the wire format, and kubectl.

// A test crate root finds modules beside it, not in a directory of its
// name: the paths keep the themes under apiserver_fixture/.
#[path = "apiserver_fixture/kinds.rs"]
mod kinds;
#[path = "apiserver_fixture/kubectl.rs"]
mod kubectl;
#[path = "apiserver_fixture/kubectl_kinds.rs"]
mod kubectl_kinds;
#[path = "apiserver_fixture/netpol.rs"]
mod netpol;
#[path = "apiserver_fixture/reads.rs"]
mod reads;
#[path = "apiserver_fixture/watch.rs"]
mod watch;
#[path = "apiserver_fixture/writes.rs"]
mod writes;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, NodeCondition};
use kube::api::Api;
use kube::runtime::reflector::Store;
use mycni_apiserver::ApiServer;
use serde_json::Value;

fn start() -> ApiServer {
    ApiServer::start("127.0.0.1:0".parse().expect("addr")).expect("start fixture")
}

fn api(server: &ApiServer) -> Api<Node> {
    Api::all(server.kube_client().expect("kube client"))
}

fn rv(n: &Node) -> String {
    n.metadata.resource_version.clone().unwrap_or_default()
}

fn by_name(nodes: impl IntoIterator<Item = Node>) -> BTreeMap<String, String> {
    nodes
        .into_iter()
        .map(|n| (n.metadata.name.clone().unwrap_or_default(), rv(&n)))
        .collect()
}

fn store_state(store: &Store<Node>) -> BTreeMap<String, String> {
    by_name(store.state().iter().map(|n| (**n).clone()))
}

/// Polls `f` until it holds, for at most `limit`.
async fn eventually(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn api_status(err: kube::Error) -> kube::core::Status {
    match err {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// A raw HTTP/1.1 exchange with `Connection: close`; returns status, headers
/// (lower-cased names) and the body, de-chunked.
fn raw(
    addr: SocketAddr,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: &str,
) -> (u16, BTreeMap<String, String>, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(ct) = content_type {
        req.push_str(&format!("Content-Type: {ct}\r\n"));
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    s.write_all(req.as_bytes()).expect("send");
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).expect("status line");
    let code: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status code");
    let mut headers = BTreeMap::new();
    loop {
        line.clear();
        r.read_line(&mut line).expect("header");
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let mut out = Vec::new();
    if headers.get("transfer-encoding").map(String::as_str) == Some("chunked") {
        loop {
            line.clear();
            r.read_line(&mut line).expect("chunk size");
            let size = usize::from_str_radix(line.trim(), 16).expect("chunk size hex");
            if size == 0 {
                break;
            }
            let mut chunk = vec![0; size + 2];
            r.read_exact(&mut chunk).expect("chunk");
            out.extend_from_slice(&chunk[..size]);
        }
    } else {
        r.read_to_end(&mut out).expect("body");
    }
    (code, headers, String::from_utf8(out).expect("utf-8 body"))
}

fn raw_json(
    addr: SocketAddr,
    method: &str,
    path: &str,
    ct: Option<&str>,
    body: &str,
) -> (u16, Value) {
    let (code, _, text) = raw(addr, method, path, ct, body);
    (
        code,
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")),
    )
}

fn watch_lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn condition(type_: &str, status: &str) -> NodeCondition {
    NodeCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(format!("{type_}Reason")),
        ..NodeCondition::default()
    }
}
