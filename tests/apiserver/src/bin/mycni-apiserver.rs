//! `mycni-apiserver`: the Kubernetes API fixture (Nodes, Namespaces, Pods,
//! NetworkPolicies)
//! (the `mycni_apiserver` library) as a standalone process, for the lab.
//!
//! ```text
//! mycni-apiserver [--listen ADDR] [--kubeconfig PATH] [--node NAME[=PODCIDR[,PODCIDR]]]...
//! ```
//!
//! It serves plain HTTP on ADDR (default 127.0.0.1:6443), writes a kubeconfig
//! for it if asked, creates the given Nodes (a dual-stack Node with its
//! podCIDRs comma-separated, `spec.podCIDR` the first), prints `listening on URL` and
//! runs until killed. Besides the Kubernetes API it answers
//! `POST /_fixture/compact`, `POST /_fixture/outage?seconds=N` (listener and
//! every connection closed for N seconds) and `GET /_fixture/counters`.
//! It is a test fixture, not an API server.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use mycni_apiserver::{ApiServer, node_with_cidrs};

const USAGE: &str = "usage: mycni-apiserver [--listen ADDR] [--kubeconfig PATH] [--node NAME[=PODCIDR[,PODCIDR]]]...";

fn main() -> Result<()> {
    let mut listen: SocketAddr = "127.0.0.1:6443".parse()?;
    let mut kubeconfig: Option<PathBuf> = None;
    let mut nodes: Vec<(String, Vec<String>)> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| {
            args.next()
                .with_context(|| format!("{flag} needs a value\n{USAGE}"))
        };
        match arg.as_str() {
            "--listen" => {
                let v = value("--listen")?;
                listen = v.parse().with_context(|| format!("bad address {v:?}"))?;
            }
            "--kubeconfig" => kubeconfig = Some(PathBuf::from(value("--kubeconfig")?)),
            "--node" => {
                let v = value("--node")?;
                match v.split_once('=') {
                    Some((n, c)) => nodes.push((
                        n.to_string(),
                        c.split(',').map(|c| c.trim().to_string()).collect(),
                    )),
                    None => nodes.push((v, Vec::new())),
                }
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    let server = ApiServer::start(listen)?;
    for (name, cidrs) in &nodes {
        let cidrs: Vec<&str> = cidrs.iter().map(String::as_str).collect();
        server
            .create_node(node_with_cidrs(name, &cidrs))
            .with_context(|| format!("create node {name}"))?;
    }
    if let Some(path) = &kubeconfig {
        server.write_kubeconfig(path)?;
    }
    let mut out = std::io::stdout();
    writeln!(out, "listening on {}", server.url())?;
    out.flush()?;
    loop {
        std::thread::park();
    }
}
