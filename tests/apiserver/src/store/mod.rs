//! The fixture's storage: every object of every kind by (kind, namespace,
//! name), one global resourceVersion across kinds (as etcd's revision is),
//! the event history watches replay from, and the list snapshots `continue`
//! tokens use. Every write goes through here, whether it came over HTTP or
//! from a test; `kinds` holds what differs per kind.

use std::collections::VecDeque;
use std::sync::Arc;

use serde_json::Value;

mod decode;
mod error;
mod kinds;
mod list;
mod netpol;
mod node;
mod object;
mod resource;
mod selector;
mod validation;
mod writes;

pub(crate) use decode::now_secs;
pub(crate) use error::ApiError;
pub use kinds::NAMESPACE_NAME_LABEL;
pub(crate) use list::ListRequest;
pub(crate) use object::{Event, EventType, Key, ObjectMap, PatchKind, Stored, Target, WriteMode};
pub(crate) use resource::Kind;
pub(crate) use selector::{FieldSelector, LabelSelector, Selectors};

/// Events kept for watches to resume from; older ones are dropped as by a
/// compaction (a watch from before them gets 410 Gone).
pub(crate) const HISTORY_CAP: usize = 100_000;

#[derive(Debug)]
pub(crate) struct State {
    pub(crate) rv: u64,
    pub(crate) objects: Arc<ObjectMap>,
    /// Events with resourceVersion `oldest + 1 ..= rv`, in order: every bump
    /// of `rv` is exactly one event.
    pub(crate) history: VecDeque<Event>,
    /// A watch may start from any resourceVersion >= this.
    pub(crate) oldest: u64,
    snapshots: VecDeque<(u64, Arc<ObjectMap>)>,
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
            objects: Arc::default(),
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
        kind: Kind,
        ev: EventType,
        mut value: Value,
        prev: Option<Arc<Stored>>,
    ) -> Result<Arc<Stored>, ApiError> {
        let rv = self.rv + 1;
        if let Value::Object(obj) = &mut value {
            decode::meta_mut(obj).insert("resourceVersion".into(), rv.to_string().into());
        }
        let stored = Arc::new(Stored::new(kind, value)?);
        self.rv = rv;
        Arc::make_mut(&mut self.objects).insert(stored.key(), stored.clone());
        self.push_event(ev, stored.clone(), prev);
        Ok(stored)
    }

    /// Removes an object; the DELETED event carries its final state at the new version.
    fn commit_delete(&mut self, last: &Stored) -> Result<Arc<Stored>, ApiError> {
        let rv = self.rv + 1;
        let gone = Arc::new(last.with_rv(rv)?);
        self.rv = rv;
        Arc::make_mut(&mut self.objects).remove(&gone.key());
        self.push_event(EventType::Deleted, gone.clone(), None);
        Ok(gone)
    }

    pub(crate) fn get(&self, key: &Key) -> Result<Arc<Stored>, ApiError> {
        self.objects
            .get(key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(key.kind, &key.name))
    }

    /// The objects of a kind, in one namespace or all.
    pub(crate) fn of_kind<'a>(
        &'a self,
        kind: Kind,
        ns: Option<&'a str>,
    ) -> impl Iterator<Item = &'a Arc<Stored>> + 'a {
        objects_of(&self.objects, kind, ns)
    }
}

/// The objects of a kind in `map`, in one namespace or all, in key order.
pub(crate) fn objects_of<'a>(
    map: &'a ObjectMap,
    kind: Kind,
    ns: Option<&'a str>,
) -> impl Iterator<Item = &'a Arc<Stored>> + 'a {
    let start = Key::new(kind, ns.unwrap_or_default(), "");
    map.range(start..)
        .map(|(_, o)| o)
        .take_while(move |o| o.kind == kind && ns.is_none_or(|n| o.ns == n))
}
