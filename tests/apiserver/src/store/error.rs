//! Failures with the real server's codes, reasons and messages, as the
//! `Status` objects clients parse.

use serde_json::{Value, json};

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
    pub(crate) fn not_found(name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("nodes \"{name}\" not found"),
            Some(json!({"name": name, "kind": "nodes"})),
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
    pub(crate) fn already_exists(name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("nodes \"{name}\" already exists"),
            Some(json!({"name": name, "kind": "nodes"})),
        )
    }
    pub(crate) fn conflict(name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on nodes \"{name}\": {why}"),
            Some(json!({"name": name, "kind": "nodes"})),
        )
    }
    pub(crate) fn modified(name: &str) -> Self {
        Self::conflict(
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }
    pub(crate) fn bad_request(message: &str) -> Self {
        Self::new(400, "BadRequest", message.into(), None)
    }
    pub(crate) fn invalid(name: &str, causes: &[(&str, String)]) -> Self {
        let text: Vec<String> = causes.iter().map(|(f, m)| format!("{f}: {m}")).collect();
        let text = if text.len() == 1 {
            text.join("")
        } else {
            format!("[{}]", text.join(", "))
        };
        let causes: Vec<Value> = causes
            .iter()
            .map(|(f, m)| json!({"reason": "FieldValueInvalid", "message": m, "field": f}))
            .collect();
        Self::new(
            422,
            "Invalid",
            format!("Node \"{name}\" is invalid: {text}"),
            Some(json!({"name": name, "kind": "Node", "causes": causes})),
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
