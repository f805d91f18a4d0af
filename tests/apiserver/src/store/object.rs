//! What the store holds: a Node version with its encodings, and the
//! events watches replay.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use k8s_openapi::api::core::v1::Node;
use serde_json::{Value, json};

use super::error::ApiError;

pub(crate) type NodeMap = BTreeMap<String, Arc<Stored>>;

/// One version of a Node, normalized the way the server stores it, with its
/// JSON encodings ready to send.
#[derive(Debug)]
pub(crate) struct Stored {
    pub(crate) name: String,
    pub(crate) rv: u64,
    /// The object as JSON, with apiVersion and kind.
    pub(crate) value: Value,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) unschedulable: bool,
    /// The encoding as a list item: without apiVersion and kind, like the real server.
    pub(crate) item: Bytes,
    /// The encoding for get and watch: with apiVersion and kind.
    pub(crate) full: Bytes,
}

impl Stored {
    pub(super) fn new(node: &Node) -> Result<Self, ApiError> {
        let name = node.metadata.name.clone().unwrap_or_default();
        let rv = node
            .metadata
            .resource_version
            .as_deref()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let mut value =
            serde_json::to_value(node).map_err(|e| ApiError::internal(&e.to_string()))?;
        if let Value::Object(m) = &mut value {
            m.remove("apiVersion");
            m.remove("kind");
        }
        let item = serde_json::to_vec(&value).map_err(|e| ApiError::internal(&e.to_string()))?;
        let mut full = br#"{"apiVersion":"v1","kind":"Node","#.to_vec();
        full.extend_from_slice(item.get(1..).unwrap_or_default());
        if let Value::Object(m) = &mut value {
            m.insert("apiVersion".into(), json!("v1"));
            m.insert("kind".into(), json!("Node"));
        }
        Ok(Self {
            name,
            rv,
            value,
            labels: node.metadata.labels.clone().unwrap_or_default(),
            unschedulable: node
                .spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false),
            item: Bytes::from(item),
            full: Bytes::from(full),
        })
    }

    pub(crate) fn node(&self) -> Option<Node> {
        serde_json::from_slice(&self.full).ok()
    }

    /// The same object with another resourceVersion (what a DELETED event carries).
    pub(crate) fn with_rv(&self, rv: u64) -> Result<Self, ApiError> {
        let mut node = self
            .node()
            .ok_or_else(|| ApiError::internal("stored node does not decode"))?;
        node.metadata.resource_version = Some(rv.to_string());
        Self::new(&node)
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
/// ignores spec (and takes metadata and status, as the real node status
/// strategy does), and the fixture's own methods may change anything.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Target {
    Main,
    Status,
    Direct,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum PatchKind {
    Merge,
    Strategic,
    Json,
}
