//! Polls a node's overlay from inside its namespace, through the shared
//! netlink layer: dumps the kernel filters (only their length is kept) and
//! single-entry gets, so polling stays cheap next to the agent it measures.

use std::fs::File;
use std::net::Ipv4Addr;
use std::path::Path;

use anyhow::{Context, Result};
use mycni_common::net::Mac;
use mycni_common::netlink::{self, Netlink};

pub struct Overlay {
    rt: tokio::runtime::Runtime,
    nl: Netlink,
}

/// The length of a dump; None when the kernel kept reporting it
/// interrupted by concurrent changes, so the count may be off.
fn count<T>(dump: netlink::Result<Vec<T>>) -> Result<Option<usize>> {
    match dump {
        Ok(v) => Ok(Some(v.len())),
        Err(e) if e.is_interrupted() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

impl Overlay {
    /// A connection inside the named namespace (`ip netns`), from this
    /// thread, which stays where it is.
    pub fn open(ns: &str) -> Result<Self> {
        let path = Path::new("/run/netns").join(ns);
        let f = File::open(&path).with_context(|| format!("open {}", path.display()))?;
        // One thread is enough: each poll waits for its answer anyway.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()?;
        let nl = rt.block_on(async { Netlink::in_netns(&f) })?;
        Ok(Self { rt, nl })
    }

    /// The ifindex of the link `name`.
    pub fn ifindex(&self, name: &str) -> Result<u32> {
        let link = self.rt.block_on(self.nl.link_by_name(name))?;
        Ok(link.with_context(|| format!("no {name}"))?.index)
    }

    /// IPv4 routes with protocol `proto` (all tables).
    pub fn count_routes(&self, proto: u8) -> Result<Option<usize>> {
        count(self.rt.block_on(self.nl.routes_by_protocol(proto)))
    }

    /// Permanent IPv4 neighbours on `ifindex`.
    pub fn count_neighbours(&self, ifindex: u32) -> Result<Option<usize>> {
        count(self.rt.block_on(self.nl.permanent_neighbours(ifindex)))
    }

    /// Permanent `self` FDB entries on `ifindex`, the all-zeros one excluded.
    pub fn count_fdb(&self, ifindex: u32) -> Result<Option<usize>> {
        count(self.rt.block_on(self.nl.fdb_entries(ifindex)))
    }

    /// The MAC of the (permanent, as the agent sets them) neighbour `ip`
    /// on `ifindex`, if there is one.
    pub fn neighbour(&self, ifindex: u32, ip: Ipv4Addr) -> Result<Option<Mac>> {
        Ok(self.rt.block_on(self.nl.permanent_neighbour(ifindex, ip))?)
    }

    /// Whether the `self` FDB entry for `mac` exists on `ifindex`.
    pub fn has_fdb(&self, ifindex: u32, mac: Mac) -> Result<bool> {
        Ok(self.rt.block_on(self.nl.has_fdb_entry(ifindex, mac))?)
    }

    /// The host the `self` FDB entry for `mac` on `ifindex` sends to (a
    /// dump: the layer has no single-entry get that returns it).
    pub fn fdb_dst(&self, ifindex: u32, mac: Mac) -> Result<Option<Ipv4Addr>> {
        // One entry asked for, not a dump of all N: polled back to back,
        // a dump (1-2 ms of CPU at 5,000 peers) competed with the agent
        // it was timing.
        let e = self.rt.block_on(self.nl.fdb_entry(ifindex, mac))?;
        Ok(e.and_then(|e| e.dst))
    }

    /// Nexthops with protocol `proto`; Some(0) on a kernel without
    /// nexthop objects.
    pub fn count_nexthops(&self, proto: u8) -> Result<Option<usize>> {
        match self.rt.block_on(self.nl.nexthops_by_protocol(proto)) {
            Err(e) if e.errno() == Some(libc::EOPNOTSUPP) => Ok(Some(0)),
            other => count(other),
        }
    }

    /// The nexthops through `ifindex` (the kernel filters).
    pub fn nexthops_of_link(&self, ifindex: u32) -> Result<Vec<netlink::Nexthop>> {
        Ok(self.rt.block_on(self.nl.nexthops_of_link(ifindex))?)
    }
}
