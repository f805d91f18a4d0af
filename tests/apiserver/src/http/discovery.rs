//! Discovery, version and OpenAPI, generated from the kinds in
//! `store::Kind`: just what kube-rs and kubectl ask for before they touch
//! a resource.

use bytes::Bytes;
use hyper::{Response, StatusCode};
use serde_json::{Value, json};

use super::response::{full, json_value};
use super::{Body, Ctx};
use crate::store::Kind;

pub(super) fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": "v1.33.0",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-04-23T00:00:00Z",
        "goVersion": "go1.24.2",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

const OPENAPI_HASH: &str = "6D7E3F2A1B0C9D8E";

/// The API groups besides the legacy core group, each with its one version.
fn groups() -> Vec<&'static str> {
    let mut g: Vec<&str> = Kind::ALL
        .iter()
        .map(|k| k.res().group)
        .filter(|g| !g.is_empty())
        .collect();
    g.dedup();
    g
}

fn group_value(group: &str) -> Value {
    let gv = json!({"groupVersion": format!("{group}/v1"), "version": "v1"});
    json!({"name": group, "versions": [gv], "preferredVersion": gv})
}

/// `/apis`: the legacy (unaggregated) group list, which kubectl reads when
/// the answer is plain `application/json`.
pub(super) fn api_group_list() -> Value {
    let groups: Vec<Value> = groups().into_iter().map(group_value).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/{group}`.
pub(super) fn api_group(group: &str) -> Option<Value> {
    groups().contains(&group).then(|| {
        let mut g = group_value(group);
        if let Value::Object(m) = &mut g {
            m.insert("kind".into(), json!("APIGroup"));
            m.insert("apiVersion".into(), json!("v1"));
        }
        g
    })
}

/// `/api/v1` and `/apis/{group}/{version}`: each kind and its `/status`.
pub(super) fn api_resource_list(group: &str, version: &str) -> Value {
    let mut resources = Vec::new();
    for kind in Kind::of_group(group, version) {
        let r = kind.res();
        resources.push(json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
            "shortNames": r.short_names,
            "storageVersionHash": r.storage_hash
        }));
        if r.status {
            resources.push(json!({
                "name": format!("{}/status", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": ["get", "patch", "update"]
            }));
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})
}

/// `/openapi/v3`: where each group version's document is.
pub(super) fn openapi_v3_index() -> Value {
    let mut paths = serde_json::Map::new();
    paths.insert(
        "api/v1".into(),
        json!({"serverRelativeURL": format!("/openapi/v3/api/v1?hash={OPENAPI_HASH}")}),
    );
    for g in groups() {
        paths.insert(
            format!("apis/{g}/v1"),
            json!({"serverRelativeURL": format!("/openapi/v3/apis/{g}/v1?hash={OPENAPI_HASH}")}),
        );
    }
    json!({ "paths": paths })
}

/// Just enough OpenAPI v3 for kubectl: each kind's PATCH operation accepts
/// `fieldValidation`, so kubectl's default validation (`--validate=strict`)
/// is left to the server (which this fixture does not do) instead of
/// downloading the v2 schema. The operations declare no request body, so
/// `kubectl apply` computes its strategic merge patch from its own
/// compiled-in types, as it does for every built-in kind.
pub(super) fn openapi_v3(group: &str, version: &str) -> Value {
    let params = json!([
        {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
        {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
        {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}}
    ]);
    let mut paths = serde_json::Map::new();
    for kind in Kind::of_group(group, version) {
        let r = kind.res();
        let gvk = json!({"group": group, "version": version, "kind": r.kind});
        let op = |verb: &str, suffix: &str, action: &str| {
            json!({"operationId": format!("{verb}{}{suffix}", r.kind), "parameters": params,
                   "responses": {"200": {"description": "OK"}},
                   "x-kubernetes-action": action, "x-kubernetes-group-version-kind": gvk})
        };
        let prefix = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let collection = if r.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}", r.plural)
        } else {
            format!("{prefix}/{}", r.plural)
        };
        paths.insert(
            collection.clone(),
            json!({"post": op("create", "", "post")}),
        );
        paths.insert(
            format!("{collection}/{{name}}"),
            json!({"put": op("replace", "", "put"), "patch": op("patch", "", "patch")}),
        );
        if r.status {
            paths.insert(
                format!("{collection}/{{name}}/status"),
                json!({"put": op("replace", "Status", "put"), "patch": op("patch", "Status", "patch")}),
            );
        }
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": paths,
        "components": {}
    })
}

impl Ctx {
    pub(super) fn discovery(&self, v: Value) -> Response<Body> {
        self.shared.count("discovery");
        json_value(StatusCode::OK, &v)
    }

    /// An OpenAPI v2 document without definitions: kubectl's client-side
    /// validation finds no schema for a kind and lets it through. kubectl asks
    /// for protobuf (gnostic `openapi_v2.Document`); field 1 is `swagger`.
    pub(super) fn openapi_v2(&self, accept: &str) -> Response<Body> {
        self.shared.count("discovery");
        if accept.contains("protobuf") {
            return full(
                StatusCode::OK,
                "application/octet-stream",
                Bytes::from_static(b"\x0a\x032.0"),
            );
        }
        json_value(
            StatusCode::OK,
            &json!({"swagger": "2.0", "info": {"title": "Kubernetes", "version": "v1.33.0"},
                    "paths": {}, "definitions": {}}),
        )
    }

    pub(super) fn root(&self) -> Response<Body> {
        let mut paths = vec![
            "/api".to_string(),
            "/api/v1".to_string(),
            "/apis".to_string(),
        ];
        for g in groups() {
            paths.push(format!("/apis/{g}"));
            paths.push(format!("/apis/{g}/v1"));
        }
        paths.extend(
            [
                "/healthz",
                "/livez",
                "/openapi/v2",
                "/openapi/v3",
                "/readyz",
                "/version",
            ]
            .map(String::from),
        );
        self.discovery(json!({ "paths": paths }))
    }
}
