//! Running a CNI plugin binary the way a container runtime does: env vars,
//! config on stdin, one JSON object back, inside a "node" namespace that
//! stands in for the host.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result};
use serde_json::{Value, json};

use crate::NetNs;

/// Where the reference plugins live on Debian.
pub const REFERENCE_PLUGINS: &str = "/usr/lib/cni";

/// A node namespace with its own IPAM data dir, log file and ready file.
pub struct Node {
    pub ns: NetNs,
    pub dir: tempfile::TempDir,
    pub bin_dir: PathBuf,
}

/// One invocation's identity.
#[derive(Clone, Debug)]
pub struct Call<'a> {
    pub container_id: &'a str,
    pub netns: &'a str,
    pub ifname: &'a str,
    pub args: &'a str,
}

/// What one run starts: `plugin` (a name in the bin dir) with CNI_COMMAND
/// `command`, and `env` on top of the CNI variables.
#[derive(Clone, Copy, Debug)]
pub struct Exec<'a> {
    pub plugin: &'a str,
    pub command: &'a str,
    pub env: &'a [(&'a str, &'a str)],
}

impl<'a> Exec<'a> {
    /// `plugin` with CNI_COMMAND `command` and no other variables.
    pub fn new(plugin: &'a str, command: &'a str) -> Self {
        Self {
            plugin,
            command,
            env: &[],
        }
    }

    /// The same run with `env` on top of the CNI variables.
    pub fn env(self, env: &'a [(&'a str, &'a str)]) -> Self {
        Self { env, ..self }
    }
}

/// The outcome of one plugin run.
#[derive(Debug)]
pub struct Reply {
    pub ok: bool,
    pub stdout: String,
    pub json: Value,
}

impl Reply {
    pub fn code(&self) -> Option<u64> {
        self.json["code"].as_u64()
    }
}

impl Node {
    /// `plugin` is the mycni binary; a bin dir holds it (as `mycni`) beside
    /// the reference plugins, as /opt/cni/bin would.
    pub fn new(plugin: &Path) -> Result<Self> {
        let ns = NetNs::new("node")?;
        ns.exec("sysctl", &["-qw", "net.ipv4.ip_forward=1"])?;
        let dir = tempfile::Builder::new().prefix("mycni-node-").tempdir()?;
        let bin_dir = dir.path().join("bin");
        std::fs::create_dir_all(&bin_dir)?;
        std::os::unix::fs::symlink(plugin, bin_dir.join("mycni"))?;
        for entry in std::fs::read_dir(REFERENCE_PLUGINS)? {
            let entry = entry?;
            std::os::unix::fs::symlink(entry.path(), bin_dir.join(entry.file_name()))?;
        }
        Ok(Self { ns, dir, bin_dir })
    }

    pub fn lease_dir(&self) -> PathBuf {
        self.dir.path().join("leases")
    }

    pub fn ready_file(&self) -> PathBuf {
        self.dir.path().join("ready")
    }

    /// Where the plugin records which Pod each host veth is (beside the
    /// ready file, as the agent's state dir): `contract::POD_RECORDS_DIR`,
    /// spelled out to keep this crate light; the plugin's tests check it.
    pub fn records_dir(&self) -> PathBuf {
        self.dir.path().join("pods")
    }

    /// A mycni network config for `version` with the built-in IPAM over `subnet`.
    pub fn conf(&self, version: &str, subnet: &str) -> Value {
        json!({
            "cniVersion": version,
            "name": "mycni0",
            "type": "mycni",
            "logFile": self.dir.path().join("plugin.log"),
            "readyFile": self.ready_file(),
            "ipam": { "type": "mycni-ipam", "subnet": subnet, "dataDir": self.lease_dir() },
        })
    }

    /// Runs `plugin` (a name in the bin dir) with CNI_COMMAND `command`.
    pub fn run(&self, plugin: &str, command: &str, call: &Call, conf: &Value) -> Result<Reply> {
        self.run_env(Exec::new(plugin, command), call, conf)
    }

    /// Runs `exec` (with its extra variables) on `conf`.
    pub fn run_env(&self, exec: Exec<'_>, call: &Call, conf: &Value) -> Result<Reply> {
        self.run_raw(exec, call, conf.to_string().as_bytes())
    }

    /// Runs `exec` with `stdin` as it is, a config or not.
    pub fn run_raw(&self, exec: Exec<'_>, call: &Call, stdin: &[u8]) -> Result<Reply> {
        let Exec {
            plugin,
            command,
            env: extra_env,
        } = exec;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", self.ns.name()])
            .arg(self.bin_dir.join(plugin))
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", call.container_id)
            .env("CNI_NETNS", call.netns)
            .env("CNI_IFNAME", call.ifname)
            .env("CNI_ARGS", call.args)
            .env("CNI_PATH", &self.bin_dir);
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("spawn plugin")?;
        if let Some(mut s) = child.stdin.take() {
            let _ = s.write_all(stdin);
        }
        let out = child.wait_with_output()?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let json = if stdout.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&stdout)
                .with_context(|| format!("{plugin} {command} printed non-JSON: {stdout:?}"))?
        };
        Ok(Reply {
            ok: out.status.success(),
            stdout,
            json,
        })
    }

    /// Everything on the node a test compares before and after: links,
    /// routes of both families, lease files (IPv4 and IPv6) and pod records.
    pub fn snapshot(&self) -> Result<String> {
        let links = self.ns.exec("ip", &["-o", "link", "show"])?;
        let links: Vec<&str> = links
            .lines()
            .filter_map(|l| l.split(':').nth(1))
            .map(str::trim)
            .collect();
        let routes = self.ns.exec("ip", &["route", "show"])?;
        let routes6 = self.ns.exec("ip", &["-6", "route", "show"])?;
        let leases = self.leases();
        let records = dir_names(&self.records_dir());
        Ok(format!(
            "links={links:?}\nroutes={routes}\nroutes6={routes6}\nleases={leases:?}\nrecords={records:?}"
        ))
    }

    /// Number of leases (of both families) the built-in IPAM holds.
    pub fn lease_count(&self) -> usize {
        self.leases().len()
    }

    /// The lease files' names (addresses of both families), sorted.
    fn leases(&self) -> Vec<String> {
        dir_names(&self.lease_dir().join("mycni0"))
            .into_iter()
            .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
            .collect()
    }
}

/// The names in `dir`, sorted; none when it does not exist.
fn dir_names(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// `conf` with `prevResult` set, as a runtime builds it for CHECK/DEL.
pub fn with_prev(conf: &Value, prev: &Value) -> Value {
    let mut c = conf.clone();
    c["prevResult"] = prev.clone();
    c
}
