//! A private containerd driven over CRI the way kubelet drives it, so a CNI
//! plugin runs exactly as in production: called by containerd's CRI with
//! `K8S_POD_*` CNI_ARGS, a sandbox netns made by containerd, and libcni's
//! result cache.
//!
//! Isolation from the host:
//! - containerd runs in a network namespace of its own (the "node"), so the
//!   plugin's host side, veths and routes, lives there;
//! - and in a mount namespace of its own (slave of the host's), in which
//!   `/var/lib/cni` (libcni's cache, a fixed path in containerd 1.6) and
//!   `/run/containerd` (shim sockets, also fixed) are bind mounts of
//!   directories in the harness's tempdir and `/sys` is remounted for the node
//!   namespace, as `ip netns exec` does. Every mount containerd and its shims
//!   make (rootfs, shm, the pods' netns files) stays in that namespace and
//!   vanishes with its last process.
//!
//! The API is blocking: the harness owns a small tokio runtime, so it must
//! not be used (or dropped) from inside another async runtime.

mod client;
mod image;

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::runtime::Runtime;

pub use client::{CriClient, ExecOutput, PodStatus};
pub use image::build_busybox_archive;
pub use k8s_cri::v1 as api;

use crate::leftovers::{
    kill_and_wait, mounts_under, processes_mentioning, remove_cgroups, stop_child,
};
use mycni_testkit::{NetNs, sh};

/// The local image: the sandbox image and the default container image.
pub const TEST_IMAGE: &str = "localhost/mycni-test-busybox:1";

const START_TIMEOUT: Duration = Duration::from_secs(20);
/// Per CRI call while dropping: a hung containerd must not hang the test.
const SHUTDOWN_CALL_TIMEOUT: Duration = Duration::from_secs(5);
const NETWORK_READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs inside containerd's new mount namespace, then becomes containerd.
/// `$1` is the harness's directory. The cgroup (and bpf) mounts are carried
/// over the fresh sysfs because runc needs them.
const LAUNCH: &str = r#"set -eu
dir=$1
mkdir -p /var/lib/cni /run/containerd
mount --bind "$dir/cni-cache" /var/lib/cni
mount --bind "$dir/run-containerd" /run/containerd
for fs in cgroup bpf; do
  if mountpoint -q "/sys/fs/$fs"; then
    mkdir -p "$dir/sys-save/$fs"
    mount --rbind "/sys/fs/$fs" "$dir/sys-save/$fs"
  fi
done
mount -t sysfs sysfs /sys
for fs in cgroup bpf; do
  if [ -d "$dir/sys-save/$fs" ] && mountpoint -q "$dir/sys-save/$fs"; then
    mount --move "$dir/sys-save/$fs" "/sys/fs/$fs"
  fi
done
exec containerd --config "$dir/config.toml"
"#;

/// A private containerd in its own network namespace, with the busybox test
/// image imported. Everything it made is removed on drop.
pub struct ContainerdHarness {
    rt: Runtime,
    client: CriClient,
    containerd: Option<Child>,
    /// Sandboxes created through the harness, with the config kubelet would
    /// pass again to CreateContainer.
    sandboxes: Mutex<HashMap<String, api::PodSandboxConfig>>,
    /// Every pod's cgroups go below this one, as kubelet puts them below
    /// /kubepods, so the harness can remove what runc leaves behind.
    cgroup_parent: String,
    node: NetNs,
    dir: tempfile::TempDir,
}

impl ContainerdHarness {
    /// Starts containerd with CRI using the CNI binaries in `cni_bin_dir` and
    /// the first config in `cni_conf_dir`, and imports [`TEST_IMAGE`].
    pub fn start(cni_bin_dir: &Path, cni_conf_dir: &Path) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("mycni-cri-").tempdir()?;
        let node = NetNs::new("cri")?;
        for d in [
            "cni-cache",
            "run-containerd",
            "root",
            "state",
            "pods",
            "image",
        ] {
            fs::create_dir(dir.path().join(d))?;
        }
        fs::write(
            dir.path().join("config.toml"),
            containerd_config(dir.path(), cni_bin_dir, cni_conf_dir),
        )?;
        // The image is built before containerd starts so a failure here
        // leaves nothing running.
        let archive = dir.path().join("image.tar");
        build_busybox_archive(&dir.path().join("image"), TEST_IMAGE, &archive)?;

        let log = fs::File::create(dir.path().join("containerd.log"))?;
        let child = Command::new("nsenter")
            .arg(format!("--net={}", node.path().display()))
            .args(["--", "unshare", "--mount", "--propagation", "slave", "--"])
            .args(["sh", "-c", LAUNCH, "sh"])
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("spawn containerd")?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let client = {
            let _guard = rt.enter();
            CriClient::new_lazy(&dir.path().join("containerd.sock"))?
        };
        let cgroup_parent = format!("/{}", node.name());
        let mut harness = Self {
            rt,
            client,
            containerd: Some(child),
            sandboxes: Mutex::new(HashMap::new()),
            cgroup_parent,
            node,
            dir,
        };
        harness.wait_started()?;
        harness.import_image(&archive)?;
        Ok(harness)
    }

    /// The node network namespace containerd runs in: the plugins' host side.
    pub fn node(&self) -> &NetNs {
        &self.node
    }

    /// The async CRI client, for calls this harness doesn't wrap.
    pub fn client(&self) -> &CriClient {
        &self.client
    }

    /// Runs a future on the harness's runtime, e.g. a raw [`CriClient`] call.
    pub fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// libcni's result cache (`/var/lib/cni` inside containerd's mount
    /// namespace): `results/<network>-<sandbox id>-<ifname>` holds the
    /// CNI_ARGS and the ADD result containerd will hand back on DEL.
    pub fn cni_cache_dir(&self) -> PathBuf {
        self.dir.path().join("cni-cache")
    }

    /// containerd's log, for failure messages.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("containerd.log")
    }

    /// The last `lines` lines of containerd's log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = fs::read_to_string(self.log_path()).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Waits for CRI's NetworkReady condition, which kubelet also waits for
    /// before it starts a pod that isn't host-network.
    pub fn wait_network_ready(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let conditions = self.rt.block_on(self.client.status())?;
            let network = conditions.iter().find(|c| c.r#type == "NetworkReady");
            if network.is_some_and(|c| c.status) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("CRI network not ready after {timeout:?}: {network:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// RunPodSandbox with a config like kubelet's for a pod `namespace/name`,
    /// then returns the sandbox ID. The pod's network is set up when this
    /// returns.
    pub fn run_pod_sandbox(&self, name: &str, namespace: &str, uid: &str) -> Result<String> {
        self.wait_network_ready(NETWORK_READY_TIMEOUT)?;
        let config = sandbox_config(self.dir.path(), &self.cgroup_parent, name, namespace, uid)?;
        let id = self
            .rt
            .block_on(self.client.run_pod_sandbox(config.clone()))
            .with_context(|| format!("containerd log:\n{}", self.log_tail(20)))?;
        self.lock_sandboxes().insert(id.clone(), config);
        Ok(id)
    }

    pub fn pod_sandbox_status(&self, id: &str) -> Result<PodStatus> {
        self.rt.block_on(self.client.pod_sandbox_status(id))
    }

    /// The sandbox's netns as a path the test process can open: the netns
    /// file is a bind mount that exists only in containerd's mount namespace.
    pub fn netns_host_path(&self, status: &PodStatus) -> Result<PathBuf> {
        let pid = self.containerd_pid()?;
        let inner = status
            .netns_path
            .strip_prefix("/")
            .unwrap_or(&status.netns_path);
        Ok(PathBuf::from(format!("/proc/{pid}/root")).join(inner))
    }

    /// Runs a host program inside the sandbox's network namespace only
    /// (nsenter), as the CNI plugin saw it. Cheaper than a container.
    pub fn pod_netns_exec(&self, sandbox_id: &str, program: &str, args: &[&str]) -> Result<String> {
        let status = self.pod_sandbox_status(sandbox_id)?;
        let net = format!("--net={}", self.netns_host_path(&status)?.display());
        let mut full = vec![net.as_str(), "--", program];
        full.extend_from_slice(args);
        sh("nsenter", &full)
    }

    pub fn stop_pod_sandbox(&self, id: &str) -> Result<()> {
        self.rt.block_on(self.client.stop_pod_sandbox(id))
    }

    /// RemovePodSandbox; the harness stops tracking the sandbox once it is
    /// gone.
    pub fn remove_pod_sandbox(&self, id: &str) -> Result<()> {
        self.rt.block_on(self.client.remove_pod_sandbox(id))?;
        self.lock_sandboxes().remove(id);
        Ok(())
    }

    /// CreateContainer + StartContainer of [`TEST_IMAGE`] running `command`
    /// in the sandbox; returns the container ID.
    pub fn run_container(&self, sandbox_id: &str, name: &str, command: &[&str]) -> Result<String> {
        let sandbox_config = self
            .lock_sandboxes()
            .get(sandbox_id)
            .cloned()
            .with_context(|| format!("sandbox {sandbox_id} was not created by this harness"))?;
        let config = api::ContainerConfig {
            metadata: Some(api::ContainerMetadata {
                name: name.to_owned(),
                attempt: 0,
            }),
            image: Some(api::ImageSpec {
                image: TEST_IMAGE.to_owned(),
                ..Default::default()
            }),
            command: command.iter().map(|s| (*s).to_owned()).collect(),
            log_path: format!("{name}/0.log"),
            linux: Some(api::LinuxContainerConfig::default()),
            ..Default::default()
        };
        let id = self
            .rt
            .block_on(
                self.client
                    .create_container(sandbox_id, config, sandbox_config),
            )
            .with_context(|| format!("containerd log:\n{}", self.log_tail(20)))?;
        self.rt.block_on(self.client.start_container(&id))?;
        Ok(id)
    }

    /// ExecSync in a container; a non-zero exit is returned, not an error.
    pub fn exec_sync(&self, container_id: &str, cmd: &[&str]) -> Result<ExecOutput> {
        self.rt.block_on(
            self.client
                .exec_sync(container_id, cmd, Duration::from_secs(20)),
        )
    }

    fn lock_sandboxes(&self) -> std::sync::MutexGuard<'_, HashMap<String, api::PodSandboxConfig>> {
        // A panic while holding the lock can't leave the map inconsistent.
        self.sandboxes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn containerd_pid(&self) -> Result<u32> {
        self.containerd
            .as_ref()
            .map(Child::id)
            .context("containerd is not running")
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("containerd.sock")
    }

    /// Waits for CRI to report RuntimeReady.
    fn wait_started(&mut self) -> Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(conditions) = self.rt.block_on(self.client.status())
                && conditions
                    .iter()
                    .any(|c| c.r#type == "RuntimeReady" && c.status)
            {
                return Ok(());
            }
            if let Some(child) = self.containerd.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!("containerd exited ({status}):\n{}", self.log_tail(30));
            }
            if Instant::now() >= deadline {
                bail!(
                    "containerd not ready after {START_TIMEOUT:?}:\n{}",
                    self.log_tail(30)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Imports into containerd's `k8s.io` namespace, the one CRI uses, and
    /// unpacks for the snapshotter CRI is configured with.
    fn import_image(&self, archive: &Path) -> Result<()> {
        sh(
            "ctr",
            &[
                "--address",
                &self.socket().to_string_lossy(),
                "--namespace",
                "k8s.io",
                "images",
                "import",
                "--snapshotter",
                SNAPSHOTTER,
                &archive.to_string_lossy(),
            ],
        )?;
        Ok(())
    }

    /// Best effort, in the order that leaves the least behind: CRI removes
    /// the sandboxes (so the plugin gets its DEL), runc kills what CRI could
    /// not, then containerd and its shims go, taking their mount namespace
    /// and every mount in it along.
    fn shutdown(&mut self) {
        let ids: Vec<String> = self.lock_sandboxes().keys().cloned().collect();
        for id in ids {
            let client = &self.client;
            let _ = self.rt.block_on(async {
                tokio::time::timeout(SHUTDOWN_CALL_TIMEOUT, client.stop_pod_sandbox(&id)).await
            });
            let _ = self.rt.block_on(async {
                tokio::time::timeout(SHUTDOWN_CALL_TIMEOUT, client.remove_pod_sandbox(&id)).await
            });
        }
        let runc_root = self.dir.path().join("state/runc/k8s.io");
        if let Ok(entries) = fs::read_dir(&runc_root) {
            for e in entries.flatten() {
                let _ = Command::new("runc")
                    .arg("--root")
                    .arg(&runc_root)
                    .args(["delete", "--force"])
                    .arg(e.file_name())
                    .output();
            }
        }
        if let Some(mut child) = self.containerd.take() {
            stop_child(&mut child);
        }
        kill_and_wait(&processes_mentioning(self.dir.path()));
        remove_cgroups(&self.cgroup_parent);
        // Nothing should be mounted under the tempdir in this mount namespace,
        // but a leftover mount would make the tempdir's removal fail.
        for m in mounts_under(self.dir.path()).iter().rev() {
            let _ = Command::new("umount").arg("-l").arg(m).output();
        }
    }
}

impl Drop for ContainerdHarness {
    fn drop(&mut self) {
        self.shutdown();
        // Fields drop next: the node namespace (with any veth left in it),
        // then the tempdir.
    }
}

/// The snapshotter CRI unpacks images for. `native` copies each layer
/// instead of mounting overlays: slower for big images, but the busybox
/// image is 2 MB and it works on every filesystem.
const SNAPSHOTTER: &str = "native";

fn containerd_config(dir: &Path, cni_bin_dir: &Path, cni_conf_dir: &Path) -> String {
    let d = dir.display();
    let bin = cni_bin_dir.display();
    let conf = cni_conf_dir.display();
    // Everything containerd writes lives under `dir`; runc's state root is
    // set too, as its default is the host-wide /run/containerd/runc.
    format!(
        r#"version = 2
root = "{d}/root"
state = "{d}/state"
# Not needed by CRI, and they only slow start-up or log errors here.
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "{d}/containerd.sock"

[ttrpc]
  address = "{d}/containerd.sock.ttrpc"

[debug]
  level = "info"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{TEST_IMAGE}"
  # The pods' netns files then live in containerd's state dir, not in the
  # host's /run/netns.
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  # runc would set the sandbox's oom_score_adj to -998, which needs
  # CAP_SYS_RESOURCE; this caps it at containerd's own value instead.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{bin}"
    conf_dir = "{conf}"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "{SNAPSHOTTER}"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "{d}/state/runc"
"#
    )
}

/// What kubelet sends for a plain pod: its own network, IPC and per-container
/// PID namespaces, the kubelet labels, a log directory.
fn sandbox_config(
    dir: &Path,
    cgroup_parent: &str,
    name: &str,
    namespace: &str,
    uid: &str,
) -> Result<api::PodSandboxConfig> {
    let log_dir = dir.join("pods").join(format!("{namespace}_{name}_{uid}"));
    fs::create_dir_all(&log_dir)?;
    let labels = HashMap::from([
        ("io.kubernetes.pod.name".to_owned(), name.to_owned()),
        (
            "io.kubernetes.pod.namespace".to_owned(),
            namespace.to_owned(),
        ),
        ("io.kubernetes.pod.uid".to_owned(), uid.to_owned()),
    ]);
    Ok(api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: name.to_owned(),
            uid: uid.to_owned(),
            namespace: namespace.to_owned(),
            attempt: 0,
        }),
        hostname: name.to_owned(),
        log_directory: log_dir.to_string_lossy().into_owned(),
        labels,
        linux: Some(api::LinuxPodSandboxConfig {
            cgroup_parent: format!("{cgroup_parent}/pod{uid}"),
            security_context: Some(api::LinuxSandboxSecurityContext {
                namespace_options: Some(api::NamespaceOption {
                    network: api::NamespaceMode::Pod.into(),
                    pid: api::NamespaceMode::Container.into(),
                    ipc: api::NamespaceMode::Pod.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    })
}
