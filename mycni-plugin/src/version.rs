//! The CNI spec versions this plugin speaks, and what each allows.

use crate::error::{CniError, Code, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Version {
    V0_3_1,
    V0_4_0,
    V1_0_0,
    V1_1_0,
}

pub const SUPPORTED: [&str; 4] = ["0.3.1", "0.4.0", "1.0.0", "1.1.0"];

impl Version {
    pub const fn as_str(self) -> &'static str {
        match self {
            Version::V0_3_1 => "0.3.1",
            Version::V0_4_0 => "0.4.0",
            Version::V1_0_0 => "1.0.0",
            Version::V1_1_0 => "1.1.0",
        }
    }

    /// CHECK exists from 0.4.0 on.
    pub fn has_check(self) -> bool {
        self >= Version::V0_4_0
    }

    /// STATUS and GC exist from 1.1.0 on.
    pub fn has_status_gc(self) -> bool {
        self >= Version::V1_1_0
    }

    /// Results before 1.0.0 carry `"version": "4"` on each IP.
    pub fn ip_has_version_field(self) -> bool {
        self < Version::V1_0_0
    }
}

pub fn parse_supported(s: &str) -> Result<Version> {
    Ok(match s {
        "0.3.1" => Version::V0_3_1,
        "0.4.0" => Version::V0_4_0,
        "1.0.0" => Version::V1_0_0,
        "1.1.0" => Version::V1_1_0,
        other => {
            return Err(CniError::new(
                Code::IncompatibleVersion,
                format!("CNI version {other:?} is not supported by mycni"),
            )
            .with_details(format!("supported versions: {}", SUPPORTED.join(", "))));
        }
    })
}

/// The VERSION command's answer.
pub fn version_json() -> String {
    serde_json::json!({ "cniVersion": "1.1.0", "supportedVersions": SUPPORTED }).to_string()
}
