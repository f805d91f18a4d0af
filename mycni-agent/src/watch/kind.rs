//! What differs between the kinds of object the agent watches.

use crate::metrics::Metrics;

/// How one kind of object is watched.
pub(super) struct Kind<K> {
    /// What the failure log calls it.
    pub(super) name: &'static str,
    /// Drops what the agent does not read, before the object is cached.
    pub(super) trim: fn(&mut K),
    /// Logs the initial list, with its size.
    pub(super) listed: fn(usize),
    /// Counts an event (not the initial list).
    pub(super) event: fn(&Metrics),
    /// Whether this watch's successes and failures speak for the API's
    /// reachability (`mycni_api_reachable`): the Node watch's do; a policy
    /// watch refused by an older ClusterRole must not call the API down.
    pub(super) reachability: bool,
}
