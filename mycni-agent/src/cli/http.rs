//! `run`'s metrics and health flags: the HTTP endpoint's address, and how
//! long the loop may be away before /healthz fails.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use mycni_agent::metrics::{DEFAULT_STALE_AFTER, Liveness};
use mycni_agent::settings::{LIVENESS_STALE_AFTER, METRICS_ADDR};

use super::order::Order;
use super::values::parse_positive_duration;

#[derive(Args, Clone)]
pub(super) struct HttpArgs {
    /// /metrics, /healthz, /readyz; "off" disables.
    #[arg(long = METRICS_ADDR.flag, env = METRICS_ADDR.env, default_value = "0.0.0.0:9971", value_parser = parse_metrics_addr, display_order = Order::MetricsAddr as usize)]
    pub metrics_addr: MetricsAddr,
    /// /healthz fails once the reconcile loop has not come back to its
    /// wait for this long (it does after every pass, and every 10 s, or
    /// every resync period if shorter, while idle), so the liveness probe
    /// restarts a stuck agent; at least 3 of those heartbeats [default:
    /// 30s, or 3 heartbeats if longer].
    #[arg(long = LIVENESS_STALE_AFTER.flag, env = LIVENESS_STALE_AFTER.env, value_parser = parse_stale_after, display_order = Order::LivenessStaleAfter as usize)]
    pub liveness_stale_after: Option<Duration>,
}

/// `--metrics-addr`: None is `off`.
#[derive(Debug, Clone, Copy)]
pub(super) struct MetricsAddr(pub Option<SocketAddr>);

fn parse_metrics_addr(s: &str) -> Result<MetricsAddr, String> {
    let v = match s.trim() {
        "off" | "" => Ok(MetricsAddr(None)),
        a => a
            .parse::<SocketAddr>()
            .map(|a| MetricsAddr(Some(a)))
            .map_err(|_| format!("{a:?} is not `off` or an address:port like 0.0.0.0:9971")),
    };
    METRICS_ADDR.check(v)
}

fn parse_stale_after(s: &str) -> Result<Duration, String> {
    LIVENESS_STALE_AFTER.check(parse_positive_duration(s))
}

impl HttpArgs {
    /// The least `--liveness-stale-after` with this resync period: 3
    /// heartbeats. Fewer would restart a healthy agent whose pass merely
    /// ran long once.
    fn min_stale_after(resync: Duration) -> Duration {
        Liveness::period(resync) * 3
    }

    /// How long the loop may stay away from its wait before /healthz
    /// fails: as set, else 30 s (3 heartbeats if longer). The heartbeat
    /// does not follow a long resync, so neither does this.
    pub fn stale_after(&self, resync: Duration) -> Duration {
        self.liveness_stale_after
            .unwrap_or_else(|| Self::min_stale_after(resync).max(DEFAULT_STALE_AFTER))
    }

    /// A limit set below [`Self::min_stale_after`] is refused, naming the
    /// setting.
    pub fn check(&self, resync: Duration) -> Result<()> {
        let least = Self::min_stale_after(resync);
        if let Some(set) = self.liveness_stale_after
            && set < least
        {
            anyhow::bail!(
                "--{} {:?} ({}) must be at least 3 heartbeats of the loop ({:?}: 3 x the resync period, at most 3 x 10 s)",
                LIVENESS_STALE_AFTER.flag,
                set,
                LIVENESS_STALE_AFTER.source(),
                least
            );
        }
        Ok(())
    }
}
