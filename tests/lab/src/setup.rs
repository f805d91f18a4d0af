//! Bringing a lab up and down: the underlay, the API fixture, the nodes and
//! their agents.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use mycni_apiserver::{ApiServer, node_with_cidrs};
use mycni_testkit::{in_netns, sh};

use crate::daemon::AGENT_CAPS_ENV;
use crate::daemon::{ns_exec, spawn_daemon, stop_pidfile};
use crate::{IpFamily, Lab, Spec, Stack, check_interrupted, wait_for};

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
        std::fs::write(spec.stack_file(), format!("{}\n", spec.stack.name()))?;
        let mut lab = Lab { spec, api: None };
        if let Err(e) = lab.build() {
            let logs = lab.agent_log_tails();
            lab.down();
            return Err(e.context(logs));
        }
        Ok(lab)
    }

    /// Attaches to a lab already up (for `lab test/status/down`), with the
    /// stack it was brought up with (its addresses depend on it), whatever
    /// `spec` says.
    pub fn attach(mut spec: Spec) -> Lab {
        if let Some(stack) = std::fs::read_to_string(spec.stack_file())
            .ok()
            .and_then(|s| Stack::from_name(&s))
        {
            spec.stack = stack;
        }
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
        ns_exec(&u, "ip", &str_args(&self.spec.bridge_addr_args()))?;
        ns_exec(&u, "ip", &["link", "set", "br0", "up"])?;
        if self.spec.in_process_api {
            let api = in_netns(&u, || ApiServer::start(self.spec.api_socket()))??;
            for i in 1..=self.spec.nodes {
                let cidrs = self.spec.stack.pod_cidrs(i);
                let cidrs: Vec<&str> = cidrs.iter().map(String::as_str).collect();
                api.create_node(node_with_cidrs(&self.spec.node_name(i), &cidrs))?;
            }
            api.write_kubeconfig(&self.spec.kubeconfig())?;
            self.api = Some(api);
        } else {
            self.spawn_api()?;
        }
        self.start_host_api()?;
        let s = &self.spec;
        if s.model {
            if (s.nodes, s.pods) != (3, 3) {
                bail!(
                    "the NetworkPolicy model is 3 nodes x 3 pods, not {} x {}",
                    s.nodes,
                    s.pods
                );
            }
            self.create_model_namespaces()?;
        }
        for i in 1..=s.nodes {
            check_interrupted()?;
            self.add_node(i)?;
        }
        for i in 1..=s.nodes {
            let conflist = s.node_dir(i).join("net.d/00-mycni.conflist");
            // An agent that refuses its flags or its Node exits at once:
            // its error (in the logs `up` fails with) need not wait 30 s.
            let mut exited = false;
            wait_for(
                &format!("{} to write its conflist", s.node_name(i)),
                Duration::from_secs(30),
                || {
                    exited = !self.agent_running(i);
                    exited || conflist.exists()
                },
            )?;
            if exited && !conflist.exists() {
                bail!(
                    "{}'s agent exited before writing its conflist",
                    s.node_name(i)
                );
            }
        }
        // Up means converged: every node routes to every other node's pods
        // before any pod exists, so the first packet of a test never races
        // an agent that has not seen a late peer yet.
        for i in 1..=s.nodes {
            let ns = s.node_name(i);
            wait_for(
                &format!(
                    "{ns} to program its {} peers ({})",
                    s.nodes - 1,
                    s.stack
                        .families()
                        .iter()
                        .map(|f| f.label())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                Duration::from_secs(30),
                || {
                    s.stack.families().iter().all(|f| {
                        let family = if *f == IpFamily::V6 { "-6" } else { "-4" };
                        sh("ip", &[family, "-n", &ns, "route", "show", "proto", "110"])
                            .map(|r| r.lines().count() == s.nodes - 1)
                            .unwrap_or(false)
                    })
                },
            )?;
        }
        if s.stack == Stack::Ipv6Only {
            self.check_ipv6_only_underlay()?;
        }
        let mut pods = Vec::new();
        for i in 1..=s.nodes {
            for j in 1..=s.pods {
                check_interrupted()?;
                pods.push(if s.model {
                    self.add_kube_pod_at(i, j, crate::model::model_pod(i, j))?
                } else {
                    self.add_pod(i, j, None)?
                });
            }
        }
        // Recorded now: `down` stops what was started even if a wait
        // below fails.
        self.save_pods(&pods)?;
        if s.model {
            self.sync_services()?;
        }
        // With the fast path on, up also means every pod's veth is attached
        // (the agent picks new pods up on its next full pass). The gauge
        // counts mycni_local and mycni_local6: one entry per pod and family;
        // a legacy tc attach waits for the CNI chain a moment longer.
        let entries = s.pods * s.stack.families().len();
        for i in 1..=s.nodes {
            let want = format!("mycni_datapath_entries{{map=\"local\"}} {entries}");
            wait_for(
                &format!("{} to attach its pods", s.node_name(i)),
                Duration::from_secs(30),
                || {
                    self.metrics(i)
                        .map(|m| {
                            m.lines().any(|l| l == "mycni_datapath_ebpf 0")
                                || (m.lines().any(|l| l == want)
                                    && m.lines().any(|l| l == "mycni_datapath_attach_waiting 0"))
                        })
                        .unwrap_or(false)
                },
            )?;
        }
        self.check_ready()
    }

    /// Fails unless every agent answers `/readyz` with 200 within a few
    /// seconds, naming each node that does not and what it answered.
    pub fn check_ready(&self) -> Result<()> {
        let s = &self.spec;
        let not_ready = || -> Vec<String> {
            (1..=s.nodes)
                .filter_map(|i| match self.readyz(i) {
                    Ok(r) if r.starts_with("HTTP/1.1 200 ") => None,
                    Ok(r) => Some(format!("{}: {}", s.node_name(i), r.trim())),
                    Err(e) => Some(format!("{}: /readyz unreachable: {e:#}", s.node_name(i))),
                })
                .collect()
        };
        let waited = wait_for("every agent to be ready", Duration::from_secs(10), || {
            not_ready().is_empty()
        });
        if let Err(e) = waited {
            bail!("{e:#}: {}", not_ready().join("; "));
        }
        Ok(())
    }

    fn spawn_api(&self) -> Result<()> {
        let s = &self.spec;
        let u = s.underlay_ns();
        let mut api_args = vec![
            "--listen".to_string(),
            s.api_socket().to_string(),
            "--kubeconfig".to_string(),
            s.kubeconfig().to_string_lossy().into_owned(),
        ];
        for i in 1..=s.nodes {
            api_args.push("--node".into());
            api_args.push(format!(
                "{}={}",
                s.node_name(i),
                s.stack.pod_cidrs(i).join(",")
            ));
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
        let [addr, route] = s.node_underlay_cmds(i);
        ns_exec(&ns, "ip", &str_args(&addr))?;
        ns_exec(&ns, "ip", &["link", "set", "eth0", "up"])?;
        ns_exec(&ns, "ip", &str_args(&route))?;
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
            s.metrics_socket(i).to_string(),
            "--bpffs".into(),
            s.bpffs()
                .join(format!("node{i}"))
                .to_string_lossy()
                .into_owned(),
        ];
        // The agent refuses a flag given twice: a test's own range wins.
        if !s.agent_args.iter().any(|a| a.starts_with("--cluster-cidr")) {
            args.extend(["--cluster-cidr".into(), s.stack.cluster_cidr()]);
        }
        args.extend(s.agent_args.iter().cloned());
        let (program, args) = match std::env::var(AGENT_CAPS_ENV) {
            Ok(keep) => crate::daemon::with_only_caps(&keep, &s.bins.agent, args)?,
            Err(_) => (s.bins.agent.clone(), args),
        };
        spawn_daemon(
            &s.node_name(i),
            &program,
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

    /// Whether node `i`'s agent process is still running (a child of this
    /// process that exited is reaped here).
    fn agent_running(&self, i: usize) -> bool {
        let Some(pid) = std::fs::read_to_string(self.spec.node_dir(i).join("agent.pid"))
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        else {
            return false;
        };
        // SAFETY: WNOHANG waitpid and signal 0 on a pid this lab started;
        // waitpid is ECHILD when it is not our child.
        unsafe {
            libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) != pid
                && libc::kill(pid, 0) == 0
        }
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
        // Not our child (ECHILD): the kill is delivered, the exit may
        // still be under way; its successor must not meet it.
        let t0 = std::time::Instant::now();
        // SAFETY: signal 0 only asks whether the pid exists.
        while unsafe { libc::kill(pid, 0) } == 0 && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
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

    /// Agent readiness and metrics address per node.
    pub fn status(&self) -> Result<String> {
        let s = &self.spec;
        let mut out = format!(
            "API fixture: http://{} (the agents' kubeconfig {}; from the host: KUBECONFIG={} {})\n",
            s.api_socket(),
            s.kubeconfig().display(),
            s.host_kubeconfig().display(),
            crate::HOST_KUBECONFIG_HINT,
        );
        for i in 1..=s.nodes {
            let url = s.metrics_socket(i).to_string();
            let ready = ns_exec(
                &s.underlay_ns(),
                &s.bins.lab.to_string_lossy(),
                &["http-get", &url, "/readyz"],
            )
            .unwrap_or_else(|e| format!("unreachable: {e}"));
            // The agent's own detail names its encapsulation mode even when
            // direct routing leaves nothing to encapsulate: the lab's
            // summary, from the routes, says what its traffic takes.
            let datapath = self
                .describe_datapath(i)
                .unwrap_or_else(|e| format!("unknown ({e:#})"));
            out.push_str(&format!(
                "{}  underlay {}  metrics http://{url}/metrics  {}\n    datapath: {datapath}\n",
                s.node_name(i),
                s.node_addr(i),
                ready.trim()
            ));
        }
        for p in self.pods().unwrap_or_default() {
            let service = p
                .kube
                .as_ref()
                .map(|k| {
                    let ips: Vec<String> = k
                        .cluster_ip
                        .map(|a| a.to_string())
                        .into_iter()
                        .chain(k.cluster_ip6.map(|a| a.to_string()))
                        .collect();
                    format!(", Service {}", ips.join(" "))
                })
                .unwrap_or_default();
            out.push_str(&format!(
                "  pod {} ({}) on {}: {}{service}\n",
                p.ns,
                crate::pod_label(&p),
                s.node_name(p.node),
                p.addresses()
            ));
        }
        Ok(out)
    }

    fn agent_log_tails(&self) -> String {
        let mut out = String::from("agent logs:\n");
        for i in 1..=self.spec.nodes {
            if let Ok(log) = std::fs::read_to_string(self.spec.node_dir(i).join("agent.log")) {
                // An agent that exits prints its error first and a
                // backtrace after it, which would fill the tail.
                let error = log.lines().find(|l| l.starts_with("Error: "));
                let tail: Vec<&str> = log
                    .lines()
                    .take_while(|l| Some(*l) != error && *l != "Stack backtrace:")
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .take(8)
                    .collect();
                out.push_str(&format!(
                    "--- node{i}\n{}\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
                    error.map(|e| format!("{e}\n")).unwrap_or_default()
                ));
            }
        }
        out
    }

    /// Removes every namespace, process and file of the lab; never fails.
    pub fn down(&mut self) {
        let s = &self.spec;
        // Pods added after `up` (`lab pod add`) are past `s.pods`.
        let added: Vec<(usize, usize)> = self
            .pods()
            .unwrap_or_default()
            .iter()
            .map(|p| (p.node, p.index))
            .collect();
        for i in 1..=s.nodes {
            let mut js: Vec<usize> = (1..=s.pods).collect();
            js.extend(added.iter().filter(|(n, _)| *n == i).map(|(_, j)| *j));
            js.sort_unstable();
            js.dedup();
            for j in js {
                for pid in ["echo.pid", "serve.pid"] {
                    stop_pidfile(&s.node_dir(i).join(format!("pod{j}/{pid}")));
                }
                let _ = sh("ip", &["netns", "del", &s.pod_ns(i, j)]);
            }
            stop_pidfile(&s.node_dir(i).join("agent.pid"));
            let _ = sh("ip", &["netns", "del", &s.node_name(i)]);
        }
        self.stop_prometheus();
        stop_pidfile(&s.root.join("forward.pid"));
        stop_pidfile(&s.root.join("flows-map.pid"));
        // Dropping the in-process fixture stops it before its netns goes.
        self.api = None;
        stop_pidfile(&s.root.join("apiserver.pid"));
        let _ = sh("ip", &["netns", "del", &s.underlay_ns()]);
        // Pins go with the mount; programs and maps with their last user.
        let _ = Command::new("umount").arg(s.bpffs()).output();
        let _ = std::fs::remove_dir_all(&s.root);
    }
}

/// `ip` arguments as `ns_exec` takes them.
fn str_args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}
