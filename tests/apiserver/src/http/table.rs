//! The server-side Table `kubectl get` prints: the frame, the row objects
//! and the age format; `rows` has each kind's columns and cells.

use std::sync::Arc;

use serde_json::{Value, json};

use super::rows;
use crate::store::{Kind, Stored};

/// `kubectl`'s age format.
pub(super) fn human_age(secs: i64) -> String {
    let s = secs.max(0);
    match s {
        0..120 => format!("{s}s"),
        120..600 => format!("{}m{}s", s / 60, s % 60),
        600..10_800 => format!("{}m", s / 60),
        10_800..28_800 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        28_800..172_800 => format!("{}h", s / 3600),
        172_800..691_200 => format!("{}d{}h", s / 86_400, (s % 86_400) / 3600),
        691_200..63_072_000 => format!("{}d", s / 86_400),
        _ => format!("{}y{}d", s / 31_536_000, (s % 31_536_000) / 86_400),
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages() {
        assert_eq!(human_age(5), "5s");
        assert_eq!(human_age(150), "2m30s");
        assert_eq!(human_age(3600), "60m");
        assert_eq!(human_age(5 * 3600 + 60), "5h1m");
        assert_eq!(human_age(3 * 86_400), "3d0h");
    }
}
