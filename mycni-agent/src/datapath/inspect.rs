//! `mycni-agent inspect`: the fast path's pinned state in human form. Reads
//! bpffs directly, so it works with the agent down and from `kubectl exec`.

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::Path;

use anyhow::{Context, Result};

use mycni_common::{DpFamily, DpPath, PathCounter};

use super::maps::{self, AttachedMaps, MapSource};
use super::{LOCAL, LOCAL6, PEERS, Prog, REMOTE, REMOTE6, programs};
use mycni_common::net::Mac;

fn ifname(index: u32) -> String {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: buf has IF_NAMESIZE bytes, as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(index, buf.as_mut_ptr()) };
    if p.is_null() {
        return "(gone)".to_owned();
    }
    // SAFETY: on success the kernel wrote a NUL-terminated name into buf.
    unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

fn human(n: u64) -> String {
    match n {
        0..1_000 => n.to_string(),
        1_000..1_000_000 => format!("{:.1}k", n as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1}M", n as f64 / 1e6),
        _ => format!("{:.1}G", n as f64 / 1e9),
    }
}

/// Renders everything pinned under `pin_dir`.
pub fn render(pin_dir: &Path) -> Result<String> {
    let cfg = match maps::read_config(pin_dir) {
        Ok(c) => c,
        Err(e) => {
            return Ok(format!(
                "no fast path pinned at {} ({e}): the node runs the kernel path, or the agent has not started\n",
                pin_dir.display()
            ));
        }
    };
    let links = programs::pinned_links(pin_dir)?;
    render_from(
        pin_dir,
        cfg,
        &format!("fast path pinned at {}", pin_dir.display()),
        &links,
    )
}

/// Renders the fast path of this network namespace as the kernel holds
/// it, found from the programs attached to `vxlan` (no bpffs path needed),
/// or where there is no such device (an IPv6-only node has no `vxlan.1`)
/// to `vxlan6`, or else what is pinned under `fallback`.
pub fn render_attached(vxlan: &str, vxlan6: &str, fallback: &Path) -> Result<String> {
    let by_name = |name: &str| {
        std::ffi::CString::new(name)
            .map(|c| {
                // SAFETY: a NUL-terminated name; the call only reads it.
                unsafe { libc::if_nametoindex(c.as_ptr()) }
            })
            .unwrap_or(0)
    };
    let (vxlan, index) = match by_name(vxlan) {
        0 => (vxlan6, by_name(vxlan6)),
        i => (vxlan, i),
    };
    let found = if index == 0 {
        None
    } else {
        AttachedMaps::discover(index)?
    };
    let Some(found) = found else {
        let pinned = render(fallback)?;
        return Ok(format!(
            "no mycni program attached to {vxlan} in this network namespace\n{pinned}"
        ));
    };
    let cfg = maps::read_config(&found).context("reading mycni_config")?;
    let header = format!("fast path attached to {vxlan} (ifindex {index}), maps found by id");
    render_from(&found, cfg, &header, &found.links)
}

fn render_from<S: MapSource + ?Sized>(
    pin_dir: &S,
    cfg: mycni_common::DpConfig,
    header: &str,
    links: &[(Prog, u32)],
) -> Result<String> {
    let mut o = String::new();
    writeln!(o, "{header}")?;
    if cfg.vxlan_ifindex == 0 {
        writeln!(o, "  vxlan: none ({})", crate::topology::IPV6_ONLY)?;
    } else {
        writeln!(
            o,
            "  vxlan: {} (ifindex {}), VTEP MAC {}",
            ifname(cfg.vxlan_ifindex),
            cfg.vxlan_ifindex,
            Mac(cfg.vtep_mac)
        )?;
    }
    if cfg.vxlan6_ifindex != 0 {
        writeln!(
            o,
            "  vxlan over IPv6: {} (ifindex {}), VTEP MAC {}",
            ifname(cfg.vxlan6_ifindex),
            cfg.vxlan6_ifindex,
            Mac(cfg.vtep6_mac)
        )?;
    }
    if cfg.flags & mycni_common::CFG_TC_ENCAP != 0 {
        writeln!(
            o,
            "  tc encap/decap: underlay {} (ifindex {}), local {}, VNI {}, port {}, source ports {}-{}, TTL {}",
            ifname(cfg.underlay_ifindex),
            cfg.underlay_ifindex,
            Ipv4Addr::from(cfg.host_ip.to_ne_bytes()),
            cfg.vni,
            cfg.vxlan_port,
            cfg.port_min,
            cfg.port_max,
            cfg.ttl
        )?;
    } else if cfg.vxlan_ifindex == 0 {
        writeln!(o, "  tc encap/decap: off (no vxlan.1)")?;
    } else {
        writeln!(
            o,
            "  tc encap/decap: off (remote traffic goes through vxlan.1)"
        )?;
    }
    writeln!(
        o,
        "  conntrack renewal: tcp {} s, udp {} s",
        cfg.tcp_timeout_ms / 1000,
        cfg.udp_timeout_ms / 1000
    )?;
    let events = if cfg.flags & mycni_common::CFG_FLOW_EVENTS != 0 {
        "on"
    } else {
        "off"
    };
    // Programs of a build without the ring have no statistics to show.
    match super::maps::read_flow_stats(pin_dir) {
        Ok(s) => writeln!(
            o,
            "  flow events: {events} (emitted {}, lost {}, suppressed {})",
            s.emitted, s.lost, s.suppressed
        )?,
        Err(_) => writeln!(o, "  flow events: {events}")?,
    }

    writeln!(o, "\nattached ({}):", links.len())?;
    for (p, ifindex) in links {
        let hook = match p {
            Prog::FromPod => "pod veth ingress",
            Prog::FromVxlan => "vxlan ingress",
            Prog::FromUnderlay => "underlay ingress (tc decap)",
        };
        writeln!(
            o,
            "  {:<20} {:<16} ifindex {:<6} {hook}",
            p.name(),
            ifname(*ifindex),
            ifindex
        )?;
    }

    // Read from the kernel, not the pins: what the agent leaves alone.
    if let Ok(shaped) = super::shaping::shaped_pod_veths()
        && !shaped.is_empty()
    {
        writeln!(o, "\nleft to the kernel path ({}):", shaped.len())?;
        for (ifindex, _, why) in shaped {
            writeln!(o, "  ifindex {ifindex:<6} {why}")?;
        }
    }

    let remote = REMOTE.read(pin_dir).context("reading mycni_remote")?;
    // Maps pinned by an agent from before IPv6 have no IPv6 twins: none.
    let remote6 = REMOTE6.read(pin_dir).unwrap_or_default();
    writeln!(
        o,
        "\npeers: remote podCIDRs ({} IPv4, {} IPv6):",
        remote.len(),
        remote6.len()
    )?;
    let remotes = remote
        .iter()
        .map(|((a, p), r)| (format!("{a}/{p}"), r))
        .chain(remote6.iter().map(|((a, p), r)| (format!("{a}/{p}"), r)));
    for (cidr, r) in remotes {
        // A peer over the IPv6 underlay: its host address is in vxlan6.1's
        // FDB, not in the map.
        let host = if r.flags & mycni_common::REMOTE_VXLAN6 != 0 {
            format!("over {}", ifname(cfg.vxlan6_ifindex))
        } else {
            format!("host {}", Ipv4Addr::from(r.host_ip.to_ne_bytes()))
        };
        let how = if r.flags & mycni_common::REMOTE_DIRECT != 0 {
            "  direct"
        } else {
            ""
        };
        writeln!(o, "  {cidr:<18} -> VTEP {}  {host}{how}", Mac(r.vtep_mac))?;
    }

    if cfg.flags & mycni_common::CFG_TC_DECAP == 0 {
        // Only the underlay's program reads it, and none is attached (no
        // --tc-encap, or no vxlan.1): maps found through the attached
        // programs do not include it.
        writeln!(
            o,
            "peer hosts VXLAN is unwrapped from: none (no tc decapsulation)"
        )?;
    } else {
        let peers = PEERS.read(pin_dir).context("reading mycni_peers")?;
        let hosts: Vec<String> = peers.keys().map(Ipv4Addr::to_string).collect();
        writeln!(
            o,
            "peer hosts VXLAN is unwrapped from ({}): {}",
            peers.len(),
            hosts.join(" ")
        )?;
    }

    let local = LOCAL.read(pin_dir).context("reading mycni_local")?;
    let local6 = LOCAL6.read(pin_dir).unwrap_or_default();
    writeln!(
        o,
        "\nlocal endpoints ({} IPv4, {} IPv6):",
        local.len(),
        local6.len()
    )?;
    let locals = local
        .iter()
        .map(|(ip, ep)| (ip.to_string(), ep))
        .chain(local6.iter().map(|(ip, ep)| (ip.to_string(), ep)));
    for (ip, ep) in locals {
        writeln!(
            o,
            "  {:<15} veth {:<16} ifindex {:<6} pod MAC {}  gateway MAC {}",
            ip,
            ifname(ep.ifindex),
            ep.ifindex,
            Mac(ep.pod_mac),
            Mac(ep.host_mac)
        )?;
    }

    o.push_str(&counters_table(&maps::read_family_counters(pin_dir)?));
    Ok(o)
}

fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// The counters, overall and per family, then a row per path and family
/// that saw packets (the fast paths of both IP families always, so a fast
/// path that stays at zero shows).
fn counters_table(counters: &[(DpFamily, DpPath, PathCounter)]) -> String {
    let sum = |keep: &dyn Fn(DpFamily, DpPath) -> bool| -> u64 {
        counters
            .iter()
            .filter(|(f, p, _)| keep(*f, *p))
            .map(|(_, _, c)| c.packets)
            .sum()
    };
    let total = sum(&|_, _| true);
    let fast = sum(&|_, p| p.is_fast());
    let mut o = format!(
        "\ncounters (since the maps were created): {} packets, {:.1}% fast\n",
        human(total),
        pct(fast, total)
    );
    for f in DpFamily::ALL {
        let n = sum(&|g, _| g == f);
        let fast = sum(&|g, p| g == f && p.is_fast());
        let _ = match f {
            DpFamily::Other => writeln!(o, "  {:<5} {:>10} packets (not IP)", f.name(), human(n)),
            _ => writeln!(
                o,
                "  {:<5} {:>10} packets, {:.1}% fast",
                f.name(),
                human(n),
                pct(fast, n)
            ),
        };
    }
    let _ = writeln!(
        o,
        "  {:<30} {:<6} {:>10} {:>10}",
        "path", "family", "packets", "bytes"
    );
    let mut hidden = 0;
    for p in DpPath::ALL {
        let mut shown = false;
        for (f, _, c) in counters.iter().filter(|(_, q, _)| *q == p) {
            if c.packets == 0 && !(p.is_fast() && *f != DpFamily::Other) {
                continue;
            }
            shown = true;
            let _ = writeln!(
                o,
                "  {:<30} {:<6} {:>10} {:>10}",
                p.name(),
                f.name(),
                human(c.packets),
                human(c.bytes)
            );
        }
        hidden += usize::from(!shown);
    }
    if hidden > 0 {
        let _ = writeln!(o, "  ({hidden} fallback reasons with no packets not shown)");
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_show_each_family_and_its_fast_share() {
        let c = |packets| PathCounter {
            packets,
            bytes: packets * 100,
        };
        let mut counters: Vec<_> = mycni_common::counter_slots()
            .map(|(_, f, p)| (f, p, PathCounter::default()))
            .collect();
        let mut set = |f: DpFamily, p: DpPath, n| {
            counters[mycni_common::counter_index(f, p) as usize].2 = c(n);
        };
        set(DpFamily::Ipv4, DpPath::FastEncap, 90);
        set(DpFamily::Ipv4, DpPath::KernelTcpControl, 10);
        set(DpFamily::Ipv6, DpPath::FastLocal, 30);
        set(DpFamily::Ipv6, DpPath::KernelTcpControl, 70);
        set(DpFamily::Other, DpPath::KernelNotIpv4, 200);
        let t = counters_table(&counters);
        assert!(t.contains("400 packets, 30.0% fast"), "{t}");
        assert!(t.contains("ipv4         100 packets, 90.0% fast"), "{t}");
        assert!(t.contains("ipv6         100 packets, 30.0% fast"), "{t}");
        assert!(t.contains("other        200 packets (not IP)"), "{t}");
        let row = |p: &str, f: &str| {
            t.lines()
                .find(|l| l.split_whitespace().take(2).eq([p, f]))
                .map(|l| l.split_whitespace().skip(2).collect::<Vec<_>>())
        };
        assert_eq!(row("kernel_tcp_control", "ipv6"), Some(vec!["70", "7.0k"]));
        assert_eq!(row("kernel_not_ipv4", "other"), Some(vec!["200", "20.0k"]));
        // A fast path at zero still shows, for both IP families only.
        assert_eq!(row("fast_tc_decap", "ipv6"), Some(vec!["0", "0"]));
        assert_eq!(row("fast_tc_decap", "other"), None);
        assert_eq!(row("fast_vxlan6", "ipv6"), Some(vec!["0", "0"]));
        assert_eq!(row("kernel_vxlan6_mtu", "ipv6"), None);
        assert_eq!(row("kernel_ttl", "ipv4"), None);
    }
}
