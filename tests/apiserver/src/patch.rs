//! The three patch formats of the Kubernetes API: JSON merge patch (RFC 7386),
//! strategic merge patch (with the merge keys of the served kinds' schemas)
//! and JSON patch (RFC 6902).

use serde_json::{Map, Value};

/// RFC 7386: objects merge recursively, `null` deletes, anything else replaces.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(t) = target {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// How a strategic merge patch treats a list field, from the
/// `patchStrategy`/`patchMergeKey` tags of the core/v1 Go types.
#[derive(Debug, Clone, Copy, PartialEq)]
enum ListStrategy {
    /// No patch strategy: the patch's list replaces the object's.
    Replace,
    /// `patchStrategy:"merge"` on a list of scalars: set union.
    MergeScalars,
    /// `patchStrategy:"merge" patchMergeKey:"<key>"`: items merge by key.
    MergeByKey(&'static str),
}

fn list_strategy(path: &[String]) -> ListStrategy {
    let p: Vec<&str> = path.iter().map(String::as_str).collect();
    match p.as_slice() {
        ["metadata", "finalizers"] | ["spec", "podCIDRs"] => ListStrategy::MergeScalars,
        ["metadata", "ownerReferences"] => ListStrategy::MergeByKey("uid"),
        ["status", "conditions"] | ["status", "addresses"] => ListStrategy::MergeByKey("type"),
        // Pods (the paths of the kinds served do not collide).
        [
            "spec",
            "containers" | "initContainers" | "ephemeralContainers",
        ]
        | ["spec", "volumes" | "imagePullSecrets"]
        | ["spec", "containers" | "initContainers", "env"] => ListStrategy::MergeByKey("name"),
        ["spec", "containers" | "initContainers", "ports"] => {
            ListStrategy::MergeByKey("containerPort")
        }
        ["spec", "containers" | "initContainers", "volumeMounts"] => {
            ListStrategy::MergeByKey("mountPath")
        }
        ["status", "podIPs" | "hostIPs"] => ListStrategy::MergeByKey("ip"),
        // spec.taints, status.images, status.volumesAttached, every list of
        // a NetworkPolicy, ... are atomic.
        _ => ListStrategy::Replace,
    }
}

/// Removes directive keys (`$patch`, `$retainKeys`, ...) from a value taken
/// from a patch as a whole.
fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(
            items
                .iter()
                .filter(|i| !is_directive_item(i))
                .map(strip_directives)
                .collect(),
        ),
        other => other.clone(),
    }
}

fn is_directive_item(item: &Value) -> bool {
    item.as_object()
        .is_some_and(|m| m.len() == 1 && m.contains_key("$patch"))
}

/// Applies a strategic merge patch to an object (as JSON). Both the main
/// resource and the status subresource take a whole-object patch.
pub(crate) fn strategic_merge_patch(target: &mut Value, patch: &Value) -> Result<(), String> {
    let Value::Object(p) = patch else {
        return Err("strategic merge patch must be a JSON object".into());
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else {
        return Ok(());
    };
    if merge_map(t, p, &mut Vec::new())? {
        t.clear();
    }
    Ok(())
}

/// Merges `patch` into `orig`; returns true if the patch asks to delete the map.
fn merge_map(
    orig: &mut Map<String, Value>,
    patch: &Map<String, Value>,
    path: &mut Vec<String>,
) -> Result<bool, String> {
    match patch.get("$patch").and_then(Value::as_str) {
        Some("delete") => return Ok(true),
        Some("replace") => {
            if let Value::Object(m) = strip_directives(&Value::Object(patch.clone())) {
                *orig = m;
            }
            return Ok(false);
        }
        Some("merge") | None => {}
        Some(other) => return Err(format!("unknown patch type: {other}")),
    }
    if let Some(keys) = patch.get("$retainKeys") {
        let keys = keys
            .as_array()
            .ok_or("$retainKeys must be a list of strings")?
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>();
        orig.retain(|k, _| keys.contains(&k.as_str()));
    }
    for (k, v) in patch {
        if k.starts_with('$') {
            continue;
        }
        path.push(k.clone());
        match v {
            Value::Null => {
                orig.remove(k);
            }
            Value::Object(pm) => {
                let slot = orig
                    .entry(k.clone())
                    .or_insert_with(|| Value::Object(Map::new()));
                if !slot.is_object() {
                    *slot = Value::Object(Map::new());
                }
                let delete = match slot {
                    Value::Object(om) => merge_map(om, pm, path)?,
                    _ => false,
                };
                if delete {
                    orig.remove(k);
                }
            }
            Value::Array(items) => {
                let merged = merge_list(orig.get(k), items, path)?;
                orig.insert(k.clone(), merged);
            }
            scalar => {
                orig.insert(k.clone(), scalar.clone());
            }
        }
        path.pop();
    }
    for (k, v) in patch {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            let drop = v
                .as_array()
                .ok_or("$deleteFromPrimitiveList must be a list")?;
            if let Some(Value::Array(list)) = orig.get_mut(field) {
                list.retain(|x| !drop.contains(x));
            }
        }
    }
    Ok(false)
}

fn merge_list(
    orig: Option<&Value>,
    items: &[Value],
    path: &mut Vec<String>,
) -> Result<Value, String> {
    let strategy = list_strategy(path);
    if strategy == ListStrategy::Replace
        || items
            .iter()
            .any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        return Ok(strip_directives(&Value::Array(items.to_vec())));
    }
    let mut out: Vec<Value> = match orig {
        Some(Value::Array(a)) => a.clone(),
        _ => Vec::new(),
    };
    match strategy {
        ListStrategy::Replace => {}
        ListStrategy::MergeScalars => {
            for item in items {
                if item.is_object() || item.is_array() {
                    return Err(format!(
                        "{}: a list with merge strategy of primitives contains a map or list",
                        path.join(".")
                    ));
                }
                if !out.contains(item) {
                    out.push(item.clone());
                }
            }
        }
        ListStrategy::MergeByKey(key) => {
            for item in items {
                let Value::Object(pm) = item else {
                    return Err(format!("{}: list items must be maps", path.join(".")));
                };
                let id = pm.get(key).ok_or_else(|| {
                    format!("map: {item} does not contain declared merge key: {key}")
                })?;
                let pos = out.iter().position(|o| o.get(key) == Some(id));
                if pm.get("$patch").and_then(Value::as_str) == Some("delete") {
                    out.retain(|o| o.get(key) != Some(id));
                    continue;
                }
                match pos {
                    Some(i) => {
                        if let Some(Value::Object(om)) = out.get_mut(i)
                            && merge_map(om, pm, path)?
                        {
                            out.remove(i);
                        }
                    }
                    None => {
                        let mut fresh = Map::new();
                        if !merge_map(&mut fresh, pm, path)? {
                            out.push(Value::Object(fresh));
                        }
                    }
                }
            }
        }
    }
    Ok(Value::Array(out))
}

/// A JSON pointer (RFC 6901) as its unescaped tokens.
fn pointer(p: &str) -> Result<Vec<String>, String> {
    if p.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = p.strip_prefix('/') else {
        return Err(format!(
            "JSON pointer must be empty or start with a \"/\": {p:?}"
        ));
    };
    Ok(rest
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect())
}

fn array_index(token: &str, len: usize, allow_end: bool) -> Result<usize, String> {
    if allow_end && token == "-" {
        return Ok(len);
    }
    let i: usize = token
        .parse()
        .map_err(|_| format!("invalid array index: {token:?}"))?;
    let max = if allow_end {
        len
    } else {
        len.saturating_sub(1)
    };
    if (allow_end && i <= len) || (!allow_end && i < len) {
        Ok(i)
    } else {
        Err(format!("array index out of bounds: {i} (max {max})"))
    }
}

fn get<'a>(doc: &'a Value, tokens: &[String], raw: &str) -> Result<&'a Value, String> {
    let mut cur = doc;
    for t in tokens {
        cur = match cur {
            Value::Object(m) => m.get(t),
            Value::Array(a) => a.get(array_index(t, a.len(), false)?),
            _ => None,
        }
        .ok_or_else(|| format!("doc is missing path: {raw:?}"))?;
    }
    Ok(cur)
}

fn parent_mut<'a>(
    doc: &'a mut Value,
    tokens: &[String],
    raw: &str,
) -> Result<&'a mut Value, String> {
    let mut cur = doc;
    for t in tokens {
        cur = match cur {
            Value::Object(m) => m.get_mut(t),
            Value::Array(a) => {
                let i = array_index(t, a.len(), false)?;
                a.get_mut(i)
            }
            _ => None,
        }
        .ok_or_else(|| format!("doc is missing path: {raw:?}: missing value"))?;
    }
    Ok(cur)
}

fn add(doc: &mut Value, tokens: &[String], value: Value, raw: &str) -> Result<(), String> {
    let Some((last, parents)) = tokens.split_last() else {
        *doc = value;
        return Ok(());
    };
    match parent_mut(doc, parents, raw)? {
        Value::Object(m) => {
            m.insert(last.clone(), value);
            Ok(())
        }
        Value::Array(a) => {
            let i = array_index(last, a.len(), true)?;
            a.insert(i, value);
            Ok(())
        }
        _ => Err(format!(
            "doc is missing path: {raw:?}: parent is not a container"
        )),
    }
}

fn remove(doc: &mut Value, tokens: &[String], raw: &str) -> Result<Value, String> {
    let Some((last, parents)) = tokens.split_last() else {
        return Ok(std::mem::take(doc));
    };
    match parent_mut(doc, parents, raw)? {
        Value::Object(m) => m
            .remove(last)
            .ok_or_else(|| format!("unable to remove nonexistent key: {last}: missing value")),
        Value::Array(a) => {
            let i = array_index(last, a.len(), false)?;
            Ok(a.remove(i))
        }
        _ => Err(format!("doc is missing path: {raw:?}")),
    }
}

/// RFC 6902. Errors stop the patch; the caller discards the partial result.
pub(crate) fn json_patch(doc: &mut Value, ops: &Value) -> Result<(), String> {
    let ops = ops
        .as_array()
        .ok_or("json patch must be a list of operations")?;
    for op in ops {
        let kind = op
            .get("op")
            .and_then(Value::as_str)
            .ok_or("json patch operation without \"op\"")?;
        let raw_path = op
            .get("path")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("{kind} operation without \"path\""))?;
        let path = pointer(raw_path)?;
        let value = || {
            op.get("value")
                .cloned()
                .ok_or_else(|| format!("{kind} operation without \"value\""))
        };
        let from = || -> Result<(String, Vec<String>), String> {
            let raw = op
                .get("from")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("{kind} operation without \"from\""))?;
            Ok((raw.to_string(), pointer(raw)?))
        };
        match kind {
            "add" => add(doc, &path, value()?, raw_path)?,
            "remove" => {
                remove(doc, &path, raw_path)?;
            }
            "replace" => {
                let v = value()?;
                get(doc, &path, raw_path).map_err(|_| {
                    format!("replace operation does not apply: doc is missing key: {raw_path}")
                })?;
                if path.is_empty() {
                    *doc = v;
                } else if let Some((last, parents)) = path.split_last() {
                    match parent_mut(doc, parents, raw_path)? {
                        Value::Object(m) => {
                            m.insert(last.clone(), v);
                        }
                        Value::Array(a) => {
                            let i = array_index(last, a.len(), false)?;
                            a[i] = v;
                        }
                        _ => return Err(format!("doc is missing path: {raw_path:?}")),
                    }
                }
            }
            "move" => {
                let (raw_from, from) = from()?;
                if path.len() > from.len() && path[..from.len()] == from[..] {
                    return Err(format!(
                        "cannot move {raw_from:?} into its own child {raw_path:?}"
                    ));
                }
                let v = remove(doc, &from, &raw_from)?;
                add(doc, &path, v, raw_path)?;
            }
            "copy" => {
                let (raw_from, from) = from()?;
                let v = get(doc, &from, &raw_from)?.clone();
                add(doc, &path, v, raw_path)?;
            }
            "test" => {
                let want = value()?;
                let have = get(doc, &path, raw_path)?;
                if *have != want {
                    return Err(format!("testing value {raw_path} failed: test failed"));
                }
            }
            other => return Err(format!("unexpected kind: {other}")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_rfc7386_examples() {
        let mut t = json!({"a": "b", "c": {"d": "e", "f": "g"}});
        merge_patch(&mut t, &json!({"a": "z", "c": {"f": null}}));
        assert_eq!(t, json!({"a": "z", "c": {"d": "e"}}));
        let mut t = json!({"a": [{"b": "c"}]});
        merge_patch(&mut t, &json!({"a": [1]}));
        assert_eq!(t, json!({"a": [1]}));
    }

    #[test]
    fn strategic_conditions_merge_by_type() {
        let mut t = json!({"status": {"conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "MemoryPressure", "status": "False"}
        ]}, "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]}});
        strategic_merge_patch(
            &mut t,
            &json!({"status": {"conditions": [
                {"type": "NetworkUnavailable", "status": "False"},
                {"type": "Ready", "status": "False"},
                {"type": "MemoryPressure", "$patch": "delete"}
            ]}, "spec": {"taints": [{"key": "b", "effect": "NoExecute"}]}}),
        )
        .expect("patch");
        assert_eq!(
            t,
            json!({"status": {"conditions": [
                {"type": "Ready", "status": "False"},
                {"type": "NetworkUnavailable", "status": "False"}
            ]}, "spec": {"taints": [{"key": "b", "effect": "NoExecute"}]}})
        );
        let mut t = json!({"metadata": {"finalizers": ["a", "b"]}});
        strategic_merge_patch(
            &mut t,
            &json!({"metadata": {"finalizers": ["c"], "$deleteFromPrimitiveList/finalizers": ["a"]}}),
        )
        .expect("patch");
        assert_eq!(t, json!({"metadata": {"finalizers": ["b", "c"]}}));
        assert!(
            strategic_merge_patch(
                &mut t,
                &json!({"status": {"conditions": [{"status": "x"}]}})
            )
            .is_err()
        );
    }

    #[test]
    fn strategic_pod_containers_merge_by_name() {
        let mut t = json!({"spec": {"containers": [
            {"name": "a", "image": "x", "ports": [{"containerPort": 80, "name": "http"}]},
            {"name": "b", "image": "y"}
        ]}});
        strategic_merge_patch(
            &mut t,
            &json!({"spec": {"containers": [
                {"name": "a", "ports": [{"containerPort": 81}]},
                {"name": "b", "$patch": "delete"}
            ]}}),
        )
        .expect("patch");
        assert_eq!(
            t,
            json!({"spec": {"containers": [
                {"name": "a", "image": "x", "ports": [{"containerPort": 80, "name": "http"}, {"containerPort": 81}]}
            ]}})
        );
    }

    #[test]
    fn json_patch_ops() {
        let mut t = json!({"metadata": {"annotations": {"a/b": "1"}}, "l": [1, 2]});
        json_patch(
            &mut t,
            &json!([
                {"op": "test", "path": "/metadata/annotations/a~1b", "value": "1"},
                {"op": "add", "path": "/metadata/annotations/mycni.dev~1vtep-mac", "value": "x"},
                {"op": "replace", "path": "/metadata/annotations/a~1b", "value": "2"},
                {"op": "add", "path": "/l/-", "value": 3},
                {"op": "add", "path": "/l/0", "value": 0},
                {"op": "remove", "path": "/l/1"},
                {"op": "copy", "from": "/l", "path": "/m"},
                {"op": "move", "from": "/m", "path": "/n"}
            ]),
        )
        .expect("patch");
        assert_eq!(
            t,
            json!({"metadata": {"annotations": {"a/b": "2", "mycni.dev/vtep-mac": "x"}},
                   "l": [0, 2, 3], "n": [0, 2, 3]})
        );
        assert!(json_patch(&mut t, &json!([{"op": "test", "path": "/l/0", "value": 9}])).is_err());
        assert!(
            json_patch(
                &mut t,
                &json!([{"op": "replace", "path": "/zz", "value": 9}])
            )
            .is_err()
        );
        assert!(json_patch(&mut t, &json!([{"op": "add", "path": "/x/y", "value": 9}])).is_err());
        assert!(json_patch(&mut t, &json!([{"op": "remove", "path": "/l/7"}])).is_err());
    }
}
