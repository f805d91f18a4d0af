//! The fixture's storage: Nodes by name, a global resourceVersion, the event
//! history watches replay from, and the list snapshots `continue` tokens use.
//! Every write goes through here, whether it came over HTTP or from a test.

use std::collections::{BTreeMap, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Map, Value, json};

use super::patch;
use super::selector::Selectors;

/// Events kept for watches to resume from; older ones are dropped as by a
/// compaction (a watch from before them gets 410 Gone).
pub(crate) const HISTORY_CAP: usize = 100_000;
/// List snapshots kept for `continue` tokens.
const SNAPSHOT_CAP: usize = 8;

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
    fn new(node: &Node) -> Result<Self, ApiError> {
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

    fn finalizers(&self) -> usize {
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
/// ignores everything else, and the fixture's own methods may change anything.
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

/// A failure as the API server reports it: a `Status` object.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub(crate) code: u16,
    pub(crate) reason: &'static str,
    pub(crate) message: String,
    pub(crate) details: Option<Value>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: String, details: Option<Value>) -> Self {
        Self {
            code,
            reason,
            message,
            details,
        }
    }
    pub(crate) fn not_found(name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("nodes \"{name}\" not found"),
            Some(json!({"name": name, "kind": "nodes"})),
        )
    }
    pub(crate) fn no_route() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource".into(),
            Some(json!({})),
        )
    }
    pub(crate) fn already_exists(name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("nodes \"{name}\" already exists"),
            Some(json!({"name": name, "kind": "nodes"})),
        )
    }
    pub(crate) fn conflict(name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on nodes \"{name}\": {why}"),
            Some(json!({"name": name, "kind": "nodes"})),
        )
    }
    pub(crate) fn modified(name: &str) -> Self {
        Self::conflict(
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }
    pub(crate) fn bad_request(message: &str) -> Self {
        Self::new(400, "BadRequest", message.into(), None)
    }
    pub(crate) fn invalid(name: &str, causes: &[(&str, String)]) -> Self {
        let text: Vec<String> = causes.iter().map(|(f, m)| format!("{f}: {m}")).collect();
        let text = if text.len() == 1 {
            text.join("")
        } else {
            format!("[{}]", text.join(", "))
        };
        let causes: Vec<Value> = causes
            .iter()
            .map(|(f, m)| json!({"reason": "FieldValueInvalid", "message": m, "field": f}))
            .collect();
        Self::new(
            422,
            "Invalid",
            format!("Node \"{name}\" is invalid: {text}"),
            Some(json!({"name": name, "kind": "Node", "causes": causes})),
        )
    }
    /// A 422 without details, as a failed JSON patch reports it.
    pub(crate) fn unprocessable(message: &str) -> Self {
        Self::new(422, "Invalid", message.into(), None)
    }
    pub(crate) fn expired(message: String) -> Self {
        Self::new(410, "Expired", message, None)
    }
    pub(crate) fn too_large_rv(want: u64, have: u64) -> Self {
        Self::new(
            504,
            "Timeout",
            format!("Too large resource version: {want}, current: {have}"),
            Some(json!({"causes": [{"reason": "ResourceVersionTooLarge",
                                     "message": "Too large resource version"}],
                        "retryAfterSeconds": 1})),
        )
    }
    pub(crate) fn unsupported_media(message: &str) -> Self {
        Self::new(415, "UnsupportedMediaType", message.into(), None)
    }
    pub(crate) fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource".into(),
            Some(json!({})),
        )
    }
    pub(crate) fn internal(message: &str) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {message}"),
            Some(json!({"causes": [{"message": message}]})),
        )
    }

    /// The `Status` object.
    pub(crate) fn status(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let (Some(d), Value::Object(m)) = (&self.details, &mut v) {
            m.insert("details".into(), d.clone());
        }
        v
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

pub(crate) fn random_u64() -> u64 {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    RandomState::new().hash_one(SEQ.fetch_add(1, Ordering::Relaxed))
}

fn new_uid() -> String {
    let (a, b) = (random_u64(), random_u64());
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        ((b >> 48) & 0x3fff) | 0x8000,
        b & 0xffff_ffff_ffff
    )
}

pub(crate) fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn now_time() -> Value {
    let t = Time(Timestamp::from_second(now_secs()).unwrap_or(Timestamp::UNIX_EPOCH));
    serde_json::to_value(t).unwrap_or(Value::Null)
}

fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b.first() != Some(&b'-')
                && b.last() != Some(&b'-')
        })
}

fn is_cidr(s: &str) -> bool {
    let Some((ip, len)) = s.split_once('/') else {
        return false;
    };
    let Ok(len) = len.parse::<u8>() else {
        return false;
    };
    match ip.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => len <= 32,
        Ok(std::net::IpAddr::V6(_)) => len <= 128,
        Err(_) => false,
    }
}

fn meta_mut(obj: &mut Map<String, Value>) -> &mut Map<String, Value> {
    let slot = obj
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !slot.is_object() {
        *slot = Value::Object(Map::new());
    }
    match slot {
        Value::Object(m) => m,
        _ => unreachable!("metadata was just made an object"),
    }
}

fn check_type(obj: &Map<String, Value>) -> Result<(), ApiError> {
    if let Some(kind) = obj.get("kind").and_then(Value::as_str)
        && !kind.is_empty()
        && kind != "Node"
    {
        return Err(ApiError::bad_request(&format!(
            "the API version in the data (v1) does not match the expected API version (v1) or the kind {kind:?} does not match \"Node\""
        )));
    }
    if let Some(av) = obj.get("apiVersion").and_then(Value::as_str)
        && !av.is_empty()
        && av != "v1"
    {
        return Err(ApiError::bad_request(&format!(
            "the API version in the data ({av}) does not match the expected API version (v1)"
        )));
    }
    Ok(())
}

/// Decodes a Node the way the server does, then applies the v1 conversion
/// rule that keeps `spec.podCIDR` and `spec.podCIDRs[0]` in step.
fn decode(mut value: Value) -> Result<Node, ApiError> {
    if let Value::Object(m) = &mut value {
        m.insert("apiVersion".into(), json!("v1"));
        m.insert("kind".into(), json!("Node"));
    }
    let mut node: Node = serde_json::from_value(value)
        .map_err(|e| ApiError::bad_request(&format!("unable to decode Node: {e}")))?;
    if let Some(spec) = &mut node.spec {
        let cidrs = spec.pod_cidrs.clone().unwrap_or_default();
        match spec.pod_cidr.as_deref() {
            Some(c) if !c.is_empty() => {
                if cidrs.first().map(String::as_str) != Some(c) {
                    spec.pod_cidrs = Some(vec![c.to_string()]);
                }
            }
            _ => {
                if let Some(first) = cidrs.first() {
                    spec.pod_cidr = Some(first.clone());
                }
            }
        }
    }
    Ok(node)
}

fn validate(node: &Node, old: Option<&Node>) -> Result<(), ApiError> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let mut causes = Vec::new();
    if !is_dns_subdomain(&name) {
        causes.push((
            "metadata.name",
            format!(
                "Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
            ),
        ));
    }
    let cidrs = |n: &Node| {
        n.spec
            .as_ref()
            .and_then(|s| s.pod_cidrs.clone())
            .unwrap_or_default()
    };
    let new_cidrs = cidrs(node);
    for (i, c) in new_cidrs.iter().enumerate() {
        if !is_cidr(c) {
            causes.push((
                "spec.podCIDRs",
                format!("Invalid value: {c:?}: spec.podCIDRs[{i}] must be a valid CIDR"),
            ));
        }
    }
    if let Some(old) = old {
        let old_cidrs = cidrs(old);
        if !old_cidrs.is_empty() && old_cidrs != new_cidrs {
            causes.push((
                "spec.podCIDRs",
                "Forbidden: node updates may not change podCIDR except from \"\" to valid".into(),
            ));
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        let causes: Vec<(&str, String)> = causes;
        Err(ApiError::invalid(&name, &causes))
    }
}

/// A list request's parameters.
#[derive(Debug, Clone, Default)]
pub(crate) struct ListRequest {
    pub(crate) selectors: Selectors,
    pub(crate) limit: usize,
    pub(crate) continue_token: Option<String>,
    pub(crate) resource_version: Option<String>,
    pub(crate) version_match: Option<String>,
}

#[derive(Debug)]
pub(crate) struct ListPage {
    pub(crate) rv: u64,
    pub(crate) items: Vec<Arc<Stored>>,
    pub(crate) continue_token: Option<String>,
    pub(crate) remaining: Option<u64>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

const CONTINUE_EXPIRED: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";

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

    pub(crate) fn create(
        &mut self,
        mut value: Value,
        target: Target,
        dry_run: bool,
    ) -> Result<Arc<Stored>, ApiError> {
        let Value::Object(obj) = &mut value else {
            return Err(ApiError::bad_request(
                "Object 'Kind' is missing in request body",
            ));
        };
        check_type(obj)?;
        let meta = meta_mut(obj);
        let mut name = meta
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if name.is_empty() {
            let prefix = meta
                .get("generateName")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            if prefix.is_empty() {
                return Err(ApiError::invalid(
                    "",
                    &[(
                        "metadata.name",
                        "Required value: name or generateName is required".into(),
                    )],
                ));
            }
            const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
            let mut r = random_u64();
            name = prefix;
            for _ in 0..5 {
                name.push(char::from(ALPHABET[(r % ALPHABET.len() as u64) as usize]));
                r /= ALPHABET.len() as u64;
            }
            meta.insert("name".into(), json!(name));
        }
        let rv_set = meta
            .get("resourceVersion")
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty());
        if rv_set && target != Target::Direct {
            return Err(ApiError::internal(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        for k in [
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
        ] {
            meta.remove(k);
        }
        meta.insert("uid".into(), json!(new_uid()));
        meta.insert("creationTimestamp".into(), now_time());
        let node = decode(value)?;
        validate(&node, None)?;
        if self.nodes.contains_key(&name) {
            return Err(ApiError::already_exists(&name));
        }
        if dry_run {
            return Ok(Arc::new(Stored::new(&node)?));
        }
        self.commit(EventType::Added, node, None)
    }

    /// Replaces a Node (PUT, the result of a patch, or a direct update).
    pub(crate) fn update(
        &mut self,
        name: &str,
        mut value: Value,
        target: Target,
        dry_run: bool,
    ) -> Result<Arc<Stored>, ApiError> {
        let old = self.get(name)?;
        let Value::Object(obj) = &mut value else {
            return Err(ApiError::bad_request(
                "Object 'Kind' is missing in request body",
            ));
        };
        check_type(obj)?;
        let meta = meta_mut(obj);
        if let Some(n) = meta.get("name").and_then(Value::as_str)
            && n != name
        {
            return Err(ApiError::bad_request(&format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            )));
        }
        if target != Target::Direct
            && let Some(rv) = meta.get("resourceVersion").and_then(Value::as_str)
            && !rv.is_empty()
        {
            let rv: u64 = rv
                .parse()
                .map_err(|_| ApiError::bad_request(&format!("invalid resource version: {rv:?}")))?;
            if rv != old.rv {
                return Err(ApiError::modified(name));
            }
        }
        let old_meta = old.value.get("metadata").cloned().unwrap_or(json!({}));
        if let Some(uid) = meta.get("uid").and_then(Value::as_str)
            && !uid.is_empty()
            && Some(uid) != old_meta.get("uid").and_then(Value::as_str)
        {
            return Err(ApiError::conflict(
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    old_meta
                        .get("uid")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                ),
            ));
        }
        // Server-managed metadata always comes from the stored object.
        for k in [
            "name",
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "resourceVersion",
        ] {
            match old_meta.get(k) {
                Some(v) => meta.insert(k.into(), v.clone()),
                None => meta.remove(k),
            };
        }
        let merged = match target {
            Target::Main => {
                match old.value.get("status") {
                    Some(s) => obj.insert("status".into(), s.clone()),
                    None => obj.remove("status"),
                };
                value
            }
            Target::Status => {
                let mut m = old.value.clone();
                if let Value::Object(mo) = &mut m {
                    match obj.get("status") {
                        Some(s) => mo.insert("status".into(), s.clone()),
                        None => mo.remove("status"),
                    };
                }
                m
            }
            Target::Direct => value,
        };
        let node = decode(merged)?;
        if target != Target::Direct {
            let old_node = old
                .node()
                .ok_or_else(|| ApiError::internal("stored node does not decode"))?;
            validate(&node, Some(&old_node))?;
        }
        let candidate = Stored::new(&node)?;
        if candidate.value == old.value {
            return Ok(old);
        }
        if dry_run {
            return Ok(Arc::new(candidate));
        }
        if candidate
            .value
            .pointer("/metadata/deletionTimestamp")
            .is_some()
            && candidate.finalizers() == 0
        {
            return self.commit_delete(node);
        }
        self.commit(EventType::Modified, node, Some(old))
    }

    pub(crate) fn patch(
        &mut self,
        name: &str,
        kind: PatchKind,
        body: &Value,
        target: Target,
        dry_run: bool,
    ) -> Result<Arc<Stored>, ApiError> {
        let old = self.get(name)?;
        let mut doc = old.value.clone();
        match kind {
            PatchKind::Merge => patch::merge_patch(&mut doc, body),
            PatchKind::Strategic => patch::strategic_merge_patch(&mut doc, body)
                .map_err(|e| ApiError::bad_request(&e))?,
            PatchKind::Json => {
                patch::json_patch(&mut doc, body).map_err(|e| ApiError::unprocessable(&e))?
            }
        }
        self.update(name, doc, target, dry_run)
    }

    /// Deletes a Node, or marks it for deletion while it has finalizers.
    /// Returns the object and whether it is gone.
    pub(crate) fn delete(
        &mut self,
        name: &str,
        uid: Option<&str>,
        rv: Option<&str>,
        dry_run: bool,
    ) -> Result<(Arc<Stored>, bool), ApiError> {
        let old = self.get(name)?;
        let have_uid = old
            .value
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if let Some(uid) = uid
            && uid != have_uid
        {
            return Err(ApiError::conflict(
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {have_uid}"
                ),
            ));
        }
        if let Some(rv) = rv
            && rv != old.rv.to_string()
        {
            return Err(ApiError::conflict(
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    old.rv
                ),
            ));
        }
        if dry_run {
            return Ok((old.clone(), old.finalizers() == 0));
        }
        if old.finalizers() > 0 {
            if old.value.pointer("/metadata/deletionTimestamp").is_some() {
                return Ok((old, false));
            }
            let mut v = old.value.clone();
            if let Value::Object(obj) = &mut v {
                let meta = meta_mut(obj);
                meta.insert("deletionTimestamp".into(), now_time());
                meta.insert("deletionGracePeriodSeconds".into(), json!(0));
            }
            let node = decode(v)?;
            let stored = self.commit(EventType::Modified, node, Some(old))?;
            return Ok((stored, false));
        }
        let last = old
            .node()
            .ok_or_else(|| ApiError::internal("stored node does not decode"))?;
        Ok((self.commit_delete(last)?, true))
    }

    /// The current objects and version, or a snapshot by version.
    fn snapshot(&self, rv: u64) -> Option<Arc<NodeMap>> {
        if rv == self.rv {
            return Some(self.nodes.clone());
        }
        self.snapshots
            .iter()
            .find(|(r, _)| *r == rv)
            .map(|(_, m)| m.clone())
    }

    pub(crate) fn list(&mut self, req: &ListRequest) -> Result<ListPage, ApiError> {
        let rv_param = req.resource_version.as_deref().filter(|s| !s.is_empty());
        if req.version_match.as_deref().is_some_and(|m| !m.is_empty()) && rv_param.is_none() {
            return Err(ApiError::bad_request(
                "resourceVersionMatch is forbidden unless resourceVersion is provided",
            ));
        }
        let (rv, map, start) = match req.continue_token.as_deref().filter(|s| !s.is_empty()) {
            Some(token) => {
                if rv_param.is_some() {
                    return Err(ApiError::bad_request(
                        "specifying resource version is not allowed when using continue",
                    ));
                }
                let decoded: Value = unhex(token)
                    .and_then(|b| serde_json::from_slice(&b).ok())
                    .ok_or_else(|| {
                        ApiError::bad_request("continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)")
                    })?;
                let rv = decoded.get("rv").and_then(Value::as_u64).unwrap_or(0);
                let start = decoded
                    .get("start")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                let map = self
                    .snapshot(rv)
                    .ok_or_else(|| ApiError::expired(CONTINUE_EXPIRED.into()))?;
                (rv, map, Some(start))
            }
            None => match rv_param {
                None | Some("0") => (self.rv, self.nodes.clone(), None),
                Some(s) => {
                    let want: u64 = s.parse().map_err(|_| {
                        ApiError::bad_request(&format!("invalid resource version: {s:?}"))
                    })?;
                    if want > self.rv {
                        return Err(ApiError::too_large_rv(want, self.rv));
                    }
                    if req.version_match.as_deref() == Some("Exact") {
                        let map = self.snapshot(want).ok_or_else(|| {
                            ApiError::expired(format!(
                                "too old resource version: {want} ({})",
                                self.rv
                            ))
                        })?;
                        (want, map, None)
                    } else {
                        (self.rv, self.nodes.clone(), None)
                    }
                }
            },
        };
        let range = match &start {
            Some(s) => map.range::<str, _>((Bound::Included(s.as_str()), Bound::Unbounded)),
            None => map.range::<str, _>(..),
        };
        let mut items = Vec::new();
        let mut last = None;
        let mut more = 0u64;
        for (name, obj) in range {
            if !req.selectors.matches(obj) {
                continue;
            }
            if req.limit > 0 && items.len() >= req.limit {
                more += 1;
                if !req.selectors.is_empty() {
                    break;
                }
                continue;
            }
            last = Some(name.clone());
            items.push(obj.clone());
        }
        let continue_token = if more > 0 {
            if !self.snapshots.iter().any(|(r, _)| *r == rv) {
                self.snapshots.push_back((rv, map.clone()));
                while self.snapshots.len() > SNAPSHOT_CAP {
                    self.snapshots.pop_front();
                }
            }
            let token = json!({"v": "meta.k8s.io/v1", "rv": rv,
                               "start": format!("{}\u{0}", last.unwrap_or_default())});
            Some(hex(token.to_string().as_bytes()))
        } else {
            None
        };
        Ok(ListPage {
            rv,
            items,
            remaining: (more > 0 && req.selectors.is_empty()).then_some(more),
            continue_token,
        })
    }
}
