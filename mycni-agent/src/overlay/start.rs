//! The overlay's start: the underlay found, `vxlan.1` (and `vxlan6.1`
//! where the node has an IPv6 underlay) brought up with a stable VTEP MAC
//! and the MTU the underlay can carry.
//!
//! An IPv6-only node (a cluster CIDR with an IPv6 range alone) has no
//! `vxlan.1`: a VXLAN device outside metadata mode opens a socket of one
//! family, and such a node has no IPv4 to open it on. Its underlay is
//! found through IPv6 routes and addresses, `vxlan6.1` is its one device
//! (mandatory, holding the node's IPv6 VTEP address): flannel's IPv6-only
//! mode does the same with `flannel-v6.1` alone.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use mycni_common::VXLAN_OVERHEAD;
use mycni_common::net::{Cidr4, Cidr6, Mac, PodCidrs};

use super::{OverlayKernel, Underlay, Underlay6};
use crate::settings;
use crate::topology::{IPV6_ONLY, Underlay6Select, UnderlaySelect, Vxlan6Spec, VxlanSpec};

/// The overlay's settings.
#[derive(Debug, Clone)]
pub struct Section {
    pub vxlan_name: String,
    pub vxlan6_name: String,
    pub vni: u32,
    pub vxlan_port: u16,
    /// The pods' MTU asked for; None: the most the underlay carries.
    pub mtu: Option<u32>,
    pub iface: UnderlaySelect,
    pub underlay6: Underlay6Select,
    pub direct_routing: bool,
    /// Where the VTEP MACs are kept across restarts.
    pub data_dir: PathBuf,
    pub proc_sys: PathBuf,
}

/// The devices as brought up.
pub struct Devices {
    /// `vxlan.1`; None on an IPv6-only node.
    pub vx: Option<VxlanSpec>,
    /// `vxlan6.1`, on a node with an IPv6 underlay (always on an IPv6-only
    /// node).
    pub vx6: Option<Vxlan6Spec>,
    /// The underlay's own IPv4 subnets: the first set direct routing uses.
    pub underlay_subnets: Vec<Cidr4>,
    pub underlay_name: String,
}

/// Finds the underlay and brings the node's VXLAN devices up for its
/// podCIDRs `own`.
pub async fn start(
    cfg: &Section,
    kernel: &OverlayKernel,
    node_name: &str,
    own: PodCidrs,
) -> Result<Devices> {
    let how = &cfg.iface;
    match (own.v4, own.v6) {
        (Some(own_cidr), own_cidr6) => {
            let (vx, vx6, underlay) =
                start_dual(cfg, kernel, node_name, how, (own_cidr, own_cidr6)).await?;
            Ok(Devices {
                vx: Some(vx),
                vx6,
                underlay_subnets: underlay.subnets,
                underlay_name: underlay.name,
            })
        }
        (None, Some(own_cidr6)) => {
            let (vx6, u6) = start_ipv6_only(cfg, kernel, node_name, how, own_cidr6).await?;
            Ok(Devices {
                vx: None,
                vx6: Some(vx6),
                underlay_subnets: vec![],
                underlay_name: u6.name,
            })
        }
        (None, None) => anyhow::bail!("this node has no podCIDR of either family"),
    }
}

/// A node with an IPv4 podCIDR: `vxlan.1` over the IPv4 underlay, and
/// `vxlan6.1` beside it where the node has IPv6 pods and an IPv6 underlay.
async fn start_dual(
    cfg: &Section,
    kernel: &OverlayKernel,
    node_name: &str,
    how: &UnderlaySelect,
    own: (Cidr4, Option<Cidr6>),
) -> Result<(VxlanSpec, Option<Vxlan6Spec>, Underlay)> {
    let own_cidr6 = own.1;
    let underlay = kernel.select_underlay(how).await.with_context(|| {
        format!(
            "finding the underlay --iface {how} ({})",
            settings::UNDERLAY.source()
        )
    })?;
    // An IPv6 underlay only where the node's pods have IPv6: it carries
    // IPv6 pod traffic alone.
    let underlay6 = match own_cidr6 {
        Some(_) => kernel
            .underlay6(&underlay, &cfg.underlay6)
            .await
            .with_context(|| {
                format!(
                    "finding the IPv6 underlay (--underlay6, {})",
                    settings::UNDERLAY6.source()
                )
            })?,
        None => None,
    };
    let mtu = overlay_mtu(cfg.mtu, &underlay, own_cidr6.is_some(), underlay6.is_some())?;
    let vx = bring_up_vxlan(cfg, kernel, &underlay, mtu, own).await?;
    tracing::info!(node = %node_name, pod_cidr = %own.0, pod_cidr6 = ?own_cidr6, underlay = %underlay.name, host_ip = %underlay.ip, vtep_mac = %vx.mac, mtu = vx.mtu, "brought the overlay up");
    let vx6 = match &underlay6 {
        Some(u6) => Some(
            bring_up_vxlan6(
                cfg,
                kernel,
                u6,
                u6.mtu.saturating_sub(VXLAN6_OVERHEAD),
                None,
            )
            .await?,
        ),
        None => {
            // An earlier run's, when the node no longer has an IPv6
            // underlay (or it is turned off): its peers must not be sent
            // there, nor its socket left bound.
            if let Some(l) = kernel.link(&cfg.vxlan6_name).await? {
                tracing::info!(device = %cfg.vxlan6_name, "no IPv6 underlay: removing the VXLAN device over IPv6");
                kernel.del_link(l.index).await?;
            }
            None
        }
    };
    Ok((vx, vx6, underlay))
}

/// An IPv6-only node: no `vxlan.1` (an earlier run's is removed, with the
/// routes and nexthops it had), `vxlan6.1` over the IPv6 underlay as the
/// node's one VXLAN device, with the pods' MTU and the IPv6 VTEP address.
async fn start_ipv6_only(
    cfg: &Section,
    kernel: &OverlayKernel,
    node_name: &str,
    how: &UnderlaySelect,
    own_cidr6: Cidr6,
) -> Result<(Vxlan6Spec, Underlay6)> {
    if cfg.underlay6 == Underlay6Select::Off {
        anyhow::bail!(
            "--underlay6 off ({}) on an IPv6-only node: {} over the IPv6 underlay is the only way it has to its peers; set auto or one of its IPv6 addresses",
            settings::UNDERLAY6.source(),
            cfg.vxlan6_name
        );
    }
    let u6 = kernel
        .select_underlay_ipv6(how, &cfg.underlay6, None)
        .await
        .with_context(|| {
            format!(
                "finding the IPv6 underlay of an IPv6-only node: --iface {how} ({}), --underlay6 {} (key `{}`, env {})",
                settings::UNDERLAY.source(),
                cfg.underlay6,
                settings::UNDERLAY6.key,
                settings::UNDERLAY6.env,
            )
        })?;
    let mtu = mtu_within(cfg.mtu, &u6.name, u6.mtu, VXLAN6_OVERHEAD, true)?;
    tracing::info!(node = %node_name, pod_cidr6 = %own_cidr6, underlay = %u6.name, host_ip6 = %u6.ip, "{IPV6_ONLY}: no {}, every peer through {}", cfg.vxlan_name, cfg.vxlan6_name);
    if cfg.direct_routing {
        tracing::warn!(
            "--direct-routing routes IPv4 podCIDRs only: nothing to do on an IPv6-only node"
        );
    }
    // An earlier (dual-stack) run's: its socket and routes must go, and so
    // must the agent's nexthops (this node makes none: vxlan6.1's routes
    // are onlink), those of direct routing on the underlay among them.
    if let Some(l) = kernel.link(&cfg.vxlan_name).await? {
        tracing::info!(device = %cfg.vxlan_name, "{IPV6_ONLY}: removing the VXLAN device over IPv4");
        kernel.del_link(l.index).await?;
    }
    kernel.delete_nexthops().await?;
    let vx6 = bring_up_vxlan6(cfg, kernel, &u6, mtu, Some(own_cidr6.network())).await?;
    Ok((vx6, u6))
}

/// `vxlan.1` over the underlay, addressed with the podCIDR's network address.
async fn bring_up_vxlan(
    cfg: &Section,
    kernel: &OverlayKernel,
    underlay: &Underlay,
    mtu: u32,
    (own_cidr, own_cidr6): (Cidr4, Option<Cidr6>),
) -> Result<VxlanSpec> {
    let existing_mac = kernel.link(&cfg.vxlan_name).await?.map(|l| l.mac);
    let mac = vtep_mac(&cfg.data_dir, existing_mac.as_deref())?;
    let vx = VxlanSpec {
        name: cfg.vxlan_name.clone(),
        vni: cfg.vni,
        port: cfg.vxlan_port,
        underlay_index: underlay.index,
        local_ip: underlay.ip,
        mtu,
        mac,
        address: own_cidr.network(),
        address6: own_cidr6.map(|c| c.network()),
    };
    if own_cidr6.is_some() {
        // A host whose `default.disable_ipv6` is 1 makes every new device
        // so, and the kernel then refuses the VTEP's IPv6 address: bring
        // the device up without it, turn IPv6 on for it alone, then add it.
        kernel
            .ensure_vxlan(&VxlanSpec {
                address6: None,
                ..vx.clone()
            })
            .await?;
        enable_ipv6(&cfg.proc_sys, &cfg.vxlan_name)?;
    }
    kernel.ensure_vxlan(&vx).await?;
    Ok(vx)
}

/// `vxlan6.1` over the IPv6 underlay: `vxlan.1`'s VNI and port, a VTEP
/// MAC of its own kept as stable as `vxlan.1`'s, `mtu` (what the IPv6
/// underlay carries, or the pods' on an IPv6-only node), and on an
/// IPv6-only node the IPv6 VTEP address (`address6`).
async fn bring_up_vxlan6(
    cfg: &Section,
    kernel: &OverlayKernel,
    u6: &Underlay6,
    mtu: u32,
    address6: Option<std::net::Ipv6Addr>,
) -> Result<Vxlan6Spec> {
    let existing_mac = kernel.link(&cfg.vxlan6_name).await?.map(|l| l.mac);
    let mac = stable_mac(&cfg.data_dir, "vtep-mac-v6", existing_mac.as_deref())?;
    let vx6 = Vxlan6Spec {
        name: cfg.vxlan6_name.clone(),
        vni: cfg.vni,
        port: cfg.vxlan_port,
        underlay_index: u6.index,
        local_ip: u6.ip,
        mtu,
        mac,
        address6,
    };
    tracing::info!(device = %vx6.name, underlay = %u6.name, host_ip6 = %u6.ip, vtep_mac = %mac, mtu = vx6.mtu, vtep6 = ?address6, "bringing the VXLAN device over IPv6 up");
    if address6.is_some() {
        // As for vxlan.1's IPv6 address (`bring_up_vxlan`): up without
        // it, IPv6 on for the device, then the address.
        kernel
            .ensure_vxlan6(&Vxlan6Spec {
                address6: None,
                ..vx6.clone()
            })
            .await?;
        enable_ipv6(&cfg.proc_sys, &cfg.vxlan6_name)?;
    }
    kernel.ensure_vxlan6(&vx6).await?;
    Ok(vx6)
}

/// `disable_ipv6` 0 on the device `name`, if it is not: a host whose
/// `default.disable_ipv6` is 1 makes every new device so, and the kernel
/// then refuses the VTEP's IPv6 address.
fn enable_ipv6(proc_sys: &Path, name: &str) -> Result<()> {
    // A path, not `set_sysctl`'s dotted key: the device name has a dot.
    let p = proc_sys.join(format!("net/ipv6/conf/{name}/disable_ipv6"));
    if std::fs::read_to_string(&p).is_ok_and(|v| v.trim() != "0") {
        std::fs::write(&p, "0").with_context(|| format!("writing 0 to {}", p.display()))?;
    }
    Ok(())
}

/// What VXLAN adds around a pod's packet over an IPv6 underlay: the outer
/// IPv6 header is 20 bytes longer than IPv4's (40 + 8 UDP + 8 VXLAN + 14
/// inner Ethernet), as flannel and Linux's own VXLAN MTU rules count.
pub(crate) const VXLAN6_OVERHEAD: u32 = VXLAN_OVERHEAD + 20;

/// The smallest MTU a link may have and carry IPv6 (RFC 8200): below it
/// the kernel takes IPv6 off the device, the VTEP's /128 with it.
const IPV6_MIN_MTU: u32 = 1280;

/// VXLAN's overhead over an underlay whose outer header is `local`'s
/// family.
pub(crate) fn vxlan_overhead(local: IpAddr) -> u32 {
    match local {
        IpAddr::V4(_) => VXLAN_OVERHEAD,
        IpAddr::V6(_) => VXLAN6_OVERHEAD,
    }
}

/// The MTU of vxlan.1 and the pods: the override, if the underlay can carry
/// it with VXLAN around it (a larger one would have the underlay drop or
/// fragment every full-size packet), else the most it can carry. Pods with
/// IPv6 (`ipv6`) need at least 1280. With a VXLAN device over IPv6 too
/// (`over_ipv6`), a pod's packet may leave through either, so it must fit
/// the one with the larger overhead.
fn overlay_mtu(want: Option<u32>, underlay: &Underlay, ipv6: bool, over_ipv6: bool) -> Result<u32> {
    let overhead = if over_ipv6 {
        VXLAN6_OVERHEAD
    } else {
        vxlan_overhead(IpAddr::V4(underlay.ip))
    };
    mtu_within(want, &underlay.name, underlay.mtu, overhead, ipv6)
}

/// [`overlay_mtu`] over the underlay `name` of MTU `underlay_mtu`, with
/// `overhead` bytes of VXLAN around each packet.
fn mtu_within(
    want: Option<u32>,
    name: &str,
    underlay_mtu: u32,
    overhead: u32,
    ipv6: bool,
) -> Result<u32> {
    let most = underlay_mtu.saturating_sub(overhead);
    let mtu = match want {
        None => most,
        Some(m) if m <= most => m,
        Some(m) => anyhow::bail!(
            "--mtu {m} ({}) is above what the underlay {name} carries with VXLAN: at most {most} ({underlay_mtu} less {overhead})",
            settings::MTU.source(),
        ),
    };
    if ipv6 && mtu < IPV6_MIN_MTU {
        anyhow::bail!(
            "the overlay MTU {mtu} (underlay {name} with {underlay_mtu} less {overhead}, or `mtu`) is below IPv6's minimum of {IPV6_MIN_MTU}: pods could not have IPv6",
        );
    }
    Ok(mtu)
}

/// The VTEP MAC: reused from the last run (data dir), else from an existing
/// device, else new. Stable across restarts and re-creation, so peers never
/// keep a stale MAC.
fn vtep_mac(data_dir: &Path, existing: Option<&[u8]>) -> Result<Mac> {
    stable_mac(data_dir, "vtep-mac", existing)
}

/// A device's MAC kept in `data_dir/name` (see [`vtep_mac`]).
fn stable_mac(data_dir: &Path, name: &str, existing: Option<&[u8]>) -> Result<Mac> {
    let file = data_dir.join(name);
    if let Ok(s) = std::fs::read_to_string(&file)
        && let Ok(m) = s.trim().parse::<Mac>()
    {
        return Ok(m);
    }
    let mac = match existing.and_then(|e| Mac::try_from(e).ok()) {
        Some(m) if m.is_unicast() => m,
        _ => {
            let mut m: [u8; 6] = rand::random();
            m[0] = (m[0] & 0xfe) | 0x02; // unicast, locally administered
            Mac(m)
        }
    };
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("creating {}", data_dir.display()))?;
    mycni_common::fs::write_atomic(&file, format!("{mac}\n").as_bytes())?;
    Ok(mac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_override_must_fit_the_underlay() {
        let u = Underlay {
            name: "eth0".into(),
            index: 2,
            ip: std::net::Ipv4Addr::new(192, 168, 1, 2),
            mtu: 1500,
            subnets: vec![],
        };
        assert_eq!(overlay_mtu(None, &u, false, false).ok(), Some(1450));
        // A VXLAN device over IPv6 beside: 20 bytes less for every pod.
        assert_eq!(overlay_mtu(None, &u, true, true).ok(), Some(1430));
        assert!(overlay_mtu(Some(1431), &u, true, true).is_err());
        assert_eq!(overlay_mtu(Some(1400), &u, false, false).ok(), Some(1400));
        assert_eq!(overlay_mtu(Some(1450), &u, true, false).ok(), Some(1450));
        let e = overlay_mtu(Some(1451), &u, false, false).map_err(|e| e.to_string());
        let e = e.expect_err("1451 over a 1500 underlay");
        assert!(
            e.contains("`mtu`") && e.contains("eth0") && e.contains("1450"),
            "{e}"
        );
        // IPv6 pods need 1280; IPv4 ones make do with less.
        assert_eq!(overlay_mtu(Some(1279), &u, false, false).ok(), Some(1279));
        let e = overlay_mtu(Some(1279), &u, true, false).map_err(|e| e.to_string());
        assert!(e.expect_err("1279 with IPv6").contains("1280"));
        let small = Underlay { mtu: 1300, ..u };
        assert!(
            overlay_mtu(None, &small, true, false).is_err(),
            "1250 with IPv6"
        );
    }

    #[test]
    fn an_ipv6_only_nodes_mtu_is_its_ipv6_underlays_less_70() {
        let mtu = |want, underlay| mtu_within(want, "eth0", underlay, VXLAN6_OVERHEAD, true);
        assert_eq!(mtu(None, 1500).ok(), Some(1430));
        assert_eq!(mtu(Some(1400), 1500).ok(), Some(1400));
        let e = mtu(Some(1431), 1500).map_err(|e| e.to_string());
        assert!(e.expect_err("1431").contains("at most 1430 (1500 less 70)"));
        // Its pods have IPv6 only: 1280 at least.
        assert!(mtu(None, 1349).is_err());
        assert_eq!(mtu(None, 1350).ok(), Some(1280));
    }

    #[test]
    fn an_ipv6_underlay_costs_20_bytes_more() {
        assert_eq!(vxlan_overhead("192.168.1.2".parse().expect("ip")), 50);
        assert_eq!(vxlan_overhead("2001:db8::2".parse().expect("ip")), 70);
    }
}
