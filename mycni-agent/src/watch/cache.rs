//! A cache that keeps what a room reads of each object, not the object:
//! each is converted once, as its event arrives, and the typed object is
//! dropped. kube's reflector keeps the whole k8s-openapi value, whose
//! fixed-size structs weigh ~4.5 KB for a Pod with one container however
//! much is trimmed, and a room reading it converts every object again at
//! every pass; at 100,000 pods that was 5.7 KB a pod and seconds a pass.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use kube::Resource;
use kube::runtime::watcher;

/// Namespace (empty for cluster-scoped kinds) and name.
type ObjectKey = (String, String);

fn object_key<K: Resource>(o: &K) -> ObjectKey {
    let meta = o.meta();
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// The reading side: what every object converted to, as last told.
pub struct Cache<T> {
    objects: Arc<RwLock<HashMap<ObjectKey, Arc<T>>>>,
}

impl<T> Clone for Cache<T> {
    fn clone(&self) -> Self {
        Cache {
            objects: self.objects.clone(),
        }
    }
}

impl<T> Cache<T> {
    /// Every object's conversion, in no particular order.
    pub fn state(&self) -> Vec<Arc<T>> {
        // A writer never panics while holding the lock (the conversion
        // runs before it is taken), so a poisoned one still holds a
        // consistent map.
        let objects = self.objects.read().unwrap_or_else(|e| e.into_inner());
        objects.values().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.objects.read().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// The writing side, fed every event of the watch, as a reflector's
/// writer is: a re-list is buffered and replaces the cache whole at its
/// end, so a reader never sees half a list.
pub(crate) struct Writer<K, T> {
    cache: Cache<T>,
    convert: fn(&K) -> T,
    relisting: Option<HashMap<ObjectKey, Arc<T>>>,
}

/// A cache and its writer.
pub fn cache<K, T>(convert: fn(&K) -> T) -> (Cache<T>, Writer<K, T>) {
    let cache = Cache {
        objects: Arc::default(),
    };
    let writer = Writer {
        cache: cache.clone(),
        convert,
        relisting: None,
    };
    (cache, writer)
}

impl<K: Resource, T> Writer<K, T> {
    pub fn apply(&mut self, event: &watcher::Event<K>) {
        match event {
            watcher::Event::Apply(o) => {
                let value = Arc::new((self.convert)(o));
                self.write().insert(object_key(o), value);
            }
            watcher::Event::Delete(o) => {
                self.write().remove(&object_key(o));
            }
            watcher::Event::Init => self.relisting = Some(HashMap::new()),
            watcher::Event::InitApply(o) => {
                let value = Arc::new((self.convert)(o));
                self.relisting
                    .get_or_insert_default()
                    .insert(object_key(o), value);
            }
            watcher::Event::InitDone => {
                let listed = self.relisting.take().unwrap_or_default();
                *self.write() = listed;
            }
        }
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<ObjectKey, Arc<T>>> {
        self.cache
            .objects
            .write()
            .unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::ObjectMeta;

    fn ns(name: &str, label: &str) -> Namespace {
        Namespace {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some([("l".to_string(), label.to_string())].into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn label(n: &Namespace) -> String {
        n.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("l"))
            .cloned()
            .unwrap_or_default()
    }

    fn sorted(c: &Cache<String>) -> Vec<String> {
        let mut v: Vec<String> = c.state().iter().map(|s| s.to_string()).collect();
        v.sort();
        v
    }

    /// Events replace and remove by name; a re-list shows nothing until
    /// it is complete, then exactly what it listed.
    #[test]
    fn follows_events_and_swaps_a_relist_in_whole() {
        let (c, mut w) = cache::<Namespace, String>(label);
        w.apply(&watcher::Event::Init);
        w.apply(&watcher::Event::InitApply(ns("a", "1")));
        w.apply(&watcher::Event::InitApply(ns("b", "1")));
        assert!(c.state().is_empty(), "a partial list is not shown");
        w.apply(&watcher::Event::InitDone);
        assert_eq!(sorted(&c), ["1", "1"]);
        w.apply(&watcher::Event::Apply(ns("a", "2")));
        assert_eq!(sorted(&c), ["1", "2"]);
        w.apply(&watcher::Event::Delete(ns("b", "1")));
        assert_eq!(sorted(&c), ["2"]);
        // The watch restarts: "a" went while it was down.
        w.apply(&watcher::Event::Init);
        w.apply(&watcher::Event::InitApply(ns("c", "3")));
        assert_eq!(sorted(&c), ["2"], "the old state stands during the list");
        w.apply(&watcher::Event::InitDone);
        assert_eq!(sorted(&c), ["3"]);
        assert_eq!(c.len(), 1);
    }
}
