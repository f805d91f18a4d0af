//! The deployment manifests under `deploy/`, checked without a cluster.
//!
//! Every YAML document parses into its Kubernetes API type, strictly: the
//! parsed object serialised again must equal the document, so a misspelt
//! field (which serde would silently drop) fails. Then the decisions that
//! `deploy/daemonset.yaml`, `deploy/rbac.yaml` and `deploy/README.md` explain
//! are checked against the committed allow-lists below, and the Dockerfile is
//! checked against what its builder stage produces and what the DaemonSet
//! runs (no container engine is available to build it).
//!
//! Each check is a function over the parsed manifests.
//! `each_check_catches_its_breakage`, `dockerfile_checks_catch_their_breakage`
//! and `strict_parsing_rejects_typos_unknown_kinds_and_bad_yaml` break the
//! real files in the ways the checks guard against and require them to fail,
//! so none passes vacuously.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, PodSpec, ServiceAccount, Toleration};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::serde::Deserialize;
use k8s_openapi::serde::Serialize;
use k8s_openapi::serde::de::DeserializeOwned;
use serde_json::Value;

type Check<T> = Result<T, String>;

const NAMESPACE: &str = "kube-system";
const SERVICE_ACCOUNT: &str = "mycni-agent";
const IMAGE: &str = "mycni:dev";
const AGENT: &str = "mycni-agent";
const INSTALL_CNI: &str = "install-cni";
const MOUNT_BPFFS: &str = "mount-bpffs";
const METRICS_PORT: i32 = 9971;
const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// Where the Dockerfile puts the binaries; the DaemonSet runs them from there.
const AGENT_BIN: &str = "/usr/local/bin/mycni-agent";
const PLUGIN_BIN: &str = "/usr/local/bin/mycni";

/// The capabilities the agent adds after dropping ALL, and why (the long form
/// is next to each in deploy/daemonset.yaml and in deploy/README.md). Adding
/// one to the manifest without adding it here fails the test.
const AGENT_CAPABILITIES: &[(&str, &str)] = &[
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
];

/// The ClusterRole, exactly: (API group, resource, verbs). The reason for
/// each verb is in deploy/rbac.yaml.
const RBAC_RULES: &[(&str, &str, &[&str])] = &[
    ("", "nodes", &["get", "list", "watch", "patch"]),
    ("", "nodes/status", &["patch"]),
];

/// Every hostPath mount of the pod: (container, host path, container path,
/// mount propagation). Nothing else from the host is mounted anywhere.
const HOST_MOUNTS: &[(&str, &str, &str, Option<&str>)] = &[
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
const HOST_PATH_TYPES: &[(&str, &str)] = &[
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
const AGENT_PATH_FLAGS: &[(&str, &str, &str)] = &[
    ("--cni-conf-dir", "/host/etc/cni/net.d", "/etc/cni/net.d"),
    ("--state-dir", "/run/mycni", "/run/mycni"),
    ("--data-dir", "/var/lib/mycni", "/var/lib/mycni"),
    ("--bpffs", "/sys/fs/bpf", "/sys/fs/bpf"),
    ("--proc-sys", "/host/proc/sys", "/proc/sys"),
];
const METRICS_ADDR_DEFAULT: &str = "0.0.0.0:9971";

/// The only privileged container: mounts bpffs on the host if none is there.
const MOUNT_BPFFS_COMMAND: &[&str] = &[
    "/bin/sh",
    "-c",
    "grep -q ' /sys/fs/bpf bpf ' /proc/mounts || mount -t bpf bpf /sys/fs/bpf",
];

/// What the builder stage must install: the build-time part of
/// `cargo xtask setup`'s package list (xtask/src/setup.rs).
const BUILD_PACKAGES: &[&str] = &[
    "llvm-22-dev",
    "libpolly-22-dev",
    "libzstd-dev",
    "zlib1g-dev",
    "clang-22",
    "bpftool",
];
const RUNTIME_PACKAGES: &[&str] = &["iproute2", "nftables"];
/// The object `cargo xtask build-ebpf --release` writes, relative to the
/// workspace root.
const EBPF_OBJECT: &str = "target/ebpf/bpfel-unknown-none/release/mycni-ebpf";

fn workspace() -> PathBuf {
    // tests/e2e -> the workspace root.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("../.."))
}

fn read(rel: &str) -> String {
    let path = workspace().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

// ---------------------------------------------------------------------------
// Loading: every YAML document under deploy/, strictly.

#[derive(Clone)]
struct Deploy {
    daemonset: DaemonSet,
    service_account: ServiceAccount,
    cluster_role: ClusterRole,
    binding: ClusterRoleBinding,
}

/// Every `.yaml`/`.yml` file under deploy/, recursively: (relative name, text).
fn deploy_yaml_files() -> Vec<(String, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let entries =
            std::fs::read_dir(dir).unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()));
        for entry in entries {
            let path = entry
                .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
                .path();
            if path.is_dir() {
                walk(&path, out);
            } else if matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml")
            ) {
                out.push(path);
            }
        }
    }
    let root = workspace();
    let mut paths = Vec::new();
    walk(&root.join("deploy"), &mut paths);
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            let name = p.strip_prefix(&root).unwrap_or(&p).display().to_string();
            let text = std::fs::read_to_string(&p)
                .unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
            (name, text)
        })
        .collect()
}

/// Parses `raw` as `T` and requires that serialising it again gives back
/// exactly `raw`: what the API types do not know would otherwise be dropped
/// without a word (the API server drops or rejects it too).
fn parse_strict<T: DeserializeOwned + Serialize>(raw: &Value, what: &str) -> Check<T> {
    let parsed: T = serde_json::from_value(raw.clone()).map_err(|e| format!("{what}: {e}"))?;
    let again = serde_json::to_value(&parsed).map_err(|e| format!("{what}: {e}"))?;
    if &again != raw {
        let mut diffs = Vec::new();
        diff(raw, &again, String::new(), &mut diffs);
        return Err(format!(
            "{what}: not a faithful {}; fields unknown to the API or changed by parsing: {}",
            std::any::type_name::<T>(),
            diffs.join("; ")
        ));
    }
    Ok(parsed)
}

fn diff(original: &Value, again: &Value, at: String, out: &mut Vec<String>) {
    match (original, again) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                match b.get(k) {
                    Some(w) => diff(v, w, format!("{at}/{k}"), out),
                    None => out.push(format!("{at}/{k} (unknown field)")),
                }
            }
            for k in b.keys().filter(|k| !a.contains_key(*k)) {
                out.push(format!("{at}/{k} (added by parsing)"));
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (v, w)) in a.iter().zip(b).enumerate() {
                diff(v, w, format!("{at}/{i}"), out);
            }
        }
        _ if original != again => out.push(format!("{at}: {original} became {again}")),
        _ => {}
    }
}

fn load_from(files: &[(String, String)]) -> Check<Deploy> {
    let mut daemonsets = Vec::new();
    let mut service_accounts = Vec::new();
    let mut cluster_roles = Vec::new();
    let mut bindings = Vec::new();
    for (name, text) in files {
        for (i, doc) in serde_norway::Deserializer::from_str(text).enumerate() {
            let what = format!("{name} document {i}");
            let raw = Value::deserialize(doc).map_err(|e| format!("{what}: not YAML: {e}"))?;
            if raw.is_null() {
                continue; // an empty document, e.g. after a trailing `---`
            }
            let kind = (
                raw.get("apiVersion").and_then(Value::as_str).unwrap_or(""),
                raw.get("kind").and_then(Value::as_str).unwrap_or(""),
            );
            match kind {
                ("apps/v1", "DaemonSet") => daemonsets.push(parse_strict(&raw, &what)?),
                ("v1", "ServiceAccount") => service_accounts.push(parse_strict(&raw, &what)?),
                ("rbac.authorization.k8s.io/v1", "ClusterRole") => {
                    cluster_roles.push(parse_strict(&raw, &what)?)
                }
                ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
                    bindings.push(parse_strict(&raw, &what)?)
                }
                (api, kind) => {
                    return Err(format!(
                        "{what}: unexpected kind {kind:?} (apiVersion {api:?}); \
                         deploy/ holds a DaemonSet, a ServiceAccount, a ClusterRole and a ClusterRoleBinding"
                    ));
                }
            }
        }
    }
    Ok(Deploy {
        daemonset: exactly_one(daemonsets, "DaemonSet")?,
        service_account: exactly_one(service_accounts, "ServiceAccount")?,
        cluster_role: exactly_one(cluster_roles, "ClusterRole")?,
        binding: exactly_one(bindings, "ClusterRoleBinding")?,
    })
}

fn exactly_one<T>(mut found: Vec<T>, kind: &str) -> Check<T> {
    match found.len() {
        1 => Ok(found.remove(0)),
        n => Err(format!("deploy/ must hold exactly one {kind}, found {n}")),
    }
}

fn load() -> Deploy {
    load_from(&deploy_yaml_files()).unwrap_or_else(|e| panic!("{e}"))
}

// ---------------------------------------------------------------------------
// Accessors.

fn pod(d: &Deploy) -> Check<&PodSpec> {
    d.daemonset
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .ok_or_else(|| "the DaemonSet has no pod template spec".to_string())
}

fn init_containers(p: &PodSpec) -> &[Container] {
    p.init_containers.as_deref().unwrap_or_default()
}

fn all_containers(p: &PodSpec) -> impl Iterator<Item = &Container> {
    init_containers(p).iter().chain(&p.containers)
}

fn container<'a>(p: &'a PodSpec, name: &str) -> Check<&'a Container> {
    all_containers(p)
        .find(|c| c.name == name)
        .ok_or_else(|| format!("no container {name:?} in the pod"))
}

fn agent(d: &Deploy) -> Check<&Container> {
    let p = pod(d)?;
    p.containers
        .iter()
        .find(|c| c.name == AGENT)
        .ok_or_else(|| format!("no main container {AGENT:?}"))
}

/// command followed by args: what the container executes.
fn argv(c: &Container) -> Vec<&str> {
    c.command
        .iter()
        .chain(c.args.iter())
        .flatten()
        .map(String::as_str)
        .collect()
}

/// The value of `--flag=value` or `--flag value` in `argv`.
fn flag<'a>(argv: &[&'a str], name: &str) -> Option<&'a str> {
    argv.iter().enumerate().find_map(|(i, a)| {
        if *a == name {
            argv.get(i + 1).copied()
        } else {
            a.strip_prefix(name).and_then(|v| v.strip_prefix('='))
        }
    })
}

fn privileged(c: &Container) -> bool {
    c.security_context
        .as_ref()
        .and_then(|s| s.privileged)
        .unwrap_or(false)
}

fn sorted<'a>(v: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut v: Vec<&str> = v.into_iter().collect();
    v.sort_unstable();
    v
}

// ---------------------------------------------------------------------------
// The checks.

fn check_pod_basics(d: &Deploy) -> Check<()> {
    let ds = &d.daemonset;
    if ds.metadata.name.as_deref() != Some(AGENT)
        || ds.metadata.namespace.as_deref() != Some(NAMESPACE)
    {
        return Err(format!("the DaemonSet must be {NAMESPACE}/{AGENT}"));
    }
    let spec = ds.spec.as_ref().ok_or("the DaemonSet has no spec")?;
    let p = pod(d)?;
    if p.host_network != Some(true) {
        return Err("hostNetwork must be true: the agent programs the host's network".into());
    }
    if p.priority_class_name.as_deref() != Some("system-node-critical") {
        return Err("priorityClassName must be system-node-critical".into());
    }
    let strategy = spec.update_strategy.as_ref().ok_or("no updateStrategy")?;
    let max_unavailable = strategy
        .rolling_update
        .as_ref()
        .and_then(|r| r.max_unavailable.as_ref());
    if strategy.type_.as_deref() != Some("RollingUpdate")
        || max_unavailable != Some(&IntOrString::Int(1))
    {
        return Err("updateStrategy must be RollingUpdate with maxUnavailable 1".into());
    }
    // The API server rejects a selector that does not match the template.
    let selector = spec.selector.match_labels.clone().unwrap_or_default();
    let labels = spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone());
    let labels = labels.unwrap_or_default();
    if selector.is_empty() || selector.iter().any(|(k, v)| labels.get(k) != Some(v)) {
        return Err(format!(
            "selector {selector:?} must match the template labels {labels:?}"
        ));
    }
    for c in all_containers(p) {
        if c.image.as_deref() != Some(IMAGE) {
            return Err(format!("container {} must run {IMAGE}", c.name));
        }
    }
    let names: BTreeSet<&str> = all_containers(p).map(|c| c.name.as_str()).collect();
    if names.len() != all_containers(p).count() {
        return Err("container names must be unique".into());
    }
    Ok(())
}

/// A toleration that matches every taint with `effect`: `operator: Exists`
/// and no key, and either that effect or none (all effects).
fn tolerates_all(tolerations: &[Toleration], effect: &str) -> bool {
    tolerations.iter().any(|t| {
        t.operator.as_deref() == Some("Exists")
            && t.key.as_deref().unwrap_or("").is_empty()
            && t.effect.as_deref().is_none_or(|e| e == effect)
    })
}

fn check_tolerations(d: &Deploy) -> Check<()> {
    let tolerations = pod(d)?.tolerations.as_deref().unwrap_or_default();
    for effect in ["NoSchedule", "NoExecute"] {
        if !tolerates_all(tolerations, effect) {
            return Err(format!(
                "no `operator: Exists` toleration for every {effect} taint \
                 (a node is NotReady, and tainted, until the CNI runs)"
            ));
        }
    }
    Ok(())
}

/// Not privileged, no escalation, drop ALL, add exactly `add`.
fn check_confined(c: &Container, add: &[&str]) -> Check<()> {
    let sc = c
        .security_context
        .as_ref()
        .ok_or_else(|| format!("{}: no securityContext", c.name))?;
    if sc.privileged != Some(false) {
        return Err(format!("{}: privileged must be false", c.name));
    }
    if sc.allow_privilege_escalation != Some(false) {
        return Err(format!(
            "{}: allowPrivilegeEscalation must be false",
            c.name
        ));
    }
    let caps = sc.capabilities.as_ref();
    let drop = caps.and_then(|c| c.drop.clone()).unwrap_or_default();
    if drop != ["ALL"] {
        return Err(format!(
            "{}: capabilities.drop must be [ALL], is {drop:?}",
            c.name
        ));
    }
    let added = caps.and_then(|c| c.add.clone()).unwrap_or_default();
    let got = sorted(added.iter().map(String::as_str));
    if got != sorted(add.iter().copied()) {
        return Err(format!(
            "{}: capabilities.add must be exactly {add:?} (the committed allow-list), is {added:?}",
            c.name
        ));
    }
    Ok(())
}

fn check_agent_capabilities(d: &Deploy) -> Check<()> {
    let allowed: Vec<&str> = AGENT_CAPABILITIES.iter().map(|(c, _)| *c).collect();
    check_confined(agent(d)?, &allowed)
}

/// The seccomp and AppArmor decisions (see the comment in daemonset.yaml):
/// the agent is Unconfined because the runtimes' defaults block bpf(2) and
/// pinning; install-cni keeps RuntimeDefault.
fn check_lsm_profiles(d: &Deploy) -> Check<()> {
    let a = agent(d)?;
    let sc = a
        .security_context
        .as_ref()
        .ok_or("agent: no securityContext")?;
    let seccomp = sc.seccomp_profile.as_ref().map(|p| p.type_.as_str());
    let apparmor = sc.app_armor_profile.as_ref().map(|p| p.type_.as_str());
    if seccomp != Some("Unconfined") || apparmor != Some("Unconfined") {
        return Err(format!(
            "agent: seccompProfile and appArmorProfile must be Unconfined \
             (is {seccomp:?}, {apparmor:?})"
        ));
    }
    let install = container(pod(d)?, INSTALL_CNI)?;
    let seccomp = install
        .security_context
        .as_ref()
        .and_then(|s| s.seccomp_profile.as_ref())
        .map(|p| p.type_.as_str());
    if seccomp != Some("RuntimeDefault") {
        return Err(format!(
            "{INSTALL_CNI}: seccompProfile must be RuntimeDefault"
        ));
    }
    Ok(())
}

fn check_install_cni(d: &Deploy) -> Check<()> {
    let p = pod(d)?;
    let c = init_containers(p)
        .iter()
        .find(|c| c.name == INSTALL_CNI)
        .ok_or_else(|| format!("no init container {INSTALL_CNI:?}"))?;
    let want = [
        AGENT_BIN,
        "install-cni",
        "--src",
        PLUGIN_BIN,
        "--dst-dir",
        "/host/opt/cni/bin",
    ];
    if argv(c) != want {
        return Err(format!(
            "{INSTALL_CNI} must run {want:?}, runs {:?}",
            argv(c)
        ));
    }
    check_confined(c, &[])
}

fn check_bpffs_propagation(d: &Deploy) -> Check<()> {
    let p = pod(d)?;
    // The rule the API server enforces (validateMountPropagation).
    for c in all_containers(p) {
        for m in c.volume_mounts.iter().flatten() {
            if m.mount_propagation.as_deref() == Some("Bidirectional") && !privileged(c) {
                return Err(format!(
                    "{}: Bidirectional propagation on {} is refused for unprivileged containers",
                    c.name, m.mount_path
                ));
            }
        }
        let sc = c.security_context.as_ref();
        if privileged(c) && sc.and_then(|s| s.allow_privilege_escalation) == Some(false) {
            return Err(format!(
                "{}: allowPrivilegeEscalation false with privileged true is refused",
                c.name
            ));
        }
    }
    // Our decision: one privileged container, an init container that only mounts bpffs.
    let privileged_names: Vec<&str> = all_containers(p)
        .filter(|c| privileged(c))
        .map(|c| c.name.as_str())
        .collect();
    if privileged_names != [MOUNT_BPFFS] {
        return Err(format!(
            "only {MOUNT_BPFFS} may be privileged, privileged: {privileged_names:?}"
        ));
    }
    let mount = init_containers(p)
        .iter()
        .find(|c| c.name == MOUNT_BPFFS)
        .ok_or_else(|| format!("{MOUNT_BPFFS} must be an init container"))?;
    if argv(mount) != MOUNT_BPFFS_COMMAND {
        return Err(format!(
            "{MOUNT_BPFFS} must run exactly {MOUNT_BPFFS_COMMAND:?}, runs {:?}",
            argv(mount)
        ));
    }
    let mounts: Vec<(&str, Option<&str>)> = mount
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| (m.mount_path.as_str(), m.mount_propagation.as_deref()))
        .collect();
    if mounts != [("/sys/fs/bpf", Some("Bidirectional"))] {
        return Err(format!(
            "{MOUNT_BPFFS} must mount only /sys/fs/bpf, Bidirectional; mounts {mounts:?}"
        ));
    }
    let agent_bpffs = agent(d)?
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == "/sys/fs/bpf")
        .ok_or("the agent does not mount /sys/fs/bpf")?;
    if agent_bpffs.mount_propagation.as_deref() != Some("HostToContainer") {
        return Err("the agent's /sys/fs/bpf must be HostToContainer".into());
    }
    Ok(())
}

fn check_host_mounts(d: &Deploy) -> Check<()> {
    let p = pod(d)?;
    let volumes = p.volumes.as_deref().unwrap_or_default();
    let mut host_paths: BTreeMap<&str, (&str, Option<&str>)> = BTreeMap::new();
    let mut names = BTreeSet::new();
    for v in volumes {
        if !names.insert(v.name.as_str()) {
            return Err(format!("volume {} is defined twice", v.name));
        }
        if let Some(h) = &v.host_path {
            host_paths.insert(v.name.as_str(), (h.path.as_str(), h.type_.as_deref()));
        }
    }
    for (host, kind) in host_paths.values() {
        let want = HOST_PATH_TYPES.iter().find(|(h, _)| h == host);
        match want {
            Some((_, want)) if Some(*want) == *kind => {}
            Some((_, want)) => {
                return Err(format!("hostPath {host}: type must be {want}, is {kind:?}"));
            }
            None => return Err(format!("hostPath {host} is not in the documented list")),
        }
    }
    let mut found = Vec::new();
    for c in all_containers(p) {
        for m in c.volume_mounts.iter().flatten() {
            if !names.contains(m.name.as_str()) {
                return Err(format!("{}: mount of undefined volume {}", c.name, m.name));
            }
            if let Some((host, _)) = host_paths.get(m.name.as_str()) {
                found.push((
                    c.name.as_str(),
                    *host,
                    m.mount_path.as_str(),
                    m.mount_propagation.as_deref(),
                ));
            }
        }
    }
    found.sort_unstable();
    let mut want = HOST_MOUNTS.to_vec();
    want.sort_unstable();
    if found != want {
        return Err(format!(
            "hostPath mounts (container, host, container path, propagation) must be exactly\n  \
             {want:?}\nare\n  {found:?}"
        ));
    }
    let used: BTreeSet<&str> = all_containers(p)
        .flat_map(|c| c.volume_mounts.iter().flatten())
        .map(|m| m.name.as_str())
        .collect();
    if let Some(unused) = names.iter().find(|n| !used.contains(*n)) {
        return Err(format!("volume {unused} is mounted nowhere"));
    }
    Ok(())
}

fn metrics_port(a: &Container) -> Check<i32> {
    let args = argv(a);
    let addr = flag(&args, "--metrics-addr").unwrap_or(METRICS_ADDR_DEFAULT);
    addr.rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .ok_or_else(|| format!("--metrics-addr {addr:?} has no port"))
}

fn check_agent_flags(d: &Deploy) -> Check<()> {
    let a = agent(d)?;
    let args = argv(a);
    if args.first() != Some(&AGENT_BIN) || args.get(1) != Some(&"run") {
        return Err(format!(
            "the agent must run `{AGENT_BIN} run ...`, runs {args:?}"
        ));
    }
    for (name, default, host) in AGENT_PATH_FLAGS {
        let value = flag(&args, name).unwrap_or(default);
        let (_, _, mount_path, _) = HOST_MOUNTS
            .iter()
            .find(|(c, h, _, _)| *c == AGENT && h == host)
            .ok_or_else(|| format!("no documented agent mount of {host}"))?;
        if value != *mount_path {
            return Err(format!(
                "{name} is {value}, but the host's {host} is mounted at {mount_path}"
            ));
        }
    }
    let port = metrics_port(a)?;
    if port != METRICS_PORT {
        return Err(format!("metrics port must be {METRICS_PORT}, is {port}"));
    }
    Ok(())
}

fn check_probes(d: &Deploy) -> Check<()> {
    let a = agent(d)?;
    let port = metrics_port(a)?;
    let ports = a.ports.as_deref().unwrap_or_default();
    let resolve = |p: &IntOrString| match p {
        IntOrString::Int(n) => Some(*n),
        IntOrString::String(name) => ports
            .iter()
            .find(|cp| cp.name.as_deref() == Some(name))
            .map(|cp| cp.container_port),
    };
    if !ports
        .iter()
        .any(|cp| cp.container_port == port && cp.host_port.is_none_or(|h| h == port))
    {
        return Err(format!("the agent must declare containerPort {port}"));
    }
    for (kind, probe, path) in [
        ("readinessProbe", &a.readiness_probe, "/readyz"),
        ("livenessProbe", &a.liveness_probe, "/healthz"),
    ] {
        let get = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .ok_or_else(|| format!("the agent has no HTTP {kind}"))?;
        if get.path.as_deref() != Some(path) || resolve(&get.port) != Some(port) {
            return Err(format!(
                "{kind} must GET {path} on the metrics port {port}, gets {:?} on {:?}",
                get.path, get.port
            ));
        }
    }
    Ok(())
}

fn check_env(d: &Deploy) -> Check<()> {
    let env = agent(d)?.env.as_deref().unwrap_or_default();
    for (name, field) in [
        ("NODE_NAME", "spec.nodeName"),
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
    ] {
        let got = env
            .iter()
            .find(|e| e.name == name)
            .and_then(|e| e.value_from.as_ref())
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.as_str());
        if got != Some(field) {
            return Err(format!(
                "env {name} must come from the downward API field {field}"
            ));
        }
    }
    let cidr = env
        .iter()
        .find(|e| e.name == "MYCNI_CLUSTER_CIDR")
        .and_then(|e| e.value.as_deref());
    if cidr != Some(CLUSTER_CIDR) {
        return Err(format!(
            "MYCNI_CLUSTER_CIDR must be {CLUSTER_CIDR} (kube-controller-manager's --cluster-cidr)"
        ));
    }
    Ok(())
}

/// Bytes or cores of a Kubernetes quantity ("64Mi", "100m", "1").
fn quantity(q: &str) -> Check<f64> {
    const SUFFIXES: &[(&str, f64)] = &[
        ("Ki", 1024.0),
        ("Mi", 1024.0 * 1024.0),
        ("Gi", 1024.0 * 1024.0 * 1024.0),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("m", 1e-3),
    ];
    let (number, scale) = SUFFIXES
        .iter()
        .find_map(|(s, f)| q.strip_suffix(s).map(|n| (n, *f)))
        .unwrap_or((q, 1.0));
    number
        .parse::<f64>()
        .map(|n| n * scale)
        .map_err(|_| format!("bad quantity {q:?}"))
}

/// The agent's memory target: < 50 MB RSS with 5,000 nodes.
const AGENT_RSS_TARGET: f64 = 50e6;

fn check_resources(d: &Deploy) -> Check<()> {
    for c in all_containers(pod(d)?) {
        let r = c
            .resources
            .as_ref()
            .ok_or_else(|| format!("{}: no resources", c.name))?;
        for res in ["cpu", "memory"] {
            let get = |m: &Option<BTreeMap<String, Quantity>>| {
                m.as_ref()
                    .and_then(|m| m.get(res))
                    .map(|q| quantity(&q.0))
                    .transpose()?
                    .ok_or_else(|| format!("{}: no {res} request and limit", c.name))
            };
            let (request, limit) = (get(&r.requests)?, get(&r.limits)?);
            if request > limit {
                return Err(format!("{}: {res} request above its limit", c.name));
            }
            if c.name == AGENT && res == "memory" {
                if request < AGENT_RSS_TARGET {
                    return Err(format!(
                        "{AGENT}: memory request {request} B is below the {AGENT_RSS_TARGET} B RSS target"
                    ));
                }
                if limit > 4.0 * AGENT_RSS_TARGET {
                    return Err(format!(
                        "{AGENT}: memory limit {limit} B is far above the {AGENT_RSS_TARGET} B target"
                    ));
                }
            }
        }
    }
    Ok(())
}

fn check_rbac_rules(d: &Deploy) -> Check<()> {
    let role = &d.cluster_role;
    if role.metadata.name.as_deref() != Some(SERVICE_ACCOUNT) {
        return Err(format!("the ClusterRole must be {SERVICE_ACCOUNT}"));
    }
    let mut got = BTreeSet::new();
    for rule in role.rules.iter().flatten() {
        if rule.resource_names.is_some() || rule.non_resource_urls.is_some() {
            return Err("rules must not use resourceNames or nonResourceURLs".into());
        }
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    got.insert((group.as_str(), resource.as_str(), verb.as_str()));
                }
            }
        }
    }
    let want: BTreeSet<(&str, &str, &str)> = RBAC_RULES
        .iter()
        .flat_map(|(g, r, verbs)| verbs.iter().map(move |v| (*g, *r, *v)))
        .collect();
    if got != want {
        return Err(format!(
            "the ClusterRole must grant exactly {want:?} (the committed allow-list), grants {got:?}"
        ));
    }
    Ok(())
}

fn check_binding(d: &Deploy) -> Check<()> {
    let sa = &d.service_account;
    let p = pod(d)?;
    let sa_ref = (
        sa.metadata.name.as_deref(),
        sa.metadata.namespace.as_deref(),
    );
    if sa_ref != (Some(SERVICE_ACCOUNT), Some(NAMESPACE))
        || p.service_account_name.as_deref() != Some(SERVICE_ACCOUNT)
        || d.daemonset.metadata.namespace.as_deref() != Some(NAMESPACE)
    {
        return Err(format!(
            "the DaemonSet must run as ServiceAccount {NAMESPACE}/{SERVICE_ACCOUNT}, defined beside it"
        ));
    }
    let b = &d.binding;
    let role_ref = &b.role_ref;
    if (
        role_ref.api_group.as_str(),
        role_ref.kind.as_str(),
        Some(role_ref.name.as_str()),
    ) != (
        "rbac.authorization.k8s.io",
        "ClusterRole",
        d.cluster_role.metadata.name.as_deref(),
    ) {
        return Err(format!(
            "the binding must refer to the ClusterRole, refers to {role_ref:?}"
        ));
    }
    let subjects: Vec<(&str, &str, Option<&str>)> = b
        .subjects
        .iter()
        .flatten()
        .map(|s| (s.kind.as_str(), s.name.as_str(), s.namespace.as_deref()))
        .collect();
    if subjects != [("ServiceAccount", SERVICE_ACCOUNT, Some(NAMESPACE))] {
        return Err(format!(
            "the binding's only subject must be the DaemonSet's ServiceAccount, is {subjects:?}"
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The Dockerfile.

#[derive(Debug)]
struct Stage {
    base: String,
    name: Option<String>,
    /// (INSTRUCTION, arguments), continuation lines joined, comments dropped.
    instructions: Vec<(String, String)>,
}

/// (global ARGs before the first FROM, stages).
fn parse_dockerfile(text: &str) -> Check<(Vec<String>, Vec<Stage>)> {
    let mut logical = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => {
                current.push_str(part);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                logical.push(std::mem::take(&mut current));
            }
        }
    }
    if !current.is_empty() {
        return Err("the Dockerfile ends inside a continued line".into());
    }
    let mut global_args = Vec::new();
    let mut stages: Vec<Stage> = Vec::new();
    for l in logical {
        let (keyword, rest) = l
            .split_once(char::is_whitespace)
            .unwrap_or((l.as_str(), ""));
        let keyword = keyword.to_ascii_uppercase();
        let rest = rest.trim().to_string();
        if keyword == "FROM" {
            let words: Vec<&str> = rest.split_whitespace().collect();
            let (base, name) = match words.as_slice() {
                [base] => (*base, None),
                [base, as_, name] if as_.eq_ignore_ascii_case("as") => (*base, Some(*name)),
                _ => return Err(format!("cannot read FROM {rest}")),
            };
            stages.push(Stage {
                base: base.to_string(),
                name: name.map(str::to_string),
                instructions: Vec::new(),
            });
        } else if let Some(stage) = stages.last_mut() {
            stage.instructions.push((keyword, rest));
        } else if keyword == "ARG" {
            global_args.push(rest);
        } else {
            return Err(format!("{keyword} before the first FROM"));
        }
    }
    Ok((global_args, stages))
}

/// `NAME=value` among ARG instructions.
fn arg_default<'a>(args: impl IntoIterator<Item = &'a String>, name: &str) -> Option<&'a str> {
    args.into_iter()
        .find_map(|a| a.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
        .map(|v| v.trim_matches('"'))
}

/// The binaries a workspace package builds: its `[[bin]]` names, or its
/// package name when it has none and a src/main.rs.
fn package_bins(package_dir: &str) -> Vec<String> {
    let manifest = read(&format!("{package_dir}/Cargo.toml"));
    let mut section = String::new();
    let (mut package_name, mut bins) = (None, Vec::new());
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.to_string();
            continue;
        }
        let Some(value) = line
            .strip_prefix("name")
            .map(str::trim_start)
            .and_then(|l| l.strip_prefix('='))
            .map(|v| v.trim().trim_matches('"').to_string())
        else {
            continue;
        };
        match section.as_str() {
            "[package]" => package_name = Some(value),
            "[[bin]]" => bins.push(value),
            _ => {}
        }
    }
    if bins.is_empty() && workspace().join(package_dir).join("src/main.rs").exists() {
        bins.extend(package_name);
    }
    bins
}

/// Workspace package name -> its directory.
const PACKAGE_DIRS: &[(&str, &str)] = &[
    ("mycni-agent", "mycni-agent"),
    ("mycni-plugin", "mycni-plugin"),
];

/// Checks the builder/runtime split and returns the runtime stage's
/// `COPY --from=builder` destinations: (source, destination).
fn check_dockerfile(text: &str) -> Check<Vec<(String, String)>> {
    let (_, stages) = parse_dockerfile(text)?;
    let [builder, runtime] = stages.as_slice() else {
        return Err(format!(
            "expected two stages (builder, runtime), found {}",
            stages.len()
        ));
    };
    if builder.name.as_deref() != Some("builder")
        || !builder.base.contains("rust:")
        || !builder.base.ends_with("-bookworm")
    {
        return Err(format!(
            "the first stage must be `rust:<version>-bookworm AS builder`, is {} AS {:?}",
            builder.base, builder.name
        ));
    }
    if !runtime.base.ends_with("debian:bookworm-slim") {
        return Err(format!(
            "the runtime stage must be debian:bookworm-slim, is {}",
            runtime.base
        ));
    }

    // What the builder produces.
    let mut workdir = String::from("/");
    let mut produced = BTreeSet::new();
    let mut ebpf_built = false;
    for (keyword, args) in &builder.instructions {
        match keyword.as_str() {
            "WORKDIR" => workdir = args.trim_end_matches('/').to_string(),
            "ENV" if args.contains("CARGO_TARGET_DIR") => {
                return Err("CARGO_TARGET_DIR moves the build outputs".into());
            }
            "RUN" => {
                for command in args.split("&&") {
                    let words: Vec<&str> = command.split_whitespace().collect();
                    if words.starts_with(&["cargo", "xtask", "build-ebpf"]) {
                        if !words.contains(&"--release") {
                            return Err(
                                "build-ebpf must be --release: the agent embeds that object".into(),
                            );
                        }
                        ebpf_built = true;
                        produced.insert(format!("{workdir}/{EBPF_OBJECT}"));
                    }
                    if words.starts_with(&["cargo", "build"]) {
                        if !words.contains(&"--release") || words.contains(&"--target-dir") {
                            return Err(format!(
                                "`{}` must be a plain --release build",
                                command.trim()
                            ));
                        }
                        if !ebpf_built {
                            return Err(
                                "cargo build runs before `cargo xtask build-ebpf --release`: \
                                        the agent would embed no eBPF object"
                                    .into(),
                            );
                        }
                        for (i, w) in words.iter().enumerate() {
                            if *w != "-p" && *w != "--package" {
                                continue;
                            }
                            let package = words.get(i + 1).copied().unwrap_or_default();
                            let (_, dir) = PACKAGE_DIRS
                                .iter()
                                .find(|(p, _)| *p == package)
                                .ok_or_else(|| format!("unknown package {package:?}"))?;
                            for bin in package_bins(dir) {
                                produced.insert(format!("{workdir}/target/release/{bin}"));
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }

    let installs = |stage: &Stage, package: &str| {
        stage.instructions.iter().any(|(k, a)| {
            k == "RUN"
                && a.contains("apt-get install")
                && a.split_whitespace().any(|w| w == package)
        })
    };
    for package in BUILD_PACKAGES {
        if !installs(builder, package) {
            return Err(format!("the builder stage does not install {package}"));
        }
    }
    for package in RUNTIME_PACKAGES {
        if !installs(runtime, package) {
            return Err(format!("the runtime stage does not install {package}"));
        }
    }

    let mut copies = Vec::new();
    for (stage, is_runtime) in [(builder, false), (runtime, true)] {
        for (keyword, args) in &stage.instructions {
            if keyword != "COPY" || !args.starts_with("--from") {
                continue;
            }
            let words: Vec<&str> = args.split_whitespace().collect();
            let [from, src, dst] = words.as_slice() else {
                return Err(format!(
                    "COPY {args}: expected one source and one destination"
                ));
            };
            if !is_runtime || *from != "--from=builder" {
                return Err(format!(
                    "COPY {args}: only the runtime stage copies, from builder"
                ));
            }
            if !produced.contains(*src) {
                return Err(format!(
                    "COPY {args}: the builder does not produce {src} (it produces {produced:?})"
                ));
            }
            let base = |p: &str| p.rsplit('/').next().unwrap_or_default().to_string();
            if base(src) != base(dst) {
                return Err(format!("COPY {args}: copies {src} under another name"));
            }
            copies.push((src.to_string(), dst.to_string()));
        }
    }
    Ok(copies)
}

/// The Dockerfile's toolchain pins are xtask's.
fn check_dockerfile_pins(dockerfile: &str, xtask_main: &str, xtask_setup: &str) -> Check<()> {
    let constant = |source: &str, name: &str| -> Check<String> {
        let start = source
            .find(&format!("const {name}: &str = \""))
            .ok_or_else(|| format!("xtask has no const {name}"))?;
        let value = &source[start..];
        value
            .split('"')
            .nth(1)
            .map(str::to_string)
            .ok_or_else(|| format!("cannot read xtask's {name}"))
    };
    let (global, stages) = parse_dockerfile(dockerfile)?;
    let stage_args: Vec<&String> = stages
        .iter()
        .flat_map(|s| &s.instructions)
        .filter(|(k, _)| k == "ARG")
        .map(|(_, a)| a)
        .chain(&global)
        .collect();
    for (arg, source, name) in [
        ("RUST_VERSION", xtask_main, "HOST_TOOLCHAIN"),
        ("EBPF_TOOLCHAIN", xtask_main, "EBPF_TOOLCHAIN"),
        ("BPF_LINKER_VERSION", xtask_setup, "BPF_LINKER_VERSION"),
    ] {
        let pinned = constant(source, name)?;
        let ours = arg_default(stage_args.iter().copied(), arg);
        if ours != Some(pinned.as_str()) {
            return Err(format!(
                "ARG {arg} is {ours:?} but xtask pins {name} = {pinned:?}"
            ));
        }
    }
    for package in BUILD_PACKAGES {
        if !xtask_setup.contains(&format!("(\"{package}\""))
            && !xtask_setup.contains(&format!("\"{package}\","))
        {
            return Err(format!(
                "{package} is not in `cargo xtask setup`'s package list any more"
            ));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The tests.

#[test]
fn every_document_parses_strictly_into_a_known_kind() {
    let files = deploy_yaml_files();
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["deploy/daemonset.yaml", "deploy/rbac.yaml"]);
    if let Err(e) = load_from(&files) {
        panic!("{e}");
    }
}

#[test]
fn daemonset_runs_on_every_node_in_the_host_network() {
    let d = load();
    check_pod_basics(&d).unwrap_or_else(|e| panic!("{e}"));
    check_tolerations(&d).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn agent_adds_exactly_the_committed_capabilities() {
    check_agent_capabilities(&load()).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn seccomp_and_apparmor_are_the_committed_profiles() {
    check_lsm_profiles(&load()).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn install_cni_init_container_copies_the_plugin_unprivileged() {
    check_install_cni(&load()).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn only_the_bpffs_mount_is_privileged_and_the_agent_is_host_to_container() {
    check_bpffs_propagation(&load()).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn host_paths_are_exactly_the_documented_ones() {
    check_host_mounts(&load()).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn agent_path_flags_point_into_their_mounts() {
    check_agent_flags(&load()).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn probes_hit_readyz_and_healthz_on_the_metrics_port() {
    check_probes(&load()).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn env_comes_from_the_downward_api() {
    check_env(&load()).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn every_container_has_requests_and_limits_sized_for_the_target() {
    check_resources(&load()).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn cluster_role_grants_exactly_the_committed_rules() {
    check_rbac_rules(&load()).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn binding_grants_the_role_to_the_daemonsets_service_account() {
    check_binding(&load()).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn dockerfile_copies_the_workspace_binaries_the_daemonset_runs() {
    let copies = check_dockerfile(&read("deploy/Dockerfile")).unwrap_or_else(|e| panic!("{e}"));
    let destinations = sorted(copies.iter().map(|(_, d)| d.as_str()));
    assert_eq!(destinations, sorted([AGENT_BIN, PLUGIN_BIN]));
    // The names are the workspace's binary names.
    assert_eq!(package_bins("mycni-agent"), ["mycni-agent"]);
    assert_eq!(package_bins("mycni-plugin"), ["mycni"]);
    // And the DaemonSet executes exactly these paths.
    let d = load();
    let p = pod(&d).unwrap_or_else(|e| panic!("{e}"));
    for c in all_containers(p).filter(|c| c.name != MOUNT_BPFFS) {
        let args = argv(c);
        let binary = args.first().copied().unwrap_or_default();
        assert!(
            destinations.contains(&binary),
            "{} runs {binary}, not in the image",
            c.name
        );
        if let Some(src) = flag(&args, "--src") {
            assert!(
                destinations.contains(&src),
                "install-cni copies {src}, not in the image"
            );
        }
    }
}

#[test]
fn dockerfile_pins_the_xtask_toolchains_and_packages() {
    check_dockerfile_pins(
        &read("deploy/Dockerfile"),
        &read("xtask/src/main.rs"),
        &read("xtask/src/setup.rs"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn readme_documents_install_uninstall_flags_capabilities_and_mounts() {
    let readme = read("deploy/README.md");
    let mut required = vec![
        "kubectl apply -f deploy/rbac.yaml -f deploy/daemonset.yaml".to_string(),
        "--allocate-node-cidrs=true".to_string(),
        format!("--cluster-cidr={CLUSTER_CIDR}"),
        "mycni-agent uninstall".to_string(),
        "docker build".to_string(),
    ];
    required.extend(AGENT_CAPABILITIES.iter().map(|(c, _)| format!("`{c}`")));
    required.extend(HOST_MOUNTS.iter().map(|(_, h, _, _)| format!("`{h}`")));
    for needle in required {
        assert!(
            readme.contains(&needle),
            "deploy/README.md does not mention {needle}"
        );
    }
}

// ---------------------------------------------------------------------------
// Each check fails on a manifest broken the way it guards against.

fn pod_mut(d: &mut Deploy) -> &mut PodSpec {
    d.daemonset
        .spec
        .as_mut()
        .and_then(|s| s.template.spec.as_mut())
        .expect("pod spec")
}

fn container_mut<'a>(d: &'a mut Deploy, name: &str) -> &'a mut Container {
    let p = pod_mut(d);
    p.init_containers
        .iter_mut()
        .flatten()
        .chain(p.containers.iter_mut())
        .find(|c| c.name == name)
        .expect("container")
}

fn security_mut<'a>(
    d: &'a mut Deploy,
    name: &str,
) -> &'a mut k8s_openapi::api::core::v1::SecurityContext {
    container_mut(d, name)
        .security_context
        .as_mut()
        .expect("securityContext")
}

fn add_capability(d: &mut Deploy, name: &str, cap: &str) {
    let caps = security_mut(d, name)
        .capabilities
        .as_mut()
        .expect("capabilities");
    caps.add.get_or_insert_with(Vec::new).push(cap.to_string());
}

fn mount_mut<'a>(
    d: &'a mut Deploy,
    container: &str,
    path: &str,
) -> &'a mut k8s_openapi::api::core::v1::VolumeMount {
    container_mut(d, container)
        .volume_mounts
        .iter_mut()
        .flatten()
        .find(|m| m.mount_path == path)
        .expect("volume mount")
}

fn args_mut(d: &mut Deploy) -> &mut Vec<String> {
    container_mut(d, AGENT).args.as_mut().expect("args")
}

type Breakage = (&'static str, fn(&Deploy) -> Check<()>, fn(&mut Deploy));

const BREAKAGES: &[Breakage] = &[
    ("hostNetwork off", check_pod_basics, |d| {
        pod_mut(d).host_network = Some(false)
    }),
    ("no priority class", check_pod_basics, |d| {
        pod_mut(d).priority_class_name = None
    }),
    ("maxUnavailable 2", check_pod_basics, |d| {
        let s = d.daemonset.spec.as_mut().expect("spec");
        let ru = s
            .update_strategy
            .as_mut()
            .and_then(|u| u.rolling_update.as_mut());
        ru.expect("rollingUpdate").max_unavailable = Some(IntOrString::Int(2));
    }),
    (
        "selector does not match the template",
        check_pod_basics,
        |d| {
            let s = d.daemonset.spec.as_mut().expect("spec");
            let labels = s.selector.match_labels.get_or_insert_with(BTreeMap::new);
            labels.insert("app.kubernetes.io/name".into(), "other".into());
        },
    ),
    ("another image", check_pod_basics, |d| {
        container_mut(d, INSTALL_CNI).image = Some("mycni:latest".into())
    }),
    ("no NoExecute toleration", check_tolerations, |d| {
        let t = pod_mut(d).tolerations.as_mut().expect("tolerations");
        t.retain(|t| t.effect.as_deref() != Some("NoExecute"));
    }),
    (
        "a keyed NoSchedule toleration only",
        check_tolerations,
        |d| {
            for t in pod_mut(d).tolerations.iter_mut().flatten() {
                if t.effect.as_deref() == Some("NoSchedule") {
                    t.key = Some("node.kubernetes.io/not-ready".into());
                }
            }
        },
    ),
    ("agent privileged", check_agent_capabilities, |d| {
        security_mut(d, AGENT).privileged = Some(true)
    }),
    ("agent may escalate", check_agent_capabilities, |d| {
        security_mut(d, AGENT).allow_privilege_escalation = None
    }),
    ("agent adds SYS_ADMIN", check_agent_capabilities, |d| {
        add_capability(d, AGENT, "SYS_ADMIN")
    }),
    ("agent lacks PERFMON", check_agent_capabilities, |d| {
        let caps = security_mut(d, AGENT).capabilities.as_mut().expect("caps");
        caps.add.as_mut().expect("add").retain(|c| c != "PERFMON");
    }),
    (
        "agent keeps the default capabilities",
        check_agent_capabilities,
        |d| {
            let caps = security_mut(d, AGENT).capabilities.as_mut().expect("caps");
            caps.drop = None;
        },
    ),
    (
        "agent under RuntimeDefault seccomp",
        check_lsm_profiles,
        |d| {
            let sc = security_mut(d, AGENT);
            sc.seccomp_profile.as_mut().expect("seccomp").type_ = "RuntimeDefault".into();
        },
    ),
    ("install-cni unconfined", check_lsm_profiles, |d| {
        security_mut(d, INSTALL_CNI).seccomp_profile = None
    }),
    ("install-cni copies elsewhere", check_install_cni, |d| {
        let c = container_mut(d, INSTALL_CNI);
        let cmd = c.command.as_mut().expect("command");
        if let Some(last) = cmd.last_mut() {
            *last = "/opt/cni/bin".into();
        }
    }),
    ("install-cni gets NET_ADMIN", check_install_cni, |d| {
        add_capability(d, INSTALL_CNI, "NET_ADMIN")
    }),
    ("agent bpffs Bidirectional", check_bpffs_propagation, |d| {
        mount_mut(d, AGENT, "/sys/fs/bpf").mount_propagation = Some("Bidirectional".into())
    }),
    (
        "agent bpffs without propagation",
        check_bpffs_propagation,
        |d| mount_mut(d, AGENT, "/sys/fs/bpf").mount_propagation = None,
    ),
    ("mount-bpffs unprivileged", check_bpffs_propagation, |d| {
        security_mut(d, MOUNT_BPFFS).privileged = Some(false)
    }),
    (
        "mount-bpffs runs something else",
        check_bpffs_propagation,
        |d| container_mut(d, MOUNT_BPFFS).command = Some(vec!["/bin/sh".into()]),
    ),
    ("install-cni privileged too", check_bpffs_propagation, |d| {
        let sc = security_mut(d, INSTALL_CNI);
        sc.privileged = Some(true);
        sc.allow_privilege_escalation = None;
    }),
    ("extra hostPath /lib/modules", check_host_mounts, |d| {
        let p = pod_mut(d);
        p.volumes
            .get_or_insert_with(Vec::new)
            .push(k8s_openapi::api::core::v1::Volume {
                name: "lib-modules".into(),
                host_path: Some(k8s_openapi::api::core::v1::HostPathVolumeSource {
                    path: "/lib/modules".into(),
                    type_: Some("Directory".into()),
                }),
                ..Default::default()
            });
        container_mut(d, AGENT)
            .volume_mounts
            .get_or_insert_with(Vec::new)
            .push(k8s_openapi::api::core::v1::VolumeMount {
                name: "lib-modules".into(),
                mount_path: "/lib/modules".into(),
                read_only: Some(true),
                ..Default::default()
            });
    }),
    (
        "conf dir mounted at the wrong place",
        check_host_mounts,
        |d| mount_mut(d, AGENT, "/host/etc/cni/net.d").mount_path = "/etc/cni/net.d".into(),
    ),
    (
        "/var/lib/mycni must already exist",
        check_host_mounts,
        |d| {
            for v in pod_mut(d).volumes.iter_mut().flatten() {
                if let Some(h) = v.host_path.as_mut().filter(|h| h.path == "/var/lib/mycni") {
                    h.type_ = Some("Directory".into());
                }
            }
        },
    ),
    ("agent loses /var/lib/cni", check_host_mounts, |d| {
        let mounts = container_mut(d, AGENT)
            .volume_mounts
            .as_mut()
            .expect("mounts");
        mounts.retain(|m| m.mount_path != "/var/lib/cni");
    }),
    ("state dir outside its mount", check_agent_flags, |d| {
        for a in args_mut(d).iter_mut() {
            if a.starts_with("--state-dir") {
                *a = "--state-dir=/var/run/mycni".into();
            }
        }
    }),
    ("proc-sys default, not the mount", check_agent_flags, |d| {
        args_mut(d).retain(|a| !a.starts_with("--proc-sys"));
        args_mut(d).push("--proc-sys=/proc/sys".into());
    }),
    ("metrics elsewhere", check_agent_flags, |d| {
        for a in args_mut(d).iter_mut() {
            if a.starts_with("--metrics-addr") {
                *a = "--metrics-addr=0.0.0.0:9090".into();
            }
        }
    }),
    ("readiness on /healthz", check_probes, |d| {
        let c = container_mut(d, AGENT);
        let probe = c.readiness_probe.as_mut().and_then(|p| p.http_get.as_mut());
        probe.expect("httpGet").path = Some("/healthz".into());
    }),
    ("liveness on another port", check_probes, |d| {
        let c = container_mut(d, AGENT);
        let probe = c.liveness_probe.as_mut().and_then(|p| p.http_get.as_mut());
        probe.expect("httpGet").port = IntOrString::Int(8080);
    }),
    ("metrics port not declared", check_probes, |d| {
        container_mut(d, AGENT).ports = None
    }),
    ("NODE_NAME from the pod name", check_env, |d| {
        for e in container_mut(d, AGENT).env.iter_mut().flatten() {
            if e.name == "NODE_NAME" {
                let f = e.value_from.as_mut().and_then(|v| v.field_ref.as_mut());
                f.expect("fieldRef").field_path = "metadata.name".into();
            }
        }
    }),
    ("another cluster CIDR", check_env, |d| {
        for e in container_mut(d, AGENT).env.iter_mut().flatten() {
            if e.name == "MYCNI_CLUSTER_CIDR" {
                e.value = Some("10.0.0.0/8".into());
            }
        }
    }),
    ("agent without memory limit", check_resources, |d| {
        let r = container_mut(d, AGENT)
            .resources
            .as_mut()
            .expect("resources");
        r.limits.as_mut().expect("limits").remove("memory");
    }),
    ("agent limited to 1Gi", check_resources, |d| {
        let r = container_mut(d, AGENT)
            .resources
            .as_mut()
            .expect("resources");
        let limits = r.limits.as_mut().expect("limits");
        limits.insert("memory".into(), Quantity("1Gi".into()));
    }),
    ("init container without resources", check_resources, |d| {
        container_mut(d, MOUNT_BPFFS).resources = None
    }),
    ("role may update nodes", check_rbac_rules, |d| {
        let rules = d.cluster_role.rules.as_mut().expect("rules");
        rules[0].verbs.push("update".into());
    }),
    ("role reads pods", check_rbac_rules, |d| {
        let rules = d.cluster_role.rules.as_mut().expect("rules");
        rules.push(k8s_openapi::api::rbac::v1::PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["pods".into()]),
            verbs: vec!["list".into()],
            ..Default::default()
        });
    }),
    ("role cannot patch status", check_rbac_rules, |d| {
        let rules = d.cluster_role.rules.as_mut().expect("rules");
        rules.retain(|r| r.resources.as_deref() != Some(&["nodes/status".to_string()][..]));
    }),
    ("binding to another namespace", check_binding, |d| {
        for s in d.binding.subjects.iter_mut().flatten() {
            s.namespace = Some("default".into());
        }
    }),
    (
        "pod runs as the default ServiceAccount",
        check_binding,
        |d| pod_mut(d).service_account_name = None,
    ),
    ("binding to another role", check_binding, |d| {
        d.binding.role_ref.name = "cluster-admin".into()
    }),
];

#[test]
fn each_check_catches_its_breakage() {
    let good = load();
    for (what, check, break_it) in BREAKAGES {
        check(&good).unwrap_or_else(|e| panic!("the unbroken manifests fail: {e}"));
        let mut broken = good.clone();
        break_it(&mut broken);
        assert!(check(&broken).is_err(), "a check passed with: {what}");
    }
}

#[test]
fn strict_parsing_rejects_typos_unknown_kinds_and_bad_yaml() {
    let files = deploy_yaml_files();
    let with = |from: &str, to: &str| -> Vec<(String, String)> {
        let mut broken = files.clone();
        for (_, text) in broken.iter_mut() {
            *text = text.replacen(from, to, 1);
        }
        assert_ne!(broken, files, "{from:?} is not in the manifests");
        broken
    };
    for (from, to, expect) in [
        ("hostNetwork: true", "hostNetwrok: true", "hostNetwrok"),
        (
            "mountPropagation: HostToContainer",
            "mountPropogation: HostToContainer",
            "mountPropogation",
        ),
        ("kind: DaemonSet", "kind: DaemonSett", "DaemonSett"),
        (
            "kind: ClusterRoleBinding",
            "kind: RoleBinding",
            "RoleBinding",
        ),
        ("hostNetwork: true", "hostNetwork: [true", "not YAML"),
        ("containerPort: 9971", "containerPort: \"9971x\"", "9971x"),
    ] {
        match load_from(&with(from, to)) {
            Ok(_) => panic!("{from:?} -> {to:?} was accepted"),
            Err(e) => assert!(e.contains(expect), "{from:?} -> {to:?}: {e}"),
        }
    }
    // A second copy of a document is an error too.
    let mut doubled = files.clone();
    doubled.push(("deploy/extra.yaml".into(), read("deploy/rbac.yaml")));
    assert!(load_from(&doubled).is_err());
}

#[test]
fn dockerfile_checks_catch_their_breakage() {
    let good = read("deploy/Dockerfile");
    let (main, setup) = (read("xtask/src/main.rs"), read("xtask/src/setup.rs"));
    check_dockerfile(&good).unwrap_or_else(|e| panic!("{e}"));
    for (from, to) in [
        // Copies something the builder does not build.
        (
            "target/release/mycni /usr/local/bin/mycni",
            "target/release/mycni-plugin /usr/local/bin/mycni",
        ),
        // Builds in debug, so target/release is empty.
        ("cargo build --release --locked", "cargo build --locked"),
        // Does not build the plugin.
        (" -p mycni-plugin", ""),
        // Builds the agent before the eBPF object it embeds.
        (
            "RUN cargo xtask build-ebpf --release \\\n && cargo build --release --locked -p mycni-agent -p mycni-plugin",
            "RUN cargo build --release --locked -p mycni-agent -p mycni-plugin \\\n && cargo xtask build-ebpf --release",
        ),
        // Misses a build package.
        (" clang-22 ", " "),
        // Misses nftables at run time.
        ("iproute2 nftables", "iproute2"),
        // Renames the plugin on the way.
        ("/usr/local/bin/mycni\n", "/usr/local/bin/cni-plugin\n"),
    ] {
        assert!(good.contains(from), "{from:?} is not in the Dockerfile");
        let broken = good.replacen(from, to, 1);
        assert!(
            check_dockerfile(&broken).is_err(),
            "accepted: {from:?} -> {to:?}"
        );
    }
    check_dockerfile_pins(&good, &main, &setup).unwrap_or_else(|e| panic!("{e}"));
    for (from, to) in [
        ("RUST_VERSION=1.98.0", "RUST_VERSION=1.97.0"),
        (
            "EBPF_TOOLCHAIN=nightly-2026-07-01",
            "EBPF_TOOLCHAIN=nightly",
        ),
        ("BPF_LINKER_VERSION=0.13", "BPF_LINKER_VERSION=0.12"),
    ] {
        assert!(good.contains(from), "{from:?} is not in the Dockerfile");
        let broken = good.replacen(from, to, 1);
        assert!(
            check_dockerfile_pins(&broken, &main, &setup).is_err(),
            "accepted: {to:?}"
        );
    }
}

/// The agent binary this suite was built with (cargo builds every
/// workspace binary before the tests run).
fn built_agent() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    // target/<profile>/deps/<test> -> target/<profile>/mycni-agent
    exe.parent()
        .and_then(Path::parent)
        .map(|d| d.join("mycni-agent"))
        .unwrap_or_default()
}

#[test]
fn every_container_command_parses_with_the_built_agent() {
    // A flag the DaemonSet passes but the agent does not know would crash-loop
    // every node; clap rejects unknown flags before it looks at --help.
    let d = load();
    let p = pod(&d).unwrap_or_else(|e| panic!("{e}"));
    let bin = built_agent();
    assert!(
        bin.exists(),
        "{} not built: run via `cargo xtask test`",
        bin.display()
    );
    let mut checked = 0;
    for c in all_containers(p) {
        let argv = argv(c);
        if argv.first() != Some(&AGENT_BIN) {
            continue;
        }
        let out = std::process::Command::new(&bin)
            .args(&argv[1..])
            .arg("--help")
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", bin.display()));
        assert!(
            out.status.success(),
            "container {}: `{}` is rejected by the agent: {}",
            c.name,
            argv.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        checked += 1;
    }
    assert_eq!(checked, 2, "install-cni and the agent both run {AGENT_BIN}");
}
