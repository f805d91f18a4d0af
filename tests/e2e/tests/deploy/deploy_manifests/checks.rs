//! The checks of the manifests, one function each.

use super::*;

pub(crate) fn check_pod_basics(d: &Deploy) -> Check<()> {
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
    // The setting, copied from the ConfigMap by deploy/components/rollout.
    let setting = config_value(d, MAX_UNAVAILABLE)?;
    let want = setting
        .parse::<i32>()
        .map_err(|_| format!("{MAX_UNAVAILABLE} {setting:?} is not a number of nodes"))?;
    if strategy.type_.as_deref() != Some("RollingUpdate")
        || max_unavailable != Some(&IntOrString::Int(want))
        || want < 1
    {
        return Err(format!(
            "updateStrategy must be RollingUpdate with maxUnavailable {setting} (the ConfigMap's {MAX_UNAVAILABLE}, at least 1), is {max_unavailable:?}"
        ));
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
pub(crate) fn tolerates_all(tolerations: &[Toleration], effect: &str) -> bool {
    tolerations.iter().any(|t| {
        t.operator.as_deref() == Some("Exists")
            && t.key.as_deref().unwrap_or("").is_empty()
            && t.effect.as_deref().is_none_or(|e| e == effect)
    })
}

pub(crate) fn check_tolerations(d: &Deploy) -> Check<()> {
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
pub(crate) fn check_confined(c: &Container, add: &[&str]) -> Check<()> {
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

pub(crate) fn check_agent_capabilities(d: &Deploy) -> Check<()> {
    let allowed: Vec<&str> = AGENT_CAPABILITIES.iter().map(|(c, _)| *c).collect();
    check_confined(agent(d)?, &allowed)
}

/// The seccomp and AppArmor decisions (see the comment in daemonset.yaml):
/// the agent is Unconfined because the runtimes' defaults block bpf(2) and
/// pinning; install-cni keeps RuntimeDefault.
pub(crate) fn check_lsm_profiles(d: &Deploy) -> Check<()> {
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

pub(crate) fn check_install_cni(d: &Deploy) -> Check<()> {
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

pub(crate) fn check_bpffs_propagation(d: &Deploy) -> Check<()> {
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
        // The same rule's other half compares the literal name.
        let added = sc.and_then(|s| s.capabilities.as_ref()?.add.as_ref());
        if sc.and_then(|s| s.allow_privilege_escalation) == Some(false)
            && added.is_some_and(|a| a.iter().any(|c| c == "CAP_SYS_ADMIN"))
        {
            return Err(format!(
                "{}: allowPrivilegeEscalation false with CAP_SYS_ADMIN added is refused",
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

pub(crate) fn check_host_mounts(d: &Deploy) -> Check<()> {
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

/// The port of the agent's --metrics-addr: a flag (which overrides the
/// environment), else the ConfigMap's metrics-addr, else the default.
pub(crate) fn metrics_port(d: &Deploy) -> Check<i32> {
    let args = argv(agent(d)?);
    let addr = match flag(&args, "--metrics-addr") {
        Some(a) => a,
        None => env_setting(d, "MYCNI_METRICS_ADDR").unwrap_or(METRICS_ADDR_DEFAULT),
    };
    addr.rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .ok_or_else(|| format!("--metrics-addr {addr:?} has no port"))
}

pub(crate) fn check_agent_flags(d: &Deploy) -> Check<()> {
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
    let port = metrics_port(d)?;
    if port != METRICS_PORT {
        return Err(format!("metrics port must be {METRICS_PORT}, is {port}"));
    }
    Ok(())
}

pub(crate) fn check_probes(d: &Deploy) -> Check<()> {
    let a = agent(d)?;
    let port = metrics_port(d)?;
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
    // /healthz fails until the first pass, then when the loop goes stale:
    // the startup probe waits for the first, liveness for the second.
    for (kind, probe, path) in [
        ("readinessProbe", &a.readiness_probe, "/readyz"),
        ("startupProbe", &a.startup_probe, "/healthz"),
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

pub(crate) fn check_env(d: &Deploy) -> Check<()> {
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
    // Every setting comes from the one ConfigMap, and it holds nothing else.
    for (key, var, _) in SETTINGS.iter() {
        let e = env
            .iter()
            .find(|e| e.name == *var)
            .ok_or_else(|| format!("the agent has no env {var} (ConfigMap key {key})"))?;
        let r = e
            .value_from
            .as_ref()
            .and_then(|v| v.config_map_key_ref.as_ref());
        if r.map(|r| r.key.as_str()) != Some(*key) {
            return Err(format!("env {var} must come from ConfigMap key {key}"));
        }
        env_setting(d, var)?;
    }
    let keys: BTreeSet<&str> = d
        .config
        .data
        .iter()
        .flatten()
        .map(|(k, _)| k.as_str())
        .collect();
    let want: BTreeSet<&str> = SETTINGS
        .iter()
        .map(|(k, _, _)| *k)
        .chain([MAX_UNAVAILABLE])
        .collect();
    if keys != want {
        return Err(format!(
            "the ConfigMap must hold exactly {want:?}, holds {keys:?}"
        ));
    }
    if d.config.metadata.namespace.as_deref() != Some(NAMESPACE)
        || !d
            .config
            .metadata
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with(&format!("{CONFIG_MAP}-")))
    {
        return Err(format!(
            "the ConfigMap must be {NAMESPACE}/{CONFIG_MAP}-<hash> (kustomize's configMapGenerator), is {:?}",
            d.config.metadata.name
        ));
    }
    Ok(())
}

/// The base's values are the committed defaults; the cluster CIDR is the one
/// deploy/README.md tells kube-controller-manager to use.
pub(crate) fn check_base_settings(d: &Deploy) -> Check<()> {
    for (key, var, value) in SETTINGS.iter() {
        let got = env_setting(d, var)?;
        if got != *value {
            return Err(format!("the base's {key} must be {value:?}, is {got:?}"));
        }
    }
    let got = config_value(d, MAX_UNAVAILABLE)?;
    if got != "1" {
        return Err(format!(
            "the base's {MAX_UNAVAILABLE} must be 1, is {got:?}"
        ));
    }
    Ok(())
}

/// prometheus.io/* annotations on the pod template, on the metrics port.
pub(crate) fn check_scrape_annotations(d: &Deploy) -> Check<()> {
    let port = metrics_port(d)?.to_string();
    let annotations = d
        .daemonset
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.annotations.clone())
        .unwrap_or_default();
    for (k, v) in [
        ("prometheus.io/scrape", "true"),
        ("prometheus.io/port", port.as_str()),
        ("prometheus.io/path", "/metrics"),
    ] {
        if annotations.get(k).map(String::as_str) != Some(v) {
            return Err(format!(
                "the pod template must be annotated {k}: {v:?}, is {:?}",
                annotations.get(k)
            ));
        }
    }
    Ok(())
}

/// Bytes or cores of a Kubernetes quantity ("64Mi", "100m", "1").
pub(crate) fn quantity(q: &str) -> Check<f64> {
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
pub(crate) const AGENT_RSS_TARGET: f64 = 50e6;

pub(crate) fn check_resources(d: &Deploy) -> Check<()> {
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

pub(crate) fn check_rbac_rules(d: &Deploy) -> Check<()> {
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

/// No write verb on `nodes` itself, nor a wildcard that covers it: the
/// agent writes its annotations and condition through `nodes/status`.
pub(crate) fn check_no_node_writes(d: &Deploy) -> Check<()> {
    const WRITES: [&str; 6] = [
        "create",
        "update",
        "patch",
        "delete",
        "deletecollection",
        "*",
    ];
    for rule in d.cluster_role.rules.iter().flatten() {
        let core = rule
            .api_groups
            .iter()
            .flatten()
            .any(|g| g.is_empty() || g == "*");
        let nodes = rule
            .resources
            .iter()
            .flatten()
            .any(|r| r == "nodes" || r == "*");
        let writes: Vec<&String> = rule
            .verbs
            .iter()
            .filter(|v| WRITES.contains(&v.as_str()))
            .collect();
        if core && nodes && !writes.is_empty() {
            return Err(format!(
                "the ClusterRole may write to nodes ({writes:?}): only nodes/status may be patched"
            ));
        }
    }
    Ok(())
}

pub(crate) fn check_binding(d: &Deploy) -> Check<()> {
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
