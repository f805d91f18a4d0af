//! Prometheus metrics, `/healthz` and `/readyz`, on a tiny HTTP endpoint.
//! Hand-written on purpose: three read-only paths do not need a framework.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

#[derive(Default)]
pub struct Metrics {
    pub peers_programmed: AtomicU64,
    pub reconcile_runs: AtomicU64,
    pub reconcile_errors: AtomicU64,
    /// Sum of reconcile durations in microseconds (with `reconcile_runs`, a mean).
    pub reconcile_micros_sum: AtomicU64,
    pub reconcile_last_micros: AtomicU64,
    /// Kernel entries re-created or removed although the desired state had
    /// not changed since the last good reconcile: someone else touched them.
    pub drift_repaired: AtomicU64,
    pub kernel_actions: AtomicU64,
    pub rejected: Mutex<BTreeMap<&'static str, u64>>,
    pub ready: AtomicBool,
    pub ready_detail: Mutex<String>,
    pub api_reachable: AtomicBool,
    /// The fast path is loaded and maintained.
    pub datapath_ebpf: AtomicBool,
    pub ebpf_load_failures: AtomicU64,
    /// Where the counters are pinned (read at scrape time).
    pub pin_dir: Mutex<Option<PathBuf>>,
    pub dp_local: AtomicU64,
    pub dp_remote: AtomicU64,
    /// Host IPs the underlay filter accepts VXLAN from (the peers').
    pub underlay_filter_peers: AtomicU64,
    /// Failed writes of the underlay filter (nft); each is retried.
    pub underlay_filter_errors: AtomicU64,
}

impl Metrics {
    pub fn set_not_ready(&self, why: impl Into<String>) {
        self.ready.store(false, Ordering::Relaxed);
        if let Ok(mut d) = self.ready_detail.lock() {
            *d = why.into();
        }
    }

    pub fn set_ready(&self, detail: impl Into<String>) {
        self.ready.store(true, Ordering::Relaxed);
        if let Ok(mut d) = self.ready_detail.lock() {
            *d = detail.into();
        }
    }

    pub fn detail(&self) -> String {
        self.ready_detail
            .lock()
            .map(|d| d.clone())
            .unwrap_or_default()
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let g = |out: &mut String, name: &str, help: &str, kind: &str, v: u64| {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n"
            ));
        };
        g(
            &mut out,
            "mycni_peers_programmed",
            "Peer nodes whose route, neighbour and FDB entry are programmed.",
            "gauge",
            self.peers_programmed.load(Ordering::Relaxed),
        );
        g(
            &mut out,
            "mycni_reconcile_runs_total",
            "Reconcile passes run.",
            "counter",
            self.reconcile_runs.load(Ordering::Relaxed),
        );
        g(
            &mut out,
            "mycni_reconcile_errors_total",
            "Reconcile passes with at least one failed kernel update or read.",
            "counter",
            self.reconcile_errors.load(Ordering::Relaxed),
        );
        let runs = self.reconcile_runs.load(Ordering::Relaxed);
        out.push_str(&format!(
            "# HELP mycni_reconcile_duration_seconds Time spent in reconcile passes.\n# TYPE mycni_reconcile_duration_seconds summary\nmycni_reconcile_duration_seconds_sum {}\nmycni_reconcile_duration_seconds_count {runs}\n",
            self.reconcile_micros_sum.load(Ordering::Relaxed) as f64 / 1e6
        ));
        g(
            &mut out,
            "mycni_kernel_drift_repaired_total",
            "Kernel entries repaired that changed without a Node change.",
            "counter",
            self.drift_repaired.load(Ordering::Relaxed),
        );
        g(
            &mut out,
            "mycni_kernel_updates_total",
            "Route, neighbour and FDB updates applied.",
            "counter",
            self.kernel_actions.load(Ordering::Relaxed),
        );
        out.push_str("# HELP mycni_rejected_peers Nodes not programmed because their data is malformed or hostile, by reason.\n# TYPE mycni_rejected_peers gauge\n");
        if let Ok(r) = self.rejected.lock() {
            for (reason, n) in r.iter() {
                out.push_str(&format!(
                    "mycni_rejected_peers{{reason=\"{reason}\"}} {n}\n"
                ));
            }
        }
        g(
            &mut out,
            "mycni_ready",
            "1 when the overlay is up and the CNI config written.",
            "gauge",
            u64::from(self.ready.load(Ordering::Relaxed)),
        );
        g(
            &mut out,
            "mycni_api_reachable",
            "1 while the Kubernetes API watch is healthy.",
            "gauge",
            u64::from(self.api_reachable.load(Ordering::Relaxed)),
        );
        g(
            &mut out,
            "mycni_datapath_ebpf",
            "1 while the eBPF fast path runs; 0 on the kernel path (see /readyz for why).",
            "gauge",
            u64::from(self.datapath_ebpf.load(Ordering::Relaxed)),
        );
        g(
            &mut out,
            "mycni_ebpf_load_failures_total",
            "Failed loads of the eBPF programs (the node then runs the kernel path).",
            "counter",
            self.ebpf_load_failures.load(Ordering::Relaxed),
        );
        g(
            &mut out,
            "mycni_underlay_filter_peers",
            "Host IPs VXLAN is accepted from (nftables set mycni_underlay/peers).",
            "gauge",
            self.underlay_filter_peers.load(Ordering::Relaxed),
        );
        g(
            &mut out,
            "mycni_underlay_filter_errors_total",
            "Failed writes of the VXLAN underlay filter (nft); retried on the next pass.",
            "counter",
            self.underlay_filter_errors.load(Ordering::Relaxed),
        );
        out.push_str("# HELP mycni_datapath_entries Entries in the fast path's maps.\n# TYPE mycni_datapath_entries gauge\n");
        out.push_str(&format!(
            "mycni_datapath_entries{{map=\"local\"}} {}\nmycni_datapath_entries{{map=\"remote\"}} {}\n",
            self.dp_local.load(Ordering::Relaxed),
            self.dp_remote.load(Ordering::Relaxed)
        ));
        let pin = self.pin_dir.lock().ok().and_then(|p| p.clone());
        if let Some(Ok(counters)) = pin.map(|p| crate::ebpf::read_counters(&p)) {
            out.push_str("# HELP mycni_datapath_packets_total Packets seen by the tc programs, by the path they took or why they were left to the kernel.\n# TYPE mycni_datapath_packets_total counter\n");
            for (path, c) in &counters {
                out.push_str(&format!(
                    "mycni_datapath_packets_total{{path=\"{}\",fast=\"{}\"}} {}\n",
                    path.name(),
                    path.is_fast(),
                    c.packets
                ));
            }
            out.push_str("# HELP mycni_datapath_bytes_total Bytes seen by the tc programs, by path.\n# TYPE mycni_datapath_bytes_total counter\n");
            for (path, c) in &counters {
                out.push_str(&format!(
                    "mycni_datapath_bytes_total{{path=\"{}\",fast=\"{}\"}} {}\n",
                    path.name(),
                    path.is_fast(),
                    c.bytes
                ));
            }
        }
        out
    }
}

/// Serves until the process ends. Each connection gets one response.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving /metrics, /healthz, /readyz");
    loop {
        let (mut sock, _) = listener.accept().await?;
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 2048];
            let n = match sock.read(&mut buf).await {
                Ok(n) => n,
                Err(_) => return,
            };
            let req = String::from_utf8_lossy(&buf[..n]);
            let path = req.split_whitespace().nth(1).unwrap_or("/");
            let (status, body) = match path {
                "/metrics" => ("200 OK", metrics.render()),
                "/healthz" => ("200 OK", "ok\n".to_string()),
                "/readyz" if metrics.ready.load(Ordering::Relaxed) => {
                    ("200 OK", format!("ready: {}\n", metrics.detail()))
                }
                "/readyz" => (
                    "503 Service Unavailable",
                    format!("not ready: {}\n", metrics.detail()),
                ),
                _ => ("404 Not Found", "not found\n".to_string()),
            };
            let resp = format!(
                "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = sock.write_all(resp.as_bytes()).await;
        });
    }
}
