//! What the bench reads of the running agent: its CPU and memory from
//! `/proc`, its log lines with their timestamps, its metrics.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use mycni_lab::Lab;

pub(super) fn proc_status(pid: u32, key: &str) -> Result<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = s
        .lines()
        .find(|l| l.starts_with(key))
        .with_context(|| format!("no {key} in /proc/{pid}/status"))?;
    let kb: f64 = line
        .split_whitespace()
        .nth(1)
        .context("status value")?
        .parse()?;
    Ok(kb / 1024.0)
}

/// User and system CPU seconds of `pid` so far.
pub(super) fn cpu(pid: u32) -> Result<(f64, f64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = s.rsplit_once(')').context("stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    // After ")": state is field 3, utime 14 and stime 15 (1-based).
    let ut: f64 = f.get(11).context("utime")?.parse()?;
    let st: f64 = f.get(12).context("stime")?.parse()?;
    Ok((ut / hz, st / hz))
}

pub(super) use mycni_lab::strip_ansi;

/// One line of the agent's log: its timestamp and text.
pub(super) struct LogLine {
    pub(super) at: SystemTime,
    pub(super) text: String,
}

pub(super) fn agent_log(path: &Path) -> Result<Vec<LogLine>> {
    let raw = std::fs::read_to_string(path)?;
    let mut out = Vec::new();
    for l in raw.lines() {
        let l = strip_ansi(l);
        let Some((ts, _)) = l.split_once(' ') else {
            continue;
        };
        let Ok(t) = ts.parse::<k8s_openapi::jiff::Timestamp>() else {
            continue;
        };
        let at = UNIX_EPOCH + Duration::from_nanos(t.as_nanosecond() as u64);
        out.push(LogLine {
            at,
            text: l.to_string(),
        });
    }
    Ok(out)
}

pub(super) fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let pat = format!("{name}=");
    let start = line.find(&pat)? + pat.len();
    line[start..].split_whitespace().next()
}

pub(super) fn secs_between(a: SystemTime, b: SystemTime) -> f64 {
    match b.duration_since(a) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

pub(super) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The agent's metrics as name -> value (unlabelled series only).
pub(super) fn metrics(lab: &Lab) -> Result<BTreeMap<String, f64>> {
    let text = lab.metrics(1)?;
    Ok(text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.contains('{'))
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect())
}
