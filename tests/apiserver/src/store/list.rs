//! Lists: resourceVersion semantics, `limit`/`continue` pagination and the
//! snapshots that keep continued lists consistent.

use std::ops::Bound;
use std::sync::Arc;

use serde_json::{Value, json};

use super::error::ApiError;
use super::object::{Key, ObjectMap, Stored};
use super::resource::Kind;
use super::selector::Selectors;
use super::{State, objects_of};

/// List snapshots kept for `continue` tokens.
const SNAPSHOT_CAP: usize = 8;

/// A list request's parameters.
#[derive(Debug, Clone)]
pub(crate) struct ListRequest {
    pub(crate) kind: Kind,
    /// One namespace, or all (and cluster-scoped kinds).
    pub(crate) ns: Option<String>,
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

impl State {
    /// The current objects and version, or a snapshot by version.
    fn snapshot(&self, rv: u64) -> Option<Arc<ObjectMap>> {
        if rv == self.rv {
            return Some(self.objects.clone());
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
                let field = |k: &str| {
                    decoded
                        .get(k)
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string()
                };
                let start = (field("ns"), field("name"));
                let map = self
                    .snapshot(rv)
                    .ok_or_else(|| ApiError::expired(CONTINUE_EXPIRED.into()))?;
                (rv, map, Some(start))
            }
            None => match rv_param {
                None | Some("0") => (self.rv, self.objects.clone(), None),
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
                        (self.rv, self.objects.clone(), None)
                    }
                }
            },
        };
        // A continued list resumes after the last object the previous page
        // held; the objects stay those of the snapshot it was cut from.
        let after = start.map(|(ns, name)| Key::new(req.kind, &ns, &name));
        let mut items = Vec::new();
        let mut last = None;
        let mut more = 0u64;
        let objects: Box<dyn Iterator<Item = &Arc<Stored>>> = match &after {
            Some(a) => Box::new(
                map.range((Bound::Excluded(a), Bound::Unbounded))
                    .map(|(_, o)| o)
                    .take_while(|o| {
                        o.kind == req.kind && req.ns.as_deref().is_none_or(|n| o.ns == n)
                    }),
            ),
            None => Box::new(objects_of(&map, req.kind, req.ns.as_deref())),
        };
        for obj in objects {
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
            last = Some(obj.key());
            items.push(obj.clone());
        }
        let continue_token = if more > 0 {
            if !self.snapshots.iter().any(|(r, _)| *r == rv) {
                self.snapshots.push_back((rv, map.clone()));
                while self.snapshots.len() > SNAPSHOT_CAP {
                    self.snapshots.pop_front();
                }
            }
            let last = last.unwrap_or_else(|| Key::new(req.kind, "", ""));
            let token = json!({"v": "meta.k8s.io/v1", "rv": rv,
                               "ns": last.ns, "name": last.name});
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
