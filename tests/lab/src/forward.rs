//! kubectl from the host: the API fixture listens inside the underlay
//! namespace (192.168.77.1 or fd00:77::1), which the host does not have, so
//! a request from the host would leave by its default route. A forwarder
//! listens on a loopback port of the host's and connects, for each client,
//! from inside the underlay namespace; `<root>/kubeconfig`
//! (`/run/mycni-lab/kubeconfig`) names it. The agents keep their own
//! kubeconfig (`<root>/agents.kubeconfig`), which names the fixture itself.

use std::fs::File;
use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::daemon::{spawn_host_daemon, wait_for};
use crate::{Lab, Spec};

/// What `up` prints for the host.
pub const HOST_KUBECONFIG_HINT: &str = "kubectl get pods -A -o wide";

impl Spec {
    /// The agents' kubeconfig: the fixture at its own address.
    pub fn kubeconfig(&self) -> std::path::PathBuf {
        self.root.join("agents.kubeconfig")
    }

    /// The host's kubeconfig: the forwarder on a loopback port.
    pub fn host_kubeconfig(&self) -> std::path::PathBuf {
        self.root.join("kubeconfig")
    }
}

impl Lab {
    /// Starts the forwarder and writes the host's kubeconfig.
    pub(crate) fn start_host_api(&self) -> Result<()> {
        let port = self.start_host_forward("forward", self.spec.api_socket())?;
        std::fs::write(
            self.spec.host_kubeconfig(),
            kubeconfig_text(&format!("http://127.0.0.1:{port}")),
        )?;
        Ok(())
    }

    /// `mycni-agent flows --kubeconfig <the agents'> <args>` run from the
    /// underlay, where every node's agent is reachable (as from an
    /// operator's machine): what it printed.
    pub fn flows_cli(&self, args: &[&str]) -> Result<String> {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &self.spec.underlay_ns()])
            .arg(&self.spec.bins.agent)
            .arg("flows")
            .arg("--kubeconfig")
            .arg(self.spec.kubeconfig())
            .args(args)
            .output()?;
        if !out.status.success() {
            bail!(
                "mycni-agent flows {}: {}\n{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// A forwarder from a loopback port of the host to `to` in the
    /// underlay (`<root>/<name>.pid`, `.port`, `.log`; `down` stops it):
    /// the port.
    pub fn start_host_forward(&self, name: &str, to: SocketAddr) -> Result<u16> {
        let s = &self.spec;
        let file = s.root.join(format!("{name}.port"));
        let args: Vec<String> = vec![
            "forward".into(),
            "--netns".into(),
            s.underlay_ns(),
            "--to".into(),
            to.to_string(),
            "--port-file".into(),
            file.to_string_lossy().into_owned(),
        ];
        spawn_host_daemon(
            &s.bins.lab,
            &args,
            &s.root.join(format!("{name}.log")),
            &s.root.join(format!("{name}.pid")),
        )?;
        wait_for("a forwarder's port", Duration::from_secs(10), || {
            std::fs::read_to_string(&file)
                .map(|p| p.trim().parse::<u16>().is_ok())
                .unwrap_or(false)
        })?;
        Ok(std::fs::read_to_string(&file)?.trim().parse()?)
    }
}

/// A kubeconfig naming `server`, no credentials (the fixture has none).
pub fn kubeconfig_text(server: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: mycni-lab\n  cluster:\n    server: {server}\n\
         users:\n- name: mycni-lab\n  user: {{}}\ncontexts:\n- name: mycni-lab\n  context:\n    \
         cluster: mycni-lab\n    user: mycni-lab\ncurrent-context: mycni-lab\npreferences: {{}}\n"
    )
}

/// `mycni-lab forward --netns NS --to ADDR --port-file F`: listens on
/// 127.0.0.1 (an ephemeral port, written to F) in this namespace, then
/// enters NS, where every client's connection to ADDR is made.
pub fn forward_command(netns: &str, to: SocketAddr, port_file: &Path) -> Result<()> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let port = l.local_addr()?.port();
    // Before any thread exists: a thread started later inherits the
    // namespace of the thread that starts it, and the listener keeps the
    // namespace it was bound in.
    let ns = File::open(Path::new("/run/netns").join(netns))
        .with_context(|| format!("open netns {netns}"))?;
    // SAFETY: setns on this (the only) thread, with a valid fd.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        bail!("setns {netns}: {}", std::io::Error::last_os_error());
    }
    let tmp = port_file.with_extension("tmp");
    std::fs::File::create(&tmp)?.write_all(port.to_string().as_bytes())?;
    std::fs::rename(&tmp, port_file)?;
    for client in l.incoming() {
        let Ok(client) = client else { continue };
        std::thread::spawn(move || {
            let Ok(server) = TcpStream::connect_timeout(&to, Duration::from_secs(5)) else {
                return;
            };
            let _ = pipe(client, server);
        });
    }
    Ok(())
}

/// Copies both ways until either side closes (watches stay open for as
/// long as kubectl wants).
fn pipe(a: TcpStream, b: TcpStream) -> Result<()> {
    let (mut ar, mut bw) = (a.try_clone()?, b.try_clone()?);
    let up = std::thread::spawn(move || {
        let _ = std::io::copy(&mut ar, &mut bw);
        let _ = bw.shutdown(Shutdown::Write);
    });
    let (mut br, mut aw) = (b, a);
    let _ = std::io::copy(&mut br, &mut aw);
    let _ = aw.shutdown(Shutdown::Write);
    let _ = up.join();
    Ok(())
}
