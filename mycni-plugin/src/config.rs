//! The network configuration on stdin, the CNI_* environment and CNI_ARGS.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;

use serde::Deserialize;
use serde_json::Value;

use crate::error::{CniError, Code, Result};
use crate::version::{self, Version};

/// The overlay MTU: 1500 underlay - 50 VXLAN overhead.
pub const DEFAULT_MTU: u32 = 1450;
/// The ready marker is written by the agent once the overlay is up (see
/// STATUS); these defaults are the agent's too, so they live in the contract.
pub use mycni_common::contract::{
    DEFAULT_PLUGIN_LOG_FILE as DEFAULT_LOG_FILE, DEFAULT_READY_FILE, DEFAULT_VXLAN_DEVICE,
};

/// One attachment named in `cni.dev/valid-attachments` (GC).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq, Hash)]
pub struct Attachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

#[derive(Debug, Deserialize)]
struct Wire {
    #[serde(rename = "cniVersion")]
    cni_version: Option<Value>,
    name: Option<Value>,
    #[serde(rename = "type")]
    plugin_type: Option<Value>,
    mtu: Option<Value>,
    ipam: Option<Value>,
    #[serde(rename = "prevResult")]
    prev_result: Option<Value>,
    #[serde(rename = "runtimeConfig")]
    runtime_config: Option<Value>,
    dns: Option<Value>,
    #[serde(rename = "cni.dev/valid-attachments")]
    valid_attachments: Option<Value>,
    #[serde(rename = "readyFile")]
    ready_file: Option<String>,
    #[serde(rename = "vxlanDevice")]
    vxlan_device: Option<String>,
    #[serde(rename = "logFile")]
    log_file: Option<String>,
    #[serde(rename = "logLevel")]
    log_level: Option<String>,
}

/// A validated network configuration. Unknown fields are tolerated (the spec
/// lets runtimes and other plugins add their own).
#[derive(Debug, Clone)]
pub struct NetConf {
    pub cni_version: Version,
    pub name: String,
    pub plugin_type: String,
    pub mtu: u32,
    /// The `ipam` object as given; `ipam_type` is its `type`.
    pub ipam: Option<Value>,
    pub ipam_type: Option<String>,
    pub prev_result: Option<Value>,
    pub runtime_config: Option<Value>,
    pub dns: Option<Value>,
    pub valid_attachments: Option<Vec<Attachment>>,
    pub ready_file: PathBuf,
    pub vxlan_device: String,
    pub log_file: PathBuf,
    pub log_level: String,
    /// The bytes received, forwarded unchanged to a delegated IPAM plugin.
    pub raw: Vec<u8>,
}

fn bad(msg: impl Into<String>) -> CniError {
    CniError::new(Code::InvalidConfig, msg)
}

fn string_field(v: Option<Value>, field: &str) -> Result<Option<String>> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(bad(format!("`{field}` must be a string, got {other}"))),
    }
}

/// The spec's rule for network names: `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`.
pub fn valid_network_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

impl NetConf {
    /// Parses stdin. Errors carry spec codes: 6 for undecodable JSON, 1 for
    /// a version we do not speak, 7 for a config that is well-formed but wrong.
    pub fn parse(raw: &[u8]) -> Result<Self> {
        let wire: Wire = serde_json::from_slice(raw).map_err(|e| {
            CniError::new(
                Code::Decode,
                format!("network configuration is not valid JSON: {e}"),
            )
            .with_details(
                "the runtime passes the network config on stdin; check the file in /etc/cni/net.d",
            )
        })?;
        let version_str = string_field(wire.cni_version, "cniVersion")?
            .ok_or_else(|| bad("`cniVersion` is missing from the network configuration"))?;
        let cni_version = version::parse_supported(&version_str)?;
        let name = string_field(wire.name, "name")?
            .ok_or_else(|| bad("`name` is missing from the network configuration"))?;
        if !valid_network_name(&name) {
            return Err(bad(format!(
                "network name {name:?} is invalid: it must match ^[a-zA-Z0-9][a-zA-Z0-9_.-]*$"
            )));
        }
        let plugin_type = string_field(wire.plugin_type, "type")?
            .ok_or_else(|| bad("`type` is missing from the network configuration"))?;
        let mtu = match wire.mtu {
            None | Some(Value::Null) => DEFAULT_MTU,
            Some(Value::Number(n)) => match n.as_u64() {
                Some(m @ 68..=65535) => m as u32,
                _ => return Err(bad(format!("`mtu` {n} is out of range (68..=65535)"))),
            },
            Some(other) => return Err(bad(format!("`mtu` must be a number, got {other}"))),
        };
        let (ipam, ipam_type) = match wire.ipam {
            None | Some(Value::Null) => (None, None),
            Some(v @ Value::Object(_)) => {
                let t = string_field(v.get("type").cloned(), "ipam.type")?;
                match t {
                    Some(t) if !t.is_empty() && !t.contains('/') && t != "." && t != ".." => {
                        (Some(v), Some(t))
                    }
                    Some(t) => return Err(bad(format!("`ipam.type` {t:?} is not a plugin name"))),
                    None => return Err(bad("`ipam.type` is missing")),
                }
            }
            Some(other) => return Err(bad(format!("`ipam` must be an object, got {other}"))),
        };
        let prev_result = match wire.prev_result {
            None | Some(Value::Null) => None,
            Some(v @ Value::Object(_)) => Some(v),
            Some(other) => return Err(bad(format!("`prevResult` must be an object, got {other}"))),
        };
        let dns = match wire.dns {
            None | Some(Value::Null) => None,
            Some(v @ Value::Object(_)) => Some(v),
            Some(other) => return Err(bad(format!("`dns` must be an object, got {other}"))),
        };
        let valid_attachments = match wire.valid_attachments {
            None | Some(Value::Null) => None,
            Some(v) => Some(serde_json::from_value::<Vec<Attachment>>(v).map_err(|e| {
                bad(format!(
                    "`cni.dev/valid-attachments` must be a list of {{containerID, ifname}}: {e}"
                ))
            })?),
        };
        Ok(Self {
            cni_version,
            name,
            plugin_type,
            mtu,
            ipam,
            ipam_type,
            prev_result,
            runtime_config: wire.runtime_config,
            dns,
            valid_attachments,
            ready_file: wire
                .ready_file
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(DEFAULT_READY_FILE)),
            vxlan_device: wire
                .vxlan_device
                .unwrap_or_else(|| DEFAULT_VXLAN_DEVICE.to_string()),
            log_file: wire
                .log_file
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(DEFAULT_LOG_FILE)),
            log_level: wire.log_level.unwrap_or_else(|| "info".to_string()),
            raw: raw.to_vec(),
        })
    }

    /// The plugin's state dir: the ready marker's directory (the agent
    /// writes the conflist naming the marker, so the two cannot disagree).
    /// Pod records and what delegated IPAM binaries speak are kept there.
    pub fn state_dir(&self) -> Option<&std::path::Path> {
        self.ready_file.parent()
    }

    /// The IPAM type, or a config error for commands that need one.
    pub fn require_ipam(&self) -> Result<&str> {
        self.ipam_type
            .as_deref()
            .ok_or_else(|| bad("the network configuration has no `ipam` section; mycni needs one to assign pod IPs"))
    }
}

/// `CNI_ARGS`: `K=V;K=V`, read as libcni's `LoadArgs` reads it (the
/// reference plugins' parser, so a runtime sees one behaviour whichever
/// plugin it calls): every pair has exactly one `=` (an empty pair or a
/// value with `=` in it is an error), `IgnoreUnknown` takes `1`/`true`/
/// `0`/`false` in any case and nothing else (not even empty), and keys are
/// matched exactly; unknown keys, an empty one included, are an error
/// unless `IgnoreUnknown` is true.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    pub pod_namespace: Option<String>,
    pub pod_name: Option<String>,
    pub infra_container_id: Option<String>,
    pub pod_uid: Option<String>,
    /// Unknown keys with a name (kept for logs; an empty key has nothing
    /// to keep).
    pub other: BTreeMap<String, String>,
}

impl CniArgs {
    pub fn parse(s: &str) -> Result<Self> {
        let mut out = CniArgs::default();
        if s.is_empty() {
            return Ok(out);
        }
        let mut ignore_unknown = false;
        let mut unknown = Vec::new();
        for pair in s.split(';') {
            let mut kv = pair.split('=');
            let (Some(k), Some(v), None) = (kv.next(), kv.next(), kv.next()) else {
                return Err(CniError::new(
                    Code::InvalidEnv,
                    format!("CNI_ARGS: {pair:?} is not one KEY=VALUE pair"),
                ));
            };
            let v = v.to_string();
            match k {
                "IgnoreUnknown" => {
                    ignore_unknown = match v.to_ascii_lowercase().as_str() {
                        "1" | "true" => true,
                        "0" | "false" => false,
                        _ => {
                            return Err(CniError::new(
                                Code::InvalidEnv,
                                format!(
                                    "CNI_ARGS: IgnoreUnknown={v:?} is not a boolean (1, true, 0 or false)"
                                ),
                            ));
                        }
                    }
                }
                "K8S_POD_NAMESPACE" => out.pod_namespace = Some(v),
                "K8S_POD_NAME" => out.pod_name = Some(v),
                "K8S_POD_INFRA_CONTAINER_ID" => out.infra_container_id = Some(v),
                "K8S_POD_UID" => out.pod_uid = Some(v),
                _ => {
                    unknown.push(k.to_string());
                    if !k.is_empty() {
                        out.other.insert(k.to_string(), v);
                    }
                }
            }
        }
        if !unknown.is_empty() && !ignore_unknown {
            return Err(CniError::new(
                Code::UnsupportedField,
                format!("CNI_ARGS: unknown keys {unknown:?} (set IgnoreUnknown=1 to allow them)"),
            ));
        }
        Ok(out)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Status,
    Gc,
    Version,
}

/// The `CNI_*` environment, validated for the command.
#[derive(Debug, Clone)]
pub struct Env {
    pub command: Command,
    pub container_id: String,
    /// Empty when the runtime has none (allowed for DEL).
    pub netns: String,
    pub ifname: String,
    pub args: CniArgs,
    pub path: Vec<PathBuf>,
}

fn invalid_env(msg: impl Into<String>) -> CniError {
    CniError::new(Code::InvalidEnv, msg)
}

/// Container IDs: the spec's `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`.
pub fn valid_container_id(id: &str) -> bool {
    valid_network_name(id)
}

/// Interface names the kernel accepts: 1..=15 bytes, no '/', ':' or
/// whitespace, not "." or "..".
pub fn valid_ifname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 15
        && name != "."
        && name != ".."
        && !name
            .bytes()
            .any(|b| b == b'/' || b == b':' || b.is_ascii_whitespace() || b == 0)
}

impl Env {
    /// Reads the environment through `get` (a closure so tests need not mutate
    /// the process environment). A variable that is set but not UTF-8 is an
    /// error, not "unset": read as unset, a garbled `CNI_ARGS` would drop
    /// `IgnoreUnknown` and the pod's name in silence.
    pub fn from_lookup(get: impl Fn(&str) -> Option<OsString>) -> Result<Self> {
        let get = |k: &str| -> Result<Option<String>> {
            get(k)
                .map(|v| {
                    v.into_string()
                        .map_err(|v| invalid_env(format!("{k} is set but is not UTF-8: {v:?}")))
                })
                .transpose()
        };
        let command = match get("CNI_COMMAND")?.as_deref() {
            Some("ADD") => Command::Add,
            Some("DEL") => Command::Del,
            Some("CHECK") => Command::Check,
            Some("STATUS") => Command::Status,
            Some("GC") => Command::Gc,
            Some("VERSION") => Command::Version,
            Some(other) => {
                return Err(invalid_env(format!(
                    "CNI_COMMAND {other:?} is not one of ADD, DEL, CHECK, STATUS, GC, VERSION"
                )));
            }
            None => return Err(invalid_env("CNI_COMMAND is not set")),
        };
        let needs_container = matches!(command, Command::Add | Command::Del | Command::Check);
        let container_id = get("CNI_CONTAINERID")?.unwrap_or_default();
        let ifname = get("CNI_IFNAME")?.unwrap_or_default();
        let netns = get("CNI_NETNS")?.unwrap_or_default();
        if needs_container {
            if container_id.is_empty() {
                return Err(invalid_env("CNI_CONTAINERID is not set"));
            }
            if !valid_container_id(&container_id) {
                return Err(invalid_env(format!(
                    "CNI_CONTAINERID {container_id:?} is invalid: it must match ^[a-zA-Z0-9][a-zA-Z0-9_.-]*$"
                )));
            }
            if ifname.is_empty() {
                return Err(invalid_env("CNI_IFNAME is not set"));
            }
            if !valid_ifname(&ifname) {
                return Err(invalid_env(format!(
                    "CNI_IFNAME {ifname:?} is not a valid interface name (1-15 bytes, no '/', ':' or spaces)"
                )));
            }
            if matches!(command, Command::Add | Command::Check) && netns.is_empty() {
                return Err(invalid_env("CNI_NETNS is not set"));
            }
        }
        let path = get("CNI_PATH")?
            .unwrap_or_default()
            .split(':')
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .collect::<Vec<_>>();
        if path.is_empty() && command != Command::Version {
            return Err(invalid_env("CNI_PATH is not set"));
        }
        let args = CniArgs::parse(&get("CNI_ARGS")?.unwrap_or_default())?;
        Ok(Self {
            command,
            container_id,
            netns,
            ifname,
            args,
            path,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(s: &str) -> Result<NetConf> {
        NetConf::parse(s.as_bytes())
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let c = conf(r#"{"cniVersion":"1.1.0","name":"mycni0","type":"mycni","ipam":{"type":"mycni-ipam","subnet":"10.244.1.0/24"},"somethingElse":[1]}"#).unwrap();
        assert_eq!(c.mtu, DEFAULT_MTU);
        assert_eq!(c.ipam_type.as_deref(), Some("mycni-ipam"));
        assert_eq!(c.cni_version, Version::V1_1_0);
    }

    #[test]
    fn config_errors_have_spec_codes() {
        let cases = [
            ("not json", Code::Decode),
            ("[]", Code::Decode),
            (r#"{"name":"n","type":"mycni"}"#, Code::InvalidConfig),
            (
                r#"{"cniVersion":"9.9.9","name":"n","type":"mycni"}"#,
                Code::IncompatibleVersion,
            ),
            (
                r#"{"cniVersion":"0.2.0","name":"n","type":"mycni"}"#,
                Code::IncompatibleVersion,
            ),
            (
                r#"{"cniVersion":1,"name":"n","type":"mycni"}"#,
                Code::InvalidConfig,
            ),
            (
                r#"{"cniVersion":"1.0.0","type":"mycni"}"#,
                Code::InvalidConfig,
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"-bad","type":"mycni"}"#,
                Code::InvalidConfig,
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"n","type":"mycni","mtu":20}"#,
                Code::InvalidConfig,
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"n","type":"mycni","mtu":"x"}"#,
                Code::InvalidConfig,
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"n","type":"mycni","ipam":{}}"#,
                Code::InvalidConfig,
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"n","type":"mycni","ipam":{"type":"../x"}}"#,
                Code::InvalidConfig,
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"n","type":"mycni","prevResult":3}"#,
                Code::InvalidConfig,
            ),
            (
                r#"{"cniVersion":"1.1.0","name":"n","type":"mycni","cni.dev/valid-attachments":[{"x":1}]}"#,
                Code::InvalidConfig,
            ),
        ];
        for (input, code) in cases {
            let err = conf(input).expect_err(input);
            assert_eq!(err.code, code, "{input}: {err}");
        }
    }

    #[test]
    fn cni_args() {
        let a = CniArgs::parse("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc;FOO=bar").unwrap();
        assert_eq!(a.pod_namespace.as_deref(), Some("default"));
        assert_eq!(a.pod_name.as_deref(), Some("web-0"));
        assert_eq!(a.infra_container_id.as_deref(), Some("abc"));
        assert_eq!(a.other.get("FOO").map(String::as_str), Some("bar"));
        assert_eq!(
            CniArgs::parse("FOO=bar").unwrap_err().code,
            Code::UnsupportedField
        );
        assert_eq!(CniArgs::parse("FOO").unwrap_err().code, Code::InvalidEnv);
        assert_eq!(
            CniArgs::parse("IgnoreUnknown=maybe").unwrap_err().code,
            Code::InvalidEnv
        );
        assert_eq!(CniArgs::parse("").unwrap(), CniArgs::default());
    }

    /// Each case as libcni's `LoadArgs` decides it (pkg/types/args.go).
    #[test]
    fn cni_args_as_libcni() {
        let err = |s: &str| CniArgs::parse(s).map(|_| ()).map_err(|e| e.code);
        // An empty key is an unknown key, not a syntax error.
        assert_eq!(err("=x"), Err(Code::UnsupportedField));
        assert_eq!(err("IgnoreUnknown=1;=x"), Ok(()));
        // Exactly one '=' per pair.
        assert_eq!(err("IgnoreUnknown=1;X=a=b"), Err(Code::InvalidEnv));
        // Empty pairs, trailing ';' included.
        assert_eq!(err("K8S_POD_NAME=a;"), Err(Code::InvalidEnv));
        assert_eq!(err(";"), Err(Code::InvalidEnv));
        // IgnoreUnknown: any case of 1/true/0/false, nothing else.
        assert_eq!(err("IgnoreUnknown=TRUE;X=1"), Ok(()));
        assert_eq!(err("IgnoreUnknown=;X=1"), Err(Code::InvalidEnv));
        assert_eq!(err("IgnoreUnknown=0;X=1"), Err(Code::UnsupportedField));
        // Where it stands does not matter; keys are case-sensitive.
        assert_eq!(err("X=1;IgnoreUnknown=1"), Ok(()));
        assert_eq!(err("ignoreunknown=1;X=1"), Err(Code::UnsupportedField));
    }

    #[test]
    fn non_utf8_env_is_an_error_not_unset() {
        use std::os::unix::ffi::OsStringExt;
        let get = |k: &str| match k {
            "CNI_COMMAND" => Some(OsString::from("ADD")),
            "CNI_CONTAINERID" => Some(OsString::from("c1")),
            "CNI_NETNS" => Some(OsString::from("/run/netns/p")),
            "CNI_IFNAME" => Some(OsString::from("eth0")),
            "CNI_PATH" => Some(OsString::from("/opt/cni/bin")),
            "CNI_ARGS" => Some(OsString::from_vec(
                b"IgnoreUnknown=1;K8S_POD_NAME=\xff".to_vec(),
            )),
            _ => None,
        };
        let e = Env::from_lookup(get).unwrap_err();
        assert_eq!(e.code, Code::InvalidEnv);
        assert!(e.msg.contains("CNI_ARGS"), "{}", e.msg);
    }

    fn env(pairs: &[(&str, &str)]) -> Result<Env> {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Env::from_lookup(|k| map.get(k).map(OsString::from))
    }

    #[test]
    fn env_validation() {
        let ok = [
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "abc123"),
            ("CNI_NETNS", "/run/netns/x"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/opt/cni/bin"),
        ];
        assert!(env(&ok).is_ok());
        let mut del_no_netns = ok.to_vec();
        del_no_netns[0] = ("CNI_COMMAND", "DEL");
        del_no_netns.remove(2);
        assert!(env(&del_no_netns).is_ok());
        for drop in 0..ok.len() {
            let mut e = ok.to_vec();
            e.remove(drop);
            assert_eq!(
                env(&e).unwrap_err().code,
                Code::InvalidEnv,
                "without {:?}",
                ok[drop]
            );
        }
        for bad_if in ["", "a/b", "toolongifname0123", "a b", ".."] {
            let mut e = ok.to_vec();
            e[3] = ("CNI_IFNAME", bad_if);
            assert_eq!(env(&e).unwrap_err().code, Code::InvalidEnv, "{bad_if:?}");
        }
        let mut e = ok.to_vec();
        e[1] = ("CNI_CONTAINERID", "-x");
        assert_eq!(env(&e).unwrap_err().code, Code::InvalidEnv);
        assert!(env(&[("CNI_COMMAND", "VERSION")]).is_ok());
        assert!(env(&[("CNI_COMMAND", "STATUS"), ("CNI_PATH", "/x")]).is_ok());
        assert_eq!(
            env(&[("CNI_COMMAND", "FOO")]).unwrap_err().code,
            Code::InvalidEnv
        );
    }
}
