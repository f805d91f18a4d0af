//! IP address management: the built-in in-process IPAM (`mycni-ipam`), or
//! delegation to an IPAM plugin binary found on CNI_PATH (e.g. `host-local`).
//!
//! The built-in IPAM's leases: `store` is the API and the on-disk layout, over
//! `lock` (one locked call: the directory fd, the `flock`, naming a new
//! lease), `lease` (what a lease file says), `dirfd` (the `*at` syscalls) and
//! `range` (the addresses a config allows). `delegate` runs an IPAM plugin
//! in the highest CNI version both sides speak.

mod delegate;
mod dirfd;
mod lease;
mod lock;
pub mod range;
pub mod store;
#[cfg(test)]
mod testutil;

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::path::PathBuf;

use mycni_common::net::Cidr;
use serde::Deserialize;
use serde_json::Value;

use crate::config::{Env, NetConf};
use crate::error::{CniError, Code, Result};
use crate::types::{CniResult, IpConfig};
use delegate::Delegate;
use store::{LeaseStore, Range};

/// `ipam.type` of the built-in IPAM, as the agent's conflist names it.
pub use mycni_common::contract::BUILTIN_IPAM_TYPE as BUILTIN_TYPE;
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/networks";

/// The built-in IPAM's configuration. It also reads host-local's `ranges`
/// form (first range of the first set), so a host-local config can switch
/// type without being rewritten.
#[derive(Debug, Deserialize)]
struct BuiltinWire {
    subnet: Option<String>,
    #[serde(rename = "rangeStart")]
    range_start: Option<String>,
    #[serde(rename = "rangeEnd")]
    range_end: Option<String>,
    ranges: Option<Vec<Vec<RangeWire>>>,
    #[serde(rename = "dataDir")]
    data_dir: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RangeWire {
    subnet: String,
    #[serde(rename = "rangeStart")]
    range_start: Option<String>,
    #[serde(rename = "rangeEnd")]
    range_end: Option<String>,
}

#[derive(Debug)]
pub struct Builtin {
    pub range: Range,
    pub data_dir: PathBuf,
}

fn bad(msg: impl Into<String>) -> CniError {
    CniError::new(Code::InvalidConfig, msg)
}

fn parse_ip(field: &str, s: Option<String>) -> Result<Option<Ipv4Addr>> {
    s.map(|s| {
        s.parse()
            .map_err(|_| bad(format!("ipam.{field} {s:?} is not an IPv4 address")))
    })
    .transpose()
}

impl Builtin {
    pub fn from_conf(ipam: &Value) -> Result<Self> {
        let w: BuiltinWire = serde_json::from_value(ipam.clone())
            .map_err(|e| bad(format!("ipam ({BUILTIN_TYPE}): {e}")))?;
        let (subnet, start, end) = match (w.subnet, w.ranges) {
            (Some(s), _) => (s, w.range_start, w.range_end),
            (None, Some(sets)) => {
                let r = sets
                    .into_iter()
                    .next()
                    .and_then(|set| set.into_iter().next())
                    .ok_or_else(|| bad("ipam.ranges is empty"))?;
                (r.subnet, r.range_start, r.range_end)
            }
            (None, None) => {
                return Err(bad(format!(
                    "ipam ({BUILTIN_TYPE}) needs `subnet`, e.g. the node's podCIDR"
                )));
            }
        };
        if subnet.contains(':') {
            return Err(CniError::new(
                Code::UnsupportedField,
                format!("ipam.subnet {subnet:?} is IPv6; mycni is IPv4-only for now"),
            ));
        }
        let (network, prefix) =
            Range::parse_cidr(&subnet).map_err(|e| bad(format!("ipam.subnet: {e}")))?;
        let range = Range::new(
            network,
            prefix,
            parse_ip("rangeStart", start)?,
            parse_ip("rangeEnd", end)?,
        )
        .map_err(|e| bad(format!("ipam range: {e}")))?;
        Ok(Self {
            range,
            data_dir: PathBuf::from(w.data_dir.unwrap_or_else(|| DEFAULT_DATA_DIR.to_string())),
        })
    }

    fn store(&self, network: &str) -> Result<LeaseStore> {
        LeaseStore::open(&self.data_dir, network).map_err(store_err)
    }

    pub fn add(&self, network: &str, container_id: &str, ifname: &str) -> Result<Ipv4Addr> {
        self.store(network)?
            .allocate(&self.range, &[], container_id, ifname)
            .map_err(store_err)
    }

    pub fn del(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
        hint: Option<Ipv4Addr>,
    ) -> Result<Vec<Ipv4Addr>> {
        self.store(network)?
            .release(container_id, ifname, hint)
            .map_err(store_err)
    }

    pub fn holds(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
        ip: Ipv4Addr,
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
            conf,
        )?))
    }

    /// ADD: one IPv4 address for the pod.
    pub fn add(&self, conf: &NetConf, env: &Env) -> Result<IpConfig> {
        match self {
            Ipam::Builtin(b) => {
                let ip = b.add(&conf.name, &env.container_id, &env.ifname)?;
                // The range's prefix was parsed as an IPv4 CIDR's.
                let address = Cidr::new(ip, b.range.prefix).ok_or_else(|| {
                    CniError::new(Code::Ipam, format!("{ip}/{} is not a CIDR", b.range.prefix))
                })?;
                Ok(IpConfig {
                    address,
                    gateway: None,
                    interface: None,
                })
            }
            Ipam::Delegate(d) => {
                let out = d.exec("ADD", conf)?.unwrap_or_default();
                let v: Value = serde_json::from_slice(&out).map_err(|e| {
                    CniError::new(
                        Code::Ipam,
                        format!("IPAM plugin {} returned invalid JSON: {e}", d.name()),
                    )
                })?;
                // Read in whichever version it answered in; the caller
                // renders the pod's result in the runtime's version.
                let r = CniResult::from_json(&v)?;
                r.ips.into_iter().next().ok_or_else(|| {
                    CniError::new(
                        Code::Ipam,
                        format!("IPAM plugin {} returned no IPv4 address", d.name()),
                    )
                })
            }
        }
    }

    /// DEL: release whatever the container holds; idempotent.
    pub fn del(&self, conf: &NetConf, env: &Env, hint: Option<Ipv4Addr>) -> Result<()> {
        match self {
            Ipam::Builtin(b) => b
                .del(&conf.name, &env.container_id, &env.ifname, hint)
                .map(|_| ()),
            Ipam::Delegate(d) => d.exec("DEL", conf).map(|_| ()),
        }
    }

    pub fn check(&self, conf: &NetConf, env: &Env, ip: Ipv4Addr) -> Result<()> {
        match self {
            Ipam::Builtin(b) => {
                if b.holds(&conf.name, &env.container_id, &env.ifname, ip)? {
                    Ok(())
                } else {
                    Err(CniError::new(
                        Code::CheckFailed,
                        format!("no lease for {ip} held by this container in the built-in IPAM"),
                    ))
                }
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
