//! The CRI v1 calls kubelet makes, over containerd's unix socket.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use hyper_util::rt::TokioIo;
use k8s_cri::v1 as api;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// No CRI call of a test should take this long; a hung containerd then
/// fails the test instead of stalling it.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A CRI runtime-service client, cheap to clone.
#[derive(Clone)]
pub struct CriClient {
    inner: RuntimeServiceClient<Channel>,
}

/// What kubelet learns about a running sandbox, plus what containerd only
/// shows in the verbose status.
#[derive(Debug, Clone)]
pub struct PodStatus {
    pub id: String,
    /// `PodSandboxNetworkStatus.ip`, the IP kubelet reports for the pod.
    pub ip: String,
    pub additional_ips: Vec<String>,
    /// The netns path containerd handed the CNI plugin as CNI_NETNS, in
    /// containerd's own mount namespace.
    pub netns_path: PathBuf,
    /// The sandbox container's init process.
    pub pid: u32,
    /// containerd's verbose sandbox info (runtime spec, CNI result, ...).
    pub info: serde_json::Value,
}

/// Output of `ExecSync`.
#[derive(Debug, Clone)]
pub struct ExecOutput {
    pub exit_code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl CriClient {
    /// A client for the CRI gRPC server on a unix socket. It connects on
    /// first use, and again after a failed call, so it can be made before
    /// the server is up. Must be called inside a tokio runtime. The URI is a
    /// placeholder tonic requires; the connector ignores it.
    pub fn new_lazy(socket: &Path) -> Result<Self> {
        let socket = socket.to_path_buf();
        let channel =
            Endpoint::try_from("http://[::1]:1")?
                .connect_timeout(Duration::from_secs(5))
                .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                    let socket = socket.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(socket).await?))
                    }
                }));
        Ok(Self {
            inner: RuntimeServiceClient::new(channel),
        })
    }

    pub async fn status(&self) -> Result<Vec<api::RuntimeCondition>> {
        let resp = timed(
            "Status",
            self.inner
                .clone()
                .status(api::StatusRequest { verbose: false }),
        )
        .await?;
        Ok(resp.status.map(|s| s.conditions).unwrap_or_default())
    }

    pub async fn run_pod_sandbox(&self, config: api::PodSandboxConfig) -> Result<String> {
        let resp = timed(
            "RunPodSandbox",
            self.inner
                .clone()
                .run_pod_sandbox(api::RunPodSandboxRequest {
                    config: Some(config),
                    runtime_handler: String::new(),
                }),
        )
        .await?;
        Ok(resp.pod_sandbox_id)
    }

    pub async fn pod_sandbox_status(&self, id: &str) -> Result<PodStatus> {
        let resp = timed(
            "PodSandboxStatus",
            self.inner
                .clone()
                .pod_sandbox_status(api::PodSandboxStatusRequest {
                    pod_sandbox_id: id.to_owned(),
                    verbose: true,
                }),
        )
        .await?;
        let status = resp.status.context("PodSandboxStatus without status")?;
        let network = status.network.unwrap_or_default();
        // containerd 1.6 puts its sandboxInfo as JSON under the key "info".
        let info: serde_json::Value = match resp.info.get("info") {
            Some(s) => serde_json::from_str(s).context("parse verbose sandbox info")?,
            None => serde_json::Value::Null,
        };
        let netns_path = info["runtimeSpec"]["linux"]["namespaces"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|ns| ns["type"] == "network")
            .and_then(|ns| ns["path"].as_str())
            .map(PathBuf::from)
            .ok_or_else(|| anyhow!("no network namespace path in sandbox {id}'s info"))?;
        let pid = info["pid"]
            .as_u64()
            .and_then(|p| u32::try_from(p).ok())
            .unwrap_or_default();
        Ok(PodStatus {
            id: status.id,
            ip: network.ip,
            additional_ips: network.additional_ips.into_iter().map(|p| p.ip).collect(),
            netns_path,
            pid,
            info,
        })
    }

    pub async fn stop_pod_sandbox(&self, id: &str) -> Result<()> {
        timed(
            "StopPodSandbox",
            self.inner
                .clone()
                .stop_pod_sandbox(api::StopPodSandboxRequest {
                    pod_sandbox_id: id.to_owned(),
                }),
        )
        .await?;
        Ok(())
    }

    pub async fn remove_pod_sandbox(&self, id: &str) -> Result<()> {
        timed(
            "RemovePodSandbox",
            self.inner
                .clone()
                .remove_pod_sandbox(api::RemovePodSandboxRequest {
                    pod_sandbox_id: id.to_owned(),
                }),
        )
        .await?;
        Ok(())
    }

    pub async fn create_container(
        &self,
        sandbox_id: &str,
        config: api::ContainerConfig,
        sandbox_config: api::PodSandboxConfig,
    ) -> Result<String> {
        let resp = timed(
            "CreateContainer",
            self.inner
                .clone()
                .create_container(api::CreateContainerRequest {
                    pod_sandbox_id: sandbox_id.to_owned(),
                    config: Some(config),
                    sandbox_config: Some(sandbox_config),
                }),
        )
        .await?;
        Ok(resp.container_id)
    }

    pub async fn start_container(&self, id: &str) -> Result<()> {
        timed(
            "StartContainer",
            self.inner
                .clone()
                .start_container(api::StartContainerRequest {
                    container_id: id.to_owned(),
                }),
        )
        .await?;
        Ok(())
    }

    pub async fn exec_sync(
        &self,
        container_id: &str,
        cmd: &[&str],
        timeout: Duration,
    ) -> Result<ExecOutput> {
        let resp = timed(
            "ExecSync",
            self.inner.clone().exec_sync(api::ExecSyncRequest {
                container_id: container_id.to_owned(),
                cmd: cmd.iter().map(|s| (*s).to_owned()).collect(),
                timeout: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
            }),
        )
        .await?;
        Ok(ExecOutput {
            exit_code: resp.exit_code,
            stdout: String::from_utf8_lossy(&resp.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&resp.stderr).into_owned(),
        })
    }
}

async fn timed<T>(
    what: &str,
    call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(Ok(resp)) => Ok(resp.into_inner()),
        Ok(Err(status)) => Err(anyhow!(
            "CRI {what}: {:?}: {}",
            status.code(),
            status.message()
        )),
        Err(_) => Err(anyhow!("CRI {what}: no answer within {CALL_TIMEOUT:?}")),
    }
}
