//! The CLI's side of the agent's HTTP API: `inspect`, `explain` and
//! `flows` ask the agent of a node through here.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use http_body_util::{BodyExt, Empty};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;

/// How long an agent may take to accept the connection.
const CONNECT: Duration = Duration::from_secs(3);
/// How long a whole answer may take (not a follow's, which never ends).
const ANSWER: Duration = Duration::from_secs(10);

/// Where to ask the agent that serves on `metrics_addr` (its
/// `--metrics-addr`): a wildcard address is asked on loopback.
pub fn agent_address(metrics_addr: &str) -> Result<SocketAddr> {
    let a = metrics_addr.trim();
    if a == "off" || a.is_empty() {
        bail!("the agent serves no HTTP (metrics-addr is off): nothing to ask");
    }
    let mut addr: SocketAddr = a
        .parse()
        .with_context(|| format!("{a:?} is not an address:port like 127.0.0.1:9971"))?;
    if addr.ip().is_unspecified() {
        let lo: IpAddr = if addr.is_ipv6() {
            std::net::Ipv6Addr::LOCALHOST.into()
        } else {
            std::net::Ipv4Addr::LOCALHOST.into()
        };
        addr.set_ip(lo);
    }
    Ok(addr)
}

/// GETs `path`; an answer other than 2xx is an error carrying its body.
async fn get(agent: SocketAddr, path: &str) -> Result<hyper::Response<Incoming>> {
    let tcp = tokio::time::timeout(CONNECT, tokio::net::TcpStream::connect(agent))
        .await
        .with_context(|| format!("connecting to the agent at {agent} timed out"))?
        .with_context(|| format!("connecting to the agent at {agent} (is it running? --agent)"))?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    let req = hyper::Request::get(path)
        .header(hyper::header::HOST, agent.to_string())
        .body(Empty::<Bytes>::new())?;
    let res = send.send_request(req).await?;
    let status = res.status();
    if !status.is_success() {
        let body = res.into_body().collect().await?.to_bytes();
        bail!(
            "the agent at {agent} answered {status}: {}",
            String::from_utf8_lossy(&body).trim()
        );
    }
    Ok(res)
}

/// The whole body of `path`.
pub async fn text(agent: SocketAddr, path: &str) -> Result<String> {
    tokio::time::timeout(ANSWER, async {
        let body = get(agent, path).await?.into_body().collect().await?;
        Ok(String::from_utf8_lossy(&body.to_bytes()).into_owned())
    })
    .await
    .with_context(|| format!("the agent at {agent} did not answer within {ANSWER:?}"))?
}

/// [`text`], for a caller outside any runtime.
pub(crate) fn text_blocking(agent: SocketAddr, path: &str) -> Result<String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(text(agent, path))
}

/// Hands each non-empty line of `path`'s body to `line` as it arrives (a
/// follow's body never ends), until `line` says stop.
pub async fn lines<F, Fut>(agent: SocketAddr, path: &str, mut line: F) -> Result<()>
where
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let mut res = get(agent, path).await?;
    let mut buf: Vec<u8> = Vec::new();
    while let Some(frame) = res.body_mut().frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        while let Some(end) = buf.iter().position(|b| *b == b'\n') {
            let raw: Vec<u8> = buf.drain(..=end).collect();
            let text = String::from_utf8_lossy(&raw).trim().to_string();
            if !text.is_empty() && !line(text).await {
                return Ok(());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wildcard_metrics_address_is_asked_on_loopback() {
        let a = agent_address("0.0.0.0:9971").expect("parses");
        assert_eq!(a.to_string(), "127.0.0.1:9971");
        let a = agent_address("[::]:9971").expect("parses");
        assert_eq!(a.to_string(), "[::1]:9971");
        assert_eq!(
            agent_address("10.0.0.1:9971").expect("parses").to_string(),
            "10.0.0.1:9971"
        );
        assert!(agent_address("off").is_err());
    }
}
