//! The built-in IPAM's section of the network config, read as host-local reads its own:
//! a top-level range and `ranges`, one range set per family.

use std::net::IpAddr;
use std::path::PathBuf;

use serde::Deserialize;
use serde_json::Value;

use super::{BUILTIN_TYPE, Builtin, DEFAULT_DATA_DIR, RangeSet, bad, family};
use crate::error::{CniError, Code, Result};
use crate::ipam::store::Range;

/// The built-in IPAM's configuration: host-local's, so a host-local config can switch
/// type without being rewritten. A top-level `subnet` (with its `rangeStart`, `rangeEnd`
/// and `gateway`) is a range set of its own, placed before those of `ranges`, as
/// host-local places it.
#[derive(Debug, Deserialize)]
struct BuiltinWire {
    subnet: Option<String>,
    #[serde(rename = "rangeStart")]
    range_start: Option<String>,
    #[serde(rename = "rangeEnd")]
    range_end: Option<String>,
    gateway: Option<String>,
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
    gateway: Option<String>,
}

fn parse_ip(field: &str, s: Option<String>) -> Result<Option<IpAddr>> {
    s.map(|s| {
        s.trim()
            .parse()
            .map_err(|_| bad(format!("ipam.{field} {s:?} is not an IP address")))
    })
    .transpose()
}

/// One range of the config, validated, with its gateway.
fn range_from(field: &str, w: RangeWire) -> Result<(Range, Option<IpAddr>)> {
    let (network, prefix) =
        Range::parse_cidr(&w.subnet).map_err(|e| bad(format!("{field}.subnet: {e}")))?;
    let range = Range::new(
        network,
        prefix,
        parse_ip(&format!("{field}.rangeStart"), w.range_start)?,
        parse_ip(&format!("{field}.rangeEnd"), w.range_end)?,
    )
    .map_err(|e| bad(format!("{field}: {e}")))?;
    let gateway = parse_ip(&format!("{field}.gateway"), w.gateway)?;
    if let Some(gw) = gateway
        && !range.subnet_contains(gw)
    {
        return Err(bad(format!(
            "{field}.gateway {gw} is outside its subnet {network}/{prefix}{}",
            if gw.is_ipv4() == network.is_ipv4() {
                String::new()
            } else {
                format!(
                    " (an {} gateway for an {} subnet)",
                    family(gw),
                    family(network)
                )
            }
        )));
    }
    Ok((range, gateway))
}

impl Builtin {
    pub fn from_conf(ipam: &Value) -> Result<Self> {
        let w: BuiltinWire = serde_json::from_value(ipam.clone())
            .map_err(|e| bad(format!("ipam ({BUILTIN_TYPE}): {e}")))?;
        let mut wire_sets: Vec<(String, Vec<RangeWire>)> = Vec::new();
        if let Some(subnet) = w.subnet {
            wire_sets.push((
                "ipam".into(),
                vec![RangeWire {
                    subnet,
                    range_start: w.range_start,
                    range_end: w.range_end,
                    gateway: w.gateway,
                }],
            ));
        }
        for (i, set) in w.ranges.into_iter().flatten().enumerate() {
            wire_sets.push((format!("ipam.ranges[{i}]"), set));
        }
        if wire_sets.is_empty() {
            return Err(bad(format!(
                "ipam ({BUILTIN_TYPE}) needs `subnet`, e.g. the node's podCIDR, or `ranges`"
            )));
        }
        let mut sets: Vec<RangeSet> = Vec::new();
        for (field, wire) in wire_sets {
            if wire.is_empty() {
                return Err(bad(format!("{field} is an empty range set")));
            }
            let mut set = RangeSet {
                ranges: Vec::new(),
                gateways: Vec::new(),
            };
            for (j, rw) in wire.into_iter().enumerate() {
                let (r, gw) = range_from(&format!("{field}[{j}]"), rw)?;
                if let Some(first) = set.ranges.first()
                    && first.is_ipv4() != r.is_ipv4()
                {
                    return Err(bad(format!(
                        "{field} mixes address families ({}/{} and {}/{}): a range set is of \
                         one family, give each family a set of its own",
                        first.network, first.prefix, r.network, r.prefix
                    )));
                }
                set.ranges.push(r);
                set.gateways.extend(gw);
            }
            if sets.iter().any(|s| s.is_ipv4() == set.is_ipv4()) {
                return Err(CniError::new(
                    Code::UnsupportedField,
                    format!(
                        "{field}: a second range set of {} addresses; mycni gives a pod one \
                         address per family, so ipam.ranges has at most one set per family",
                        if set.is_ipv4() { "IPv4" } else { "IPv6" }
                    ),
                ));
            }
            sets.push(set);
        }
        // Overlapping ranges would lease one address twice over (host-local refuses them
        // too); only ranges of one family can overlap, and those are in one set.
        for set in &sets {
            for (i, a) in set.ranges.iter().enumerate() {
                for b in &set.ranges[i + 1..] {
                    if a.start <= b.end && b.start <= a.end {
                        return Err(bad(format!(
                            "ipam ranges {}-{} and {}-{} overlap",
                            a.start, a.end, b.start, b.end
                        )));
                    }
                }
            }
        }
        Ok(Self {
            sets,
            data_dir: PathBuf::from(w.data_dir.unwrap_or_else(|| DEFAULT_DATA_DIR.to_string())),
        })
    }
}
