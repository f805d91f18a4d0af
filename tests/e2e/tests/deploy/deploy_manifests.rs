//! The deployment manifests under `deploy/`, checked without a cluster.
//!
//! `deploy/` is a kustomize base (`deploy/base`), overlays
//! (`deploy/overlays/*`) and the removal (`deploy/cleanup`); each is
//! rendered with `kubectl kustomize`, as `kubectl apply -k` would, and every
//! document of the result parses into its Kubernetes API type, strictly:
//! the parsed object serialised again must equal the document, so a
//! misspelt field (which serde would silently drop) fails. Then the
//! decisions that `deploy/base/daemonset.yaml`, `deploy/base/rbac.yaml`,
//! `deploy/base/config.env` and `deploy/README.md` explain are checked
//! against the committed allow-lists, on the base and on every overlay; the
//! ConfigMap's values go through the built agent's own parser; and the
//! Dockerfile is checked against what its builder stage produces and what
//! the DaemonSet runs (no container engine is available to build it).
//!
//! Each check is a function over the parsed manifests.
//! `each_check_catches_its_breakage`, `dockerfile_checks_catch_their_breakage`
//! and `strict_parsing_rejects_typos_unknown_kinds_and_bad_yaml` break the
//! real files in the ways the checks guard against and require them to fail,
//! so none passes vacuously.
//!
//! The committed allow-lists are in `committed`, the loading in `load`, the
//! checks in `checks` and `dockerfile`, the breakages in `breakages`; the
//! tests are here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec, ServiceAccount, Toleration};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::serde::Deserialize;
use k8s_openapi::serde::Serialize;
use k8s_openapi::serde::de::DeserializeOwned;
use serde_json::Value;

mod breakages;
mod checks;
mod cleanup;
mod committed;
mod dockerfile;
mod load;

use breakages::*;
use checks::*;
use cleanup::*;
use committed::*;
use dockerfile::*;
use load::*;

type Check<T> = Result<T, String>;

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
// The tests.

/// The checks that hold for the base and every overlay alike.
type NamedCheck = (&'static str, fn(&Deploy) -> Check<()>);

const CHECKS: &[NamedCheck] = &[
    ("pod basics", check_pod_basics),
    ("tolerations", check_tolerations),
    ("agent capabilities", check_agent_capabilities),
    ("LSM profiles", check_lsm_profiles),
    ("install-cni", check_install_cni),
    ("bpffs propagation", check_bpffs_propagation),
    ("host mounts", check_host_mounts),
    ("agent flags", check_agent_flags),
    ("probes", check_probes),
    ("env", check_env),
    ("resources", check_resources),
    ("RBAC rules", check_rbac_rules),
    ("no write on nodes", check_no_node_writes),
    ("binding", check_binding),
    ("scrape annotations", check_scrape_annotations),
];

#[test]
fn every_document_parses_strictly_into_a_known_kind() {
    let _turn = crate::turn(module_path!());
    let files = deploy_yaml_files();
    if let Err(e) = load_from(&files) {
        panic!("{e}");
    }
}

#[test]
fn every_source_file_is_used_by_a_kustomization() {
    let _turn = crate::turn(module_path!());
    // A manifest no kustomization lists would never be applied: each file
    // under deploy/ (but monitoring/) is a kustomization or named by the
    // kustomization beside it or a component's.
    let files = deploy_source_files();
    let kustomizations: Vec<&(String, String)> = files
        .iter()
        .filter(|(n, _)| n.ends_with("/kustomization.yaml"))
        .collect();
    for (name, _) in &files {
        if name.ends_with("/kustomization.yaml") {
            continue;
        }
        let (dir, file) = name.rsplit_once('/').unwrap_or(("", name));
        let used = kustomizations.iter().any(|(k, text)| {
            k.rsplit_once('/').map(|(d, _)| d) == Some(dir)
                && text.lines().any(|l| {
                    let l = l.trim().trim_start_matches("- ").trim();
                    l == file || l.strip_prefix("path: ") == Some(file)
                })
        });
        assert!(used, "{name} is in no kustomization beside it");
    }
    for dir in [BASE, CLEANUP] {
        assert!(
            kustomizations
                .iter()
                .any(|(k, _)| *k == format!("{dir}/kustomization.yaml")),
            "no {dir}/kustomization.yaml"
        );
    }
}

#[test]
fn base_settings_are_the_committed_defaults() {
    let _turn = crate::turn(module_path!());
    check_base_settings(&load()).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn pod_template_carries_the_scrape_annotations() {
    let _turn = crate::turn(module_path!());
    check_scrape_annotations(&load()).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn every_overlay_renders_valid_objects_changing_only_its_settings() {
    let _turn = crate::turn(module_path!());
    let base = load();
    let base_config = base.config.data.clone().unwrap_or_default();
    let dirs: Vec<String> = std::fs::read_dir(workspace().join(OVERLAYS_DIR))
        .unwrap_or_else(|e| panic!("listing {OVERLAYS_DIR}: {e}"))
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let committed: Vec<&str> = OVERLAYS.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        sorted(dirs.iter().map(String::as_str)),
        committed,
        "every overlay is committed in OVERLAYS with the settings it changes"
    );
    for (name, changes) in OVERLAYS {
        let dir = format!("{OVERLAYS_DIR}/{name}");
        let d = load_dir(&dir);
        for (what, check) in CHECKS {
            check(&d).unwrap_or_else(|e| panic!("{dir}: {what}: {e}"));
        }
        let mut want = base_config.clone();
        for (k, v) in *changes {
            want.insert(k.to_string(), v.to_string());
        }
        assert_eq!(d.config.data.clone().unwrap_or_default(), want, "{dir}");
        // A new name, so applying the overlay over the base rolls the agents.
        assert_ne!(d.config.metadata.name, base.config.metadata.name, "{dir}");
        // Nothing but the ConfigMap reference differs in the DaemonSet.
        let rename = |ds: &DaemonSet, from: &Option<String>| {
            let text = serde_json::to_string(ds).unwrap_or_default();
            text.replace(from.as_deref().unwrap_or_default(), CONFIG_MAP)
        };
        assert_eq!(
            rename(&d.daemonset, &d.config.metadata.name),
            rename(&base.daemonset, &base.config.metadata.name),
            "{dir}: the DaemonSet differs beyond its ConfigMap"
        );
    }
}

/// The agent's environment as the DaemonSet gives it from the ConfigMap.
fn agent_env(d: &Deploy) -> Vec<(&'static str, String)> {
    SETTINGS
        .iter()
        .map(|(_, var, _)| {
            let v = env_setting(d, var).unwrap_or_else(|e| panic!("{e}"));
            (*var, v.to_string())
        })
        .collect()
}

/// `mycni-agent check-config` with the agent container's flags and `env`
/// only: (success, stdout + stderr).
fn check_config(d: &Deploy, env: &[(&str, String)]) -> (bool, String) {
    let bin = built_agent();
    assert!(bin.exists(), "{} not built", bin.display());
    let a = agent(d).unwrap_or_else(|e| panic!("{e}"));
    let args = argv(a);
    assert_eq!(args.get(1), Some(&"run"));
    let out = std::process::Command::new(&bin)
        .arg("check-config")
        .args(&args[2..])
        .env_clear()
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", bin.display()));
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn every_configmap_passes_the_agents_own_check() {
    let _turn = crate::turn(module_path!());
    for dir in std::iter::once(BASE.to_string())
        .chain(OVERLAYS.iter().map(|(n, _)| format!("{OVERLAYS_DIR}/{n}")))
    {
        let d = load_dir(&dir);
        let (ok, out) = check_config(&d, &agent_env(&d));
        assert!(ok, "{dir}: the agent rejects its settings: {out}");
        for (key, _, _) in SETTINGS.iter() {
            let v = config_value(&d, key).unwrap_or_else(|e| panic!("{e}"));
            assert!(
                out.contains(&format!("{key}={v}")),
                "{dir}: {key}={v} not in {out}"
            );
        }
    }
}

/// A directory of its own under the target dir, for a kustomization made
/// by a test; and the path of `rel` (workspace-relative) from it, since
/// kustomize takes no absolute path to a base.
fn scratch_overlay(name: &str, kustomization: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    let up = "../".repeat(dir.components().count().saturating_sub(1));
    let root = workspace();
    let root = root.to_string_lossy();
    let text = kustomization.replace(
        "@WORKSPACE@",
        &format!("{up}{}", root.trim_start_matches('/')),
    );
    std::fs::write(dir.join("kustomization.yaml"), text)
        .unwrap_or_else(|e| panic!("writing {}: {e}", dir.display()));
    dir
}

#[test]
fn a_bad_configmap_value_stops_the_agent_naming_its_key() {
    let _turn = crate::turn(module_path!());
    // As an operator would: an overlay over the base with one bad value.
    for (key, bad) in [
        ("mtu", "9x"),
        ("mtu", "100000"),
        ("cluster-cidr", "10.244.0.0"),
        ("underlay", "eth*"),
        ("underlay", "can-reach=api.example.com"),
        ("datapath", "xdp"),
        ("direct-routing", "yes"),
        ("masquerade", "on"),
        ("network-policy", "enforce"),
        ("flow-events", "1"),
        ("flow-history", "lots"),
        ("metrics-addr", "9971"),
        ("liveness-stale-after", "1s"),
    ] {
        let dir = scratch_overlay(
            &format!("bad-config-{key}"),
            &format!(
                "resources:\n  - @WORKSPACE@/{BASE}\nconfigMapGenerator:\n  - name: {CONFIG_MAP}\n    namespace: {NAMESPACE}\n    behavior: merge\n    literals:\n      - {key}={bad}\n"
            ),
        );
        let text = kustomize_at(&dir).unwrap_or_else(|e| panic!("{e}"));
        let d = load_from(&[("bad overlay".into(), text)]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(config_value(&d, key), Ok(bad));
        let (ok, out) = check_config(&d, &agent_env(&d));
        assert!(!ok, "{key}={bad} accepted: {out}");
        let s = mycni_agent::settings::DEPLOYED
            .iter()
            .find(|s| s.key == key)
            .unwrap_or_else(|| panic!("{key} is not one of the agent's deployed settings"));
        assert!(
            out.contains(&s.source().to_string()),
            "{key}={bad}: the error does not name the key: {out}"
        );
    }
}

#[test]
fn max_unavailable_set_in_an_overlay_reaches_the_daemonset() {
    let _turn = crate::turn(module_path!());
    let dir = scratch_overlay(
        "max-unavailable",
        &format!(
            "resources:\n  - @WORKSPACE@/{BASE}\ncomponents:\n  - @WORKSPACE@/deploy/components/rollout\nconfigMapGenerator:\n  - name: {CONFIG_MAP}\n    namespace: {NAMESPACE}\n    behavior: merge\n    literals:\n      - {MAX_UNAVAILABLE}=5\n"
        ),
    );
    let text = kustomize_at(&dir).unwrap_or_else(|e| panic!("{e}"));
    let d = load_from(&[("overlay".into(), text)]).unwrap_or_else(|e| panic!("{e}"));
    check_pod_basics(&d).unwrap_or_else(|e| panic!("{e}"));
    let ru = d
        .daemonset
        .spec
        .as_ref()
        .and_then(|s| s.update_strategy.as_ref())
        .and_then(|u| u.rolling_update.as_ref())
        .and_then(|r| r.max_unavailable.clone());
    assert_eq!(ru, Some(IntOrString::Int(5)));
}

#[test]
fn cleanup_replaces_the_agent_with_an_uninstall_on_the_same_mounts() {
    let _turn = crate::turn(module_path!());
    let base = load();
    let d = load_dir(CLEANUP);
    check_cleanup(&base, &d).unwrap_or_else(|e| panic!("{e}"));
    // The uninstall command line is one the built agent accepts.
    let p = pod(&d).unwrap_or_else(|e| panic!("{e}"));
    let c = container(p, UNINSTALL).unwrap_or_else(|e| panic!("{e}"));
    let cmd = uninstall_argv(c).unwrap_or_else(|e| panic!("{e}"));
    let out = std::process::Command::new(built_agent())
        .args(&cmd[1..])
        .arg("--help")
        .output()
        .unwrap_or_else(|e| panic!("running the agent: {e}"));
    assert!(
        out.status.success(),
        "`{}` is rejected: {}",
        cmd.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    for (what, break_it) in CLEANUP_BREAKAGES {
        let mut broken = d.clone();
        break_it(&mut broken);
        assert!(
            check_cleanup(&base, &broken).is_err(),
            "cleanup check passed with: {what}"
        );
    }
}

#[test]
fn podmonitor_scrapes_the_agents_metrics_port() {
    let _turn = crate::turn(module_path!());
    let text = read("deploy/monitoring/podmonitor.yaml");
    let pm: Value =
        serde_norway::from_str(&text).unwrap_or_else(|e| panic!("podmonitor.yaml: {e}"));
    assert_eq!(pm["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(pm["kind"], "PodMonitor");
    let d = load();
    let labels = d
        .daemonset
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let selector = pm["spec"]["selector"]["matchLabels"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    assert!(!selector.is_empty(), "the PodMonitor selects nothing");
    for (k, v) in &selector {
        assert_eq!(
            labels.get(k).map(String::as_str),
            v.as_str(),
            "the PodMonitor's {k} does not match the agent's pods"
        );
    }
    assert_eq!(pm["spec"]["namespaceSelector"]["matchNames"][0], NAMESPACE);
    let endpoint = &pm["spec"]["podMetricsEndpoints"][0];
    let port_name = endpoint["port"].as_str().unwrap_or_default();
    let a = agent(&d).unwrap_or_else(|e| panic!("{e}"));
    let port = a
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(port_name))
        .map(|p| p.container_port);
    assert_eq!(port, Some(METRICS_PORT), "PodMonitor port {port_name:?}");
    assert_eq!(endpoint["path"], "/metrics");
}

#[test]
fn daemonset_runs_on_every_node_in_the_host_network() {
    let _turn = crate::turn(module_path!());
    let d = load();
    check_pod_basics(&d).unwrap_or_else(|e| panic!("{e}"));
    check_tolerations(&d).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn agent_adds_exactly_the_committed_capabilities() {
    let _turn = crate::turn(module_path!());
    check_agent_capabilities(&load()).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn seccomp_and_apparmor_are_the_committed_profiles() {
    let _turn = crate::turn(module_path!());
    check_lsm_profiles(&load()).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn install_cni_init_container_copies_the_plugin_unprivileged() {
    let _turn = crate::turn(module_path!());
    check_install_cni(&load()).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn only_the_bpffs_mount_is_privileged_and_the_agent_is_host_to_container() {
    let _turn = crate::turn(module_path!());
    check_bpffs_propagation(&load()).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn host_paths_are_exactly_the_documented_ones() {
    let _turn = crate::turn(module_path!());
    check_host_mounts(&load()).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn agent_path_flags_point_into_their_mounts() {
    let _turn = crate::turn(module_path!());
    check_agent_flags(&load()).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn probes_hit_readyz_and_healthz_on_the_metrics_port() {
    let _turn = crate::turn(module_path!());
    check_probes(&load()).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn env_comes_from_the_downward_api() {
    let _turn = crate::turn(module_path!());
    check_env(&load()).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn every_container_has_requests_and_limits_sized_for_the_target() {
    let _turn = crate::turn(module_path!());
    check_resources(&load()).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn cluster_role_grants_exactly_the_committed_rules() {
    let _turn = crate::turn(module_path!());
    check_rbac_rules(&load()).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn rbac_has_no_write_verb_on_nodes() {
    let _turn = crate::turn(module_path!());
    check_no_node_writes(&load()).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn binding_grants_the_role_to_the_daemonsets_service_account() {
    let _turn = crate::turn(module_path!());
    check_binding(&load()).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn dockerfile_copies_the_workspace_binaries_the_daemonset_runs() {
    let _turn = crate::turn(module_path!());
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
    let _turn = crate::turn(module_path!());
    check_dockerfile_pins(
        &read("deploy/Dockerfile"),
        &read("xtask/src/main.rs"),
        &read("xtask/src/setup.rs"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn readme_documents_install_uninstall_flags_capabilities_and_mounts() {
    let _turn = crate::turn(module_path!());
    let readme = read("deploy/README.md");
    let mut required = vec![
        "kubectl apply -k deploy/base".to_string(),
        "kubectl kustomize deploy/base".to_string(),
        "kubectl apply -k deploy/cleanup".to_string(),
        "kubectl delete -k deploy/cleanup".to_string(),
        "rollout status".to_string(),
        "deploy/base/config.env".to_string(),
        "deploy/monitoring/podmonitor.yaml".to_string(),
        "--allocate-node-cidrs=true".to_string(),
        format!("--cluster-cidr={CLUSTER_CIDR}"),
        "mycni-agent uninstall".to_string(),
        "mycni-agent check-config".to_string(),
        "docker build".to_string(),
    ];
    required.extend(SETTINGS.iter().map(|(k, _, _)| format!("`{k}`")));
    required.push(format!("`{MAX_UNAVAILABLE}`"));
    required.extend(OVERLAYS.iter().map(|(n, _)| format!("deploy/overlays/{n}")));
    required.extend(AGENT_CAPABILITIES.iter().map(|(c, _)| format!("`{c}`")));
    required.extend(HOST_MOUNTS.iter().map(|(_, h, _, _)| format!("`{h}`")));
    for needle in required {
        assert!(
            readme.contains(&needle),
            "deploy/README.md does not mention {needle}"
        );
    }
}

#[test]
fn each_check_catches_its_breakage() {
    let _turn = crate::turn(module_path!());
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
    let _turn = crate::turn(module_path!());
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
    doubled.push(("deploy/extra.yaml".into(), read("deploy/base/rbac.yaml")));
    assert!(load_from(&doubled).is_err());
}

#[test]
fn dockerfile_checks_catch_their_breakage() {
    let _turn = crate::turn(module_path!());
    let good = read("deploy/Dockerfile");
    let (main, setup) = (read("xtask/src/main.rs"), read("xtask/src/setup.rs"));
    check_dockerfile(&good).unwrap_or_else(|e| panic!("{e}"));
    for (from, to) in [
        // Copies something the builder does not build.
        (
            "release/mycni /usr/local/bin/mycni",
            "release/mycni-plugin /usr/local/bin/mycni",
        ),
        // Copies the plugin built with the workspace, not the one that ships.
        (
            "target/plugin/x86_64-unknown-linux-musl/release/mycni ",
            "target/release/mycni ",
        ),
        // Builds in debug, so target/release is empty.
        ("cargo build --release --locked", "cargo build --locked"),
        // Does not build the plugin.
        (" \\\n && cargo xtask build-plugin", ""),
        // Builds the agent before the eBPF object it embeds.
        (
            "RUN cargo xtask build-ebpf --release \\\n && cargo build --release --locked -p mycni-agent",
            "RUN cargo build --release --locked -p mycni-agent \\\n && cargo xtask build-ebpf --release",
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
    let _turn = crate::turn(module_path!());
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
