//! The resource endpoints other than watch, for every kind: list, get,
//! create, update, patch, delete and deletecollection, and the verb
//! dispatch that sends each request to one of them.

use hyper::{Method, Response, StatusCode};
use serde_json::{Value, json};

use super::response::{json_bytes, json_value, list_body, parse_json, success_status};
use super::table::table_of;
use super::{Body, Ctx, Route};
use crate::store::{ApiError, Key, Kind, ListRequest, PatchKind, Target, WriteMode};

impl Ctx {
    /// Answers a request for a resource by method and shape of its path.
    pub(super) fn serve(&self, r: &Route<'_>, m: &Method) -> Result<Response<Body>, ApiError> {
        let writes_forbidden = r.kind == Kind::Node
            && !r.status
            && self
                .shared
                .node_writes_forbidden
                .load(std::sync::atomic::Ordering::SeqCst);
        let forbidden = |verb: &str| {
            Err(ApiError::forbidden(
                verb,
                r.kind.res().plural,
                r.name.unwrap_or_default(),
            ))
        };
        let is_write = matches!(
            *m,
            Method::POST | Method::PUT | Method::PATCH | Method::DELETE
        );
        if r.watch_path && *m != Method::GET {
            return Err(ApiError::method_not_allowed());
        }
        // A namespaced kind's all-namespaces collection is read-only.
        if r.kind.res().namespaced && r.ns.is_none() && is_write {
            return Err(ApiError::method_not_allowed());
        }
        let watch = r.watch_path || self.query.flag("watch");
        match (r.name, r.status, m) {
            (_, false, &Method::GET) if watch => self.watch(r),
            (None, _, &Method::GET) => self.list(r),
            (None, _, &Method::POST) if writes_forbidden => forbidden("create"),
            (None, _, &Method::POST) => self.create(r),
            (None, _, &Method::DELETE) if writes_forbidden => forbidden("deletecollection"),
            (None, _, &Method::DELETE) => self.delete_collection(r),
            (Some(name), _, &Method::GET) => self.get(r, name),
            (Some(_), _, &Method::PUT) if writes_forbidden => forbidden("update"),
            (Some(_), _, &Method::PATCH) if writes_forbidden => forbidden("patch"),
            (Some(_), false, &Method::DELETE) if writes_forbidden => forbidden("delete"),
            (Some(name), _, &Method::PUT) => self.update(r, name),
            (Some(name), _, &Method::PATCH) => self.patch(r, name),
            (Some(name), false, &Method::DELETE) => self.delete(r, name),
            _ => Err(ApiError::method_not_allowed()),
        }
    }

    fn key(r: &Route<'_>, name: &str) -> Key {
        Key::new(r.kind, r.ns.unwrap_or_default(), name)
    }

    fn target(r: &Route<'_>) -> Target {
        if r.status {
            Target::Status
        } else {
            Target::Main
        }
    }

    fn list(&self, r: &Route<'_>) -> Result<Response<Body>, ApiError> {
        self.shared.count("list");
        let q = &self.query;
        let req = ListRequest {
            kind: r.kind,
            ns: r.ns.map(str::to_string),
            selectors: q.selectors(r.kind)?,
            limit: q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(0),
            continue_token: q.get("continue").map(str::to_string),
            resource_version: q.get("resourceVersion").map(str::to_string),
            version_match: q.get("resourceVersionMatch").map(str::to_string),
        };
        let page = self.shared.with_state(|st| st.list(&req))?;
        if self.table {
            return Ok(json_value(
                StatusCode::OK,
                &table_of(
                    r.kind,
                    &page.items,
                    Some(page.rv),
                    page.continue_token.as_deref(),
                    self.query.get("includeObject"),
                ),
            ));
        }
        Ok(json_bytes(
            StatusCode::OK,
            list_body(
                r.kind,
                page.rv,
                &page.items,
                page.continue_token.as_deref(),
                page.remaining,
            ),
        ))
    }

    fn get(&self, r: &Route<'_>, name: &str) -> Result<Response<Body>, ApiError> {
        self.shared.count("get");
        let obj = self.shared.with_state(|st| st.get(&Self::key(r, name)))?;
        if self.table {
            return Ok(json_value(
                StatusCode::OK,
                &table_of(r.kind, &[obj], None, None, self.query.get("includeObject")),
            ));
        }
        Ok(json_bytes(StatusCode::OK, obj.full.clone()))
    }

    fn json_body(&self) -> Result<Value, ApiError> {
        match self.content_type.as_str() {
            "" | "application/json" => parse_json(&self.body),
            other => Err(ApiError::unsupported_media(&format!(
                "the body of the request was in an unknown format - accepted media types include: application/json (got {other})"
            ))),
        }
    }

    fn create(&self, r: &Route<'_>) -> Result<Response<Body>, ApiError> {
        self.shared.count("create");
        let v = self.json_body()?;
        let mode = WriteMode {
            target: Target::Main,
            dry_run: self.query.dry_run(),
        };
        let obj = self
            .shared
            .with_state(|st| st.create(r.kind, r.ns, v, mode))?;
        Ok(json_bytes(StatusCode::CREATED, obj.full.clone()))
    }

    fn update(&self, r: &Route<'_>, name: &str) -> Result<Response<Body>, ApiError> {
        self.shared.count("update");
        let v = self.json_body()?;
        let mode = WriteMode {
            target: Self::target(r),
            dry_run: self.query.dry_run(),
        };
        let obj = self
            .shared
            .with_state(|st| st.update(&Self::key(r, name), v, mode))?;
        Ok(json_bytes(StatusCode::OK, obj.full.clone()))
    }

    fn patch(&self, r: &Route<'_>, name: &str) -> Result<Response<Body>, ApiError> {
        self.shared.count("patch");
        let kind = match self.content_type.as_str() {
            "application/merge-patch+json" => PatchKind::Merge,
            "application/strategic-merge-patch+json" => PatchKind::Strategic,
            "application/json-patch+json" => PatchKind::Json,
            _ => {
                return Err(ApiError::unsupported_media(
                    "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json",
                ));
            }
        };
        let body = parse_json(&self.body)?;
        let mode = WriteMode {
            target: Self::target(r),
            dry_run: self.query.dry_run(),
        };
        let key = Self::key(r, name);
        let obj = self
            .shared
            .with_state(|st| st.patch(&key, kind, &body, mode))?;
        Ok(json_bytes(StatusCode::OK, obj.full.clone()))
    }

    fn delete_options(&self) -> Result<(Option<String>, Option<String>, bool), ApiError> {
        let opts = if self.body.is_empty() {
            json!({})
        } else {
            parse_json(&self.body)?
        };
        let pre = |k: &str| {
            opts.pointer(&format!("/preconditions/{k}"))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let dry = self.query.dry_run()
            || opts
                .get("dryRun")
                .and_then(Value::as_array)
                .is_some_and(|a| a.iter().any(|v| v == "All"));
        Ok((pre("uid"), pre("resourceVersion"), dry))
    }

    fn delete(&self, r: &Route<'_>, name: &str) -> Result<Response<Body>, ApiError> {
        self.shared.count("delete");
        let (uid, rv, dry) = self.delete_options()?;
        let key = Self::key(r, name);
        let (obj, gone) = self
            .shared
            .with_state(|st| st.delete(&key, uid.as_deref(), rv.as_deref(), dry))?;
        if !gone {
            return Ok(json_bytes(StatusCode::OK, obj.full.clone()));
        }
        Ok(json_value(StatusCode::OK, &success_status(&obj)))
    }

    fn delete_collection(&self, r: &Route<'_>) -> Result<Response<Body>, ApiError> {
        self.shared.count("deletecollection");
        let selectors = self.query.selectors(r.kind)?;
        let (_, _, dry) = self.delete_options()?;
        let items = self.shared.with_state(|st| {
            let keys: Vec<Key> = st
                .of_kind(r.kind, r.ns)
                .filter(|o| selectors.matches(o))
                .map(|o| o.key())
                .collect();
            let mut deleted = Vec::new();
            for key in keys {
                if let Ok((obj, _)) = st.delete(&key, None, None, dry) {
                    deleted.push(obj);
                }
            }
            (st.rv, deleted)
        });
        Ok(json_bytes(
            StatusCode::OK,
            list_body(r.kind, items.0, &items.1, None, None),
        ))
    }
}
