//! Delegation to an IPAM plugin binary (e.g. `host-local`), in the highest
//! CNI version both sides speak: a config or prevResult in a newer version
//! than the delegate speaks is converted down for it. Debian's host-local
//! 1.1.x, for one, speaks up to 1.0.0: a 1.1.0 config handed on unchanged
//! fails with "incompatible CNI versions".
//!
//! For ADD and DEL the delegate is handed the config's own version first,
//! and asked for its versions (VERSION) only when it refuses that one
//! (code 1): a plugin
//! checks the version before it does anything (libcni's skel does, before
//! the command), so a refused ADD has leased nothing and is sent again in
//! the version negotiated. The common case, a delegate that speaks the
//! config's version, costs one exec per verb instead of two; the version
//! chosen is the same either way (the highest both speak, not above the
//! config's, is the config's own when the delegate speaks it).

use std::cell::Cell;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::config::NetConf;
use crate::error::{CniError, Code, Result};
use crate::log;
use crate::types::CniResult;
use crate::version::{self, Version};

/// An IPAM plugin and the version this invocation talks to it in.
#[derive(Debug)]
pub struct Delegate {
    bin: PathBuf,
    /// The version negotiated, once the delegate refused the config's.
    negotiated: Cell<Option<Version>>,
}

impl Delegate {
    /// The delegate `bin`, spoken to in the config's version until it
    /// refuses it.
    pub fn new(bin: PathBuf) -> Self {
        Self {
            bin,
            negotiated: Cell::new(None),
        }
    }

    /// Asks the delegate for its versions (the VERSION command) and picks
    /// the highest one both speak that is not newer than the config's.
    fn negotiate(&self, conf: &NetConf) -> Result<Version> {
        let bin = &self.bin;
        let ask = serde_json::json!({ "cniVersion": conf.cni_version.as_str() }).to_string();
        let out = exec_plugin(bin, "VERSION", ask.as_bytes())?;
        let theirs = supported_versions(&out).ok_or_else(|| {
            CniError::new(
                Code::Ipam,
                format!(
                    "IPAM plugin {} answered VERSION with no supportedVersions: {}",
                    bin.display(),
                    String::from_utf8_lossy(&out).trim()
                ),
            )
        })?;
        let version = pick(conf.cni_version, &theirs).ok_or_else(|| {
            CniError::new(
                Code::IncompatibleVersion,
                format!(
                    "IPAM plugin {} speaks CNI {}; mycni speaks {} and the config asks for {}",
                    bin.display(),
                    theirs.join(", "),
                    version::SUPPORTED.join(", "),
                    conf.cni_version.as_str()
                ),
            )
        })?;
        Ok(version)
    }

    pub fn name(&self) -> String {
        self.bin.display().to_string()
    }

    /// Runs `command` on the delegate. None when the version both speak
    /// has no such command (CHECK before 0.4.0, STATUS and GC before
    /// 1.1.0): the delegate then has nothing to check or collect, as libcni
    /// skips such a plugin.
    pub fn exec(&self, command: &str, conf: &NetConf) -> Result<Option<Vec<u8>>> {
        // Only ADD and DEL, which every version has, go out unasked: a
        // delegate that lacks a newer verb (host-local 1.0.0 and GC) says
        // "unknown command" rather than refusing the version, so those
        // verbs (CHECK, STATUS, GC: the rare ones) negotiate first.
        if !matches!(command, "ADD" | "DEL") && self.negotiated.get().is_none() {
            self.negotiated.set(Some(self.negotiate(conf)?));
        }
        let tried = self.negotiated.get().unwrap_or(conf.cni_version);
        match self.exec_in(command, conf, tried) {
            Err(e) if e.code == Code::IncompatibleVersion && self.negotiated.get().is_none() => {
                let version = self.negotiate(conf)?;
                self.negotiated.set(Some(version));
                if version == tried {
                    // It lists the version it refused: its refusal stands.
                    return Err(e);
                }
                self.exec_in(command, conf, version)
            }
            r => r,
        }
    }

    /// [`Delegate::exec`] in `version`.
    fn exec_in(&self, command: &str, conf: &NetConf, version: Version) -> Result<Option<Vec<u8>>> {
        let has = match command {
            "CHECK" => version.has_check(),
            "STATUS" | "GC" => version.has_status_gc(),
            _ => true,
        };
        if !has {
            log::info(&format!(
                "IPAM plugin {} speaks CNI {} at most here: no {command} to delegate",
                self.bin.display(),
                version.as_str()
            ));
            return Ok(None);
        }
        let stdin = if version == conf.cni_version {
            conf.raw.clone()
        } else {
            downgrade(&conf.raw, version)?
        };
        exec_plugin(&self.bin, command, &stdin).map(Some)
    }
}

fn supported_versions(out: &[u8]) -> Option<Vec<String>> {
    let v: Value = serde_json::from_slice(out).ok()?;
    v.get("supportedVersions")?
        .as_array()?
        .iter()
        .map(|s| s.as_str().map(str::to_string))
        .collect()
}

/// The highest version mycni speaks, the delegate lists and the config
/// allows.
fn pick(conf: Version, theirs: &[String]) -> Option<Version> {
    version::SUPPORTED
        .iter()
        .rev()
        .filter(|s| theirs.iter().any(|t| t == *s))
        .filter_map(|s| version::parse_supported(s).ok())
        .find(|v| *v <= conf)
}

/// The config as the delegate reads it in `to`: `cniVersion` rewritten and
/// a prevResult converted to that version's result format (the fields the
/// two versions share are kept as they were).
fn downgrade(raw: &[u8], to: Version) -> Result<Vec<u8>> {
    let mut v: Value = serde_json::from_slice(raw)
        .map_err(|e| CniError::new(Code::Decode, format!("network configuration: {e}")))?;
    v["cniVersion"] = Value::from(to.as_str());
    if let Some(prev) = v.get("prevResult").filter(|p| !p.is_null()) {
        let converted = CniResult::from_json(prev)?.to_json(to);
        v["prevResult"] = converted;
    }
    serde_json::to_vec(&v).map_err(|e| CniError::new(Code::Decode, e.to_string()))
}

/// Finds the plugin binary `name` on CNI_PATH.
pub fn find_plugin(path: &[PathBuf], name: &str) -> Result<PathBuf> {
    path.iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            CniError::new(
                Code::InvalidConfig,
                format!(
                    "IPAM plugin {name:?} not found in CNI_PATH ({})",
                    path.iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(":")
                ),
            )
        })
}

/// Runs a delegated plugin per the spec: same environment (with
/// CNI_COMMAND set to `command`), the network config on stdin; returns its
/// stdout on success, or its own error (code and message) on failure.
fn exec_plugin(bin: &Path, command: &str, stdin_bytes: &[u8]) -> Result<Vec<u8>> {
    let mut child = Command::new(bin)
        .env("CNI_COMMAND", command)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            CniError::new(
                Code::Ipam,
                format!("cannot run IPAM plugin {}: {e}", bin.display()),
            )
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        // A plugin that exits without reading stdin gives EPIPE: its exit status says more.
        let _ = stdin.write_all(stdin_bytes);
    }
    let out = child
        .wait_with_output()
        .map_err(|e| CniError::new(Code::Ipam, format!("IPAM plugin {}: {e}", bin.display())))?;
    if out.status.success() {
        return Ok(out.stdout);
    }
    let name = bin
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let parsed: Option<Value> = serde_json::from_slice(&out.stdout).ok();
    let msg = parsed
        .as_ref()
        .and_then(|v| v["msg"].as_str())
        .map(str::to_string)
        .unwrap_or_else(|| String::from_utf8_lossy(&out.stderr).trim().to_string());
    let code = parsed
        .as_ref()
        .and_then(|v| v["code"].as_u64())
        .and_then(code_from)
        .unwrap_or(Code::Ipam);
    Err(CniError::new(
        code,
        format!("IPAM plugin {name} {command} failed: {msg}"),
    ))
}

fn code_from(n: u64) -> Option<Code> {
    Some(match n {
        1 => Code::IncompatibleVersion,
        2 => Code::UnsupportedField,
        3 => Code::UnknownContainer,
        4 => Code::InvalidEnv,
        5 => Code::Io,
        6 => Code::Decode,
        7 => Code::InvalidConfig,
        11 => Code::TryAgainLater,
        50 => Code::NotAvailable,
        51 => Code::LimitedConnectivity,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn picks_the_highest_common_version_not_above_the_config() {
        let host_local = list(&["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0"]);
        assert_eq!(pick(Version::V1_1_0, &host_local), Some(Version::V1_0_0));
        assert_eq!(pick(Version::V0_4_0, &host_local), Some(Version::V0_4_0));
        assert_eq!(pick(Version::V0_3_1, &host_local), Some(Version::V0_3_1));
        assert_eq!(pick(Version::V1_1_0, &list(&["0.2.0"])), None);
        assert_eq!(pick(Version::V0_3_1, &list(&["1.0.0"])), None);
    }

    #[test]
    fn a_config_is_converted_down_with_its_prev_result() {
        let raw = br#"{"cniVersion":"1.1.0","name":"n","type":"mycni","ipam":{"type":"host-local"},
            "prevResult":{"cniVersion":"1.1.0","interfaces":[{"name":"eth0"}],
                          "ips":[{"address":"10.244.1.5/32","interface":0}]}}"#;
        let out: Value = serde_json::from_slice(&downgrade(raw, Version::V0_3_1).unwrap()).unwrap();
        assert_eq!(out["cniVersion"], "0.3.1");
        assert_eq!(out["ipam"]["type"], "host-local");
        assert_eq!(out["prevResult"]["ips"][0]["address"], "10.244.1.5/32");
        // 0.3.1 results say the family on each IP.
        assert_eq!(out["prevResult"]["ips"][0]["version"], "4");
        assert_eq!(out["prevResult"]["cniVersion"], "0.3.1");
    }

    /// A delegate that speaks 0.4.0 and 1.0.0, refuses any other config
    /// version with code 1 (before doing anything, as libcni's skel), and
    /// logs each command it runs to `log`.
    fn fake_delegate(dir: &Path) -> (PathBuf, PathBuf) {
        use std::os::unix::fs::PermissionsExt;
        let bin = dir.join("fake-ipam");
        let log = dir.join("calls");
        let script = format!(
            r#"#!/bin/sh
conf=$(cat)
echo "$CNI_COMMAND" >> {log}
if [ "$CNI_COMMAND" = VERSION ]; then
  echo '{{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}}'; exit 0
fi
case "$conf" in
  *'"cniVersion":"1.0.0"'*|*'"cniVersion":"0.4.0"'*) ;;
  *) echo '{{"cniVersion":"1.0.0","code":1,"msg":"incompatible CNI versions"}}'; exit 1 ;;
esac
echo '{{"cniVersion":"1.0.0","ips":[{{"address":"10.1.0.2/24"}}]}}'
"#,
            log = log.display()
        );
        std::fs::write(&bin, script).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        (bin, log)
    }

    fn calls(log: &Path) -> Vec<String> {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn a_delegate_that_speaks_the_configs_version_is_run_once_per_verb() {
        let dir = tempfile::tempdir().unwrap();
        let (bin, log) = fake_delegate(dir.path());
        let conf = NetConf::parse(
            br#"{"cniVersion":"1.0.0","name":"n","type":"mycni","ipam":{"type":"fake-ipam"}}"#,
        )
        .unwrap();
        let d = Delegate::new(bin);
        let out = d.exec("ADD", &conf).unwrap().unwrap();
        assert!(String::from_utf8_lossy(&out).contains("10.1.0.2/24"));
        d.exec("DEL", &conf).unwrap();
        assert_eq!(calls(&log), ["ADD", "DEL"]);
    }

    #[test]
    fn a_refused_version_is_negotiated_once_and_the_verb_sent_again() {
        let dir = tempfile::tempdir().unwrap();
        let (bin, log) = fake_delegate(dir.path());
        let conf = NetConf::parse(
            br#"{"cniVersion":"1.1.0","name":"n","type":"mycni","ipam":{"type":"fake-ipam"}}"#,
        )
        .unwrap();
        let d = Delegate::new(bin.clone());
        let out = d.exec("ADD", &conf).unwrap().unwrap();
        assert!(String::from_utf8_lossy(&out).contains("10.1.0.2/24"));
        // Negotiated once: 1.0.0 from then on.
        d.exec("DEL", &conf).unwrap();
        assert_eq!(calls(&log), ["ADD", "VERSION", "ADD", "DEL"]);
        // A verb newer than the delegate's versions is asked after a
        // negotiation, and skipped: GC is 1.1.0's.
        let d = Delegate::new(bin.clone());
        assert_eq!(d.exec("GC", &conf).unwrap(), None);
        assert_eq!(calls(&log)[4..], ["VERSION"]);
        // No version in common: the delegate's refusal, as before.
        let old = NetConf::parse(
            br#"{"cniVersion":"0.3.1","name":"n","type":"mycni","ipam":{"type":"fake-ipam"}}"#,
        )
        .unwrap();
        let e = Delegate::new(bin).exec("ADD", &old).unwrap_err();
        assert_eq!(e.code, Code::IncompatibleVersion, "{e:?}");
    }

    #[test]
    fn supported_versions_are_read_or_refused() {
        let ok = br#"{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}"#;
        assert_eq!(supported_versions(ok), Some(list(&["0.4.0", "1.0.0"])));
        assert_eq!(supported_versions(br#"{"supportedVersions":[1]}"#), None);
        assert_eq!(supported_versions(b"not json"), None);
    }
}
