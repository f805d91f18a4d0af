//! The local multi-node lab: an underlay bridge in its own namespace, N node
//! namespaces each running the real `mycni-agent` against the Kubernetes
//! API fixture, and P pods per node made by the real plugin binary from the
//! conflist the agent wrote. Used by `cargo xtask lab` and the lab tests.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::apiserver::{ApiServer, node};
use crate::{in_netns, sh};

/// The binaries a lab runs.
#[derive(Debug, Clone)]
pub struct Bins {
    pub agent: PathBuf,
    pub plugin: PathBuf,
    pub apiserver: PathBuf,
    /// `mycni-lab` itself: pods run its echo server.
    pub lab: PathBuf,
}

#[derive(Debug, Clone)]
pub struct Spec {
    /// Namespace names start with this: `mycni` for the CLI lab, unique in tests.
    pub prefix: String,
    pub nodes: usize,
    pub pods: usize,
    /// Lab state: kubeconfig, per-node dirs, logs, pids.
    pub root: PathBuf,
    pub bins: Bins,
    /// Extra arguments for every agent (e.g. `--datapath kernel`).
    pub agent_args: Vec<String>,
    /// Run the API fixture inside this process (tests, which then change
    /// Nodes and inject faults through `Lab::api`), else as a daemon.
    pub in_process_api: bool,
}

pub const API_ADDR: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 1);
pub const API_PORT: u16 = 6443;
pub const ECHO_PORT: u16 = 7777;
pub const METRICS_PORT: u16 = 9971;

pub fn node_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(192, 168, 77, 10 + i as u8)
}

impl Spec {
    pub fn underlay_ns(&self) -> String {
        format!("{}-underlay", self.prefix)
    }
    pub fn node_name(&self, i: usize) -> String {
        format!("{}-node{i}", self.prefix)
    }
    pub fn pod_ns(&self, i: usize, j: usize) -> String {
        format!("{}-node{i}-pod{j}", self.prefix)
    }
    pub fn node_dir(&self, i: usize) -> PathBuf {
        self.root.join(format!("node{i}"))
    }
    pub fn kubeconfig(&self) -> PathBuf {
        self.root.join("kubeconfig")
    }
    /// The lab's own bpffs: each node pins under `<bpffs>/node<i>/mycni`.
    /// Not /sys/fs/bpf: `ip netns exec` remounts /sys, hiding it.
    pub fn bpffs(&self) -> PathBuf {
        self.root.join("bpffs")
    }
    pub fn pin_dir(&self, i: usize) -> PathBuf {
        self.bpffs().join(format!("node{i}/mycni"))
    }
    fn pods_file(&self) -> PathBuf {
        self.root.join("pods.json")
    }
}

fn ns_exec(ns: &str, program: &str, args: &[&str]) -> Result<String> {
    let mut full = vec!["netns", "exec", ns, program];
    full.extend_from_slice(args);
    sh("ip", &full)
}

/// Starts `program` inside `ns` as a daemon in its own session (so it
/// outlives `lab up`), logging to `log`; records its pid in `pidfile`.
pub fn spawn_daemon(
    ns: &str,
    program: &Path,
    args: &[String],
    log: &Path,
    pidfile: &Path,
) -> Result<u32> {
    let out = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let err = out.try_clone()?;
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns])
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    // SAFETY: setsid, sigemptyset, sigprocmask and signal are
    // async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            // A daemon must die on SIGTERM whatever mask or disposition the
            // spawning thread had (a test harness thread, a runtime worker).
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
            libc::signal(libc::SIGTERM, libc::SIG_DFL);
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {}", program.display()))?;
    let pid = child.id();
    std::fs::write(pidfile, pid.to_string())?;
    Ok(pid)
}

fn stop_pidfile(pidfile: &Path) {
    let Ok(s) = std::fs::read_to_string(pidfile) else {
        return;
    };
    let Ok(pid) = s.trim().parse::<i32>() else {
        return;
    };
    // SAFETY: plain kill(2) on a pid we started.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    for _ in 0..500 {
        // When this process started the daemon (tests), it is our child and
        // stays a zombie until reaped: kill(pid, 0) alone would see it alive.
        // SAFETY: WNOHANG waitpid on a pid; ECHILD when it is not our child.
        let reaped = unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) } == pid;
        // SAFETY: signal 0 only probes for existence.
        if reaped || unsafe { libc::kill(pid, 0) } != 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let _ = std::fs::remove_file(pidfile);
}

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if f() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("timed out after {timeout:?} waiting for {what}")
}

/// One pod of the lab.
#[derive(Debug, Clone)]
pub struct Pod {
    pub node: usize,
    pub index: usize,
    pub ns: String,
    pub ip: Ipv4Addr,
}

pub struct Lab {
    pub spec: Spec,
    pub api: Option<ApiServer>,
}

impl Lab {
    /// Builds the whole lab. On failure, whatever was made is torn down.
    pub fn up(spec: Spec) -> Result<Lab> {
        if spec.root.join("state").exists() {
            bail!(
                "a lab is already up at {} (run `cargo xtask lab down`)",
                spec.root.display()
            );
        }
        std::fs::create_dir_all(&spec.root)?;
        std::fs::write(spec.root.join("state"), "up\n")?;
        let mut lab = Lab { spec, api: None };
        if let Err(e) = lab.build() {
            let logs = lab.agent_log_tails();
            lab.down();
            return Err(e.context(logs));
        }
        Ok(lab)
    }

    /// Attaches to a lab already up (for `lab test/status/down`).
    pub fn attach(spec: Spec) -> Lab {
        Lab { spec, api: None }
    }

    fn build(&mut self) -> Result<()> {
        let bpffs = self.spec.bpffs();
        std::fs::create_dir_all(&bpffs)?;
        sh("mount", &["-t", "bpf", "bpf", &bpffs.to_string_lossy()])?;
        let u = self.spec.underlay_ns();
        sh("ip", &["netns", "add", &u])?;
        ns_exec(&u, "ip", &["link", "set", "lo", "up"])?;
        // A fixed address: a bridge without one takes its lowest port's MAC,
        // which changes as nodes are added, and a node that resolved the old
        // one loses the API server until its neighbour entry expires.
        ns_exec(
            &u,
            "ip",
            &[
                "link",
                "add",
                "br0",
                "address",
                "02:00:c0:a8:4d:01",
                "type",
                "bridge",
            ],
        )?;
        ns_exec(
            &u,
            "ip",
            &["addr", "add", &format!("{API_ADDR}/24"), "dev", "br0"],
        )?;
        ns_exec(&u, "ip", &["link", "set", "br0", "up"])?;
        if self.spec.in_process_api {
            let api = in_netns(&u, || {
                ApiServer::start(SocketAddr::from((API_ADDR, API_PORT)))
            })??;
            for i in 1..=self.spec.nodes {
                api.create_node(node(
                    &self.spec.node_name(i),
                    Some(&format!("10.244.{i}.0/24")),
                ))?;
            }
            api.write_kubeconfig(&self.spec.kubeconfig())?;
            self.api = Some(api);
        } else {
            self.spawn_api()?;
        }
        let s = &self.spec;
        for i in 1..=s.nodes {
            self.add_node(i)?;
        }
        for i in 1..=s.nodes {
            let conflist = s.node_dir(i).join("net.d/00-mycni.conflist");
            wait_for(
                &format!("{} to write its conflist", s.node_name(i)),
                Duration::from_secs(30),
                || conflist.exists(),
            )?;
        }
        // Up means converged: every node routes to every other node's pods
        // before any pod exists, so the first packet of a test never races
        // an agent that has not seen a late peer yet.
        for i in 1..=s.nodes {
            let ns = s.node_name(i);
            wait_for(
                &format!("{ns} to program its {} peers", s.nodes - 1),
                Duration::from_secs(30),
                || {
                    sh("ip", &["-n", &ns, "route", "show", "proto", "110"])
                        .map(|r| r.lines().count() == s.nodes - 1)
                        .unwrap_or(false)
                },
            )?;
        }
        let mut pods = Vec::new();
        for i in 1..=s.nodes {
            for j in 1..=s.pods {
                pods.push(self.add_pod(i, j)?);
            }
        }
        // With the fast path on, up also means every pod's veth is attached
        // (the agent picks new pods up on its next full pass).
        for i in 1..=s.nodes {
            let want = format!("mycni_datapath_entries{{map=\"local\"}} {}", s.pods);
            wait_for(
                &format!("{} to attach its pods", s.node_name(i)),
                Duration::from_secs(30),
                || {
                    self.metrics(i)
                        .map(|m| {
                            m.lines().any(|l| l == "mycni_datapath_ebpf 0")
                                || m.lines().any(|l| l == want)
                        })
                        .unwrap_or(false)
                },
            )?;
        }
        let listing: Vec<Value> = pods
            .iter()
            .map(|p| json!({"node": p.node, "index": p.index, "ns": p.ns, "ip": p.ip.to_string()}))
            .collect();
        std::fs::write(s.pods_file(), serde_json::to_vec_pretty(&listing)?)?;
        Ok(())
    }

    fn spawn_api(&self) -> Result<()> {
        let s = &self.spec;
        let u = s.underlay_ns();
        let mut api_args = vec![
            "--listen".to_string(),
            format!("{API_ADDR}:{API_PORT}"),
            "--kubeconfig".to_string(),
            s.kubeconfig().to_string_lossy().into_owned(),
        ];
        for i in 1..=s.nodes {
            api_args.push("--node".into());
            api_args.push(format!("{}=10.244.{i}.0/24", s.node_name(i)));
        }
        spawn_daemon(
            &u,
            &s.bins.apiserver,
            &api_args,
            &s.root.join("apiserver.log"),
            &s.root.join("apiserver.pid"),
        )?;
        wait_for(
            "the API fixture's kubeconfig",
            Duration::from_secs(10),
            || s.kubeconfig().exists(),
        )
    }

    /// Fault injection on the in-process fixture; the listener is reopened
    /// inside the underlay namespace, where the agents can reach it.
    pub fn set_api_reachable(&self, up: bool) -> Result<()> {
        let api = self
            .api
            .as_ref()
            .context("the lab's API fixture is not in-process")?;
        in_netns(&self.spec.underlay_ns(), || api.set_reachable(up))
    }

    /// Reads a node's Prometheus metrics (from the underlay, where its
    /// metrics address is reachable).
    pub fn metrics(&self, i: usize) -> Result<String> {
        let addr = format!("{}:{METRICS_PORT}", node_ip(i));
        in_netns(&self.spec.underlay_ns(), || http_get(&addr, "/metrics"))?
    }

    /// A node's fast-path counters (packets per path name, e.g.
    /// `fast_remote`), read from its metrics endpoint.
    pub fn counters(&self, i: usize) -> Result<std::collections::BTreeMap<String, u64>> {
        let m = self.metrics(i)?;
        let mut out = std::collections::BTreeMap::new();
        for line in m.lines() {
            let Some(rest) = line.strip_prefix("mycni_datapath_packets_total{path=\"") else {
                continue;
            };
            let name = rest.split('"').next().unwrap_or_default().to_string();
            let n = rest
                .rsplit(' ')
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            out.insert(name, n);
        }
        Ok(out)
    }

    /// Restarts every agent with `--datapath mode` (`ebpf` or `kernel`) and
    /// waits until each is ready again and reports that datapath.
    pub fn set_datapath(&mut self, mode: &str) -> Result<()> {
        let args = &mut self.spec.agent_args;
        if let Some(k) = args.iter().position(|a| a == "--datapath") {
            args.drain(k..(k + 2).min(args.len()));
        }
        args.extend(["--datapath".to_string(), mode.to_string()]);
        for i in 1..=self.spec.nodes {
            self.restart_agent(i)?;
        }
        for i in 1..=self.spec.nodes {
            wait_for(
                &format!("node {i} to run the {mode} datapath"),
                Duration::from_secs(30),
                || {
                    self.metrics(i)
                        .map(|m| {
                            m.lines().any(|l| {
                                l == format!("mycni_datapath_ebpf {}", u8::from(mode == "ebpf"))
                            })
                        })
                        .unwrap_or(false)
                },
            )?;
        }
        Ok(())
    }

    fn add_node(&self, i: usize) -> Result<()> {
        let s = &self.spec;
        let ns = s.node_name(i);
        let dir = s.node_dir(i);
        for sub in ["net.d", "run", "data", "ipam"] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        sh("ip", &["netns", "add", &ns])?;
        let port = format!("n{i}");
        ns_exec(&ns, "ip", &["link", "set", "lo", "up"])?;
        sh(
            "ip",
            &[
                "-n",
                &ns,
                "link",
                "add",
                "eth0",
                "type",
                "veth",
                "peer",
                "name",
                &port,
                "netns",
                &s.underlay_ns(),
            ],
        )?;
        ns_exec(
            &s.underlay_ns(),
            "ip",
            &["link", "set", &port, "master", "br0", "up"],
        )?;
        ns_exec(
            &ns,
            "ip",
            &["addr", "add", &format!("{}/24", node_ip(i)), "dev", "eth0"],
        )?;
        ns_exec(&ns, "ip", &["link", "set", "eth0", "up"])?;
        ns_exec(
            &ns,
            "ip",
            &["route", "add", "default", "via", &API_ADDR.to_string()],
        )?;
        self.start_agent(i)
    }

    pub fn start_agent(&self, i: usize) -> Result<()> {
        let s = &self.spec;
        let dir = s.node_dir(i);
        let p = |sub: &str| dir.join(sub).to_string_lossy().into_owned();
        let mut args: Vec<String> = vec![
            "run".into(),
            "--node-name".into(),
            s.node_name(i),
            "--kubeconfig".into(),
            s.kubeconfig().to_string_lossy().into_owned(),
            "--cni-conf-dir".into(),
            p("net.d"),
            "--state-dir".into(),
            p("run"),
            "--data-dir".into(),
            p("data"),
            "--ipam-data-dir".into(),
            p("ipam"),
            "--plugin-log-file".into(),
            p("plugin.log"),
            "--proc-sys".into(),
            "/proc/sys".into(),
            "--metrics-addr".into(),
            format!("{}:{METRICS_PORT}", node_ip(i)),
            "--bpffs".into(),
            s.bpffs()
                .join(format!("node{i}"))
                .to_string_lossy()
                .into_owned(),
        ];
        args.extend(s.agent_args.iter().cloned());
        spawn_daemon(
            &s.node_name(i),
            &s.bins.agent,
            &args,
            &dir.join("agent.log"),
            &dir.join("agent.pid"),
        )?;
        Ok(())
    }

    /// SIGTERM, wait, SIGKILL: the agent's datapath must stay in place.
    pub fn stop_agent(&self, i: usize) {
        stop_pidfile(&self.spec.node_dir(i).join("agent.pid"));
    }

    /// SIGKILL, no warning: what an OOM kill or a node hiccup does.
    pub fn kill_agent(&self, i: usize) {
        let pidfile = self.spec.node_dir(i).join("agent.pid");
        let Some(pid) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        else {
            return;
        };
        // SAFETY: kill(2) and waitpid(2) on a pid this lab started; waitpid
        // reaps it when it is our child (ECHILD otherwise, harmless).
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        let _ = std::fs::remove_file(pidfile);
    }

    pub fn restart_agent(&self, i: usize) -> Result<()> {
        self.stop_agent(i);
        self.start_agent(i)?;
        let ready = self.spec.node_dir(i).join("run/ready");
        wait_for(
            "the restarted agent to be ready",
            Duration::from_secs(30),
            || ready.exists(),
        )
        .map_err(|e| e.context(self.agent_log_tails()))
    }

    /// The runtime's part: plugin ADD with the network from the agent's conflist.
    fn add_pod(&self, i: usize, j: usize) -> Result<Pod> {
        let s = &self.spec;
        let ns = s.pod_ns(i, j);
        sh("ip", &["netns", "add", &ns])?;
        ns_exec(&ns, "ip", &["link", "set", "lo", "up"])?;
        let result = self.cni(
            i,
            "ADD",
            &format!("lab-{i}-{j}"),
            &format!("/run/netns/{ns}"),
            &format!("pod{j}"),
        )?;
        let ip: Ipv4Addr = result["ips"][0]["address"]
            .as_str()
            .and_then(|a| a.split('/').next())
            .and_then(|a| a.parse().ok())
            .with_context(|| format!("no IP in ADD result {result}"))?;
        let pod_dir = s.node_dir(i).join(format!("pod{j}"));
        std::fs::create_dir_all(&pod_dir)?;
        spawn_daemon(
            &ns,
            &s.bins.lab,
            &["echo-server".into(), ECHO_PORT.to_string()],
            &pod_dir.join("echo.log"),
            &pod_dir.join("echo.pid"),
        )?;
        Ok(Pod {
            node: i,
            index: j,
            ns,
            ip,
        })
    }

    /// The config the runtime passes the plugin on node `i`: the conflist's
    /// single plugin config, with the list's `cniVersion` and `name`.
    pub fn plugin_conf(&self, i: usize) -> Result<Value> {
        let conflist: Value = serde_json::from_slice(&std::fs::read(
            self.spec.node_dir(i).join("net.d/00-mycni.conflist"),
        )?)?;
        let mut conf = conflist["plugins"][0].clone();
        conf["cniVersion"] = conflist["cniVersion"].clone();
        conf["name"] = conflist["name"].clone();
        Ok(conf)
    }

    /// The plugin on node `i` as the runtime starts it for pod `pod`
    /// (interface `eth0`), stdin, stdout and stderr piped: the caller
    /// writes the config to stdin, and may kill the child.
    pub fn cni_command(
        &self,
        i: usize,
        command: &str,
        cid: &str,
        netns: &str,
        pod: &str,
    ) -> Result<Command> {
        let s = &self.spec;
        let bin_dir = s.bins.plugin.parent().context("plugin path")?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &s.node_name(i)])
            .arg(&s.bins.plugin)
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", cid)
            .env("CNI_NETNS", netns)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", bin_dir)
            .env(
                "CNI_ARGS",
                format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=lab;K8S_POD_NAME={pod}"),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        Ok(cmd)
    }

    /// Runs the plugin on node `i` as the runtime would, with the conflist's
    /// single plugin config.
    pub fn cni(&self, i: usize, command: &str, cid: &str, netns: &str, pod: &str) -> Result<Value> {
        let conf = self.plugin_conf(i)?;
        let mut child = self.cni_command(i, command, cid, netns, pod)?.spawn()?;
        if let Some(mut w) = child.stdin.take() {
            w.write_all(conf.to_string().as_bytes())?;
        }
        let out = child.wait_with_output()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!("plugin {command} on node {i} failed: {stdout}");
        }
        Ok(if stdout.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&stdout)?
        })
    }

    pub fn pods(&self) -> Result<Vec<Pod>> {
        let v: Vec<Value> =
            serde_json::from_slice(&std::fs::read(self.spec.pods_file()).context("no lab is up")?)?;
        v.iter()
            .map(|p| {
                Ok(Pod {
                    node: p["node"].as_u64().context("node")? as usize,
                    index: p["index"].as_u64().context("index")? as usize,
                    ns: p["ns"].as_str().context("ns")?.to_string(),
                    ip: p["ip"].as_str().context("ip")?.parse()?,
                })
            })
            .collect()
    }

    /// Connectivity matrix: every pod and node to every pod, by ping and TCP.
    /// Returns the printable table and the number of failed cells.
    pub fn matrix(&self) -> Result<(String, usize)> {
        let pods = self.pods()?;
        let mut sources: Vec<(String, String)> = pods
            .iter()
            .map(|p| (format!("n{}p{}", p.node, p.index), p.ns.clone()))
            .collect();
        for i in 1..=self.spec.nodes {
            sources.push((format!("node{i}"), self.spec.node_name(i)));
        }
        let mut out = String::new();
        out.push_str(&format!("{:<8}", "from\\to"));
        for p in &pods {
            out.push_str(&format!(
                "{:>14}",
                format!("n{}p{} {}", p.node, p.index, p.ip.octets()[3])
            ));
        }
        out.push('\n');
        let mut failed = 0;
        for (label, ns) in &sources {
            out.push_str(&format!("{label:<8}"));
            for p in &pods {
                if *ns == p.ns {
                    out.push_str(&format!("{:>14}", "-"));
                    continue;
                }
                let ping = ns_exec(ns, "ping", &["-c", "1", "-W", "1", &p.ip.to_string()]).is_ok();
                let tcp = ns_exec(
                    ns,
                    &self.spec.bins.lab.to_string_lossy(),
                    &["tcp-probe", &format!("{}:{ECHO_PORT}", p.ip)],
                )
                .is_ok();
                if !(ping && tcp) {
                    failed += 1;
                }
                let cell = format!(
                    "{}/{}",
                    if ping { "ping" } else { "PING!" },
                    if tcp { "tcp" } else { "TCP!" }
                );
                out.push_str(&format!("{cell:>14}"));
            }
            out.push('\n');
        }
        Ok((out, failed))
    }

    /// Agent readiness and metrics address per node.
    pub fn status(&self) -> Result<String> {
        let s = &self.spec;
        let mut out = format!(
            "API fixture: http://{API_ADDR}:{API_PORT} (kubeconfig {})\n",
            s.kubeconfig().display()
        );
        for i in 1..=s.nodes {
            let url = format!("{}:{METRICS_PORT}", node_ip(i));
            let ready = ns_exec(
                &s.underlay_ns(),
                &s.bins.lab.to_string_lossy(),
                &["http-get", &url, "/readyz"],
            )
            .unwrap_or_else(|e| format!("unreachable: {e}"));
            out.push_str(&format!(
                "{}  underlay {}  metrics http://{url}/metrics  {}\n",
                s.node_name(i),
                node_ip(i),
                ready.trim()
            ));
        }
        for p in self.pods().unwrap_or_default() {
            out.push_str(&format!(
                "  pod {} on {}: {}\n",
                p.ns,
                s.node_name(p.node),
                p.ip
            ));
        }
        Ok(out)
    }

    fn agent_log_tails(&self) -> String {
        let mut out = String::from("agent logs:\n");
        for i in 1..=self.spec.nodes {
            if let Ok(log) = std::fs::read_to_string(self.spec.node_dir(i).join("agent.log")) {
                let tail: Vec<&str> = log.lines().rev().take(8).collect();
                out.push_str(&format!(
                    "--- node{i}\n{}\n",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                ));
            }
        }
        out
    }

    /// Removes every namespace, process and file of the lab; never fails.
    pub fn down(&mut self) {
        let s = &self.spec;
        for i in 1..=s.nodes {
            for j in 1..=s.pods {
                stop_pidfile(&s.node_dir(i).join(format!("pod{j}/echo.pid")));
                let _ = sh("ip", &["netns", "del", &s.pod_ns(i, j)]);
            }
            stop_pidfile(&s.node_dir(i).join("agent.pid"));
            let _ = sh("ip", &["netns", "del", &s.node_name(i)]);
        }
        // Dropping the in-process fixture stops it before its netns goes.
        self.api = None;
        stop_pidfile(&s.root.join("apiserver.pid"));
        let _ = sh("ip", &["netns", "del", &s.underlay_ns()]);
        // Pins go with the mount; programs and maps with their last user.
        let _ = Command::new("umount").arg(s.bpffs()).output();
        let _ = std::fs::remove_dir_all(&s.root);
    }
}

/// `mycni-lab echo-server PORT`: echoes every connection, forever.
pub fn echo_server(port: u16) -> Result<()> {
    let l = std::net::TcpListener::bind(("0.0.0.0", port))?;
    for conn in l.incoming() {
        let Ok(mut c) = conn else { continue };
        std::thread::spawn(move || {
            let mut buf = [0u8; 65536];
            while let Ok(n) = c.read(&mut buf) {
                if n == 0 || c.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        });
    }
    Ok(())
}

/// `mycni-lab tcp-probe IP:PORT`: one round trip through the echo server.
pub fn tcp_probe(addr: &str) -> Result<()> {
    let addr: SocketAddr = addr.parse()?;
    let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    c.set_read_timeout(Some(Duration::from_secs(2)))?;
    c.write_all(b"mycni\n")?;
    let mut buf = [0u8; 6];
    c.read_exact(&mut buf)?;
    if &buf != b"mycni\n" {
        bail!("echo mismatch");
    }
    Ok(())
}

/// `mycni-lab http-get HOST:PORT PATH`: prints status line and body.
pub fn http_get(addr: &str, path: &str) -> Result<String> {
    let addr: SocketAddr = addr.parse()?;
    let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    c.set_read_timeout(Some(Duration::from_secs(2)))?;
    c.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )?;
    let mut s = String::new();
    c.read_to_string(&mut s)?;
    let status = s.lines().next().unwrap_or_default().to_string();
    let body = s.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
    Ok(format!("{status} {body}"))
}
