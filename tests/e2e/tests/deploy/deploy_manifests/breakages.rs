//! Each check fails on a manifest broken the way it guards against.

use super::*;

pub(crate) fn pod_mut(d: &mut Deploy) -> &mut PodSpec {
    d.daemonset
        .spec
        .as_mut()
        .and_then(|s| s.template.spec.as_mut())
        .expect("pod spec")
}

pub(crate) fn container_mut<'a>(d: &'a mut Deploy, name: &str) -> &'a mut Container {
    let p = pod_mut(d);
    p.init_containers
        .iter_mut()
        .flatten()
        .chain(p.containers.iter_mut())
        .find(|c| c.name == name)
        .expect("container")
}

pub(crate) fn security_mut<'a>(
    d: &'a mut Deploy,
    name: &str,
) -> &'a mut k8s_openapi::api::core::v1::SecurityContext {
    container_mut(d, name)
        .security_context
        .as_mut()
        .expect("securityContext")
}

pub(crate) fn add_capability(d: &mut Deploy, name: &str, cap: &str) {
    let caps = security_mut(d, name)
        .capabilities
        .as_mut()
        .expect("capabilities");
    caps.add.get_or_insert_with(Vec::new).push(cap.to_string());
}

pub(crate) fn mount_mut<'a>(
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

pub(crate) fn args_mut(d: &mut Deploy) -> &mut Vec<String> {
    container_mut(d, AGENT).args.as_mut().expect("args")
}

pub(crate) type Breakage = (&'static str, fn(&Deploy) -> Check<()>, fn(&mut Deploy));

pub(crate) const BREAKAGES: &[Breakage] = &[
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
    ("agent adds SYS_MODULE", check_agent_capabilities, |d| {
        add_capability(d, AGENT, "SYS_MODULE")
    }),
    (
        "agent spells it CAP_SYS_ADMIN",
        check_bpffs_propagation,
        |d| {
            let caps = security_mut(d, AGENT).capabilities.as_mut().expect("caps");
            for c in caps.add.iter_mut().flatten() {
                if c == "SYS_ADMIN" {
                    *c = "CAP_SYS_ADMIN".into();
                }
            }
        },
    ),
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
        let data = d.config.data.as_mut().expect("data");
        data.insert("metrics-addr".into(), "0.0.0.0:9090".into());
    }),
    (
        "metrics flag overrides the ConfigMap",
        check_agent_flags,
        |d| {
            args_mut(d).push("--metrics-addr=0.0.0.0:9090".into());
        },
    ),
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
    ("another cluster CIDR", check_base_settings, |d| {
        let data = d.config.data.as_mut().expect("data");
        data.insert("cluster-cidr".into(), "10.0.0.0/8".into());
    }),
    ("cluster CIDR as a literal", check_env, |d| {
        for e in container_mut(d, AGENT).env.iter_mut().flatten() {
            if e.name == "MYCNI_CLUSTER_CIDR" {
                e.value = Some("10.244.0.0/16".into());
                e.value_from = None;
            }
        }
    }),
    ("MTU from another ConfigMap", check_env, |d| {
        for e in container_mut(d, AGENT).env.iter_mut().flatten() {
            if e.name == "MYCNI_MTU" {
                let r = e
                    .value_from
                    .as_mut()
                    .and_then(|v| v.config_map_key_ref.as_mut());
                r.expect("configMapKeyRef").name = "mycni-config".into();
            }
        }
    }),
    ("a ConfigMap key nothing reads", check_env, |d| {
        let data = d.config.data.as_mut().expect("data");
        data.insert("iface".into(), "eth0".into());
    }),
    ("no startup probe", check_probes, |d| {
        container_mut(d, AGENT).startup_probe = None
    }),
    ("scraped on another port", check_scrape_annotations, |d| {
        let t = d.daemonset.spec.as_mut().expect("spec");
        let a = t
            .template
            .metadata
            .as_mut()
            .and_then(|m| m.annotations.as_mut());
        a.expect("annotations")
            .insert("prometheus.io/port".into(), "9090".into());
    }),
    ("maxUnavailable not the setting", check_pod_basics, |d| {
        let data = d.config.data.as_mut().expect("data");
        data.insert(MAX_UNAVAILABLE.into(), "3".into());
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
    ("role may patch nodes", check_no_node_writes, |d| {
        let rules = d.cluster_role.rules.as_mut().expect("rules");
        rules[0].verbs.push("patch".into());
    }),
    (
        "role may do anything to anything",
        check_no_node_writes,
        |d| {
            let rules = d.cluster_role.rules.as_mut().expect("rules");
            rules.push(k8s_openapi::api::rbac::v1::PolicyRule {
                api_groups: Some(vec!["*".into()]),
                resources: Some(vec!["*".into()]),
                verbs: vec!["*".into()],
                ..Default::default()
            });
        },
    ),
    ("role reads secrets", check_rbac_rules, |d| {
        let rules = d.cluster_role.rules.as_mut().expect("rules");
        rules.push(k8s_openapi::api::rbac::v1::PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["secrets".into()]),
            verbs: vec!["list".into()],
            ..Default::default()
        });
    }),
    ("role writes networkpolicies", check_rbac_rules, |d| {
        let rules = d.cluster_role.rules.as_mut().expect("rules");
        rules.push(k8s_openapi::api::rbac::v1::PolicyRule {
            api_groups: Some(vec!["networking.k8s.io".into()]),
            resources: Some(vec!["networkpolicies".into()]),
            verbs: vec!["patch".into()],
            ..Default::default()
        });
    }),
    ("role cannot watch pods", check_rbac_rules, |d| {
        let rules = d.cluster_role.rules.as_mut().expect("rules");
        rules.retain(|r| {
            r.resources.as_deref() != Some(&["pods".to_string(), "namespaces".to_string()][..])
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
