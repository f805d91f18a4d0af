//! The fixture's storage: Nodes by name, a global resourceVersion, the event
//! history watches replay from, and the list snapshots `continue` tokens use.
//! Every write goes through here, whether it came over HTTP or from a test.

use std::collections::VecDeque;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;

mod decode;
mod error;
mod list;
mod object;
mod selector;
mod writes;

pub(crate) use decode::now_secs;
pub(crate) use error::ApiError;
pub(crate) use list::ListRequest;
pub(crate) use object::{Event, EventType, NodeMap, PatchKind, Stored, Target};
pub(crate) use selector::{FieldSelector, LabelSelector, Selectors};

/// Events kept for watches to resume from; older ones are dropped as by a
/// compaction (a watch from before them gets 410 Gone).
pub(crate) const HISTORY_CAP: usize = 100_000;

#[derive(Debug)]
pub(crate) struct State {
    pub(crate) rv: u64,
    pub(crate) nodes: Arc<NodeMap>,
    /// Events with resourceVersion `oldest + 1 ..= rv`, in order: every bump
    /// of `rv` is exactly one event.
    pub(crate) history: VecDeque<Event>,
    /// A watch may start from any resourceVersion >= this.
    pub(crate) oldest: u64,
    snapshots: VecDeque<(u64, Arc<NodeMap>)>,
}

impl Default for State {
    fn default() -> Self {
        Self::new()
    }
}

impl State {
    pub(crate) fn new() -> Self {
        // Start past the small numbers so "0" and "1" are never confused with real versions.
        Self {
            rv: 100,
            nodes: Arc::default(),
            history: VecDeque::new(),
            oldest: 100,
            snapshots: VecDeque::new(),
        }
    }

    /// The events after `cursor`, or `Err(oldest)` if some were compacted away.
    pub(crate) fn events_after(&self, cursor: u64) -> Result<impl Iterator<Item = &Event>, u64> {
        if cursor < self.oldest {
            return Err(self.oldest);
        }
        let skip = usize::try_from(cursor - self.oldest).unwrap_or(usize::MAX);
        Ok(self.history.iter().skip(skip))
    }

    pub(crate) fn compact(&mut self) {
        self.history.clear();
        self.oldest = self.rv;
        self.snapshots.clear();
    }

    fn push_event(&mut self, kind: EventType, obj: Arc<Stored>, prev: Option<Arc<Stored>>) {
        self.history.push_back(Event {
            rv: obj.rv,
            kind,
            obj,
            prev,
        });
        while self.history.len() > HISTORY_CAP {
            self.history.pop_front();
            self.oldest += 1;
        }
    }

    fn commit(
        &mut self,
        kind: EventType,
        mut node: Node,
        prev: Option<Arc<Stored>>,
    ) -> Result<Arc<Stored>, ApiError> {
        let rv = self.rv + 1;
        node.metadata.resource_version = Some(rv.to_string());
        let stored = Arc::new(Stored::new(&node)?);
        self.rv = rv;
        Arc::make_mut(&mut self.nodes).insert(stored.name.clone(), stored.clone());
        self.push_event(kind, stored.clone(), prev);
        Ok(stored)
    }

    /// Removes a Node; the DELETED event carries `last` (its final state) at the new version.
    fn commit_delete(&mut self, mut last: Node) -> Result<Arc<Stored>, ApiError> {
        let rv = self.rv + 1;
        last.metadata.resource_version = Some(rv.to_string());
        let gone = Arc::new(Stored::new(&last)?);
        self.rv = rv;
        Arc::make_mut(&mut self.nodes).remove(&gone.name);
        self.push_event(EventType::Deleted, gone.clone(), None);
        Ok(gone)
    }

    pub(crate) fn get(&self, name: &str) -> Result<Arc<Stored>, ApiError> {
        self.nodes
            .get(name)
            .cloned()
            .ok_or_else(|| ApiError::not_found(name))
    }
}
