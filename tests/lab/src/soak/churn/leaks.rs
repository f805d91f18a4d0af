//! What a churn run leaves on the node, read from the kernel, the lease
//! directory and the pinned maps and links, and the checks that every piece
//! of it belongs to a live pod.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::{Live, MAP_TIMEOUT};
use crate::Lab;
use mycni_testkit::sh;

/// What mycni holds on the node, as the checks see it. Also what the podman
/// test compares before and after a container (`mycni_lab::node_state`).
#[derive(Debug, Default, Clone)]
pub struct NodeState {
    /// IP -> "containerID/ifname".
    pub leases: BTreeMap<Ipv4Addr, String>,
    /// Files in the lease dir that are neither leases nor the store's own.
    pub stray_files: Vec<String>,
    /// Host veths named `mycni*`: name -> (ifindex, alias).
    pub veths: BTreeMap<String, (u32, Option<String>)>,
    /// `proto 109` routes: destination -> device.
    pub routes: BTreeMap<String, String>,
    /// "dst dev state" of neighbours on `mycni*` devices or to pod IPs.
    pub neighbours: Vec<(Ipv4Addr, String, String)>,
    /// `mycni_local` keys -> ifindex.
    pub map: BTreeMap<Ipv4Addr, u32>,
    /// ifindexes of pinned `mycni_from_pod` links.
    pub links: BTreeSet<u32>,
}

pub(super) fn ip_json(lab: &Lab, node: usize, args: &[&str]) -> Result<Vec<Value>> {
    let ns = lab.spec.node_name(node);
    let mut full = vec!["-n", ns.as_str(), "-j"];
    full.extend_from_slice(args);
    let out = sh("ip", &full)?;
    if out.trim().is_empty() {
        return Ok(vec![]);
    }
    serde_json::from_str(&out).with_context(|| format!("ip {args:?}: {out}"))
}

fn byte(v: &Value) -> Option<u8> {
    match v {
        Value::Number(n) => n.as_u64().and_then(|n| u8::try_from(n).ok()),
        Value::String(s) => u8::from_str_radix(s.trim_start_matches("0x"), 16).ok(),
        _ => None,
    }
}

fn u32_le(v: &Value) -> Option<u32> {
    if let Some(n) = v.as_u64() {
        return u32::try_from(n).ok();
    }
    let b: Vec<u8> = v.as_array()?.iter().map(byte).collect::<Option<_>>()?;
    Some(u32::from_le_bytes(b.get(..4)?.try_into().ok()?))
}

/// `mycni_local` as bpftool dumps it: key = IPv4 bytes, value.ifindex.
pub(super) fn local_map(lab: &Lab, node: usize) -> Result<BTreeMap<Ipv4Addr, u32>> {
    let pin = lab.spec.pin_dir(node).join("mycni_local");
    let out = sh(
        "bpftool",
        &["-j", "map", "dump", "pinned", &pin.to_string_lossy()],
    )?;
    let entries: Vec<Value> =
        serde_json::from_str(&out).with_context(|| format!("bpftool dump: {out}"))?;
    let mut map = BTreeMap::new();
    for e in entries {
        let e = e.get("formatted").unwrap_or(&e);
        let key: Vec<u8> = e["key"]
            .as_array()
            .and_then(|k| k.iter().map(byte).collect::<Option<_>>())
            .with_context(|| format!("mycni_local key {e}"))?;
        let [a, b, c, d] = key[..] else {
            bail!("mycni_local key {key:?} is not an IPv4 address");
        };
        let ifindex = e["value"]
            .get("ifindex")
            .and_then(u32_le)
            .or_else(|| u32_le(&e["value"]))
            .with_context(|| format!("mycni_local value {e}"))?;
        map.insert(Ipv4Addr::new(a, b, c, d), ifindex);
    }
    Ok(map)
}

pub(super) fn pinned_pod_links(lab: &Lab, node: usize) -> Result<BTreeSet<u32>> {
    let dir = lab.spec.pin_dir(node).join("links");
    let mut out = BTreeSet::new();
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(out);
    };
    for e in entries {
        let name = e?.file_name().to_string_lossy().into_owned();
        if let Some(i) = name
            .strip_prefix("mycni_from_pod_")
            .and_then(|i| i.parse().ok())
        {
            out.insert(i);
        }
    }
    Ok(out)
}

/// What mycni holds on lab node `node` for the CNI network `network`.
pub fn node_state(lab: &Lab, node: usize, network: &str) -> Result<NodeState> {
    let mut st = NodeState::default();
    let dir = lab.spec.node_dir(node).join("ipam").join(network);
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            if let Ok(ip) = name.parse::<Ipv4Addr>() {
                let owner = std::fs::read_to_string(e.path()).unwrap_or_default();
                st.leases.insert(ip, owner.replace("\r\n", "/"));
            } else if name != "lock" && name != "last_reserved_ip.0" {
                st.stray_files.push(name);
            }
        }
    }
    for l in ip_json(lab, node, &["link", "show"])? {
        let name = l["ifname"].as_str().unwrap_or_default();
        let alias = l["ifalias"].as_str().map(str::to_string);
        if name.starts_with("mycni") || alias.as_deref().is_some_and(|a| a.starts_with("mycni:")) {
            let index = l["ifindex"].as_u64().unwrap_or_default() as u32;
            st.veths.insert(name.to_string(), (index, alias));
        }
    }
    for r in ip_json(lab, node, &["route", "show", "proto", "109"])? {
        st.routes.insert(
            r["dst"].as_str().unwrap_or_default().to_string(),
            r["dev"].as_str().unwrap_or_default().to_string(),
        );
    }
    let pod_net = format!("10.244.{node}.");
    for n in ip_json(lab, node, &["neigh", "show"])? {
        let dev = n["dev"].as_str().unwrap_or_default().to_string();
        let dst = n["dst"].as_str().unwrap_or_default();
        let Ok(ip) = dst.parse::<Ipv4Addr>() else {
            continue;
        };
        if dev.starts_with("mycni") || dst.starts_with(&pod_net) {
            st.neighbours
                .push((ip, dev, n["state"].to_string().replace('"', "")));
        }
    }
    st.map = local_map(lab, node)?;
    st.links = pinned_pod_links(lab, node)?;
    Ok(st)
}

/// What should be there for `live` pods: (leases, veths, routes) problems,
/// each a leaked or missing item. The map and links are checked apart
/// (they follow the agent's pass).
pub(super) fn kernel_problems(st: &NodeState, live: &[&Live], network: &str) -> Vec<String> {
    let mut p = Vec::new();
    let want_ips: BTreeMap<Ipv4Addr, &Live> = live.iter().map(|l| (l.ip, *l)).collect();
    let want_veths: BTreeMap<&str, &Live> = live.iter().map(|l| (l.veth.as_str(), *l)).collect();
    for (ip, owner) in &st.leases {
        match want_ips.get(ip) {
            Some(l) if *owner == format!("{}/eth0", l.cid) => {}
            Some(l) => p.push(format!(
                "lease {ip} held by {owner:?}, the pod is {}",
                l.cid
            )),
            None => p.push(format!("leaked lease {ip} ({owner})")),
        }
    }
    for f in &st.stray_files {
        p.push(format!("stray file {f} in the lease dir"));
    }
    for (name, (_, alias)) in &st.veths {
        match want_veths.get(name.as_str()) {
            Some(l) if alias.as_deref() == Some(&format!("mycni:{network}:{}:eth0", l.cid)) => {}
            _ => p.push(format!("leaked host veth {name} (alias {alias:?})")),
        }
    }
    for (dst, dev) in &st.routes {
        let ok = dst
            .parse::<Ipv4Addr>()
            .ok()
            .and_then(|ip| want_ips.get(&ip))
            .is_some_and(|l| l.veth == *dev);
        if !ok {
            p.push(format!("leaked route {dst} dev {dev} proto 109"));
        }
    }
    for (ip, dev, state) in &st.neighbours {
        if !want_veths.contains_key(dev.as_str()) && !want_ips.contains_key(ip) {
            p.push(format!("leaked neighbour {ip} dev {dev} {state}"));
        }
    }
    for l in live {
        if !st.leases.contains_key(&l.ip) {
            p.push(format!("live pod {} lost its lease {}", l.cid, l.ip));
        }
        if !st.veths.contains_key(&l.veth) {
            p.push(format!("live pod {} lost its host veth {}", l.cid, l.veth));
        }
        if !st.routes.contains_key(&l.ip.to_string()) {
            p.push(format!("live pod {} lost its host route {}", l.cid, l.ip));
        }
    }
    p
}

/// Map entries and pinned links that differ from the live pods.
pub(super) fn datapath_problems(st: &NodeState, live: &[&Live]) -> Vec<String> {
    let mut p = Vec::new();
    let want: BTreeMap<Ipv4Addr, Option<u32>> = live
        .iter()
        .map(|l| (l.ip, st.veths.get(&l.veth).map(|v| v.0)))
        .collect();
    for (ip, ifindex) in &st.map {
        match want.get(ip) {
            Some(Some(i)) if i == ifindex => {}
            _ => p.push(format!(
                "leaked mycni_local entry {ip} -> ifindex {ifindex}"
            )),
        }
    }
    for (ip, i) in &want {
        if !st.map.contains_key(ip) {
            p.push(format!("live pod {ip} missing from mycni_local"));
        }
        if let Some(i) = i
            && !st.links.contains(i)
        {
            p.push(format!("live pod {ip}: no program attached to ifindex {i}"));
        }
    }
    let want_links: BTreeSet<u32> = want.values().flatten().copied().collect();
    for i in st.links.difference(&want_links) {
        p.push(format!("leaked pinned link mycni_from_pod_{i}"));
    }
    p
}

/// Waits for the agent's full pass to make the map and links mirror `live`.
/// Returns the time it took and what still differs at the deadline.
pub(super) fn await_datapath(
    lab: &Lab,
    node: usize,
    network: &str,
    live: &[&Live],
) -> Result<(Duration, Vec<String>)> {
    let t0 = Instant::now();
    loop {
        let st = node_state(lab, node, network)?;
        let p = datapath_problems(&st, live);
        if p.is_empty() || t0.elapsed() > MAP_TIMEOUT {
            return Ok((t0.elapsed(), p));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
