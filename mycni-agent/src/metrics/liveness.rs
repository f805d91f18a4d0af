//! The reconcile loop's heartbeat, what `/healthz` answers from.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The reconcile loop's heartbeat. `/healthz` fails when the loop has not
/// come back to its wait for longer than `stale_after`: a wedged loop (a
/// hung netlink or API call, a deadlock) keeps serving HTTP and keeps the
/// datapath as it was, but no longer follows Nodes or repairs drift; only a
/// restart gets it going again, which is what the liveness probe does.
///
/// The loop beats after every pass and, while idle, every [`Liveness::period`]
/// from its wait: with the full pass minutes apart (the resync) and a
/// quiet cluster, passes alone would not say the loop is alive.
#[derive(Debug)]
pub struct Liveness {
    last_pass: Mutex<Option<Instant>>,
    stale_after: Mutex<Duration>,
}

/// The default staleness: 3 heartbeats of the longest period.
pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(30);

/// The longest heartbeat period, whatever the resync.
const MAX_PERIOD: Duration = Duration::from_secs(10);

impl Default for Liveness {
    fn default() -> Self {
        Liveness {
            last_pass: Mutex::default(),
            stale_after: Mutex::new(DEFAULT_STALE_AFTER),
        }
    }
}

impl Liveness {
    /// How often the idle loop beats: the resync period if that is
    /// shorter (a short resync wakes it anyway), else 10 s. A staleness
    /// limit needs at least 3 of these, so that one slow pass between two
    /// beats does not restart a healthy agent.
    pub fn period(resync: Duration) -> Duration {
        resync.min(MAX_PERIOD)
    }

    /// The loop is back at its wait: after a pass, whatever its outcome (a
    /// pass that fails is the readiness probe's and the error counter's
    /// business; restarting the agent would not make the kernel accept the
    /// update), or on the idle heartbeat.
    pub fn beat(&self) {
        if let Ok(mut t) = self.last_pass.lock() {
            *t = Some(Instant::now());
        }
    }

    pub fn set_stale_after(&self, d: Duration) {
        if let Ok(mut s) = self.stale_after.lock() {
            *s = d;
        }
    }

    /// Ok while the loop beats; else why not.
    pub fn check(&self) -> Result<(), String> {
        let stale_after = self
            .stale_after
            .lock()
            .map(|s| *s)
            .unwrap_or(DEFAULT_STALE_AFTER);
        match self.last_pass.lock().map(|t| *t) {
            Ok(Some(t)) if t.elapsed() <= stale_after => Ok(()),
            Ok(Some(t)) => Err(format!(
                "the reconcile loop has not finished a pass for {:.1} s (limit {:.1} s)",
                t.elapsed().as_secs_f64(),
                stale_after.as_secs_f64()
            )),
            Ok(None) => Err("starting: no reconcile pass yet".into()),
            Err(_) => Err("the heartbeat lock is poisoned".into()),
        }
    }
}
