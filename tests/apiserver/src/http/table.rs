//! The server-side Table `kubectl get` prints: the frame and the row
//! objects; `rows` has each kind's columns and cells.

use std::sync::Arc;

use serde_json::{Value, json};

use super::rows;
use crate::store::{Kind, Stored};

/// A row's `object`: as `includeObject` asks, metadata only by default.
fn row_object(obj: &Stored, include: Option<&str>) -> Value {
    match include {
        Some("None") => Value::Null,
        Some("Object") => obj.value.clone(),
        _ => json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.value.get("metadata").cloned().unwrap_or(json!({}))
        }),
    }
}

/// The `meta.k8s.io/v1` Table the real server renders for `kind`.
pub(super) fn table_of(
    kind: Kind,
    items: &[Arc<Stored>],
    rv: Option<u64>,
    cont: Option<&str>,
    include: Option<&str>,
) -> Value {
    let columns: Vec<Value> = rows::columns(kind)
        .iter()
        .map(|(name, format, priority, description)| {
            json!({"name": name, "type": "string", "format": format,
                   "description": description, "priority": priority})
        })
        .collect();
    let rows: Vec<Value> = items
        .iter()
        .filter_map(|o| {
            let cells = rows::cells(o)?;
            Some(json!({"cells": cells, "object": row_object(o, include)}))
        })
        .collect();
    let mut meta = json!({});
    if let Value::Object(m) = &mut meta {
        if let Some(rv) = rv {
            m.insert("resourceVersion".into(), json!(rv.to_string()));
        }
        if let Some(c) = cont {
            m.insert("continue".into(), json!(c));
        }
    }
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": columns,
        "rows": rows
    })
}
