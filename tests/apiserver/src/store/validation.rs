//! Field validation the kinds share, with apimachinery's messages: names,
//! labels, label selectors and CIDRs, collected as field errors so one
//! `422 Invalid` reports them all, as the real server does.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use mycni_common::net::Cidr;
use serde_json::{Value, json};

use super::error::{ApiError, Cause};
use super::resource::Kind;

/// The field errors of one object.
#[derive(Debug, Default)]
pub(crate) struct Causes(Vec<Cause>);

impl Causes {
    fn push(&mut self, field: &str, reason: &'static str, message: String) {
        self.0.push(Cause {
            field: field.to_string(),
            reason,
            message,
        });
    }

    /// `field.Invalid`: the value as Go's `%v`/`%q` prints it, then why.
    pub(crate) fn invalid(&mut self, field: &str, value: &Value, why: &str) {
        self.push(
            field,
            "FieldValueInvalid",
            format!("Invalid value: {value}: {why}"),
        );
    }

    pub(crate) fn required(&mut self, field: &str, why: &str) {
        let msg = if why.is_empty() {
            "Required value".to_string()
        } else {
            format!("Required value: {why}")
        };
        self.push(field, "FieldValueRequired", msg);
    }

    pub(crate) fn forbidden(&mut self, field: &str, why: &str) {
        self.push(field, "FieldValueForbidden", format!("Forbidden: {why}"));
    }

    pub(crate) fn not_supported(&mut self, field: &str, value: &Value, supported: &[&str]) {
        let list: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
        self.push(
            field,
            "FieldValueNotSupported",
            format!(
                "Unsupported value: {value}: supported values: {}",
                list.join(", ")
            ),
        );
    }

    pub(crate) fn into_result(self, kind: Kind, name: &str) -> Result<(), ApiError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(ApiError::invalid(kind, name, &self.0))
        }
    }
}

const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const QUALIFIED_NAME_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b.first() != Some(&b'-')
        && b.last() != Some(&b'-')
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, at most 63: a label value
/// (non-empty) or the name part of a qualified name.
fn is_qualified_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// Metadata name rules: most kinds take a DNS-1123 subdomain, Namespaces a label.
pub(crate) fn name(causes: &mut Causes, name: &str, label: bool) {
    let ok = if label {
        is_dns_label(name)
    } else {
        is_dns_subdomain(name)
    };
    if !ok {
        let msg = if label {
            DNS1123_LABEL_MSG
        } else {
            DNS1123_SUBDOMAIN_MSG
        };
        causes.invalid("metadata.name", &json!(name), msg);
    }
}

/// A label key: `[prefix/]name`, the prefix a DNS subdomain.
fn label_key(causes: &mut Causes, field: &str, key: &str) {
    let (prefix, part) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if prefix.is_some_and(|p| !is_dns_subdomain(p)) {
        causes.invalid(
            field,
            &json!(key),
            &format!("prefix part {DNS1123_SUBDOMAIN_MSG}"),
        );
    }
    if !is_qualified_part(part) {
        causes.invalid(field, &json!(key), QUALIFIED_NAME_MSG);
    }
}

fn label_value(causes: &mut Causes, field: &str, value: &str) {
    if !value.is_empty() && !is_qualified_part(value) {
        causes.invalid(field, &json!(value), LABEL_VALUE_MSG);
    }
}

pub(crate) fn labels(causes: &mut Causes, field: &str, labels: &BTreeMap<String, String>) {
    for (k, v) in labels {
        label_key(causes, field, k);
        label_value(causes, field, v);
    }
}

/// `ValidateLabelSelector`: operators, the values each operator needs,
/// keys and values that could be labels.
pub(crate) fn label_selector(causes: &mut Causes, field: &str, sel: &LabelSelector) {
    for (i, req) in sel.match_expressions.iter().flatten().enumerate() {
        let path = format!("{field}.matchExpressions[{i}]");
        let values = req.values.as_deref().unwrap_or_default();
        match req.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => causes.required(
                &format!("{path}.values"),
                "must be specified when `operator` is 'In' or 'NotIn'",
            ),
            "Exists" | "DoesNotExist" if !values.is_empty() => causes.forbidden(
                &format!("{path}.values"),
                "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
            ),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => causes.invalid(
                &format!("{path}.operator"),
                &json!(other),
                "not a valid selector operator",
            ),
        }
        label_key(causes, &format!("{path}.key"), &req.key);
        for (j, v) in values.iter().enumerate() {
            label_value(causes, &format!("{path}.values[{j}]"), v);
        }
    }
    if let Some(m) = &sel.match_labels {
        labels(causes, &format!("{field}.matchLabels"), m);
    }
}

/// A CIDR as the API server takes one (`10.0.0.1/8` too: host bits are
/// allowed, and cleared here), in mycni-common's syntax, the workspace's one
/// CIDR parser (no sign or leading zero in the prefix length).
pub(crate) fn parse_cidr(s: &str) -> Option<Cidr> {
    s.parse::<Cidr>().ok().map(Cidr::trunc)
}

/// Whether `inner` is a strict subset of `outer`: same family, longer
/// prefix, inside it.
pub(crate) fn strictly_contains(outer: Cidr, inner: Cidr) -> bool {
    inner.prefix() > outer.prefix() && outer.covers(inner)
}

pub(crate) const CIDR_MSG: &str = "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs() {
        let c = |s| parse_cidr(s).expect(s);
        assert!(strictly_contains(c("10.0.0.0/8"), c("10.1.0.0/16")));
        assert!(!strictly_contains(c("10.0.0.0/8"), c("10.0.0.0/8")));
        assert!(!strictly_contains(c("10.0.0.0/8"), c("11.0.0.0/16")));
        assert!(!strictly_contains(c("10.0.0.0/8"), c("::/64")));
        assert!(strictly_contains(c("2001:db8::/32"), c("2001:db8:1::/48")));
        assert_eq!(c("0.0.0.0/0").prefix(), 0);
        // Host bits are the writer's business; the subset test ignores them.
        assert_eq!(c("10.1.2.3/8"), c("10.0.0.0/8"));
        assert!(strictly_contains(c("10.9.9.9/8"), c("10.1.0.1/16")));
        assert!(parse_cidr("10.0.0.0/33").is_none());
        assert!(parse_cidr("10.0.0.0").is_none());
    }

    #[test]
    fn names_and_labels() {
        let mut c = Causes::default();
        name(&mut c, "a.b", false);
        name(&mut c, "ok", true);
        labels(
            &mut c,
            "metadata.labels",
            &[("kubernetes.io/metadata.name".to_string(), "x".to_string())]
                .into_iter()
                .collect(),
        );
        assert!(c.0.is_empty(), "{c:?}");
        name(&mut c, "a.b", true);
        labels(
            &mut c,
            "metadata.labels",
            &[("-bad".to_string(), "x y".to_string())]
                .into_iter()
                .collect(),
        );
        assert_eq!(c.0.len(), 3, "{c:?}");
    }
}
