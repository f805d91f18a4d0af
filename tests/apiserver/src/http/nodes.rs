//! The Node endpoints other than watch: list, get, create, update, patch,
//! delete and deletecollection.

use hyper::{Response, StatusCode};
use serde_json::{Value, json};

use super::response::{json_bytes, json_value, node_list, parse_json, success_status};
use super::table::table_of;
use super::{Body, Ctx};
use crate::store::{ApiError, ListRequest, PatchKind, Target};

impl Ctx {
    pub(super) fn list(&self) -> Result<Response<Body>, ApiError> {
        self.shared.count("list");
        let q = &self.query;
        let req = ListRequest {
            selectors: q.selectors()?,
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
                    &page.items,
                    Some(page.rv),
                    page.continue_token.as_deref(),
                    self.query.get("includeObject"),
                ),
            ));
        }
        Ok(json_bytes(
            StatusCode::OK,
            node_list(
                page.rv,
                &page.items,
                page.continue_token.as_deref(),
                page.remaining,
            ),
        ))
    }

    pub(super) fn get(&self, name: &str) -> Result<Response<Body>, ApiError> {
        self.shared.count("get");
        let obj = self.shared.with_state(|st| st.get(name))?;
        if self.table {
            return Ok(json_value(
                StatusCode::OK,
                &table_of(&[obj], None, None, self.query.get("includeObject")),
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

    pub(super) fn create(&self) -> Result<Response<Body>, ApiError> {
        self.shared.count("create");
        let v = self.json_body()?;
        let dry = self.query.dry_run();
        let obj = self
            .shared
            .with_state(|st| st.create(v, Target::Main, dry))?;
        Ok(json_bytes(StatusCode::CREATED, obj.full.clone()))
    }

    pub(super) fn update(&self, name: &str, target: Target) -> Result<Response<Body>, ApiError> {
        self.shared.count("update");
        let v = self.json_body()?;
        let dry = self.query.dry_run();
        let obj = self
            .shared
            .with_state(|st| st.update(name, v, target, dry))?;
        Ok(json_bytes(StatusCode::OK, obj.full.clone()))
    }

    pub(super) fn patch(&self, name: &str, target: Target) -> Result<Response<Body>, ApiError> {
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
        let dry = self.query.dry_run();
        let obj = self
            .shared
            .with_state(|st| st.patch(name, kind, &body, target, dry))?;
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

    pub(super) fn delete(&self, name: &str) -> Result<Response<Body>, ApiError> {
        self.shared.count("delete");
        let (uid, rv, dry) = self.delete_options()?;
        let (obj, gone) = self
            .shared
            .with_state(|st| st.delete(name, uid.as_deref(), rv.as_deref(), dry))?;
        if !gone {
            return Ok(json_bytes(StatusCode::OK, obj.full.clone()));
        }
        Ok(json_value(StatusCode::OK, &success_status(&obj)))
    }

    pub(super) fn delete_collection(&self) -> Result<Response<Body>, ApiError> {
        self.shared.count("deletecollection");
        let selectors = self.query.selectors()?;
        let (_, _, dry) = self.delete_options()?;
        let items = self.shared.with_state(|st| {
            let names: Vec<String> = st
                .nodes
                .values()
                .filter(|o| selectors.matches(o))
                .map(|o| o.name.clone())
                .collect();
            let mut deleted = Vec::new();
            for name in names {
                if let Ok((obj, _)) = st.delete(&name, None, None, dry) {
                    deleted.push(obj);
                }
            }
            (st.rv, deleted)
        });
        Ok(json_bytes(
            StatusCode::OK,
            node_list(items.0, &items.1, None, None),
        ))
    }
}
