//! What the manifests must say, committed here: names, allow-lists, pins.

use std::sync::LazyLock;

pub(crate) const NAMESPACE: &str = "kube-system";
pub(crate) const SERVICE_ACCOUNT: &str = "mycni-agent";
pub(crate) const IMAGE: &str = "mycni:dev";
pub(crate) const AGENT: &str = "mycni-agent";
pub(crate) const INSTALL_CNI: &str = "install-cni";
pub(crate) const MOUNT_BPFFS: &str = "mount-bpffs";
pub(crate) const METRICS_PORT: i32 = 9971;
pub(crate) const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// The kustomize base, the overlays' directory and the removal, relative to
/// the workspace.
pub(crate) const BASE: &str = "deploy/base";
pub(crate) const OVERLAYS_DIR: &str = "deploy/overlays";
pub(crate) const CLEANUP: &str = "deploy/cleanup";
/// The ConfigMap kustomize generates (with a hash suffix): the one the
/// agent's errors name.
pub(crate) const CONFIG_MAP: &str = mycni_agent::settings::CONFIG_MAP;
/// The one setting that is not the agent's: the DaemonSet's maxUnavailable.
pub(crate) const MAX_UNAVAILABLE: &str = "max-unavailable";

/// The base's value of each setting its ConfigMap holds, by key.
const BASE_VALUES: &[(&str, &str)] = &[
    ("cluster-cidr", CLUSTER_CIDR),
    ("mtu", "auto"),
    ("underlay", "default-route"),
    ("underlay6", "auto"),
    ("datapath", "ebpf"),
    ("direct-routing", "false"),
    ("masquerade", "true"),
    ("network-policy", "true"),
    ("flow-events", "true"),
    ("flow-history", "4095"),
    ("flow-pod-series", "100"),
    ("metrics-addr", "0.0.0.0:9971"),
    ("liveness-stale-after", "30s"),
];

/// The agent's settings the deploy carries, from the agent's own table
/// (`mycni_agent::settings::DEPLOYED`): ConfigMap key, the agent's
/// environment variable the DaemonSet maps it to, and the base's value.
pub(crate) static SETTINGS: LazyLock<Vec<(&str, &str, &str)>> = LazyLock::new(|| {
    let table = mycni_agent::settings::DEPLOYED;
    assert_eq!(
        table.len(),
        BASE_VALUES.len(),
        "a base value for each of the agent's deployed settings, and no other"
    );
    table
        .iter()
        .map(|s| {
            let (_, v) = BASE_VALUES
                .iter()
                .find(|(k, _)| *k == s.key)
                .unwrap_or_else(|| panic!("no base value for the agent's setting {}", s.key));
            (s.key, s.env, *v)
        })
        .collect()
});

/// Each overlay under deploy/overlays/ and the settings it changes from the
/// base's (everything else renders as the base does).
pub(crate) const OVERLAYS: &[(&str, &[(&str, &str)])] = &[
    (
        "custom-cidr",
        &[
            ("cluster-cidr", "10.32.0.0/12"),
            ("underlay", "can-reach=192.168.0.1"),
        ],
    ),
    ("direct-routing", &[("direct-routing", "true")]),
    ("kernel-datapath", &[("datapath", "kernel")]),
];
/// Where the Dockerfile puts the binaries; the DaemonSet runs them from there.
pub(crate) const AGENT_BIN: &str = "/usr/local/bin/mycni-agent";
pub(crate) const PLUGIN_BIN: &str = "/usr/local/bin/mycni";

/// The capabilities the agent adds after dropping ALL, and why (the long form
/// is next to each in deploy/base/daemonset.yaml and in deploy/README.md). Adding
/// one to the manifest without adding it here fails the test.
pub(crate) const AGENT_CAPABILITIES: &[(&str, &str)] = &[
    (
        "NET_ADMIN",
        "netlink links/addresses/routes/neighbours/FDB of vxlan.1, nftables, \
         BPF_PROG_LOAD of BPF_PROG_TYPE_SCHED_CLS (is_net_admin_prog_type), BPF_PROG_QUERY",
    ),
    (
        "BPF",
        "bpf(2): BPF_MAP_CREATE, BPF_BTF_LOAD, BPF_PROG_LOAD (bpf_capable), kfunc calls",
    ),
    (
        "PERFMON",
        "the verifier's privileged mode (bpf_bypass_spec_v1/v4, allow_ptr_leaks): \
         variable-offset arithmetic on packet pointers",
    ),
    (
        "SYS_ADMIN",
        "only while the programs load: nf_conntrack's BTF object for the kfuncs \
         (BPF_BTF_GET_NEXT_ID, BPF_BTF_GET_FD_BY_ID); the agent drops it after the load",
    ),
];

/// The ClusterRole, exactly: (API group, resource, verbs). The reason for
/// each verb is in deploy/base/rbac.yaml.
pub(crate) const RBAC_RULES: &[(&str, &str, &[&str])] = &[
    ("", "nodes", &["get", "list", "watch"]),
    ("", "nodes/status", &["patch"]),
    ("", "pods", &["list", "watch"]),
    ("", "namespaces", &["list", "watch"]),
    ("networking.k8s.io", "networkpolicies", &["list", "watch"]),
    ("events.k8s.io", "events", &["create", "patch"]),
];

/// Every hostPath mount of the pod: (container, host path, container path,
/// mount propagation). Nothing else from the host is mounted anywhere.
pub(crate) const HOST_MOUNTS: &[(&str, &str, &str, Option<&str>)] = &[
    (
        MOUNT_BPFFS,
        "/sys/fs/bpf",
        "/sys/fs/bpf",
        Some("Bidirectional"),
    ),
    (INSTALL_CNI, "/opt/cni/bin", "/host/opt/cni/bin", None),
    (AGENT, "/etc/cni/net.d", "/host/etc/cni/net.d", None),
    (AGENT, "/var/lib/cni", "/var/lib/cni", None),
    // The propagation decision: the agent only sees the host's bpffs
    // (HostToContainer is allowed unprivileged); the mount is made by the
    // privileged mount-bpffs init container with Bidirectional, the only
    // propagation that reaches the host and one the API server allows only
    // to privileged containers.
    (AGENT, "/sys/fs/bpf", "/sys/fs/bpf", Some("HostToContainer")),
    (AGENT, "/run/mycni", "/run/mycni", None),
    (AGENT, "/var/lib/mycni", "/var/lib/mycni", None),
    (AGENT, "/proc/sys", "/host/proc/sys", None),
];

/// hostPath `type` of each host path: the directories the agent or plugin
/// owns are created on first install; kernel ones must exist.
pub(crate) const HOST_PATH_TYPES: &[(&str, &str)] = &[
    ("/opt/cni/bin", "DirectoryOrCreate"),
    ("/etc/cni/net.d", "DirectoryOrCreate"),
    ("/var/lib/cni", "DirectoryOrCreate"),
    ("/sys/fs/bpf", "Directory"),
    ("/run/mycni", "DirectoryOrCreate"),
    ("/var/lib/mycni", "DirectoryOrCreate"),
    ("/proc/sys", "Directory"),
];

/// The agent's path flags, their defaults in the agent's contract, and the
/// host path whose mount each must point into.
pub(crate) const AGENT_PATH_FLAGS: &[(&str, &str, &str)] = &[
    ("--cni-conf-dir", "/host/etc/cni/net.d", "/etc/cni/net.d"),
    ("--state-dir", "/run/mycni", "/run/mycni"),
    ("--data-dir", "/var/lib/mycni", "/var/lib/mycni"),
    ("--bpffs", "/sys/fs/bpf", "/sys/fs/bpf"),
    ("--proc-sys", "/host/proc/sys", "/proc/sys"),
];
pub(crate) const METRICS_ADDR_DEFAULT: &str = "0.0.0.0:9971";

/// The only privileged container: mounts bpffs on the host if none is there.
pub(crate) const MOUNT_BPFFS_COMMAND: &[&str] = &[
    "/bin/sh",
    "-c",
    "grep -q ' /sys/fs/bpf bpf ' /proc/mounts || mount -t bpf bpf /sys/fs/bpf",
];

/// What the builder stage must install: the build-time part of
/// `cargo xtask setup`'s package list (xtask/src/setup.rs).
pub(crate) const BUILD_PACKAGES: &[&str] = &[
    "llvm-22-dev",
    "libpolly-22-dev",
    "libzstd-dev",
    "zlib1g-dev",
    "clang-22",
    "bpftool",
];
pub(crate) const RUNTIME_PACKAGES: &[&str] = &["iproute2", "nftables"];
/// The object `cargo xtask build-ebpf --release` writes, relative to the
/// workspace root.
pub(crate) const EBPF_OBJECT: &str = "target/ebpf/bpfel-unknown-none/release/mycni-ebpf";
/// What `cargo xtask build-plugin` builds (the image is amd64 only).
pub(crate) const PLUGIN_BINARY: &str = "target/plugin/x86_64-unknown-linux-musl/release/mycni";
