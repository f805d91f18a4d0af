//! A private podman (Debian bookworm's 4.3) on its CNI network backend, run
//! inside a lab node's network namespace: the second runtime the plugin is
//! proven against, beside containerd's CRI (`cri`). podman calls the plugin
//! through libcni itself (no kubelet, no `K8S_POD_NAMESPACE`), keeps
//! libcni's result cache and makes the container's netns under `/run/netns`.
//!
//! Nothing of the host's configuration is used or changed:
//! - every command gets the harness's own `containers.conf` and
//!   `storage.conf` (`CONTAINERS_CONF`, `CONTAINERS_STORAGE_CONF`), which
//!   force the CNI backend (`network_backend = "cni"`, not netavark), name
//!   the CNI config directory and a plugin directory holding only the
//!   plugin under test, and put storage (vfs), libpod's state, locks and
//!   temporary files in the harness's tempdir. conmon hands
//!   `CONTAINERS_CONF` on to the `podman container cleanup` it runs when a
//!   container exits, so that one sees the same network;
//! - podman runs in a mount namespace of its own (slave of the host's), held
//!   by a process that lives as long as the harness. In it, the paths
//!   podman 4.3 does not let one configure are bind mounts of the harness's
//!   directories: libcni's cache `/var/lib/cni`, the netns files
//!   `/run/netns` (fixed for root), runc's state `/run/runc` and
//!   `/var/lib/containers`, where `podman load` keeps its blob info cache
//!   whatever the storage root. The netns mounts podman makes stay in that
//!   namespace; the host never sees them.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::cri::{TEST_IMAGE, build_busybox_archive};
use crate::leftovers::{
    kill_and_wait, mounts_of, processes_in_cgroups, processes_mentioning, remove_cgroups,
};
use mycni_testkit::unique;

/// Becomes the holder of podman's mount namespace once the bind mounts are
/// in place. `$1` is the harness's directory. The mount points are made on
/// the host if missing (empty directories, as the containerd harness does).
const HOLD: &str = r#"set -eu
dir=$1
mkdir -p /var/lib/cni /run/netns /run/runc /var/lib/containers
mount --bind "$dir/cni-cache" /var/lib/cni
mount --bind "$dir/var-lib-containers" /var/lib/containers
mount --bind "$dir/netns" /run/netns
mount --bind "$dir/runc" /run/runc
: > "$dir/held"
exec sleep infinity
"#;

const HOLD_TIMEOUT: Duration = Duration::from_secs(10);
/// A podman command of a test; a hung podman fails the test instead of
/// stalling it.
const COMMAND_TIMEOUT: &str = "60";

/// A private podman whose commands run in the network namespace of a lab
/// node, with the busybox test image loaded. Everything it made is removed
/// on drop.
pub struct Podman {
    holder: Option<Child>,
    /// Every container's cgroups go below this one (cgroupfs manager), so
    /// the harness can remove what a failed test leaves.
    cgroup_parent: String,
    dir: tempfile::TempDir,
}

impl Podman {
    /// podman in the network namespace `node_netns` (a name under
    /// /run/netns), with the CNI config directory `cni_conf_dir` (a lab
    /// node's, where its agent writes the conflist) and `plugin` as the only
    /// CNI plugin; loads [`TEST_IMAGE`].
    pub fn start(node_netns: &str, cni_conf_dir: &Path, plugin: &Path) -> Result<Self> {
        let version = Command::new("podman").arg("--version").output();
        if !version.is_ok_and(|v| v.status.success()) {
            bail!("podman is missing: `cargo xtask setup` installs it");
        }
        let dir = tempfile::Builder::new().prefix("mycni-podman-").tempdir()?;
        let d = dir.path();
        for sub in [
            "cni-cache",
            "var-lib-containers",
            "netns",
            "runc",
            "cni-bin",
            "root",
            "runroot",
            "libpod-tmp",
            "tmp",
            "image",
        ] {
            fs::create_dir(d.join(sub))?;
        }
        symlink(plugin, d.join("cni-bin").join(plugin_type(plugin)?))?;
        fs::write(d.join("containers.conf"), containers_conf(d, cni_conf_dir)?)?;
        fs::write(d.join("storage.conf"), storage_conf(d)?)?;
        // Images from a local archive carry no signatures to check.
        fs::write(
            d.join("policy.json"),
            r#"{"default":[{"type":"insecureAcceptAnything"}]}"#,
        )?;
        let archive = d.join("image.tar");
        build_busybox_archive(&d.join("image"), TEST_IMAGE, &archive)?;

        let log = fs::File::create(d.join("holder.log"))?;
        let holder = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{node_netns}"))
            .args(["--", "unshare", "--mount", "--propagation", "slave", "--"])
            .args(["sh", "-c", HOLD, "sh"])
            .arg(d)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("spawn the holder of podman's mount namespace")?;
        let mut podman = Self {
            holder: Some(holder),
            cgroup_parent: format!("/{}", unique("mycni-t-podman-")),
            dir,
        };
        podman.wait_held()?;
        // The backend is the point of the harness: a podman that picked
        // netavark (or ignored the config) must not pass for one on CNI.
        let backend = podman.ok(&["info", "--format", "{{.Host.NetworkBackend}}"])?;
        ensure!(
            backend.trim() == "cni",
            "podman's network backend is {:?}, not cni",
            backend.trim()
        );
        podman.ok(&[
            "load",
            "--signature-policy",
            &podman.path("policy.json").to_string_lossy(),
            "-i",
            &archive.to_string_lossy(),
        ])?;
        Ok(podman)
    }

    /// A podman command as run in the harness (its namespaces and
    /// configuration), not yet started.
    pub fn command(&self, args: &[&str]) -> Result<Command> {
        let pid = self.holder_pid()?;
        let mut cmd = Command::new("timeout");
        cmd.args([COMMAND_TIMEOUT, "nsenter", "--target", &pid.to_string()])
            .args(["--mount", "--net", "--", "podman"])
            .args(args)
            .env("CONTAINERS_CONF", self.path("containers.conf"))
            .env("CONTAINERS_STORAGE_CONF", self.path("storage.conf"))
            .env("TMPDIR", self.path("tmp"))
            .stdin(Stdio::null());
        Ok(cmd)
    }

    /// Runs a podman command to its end, whatever its exit status.
    pub fn output(&self, args: &[&str]) -> Result<Output> {
        self.command(args)?
            .output()
            .with_context(|| format!("run podman {}", args.join(" ")))
    }

    /// Runs a podman command that must succeed; returns its stdout.
    pub fn ok(&self, args: &[&str]) -> Result<String> {
        let out = self.output(args)?;
        if !out.status.success() {
            bail!(
                "`podman {}` failed ({}): {}{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim(),
                String::from_utf8_lossy(&out.stdout).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `podman run -d` of [`TEST_IMAGE`] (which sleeps forever) named
    /// `name`, on the CNI network `network`; returns the container ID.
    pub fn run_detached(&self, name: &str, network: &str) -> Result<String> {
        let out = self.ok(&self.run_args(name, network, &[]))?;
        let id = out.trim().to_owned();
        ensure!(
            id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()),
            "podman run printed {out:?}, not a container ID"
        );
        Ok(id)
    }

    /// `podman run -d` of [`TEST_IMAGE`] running `command`, whatever its
    /// exit status: for containers that must fail to start.
    pub fn try_run_detached(&self, name: &str, network: &str, command: &[&str]) -> Result<Output> {
        self.output(&self.run_args(name, network, command))
    }

    fn run_args<'a>(
        &'a self,
        name: &'a str,
        network: &'a str,
        command: &[&'a str],
    ) -> Vec<&'a str> {
        let mut args = vec![
            "run",
            "-d",
            "--name",
            name,
            "--network",
            network,
            "--cgroup-parent",
            &self.cgroup_parent,
            TEST_IMAGE,
        ];
        args.extend_from_slice(command);
        args
    }

    /// `podman exec` in a running container; returns its stdout.
    pub fn exec(&self, container: &str, cmd: &[&str]) -> Result<String> {
        let mut args = vec!["exec", container];
        args.extend_from_slice(cmd);
        self.ok(&args)
    }

    /// `podman inspect --format` of a container.
    pub fn inspect(&self, container: &str, format: &str) -> Result<String> {
        Ok(self
            .ok(&["inspect", "--format", format, container])?
            .trim()
            .to_owned())
    }

    /// `podman rm -f` without the 10 s grace period: the image's sleep is
    /// PID 1 and ignores SIGTERM.
    pub fn remove(&self, container: &str) -> Result<()> {
        self.ok(&["rm", "-f", "-t", "0", container]).map(drop)
    }

    /// A path inside podman's mount namespace (e.g. a netns under
    /// `/run/netns`), as the test process can open it.
    pub fn host_path(&self, inner: &Path) -> Result<PathBuf> {
        let pid = self.holder_pid()?;
        let rel = inner.strip_prefix("/").unwrap_or(inner);
        Ok(PathBuf::from(format!("/proc/{pid}/root")).join(rel))
    }

    /// Mount points at or below `dir` in podman's mount namespace.
    pub fn mounts_under(&self, dir: &Path) -> Result<Vec<String>> {
        Ok(mounts_of(self.holder_pid()?, dir))
    }

    /// libcni's cache (`/var/lib/cni` in podman's mount namespace):
    /// `results/<network>-<container ID>-<ifname>` holds the CNI_ARGS and the
    /// ADD result podman hands back on DEL.
    pub fn cni_cache_dir(&self) -> PathBuf {
        self.path("cni-cache")
    }

    /// What is under `/run/netns` in podman's mount namespace: the netns
    /// files of its containers (the mounts on them are only seen there).
    pub fn netns_dir(&self) -> PathBuf {
        self.path("netns")
    }

    /// runc's state (`/run/runc` in podman's mount namespace).
    pub fn runc_dir(&self) -> PathBuf {
        self.path("runc")
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn holder_pid(&self) -> Result<u32> {
        self.holder
            .as_ref()
            .map(Child::id)
            .context("podman's mount namespace is gone")
    }

    fn wait_held(&mut self) -> Result<()> {
        let deadline = Instant::now() + HOLD_TIMEOUT;
        let held = self.path("held");
        let log_path = self.path("holder.log");
        let log = || fs::read_to_string(&log_path).unwrap_or_default();
        while !held.exists() {
            if let Some(child) = self.holder.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!(
                    "the holder of podman's mount namespace exited ({status}): {}",
                    log()
                );
            }
            if Instant::now() >= deadline {
                bail!(
                    "podman's mount namespace not ready after {HOLD_TIMEOUT:?}: {}",
                    log()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// Best effort: podman removes its containers (so the plugin gets its
    /// DEL), then what outlives podman goes (conmon, cleanup processes),
    /// then the holder, taking the mount namespace and every mount in it.
    fn shutdown(&mut self) {
        if self.holder.is_some() {
            let _ = self.output(&["rm", "-a", "-f", "-t", "0"]);
        }
        kill_and_wait(&processes_mentioning(self.dir.path()));
        // Containers podman could not remove: their processes name nothing
        // of the harness, but they are in its cgroups, and each keeps its
        // netns (and so its veth) alive.
        kill_and_wait(&processes_in_cgroups(&self.cgroup_parent));
        if let Some(mut holder) = self.holder.take() {
            let _ = holder.kill();
            let _ = holder.wait();
        }
        remove_cgroups(&self.cgroup_parent);
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        self.shutdown();
        // The tempdir goes next, with podman's storage and state in it.
    }
}

/// The CNI `type` the plugin answers to: its file name.
fn plugin_type(plugin: &Path) -> Result<&std::ffi::OsStr> {
    plugin
        .file_name()
        .with_context(|| format!("plugin path {} has no file name", plugin.display()))
}

/// A TOML basic string: JSON's escapes are TOML's.
fn toml_str(path: &Path) -> Result<String> {
    let s = path
        .to_str()
        .with_context(|| format!("{} is not UTF-8", path.display()))?;
    Ok(serde_json::to_string(s)?)
}

fn containers_conf(dir: &Path, cni_conf_dir: &Path) -> Result<String> {
    let p = |rel: &str| toml_str(&dir.join(rel));
    Ok(format!(
        r#"[containers]
log_driver = "k8s-file"
# podman 4.3 gives a root container RLIMIT_NOFILE 1048576 and RLIMIT_NPROC
# pid_max, which runc sets with prlimit(2); without CAP_SYS_RESOURCE (root
# here lacks it) that fails: "error setting rlimit type 7: operation not
# permitted". None: the container inherits conmon's, as under containerd.
default_ulimits = []

[engine]
# No systemd on these machines; no journald either.
cgroup_manager = "cgroupfs"
events_logger = "none"
# File locks in tmp_dir instead of the host-wide /dev/shm/libpod_lock.
lock_type = "file"
runtime = "runc"
tmp_dir = {tmp}
image_copy_tmp_dir = {copy_tmp}

[network]
network_backend = "cni"
network_config_dir = {conf}
cni_plugin_dirs = [{bin}]
"#,
        tmp = p("libpod-tmp")?,
        copy_tmp = p("tmp")?,
        conf = toml_str(cni_conf_dir)?,
        bin = p("cni-bin")?,
    ))
}

fn storage_conf(dir: &Path) -> Result<String> {
    // vfs copies the layer instead of mounting overlays: the image is 2 MB,
    // and it needs no mount at all.
    Ok(format!(
        r#"[storage]
driver = "vfs"
graphroot = {root}
runroot = {runroot}
"#,
        root = toml_str(&dir.join("root"))?,
        runroot = toml_str(&dir.join("runroot"))?,
    ))
}
