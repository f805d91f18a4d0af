//! The Kubernetes API client, and which Node the agent runs on.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

use super::Config;

pub async fn kube_client(kubeconfig: Option<&Path>) -> Result<kube::Client> {
    let config = match kubeconfig {
        Some(p) => {
            let kc = kube::config::Kubeconfig::read_from(p)
                .with_context(|| format!("reading kubeconfig {}", p.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?
        }
        None => kube::Config::infer()
            .await
            .context("no kubeconfig and not in a cluster")?,
    };
    // Fail a dead connection attempt fast and retry, rather than hang 30 s.
    let mut config = config;
    config.connect_timeout = Some(Duration::from_secs(5));
    config.write_timeout = Some(Duration::from_secs(10));
    Ok(kube::Client::try_from(config)?)
}

pub(super) async fn resolve_node_name(cfg: &Config, client: &kube::Client) -> Result<String> {
    if let Some(n) = cfg.node_name.clone().filter(|n| !n.is_empty()) {
        return Ok(n);
    }
    // The seed's way: our own Pod says which node it runs on.
    let (Some(pod), Some(ns)) = (&cfg.pod_name, &cfg.pod_namespace) else {
        bail!("set NODE_NAME (downward API spec.nodeName), or POD_NAME and POD_NAMESPACE");
    };
    let p = Api::<Pod>::namespaced(client.clone(), ns).get(pod).await?;
    p.spec
        .and_then(|s| s.node_name)
        .with_context(|| format!("pod {ns}/{pod} is not scheduled yet"))
}
