//! Pods as a kubelet makes them: the Pod object (what the scheduler
//! wrote), the sandbox (the plugin's ADD with the pod's namespace and name
//! in `CNI_ARGS`), `status.podIPs`, the servers; and the lab's record of
//! its pods (`pods.json`), which every command reads.

use std::net::{Ipv4Addr, Ipv6Addr};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use mycni_testkit::sh;

use crate::daemon::{spawn_daemon, stop_pidfile};
use crate::kubeapi::{Method, collection};
use crate::model::{
    self, ContainerPort, KubePod, NAMESPACES, Proto, namespace_labels, namespace_object,
    pod_object, pod_status,
};
use crate::{Lab, Pod};

/// What `lab pod add` asks for.
#[derive(Debug, Clone)]
pub struct PodRequest {
    pub namespace: String,
    pub name: String,
    /// 1-based.
    pub node: usize,
    pub labels: Vec<(String, String)>,
    pub ports: Vec<ContainerPort>,
}

impl Lab {
    /// Whether the fixture serves Pods (it served Nodes alone before
    /// issue 24): without them the lab's pods have no objects, only
    /// sandboxes.
    pub(crate) fn serves_pods(&self) -> bool {
        self.kube_serves("v1", "pods")
    }

    /// The model's namespaces x, y, z with their labels.
    pub(crate) fn create_model_namespaces(&self) -> Result<()> {
        if !self.kube_serves("v1", "namespaces") {
            return Ok(());
        }
        for ns in NAMESPACES {
            self.kube_apply("namespaces", &namespace_object(ns, &namespace_labels(ns)))?;
        }
        Ok(())
    }

    /// Node `i`'s `j`-th pod with a Kubernetes side: its object first (a
    /// kubelet only starts what the API assigned it), then the sandbox,
    /// then its status and servers.
    pub(crate) fn add_kube_pod_at(&self, i: usize, j: usize, k: KubePod) -> Result<Pod> {
        let serves = self.serves_pods();
        if serves {
            self.kube_apply("pods", &pod_object(&k, &self.spec.node_name(i)))?;
        }
        let mut pod = self.add_pod(i, j, Some((&k.namespace, &k.name)))?;
        if serves {
            let path = format!(
                "{}/{}/status",
                collection("pods", Some(&k.namespace)),
                k.name
            );
            self.kube_ok(Method::Patch, &path, Some(&pod_status(&pod)))?;
        }
        let mut args = vec!["serve".to_string()];
        args.extend(
            k.ports
                .iter()
                .map(|p| format!("{}/{}", p.port, p.proto.lower())),
        );
        let dir = self.spec.node_dir(i).join(format!("pod{j}"));
        spawn_daemon(
            &pod.ns,
            &self.spec.bins.lab,
            &args,
            &dir.join("serve.log"),
            &dir.join("serve.pid"),
        )?;
        pod.kube = Some(k);
        Ok(pod)
    }

    /// `lab pod add`: a pod of the user's choosing on a running lab, with a
    /// Service like the others'.
    pub fn add_kube_pod(&self, req: &PodRequest) -> Result<Pod> {
        let s = &self.spec;
        if req.node == 0 || req.node > s.nodes {
            bail!("--node {}: the lab has nodes 1..={}", req.node, s.nodes);
        }
        let mut pods = self.pods()?;
        if pods.iter().any(|p| {
            p.kube.as_ref().map(KubePod::label) == Some(format!("{}/{}", req.namespace, req.name))
        }) {
            bail!("pod {}/{} exists", req.namespace, req.name);
        }
        let j = pods
            .iter()
            .filter(|p| p.node == req.node)
            .map(|p| p.index)
            .max()
            .unwrap_or(0)
            + 1;
        // The next free Service ordinal: past every ClusterIP in use.
        let used: Vec<Ipv4Addr> = pods
            .iter()
            .filter_map(|p| p.kube.as_ref()?.cluster_ip)
            .collect();
        let n = (0..)
            .find(|n| !used.contains(&model::cluster_ips(*n).0))
            .unwrap_or(0);
        let (v4, v6) = model::cluster_ips(n);
        let k = KubePod {
            namespace: req.namespace.clone(),
            name: req.name.clone(),
            labels: req.labels.clone(),
            ports: req.ports.clone(),
            cluster_ip: s.stack.has(crate::IpFamily::V4).then_some(v4),
            cluster_ip6: s.stack.has(crate::IpFamily::V6).then_some(v6),
        };
        let pod = self.add_kube_pod_at(req.node, j, k)?;
        pods.push(pod.clone());
        self.save_pods(&pods)?;
        self.sync_services()?;
        Ok(pod)
    }

    /// `lab pod delete`: the sandbox (DEL), its servers, its object and
    /// its Service.
    pub fn delete_kube_pod(&self, namespace: &str, name: &str) -> Result<()> {
        let mut pods = self.pods()?;
        let label = format!("{namespace}/{name}");
        let Some(at) = pods
            .iter()
            .position(|p| p.kube.as_ref().map(KubePod::label) == Some(label.clone()))
        else {
            bail!("no pod {label} in the lab");
        };
        let pod = pods.remove(at);
        self.remove_sandbox(&pod)?;
        if self.serves_pods() {
            self.kube_delete("pods", Some(namespace), name)?;
        }
        self.save_pods(&pods)?;
        self.sync_services()
    }

    /// Stops a pod's processes, runs the plugin's DEL and removes its
    /// namespace.
    pub(crate) fn remove_sandbox(&self, pod: &Pod) -> Result<()> {
        let dir = self
            .spec
            .node_dir(pod.node)
            .join(format!("pod{}", pod.index));
        for pid in ["echo.pid", "serve.pid"] {
            stop_pidfile(&dir.join(pid));
        }
        let names = pod
            .kube
            .as_ref()
            .map(|k| (k.namespace.as_str(), k.name.as_str()));
        let del = self.cni(
            pod.node,
            "DEL",
            crate::Sandbox::new(
                &format!("lab-{}-{}", pod.node, pod.index),
                &format!("/run/netns/{}", pod.ns),
                &cni_pod_arg(names, pod.index),
            ),
        );
        let _ = sh("ip", &["netns", "del", &pod.ns]);
        del.map(|_| ())
    }

    pub(crate) fn save_pods(&self, pods: &[Pod]) -> Result<()> {
        let listing: Vec<Value> = pods.iter().map(pod_json).collect();
        std::fs::write(self.spec.pods_file(), serde_json::to_vec_pretty(&listing)?)?;
        Ok(())
    }
}

/// The `pod` argument of [`Lab::cni`] for a pod named `names`, or the
/// anonymous `j`-th pod of its node.
pub(crate) fn cni_pod_arg(names: Option<(&str, &str)>, j: usize) -> String {
    match names {
        Some((ns, name)) => format!("{ns}/{name}"),
        None => format!("pod{j}"),
    }
}

/// A pod as `pods.json` records it.
pub(crate) fn pod_json(p: &Pod) -> Value {
    let kube = p.kube.as_ref().map(|k| {
        json!({"namespace": k.namespace, "name": k.name,
               "labels": k.labels.iter().map(|(a, b)| json!([a, b])).collect::<Vec<_>>(),
               "ports": k.ports.iter().map(ContainerPort::to_json).collect::<Vec<_>>(),
               "clusterIP": k.cluster_ip.map(|a| a.to_string()),
               "clusterIP6": k.cluster_ip6.map(|a| a.to_string())})
    });
    json!({"node": p.node, "index": p.index, "ns": p.ns,
           "ip": p.addr(crate::IpFamily::V4).map(|a| a.to_string()),
           "ip6": p.ip6.map(|a| a.to_string()),
           "kube": kube})
}

/// [`pod_json`] back.
pub(crate) fn pod_from_json(p: &Value) -> Result<Pod> {
    let kube = match &p["kube"] {
        Value::Null => None,
        k => Some(KubePod {
            namespace: k["namespace"].as_str().context("namespace")?.to_string(),
            name: k["name"].as_str().context("name")?.to_string(),
            labels: k["labels"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|l| Some((l[0].as_str()?.to_string(), l[1].as_str()?.to_string())))
                .collect(),
            ports: k["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| {
                    Ok(ContainerPort {
                        name: c["name"].as_str().context("port name")?.to_string(),
                        port: c["containerPort"].as_u64().context("containerPort")? as u16,
                        proto: c["protocol"]
                            .as_str()
                            .and_then(Proto::parse)
                            .context("protocol")?,
                    })
                })
                .collect::<Result<_>>()?,
            cluster_ip: k["clusterIP"]
                .as_str()
                .map(str::parse::<Ipv4Addr>)
                .transpose()?,
            cluster_ip6: k["clusterIP6"]
                .as_str()
                .map(str::parse::<Ipv6Addr>)
                .transpose()?,
        }),
    };
    Ok(Pod {
        node: p["node"].as_u64().context("node")? as usize,
        index: p["index"].as_u64().context("index")? as usize,
        ns: p["ns"].as_str().context("ns")?.to_string(),
        // null: a pod of an IPv6-only lab.
        ip: p["ip"]
            .as_str()
            .map(str::parse)
            .transpose()?
            .unwrap_or(Ipv4Addr::UNSPECIFIED),
        ip6: p["ip6"].as_str().map(str::parse).transpose()?,
        kube,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_json_round_trips() {
        let pod = Pod {
            node: 2,
            index: 4,
            ns: "mycni-node2-pod4".into(),
            ip: "10.244.2.9".parse().expect("ip"),
            ip6: None,
            kube: Some(model::model_pod(2, 1)),
        };
        let back = pod_from_json(&pod_json(&pod)).expect("parses");
        assert_eq!(back.kube, pod.kube);
        assert_eq!(back.ip, pod.ip);
        let anon = Pod { kube: None, ..pod };
        assert!(
            pod_from_json(&pod_json(&anon))
                .expect("parses")
                .kube
                .is_none()
        );
    }
}
