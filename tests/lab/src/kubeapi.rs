//! The lab's own calls to the Kubernetes API fixture, over HTTP as kubectl
//! makes them: the same code whether the fixture runs in this process (the
//! tests) or as the lab's daemon (`cargo xtask lab`).
//!
//! The connection is opened from inside the underlay namespace, where the
//! fixture listens, and then used from here (a socket keeps the namespace
//! it was made in).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use mycni_testkit::in_netns;

use crate::Lab;

/// How a body is sent: `POST`/`PUT` take a whole object, `PATCH` a JSON
/// merge patch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
    Put,
    Patch,
    Delete,
}

impl Method {
    fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Patch => "PATCH",
            Method::Delete => "DELETE",
        }
    }
}

/// The path of a kind's collection in `namespace`: `pods` ->
/// `/api/v1/namespaces/x/pods`, `networkpolicies` ->
/// `/apis/networking.k8s.io/v1/namespaces/x/networkpolicies`.
pub fn collection(resource: &str, namespace: Option<&str>) -> String {
    let group = match resource {
        "networkpolicies" => "/apis/networking.k8s.io/v1",
        _ => "/api/v1",
    };
    match namespace {
        Some(ns) => format!("{group}/namespaces/{ns}/{resource}"),
        None => format!("{group}/{resource}"),
    }
}

/// One object: its kind's `resource`, its namespace (`None` for a
/// cluster-scoped kind) and its name.
#[derive(Debug, Clone, Copy)]
pub struct ObjectRef<'a> {
    pub resource: &'a str,
    pub ns: Option<&'a str>,
    pub name: &'a str,
}

impl ObjectRef<'_> {
    /// The object's path.
    pub fn path(&self) -> String {
        format!("{}/{}", collection(self.resource, self.ns), self.name)
    }
}

impl Lab {
    /// One API call; the status and the decoded body (`Null` when empty).
    pub fn kube(&self, method: Method, path: &str, body: Option<&Value>) -> Result<(u16, Value)> {
        let addr = self.spec.api_socket();
        let mut c = in_netns(&self.spec.underlay_ns(), || {
            TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        })?
        .with_context(|| format!("connecting to the API fixture at {addr}"))?;
        c.set_read_timeout(Some(Duration::from_secs(5)))?;
        let body = body.map(Value::to_string).unwrap_or_default();
        let ctype = if method == Method::Patch {
            "application/merge-patch+json"
        } else {
            "application/json"
        };
        // HTTP/1.0: the answer ends with the connection, never chunked.
        let req = format!(
            "{} {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: application/json\r\n\
             Content-Type: {ctype}\r\nContent-Length: {}\r\n\r\n{body}",
            method.as_str(),
            body.len()
        );
        c.write_all(req.as_bytes())?;
        let mut raw = Vec::new();
        c.read_to_end(&mut raw)?;
        let text = String::from_utf8_lossy(&raw);
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("no status in the answer to {path}: {head:?}"))?;
        let body = if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            dechunk(body)
        } else {
            body.to_string()
        };
        let value = if body.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&body).unwrap_or(Value::String(body))
        };
        Ok((status, value))
    }

    /// [`Lab::kube`], failing on anything but 2xx.
    pub fn kube_ok(&self, method: Method, path: &str, body: Option<&Value>) -> Result<Value> {
        let (status, v) = self.kube(method, path, body)?;
        if !(200..300).contains(&status) {
            bail!("{} {path}: {status} {v}", method.as_str());
        }
        Ok(v)
    }

    /// Whether the fixture serves `resource` in `group_version` (`v1`,
    /// `networking.k8s.io/v1`), by its discovery document.
    pub fn kube_serves(&self, group_version: &str, resource: &str) -> bool {
        let path = if group_version == "v1" {
            "/api/v1".to_string()
        } else {
            format!("/apis/{group_version}")
        };
        match self.kube(Method::Get, &path, None) {
            Ok((200, v)) => v["resources"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|r| r["name"] == resource),
            _ => false,
        }
    }

    /// Creates the object, or replaces it (keeping nothing of the old one
    /// but its identity) when it exists: `kubectl apply` for the lab's own
    /// objects.
    pub fn kube_apply(&self, resource: &str, obj: &Value) -> Result<Value> {
        let ns = obj["metadata"]["namespace"].as_str();
        let name = obj["metadata"]["name"]
            .as_str()
            .context("object without a name")?;
        let coll = collection(resource, ns);
        let (status, v) = self.kube(Method::Post, &coll, Some(obj))?;
        if status != 409 {
            if !(200..300).contains(&status) {
                bail!("POST {coll}: {status} {v}");
            }
            return Ok(v);
        }
        let path = format!("{coll}/{name}");
        let current = self.kube_ok(Method::Get, &path, None)?;
        let mut obj = obj.clone();
        obj["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
        self.kube_ok(Method::Put, &path, Some(&obj))
    }

    /// Deletes an object; one already gone is fine.
    pub fn kube_delete(&self, resource: &str, ns: Option<&str>, name: &str) -> Result<()> {
        let path = format!("{}/{name}", collection(resource, ns));
        let (status, v) = self.kube(Method::Delete, &path, None)?;
        if !(200..300).contains(&status) && status != 404 {
            bail!("DELETE {path}: {status} {v}");
        }
        Ok(())
    }

    /// Sets (`Some`) or removes (`None`) one label, as `kubectl label` does.
    pub fn kube_label(&self, object: ObjectRef<'_>, key: &str, value: Option<&str>) -> Result<()> {
        let path = object.path();
        let patch = serde_json::json!({"metadata": {"labels": {key: value}}});
        self.kube_ok(Method::Patch, &path, Some(&patch))?;
        Ok(())
    }
}

/// A chunked body's payload.
fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_chunks() {
        assert_eq!(
            collection("networkpolicies", Some("x")),
            "/apis/networking.k8s.io/v1/namespaces/x/networkpolicies"
        );
        assert_eq!(collection("namespaces", None), "/api/v1/namespaces");
        assert_eq!(dechunk("3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"), "abcde");
    }
}
