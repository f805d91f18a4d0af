//! The plugin's side of the shared netlink layer (`mycni_common::netlink`):
//! its errors as CNI errors, the routes it installs, and the sysctls it sets.

use std::net::Ipv4Addr;

use mycni_common::net::Cidr;
pub use mycni_common::netlink::{Link, Netlink, Route};

use crate::error::{CniError, Code, Result, kernel};

pub use mycni_common::contract::RTPROT_MYCNI_PLUGIN;
/// The pod's gateway, answered by proxy ARP / a static neighbour on the host veth.
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);

/// Every netlink failure is a kernel failure for the runtime; the message
/// says which step failed on what, and the kernel's reason.
impl From<mycni_common::netlink::Error> for CniError {
    fn from(e: mycni_common::netlink::Error) -> Self {
        kernel(e.op(), e.cause())
    }
}

/// `ip/prefix`, for the prefixes the plugin writes (0 and 32), which are
/// always valid for IPv4.
pub fn cidr(ip: Ipv4Addr, prefix: u8) -> Result<Cidr<Ipv4Addr>> {
    Cidr::new(ip, prefix)
        .ok_or_else(|| CniError::new(Code::Kernel, format!("{ip}/{prefix} is not a CIDR")))
}

/// `dst [via gw] dev oif` with the plugin's protocol, scope link when there
/// is no gateway, `onlink` with one (the gateway is on no subnet of the pod).
pub fn plugin_route(dst: Cidr<Ipv4Addr>, gw: Option<Ipv4Addr>, oif: u32) -> Route {
    Route {
        dst,
        gateway: gw,
        oif: Some(oif),
        protocol: RTPROT_MYCNI_PLUGIN,
        onlink: gw.is_some(),
    }
}

/// Reads a sysctl of the calling thread's namespace.
pub fn read_sysctl(path: &str) -> Result<String> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|e| CniError::new(Code::Io, format!("reading {path}: {e}")))
}

pub fn write_sysctl(path: &str, value: &str) -> Result<()> {
    std::fs::write(path, value)
        .map_err(|e| CniError::new(Code::Kernel, format!("writing {value} to {path}: {e}")))
}
