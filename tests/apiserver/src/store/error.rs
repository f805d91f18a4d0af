//! Failures with the real server's codes, reasons and messages, as the
//! `Status` objects clients parse.

use serde_json::{Value, json};

use super::resource::Kind;

/// One field error of an `Invalid` answer: `field.Error` of apimachinery.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Cause {
    pub(crate) field: String,
    /// `FieldValueInvalid`, `FieldValueRequired`, `FieldValueForbidden`, ...
    pub(crate) reason: &'static str,
    /// The error body: `Invalid value: 80: must be ...`.
    pub(crate) message: String,
}

/// A failure as the API server reports it: a `Status` object.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub(crate) code: u16,
    pub(crate) reason: &'static str,
    pub(crate) message: String,
    pub(crate) details: Option<Value>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: String, details: Option<Value>) -> Self {
        Self {
            code,
            reason,
            message,
            details,
        }
    }
    /// The details every per-object error carries: name, group and the
    /// resource (which the API calls `kind` there).
    fn details(kind: Kind, name: &str) -> Value {
        let mut d = json!({"name": name, "kind": kind.res().plural});
        if !kind.res().group.is_empty()
            && let Value::Object(m) = &mut d
        {
            m.insert("group".into(), json!(kind.res().group));
        }
        d
    }
    pub(crate) fn not_found(kind: Kind, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", kind.qualified_resource()),
            Some(Self::details(kind, name)),
        )
    }
    /// RBAC's answer to a verb the caller's role does not grant.
    pub(crate) fn forbidden(verb: &str, resource: &str, name: &str) -> Self {
        Self::new(
            403,
            "Forbidden",
            format!(
                "{resource} \"{name}\" is forbidden: User \"system:serviceaccount:kube-system:mycni-agent\" cannot {verb} resource \"{resource}\" in API group \"\" at the cluster scope"
            ),
            Some(json!({"name": name, "kind": resource})),
        )
    }
    pub(crate) fn no_route() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource".into(),
            Some(json!({})),
        )
    }
    pub(crate) fn already_exists(kind: Kind, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", kind.qualified_resource()),
            Some(Self::details(kind, name)),
        )
    }
    pub(crate) fn conflict(kind: Kind, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                kind.qualified_resource()
            ),
            Some(Self::details(kind, name)),
        )
    }
    pub(crate) fn modified(kind: Kind, name: &str) -> Self {
        Self::conflict(
            kind,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }
    pub(crate) fn bad_request(message: &str) -> Self {
        Self::new(400, "BadRequest", message.into(), None)
    }
    /// `422 Invalid` with one cause per field error, as `NewInvalid` builds it.
    pub(crate) fn invalid(kind: Kind, name: &str, causes: &[Cause]) -> Self {
        let text: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        let text = if text.len() == 1 {
            text.join("")
        } else {
            format!("[{}]", text.join(", "))
        };
        let list: Vec<Value> = causes
            .iter()
            .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
            .collect();
        let mut details = json!({"name": name, "kind": kind.res().kind, "causes": list});
        if !kind.res().group.is_empty()
            && let Value::Object(m) = &mut details
        {
            m.insert("group".into(), json!(kind.res().group));
        }
        Self::new(
            422,
            "Invalid",
            format!("{} \"{name}\" is invalid: {text}", kind.qualified_kind()),
            Some(details),
        )
    }
    /// A 422 without details, as a failed JSON patch reports it.
    pub(crate) fn unprocessable(message: &str) -> Self {
        Self::new(422, "Invalid", message.into(), None)
    }
    pub(crate) fn expired(message: String) -> Self {
        Self::new(410, "Expired", message, None)
    }
    pub(crate) fn too_large_rv(want: u64, have: u64) -> Self {
        Self::new(
            504,
            "Timeout",
            format!("Too large resource version: {want}, current: {have}"),
            Some(json!({"causes": [{"reason": "ResourceVersionTooLarge",
                                     "message": "Too large resource version"}],
                        "retryAfterSeconds": 1})),
        )
    }
    pub(crate) fn unsupported_media(message: &str) -> Self {
        Self::new(415, "UnsupportedMediaType", message.into(), None)
    }
    pub(crate) fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource".into(),
            Some(json!({})),
        )
    }
    pub(crate) fn internal(message: &str) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {message}"),
            Some(json!({"causes": [{"message": message}]})),
        )
    }

    /// The `Status` object.
    pub(crate) fn status(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let (Some(d), Value::Object(m)) = (&self.details, &mut v) {
            m.insert("details".into(), d.clone());
        }
        v
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}
