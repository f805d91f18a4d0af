//! CHECK: the pod's network, on both ends of the veth and for each family
//! prevResult lists, is still what ADD made.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use mycni_common::net::Cidr;

use super::{
    Ends, Links, PodIps, alias, host_veth_name, mac_text, open_netns, runtime, sysctl_path,
};
use crate::config::{Env, NetConf};
use crate::error::{CniError, Code, Result};
use crate::ipam::Ipam;
use crate::netlink::{
    GATEWAY, GATEWAY_V6, GATEWAY_V6_PREFIX, Link, Netlink, cidr, in_netns, ipv6_conf, netlink_in,
    read_sysctl,
};
use crate::types::CniResult;

/// Whether `ip` is link-local (fe80::/10): the kernel's own address on
/// every interface, not one of the pod's.
fn is_link_local(ip: Ipv6Addr) -> bool {
    ip.segments()[0] & 0xffc0 == 0xfe80
}

fn check_failed(msg: String) -> CniError {
    CniError::new(Code::CheckFailed, msg)
}

/// CHECK: the pod's network is still what ADD reported in prevResult, for
/// each family it lists.
pub fn check(conf: &NetConf, env: &Env) -> Result<()> {
    let prev = conf
        .prev_result
        .as_ref()
        .ok_or_else(|| CniError::new(Code::InvalidConfig, "CHECK needs prevResult"))?;
    let prev = CniResult::from_json(prev)?;
    let ips: Vec<IpAddr> = prev.ips.iter().map(|i| i.address.addr()).collect();
    if ips.is_empty() {
        return Err(CniError::new(Code::InvalidConfig, "prevResult has no IP"));
    }
    let pod_ips = PodIps::of(&ips);
    let ipam = Ipam::select(conf, env)?;
    let netns = open_netns(&env.netns)?;
    let host_name = host_veth_name(env);
    runtime()?.block_on(async {
        let host = Netlink::current()?;
        let pod = netlink_in(&netns)?;
        let hl: Link = host
            .link_by_name(&host_name)
            .await?
            .ok_or_else(|| check_failed(format!("host veth {host_name} is missing")))?;
        if hl.alias.as_deref() != Some(alias(&conf.name, &env.container_id, &env.ifname).as_str()) {
            return Err(check_failed(format!(
                "host veth {host_name} belongs to {:?}",
                hl.alias
            )));
        }
        if !hl.up {
            return Err(check_failed(format!("host veth {host_name} is down")));
        }
        if hl.mtu != conf.mtu {
            return Err(check_failed(format!(
                "host veth MTU is {}, config says {}",
                hl.mtu, conf.mtu
            )));
        }
        let pl = pod
            .link_by_name(&env.ifname)
            .await?
            .ok_or_else(|| check_failed(format!("{} is missing in the pod", env.ifname)))?;
        if !pl.up {
            return Err(check_failed(format!("{} is down in the pod", env.ifname)));
        }
        if pl.mtu != conf.mtu {
            return Err(check_failed(format!(
                "pod {} MTU is {}, config says {}",
                env.ifname, pl.mtu, conf.mtu
            )));
        }
        // The pod holds the addresses prevResult lists, and no others of
        // either family.
        let addrs = pod.ipv4_addresses(pl.index).await?;
        let want: Vec<Cidr<Ipv4Addr>> = pod_ips
            .v4
            .map(|a| cidr(a, 32))
            .transpose()?
            .into_iter()
            .collect();
        if addrs != want {
            let addrs: Vec<String> = addrs.iter().map(ToString::to_string).collect();
            return Err(check_failed(format!(
                "pod {} has IPv4 addresses {addrs:?}, want {want:?}",
                env.ifname
            )));
        }
        let addrs6: Vec<_> = pod
            .ipv6_addresses(pl.index)
            .await?
            .into_iter()
            .filter(|a| !is_link_local(a.cidr.addr()))
            .collect();
        let want6: Vec<Cidr<Ipv6Addr>> = pod_ips
            .v6
            .map(|b| cidr(b, 128))
            .transpose()?
            .into_iter()
            .collect();
        if addrs6.iter().map(|a| a.cidr).collect::<Vec<_>>() != want6
            || addrs6.iter().any(|a| !a.nodad)
        {
            return Err(check_failed(format!(
                "pod {} has IPv6 addresses {addrs6:?}, want {want6:?} (nodad)",
                env.ifname
            )));
        }
        let ends = Ends {
            host: &host,
            pod: &pod,
            netns: &netns,
            host_name: &host_name,
        };
        let links = Links {
            host: &hl,
            pod: &pl,
        };
        if let Some(a) = pod_ips.v4 {
            check_v4(ends, links, a).await?;
        }
        if let Some(b) = pod_ips.v6 {
            check_v6(ends, links, env, b).await?;
        }
        Ok(())
    })?;
    ipam.check(conf, env, &ips)
}

async fn check_v4(ends: Ends<'_>, links: Links<'_>, ip: Ipv4Addr) -> Result<()> {
    let Ends {
        host,
        pod,
        host_name,
        ..
    } = ends;
    let Links { host: hl, pod: pl } = links;
    for (key, want) in [("proxy_arp", "1"), ("proxy_delay", "0"), ("rp_filter", "1")] {
        let got = read_sysctl(&sysctl_path(host_name, key))?;
        if got != want {
            return Err(check_failed(format!(
                "{key} on {host_name} is {got}, want {want}"
            )));
        }
    }
    let pod_32 = cidr(ip, 32)?;
    if !host
        .ipv4_routes()
        .await?
        .iter()
        .any(|r| r.dst == pod_32 && r.oif == Some(hl.index))
    {
        return Err(check_failed(format!(
            "host route {ip}/32 dev {host_name} is missing"
        )));
    }
    let routes = pod.ipv4_routes().await?;
    let has = |dst: Cidr<Ipv4Addr>, gw: Option<Ipv4Addr>| {
        routes
            .iter()
            .any(|r| r.dst == dst && r.gateway == gw && r.oif == Some(pl.index))
    };
    if !has(cidr(GATEWAY, 32)?, None) || !has(cidr(Ipv4Addr::UNSPECIFIED, 0)?, Some(GATEWAY)) {
        return Err(check_failed(format!(
            "pod routes via {GATEWAY} are missing: {routes:?}"
        )));
    }
    check_gateway_neighbour(pod, pl, hl, GATEWAY.into()).await
}

async fn check_v6(ends: Ends<'_>, links: Links<'_>, env: &Env, ip: Ipv6Addr) -> Result<()> {
    let Ends {
        host,
        pod,
        netns,
        host_name,
    } = ends;
    let Links { host: hl, pod: pl } = links;
    for (key, want) in [
        ("accept_dad", "0"),
        ("forwarding", "1"),
        ("disable_ipv6", "0"),
    ] {
        let got = read_sysctl(&ipv6_conf(host_name, key))?;
        if got != want {
            return Err(check_failed(format!(
                "IPv6 {key} on {host_name} is {got}, want {want}"
            )));
        }
    }
    let ifname = env.ifname.as_str();
    let pod_conf = in_netns(netns, || {
        ["accept_dad", "accept_ra"]
            .into_iter()
            .map(|k| -> Result<(&str, String)> { Ok((k, read_sysctl(&ipv6_conf(ifname, k))?)) })
            .collect::<Result<Vec<_>>>()
    })?;
    if let Some((key, got)) = pod_conf.iter().find(|(_, v)| v != "0") {
        return Err(check_failed(format!(
            "IPv6 {key} on the pod's {ifname} is {got}, want 0"
        )));
    }
    let gw = cidr(GATEWAY_V6, GATEWAY_V6_PREFIX)?;
    if !host
        .ipv6_addresses(hl.index)
        .await?
        .iter()
        .any(|a| a.cidr == gw)
    {
        return Err(check_failed(format!(
            "host veth {host_name} lacks the gateway address {gw}"
        )));
    }
    let pod_128 = cidr(ip, 128)?;
    if !host
        .ipv6_routes()
        .await?
        .iter()
        .any(|r| r.dst == pod_128 && r.oif == Some(hl.index))
    {
        return Err(check_failed(format!(
            "host route {pod_128} dev {host_name} is missing"
        )));
    }
    let default = cidr(Ipv6Addr::UNSPECIFIED, 0)?;
    let routes = pod.ipv6_routes().await?;
    if !routes
        .iter()
        .any(|r| r.dst == default && r.gateway == Some(GATEWAY_V6) && r.oif == Some(pl.index))
    {
        return Err(check_failed(format!(
            "pod route ::/0 via {GATEWAY_V6} is missing: {routes:?}"
        )));
    }
    check_gateway_neighbour(pod, pl, hl, GATEWAY_V6.into()).await
}

/// The pod's gateway of one family is a permanent neighbour at the host
/// veth's MAC.
async fn check_gateway_neighbour(pod: &Netlink, pl: &Link, hl: &Link, gw: IpAddr) -> Result<()> {
    match pod.permanent_neighbour(pl.index, gw).await? {
        Some(mac) if mac.0[..] == hl.mac[..] => Ok(()),
        other => Err(check_failed(format!(
            "pod neighbour {gw} is {:?}, want permanent {}",
            other.map(|m| m.to_string()),
            mac_text(&hl.mac)
        ))),
    }
}
