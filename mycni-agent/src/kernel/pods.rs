//! The pods on this node, as the datapath reads them: the plugin's host
//! routes and marked veths. Not the overlay's: it never looks at pods.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use mycni_common::net::Mac;

use super::{Kernel, KernelError, RTPROT_MYCNI_PLUGIN, VethAlias};

/// Whether a link with this alias is a pod's host veth, made by the plugin.
pub fn is_pod_veth(alias: &str) -> bool {
    VethAlias::is_mycni(alias)
}

/// A pod on this node, as the fast path needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodEndpoint {
    /// The host-side veth.
    pub ifindex: u32,
    pub host_mac: Mac,
    /// The pod's eth0.
    pub pod_mac: Mac,
}

/// The pods on this node by address, per family (a dual-stack pod is in
/// both, with the same endpoint).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodEndpoints {
    pub v4: BTreeMap<Ipv4Addr, PodEndpoint>,
    pub v6: BTreeMap<Ipv6Addr, PodEndpoint>,
}

impl PodEndpoints {
    /// The pods' host veths (a dual-stack pod's once).
    pub fn veths(&self) -> std::collections::BTreeSet<u32> {
        self.v4
            .values()
            .chain(self.v6.values())
            .map(|p| p.ifindex)
            .collect()
    }
}

impl Kernel {
    /// The pods on this node as the kernel holds them: every /32 and /128
    /// host route the plugin installed, through a host veth the plugin
    /// marked, with the veth's MAC and the MAC of its peer (the pod's eth0),
    /// read through the peer's netns id. Entries the kernel cannot fully
    /// back are left out.
    pub(crate) async fn pod_endpoints(&self) -> Result<PodEndpoints, KernelError> {
        struct Veth {
            mac: Mac,
            peer: Option<(u32, i32)>,
        }
        let mut veths: BTreeMap<u32, Veth> = BTreeMap::new();
        for l in self.nl.links().await? {
            if !l.alias.as_deref().is_some_and(is_pod_veth) {
                continue;
            }
            if let Some(mac) = l.ethernet_mac() {
                veths.insert(
                    l.index,
                    Veth {
                        mac,
                        peer: l.peer_index.zip(l.peer_netns_id),
                    },
                );
            }
        }
        let pods4: Vec<(Ipv4Addr, u32)> = self
            .nl
            .routes_by_protocol(RTPROT_MYCNI_PLUGIN)
            .await?
            .into_iter()
            .filter(|r| r.dst.prefix() == 32)
            .filter_map(|r| Some((r.dst.addr(), r.oif?)))
            .collect();
        let pods6: Vec<(Ipv6Addr, u32)> = self
            .nl
            .ipv6_routes_by_protocol(RTPROT_MYCNI_PLUGIN)
            .await?
            .into_iter()
            .filter(|r| r.dst.prefix() == 128)
            .filter_map(|r| Some((r.dst.addr(), r.oif?)))
            .collect();
        // One look into the pod's netns per veth, whatever its families.
        let mut endpoints: BTreeMap<u32, Option<PodEndpoint>> = BTreeMap::new();
        for oif in pods4.iter().map(|p| p.1).chain(pods6.iter().map(|p| p.1)) {
            if endpoints.contains_key(&oif) {
                continue;
            }
            let Some(v) = veths.get(&oif) else { continue };
            let Some((peer, nsid)) = v.peer else { continue };
            // None: the pod's netns is going away, and so is the endpoint.
            let pod_mac = self
                .nl
                .link_in_peer_netns(nsid, peer)
                .await?
                .and_then(|l| l.ethernet_mac());
            endpoints.insert(
                oif,
                pod_mac.map(|pod_mac| PodEndpoint {
                    ifindex: oif,
                    host_mac: v.mac,
                    pod_mac,
                }),
            );
        }
        let of = |oif: &u32| endpoints.get(oif).copied().flatten();
        Ok(PodEndpoints {
            v4: pods4
                .iter()
                .filter_map(|(ip, oif)| Some((*ip, of(oif)?)))
                .collect(),
            v6: pods6
                .iter()
                .filter_map(|(ip, oif)| Some((*ip, of(oif)?)))
                .collect(),
        })
    }
}
