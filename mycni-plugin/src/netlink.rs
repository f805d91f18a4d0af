//! The plugin's side of the shared netlink layer (`mycni_common::netlink`):
//! its errors as CNI errors, the routes it installs, the gateways, and the
//! sysctls it sets (in its own namespace and in the pod's).

use std::fs::File;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;

use mycni_common::net::{Cidr, Family};
pub use mycni_common::netlink::{Link, Netlink, Route, RouteFamily};

use crate::error::{CniError, Code, Result, kernel};

pub use mycni_common::contract::RTPROT_MYCNI_PLUGIN;
/// The pod's gateway, answered by proxy ARP / a static neighbour on the host veth.
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
/// The pod's IPv6 gateway, the twin of [`GATEWAY`]: one fixed link-local
/// address for every pod (as Calico has one), so results, routes and
/// CHECK never depend on a host veth's random MAC. The pod reaches it
/// through a permanent neighbour entry to the host veth's MAC; the host
/// veth also holds it (nodad), so it answers the pod's neighbour
/// solicitations after the entry was flushed, as proxy ARP does for IPv4.
/// A pod's own link-local address is EUI-64 (`ff:fe` in the middle), never
/// this one.
pub const GATEWAY_V6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);
/// The prefix [`GATEWAY_V6`] has on the host veth: the link-local one.
pub const GATEWAY_V6_PREFIX: u8 = 64;

/// Every netlink failure is a kernel failure for the runtime; the message
/// says which step failed on what, and the kernel's reason.
impl From<mycni_common::netlink::Error> for CniError {
    fn from(e: mycni_common::netlink::Error) -> Self {
        kernel(e.op(), e.cause())
    }
}

/// `ip/prefix`, for the prefixes the plugin writes (0, the family's full
/// length, 64 for the link-local gateway), which are always valid.
pub fn cidr<A: Family>(ip: A, prefix: u8) -> Result<Cidr<A>> {
    Cidr::new(ip, prefix)
        .ok_or_else(|| CniError::new(Code::Kernel, format!("{ip}/{prefix} is not a CIDR")))
}

/// `dst [via gw] dev oif` with the plugin's protocol, scope link when there
/// is no gateway, `onlink` with one (the gateway is on no subnet of the
/// pod; for IPv6 the link-local route may not be there yet either).
pub fn plugin_route<A: RouteFamily>(dst: Cidr<A>, gw: Option<A>, oif: u32) -> Route<A> {
    Route {
        dst,
        gateway: gw,
        oif: Some(oif),
        protocol: RTPROT_MYCNI_PLUGIN,
        onlink: gw.is_some(),
    }
}

/// Reads a sysctl of the calling thread's namespace: open, one read,
/// close (the values the plugin reads are a few bytes; `read_to_string`
/// would also stat the file and read again to find its end).
pub fn read_sysctl(path: &str) -> Result<String> {
    let err = |e: std::io::Error| CniError::new(Code::Io, format!("reading {path}: {e}"));
    let mut buf = [0u8; 64];
    let n = File::open(path)
        .and_then(|mut f| f.read(&mut buf))
        .map_err(err)?;
    Ok(String::from_utf8_lossy(&buf[..n]).trim().to_string())
}

/// Writes a sysctl of the calling thread's namespace. Opened without
/// O_CREAT and O_TRUNC (`fs::write` asks for both, which procfs ignores
/// only after the slower lookup they cost).
pub fn write_sysctl(path: &str, value: &str) -> Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut f| f.write_all(value.as_bytes()))
        .map_err(|e| CniError::new(Code::Kernel, format!("writing {value} to {path}: {e}")))
}

/// `/proc/sys/net/ipv6/conf/<ifname>/<key>`.
pub fn ipv6_conf(ifname: &str, key: &str) -> String {
    format!("/proc/sys/net/ipv6/conf/{ifname}/{key}")
}

/// Runs `f` on this thread after it entered the namespace `netns`, and
/// brings the thread back before returning (also when `f` fails or
/// panics): `/proc/sys/net` shows the namespace of the thread that reads
/// it, IPv6 interface settings have no netlink attribute to set them with,
/// and a netlink socket belongs to the namespace it was made in. `f` is
/// synchronous, so nothing else runs on the thread meanwhile (the plugin's
/// tokio runtime is current-thread: no task is polled until `f` returns).
///
/// On the thread that runs ADD, not a thread of its own: a new thread
/// costs its creation and, worse, a wakeup on the other CPU that the
/// plugin waits for. The short-lived thread that made the pod's socket
/// was 0.6 ms of ADD's 2.5 ms median on a quiet 2-CPU VM (`cargo xtask
/// bench plugin`), and its start alone waited 1.5 to 6 ms in traces taken
/// while the machine was busy; two setns(2) calls cost microseconds.
pub fn in_netns<T>(netns: &File, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let home = File::open("/proc/thread-self/ns/net").map_err(|e| {
        CniError::new(
            Code::Kernel,
            format!("opening this thread's network namespace: {e}"),
        )
    })?;
    enter(netns).map_err(|e| {
        CniError::new(
            Code::Kernel,
            format!("entering the container's network namespace: {e}"),
        )
    })?;
    let _back = Back(home);
    f()
}

fn enter(netns: &File) -> std::io::Result<()> {
    // SAFETY: setns(2) with a descriptor borrowed for the call; it moves
    // only the calling thread.
    if unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The namespace [`in_netns`] came from, entered again on drop.
struct Back(File);

impl Drop for Back {
    fn drop(&mut self) {
        if let Err(e) = enter(&self.0) {
            // Going on would make the host's interfaces, routes and
            // leases in the pod's namespace. It cannot happen short of
            // the kernel refusing a namespace this thread was just in;
            // should it, a runtime treats the dead plugin as a failed
            // ADD and its DEL cleans up what this one made.
            crate::log::error(&format!(
                "cannot return to the host's network namespace: {e}"
            ));
            std::process::abort();
        }
    }
}

/// A netlink connection in the namespace `netns`: its socket made by this
/// thread inside it (see [`in_netns`]). Must be called inside a tokio
/// runtime.
pub fn netlink_in(netns: &File) -> Result<Netlink> {
    in_netns(netns, || Ok(Netlink::current()?))
}

/// [`netlink_in`] with its batch socket made there too (ADD's changes go
/// as one batch per namespace).
pub fn netlink_with_batches_in(netns: &File) -> Result<Netlink> {
    in_netns(netns, || Ok(Netlink::current_with_batches()?))
}
