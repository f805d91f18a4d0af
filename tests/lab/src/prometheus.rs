//! A real Prometheus (Debian's `prometheus`) in the lab's underlay
//! namespace, scraping every agent's `/metrics`: what an operator's
//! monitoring sees, with the alerting rules of `deploy/monitoring/` loaded,
//! so a lab shows the metrics, the rules and the dashboard's queries
//! working against live agents.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::daemon::{ns_exec, spawn_daemon, stop_pidfile};
use crate::{Lab, wait_for};

pub const PROMETHEUS_PORT: u16 = 9090;
const BINARY: &str = "/usr/bin/prometheus";

impl Lab {
    /// Where the lab's Prometheus answers (inside the underlay namespace).
    pub fn prometheus_url(&self) -> String {
        format!("http://{}", self.prometheus_socket())
    }

    fn prometheus_socket(&self) -> SocketAddr {
        SocketAddr::from((self.spec.api_addr(), PROMETHEUS_PORT))
    }

    /// Starts Prometheus scraping every node's agent each second, with the
    /// rules from `rules_dir` (`deploy/monitoring`), and waits until every
    /// target is up.
    pub fn start_prometheus(&self, rules_dir: &Path) -> Result<()> {
        let s = &self.spec;
        let dir = s.root.join("prometheus");
        std::fs::create_dir_all(&dir)?;
        let targets: Vec<String> = (1..=s.nodes)
            .map(|i| format!("'{}'", s.metrics_socket(i)))
            .collect();
        let rules = rules_dir.join("alerts.yaml");
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files: ['{}']\n\
             scrape_configs:\n  - job_name: mycni-agent\n    static_configs:\n      - targets: [{}]\n",
            rules.display(),
            targets.join(", ")
        );
        let config_file = dir.join("prometheus.yml");
        std::fs::write(&config_file, config)?;
        let args = vec![
            format!("--config.file={}", config_file.display()),
            format!("--storage.tsdb.path={}", dir.join("data").display()),
            format!("--web.listen-address={}", self.prometheus_socket()),
        ];
        spawn_daemon(
            &s.underlay_ns(),
            Path::new(BINARY),
            &args,
            &dir.join("prometheus.log"),
            &s.root.join("prometheus.pid"),
        )
        .context(
            "starting prometheus (Debian's `prometheus` package; `cargo xtask setup` installs it)",
        )?;
        let mut last = String::new();
        let up = wait_for(
            "Prometheus to scrape every agent",
            Duration::from_secs(30),
            || match self.prometheus_targets() {
                Ok(t) => {
                    let all = t.len() == s.nodes && t.iter().all(|(_, h)| h == "up");
                    last = format!("{t:?}");
                    all
                }
                Err(e) => {
                    last = e.to_string();
                    false
                }
            },
        );
        if let Err(e) = up {
            let log = std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(10).collect();
            bail!("{e:#}; last answer: {last}; log tail:\n{}", tail.join("\n"));
        }
        Ok(())
    }

    /// Every active target Prometheus knows, with its health ("up", "down",
    /// "unknown"), as its API reports them.
    pub fn prometheus_targets(&self) -> Result<Vec<(String, String)>> {
        let url = format!("{}/api/v1/targets?state=active", self.prometheus_url());
        let body = ns_exec(
            &self.spec.underlay_ns(),
            "curl",
            // -g: the brackets of an IPv6 address are no glob.
            &["-sfg", "--max-time", "2", &url],
        )?;
        let v: Value = serde_json::from_str(&body).context("Prometheus /api/v1/targets")?;
        let targets = v["data"]["activeTargets"]
            .as_array()
            .context("no activeTargets in Prometheus' answer")?;
        Ok(targets
            .iter()
            .map(|t| {
                (
                    t["scrapeUrl"].as_str().unwrap_or_default().to_string(),
                    t["health"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect())
    }

    pub(crate) fn stop_prometheus(&self) {
        stop_pidfile(&self.spec.root.join("prometheus.pid"));
    }
}
