//! Rendering the kustomizations under deploy/ with `kubectl kustomize`,
//! loading every document of the result strictly, and the accessors the
//! checks share.

use super::*;

#[derive(Clone)]
pub(crate) struct Deploy {
    pub(crate) daemonset: DaemonSet,
    pub(crate) service_account: ServiceAccount,
    pub(crate) cluster_role: ClusterRole,
    pub(crate) binding: ClusterRoleBinding,
    /// The generated mycni-config-<hash>.
    pub(crate) config: ConfigMap,
}

/// Every `.yaml`/`.yml`/`.env` file under deploy/, recursively, but the
/// monitoring: (relative name, text). These are kustomize inputs, not
/// objects to apply: the tests read what `kubectl kustomize` renders.
pub(crate) fn deploy_source_files() -> Vec<(String, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let entries =
            std::fs::read_dir(dir).unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()));
        for entry in entries {
            let path = entry
                .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
                .path();
            if path.is_dir() {
                // Prometheus rules and their unit tests, and the optional
                // PodMonitor, not part of any kustomization:
                // tests/e2e/tests/deploy/metrics.rs checks the rules with promtool,
                // `podmonitor_scrapes_the_agents_metrics_port` the PodMonitor.
                if path.file_name() != Some(std::ffi::OsStr::new("monitoring")) {
                    walk(&path, out);
                }
            } else if matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml" | "env")
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

/// `kubectl kustomize <dir>`, `dir` relative to the workspace.
pub(crate) fn kustomize(dir: &str) -> Check<String> {
    kustomize_at(&workspace().join(dir))
}

pub(crate) fn kustomize_at(dir: &Path) -> Check<String> {
    let out = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .map_err(|e| {
            format!(
                "running `kubectl kustomize {}` (kubectl >= 1.27, with kustomize v5, is needed): {e}",
                dir.display()
            )
        })?;
    if !out.status.success() {
        return Err(format!(
            "kubectl kustomize {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    String::from_utf8(out.stdout).map_err(|e| format!("kubectl kustomize {}: {e}", dir.display()))
}

/// What `kubectl kustomize dir` renders, as one named file.
pub(crate) fn rendered(dir: &str) -> Vec<(String, String)> {
    let text = kustomize(dir).unwrap_or_else(|e| panic!("{e}"));
    vec![(format!("kubectl kustomize {dir}"), text)]
}

/// The base, rendered: what `kubectl apply -k deploy/base` applies.
pub(crate) fn deploy_yaml_files() -> Vec<(String, String)> {
    rendered(BASE)
}

/// Parses `raw` as `T` and requires that serialising it again gives back
/// exactly `raw`: what the API types do not know would otherwise be dropped
/// without a word (the API server drops or rejects it too).
pub(crate) fn parse_strict<T: DeserializeOwned + Serialize>(raw: &Value, what: &str) -> Check<T> {
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

pub(crate) fn diff(original: &Value, again: &Value, at: String, out: &mut Vec<String>) {
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

pub(crate) fn load_from(files: &[(String, String)]) -> Check<Deploy> {
    let mut daemonsets = Vec::new();
    let mut service_accounts = Vec::new();
    let mut cluster_roles = Vec::new();
    let mut bindings = Vec::new();
    let mut configs = Vec::new();
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
                ("v1", "ConfigMap") => configs.push(parse_strict(&raw, &what)?),
                ("rbac.authorization.k8s.io/v1", "ClusterRole") => {
                    cluster_roles.push(parse_strict(&raw, &what)?)
                }
                ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
                    bindings.push(parse_strict(&raw, &what)?)
                }
                (api, kind) => {
                    return Err(format!(
                        "{what}: unexpected kind {kind:?} (apiVersion {api:?}); \
                         deploy/ renders a DaemonSet, a ConfigMap, a ServiceAccount, a ClusterRole and a ClusterRoleBinding"
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
        config: exactly_one(configs, "ConfigMap")?,
    })
}

pub(crate) fn exactly_one<T>(mut found: Vec<T>, kind: &str) -> Check<T> {
    match found.len() {
        1 => Ok(found.remove(0)),
        n => Err(format!("deploy/ must hold exactly one {kind}, found {n}")),
    }
}

pub(crate) fn load() -> Deploy {
    load_dir(BASE)
}

/// A kustomization under deploy/, rendered and loaded.
pub(crate) fn load_dir(dir: &str) -> Deploy {
    load_from(&rendered(dir)).unwrap_or_else(|e| panic!("{e}"))
}

// ---------------------------------------------------------------------------
// Accessors.

pub(crate) fn pod(d: &Deploy) -> Check<&PodSpec> {
    d.daemonset
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .ok_or_else(|| "the DaemonSet has no pod template spec".to_string())
}

pub(crate) fn init_containers(p: &PodSpec) -> &[Container] {
    p.init_containers.as_deref().unwrap_or_default()
}

pub(crate) fn all_containers(p: &PodSpec) -> impl Iterator<Item = &Container> {
    init_containers(p).iter().chain(&p.containers)
}

pub(crate) fn container<'a>(p: &'a PodSpec, name: &str) -> Check<&'a Container> {
    all_containers(p)
        .find(|c| c.name == name)
        .ok_or_else(|| format!("no container {name:?} in the pod"))
}

pub(crate) fn agent(d: &Deploy) -> Check<&Container> {
    let p = pod(d)?;
    p.containers
        .iter()
        .find(|c| c.name == AGENT)
        .ok_or_else(|| format!("no main container {AGENT:?}"))
}

/// command followed by args: what the container executes.
pub(crate) fn argv(c: &Container) -> Vec<&str> {
    c.command
        .iter()
        .chain(c.args.iter())
        .flatten()
        .map(String::as_str)
        .collect()
}

/// The value of `--flag=value` or `--flag value` in `argv`.
pub(crate) fn flag<'a>(argv: &[&'a str], name: &str) -> Option<&'a str> {
    argv.iter().enumerate().find_map(|(i, a)| {
        if *a == name {
            argv.get(i + 1).copied()
        } else {
            a.strip_prefix(name).and_then(|v| v.strip_prefix('='))
        }
    })
}

pub(crate) fn privileged(c: &Container) -> bool {
    c.security_context
        .as_ref()
        .and_then(|s| s.privileged)
        .unwrap_or(false)
}

/// A key of the generated ConfigMap.
pub(crate) fn config_value<'a>(d: &'a Deploy, key: &str) -> Check<&'a str> {
    d.config
        .data
        .as_ref()
        .and_then(|m| m.get(key))
        .map(String::as_str)
        .ok_or_else(|| format!("the ConfigMap has no key {key:?}"))
}

/// The value the agent gets for `env`: the ConfigMap key the DaemonSet maps
/// to it. An env var set any other way is an error: the ConfigMap is the one
/// configuration source.
pub(crate) fn env_setting<'a>(d: &'a Deploy, env: &str) -> Check<&'a str> {
    let e = agent(d)?
        .env
        .iter()
        .flatten()
        .find(|e| e.name == env)
        .ok_or_else(|| format!("the agent has no env {env}"))?;
    let r = e
        .value_from
        .as_ref()
        .and_then(|v| v.config_map_key_ref.as_ref())
        .ok_or_else(|| format!("env {env} must come from a configMapKeyRef"))?;
    if Some(r.name.as_str()) != d.config.metadata.name.as_deref() || r.optional == Some(true) {
        return Err(format!(
            "env {env} must come from the generated ConfigMap {:?}, not optional; refers to {:?}",
            d.config.metadata.name, r.name
        ));
    }
    config_value(d, &r.key)
}

pub(crate) fn sorted<'a>(v: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut v: Vec<&str> = v.into_iter().collect();
    v.sort_unstable();
    v
}
