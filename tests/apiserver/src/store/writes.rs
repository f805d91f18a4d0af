//! Writes of any kind: create, update (PUT, patches and the fixture's own
//! changes), patch and delete, with the real server's preconditions and
//! finalizers; `kinds` says what each kind's strategy changes on the way.

use std::sync::Arc;

use serde_json::{Value, json};

use super::decode::{check_type, meta_mut, new_uid, now_time, random_u64};
use super::error::ApiError;
use super::kinds;
use super::object::{EventType, Key, PatchKind, Stored, WriteMode};
use super::resource::Kind;
use super::{State, objects_of};
use crate::patch;

impl State {
    /// Creates an object of `kind`; `ns` is the namespace of the URL (a
    /// namespaced kind's body may name the same one or none).
    pub(crate) fn create(
        &mut self,
        kind: Kind,
        ns: Option<&str>,
        mut value: Value,
        mode: WriteMode,
    ) -> Result<Arc<Stored>, ApiError> {
        let WriteMode { target, dry_run } = mode;
        let Value::Object(obj) = &mut value else {
            return Err(ApiError::bad_request(
                "Object 'Kind' is missing in request body",
            ));
        };
        check_type(kind, obj)?;
        kinds::on_create(kind, obj, target);
        let meta = meta_mut(obj);
        let ns = if kind.res().namespaced {
            let body_ns = meta
                .get("namespace")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty());
            let ns = match (ns, body_ns) {
                (Some(url), Some(body)) if url != body => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                (Some(n), _) | (None, Some(n)) => n.to_string(),
                (None, None) => {
                    return Err(ApiError::invalid(
                        kind,
                        "",
                        &[super::error::Cause {
                            field: "metadata.namespace".into(),
                            reason: "FieldValueRequired",
                            message: "Required value".into(),
                        }],
                    ));
                }
            };
            meta.insert("namespace".into(), json!(ns));
            ns
        } else {
            meta.remove("namespace");
            String::new()
        };
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
                    kind,
                    "",
                    &[super::error::Cause {
                        field: "metadata.name".into(),
                        reason: "FieldValueRequired",
                        message: "Required value: name or generateName is required".into(),
                    }],
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
        if rv_set && !target.direct() {
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
        let value = kinds::admit(kind, value, None, target)?;
        if kind.res().namespaced
            && !self
                .objects
                .contains_key(&Key::new(Kind::Namespace, "", &ns))
        {
            return Err(ApiError::not_found(Kind::Namespace, &ns));
        }
        if self.objects.contains_key(&Key::new(kind, &ns, &name)) {
            return Err(ApiError::already_exists(kind, &name));
        }
        if dry_run {
            return Ok(Arc::new(Stored::new(kind, value)?));
        }
        self.commit(kind, EventType::Added, value, None)
    }

    /// Replaces an object (PUT, the result of a patch, or a direct update).
    pub(crate) fn update(
        &mut self,
        key: &Key,
        mut value: Value,
        mode: WriteMode,
    ) -> Result<Arc<Stored>, ApiError> {
        let WriteMode { target, dry_run } = mode;
        let old = self.get(key)?;
        let (kind, name) = (key.kind, key.name.as_str());
        let Value::Object(obj) = &mut value else {
            return Err(ApiError::bad_request(
                "Object 'Kind' is missing in request body",
            ));
        };
        check_type(kind, obj)?;
        let meta = meta_mut(obj);
        if let Some(n) = meta.get("name").and_then(Value::as_str)
            && n != name
        {
            return Err(ApiError::bad_request(&format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            )));
        }
        if !target.direct()
            && let Some(rv) = meta.get("resourceVersion").and_then(Value::as_str)
            && !rv.is_empty()
        {
            let rv: u64 = rv
                .parse()
                .map_err(|_| ApiError::bad_request(&format!("invalid resource version: {rv:?}")))?;
            if rv != old.rv {
                return Err(ApiError::modified(kind, name));
            }
        }
        let old_meta = old.value.get("metadata").cloned().unwrap_or(json!({}));
        if let Some(uid) = meta.get("uid").and_then(Value::as_str)
            && !uid.is_empty()
            && Some(uid) != old_meta.get("uid").and_then(Value::as_str)
        {
            return Err(ApiError::conflict(
                kind,
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
            "namespace",
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
        kinds::on_update(kind, obj, &old.value, target);
        let value = kinds::admit(kind, value, Some(&old.value), target)?;
        let candidate = Stored::new(kind, value.clone())?;
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
            return self.commit_delete(&candidate);
        }
        self.commit(kind, EventType::Modified, value, Some(old))
    }

    pub(crate) fn patch(
        &mut self,
        key: &Key,
        kind: PatchKind,
        body: &Value,
        mode: WriteMode,
    ) -> Result<Arc<Stored>, ApiError> {
        let old = self.get(key)?;
        let mut doc = old.value.clone();
        match kind {
            PatchKind::Merge => patch::merge_patch(&mut doc, body),
            PatchKind::Strategic => patch::strategic_merge_patch(&mut doc, body)
                .map_err(|e| ApiError::bad_request(&e))?,
            PatchKind::Json => {
                patch::json_patch(&mut doc, body).map_err(|e| ApiError::unprocessable(&e))?
            }
        }
        self.update(key, doc, mode)
    }

    /// Deletes an object, or marks it for deletion while it has
    /// finalizers. Returns the object and whether it is gone.
    ///
    /// Deleting a Namespace deletes its Pods and NetworkPolicies first, then
    /// the Namespace, all at once: a simplification of the namespace
    /// controller, which marks the Namespace `Terminating`, deletes its
    /// contents over time (Pods gracefully, through their kubelets) and
    /// removes the Namespace when they are gone. Watchers see the same
    /// DELETED events, in the same order, only sooner. Pods here are
    /// deleted at once too, as an unscheduled Pod is.
    pub(crate) fn delete(
        &mut self,
        key: &Key,
        uid: Option<&str>,
        rv: Option<&str>,
        dry_run: bool,
    ) -> Result<(Arc<Stored>, bool), ApiError> {
        let old = self.get(key)?;
        let (kind, name) = (key.kind, key.name.as_str());
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
                kind,
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
                kind,
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
        if kind == Kind::Namespace {
            let contents: Vec<Key> = [Kind::Pod, Kind::NetworkPolicy]
                .into_iter()
                .flat_map(|k| objects_of(&self.objects, k, Some(name)).map(|o| o.key()))
                .collect();
            for k in contents {
                if let Some(o) = self.objects.get(&k).cloned() {
                    self.commit_delete(&o)?;
                }
            }
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
            let stored = self.commit(kind, EventType::Modified, v, Some(old))?;
            return Ok((stored, false));
        }
        Ok((self.commit_delete(&old)?, true))
    }
}
