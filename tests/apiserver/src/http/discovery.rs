//! Discovery, version and OpenAPI: just what kube-rs and kubectl ask for
//! before they touch Nodes.

use bytes::Bytes;
use hyper::{Response, StatusCode};
use serde_json::{Value, json};

use super::response::{full, json_value};
use super::{Body, Ctx};

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

pub(super) const OPENAPI_HASH: &str = "6D7E3F2A1B0C9D8E";

/// Just enough OpenAPI v3 for kubectl: the Node PATCH operation accepts
/// `fieldValidation`, so kubectl leaves validation to the server (which
/// this fixture does not do) instead of downloading the v2 schema.
pub(super) fn openapi_v3_api_v1() -> Value {
    let gvk = json!({"group": "", "version": "v1", "kind": "Node"});
    let params = json!([
        {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
        {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
        {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}}
    ]);
    let op = |id: &str, action: &str| {
        json!({"operationId": id, "tags": ["core_v1"], "parameters": params,
               "responses": {"200": {"description": "OK"}},
               "x-kubernetes-action": action, "x-kubernetes-group-version-kind": gvk})
    };
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": {
            "/api/v1/nodes": {"post": op("createCoreV1Node", "post")},
            "/api/v1/nodes/{name}": {
                "put": op("replaceCoreV1Node", "put"),
                "patch": op("patchCoreV1Node", "patch")
            },
            "/api/v1/nodes/{name}/status": {
                "put": op("replaceCoreV1NodeStatus", "put"),
                "patch": op("patchCoreV1NodeStatus", "patch")
            }
        },
        "components": {}
    })
}

pub(super) fn api_v1() -> Value {
    json!({
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [
            {
                "name": "nodes",
                "singularName": "node",
                "namespaced": false,
                "kind": "Node",
                "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
                "shortNames": ["no"],
                "storageVersionHash": "XwShjMxG9Fs="
            },
            {
                "name": "nodes/status",
                "singularName": "",
                "namespaced": false,
                "kind": "Node",
                "verbs": ["get", "patch", "update"]
            }
        ]
    })
}

impl Ctx {
    pub(super) fn discovery(&self, v: Value) -> Response<Body> {
        self.shared.count("discovery");
        json_value(StatusCode::OK, &v)
    }

    /// An OpenAPI v2 document without definitions: kubectl's client-side
    /// validation finds no schema for Node and lets it through. kubectl asks
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
        self.discovery(json!({"paths": [
            "/api", "/api/v1", "/apis", "/healthz", "/livez", "/openapi/v2", "/openapi/v3",
            "/readyz", "/version"
        ]}))
    }
}
