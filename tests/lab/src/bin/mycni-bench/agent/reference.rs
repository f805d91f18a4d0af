//! The reference the agent is measured against: `ip -batch` programming
//! the same entries, three runs each way, and the median run.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use mycni_lab::stats::median_by;
use mycni_testkit::sh;

use super::peers::peer;
use super::{NHID_BASE, PROTO, VXLAN, counts};
use crate::overlay::Overlay;

/// One `ip -batch` reference run: the whole, and each batch file's share.
pub(super) struct Reference {
    pub(super) took: Duration,
    pub(super) phases: Vec<(&'static str, Duration)>,
}

/// `ip -batch` / `bridge -batch` programming the same entries into a fresh
/// namespace with a VXLAN device like the agent's: FDB entries, neighbours
/// and routes `via … onlink`, or, with `nexthops`, a nexthop per peer and
/// routes through them (as the agent makes them where the kernel has
/// nexthop objects).
pub(super) fn ip_batch_reference(n: usize, nexthops: bool) -> Result<Reference> {
    let ns = mycni_testkit::NetNs::new("ref")?;
    let dir = tempfile::Builder::new()
        .prefix("mycni-bench-ref-")
        .tempdir()?;
    // No dummy module here: a veth pair stands in for the underlay.
    ns.exec(
        "ip",
        &[
            "link", "add", "eth0", "type", "veth", "peer", "name", "eth1",
        ],
    )?;
    ns.exec("ip", &["link", "set", "eth1", "up"])?;
    ns.exec("ip", &["addr", "add", "192.168.77.11/24", "dev", "eth0"])?;
    ns.exec("ip", &["link", "set", "eth0", "up"])?;
    ns.exec(
        "ip",
        &[
            "link",
            "add",
            VXLAN,
            "type",
            "vxlan",
            "id",
            "1",
            "dstport",
            "8472",
            "local",
            "192.168.77.11",
            "dev",
            "eth0",
            "nolearning",
        ],
    )?;
    ns.exec("ip", &["addr", "add", "10.244.1.0/32", "dev", VXLAN])?;
    ns.exec("ip", &["link", "set", VXLAN, "up"])?;
    let (mut fdb, mut neigh, mut nh, mut route) =
        (String::new(), String::new(), String::new(), String::new());
    for i in 0..n {
        let p = peer(i);
        let mac = p.mac.to_string();
        fdb.push_str(&format!(
            "fdb add {mac} dev {VXLAN} dst {} self permanent\n",
            p.host_ip
        ));
        neigh.push_str(&format!(
            "neigh add {} lladdr {mac} dev {VXLAN} nud permanent\n",
            p.gw
        ));
        if nexthops {
            let id = NHID_BASE + i as u32;
            nh.push_str(&format!(
                "nexthop add id {id} via {} dev {VXLAN} onlink protocol {PROTO}\n",
                p.gw
            ));
            route.push_str(&format!("route add {} nhid {id} proto {PROTO}\n", p.cidr));
        } else {
            route.push_str(&format!(
                "route add {} via {} dev {VXLAN} onlink proto {PROTO}\n",
                p.cidr, p.gw
            ));
        }
    }
    let mut batches: Vec<(&'static str, &'static str, String)> =
        vec![("fdb", "bridge", fdb), ("neigh", "ip", neigh)];
    if nexthops {
        batches.push(("nexthop", "ip", nh));
    }
    batches.push(("route", "ip", route));
    let mut files = Vec::new();
    for (name, tool, text) in batches {
        let f: PathBuf = dir.path().join(name);
        std::fs::write(&f, text)?;
        files.push((name, tool, f.to_string_lossy().into_owned()));
    }
    let mut phases = Vec::new();
    let start = Instant::now();
    for (name, tool, f) in &files {
        let t = Instant::now();
        sh(tool, &["-n", ns.name(), "-batch", f])?;
        phases.push((*name, t.elapsed()));
    }
    let took = start.elapsed();
    let overlay = Overlay::open(ns.name())?;
    let vx = overlay.ifindex(VXLAN)?;
    let c = counts(&overlay, vx)?;
    ensure!(
        c == Some((n, n, n)),
        "ip -batch reference programmed {c:?} entries, not {n} each"
    );
    let nhs = overlay.count_nexthops(PROTO)?;
    ensure!(
        nhs == Some(if nexthops { n } else { 0 }),
        "ip -batch reference programmed {nhs:?} nexthops"
    );
    Ok(Reference { took, phases })
}

/// The reference runs, by how routes hold their gateway.
#[derive(Default)]
pub(super) struct References {
    pub(super) onlink: Vec<Reference>,
    pub(super) nexthop: Vec<Reference>,
}

/// The median run by total time.
pub(super) fn median(v: &[Reference]) -> Result<&Reference> {
    median_by(v, |r| r.took).context("no reference runs")
}

pub(super) fn refs_fmt(v: &[Reference]) -> String {
    v.iter()
        .map(|r| format!("{:.3}", r.took.as_secs_f64()))
        .collect::<Vec<_>>()
        .join(" ")
}
