//! The probes deploy/base/daemonset.yaml points at, against the real agent
//! in a lab node: /healthz turns unhealthy when the reconcile loop stops
//! finishing passes (what the liveness probe restarts), healthy again when
//! it resumes, while /readyz keeps answering as before (the datapath is
//! still up: readiness is not liveness).
//!
//! The loop is frozen with the agent's test hook,
//! `MYCNI_TEST_FAULT=freeze-loop:<file>` (the loop waits before its next
//! pass while the file exists), set only on the agent this test starts.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use mycni_lab::{METRICS_PORT, http_get, node_ip};

use crate::common;
use common::lab;

/// The agent this test started; killed when the test ends, pass or fail.
struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn get(l: &mycni_lab::Lab, path: &str) -> Result<String> {
    let addr = format!("{}:{METRICS_PORT}", node_ip(1));
    mycni_testkit::in_netns(&l.spec.underlay_ns(), || http_get(&addr, path))?
}

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> Result<Duration> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if f() {
            return Ok(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("{what}: not within {timeout:?}")
}

#[test]
fn liveness_fails_while_the_loop_is_frozen_and_recovers() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let t = lab(1, 0)?;
    let l = &t.0;
    let dir = l.spec.node_dir(1);
    let cmdline = l.agent_cmdline(1).context("node 1's agent command line")?;
    let (bin, args) = cmdline.split_first().context("empty agent command line")?;
    ensure!(
        !args.iter().any(|a| a.starts_with("--liveness-stale-after")),
        "{args:?}"
    );
    // Our own agent in its place, with the hook armed.
    l.stop_agent(1);
    let freeze: PathBuf = dir.join("freeze-loop");
    let log = std::fs::File::create(dir.join("agent-probes.log"))?;
    let child = Command::new("ip")
        .args(["netns", "exec", &l.spec.node_name(1)])
        .arg(bin)
        .args(args)
        // 3 of the lab's 1 s resync periods: the least the agent accepts.
        .args(["--liveness-stale-after", "3s"])
        .env(
            "MYCNI_TEST_FAULT",
            format!("freeze-loop:{}", freeze.display()),
        )
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting the agent")?;
    let _agent = Agent(child);

    wait_for(
        "/healthz 200 after the first pass",
        Duration::from_secs(30),
        || get(l, "/healthz").is_ok_and(|r| r.starts_with("HTTP/1.1 200") && r.ends_with("ok\n")),
    )?;

    std::fs::write(&freeze, b"")?;
    let took = wait_for(
        "/healthz 503 with the loop frozen",
        Duration::from_secs(15),
        || get(l, "/healthz").is_ok_and(|r| r.starts_with("HTTP/1.1 503")),
    )?;
    let body = get(l, "/healthz")?;
    ensure!(body.contains("has not finished a pass"), "{body}");
    // Not before the staleness limit (less the pass that was running).
    ensure!(
        took >= Duration::from_secs(2),
        "unhealthy after only {took:?}"
    );
    // Readiness is as before: the datapath is up, the node keeps its pods.
    let ready = get(l, "/readyz")?;
    ensure!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    eprintln!(
        "/healthz failed {} ms after the loop froze",
        took.as_millis()
    );

    std::fs::remove_file(&freeze)?;
    wait_for(
        "/healthz 200 once the loop runs again",
        Duration::from_secs(10),
        || get(l, "/healthz").is_ok_and(|r| r.starts_with("HTTP/1.1 200")),
    )?;
    Ok(())
}
