//! Label and field selectors, as the API server parses them.

use std::collections::BTreeMap;

use super::Stored;
use super::resource::Kind;

#[derive(Debug, Clone, PartialEq)]
enum Requirement {
    Eq(String, String),
    Ne(String, String),
    Exists(String),
    NotExists(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// `labelSelector`: equality (`k=v`, `k==v`, `k!=v`), existence (`k`, `!k`)
/// and set-based (`k in (a,b)`, `k notin (a,b)`) requirements, ANDed.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct LabelSelector(Vec<Requirement>);

/// Splits at commas outside parentheses.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn check_key(key: &str, whole: &str) -> Result<String, String> {
    let ok = !key.is_empty()
        && key.len() <= 317
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if ok {
        Ok(key.to_string())
    } else {
        Err(format!("unable to parse requirement: {whole}"))
    }
}

fn check_value(value: &str, whole: &str) -> Result<String, String> {
    let ok = value.len() <= 63
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(value.to_string())
    } else {
        Err(format!(
            "unable to parse requirement: values[0][{whole}]: Invalid value: \"{value}\""
        ))
    }
}

impl LabelSelector {
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self(reqs));
        }
        for term in split_top_level(s) {
            let t = term.trim();
            if t.is_empty() {
                return Err(format!("found '', expected: identifier in selector {s:?}"));
            }
            if let Some(rest) = t.strip_prefix('!') {
                reqs.push(Requirement::NotExists(check_key(rest.trim(), t)?));
            } else if let Some(open) = t.find('(') {
                let close = t
                    .rfind(')')
                    .filter(|&c| c > open && t[c + 1..].trim().is_empty())
                    .ok_or_else(|| format!("unable to parse requirement: {t}"))?;
                let head: Vec<&str> = t[..open].split_whitespace().collect();
                let values = t[open + 1..close]
                    .split(',')
                    .map(|v| check_value(v.trim(), t))
                    .collect::<Result<Vec<_>, _>>()?;
                match head.as_slice() {
                    [key, "in"] => reqs.push(Requirement::In(check_key(key, t)?, values)),
                    [key, "notin"] => reqs.push(Requirement::NotIn(check_key(key, t)?, values)),
                    _ => return Err(format!("unable to parse requirement: {t}")),
                }
            } else if let Some((k, v)) = t.split_once("!=") {
                reqs.push(Requirement::Ne(
                    check_key(k.trim(), t)?,
                    check_value(v.trim(), t)?,
                ));
            } else if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
                reqs.push(Requirement::Eq(
                    check_key(k.trim(), t)?,
                    check_value(v.trim(), t)?,
                ));
            } else {
                reqs.push(Requirement::Exists(check_key(t, t)?));
            }
        }
        Ok(Self(reqs))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Eq(k, v) => labels.get(k) == Some(v),
            Requirement::Ne(k, v) => labels.get(k) != Some(v),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::NotExists(k) => !labels.contains_key(k),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
        })
    }
}

/// `fieldSelector`: `=`, `==` and `!=` on the field labels the kind
/// supports (`Resource::fields`), the only ones the real server accepts.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    pub(crate) fn parse(kind: Kind, s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self(reqs));
        }
        let res = kind.res();
        for term in s.split(',') {
            let t = term.trim();
            let (field, equal, value) = if let Some((f, v)) = t.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
                (f, true, v)
            } else {
                return Err(format!("invalid selector: '{s}'; can't understand '{t}'"));
            };
            let field = field.trim();
            let known = field == "metadata.name"
                || (res.namespaced && field == "metadata.namespace")
                || res.fields.iter().any(|(f, _)| *f == field);
            if !known {
                return Err(format!("field label not supported: {field}"));
            }
            reqs.push((field.to_string(), equal, value.trim().to_string()));
        }
        Ok(Self(reqs))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn matches(&self, obj: &Stored) -> bool {
        self.0
            .iter()
            .all(|(field, equal, want)| (obj.field(field).unwrap_or_default() == want) == *equal)
    }
}

/// Both selectors of a list or watch request.
#[derive(Debug, Clone, Default)]
pub(crate) struct Selectors {
    pub(crate) labels: LabelSelector,
    pub(crate) fields: FieldSelector,
}

impl Selectors {
    pub(crate) fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    pub(crate) fn matches(&self, obj: &Stored) -> bool {
        self.fields.matches(obj) && self.labels.matches(&obj.labels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn label_selectors() {
        let l = labels(&[
            ("a", "1"),
            ("b", "2"),
            ("node-role.kubernetes.io/worker", ""),
        ]);
        let m = |s: &str| LabelSelector::parse(s).map(|sel| sel.matches(&l));
        assert_eq!(m("a=1"), Ok(true));
        assert_eq!(m("a==1,b=2"), Ok(true));
        assert_eq!(m("a=1,b=3"), Ok(false));
        assert_eq!(m("a!=1"), Ok(false));
        assert_eq!(m("c!=1"), Ok(true));
        assert_eq!(m("node-role.kubernetes.io/worker"), Ok(true));
        assert_eq!(m("!a"), Ok(false));
        assert_eq!(m("!c"), Ok(true));
        assert_eq!(m("a in (1,3)"), Ok(true));
        assert_eq!(m("a notin (1,3)"), Ok(false));
        assert_eq!(m("c notin (1)"), Ok(true));
        assert_eq!(m("a in (2,3),b=2"), Ok(false));
        assert_eq!(m(""), Ok(true));
        assert!(m("a in 1").is_err());
        assert!(m("a=b=c").is_err());
        assert!(m(",").is_err());
    }

    #[test]
    fn field_selectors() {
        let p = FieldSelector::parse;
        assert!(p(Kind::Node, "metadata.name=x").is_ok());
        assert!(p(Kind::Node, "metadata.name==x,spec.unschedulable!=true").is_ok());
        assert!(p(Kind::Node, "metadata.name").is_err());
        assert_eq!(
            p(Kind::Node, "status.phase=Running"),
            Err("field label not supported: status.phase".to_string())
        );
        // Cluster-scoped kinds have no namespace to select on.
        assert!(p(Kind::Node, "metadata.namespace=x").is_err());
        assert!(p(Kind::Pod, "metadata.namespace=x,spec.nodeName=n").is_ok());
        assert!(p(Kind::NetworkPolicy, "spec.nodeName=n").is_err());
    }
}
