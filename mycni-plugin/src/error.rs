//! Typed errors, and their one mapping onto the CNI wire format.

use serde::Serialize;
use thiserror::Error;

/// CNI spec 1.1.0 error codes, and ours (100+).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Code {
    IncompatibleVersion = 1,
    UnsupportedField = 2,
    UnknownContainer = 3,
    InvalidEnv = 4,
    Io = 5,
    Decode = 6,
    InvalidConfig = 7,
    TryAgainLater = 11,
    NotAvailable = 50,
    LimitedConnectivity = 51,
    /// A kernel (netlink, sysctl) operation failed.
    Kernel = 100,
    /// The delegated IPAM plugin failed or returned nonsense.
    Ipam = 101,
    /// No free address in the range.
    RangeExhausted = 102,
    /// CHECK found the pod's network differs from what ADD made.
    CheckFailed = 103,
}

#[derive(Debug, Error)]
#[error("{msg}")]
pub struct CniError {
    pub code: Code,
    pub msg: String,
    pub details: String,
}

impl CniError {
    pub fn new(code: Code, msg: impl Into<String>) -> Self {
        Self {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    /// The one JSON object a failing plugin prints on stdout.
    pub fn to_json(&self, cni_version: &str) -> String {
        #[derive(Serialize)]
        struct Wire<'a> {
            #[serde(rename = "cniVersion")]
            cni_version: &'a str,
            code: u32,
            msg: &'a str,
            #[serde(skip_serializing_if = "str::is_empty")]
            details: &'a str,
        }
        serde_json::to_string(&Wire {
            cni_version,
            code: self.code as u32,
            msg: &self.msg,
            details: &self.details,
        })
        .unwrap_or_else(|_| {
            format!(
                "{{\"cniVersion\":\"{cni_version}\",\"code\":{},\"msg\":\"error\"}}",
                self.code as u32
            )
        })
    }
}

pub type Result<T, E = CniError> = std::result::Result<T, E>;

/// Shorthand for kernel failures: says which step failed and on what.
pub fn kernel(step: &str, err: impl std::fmt::Display) -> CniError {
    CniError::new(Code::Kernel, format!("{step}: {err}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_json_has_spec_fields() {
        let e = CniError::new(Code::InvalidEnv, "CNI_NETNS missing").with_details("set it");
        let v: serde_json::Value = serde_json::from_str(&e.to_json("1.1.0")).unwrap();
        assert_eq!(v["code"], 4);
        assert_eq!(v["msg"], "CNI_NETNS missing");
        assert_eq!(v["details"], "set it");
        assert_eq!(v["cniVersion"], "1.1.0");
        let bare: serde_json::Value =
            serde_json::from_str(&CniError::new(Code::Io, "x").to_json("0.3.1")).unwrap();
        assert!(bare.get("details").is_none());
    }
}
