//! IP address management: the built-in in-process IPAM (`mycni-ipam`), or
//! delegation to an IPAM plugin binary found on CNI_PATH (e.g. `host-local`).
//!
//! The built-in IPAM's leases: `store` is the API (open, allocate, release)
//! and `gc` the listing and GC, over `layout` (host-local's files and their
//! names), `lock` (one locked call: the directory fd, the `flock`, naming a
//! new lease), `lease` (what a lease file says), `dirfd` (the `*at` syscalls)
//! and `range` (the addresses a config allows); all of them return `error`'s
//! `StoreError`, which imports none of them. `conf` reads its config section,
//! one range set per family (a pod gets one address of each, primary family
//! first). `delegate` runs an IPAM plugin in the highest CNI version both
//! sides speak (`delegate/cache.rs`: what a binary speaks, remembered).
//! `tests` holds the tests of all of these.

mod conf;
mod delegate;
mod dirfd;
mod error;
mod gc;
mod layout;
mod lease;
mod lock;
pub mod range;
pub mod store;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::net::IpAddr;
use std::path::PathBuf;

use mycni_common::net::{Cidr, Family};
use serde_json::Value;

use crate::config::{Env, NetConf};
use crate::error::{CniError, Code, Result};
use crate::types::{CniResult, IpConfig};
use delegate::Delegate;
use store::{LeaseStore, Pool, Range};

/// `ipam.type` of the built-in IPAM, as the agent's conflist names it.
pub use mycni_common::contract::BUILTIN_IPAM_TYPE as BUILTIN_TYPE;
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/networks";

/// The ranges of one family an address is leased from, and the gateways of those ranges,
/// which are never leased (as in host-local).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeSet {
    pub ranges: Vec<Range>,
    pub gateways: Vec<IpAddr>,
}

impl RangeSet {
    pub fn is_ipv4(&self) -> bool {
        self.ranges.first().is_some_and(Range::is_ipv4)
    }
}

#[derive(Debug)]
pub struct Builtin {
    /// One set per family, primary family first: each pod gets one address of each.
    pub sets: Vec<RangeSet>,
    pub data_dir: PathBuf,
}

fn bad(msg: impl Into<String>) -> CniError {
    CniError::new(Code::InvalidConfig, msg)
}

fn family(ip: IpAddr) -> &'static str {
    if ip.is_ipv4() { "IPv4" } else { "IPv6" }
}

impl Builtin {
    fn store(&self, network: &str) -> Result<LeaseStore> {
        LeaseStore::open(&self.data_dir, network).map_err(store_err)
    }

    /// One address of each range set, in the sets' order. All or nothing: an address
    /// leased before a later set fails is released again.
    pub fn add(&self, network: &str, container_id: &str, ifname: &str) -> Result<Vec<Cidr>> {
        let store = self.store(network)?;
        let mut out: Vec<Cidr> = Vec::with_capacity(self.sets.len());
        for (i, set) in self.sets.iter().enumerate() {
            let got = store
                .allocate_in(
                    Pool {
                        set: i,
                        ranges: &set.ranges,
                        reserved: &set.gateways,
                    },
                    container_id,
                    ifname,
                )
                .map_err(store_err)
                .and_then(|ip| {
                    let prefix = set
                        .ranges
                        .iter()
                        .find(|r| r.contains(ip))
                        .map_or(ip.max_prefix(), |r| r.prefix);
                    Cidr::new(ip, prefix).ok_or_else(|| {
                        CniError::new(Code::Ipam, format!("{ip}/{prefix} is not a CIDR"))
                    })
                });
            match got {
                Ok(c) => out.push(c),
                Err(e) => {
                    let leased: Vec<IpAddr> = out.iter().map(|c| c.addr()).collect();
                    if !leased.is_empty()
                        && let Err(r) = store.release_all(container_id, ifname, &leased)
                    {
                        crate::log::warn(&format!("releasing {leased:?} after a failed ADD: {r}"));
                    }
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    /// `hints`: the addresses prevResult lists; used only when there is one per range
    /// set, i.e. when they can be all the container holds.
    pub fn del(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
        hints: &[IpAddr],
    ) -> Result<Vec<IpAddr>> {
        let hints = if hints.len() == self.sets.len() {
            hints
        } else {
            &[]
        };
        self.store(network)?
            .release_all(container_id, ifname, hints)
            .map_err(store_err)
    }

    pub fn holds(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
        ip: IpAddr,
    ) -> Result<bool> {
        Ok(self
            .store(network)?
            .leases()
            .map_err(store_err)?
            .iter()
            .any(|l| {
                l.ip == ip
                    && l.container_id == container_id
                    && (l.ifname == ifname || l.ifname.is_empty())
            }))
    }

    pub fn gc(&self, network: &str, keep: &HashSet<(String, String)>) -> Result<Vec<store::Lease>> {
        self.store(network)?.gc(keep).map_err(store_err)
    }

    /// STATUS: the lease directory must be usable, else no pod can start.
    pub fn status(&self, network: &str) -> Result<()> {
        self.store(network).map(|_| ()).map_err(|e| {
            CniError::new(
                Code::NotAvailable,
                format!("built-in IPAM cannot use its lease directory: {}", e.msg),
            )
        })
    }
}

fn store_err(e: store::StoreError) -> CniError {
    let code = match e {
        store::StoreError::Exhausted { .. } => Code::RangeExhausted,
        store::StoreError::BadNetworkName(_) => Code::InvalidConfig,
        _ => Code::Io,
    };
    CniError::new(code, e.to_string())
}

/// The IPAM a config selects.
pub enum Ipam {
    Builtin(Builtin),
    Delegate(Delegate),
}

impl Ipam {
    pub fn select(conf: &NetConf, env: &Env) -> Result<Self> {
        let ty = conf.require_ipam()?;
        if ty == BUILTIN_TYPE {
            let ipam = conf.ipam.as_ref().ok_or_else(|| bad("no ipam section"))?;
            return Ok(Ipam::Builtin(Builtin::from_conf(ipam)?));
        }
        Ok(Ipam::Delegate(Delegate::new(
            delegate::find_plugin(&env.path, ty)?,
            conf.state_dir(),
        )))
    }

    /// ADD: the pod's addresses, at most one per family, primary family first (the
    /// config's first range set; a delegate answers in the order of its sets too).
    pub fn add(&self, conf: &NetConf, env: &Env) -> Result<Vec<IpConfig>> {
        self.start_add(conf, env)?.finish()
    }

    /// [`Ipam::add`], started: the built-in IPAM leases at once, a delegate is started
    /// and left running (a process of its own) until [`PendingAdd::finish`], so the
    /// caller can do work meanwhile that does not need the addresses.
    pub fn start_add<'a>(&'a self, conf: &'a NetConf, env: &Env) -> Result<PendingAdd<'a>> {
        Ok(match self {
            Ipam::Builtin(b) => PendingAdd::Leased(
                b.add(&conf.name, &env.container_id, &env.ifname)?
                    .into_iter()
                    .map(|address| IpConfig {
                        address,
                        gateway: None,
                        interface: None,
                    })
                    .collect(),
            ),
            Ipam::Delegate(d) => PendingAdd::Delegated {
                delegate: d,
                conf,
                pending: d.start("ADD", conf)?,
            },
        })
    }

    /// DEL: release whatever the container holds; idempotent. `hints`: the addresses
    /// prevResult lists.
    pub fn del(&self, conf: &NetConf, env: &Env, hints: &[IpAddr]) -> Result<()> {
        match self {
            Ipam::Builtin(b) => b
                .del(&conf.name, &env.container_id, &env.ifname, hints)
                .map(|_| ()),
            Ipam::Delegate(d) => d.exec("DEL", conf).map(|_| ()),
        }
    }

    pub fn check(&self, conf: &NetConf, env: &Env, ips: &[IpAddr]) -> Result<()> {
        match self {
            Ipam::Builtin(b) => {
                for &ip in ips {
                    if !b.holds(&conf.name, &env.container_id, &env.ifname, ip)? {
                        return Err(CniError::new(
                            Code::CheckFailed,
                            format!(
                                "no lease for {ip} held by this container in the built-in IPAM"
                            ),
                        ));
                    }
                }
                if ips.len() != b.sets.len() {
                    return Err(CniError::new(
                        Code::CheckFailed,
                        format!(
                            "prevResult has {} addresses; the built-in IPAM's config gives {}",
                            ips.len(),
                            b.sets.len()
                        ),
                    ));
                }
                Ok(())
            }
            Ipam::Delegate(d) => d.exec("CHECK", conf).map(|_| ()),
        }
    }

    pub fn status(&self, conf: &NetConf) -> Result<()> {
        match self {
            Ipam::Builtin(b) => b.status(&conf.name),
            Ipam::Delegate(d) => d.exec("STATUS", conf).map(|_| ()),
        }
    }

    pub fn gc(&self, conf: &NetConf, keep: &HashSet<(String, String)>) -> Result<()> {
        match self {
            Ipam::Builtin(b) => b.gc(&conf.name, keep).map(|_| ()),
            Ipam::Delegate(d) => d.exec("GC", conf).map(|_| ()),
        }
    }
}

/// An ADD started by [`Ipam::start_add`].
#[must_use = "a started ADD must be finished: it may hold a lease"]
pub enum PendingAdd<'a> {
    Leased(Vec<IpConfig>),
    Delegated {
        delegate: &'a Delegate,
        conf: &'a NetConf,
        pending: delegate::Pending<'a>,
    },
}

impl PendingAdd<'_> {
    /// The addresses leased. A delegate's answer that gives none the plugin can use
    /// is released again before the error is returned.
    pub fn finish(self) -> Result<Vec<IpConfig>> {
        match self {
            PendingAdd::Leased(ips) => Ok(ips),
            PendingAdd::Delegated {
                delegate,
                conf,
                pending,
            } => {
                let out = pending.finish()?.unwrap_or_default();
                let ips = delegated_ips(&delegate.name(), &out);
                if ips.is_err() {
                    // The delegate leased what it answered with: give it back, or it
                    // leaks (its DEL is idempotent, whatever it holds).
                    if let Err(e) = delegate.exec("DEL", conf) {
                        crate::log::warn(&format!("releasing the delegate's lease: {e}"));
                    }
                }
                ips
            }
        }
    }
}

/// The addresses of a delegate's ADD result: at least one, at most one per family.
fn delegated_ips(name: &str, out: &[u8]) -> Result<Vec<IpConfig>> {
    let v: Value = serde_json::from_slice(out).map_err(|e| {
        CniError::new(
            Code::Ipam,
            format!("IPAM plugin {name} returned invalid JSON: {e}"),
        )
    })?;
    // Read in whichever version it answered in; the caller renders the pod's result in
    // the runtime's version.
    let ips = CniResult::from_json(&v)?.ips;
    if ips.is_empty() {
        return Err(CniError::new(
            Code::Ipam,
            format!("IPAM plugin {name} returned no address"),
        ));
    }
    for (i, a) in ips.iter().enumerate() {
        if ips[..i]
            .iter()
            .any(|b| b.address.addr().is_ipv4() == a.address.addr().is_ipv4())
        {
            return Err(CniError::new(
                Code::Ipam,
                format!(
                    "IPAM plugin {name} returned two {} addresses; mycni gives a pod one \
                     address per family (one range set per family in `ranges`)",
                    family(a.address.addr())
                ),
            ));
        }
    }
    Ok(ips)
}
