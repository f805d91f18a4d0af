//! The removal, `deploy/cleanup`: the agent's DaemonSet with the agent
//! replaced by `mycni-agent uninstall` on the same mounts.

use super::*;

pub(crate) const UNINSTALL: &str = "uninstall";

/// The `mycni-agent uninstall ...` command inside the init container's
/// shell line (it runs with `/bin/sh -c` to also remove the VTEP MAC file).
pub(crate) fn uninstall_argv(c: &Container) -> Check<Vec<&str>> {
    let args = argv(c);
    let script = match args.as_slice() {
        ["/bin/sh", "-c", script] => *script,
        _ => {
            return Err(format!(
                "{}: must run /bin/sh -c <script>, runs {args:?}",
                c.name
            ));
        }
    };
    let words: Vec<&str> = script
        .split_whitespace()
        .skip_while(|w| *w != AGENT_BIN)
        .take_while(|w| *w != "&&")
        .collect();
    if words.get(1) != Some(&UNINSTALL) {
        return Err(format!(
            "{}: no `{AGENT_BIN} uninstall` in {script:?}",
            c.name
        ));
    }
    if !script.starts_with(AGENT_BIN) {
        return Err(format!(
            "{}: the uninstall must run first, so its failure fails the container: {script:?}",
            c.name
        ));
    }
    Ok(words)
}

fn capabilities(c: &Container) -> Vec<String> {
    c.security_context
        .as_ref()
        .and_then(|s| s.capabilities.as_ref())
        .and_then(|c| c.add.clone())
        .unwrap_or_default()
}

pub(crate) fn check_cleanup(base: &Deploy, d: &Deploy) -> Check<()> {
    // The same DaemonSet, so the rollout stops each node's agent before the
    // uninstall runs there.
    if (&d.daemonset.metadata.name, &d.daemonset.metadata.namespace)
        != (
            &base.daemonset.metadata.name,
            &base.daemonset.metadata.namespace,
        )
    {
        return Err(
            "the cleanup must replace the agent's DaemonSet, same name and namespace".into(),
        );
    }
    let p = pod(d)?;
    let base_pod = pod(base)?;
    let inits: Vec<&str> = init_containers(p).iter().map(|c| c.name.as_str()).collect();
    if inits != [MOUNT_BPFFS, UNINSTALL] {
        return Err(format!(
            "init containers must be [{MOUNT_BPFFS}, {UNINSTALL}], are {inits:?}"
        ));
    }
    let image = container(base_pod, AGENT)?.image.clone();
    for c in all_containers(p) {
        if c.image != image {
            return Err(format!("{}: must run the base's image {image:?}", c.name));
        }
    }
    let u = container(p, UNINSTALL)?;
    let cmd = uninstall_argv(u)?;
    // Every path the uninstall touches is the host's, through the same
    // volume as the agent's.
    let volumes = p.volumes.as_deref().unwrap_or_default();
    let base_volumes = base_pod.volumes.as_deref().unwrap_or_default();
    for (name, default, host) in AGENT_PATH_FLAGS {
        let value = flag(&cmd, name).unwrap_or(default);
        let mount = u
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.mount_path == value)
            .ok_or_else(|| format!("{UNINSTALL}: {name} {value} is not a mount"))?;
        let v = volumes
            .iter()
            .find(|v| v.name == mount.name)
            .ok_or_else(|| format!("{UNINSTALL}: no volume {}", mount.name))?;
        let host_path = v.host_path.as_ref().map(|h| h.path.as_str());
        if host_path != Some(*host) || !base_volumes.contains(v) {
            return Err(format!(
                "{UNINSTALL}: {name} {value} must be the agent's mount of {host}, is {host_path:?}"
            ));
        }
    }
    // Less than the agent: no SYS_ADMIN, which only loading programs needs.
    let mut agent_caps = capabilities(container(base_pod, AGENT)?);
    agent_caps.retain(|c| c != "SYS_ADMIN");
    let caps = capabilities(u);
    if privileged(u) || caps.iter().any(|c| !agent_caps.contains(c)) {
        return Err(format!(
            "{UNINSTALL}: no more privilege than the agent's without SYS_ADMIN ({agent_caps:?}), has {caps:?}"
        ));
    }
    // Nothing of the agent runs any more, and nothing answers probes.
    for c in &p.containers {
        if argv(c).contains(&AGENT_BIN)
            || c.liveness_probe.is_some()
            || c.readiness_probe.is_some()
            || c.startup_probe.is_some()
            || c.ports.is_some()
            || !capabilities(c).is_empty()
            || privileged(c)
        {
            return Err(format!(
                "{}: the cleanup's main container only waits, unprivileged",
                c.name
            ));
        }
    }
    let annotations = d
        .daemonset
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.annotations.as_ref());
    if annotations.is_some_and(|a| a.keys().any(|k| k.starts_with("prometheus.io/"))) {
        return Err("nothing to scrape on a cleaned node: no prometheus.io annotations".into());
    }
    Ok(())
}

pub(crate) type CleanupBreakage = (&'static str, fn(&mut Deploy));

pub(crate) const CLEANUP_BREAKAGES: &[CleanupBreakage] = &[
    ("a DaemonSet of its own", |d| {
        d.daemonset.metadata.name = Some("mycni-cleanup".into())
    }),
    ("uninstall without /proc/sys", |d| {
        let m = container_mut(d, UNINSTALL)
            .volume_mounts
            .as_mut()
            .expect("mounts");
        m.retain(|m| m.mount_path != "/host/proc/sys");
    }),
    ("uninstall adds SYS_ADMIN", |d| {
        add_capability(d, UNINSTALL, "SYS_ADMIN")
    }),
    ("the agent still runs", |d| {
        pod_mut(d).containers[0].command = Some(vec![AGENT_BIN.into(), "run".into()])
    }),
    ("conflist dir not the host's", |d| {
        let c = container_mut(d, UNINSTALL);
        if let Some(script) = c.command.as_mut().and_then(|c| c.last_mut()) {
            *script = script.replace(
                "--cni-conf-dir=/host/etc/cni/net.d",
                "--cni-conf-dir=/etc/cni/net.d",
            );
        }
    }),
    ("uninstall failure ignored", |d| {
        let c = container_mut(d, UNINSTALL);
        if let Some(script) = c.command.as_mut().and_then(|c| c.last_mut()) {
            *script = format!("true; {script}");
        }
    }),
];
