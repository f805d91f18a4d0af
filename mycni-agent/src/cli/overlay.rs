//! `run`'s overlay and underlay flags: the cluster's ranges, the underlay
//! interfaces, the VXLAN devices, the MTU, direct routing and masquerade.

use clap::Args;
use mycni_agent::settings::{CLUSTER_CIDR, DIRECT_ROUTING, MASQUERADE, MTU, UNDERLAY, UNDERLAY6};
use mycni_agent::topology::{Underlay6Select, UnderlaySelect};
use mycni_common::contract::{
    DEFAULT_VNI, DEFAULT_VXLAN_DEVICE, DEFAULT_VXLAN_PORT, DEFAULT_VXLAN6_DEVICE,
};
use mycni_common::net::{Cidr4, Cidr6, ClusterCidrs};

use super::order::Order;
use super::values::parse_bool;

#[derive(Args, Clone)]
pub(super) struct OverlayArgs {
    /// The cluster's pod CIDRs (kube-controller-manager --cluster-cidr):
    /// an IPv4 one, an IPv6 one, or both after a comma
    /// (`10.244.0.0/16,fd00:10:244::/56`). Without an IPv6 one the agent
    /// ignores IPv6 podCIDRs; with an IPv6 one alone the cluster is
    /// IPv6-only: no vxlan.1, every peer over vxlan6.1.
    #[arg(long = CLUSTER_CIDR.flag, env = CLUSTER_CIDR.env, default_value = "10.244.0.0/16", value_parser = parse_cidr, display_order = Order::ClusterCidr as usize)]
    pub cluster_cidr: ClusterCidrs,
    /// The underlay interface: a name (`eth0`), `interface=<glob>` (the
    /// first interface whose name matches and has an IPv4 address),
    /// `can-reach=<address>` (the interface of the route to that address), or
    /// `default-route` (the default: the interface of the default route).
    /// In an IPv6-only cluster the same forms go by IPv6 routes and
    /// addresses (the IPv6 default route; an IPv6 can-reach address).
    #[arg(long = UNDERLAY.flag, env = UNDERLAY.env, default_value = "default-route", value_parser = parse_underlay, display_order = Order::Iface as usize)]
    pub iface: UnderlaySelect,
    /// The overlay MTU (vxlan.1 and the pods' eth0), or `auto`: the
    /// underlay's MTU less the 50 bytes of VXLAN.
    #[arg(long = MTU.flag, env = MTU.env, default_value = "auto", value_parser = parse_mtu, display_order = Order::Mtu as usize)]
    pub mtu: MtuSetting,
    #[arg(long, default_value = DEFAULT_VXLAN_DEVICE, display_order = Order::VxlanName as usize)]
    pub vxlan_name: String,
    /// The VXLAN device over the IPv6 underlay, for peers reached over
    /// IPv6 only.
    #[arg(long, default_value = DEFAULT_VXLAN6_DEVICE, display_order = Order::Vxlan6Name as usize)]
    pub vxlan6_name: String,
    /// Which IPv6 address of the underlay interface the VXLAN device over
    /// IPv6 sends from: `auto` (its first global or unique-local address;
    /// without one there is no such device), `off`, or one address. Only on
    /// a node with an IPv6 podCIDR in a cluster with an IPv6 range; in an
    /// IPv6-only cluster that device is the node's only one, and `off` an
    /// error.
    #[arg(long = UNDERLAY6.flag, env = UNDERLAY6.env, default_value = "auto", value_parser = parse_underlay6, display_order = Order::Underlay6 as usize)]
    pub underlay6: Underlay6Select,
    #[arg(long, default_value_t = DEFAULT_VNI, display_order = Order::Vni as usize)]
    pub vni: u32,
    #[arg(long, default_value_t = DEFAULT_VXLAN_PORT, display_order = Order::VxlanPort as usize)]
    pub vxlan_port: u16,
    /// SNAT pod traffic leaving the cluster CIDR (nftables table `ip mycni`).
    #[arg(long = MASQUERADE.flag, env = MASQUERADE.env, default_value_t = true, action = clap::ArgAction::Set, value_parser = parse_masquerade, display_order = Order::Masquerade as usize)]
    pub masquerade: bool,
    /// Route peers whose host IP is on one of the underlay's own subnets
    /// (one L2 segment) straight to that host, without VXLAN: `podCIDR via
    /// <host IP>` on the underlay (flannel's DirectRouting, Calico's
    /// CrossSubnet). Peers elsewhere still go through VXLAN.
    #[arg(long = DIRECT_ROUTING.flag, env = DIRECT_ROUTING.env, default_value_t = false, action = clap::ArgAction::Set, value_parser = parse_direct_routing, display_order = Order::DirectRouting as usize)]
    pub direct_routing: bool,
}

/// `--mtu`: None is `auto`.
#[derive(Debug, Clone, Copy)]
pub(super) struct MtuSetting(pub Option<u32>);

/// At most one IPv4 and one IPv6 CIDR, at least one of them,
/// comma-separated, in either order, as kube-controller-manager's
/// `--cluster-cidr` takes them. Each is read by mycni-common's one CIDR
/// parser, as a network (no host bits).
fn parse_cidr(s: &str) -> Result<ClusterCidrs, String> {
    let (mut v4, mut v6) = (None, None);
    let mut r = Ok(());
    for part in s.split(',').map(str::trim) {
        if part.contains(':') {
            match Cidr6::parse_network(part) {
                Ok(c) if v6.is_none() => v6 = Some(c),
                Ok(_) => r = Err(format!("{s:?} has more than one IPv6 CIDR")),
                Err(_) => {
                    r = Err(format!(
                        "{part:?} is not an IPv6 CIDR like fd00:10:244::/56"
                    ))
                }
            }
        } else {
            match Cidr4::parse_network(part) {
                Ok(c) if v4.is_none() => v4 = Some(c),
                Ok(_) => r = Err(format!("{s:?} has more than one IPv4 CIDR")),
                Err(_) => r = Err(format!("{part:?} is not an IPv4 CIDR like 10.244.0.0/16")),
            }
        }
    }
    let r = r.and_then(|()| {
        ClusterCidrs::new(v4, v6).map_err(|_| format!("{s:?} has no CIDR of either family"))
    });
    CLUSTER_CIDR.check(r)
}

fn parse_underlay6(s: &str) -> Result<Underlay6Select, String> {
    UNDERLAY6.check(s.parse())
}

fn parse_underlay(s: &str) -> Result<UnderlaySelect, String> {
    UNDERLAY.check(s.parse())
}

/// The smallest datagram every IPv4 host must accept (RFC 791), and the
/// largest that fits an IPv4 packet with the VXLAN headers around it.
const MTU_RANGE: std::ops::RangeInclusive<u32> = 576..=65485;

fn parse_mtu(s: &str) -> Result<MtuSetting, String> {
    let v = match s.trim() {
        "" | "auto" => Ok(MtuSetting(None)),
        n => match n.parse::<u32>() {
            Ok(m) if MTU_RANGE.contains(&m) => Ok(MtuSetting(Some(m))),
            _ => Err(format!(
                "{s:?} is not an MTU: `auto` or a number from {} to {}",
                MTU_RANGE.start(),
                MTU_RANGE.end()
            )),
        },
    };
    MTU.check(v)
}

fn parse_masquerade(s: &str) -> Result<bool, String> {
    MASQUERADE.check(parse_bool(s))
}

fn parse_direct_routing(s: &str) -> Result<bool, String> {
    DIRECT_ROUTING.check(parse_bool(s))
}
