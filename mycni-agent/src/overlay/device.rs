//! The VXLAN devices: `vxlan.1` over the IPv4 underlay, `vxlan6.1` over
//! the IPv6 one, created or adopted and corrected, with the node's VTEP
//! addresses on them.

use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::Ordering;

use mycni_common::net::{Cidr, Cidr4, Mac};
use mycni_common::netlink::{Link, VxlanConfig};

use crate::kernel::KernelError;

use super::kernel::OverlayKernel;
use crate::topology::{Vxlan6Spec, VxlanSpec};

/// A VXLAN device as both families share it.
struct DeviceSpec<'a> {
    name: &'a str,
    vni: u32,
    port: u16,
    underlay_index: u32,
    local: IpAddr,
    mtu: u32,
    mac: Mac,
}

/// The [`DeviceSpec`] of a [`VxlanSpec`] or a [`Vxlan6Spec`], whose
/// fields are named alike.
macro_rules! device_of {
    ($spec:expr) => {
        DeviceSpec {
            name: &$spec.name,
            vni: $spec.vni,
            port: $spec.port,
            underlay_index: $spec.underlay_index,
            local: $spec.local_ip.into(),
            mtu: $spec.mtu,
            mac: $spec.mac,
        }
    };
}

impl OverlayKernel {
    /// Creates the VXLAN device, or adopts an existing one and corrects what
    /// differs. Attributes the kernel cannot change in place (VNI, port,
    /// local IP, underlay, learning) mean delete and recreate, with the same
    /// MAC so peers' entries stay valid. Returns the index and whether it
    /// was (re)created.
    pub async fn ensure_vxlan(&self, spec: &VxlanSpec) -> Result<(u32, bool), KernelError> {
        let (index, created) = self.ensure_vxlan_device(&device_of!(spec)).await?;
        let address = Cidr4::new(spec.address, 32)
            .ok_or_else(|| KernelError::Other(format!("{}/32 is not a CIDR", spec.address)))?;
        if !self.nl.ipv4_addresses(index).await?.contains(&address) {
            match self.nl.add_address(index, address).await {
                Err(e) if !e.is_exists() => return Err(e.into()),
                _ => {}
            }
        }
        if let Some(a6) = spec.address6 {
            self.ensure_vtep6(index, &spec.name, a6).await?;
        }
        Ok((index, created))
    }

    /// The IPv6 VTEP address `a6` as the one global address of the VXLAN
    /// device `index`.
    async fn ensure_vtep6(&self, index: u32, name: &str, a6: Ipv6Addr) -> Result<(), KernelError> {
        // No DAD: the address is this node's alone on a link that has
        // no other member to ask, and DAD would hold it tentative (not
        // usable as a source) for a second or more.
        let address6 = Cidr::<Ipv6Addr>::new(a6, 128)
            .ok_or_else(|| KernelError::Other(format!("{a6}/128 is not a CIDR")))?;
        let have = self.nl.ipv6_addresses(index).await?;
        if !have.iter().any(|a| a.cidr == address6) {
            match self.nl.add_ipv6_address_nodad(index, address6).await {
                Err(e) if !e.is_exists() => return Err(e.into()),
                _ => {}
            }
        }
        // An IPv6 VTEP address of an earlier podCIDR: left, it would
        // make that range's new owner's VTEP a local address here, and
        // the kernel refuses a route through a local gateway.
        for a in have {
            if a.cidr != address6 && !a.cidr.addr().is_unicast_link_local() {
                tracing::info!(device = %name, address = %a.cidr, "removing a stale IPv6 VTEP address");
                self.nl.delete_address(index, a.cidr).await?;
            }
        }
        Ok(())
    }

    /// The device part of [`OverlayKernel::ensure_vxlan`] and
    /// [`OverlayKernel::ensure_vxlan6`]: created, or adopted and corrected.
    async fn ensure_vxlan_device(&self, spec: &DeviceSpec<'_>) -> Result<(u32, bool), KernelError> {
        let existing = self.link(spec.name).await?;
        let mut created = false;
        let index = match existing {
            Some(l) if device_matches(&l, spec) => l.index,
            other => {
                if let Some(l) = other {
                    tracing::warn!(device = %spec.name, "existing device differs from the wanted VXLAN setup; recreating it");
                    self.nl.delete_link(l.index).await?;
                }
                self.nl
                    .create_vxlan(&VxlanConfig {
                        name: spec.name,
                        vni: spec.vni,
                        dev: spec.underlay_index,
                        local: spec.local,
                        port: spec.port,
                        learning: false,
                        // No outer UDP checksum over IPv4 (the IPv4 default,
                        // made explicit): the tc encapsulation sends none
                        // either, and both paths must put the same bytes on
                        // the wire. Over IPv6 the attribute means nothing:
                        // the kernel sends the checksum IPv6 requires
                        // (RFC 8200 8.1) unless udp6zerocsumtx is set.
                        udp_csum: false,
                        mtu: spec.mtu,
                        mac: spec.mac,
                    })
                    .await?;
                created = true;
                self.link(spec.name)
                    .await?
                    .ok_or_else(|| {
                        KernelError::Other(format!("{} vanished after creation", spec.name))
                    })?
                    .index
            }
        };
        let l = self
            .nl
            .link_by_index(index)
            .await?
            .ok_or_else(|| KernelError::Other(format!("{} vanished", spec.name)))?;
        if l.mac != spec.mac.0 || l.mtu != spec.mtu || !l.up {
            self.nl
                .set_mac_mtu_and_up(index, spec.mac, spec.mtu)
                .await?;
        }
        Ok((index, created))
    }

    /// Creates `vxlan6.1`, the VXLAN device over the IPv6 underlay, or
    /// adopts an existing one and corrects what differs, as
    /// [`OverlayKernel::ensure_vxlan`] does for `vxlan.1`. Routes through it name
    /// their gateway `onlink`; it carries the node's IPv6 VTEP address
    /// only where there is no `vxlan.1` to hold it (`address6`).
    pub(crate) async fn ensure_vxlan6(
        &self,
        spec: &Vxlan6Spec,
    ) -> Result<(u32, bool), KernelError> {
        let r = self.ensure_vxlan_device(&device_of!(spec)).await?;
        self.vxlan6_index.store(r.0, Ordering::Relaxed);
        if let Some(a6) = spec.address6 {
            self.ensure_vtep6(r.0, &spec.name, a6).await?;
        }
        Ok(r)
    }
}

fn device_matches(l: &Link, spec: &DeviceSpec<'_>) -> bool {
    let Some(v) = &l.vxlan else {
        return false;
    };
    let local = match spec.local {
        IpAddr::V4(a) => v.local == Some(a) && v.local6.is_none(),
        IpAddr::V6(a) => v.local6 == Some(a) && v.local.is_none(),
    };
    v.vni == Some(spec.vni)
        && local
        && v.port == Some(spec.port)
        && v.learning == Some(false)
        && v.dev == Some(spec.underlay_index)
        && v.udp_csum != Some(true)
}
