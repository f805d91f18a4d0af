//! Kubernetes Events on policy drops: a Warning on the pod whose isolation
//! dropped a connection, so `kubectl describe pod` says why it cannot be
//! reached (or reach). Rate-limited as Hubble does: at most one per pair
//! of ends every two minutes, and one a second per node; the rest are
//! counted, not sent. Publishing runs on a task of its own: the API's
//! latency never holds up the room.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;

use super::NftVerdict;
use super::enrich::{Record, What, Who};
use crate::verdict::Direction;

/// One event per pair of ends this often at most.
pub(crate) const PAIR_INTERVAL: Duration = Duration::from_secs(120);
/// And one a second per node.
pub(crate) const NODE_INTERVAL: Duration = Duration::from_secs(1);

/// What became of drops worth an event.
#[derive(Debug, Default)]
pub struct EventCounts {
    pub published: AtomicU64,
    pub rate_limited: AtomicU64,
    pub failed: AtomicU64,
}

/// Decides which drops become events (pure; the clock is passed in).
#[derive(Debug, Default)]
pub(crate) struct Limiter {
    last_pair: HashMap<(IpAddr, IpAddr), Instant>,
    last_any: Option<Instant>,
}

impl Limiter {
    /// Whether a drop between `a` and `b` at `now` may become an event.
    pub fn admit(&mut self, a: IpAddr, b: IpAddr, now: Instant) -> bool {
        if self
            .last_any
            .is_some_and(|t| now.duration_since(t) < NODE_INTERVAL)
        {
            return false;
        }
        if self
            .last_pair
            .get(&(a, b))
            .is_some_and(|t| now.duration_since(*t) < PAIR_INTERVAL)
        {
            return false;
        }
        // Bounded: pairs older than the interval have nothing to say.
        if self.last_pair.len() > 10_000 {
            self.last_pair
                .retain(|_, t| now.duration_since(*t) < PAIR_INTERVAL);
        }
        self.last_pair.insert((a, b), now);
        self.last_any = Some(now);
        true
    }
}

/// The event for a policy drop in `r`, about the isolated pod; None for
/// anything else.
pub(crate) fn event_for(r: &Record) -> Option<(Event, ObjectReference)> {
    let What::Nft {
        verdict: NftVerdict::PolicyDrop { direction, reason },
        denied_by,
        ..
    } = &r.what
    else {
        return None;
    };
    let (isolated, other, other_ip, port) = r.isolated()?;
    let Who::Pod(pod) = isolated else {
        return None;
    };
    let peer = match other {
        Who::Pod(p) => format!("{}/{} ({other_ip})", p.key.namespace, p.key.name),
        _ => other_ip.to_string(),
    };
    let proto = match r.proto {
        6 => "TCP",
        17 => "UDP",
        132 => "SCTP",
        _ => "IP",
    };
    let by: Vec<String> = denied_by
        .iter()
        .map(|p| format!("{}/{}", p.namespace, p.name))
        .collect();
    let way = match direction {
        Direction::Egress => format!("egress to {peer}"),
        Direction::Ingress => format!("ingress from {peer}"),
    };
    let why = match reason {
        crate::verdict::Reason::Denied if !by.is_empty() => format!(
            "isolated by {} and no rule of theirs admits it",
            by.join(", ")
        ),
        other => super::enrich::policy_reason(*other).to_string(),
    };
    let note = format!("NetworkPolicy dropped {way} on {port}/{proto}: {why}");
    let event = Event {
        type_: EventType::Warning,
        reason: "PolicyDenied".into(),
        note: Some(note),
        action: "Drop".into(),
        secondary: None,
    };
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(pod.key.namespace.clone()),
        name: Some(pod.key.name.clone()),
        ..ObjectReference::default()
    };
    Some((event, reference))
}

/// The publishing task; the room hands it what the limiter admitted.
pub fn spawn(
    client: kube::Client,
    node: &str,
    counts: Arc<EventCounts>,
) -> mpsc::Sender<(Event, ObjectReference)> {
    let (tx, mut rx) = mpsc::channel::<(Event, ObjectReference)>(64);
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: "mycni-agent".into(),
            instance: Some(node.to_string()),
        },
    );
    tokio::spawn(async move {
        while let Some((ev, reference)) = rx.recv().await {
            match recorder.publish(&ev, &reference).await {
                Ok(()) => {
                    counts.published.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    counts.failed.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(error = %e, "cannot publish a policy drop event");
                }
            }
        }
    });
    tx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_event_per_pair_every_two_minutes_and_one_a_second() {
        let mut l = Limiter::default();
        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        let (a, b, c) = (ip("10.0.0.1"), ip("10.0.0.2"), ip("10.0.0.3"));
        let t = Instant::now();
        assert!(l.admit(a, b, t));
        assert!(!l.admit(a, c, t + Duration::from_millis(500)), "1 a second");
        assert!(l.admit(a, c, t + Duration::from_secs(1)));
        assert!(!l.admit(a, b, t + Duration::from_secs(60)), "same pair");
        assert!(
            l.admit(b, a, t + Duration::from_secs(61)),
            "the other way is a pair of its own"
        );
        assert!(l.admit(a, b, t + Duration::from_secs(121)));
    }
}
