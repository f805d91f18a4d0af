//! Delegation to an IPAM plugin binary (e.g. `host-local`), in the highest
//! CNI version both sides speak: a config or prevResult in a newer version
//! than the delegate speaks is converted down for it. Debian's host-local
//! 1.1.x, for one, speaks up to 1.0.0: a 1.1.0 config handed on unchanged
//! fails with "incompatible CNI versions".
//!
//! The delegate is not asked for its versions (VERSION) on every call.
//! What it answered once is remembered per binary (`cache`: path, inode,
//! size and times in the plugin's state dir), and a version is picked from
//! that; without an answer remembered, ADD and DEL go out in the config's
//! own version. Only a refusal (code 1) makes the plugin ask: a plugin
//! checks the version before it does anything (libcni's skel does, before
//! the command), so a refused ADD has leased nothing and is sent again in
//! the version negotiated. The common case costs one exec per verb; the
//! version chosen is the same either way (the highest both speak, not
//! above the config's, is the config's own when the delegate speaks it).
//!
//! A verb is started (`start`: the process spawned, its stdin written) and
//! finished (`Pending::finish`: its answer read, a refusal negotiated)
//! apart, so ADD makes the veth while a delegated IPAM runs.

mod cache;

use std::cell::{Cell, OnceCell};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use crate::config::NetConf;
use crate::error::{CniError, Code, Result};
use crate::log;
use crate::types::CniResult;
use crate::version::{self, Version};
use cache::VersionCache;

/// An IPAM plugin and the version this invocation talks to it in.
#[derive(Debug)]
pub struct Delegate {
    bin: PathBuf,
    /// The version negotiated by this invocation (VERSION asked).
    negotiated: Cell<Option<Version>>,
    /// Where the binary's versions are remembered; None without a state dir.
    cache: Option<VersionCache>,
    /// The versions remembered, read on first use.
    remembered: OnceCell<Option<Vec<String>>>,
}

/// A verb started on the delegate: [`Pending::finish`] reads its answer.
#[must_use = "a started delegate must be finished: it may hold a lease"]
pub struct Pending<'a> {
    delegate: &'a Delegate,
    conf: &'a NetConf,
    command: &'a str,
    version: Version,
    /// None when `version` has no such command.
    child: Option<Child>,
}

impl Delegate {
    /// The delegate `bin`; what it speaks is remembered under `state_dir`.
    pub fn new(bin: PathBuf, state_dir: Option<&Path>) -> Self {
        let cache = state_dir.and_then(|d| VersionCache::new(d, &bin));
        Self {
            bin,
            negotiated: Cell::new(None),
            cache,
            remembered: OnceCell::new(),
        }
    }

    /// Asks the delegate for its versions (the VERSION command), remembers
    /// them, and picks the highest one both speak that is not newer than
    /// the config's.
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
        if let Some(cache) = &self.cache {
            cache.store(&theirs);
        }
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
        self.negotiated.set(Some(version));
        Ok(version)
    }

    /// The version the remembered answer gives for this config, if there is
    /// one and it has a version in common with the config.
    fn remembered(&self, conf: &NetConf) -> Option<Version> {
        let theirs = self
            .remembered
            .get_or_init(|| self.cache.as_ref().and_then(VersionCache::load));
        pick(conf.cni_version, theirs.as_deref()?)
    }

    pub fn name(&self) -> String {
        self.bin.display().to_string()
    }

    /// Runs `command` on the delegate. None when the version both speak
    /// has no such command (CHECK before 0.4.0, STATUS and GC before
    /// 1.1.0): the delegate then has nothing to check or collect, as libcni
    /// skips such a plugin.
    pub fn exec(&self, command: &str, conf: &NetConf) -> Result<Option<Vec<u8>>> {
        self.start(command, conf)?.finish()
    }

    /// Starts `command` on the delegate, in the version negotiated, else
    /// the one remembered, else (ADD and DEL) the config's own.
    pub fn start<'a>(&'a self, command: &'a str, conf: &'a NetConf) -> Result<Pending<'a>> {
        let version = match self.negotiated.get().or_else(|| self.remembered(conf)) {
            Some(v) => v,
            // Only ADD and DEL, which every version has, go out unasked: a
            // delegate that lacks a newer verb (host-local 1.0.0 and GC)
            // says "unknown command" rather than refusing the version, so
            // those verbs (CHECK, STATUS, GC: the rare ones) negotiate first.
            None if matches!(command, "ADD" | "DEL") => conf.cni_version,
            None => self.negotiate(conf)?,
        };
        Ok(Pending {
            delegate: self,
            conf,
            command,
            version,
            child: self.spawn_in(command, conf, version)?,
        })
    }

    /// Spawns `command` in `version`, its stdin written and closed; None
    /// when the version has no such command.
    fn spawn_in(&self, command: &str, conf: &NetConf, version: Version) -> Result<Option<Child>> {
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
        spawn_plugin(&self.bin, command, &stdin).map(Some)
    }
}

impl Pending<'_> {
    /// The delegate's answer. A version it refuses that this invocation
    /// did not negotiate (the config's, or one remembered) is negotiated
    /// now and the verb sent again in the version agreed.
    pub fn finish(self) -> Result<Option<Vec<u8>>> {
        let Pending {
            delegate,
            conf,
            command,
            version,
            child,
        } = self;
        let Some(child) = child else {
            return Ok(None);
        };
        match wait_plugin(&delegate.bin, command, child) {
            Err(e)
                if e.code == Code::IncompatibleVersion && delegate.negotiated.get().is_none() =>
            {
                let agreed = delegate.negotiate(conf)?;
                if agreed == version {
                    // It lists the version it refused: its refusal stands.
                    return Err(e);
                }
                match delegate.spawn_in(command, conf, agreed)? {
                    Some(child) => wait_plugin(&delegate.bin, command, child).map(Some),
                    None => Ok(None),
                }
            }
            r => r.map(Some),
        }
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
    wait_plugin(bin, command, spawn_plugin(bin, command, stdin_bytes)?)
}

/// [`exec_plugin`]'s first half: the process started, its stdin written
/// and closed. A config fits the pipe's buffer, and a plugin reads its
/// stdin before it answers, so this does not wait for the plugin.
fn spawn_plugin(bin: &Path, command: &str, stdin_bytes: &[u8]) -> Result<Child> {
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
    Ok(child)
}

/// [`exec_plugin`]'s second half: the plugin's answer.
fn wait_plugin(bin: &Path, command: &str, child: Child) -> Result<Vec<u8>> {
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
        install_exe(&bin, &script);
        (bin, log)
    }

    /// Writes an executable through `install(1)`, so that the write
    /// descriptor lives in another process. Written from here, a fork by a
    /// test on another thread can inherit it until that child's exec, and
    /// an exec of `path` in that window fails with ETXTBSY.
    fn install_exe(path: &Path, contents: &str) {
        let src = path.with_extension("src");
        std::fs::write(&src, contents).unwrap();
        let status = std::process::Command::new("install")
            .args(["-m", "755"])
            .arg(&src)
            .arg(path)
            .status()
            .unwrap();
        assert!(status.success(), "install {}", path.display());
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
        let d = Delegate::new(bin, None);
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
        let d = Delegate::new(bin.clone(), None);
        let out = d.exec("ADD", &conf).unwrap().unwrap();
        assert!(String::from_utf8_lossy(&out).contains("10.1.0.2/24"));
        // Negotiated once: 1.0.0 from then on.
        d.exec("DEL", &conf).unwrap();
        assert_eq!(calls(&log), ["ADD", "VERSION", "ADD", "DEL"]);
        // A verb newer than the delegate's versions is asked after a
        // negotiation, and skipped: GC is 1.1.0's.
        let d = Delegate::new(bin.clone(), None);
        assert_eq!(d.exec("GC", &conf).unwrap(), None);
        assert_eq!(calls(&log)[4..], ["VERSION"]);
        // No version in common: the delegate's refusal, as before.
        let old = NetConf::parse(
            br#"{"cniVersion":"0.3.1","name":"n","type":"mycni","ipam":{"type":"fake-ipam"}}"#,
        )
        .unwrap();
        let e = Delegate::new(bin, None).exec("ADD", &old).unwrap_err();
        assert_eq!(e.code, Code::IncompatibleVersion, "{e:?}");
    }

    fn conf_1_1_0() -> NetConf {
        NetConf::parse(
            br#"{"cniVersion":"1.1.0","name":"n","type":"mycni","ipam":{"type":"fake-ipam"}}"#,
        )
        .unwrap()
    }

    #[test]
    fn what_a_binary_speaks_is_remembered_across_invocations() {
        let dir = tempfile::tempdir().unwrap();
        let (bin, log) = fake_delegate(dir.path());
        let state = dir.path().join("state");
        let conf = conf_1_1_0();
        // The first invocation learns that the delegate speaks 1.0.0 at most.
        let d = Delegate::new(bin.clone(), Some(&state));
        d.exec("ADD", &conf).unwrap();
        assert_eq!(calls(&log), ["ADD", "VERSION", "ADD"]);
        // The next ones (each a new process: a new Delegate) ask no more,
        // for ADD and DEL as for the verbs that negotiate first.
        let d = Delegate::new(bin.clone(), Some(&state));
        let out = d.exec("ADD", &conf).unwrap().unwrap();
        assert!(String::from_utf8_lossy(&out).contains("10.1.0.2/24"));
        d.exec("DEL", &conf).unwrap();
        assert_eq!(calls(&log)[3..], ["ADD", "DEL"]);
        let d = Delegate::new(bin, Some(&state));
        assert_eq!(d.exec("GC", &conf).unwrap(), None, "GC is not in 1.0.0");
        d.exec("CHECK", &conf).unwrap();
        assert_eq!(calls(&log)[5..], ["CHECK"]);
    }

    #[test]
    fn a_changed_binary_is_asked_again() {
        let dir = tempfile::tempdir().unwrap();
        let (bin, log) = fake_delegate(dir.path());
        let state = dir.path().join("state");
        let conf = conf_1_1_0();
        Delegate::new(bin.clone(), Some(&state))
            .exec("ADD", &conf)
            .unwrap();
        // An upgrade puts another file at the same path.
        let script = std::fs::read_to_string(&bin).unwrap();
        std::fs::remove_file(&bin).unwrap();
        install_exe(&bin, &format!("{script}# upgraded\n"));
        Delegate::new(bin, Some(&state)).exec("ADD", &conf).unwrap();
        assert_eq!(
            calls(&log),
            ["ADD", "VERSION", "ADD", "ADD", "VERSION", "ADD"]
        );
    }

    #[test]
    fn a_remembered_version_the_delegate_refuses_is_negotiated_afresh() {
        let dir = tempfile::tempdir().unwrap();
        let (bin, log) = fake_delegate(dir.path());
        let state = dir.path().join("state");
        let conf = conf_1_1_0();
        // Wrong, as an entry of the same binary: it says 1.1.0.
        VersionCache::new(&state, &bin)
            .unwrap()
            .store(&["1.0.0".to_string(), "1.1.0".to_string()]);
        let d = Delegate::new(bin.clone(), Some(&state));
        let out = d.exec("ADD", &conf).unwrap().unwrap();
        assert!(String::from_utf8_lossy(&out).contains("10.1.0.2/24"));
        assert_eq!(calls(&log), ["ADD", "VERSION", "ADD"]);
        // Corrected: the next invocation goes straight to 1.0.0.
        Delegate::new(bin, Some(&state)).exec("ADD", &conf).unwrap();
        assert_eq!(calls(&log)[3..], ["ADD"]);
    }

    #[test]
    fn supported_versions_are_read_or_refused() {
        let ok = br#"{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}"#;
        assert_eq!(supported_versions(ok), Some(list(&["0.4.0", "1.0.0"])));
        assert_eq!(supported_versions(br#"{"supportedVersions":[1]}"#), None);
        assert_eq!(supported_versions(b"not json"), None);
    }
}
