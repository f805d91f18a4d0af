//! Writes: create, update (PUT, patches and the fixture's own changes),
//! patch and delete, with the real server's preconditions and finalizers.

use std::sync::Arc;

use serde_json::{Value, json};

use super::State;
use super::decode::{check_type, decode, meta_mut, new_uid, now_time, random_u64, validate};
use super::error::ApiError;
use super::object::{EventType, PatchKind, Stored, Target};
use crate::patch;

impl State {
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
            // The real node status strategy (nodeStatusStrategy in
            // pkg/registry/core/node/strategy.go): PrepareForUpdate puts the
            // old spec back and GetResetFields resets `spec` only, so status
            // and metadata (labels, annotations) are written as sent. flannel
            // writes its node annotations this way, with `patch` on
            // nodes/status alone.
            Target::Status => {
                match old.value.get("spec") {
                    Some(s) => obj.insert("spec".into(), s.clone()),
                    None => obj.remove("spec"),
                };
                value
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
}
