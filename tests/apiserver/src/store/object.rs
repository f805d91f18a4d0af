//! What the store holds: object versions with their encodings, keyed by
//! kind, namespace and name, and the events watches replay.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::decode::meta_mut;
use super::error::ApiError;
use super::resource::Kind;

/// Where an object lives: its kind, namespace (empty for cluster-scoped
/// kinds) and name. The store's order, so a kind's objects (and one
/// namespace's) are one range.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Key {
    pub(crate) kind: Kind,
    pub(crate) ns: String,
    pub(crate) name: String,
}

impl Key {
    pub(crate) fn new(kind: Kind, ns: &str, name: &str) -> Self {
        Self {
            kind,
            ns: ns.to_string(),
            name: name.to_string(),
        }
    }
}

pub(crate) type ObjectMap = BTreeMap<Key, Arc<Stored>>;

/// One version of an object, normalized the way the server stores it, with
/// its JSON encodings ready to send.
#[derive(Debug)]
pub(crate) struct Stored {
    pub(crate) kind: Kind,
    pub(crate) ns: String,
    pub(crate) name: String,
    pub(crate) rv: u64,
    /// The object as JSON, with apiVersion and kind.
    pub(crate) value: Value,
    pub(crate) labels: BTreeMap<String, String>,
    /// Its field labels, for `fieldSelector`.
    pub(crate) fields: Vec<(&'static str, String)>,
    /// The encoding as a list item: without apiVersion and kind, like the real server.
    pub(crate) item: Bytes,
    /// The encoding for get and watch: with apiVersion and kind.
    pub(crate) full: Bytes,
}

impl Stored {
    pub(super) fn new(kind: Kind, mut value: Value) -> Result<Self, ApiError> {
        let text = |v: &Value, p: &str| {
            v.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let name = text(&value, "/metadata/name");
        let ns = text(&value, "/metadata/namespace");
        let rv = text(&value, "/metadata/resourceVersion")
            .parse()
            .unwrap_or(0);
        let labels = value
            .pointer("/metadata/labels")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                    .collect()
            })
            .unwrap_or_default();
        let fields = kind.field_values(&value);
        if let Value::Object(m) = &mut value {
            m.remove("apiVersion");
            m.remove("kind");
        }
        let item = serde_json::to_vec(&value).map_err(|e| ApiError::internal(&e.to_string()))?;
        let mut full = format!(
            r#"{{"apiVersion":"{}","kind":"{}","#,
            kind.api_version(),
            kind.res().kind
        )
        .into_bytes();
        full.extend_from_slice(item.get(1..).unwrap_or_default());
        if let Value::Object(m) = &mut value {
            m.insert("apiVersion".into(), json!(kind.api_version()));
            m.insert("kind".into(), json!(kind.res().kind));
        }
        Ok(Self {
            kind,
            ns,
            name,
            rv,
            value,
            labels,
            fields,
            item: Bytes::from(item),
            full: Bytes::from(full),
        })
    }

    pub(crate) fn key(&self) -> Key {
        Key::new(self.kind, &self.ns, &self.name)
    }

    /// The object as its k8s_openapi type.
    pub(crate) fn typed<T: DeserializeOwned>(&self) -> Option<T> {
        serde_json::from_slice(&self.full).ok()
    }

    pub(crate) fn field(&self, label: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(l, _)| *l == label)
            .map(|(_, v)| v.as_str())
    }

    /// The same object with another resourceVersion (what a DELETED event carries).
    pub(crate) fn with_rv(&self, rv: u64) -> Result<Self, ApiError> {
        let mut value = self.value.clone();
        if let Value::Object(obj) = &mut value {
            meta_mut(obj).insert("resourceVersion".into(), json!(rv.to_string()));
        }
        Self::new(self.kind, value)
    }

    pub(super) fn finalizers(&self) -> usize {
        self.value
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .map_or(0, Vec::len)
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Event {
    pub(crate) rv: u64,
    pub(crate) kind: EventType,
    pub(crate) obj: Arc<Stored>,
    /// The version before a MODIFIED event, for selector transitions.
    pub(crate) prev: Option<Arc<Stored>>,
}

/// Who writes: the main resource ignores status, the status subresource
/// ignores spec (and takes metadata and status, as the real status
/// strategies do), and the fixture's own methods may change anything;
/// `Unchecked` is the fixture's own write that also skips the kind's
/// validation, as an older or broken API server would store the object.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Target {
    Main,
    Status,
    Direct,
    Unchecked,
}

impl Target {
    /// The fixture's own write, checked or not.
    pub(crate) fn direct(self) -> bool {
        matches!(self, Target::Direct | Target::Unchecked)
    }
}

/// How a write is made: who writes (`target`), and whether it is only
/// checked (`dry_run`, the `dryRun=All` of a request) or stored.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct WriteMode {
    pub(crate) target: Target,
    pub(crate) dry_run: bool,
}

impl WriteMode {
    /// A write by `target` that is stored.
    pub(crate) fn stored(target: Target) -> Self {
        WriteMode {
            target,
            dry_run: false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum PatchKind {
    Merge,
    Strategic,
    Json,
}
