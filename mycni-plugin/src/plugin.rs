//! ADD, DEL, STATUS and GC; CHECK in `check`.

mod check;
mod record;

pub use check::check;

use std::collections::HashSet;
use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

use mycni_common::contract::VethAlias;
use mycni_common::net::{Cidr, Mac};
use mycni_common::netlink::Batch;

use crate::config::{Env, NetConf};
use crate::error::{CniError, Code, Result};
use crate::ipam::Ipam;
use crate::log;
use crate::netlink::{
    GATEWAY, GATEWAY_V6, GATEWAY_V6_PREFIX, Link, Netlink, cidr, in_netns, ipv6_conf, netlink_in,
    netlink_with_batches_in, plugin_route, read_sysctl, write_sysctl,
};
use crate::types::{CniResult, Interface, IpConfig, Route};

/// Host veth names: this prefix plus 10 hex digits of a hash of the pod.
pub use mycni_common::contract::HOST_VETH_PREFIX as HOST_PREFIX;

fn fnv1a64(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The host-side veth name: from the pod (namespace.name, as the seed does)
/// when the runtime says which pod, else from container ID and ifname.
/// Always exactly 15 bytes, the kernel's limit.
pub fn host_veth_name(env: &Env) -> String {
    let key = match (&env.args.pod_namespace, &env.args.pod_name) {
        (Some(ns), Some(name)) if env.ifname == "eth0" => format!("{ns}.{name}"),
        (Some(ns), Some(name)) => format!("{ns}.{name}/{}", env.ifname),
        _ => format!("{}/{}", env.container_id, env.ifname),
    };
    format!(
        "{HOST_PREFIX}{:010x}",
        fnv1a64(key.as_bytes()) & 0xff_ffff_ffff
    )
}

/// Every host veth carries `mycni:<network>:<containerID>:<ifname>` as its
/// alias (the contract's `VethAlias`), so DEL and GC only ever touch the
/// interface of the container they are asked about, never a newer container
/// of the same pod.
pub fn alias(network: &str, container_id: &str, ifname: &str) -> String {
    VethAlias {
        network,
        container_id,
        ifname,
    }
    .render()
}

/// A link's hardware address as results write it. A veth always has an
/// Ethernet address; anything else renders empty rather than as a
/// malformed MAC.
fn mac_text(mac: &[u8]) -> String {
    Mac::try_from(mac)
        .map(|m| m.to_string())
        .unwrap_or_default()
}

fn open_netns(path: &str) -> Result<File> {
    File::open(path).map_err(|e| {
        CniError::new(
            Code::UnknownContainer,
            format!("cannot open the container's network namespace {path}: {e}"),
        )
    })
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(|e| CniError::new(Code::Io, format!("starting the async runtime: {e}")))
}

const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";
const IPV6_FORWARDING: &str = "/proc/sys/net/ipv6/conf/all/forwarding";

fn sysctl_path(ifname: &str, key: &str) -> String {
    // proxy_delay is a neighbour-table knob, proxy_arp an interface one.
    let table = if key == "proxy_delay" {
        "neigh"
    } else {
        "conf"
    };
    format!("/proc/sys/net/ipv4/{table}/{ifname}/{key}")
}

/// The addresses prevResult lists, if it is there and reads.
fn ips_from_prev(conf: &NetConf) -> Vec<IpAddr> {
    conf.prev_result
        .as_ref()
        .and_then(|p| CniResult::from_json(p).ok())
        .map(|r| r.ips.iter().map(|i| i.address.addr()).collect())
        .unwrap_or_default()
}

/// The pod's address of each family, if it has one.
#[derive(Debug, Clone, Copy, Default)]
struct PodIps {
    v4: Option<Ipv4Addr>,
    v6: Option<Ipv6Addr>,
}

impl PodIps {
    fn of(ips: &[IpAddr]) -> Self {
        let mut out = PodIps::default();
        for ip in ips {
            match *ip {
                IpAddr::V4(a) => {
                    out.v4.get_or_insert(a);
                }
                IpAddr::V6(a) => {
                    out.v6.get_or_insert(a);
                }
            }
        }
        out
    }
}

/// Test hook: `MYCNI_TEST_FAULT=<step>` makes ADD fail right after that
/// step, so the rollback of every step can be tested against the real
/// kernel; `MYCNI_TEST_FAULT=kill:<step>` SIGKILLs the plugin there
/// instead, leaving what a runtime's timeout or the OOM killer would, for
/// DEL to clean up. Steps: ipam, veth, host, pod, host-route.
fn fault(step: &str) -> Result<()> {
    match std::env::var("MYCNI_TEST_FAULT") {
        Ok(s) if s == step => Err(CniError::new(
            Code::Kernel,
            format!("injected fault after step {step}"),
        )),
        Ok(s) if s.strip_prefix("kill:") == Some(step) => {
            // SAFETY: raise(3) on this process; SIGKILL cannot be caught,
            // so nothing after this runs.
            unsafe { libc::raise(libc::SIGKILL) };
            Ok(())
        }
        _ => Ok(()),
    }
}

/// What ADD and CHECK work on: netlink in the host and in the pod's
/// network namespace (`netns`), and the host veth's name.
#[derive(Clone, Copy)]
struct Ends<'a> {
    host: &'a Netlink,
    pod: &'a Netlink,
    netns: &'a File,
    host_name: &'a str,
}

/// Both ends of the pod's veth.
#[derive(Clone, Copy)]
struct Links<'a> {
    host: &'a Link,
    pod: &'a Link,
}

/// Steps of ADD already done, undone in reverse order on failure.
enum Undo {
    Ipam,
    Link(u32),
    Record,
}

pub fn add(conf: &NetConf, env: &Env) -> Result<CniResult> {
    let ipam = Ipam::select(conf, env)?;
    let netns = open_netns(&env.netns)?;
    let rt = runtime()?;
    rt.block_on(async {
        let host = Netlink::current_with_batches()?;
        let pod = netlink_with_batches_in(&netns)?;
        let host_name = host_veth_name(env);
        // Two lookups on two sockets, in flight together.
        let (in_pod, stale) =
            futures::join!(pod.link_by_name(&env.ifname), host.link_by_name(&host_name));
        if in_pod?.is_some() {
            return Err(CniError::new(
                Code::InvalidEnv,
                format!("interface {} already exists in the container's network namespace", env.ifname),
            ));
        }
        if let Some(stale) = stale? {
            match stale.alias.as_deref().and_then(VethAlias::parse) {
                Some(VethAlias {
                    container_id: cid, ..
                }) => {
                    // Left by an earlier sandbox of the same pod whose DEL
                    // never came: its container is gone, so is its use.
                    log::warn(&format!(
                        "removing stale host veth {host_name} of container {cid}"
                    ));
                    host.delete_link(stale.index).await?;
                }
                // Our name but no mark: an ADD killed between creating the
                // veth and marking it (the kernel takes the alias only after
                // creation). The name is this pod's, so it is this pod's.
                None if stale.alias.is_none() => {
                    log::warn(&format!("removing unmarked host veth {host_name} left by an interrupted ADD"));
                    host.delete_link(stale.index).await?;
                }
                None => {
                    return Err(CniError::new(
                        Code::Kernel,
                        format!(
                            "host interface {host_name} exists with alias {:?}, so it was not made by mycni; refusing to touch it",
                            stale.alias.as_deref().unwrap_or_default()
                        ),
                    ));
                }
            }
        }
        let mut undo: Vec<Undo> = Vec::new();
        let ends = Ends {
            host: &host,
            pod: &pod,
            netns: &netns,
            host_name: &host_name,
        };
        let result = add_steps(conf, env, &ipam, ends, &mut undo).await;
        if result.is_err() {
            for step in undo.into_iter().rev() {
                let r = match step {
                    Undo::Link(i) => host.delete_link(i).await.map_err(CniError::from),
                    Undo::Ipam => ipam.del(conf, env, &[]),
                    Undo::Record => record::remove(conf, env, &host_name),
                };
                if let Err(e) = r {
                    log::warn(&format!("rollback step failed: {e}"));
                }
            }
        }
        result
    })
}

/// The host veth's settings for the families the pod has, before it is up
/// (IPv6 DAD starts then), and forwarding on.
fn host_sysctls(host_name: &str, pod_ips: PodIps) -> Result<()> {
    if pod_ips.v4.is_some() {
        // proxy_arp answers a pod that still ARPs for 169.254.1.1 (e.g.
        // after flushing its neighbours); proxy_delay=0 makes that answer
        // immediate instead of up to 0.8 s late.
        write_sysctl(&sysctl_path(host_name, "proxy_arp"), "1")?;
        write_sysctl(&sysctl_path(host_name, "proxy_delay"), "0")?;
        // Anti-spoofing on the kernel path: strict reverse-path filtering.
        // The only route back to an address arriving on this veth is the
        // pod's own /32 through it, so a packet from any other source
        // (another pod's, an outside one) is dropped and counted
        // (TcpExtIPReversePathFilter) before routing or netfilter. The
        // fast path declines such packets and leaves them here. The kernel
        // applies max(all, this device): an `all` of 2 (loose) would
        // weaken it, which the agent reports.
        write_sysctl(&sysctl_path(host_name, "rp_filter"), "1")?;
        // Pods reach each other and the world only through the host's
        // forwarding; the agent turns it on too, but a runtime may run the
        // plugin with nothing but its conflist (as the reference ptp does).
        if read_sysctl(IP_FORWARD)? != "1" {
            write_sysctl(IP_FORWARD, "1")?;
        }
    }
    if pod_ips.v6.is_some() {
        // A host whose `default.disable_ipv6` is 1 makes every new veth so.
        let disable = ipv6_conf(host_name, "disable_ipv6");
        if read_sysctl(&disable)? != "0" {
            write_sysctl(&disable, "0")?;
        }
        // No DAD on the host end: its link-local address is the source of
        // its neighbour solicitations for the pod, and a tentative one
        // would hold them back for the first second or more.
        write_sysctl(&ipv6_conf(host_name, "accept_dad"), "0")?;
        write_sysctl(&ipv6_conf(host_name, "forwarding"), "1")?;
        // As ip_forward for IPv4. A node that takes its own IPv6 default
        // route from router advertisements keeps it only with accept_ra=2
        // on its uplink once it forwards (the kernel's rule for routers).
        if read_sysctl(IPV6_FORWARDING)? != "1" {
            write_sysctl(IPV6_FORWARDING, "1")?;
        }
    }
    Ok(())
}

async fn add_steps(
    conf: &NetConf,
    env: &Env,
    ipam: &Ipam,
    ends: Ends<'_>,
    undo: &mut Vec<Undo>,
) -> Result<CniResult> {
    let Ends {
        host,
        pod,
        netns,
        host_name,
    } = ends;
    // A delegated IPAM runs (a process of its own, several ms for a Go
    // binary) while the veth is made and looked up in the pod: neither
    // needs the addresses.
    let leasing = ipam.start_add(conf, env)?;
    let created = async {
        let host_link = host
            .create_veth_in(host_name, &env.ifname, netns, conf.mtu)
            .await?;
        Ok::<_, CniError>((host_link, pod.link_by_name(&env.ifname).await))
    }
    .await;
    let ips = leasing.finish();
    // Undone in reverse: the veth (and with it the host route) goes before
    // its addresses are released for another pod.
    if ips.is_ok() {
        undo.push(Undo::Ipam);
    }
    if let Ok((link, _)) = &created {
        undo.push(Undo::Link(link.index));
    }
    let ips = ips?;
    fault("ipam")?;
    let (host_link, pod_link) = created?;
    fault("veth")?;
    let pod_link = pod_link?.ok_or_else(|| {
        CniError::new(
            Code::Kernel,
            format!("{} missing in the pod after creation", env.ifname),
        )
    })?;
    let pod_ips = PodIps::of(&ips.iter().map(|i| i.address.addr()).collect::<Vec<_>>());
    let alias = alias(&conf.name, &env.container_id, &env.ifname);
    // Before the veth is up, so the agent can know the pod by its first
    // packet; after it exists, so GC never takes the record for a leftover.
    record::write(
        conf,
        env,
        host_name,
        &ips.iter().map(|i| i.address.addr()).collect::<Vec<_>>(),
    )?;
    undo.push(Undo::Record);
    host_sysctls(host_name, pod_ips)?;
    if pod_ips.v6.is_some() {
        // Before eth0 is up, which starts DAD on its link-local address
        // and would take router advertisements: the pod's addresses are
        // unique by the IPAM, and its only router is the host veth.
        let ifname = env.ifname.as_str();
        in_netns(netns, || {
            // A pod namespace whose `default.disable_ipv6` is 1 made eth0 so.
            let disable = ipv6_conf(ifname, "disable_ipv6");
            if read_sysctl(&disable)? != "0" {
                write_sysctl(&disable, "0")?;
            }
            write_sysctl(&ipv6_conf(ifname, "accept_dad"), "0")?;
            write_sysctl(&ipv6_conf(ifname, "accept_ra"), "0")
        })?;
    }
    let host_mac = host_link.ethernet_mac().ok_or_else(|| {
        CniError::new(
            Code::Kernel,
            format!("host veth {host_name} has no Ethernet address"),
        )
    })?;
    // Every remaining change, as one batch per namespace, both in flight at
    // once: the kernel takes a datagram's requests in order, so each batch
    // keeps its order (an address before its interface is up, an interface
    // up before a route through it), and a namespace's changes cost one
    // round trip instead of one each (netlink-proto sends a connection's
    // requests one per round trip). The static neighbours save the first
    // packet a neighbour round trip and work even where proxy ARP would
    // not answer (no host route to 169.254.1.1).
    let mut pod_batch = Batch::new();
    let mut host_batch = Batch::new();
    host_batch.set_alias_and_up(host_link.index, &alias);
    if let Some(a) = pod_ips.v4 {
        pod_batch.add_ipv4_address(pod_link.index, cidr(a, 32)?);
    }
    if let Some(b) = pod_ips.v6 {
        pod_batch.add_ipv6_address_nodad(pod_link.index, cidr(b, 128)?);
    }
    pod_batch.set_up(pod_link.index);
    // Where the changes that need eth0 up begin (results before it: "host").
    let pod_up = pod_batch.len();
    if let Some(a) = pod_ips.v4 {
        let (gw_32, default, pod_32) = (
            cidr(GATEWAY, 32)?,
            cidr(Ipv4Addr::UNSPECIFIED, 0)?,
            cidr(a, 32)?,
        );
        pod_batch.replace_permanent_neighbour(pod_link.index, GATEWAY, host_mac);
        pod_batch.add_route(plugin_route(gw_32, None, pod_link.index));
        pod_batch.add_route(plugin_route(default, Some(GATEWAY), pod_link.index));
        host_batch.add_route(plugin_route(pod_32, None, host_link.index));
    }
    if let Some(b) = pod_ips.v6 {
        let (default, pod_128, gw) = (
            cidr(Ipv6Addr::UNSPECIFIED, 0)?,
            cidr(b, 128)?,
            cidr(GATEWAY_V6, GATEWAY_V6_PREFIX)?,
        );
        pod_batch.replace_permanent_neighbour(pod_link.index, GATEWAY_V6, host_mac);
        pod_batch.add_route(plugin_route(default, Some(GATEWAY_V6), pod_link.index));
        host_batch.add_ipv6_address_nodad(host_link.index, gw);
        host_batch.add_route(plugin_route(pod_128, None, host_link.index));
    }
    let (pod_done, host_done) =
        futures::join!(pod.apply_batch(pod_batch), host.apply_batch(host_batch));
    let (mut host_done, mut pod_done) = (host_done.into_iter(), pod_done.into_iter());
    // The host veth up with its alias, then the pod's addresses and eth0
    // up, then the rest: the first error in the order the changes were meant.
    host_done.next().transpose()?;
    for r in pod_done.by_ref().take(pod_up) {
        r?;
    }
    fault("host")?;
    for r in pod_done {
        r?;
    }
    fault("pod")?;
    for r in host_done {
        r?;
    }
    fault("host-route")?;

    let links = Links {
        host: &host_link,
        pod: &pod_link,
    };
    pod_result(conf, env, &ips, host_name, links)
}

/// ADD's result: both ends of the veth, and the pod's addresses in the
/// IPAM's order (primary family first), each with its family's gateway and
/// default route.
fn pod_result(
    conf: &NetConf,
    env: &Env,
    ips: &[IpConfig],
    host_name: &str,
    links: Links<'_>,
) -> Result<CniResult> {
    let Links {
        host: host_link,
        pod: pod_link,
    } = links;
    let mut result_ips = Vec::new();
    let mut routes = Vec::new();
    for ip in ips {
        let (address, gw, default): (Cidr, IpAddr, Cidr) = match ip.address.addr() {
            IpAddr::V4(a) => (
                cidr(a, 32)?.into(),
                GATEWAY.into(),
                cidr(Ipv4Addr::UNSPECIFIED, 0)?.into(),
            ),
            IpAddr::V6(b) => (
                cidr(b, 128)?.into(),
                GATEWAY_V6.into(),
                cidr(Ipv6Addr::UNSPECIFIED, 0)?.into(),
            ),
        };
        result_ips.push(IpConfig {
            address,
            gateway: Some(gw),
            interface: Some(1),
        });
        routes.push(Route {
            dst: default,
            gw: Some(gw),
        });
    }
    Ok(CniResult {
        interfaces: vec![
            Interface {
                name: host_name.to_string(),
                mac: mac_text(&host_link.mac),
                mtu: Some(host_link.mtu),
                sandbox: None,
            },
            Interface {
                name: env.ifname.clone(),
                mac: mac_text(&pod_link.mac),
                mtu: Some(pod_link.mtu),
                sandbox: Some(env.netns.clone()),
            },
        ],
        ips: result_ips,
        routes,
        dns: conf.dns.clone(),
    })
}

/// DEL: removes what ADD made for this container and releases its IP; keeps
/// going past errors and reports the first; succeeds when things are
/// already gone (netns deleted, CNI_NETNS empty, no prevResult).
pub fn del(conf: &NetConf, env: &Env) -> Result<()> {
    let mut first_err: Option<CniError> = None;
    let mut note = |r: Result<()>| {
        if let Err(e) = r {
            log::warn(&format!("DEL {}: {e}", env.container_id));
            first_err.get_or_insert(e);
        }
    };
    let rt = runtime()?;
    note(rt.block_on(async {
        let host = Netlink::current()?;
        let host_name = host_veth_name(env);
        if let Some(link) = host.link_by_name(&host_name).await? {
            let mine = alias(&conf.name, &env.container_id, &env.ifname);
            if link.alias.as_deref() == Some(mine.as_str()) {
                // Deleting the host end removes the pod end and the host route.
                host.delete_link(link.index).await?;
            } else if link.alias.is_none() && is_container_peer(&link, env).await? {
                // An ADD killed between creating the veth and marking it
                // (the kernel takes no alias at creation): its other end is
                // this container's interface, so it is this container's.
                log::warn(&format!(
                    "DEL {}: removing unmarked host veth {host_name} left by an interrupted ADD",
                    env.container_id
                ));
                host.delete_link(link.index).await?;
            } else {
                log::info(&format!(
                    "DEL {}: {host_name} belongs to {:?}, leaving it",
                    env.container_id, link.alias
                ));
            }
        }
        // Whether or not the veth was still there; a newer sandbox's
        // record (same pod, same veth name) is left alone.
        record::remove(conf, env, &host_name)
    }));
    match Ipam::select(conf, env) {
        Ok(ipam) => note(ipam.del(conf, env, &ips_from_prev(conf))),
        Err(e) => note(Err(e)),
    }
    first_err.map_or(Ok(()), Err)
}

/// Whether `host_link` and the container's `CNI_IFNAME` in `CNI_NETNS` are
/// the two ends of one veth. False when the netns is gone (and with it the
/// veth) or not given.
async fn is_container_peer(host_link: &Link, env: &Env) -> Result<bool> {
    if env.netns.is_empty() {
        return Ok(false);
    }
    let Ok(netns) = File::open(&env.netns) else {
        return Ok(false);
    };
    let pod = netlink_in(&netns)?;
    Ok(pod.link_by_name(&env.ifname).await?.is_some_and(|p| {
        p.peer_index == Some(host_link.index) && host_link.peer_index == Some(p.index)
    }))
}

/// STATUS: ready once the agent has the overlay up (its ready file exists and
/// `vxlan.1` is present), and the IPAM can allocate.
pub fn status(conf: &NetConf, env: &Env) -> Result<()> {
    if !Path::new(&conf.ready_file).exists() {
        return Err(CniError::new(
            Code::NotAvailable,
            format!(
                "mycni-agent is not ready on this node ({} is missing)",
                conf.ready_file.display()
            ),
        )
        .with_details(
            "check the mycni-agent pod on this node: kubectl -n kube-system logs ds/mycni-agent",
        ));
    }
    let vx = runtime()?.block_on(async {
        Ok::<_, CniError>(Netlink::current()?.link_by_name(&conf.vxlan_device).await?)
    })?;
    if vx.is_none() {
        return Err(CniError::new(
            Code::NotAvailable,
            format!(
                "overlay device {} is missing; mycni-agent recreates it",
                conf.vxlan_device
            ),
        ));
    }
    Ipam::select(conf, env)?.status(conf)
}

/// GC: frees every lease and host veth of this network whose attachment is
/// not in `cni.dev/valid-attachments`.
pub fn gc(conf: &NetConf, env: &Env) -> Result<()> {
    let valid = conf.valid_attachments.clone().unwrap_or_default();
    let keep: HashSet<(String, String)> = valid
        .into_iter()
        .map(|a| (a.container_id, a.ifname))
        .collect();
    let mut first_err = None;
    let r = runtime()?.block_on(async {
        let host = Netlink::current()?;
        let mut live = HashSet::new();
        for l in host.links().await? {
            live.insert(l.name.clone());
            let Some(VethAlias {
                network: net,
                container_id: cid,
                ifname,
            }) = l.alias.as_deref().and_then(VethAlias::parse)
            else {
                continue;
            };
            if net == conf.name && !keep.contains(&(cid.to_string(), ifname.to_string())) {
                log::info(&format!("GC: removing {} of {cid}/{ifname}", l.name));
                host.delete_link(l.index).await?;
                live.remove(&l.name);
            }
        }
        record::prune(conf, &live)
    });
    if let Err(e) = r {
        first_err.get_or_insert(e);
    }
    if let Err(e) = Ipam::select(conf, env).and_then(|i| i.gc(conf, &keep)) {
        first_err.get_or_insert(e);
    }
    first_err.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{CniArgs, Command};

    fn env(cid: &str, ifname: &str, ns: Option<&str>, pod: Option<&str>) -> Env {
        Env {
            command: Command::Add,
            container_id: cid.into(),
            netns: String::new(),
            ifname: ifname.into(),
            args: CniArgs {
                pod_namespace: ns.map(Into::into),
                pod_name: pod.map(Into::into),
                ..Default::default()
            },
            path: vec![],
        }
    }

    #[test]
    fn host_names_fit_and_follow_the_pod() {
        let a = host_veth_name(&env("c1", "eth0", Some("default"), Some("web-0")));
        let b = host_veth_name(&env("c2", "eth0", Some("default"), Some("web-0")));
        let c = host_veth_name(&env("c1", "eth0", Some("default"), Some("web-1")));
        let d = host_veth_name(&env("c1", "eth1", Some("default"), Some("web-0")));
        let e = host_veth_name(&env("c1", "eth0", None, None));
        assert_eq!(a, b, "same pod, new sandbox: same name");
        assert_ne!(a, c);
        assert_ne!(a, d);
        assert_ne!(a, e);
        for n in [a, c, d, e] {
            assert_eq!(n.len(), 15, "{n}");
            assert!(n.starts_with(HOST_PREFIX));
        }
    }

    #[test]
    fn alias_round_trip() {
        let a = alias("mycni0", "abc", "eth0");
        let back = VethAlias::parse(&a).map(|a| (a.network, a.container_id, a.ifname));
        assert_eq!(back, Some(("mycni0", "abc", "eth0")));
        assert_eq!(VethAlias::parse("other"), None);
    }
}
