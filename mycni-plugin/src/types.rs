//! CNI results: one internal shape, rendered for the requested version, and
//! parsed back from any supported version (IPAM results, prevResult).

use std::net::IpAddr;

use mycni_common::net::Cidr;
use serde_json::{Value, json};

use crate::error::{CniError, Code, Result};
use crate::version::Version;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub mac: String,
    pub mtu: Option<u32>,
    /// The netns path for the interface inside the container; None on the host.
    pub sandbox: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpConfig {
    /// IPv4 or IPv6; the gateway, if any, of the same family.
    pub address: Cidr<IpAddr>,
    pub gateway: Option<IpAddr>,
    /// Index into `interfaces`.
    pub interface: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// IPv4 or IPv6; the gateway, if any, of the same family.
    pub dst: Cidr<IpAddr>,
    pub gw: Option<IpAddr>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct CniResult {
    pub interfaces: Vec<Interface>,
    pub ips: Vec<IpConfig>,
    pub routes: Vec<Route>,
    pub dns: Option<Value>,
}

/// Whether a 0.3.x/0.4.0 IP's `version` ("4" or "6") names the other family
/// than its address; a missing or unknown one does not.
fn ip_version_contradicts(ip: &Value, addr: IpAddr) -> bool {
    match ip.get("version").and_then(Value::as_str) {
        Some("4") => !addr.is_ipv4(),
        Some("6") => addr.is_ipv4(),
        _ => false,
    }
}

/// A list field of a result: absent or null is empty (Go decodes both to a
/// nil slice); anything else that is not an array is a broken result, not
/// "no IPs".
fn list<'a>(obj: &'a serde_json::Map<String, Value>, field: &str) -> Result<&'a [Value]> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(a)) => Ok(a),
        Some(other) => Err(decode(format!("result `{field}` is not a list: {other}"))),
    }
}

/// An optional gateway field (`gateway`, `gw`) of an address or route of
/// `family_of`'s family: absent or null is None; anything else must be an
/// address of that family, never silently dropped (which would turn a route
/// via a gateway into a direct one).
fn optional_ip(v: &Value, field: &str, family_of: IpAddr) -> Result<Option<IpAddr>> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(g) => g
            .as_str()
            .and_then(|g| g.parse::<IpAddr>().ok())
            .filter(|g| g.is_ipv4() == family_of.is_ipv4())
            .map(Some)
            .ok_or_else(|| {
                decode(format!(
                    "result {field} {g} is not an {} address like its destination's",
                    if family_of.is_ipv4() { "IPv4" } else { "IPv6" }
                ))
            }),
    }
}

fn decode(msg: String) -> CniError {
    CniError::new(Code::Decode, msg)
}

impl CniResult {
    pub fn to_json(&self, version: Version) -> Value {
        let interfaces: Vec<Value> = self
            .interfaces
            .iter()
            .map(|i| {
                let mut o = json!({ "name": i.name, "mac": i.mac });
                if let Some(s) = &i.sandbox {
                    o["sandbox"] = json!(s);
                }
                // `mtu` on interfaces is a 1.1.0 addition.
                if let (Some(m), true) = (i.mtu, version >= Version::V1_1_0) {
                    o["mtu"] = json!(m);
                }
                o
            })
            .collect();
        let ips: Vec<Value> = self
            .ips
            .iter()
            .map(|ip| {
                let mut o = json!({ "address": ip.address.to_string() });
                if version.ip_has_version_field() {
                    o["version"] = json!(if ip.address.addr().is_ipv4() {
                        "4"
                    } else {
                        "6"
                    });
                }
                if let Some(g) = ip.gateway {
                    o["gateway"] = json!(g.to_string());
                }
                if let Some(i) = ip.interface {
                    o["interface"] = json!(i);
                }
                o
            })
            .collect();
        let routes: Vec<Value> = self
            .routes
            .iter()
            .map(|r| {
                let mut o = json!({ "dst": r.dst.to_string() });
                if let Some(g) = r.gw {
                    o["gw"] = json!(g.to_string());
                }
                o
            })
            .collect();
        let mut out = json!({ "cniVersion": version.as_str() });
        if !interfaces.is_empty() {
            out["interfaces"] = json!(interfaces);
        }
        out["ips"] = json!(ips);
        if !routes.is_empty() {
            out["routes"] = json!(routes);
        }
        out["dns"] = self.dns.clone().unwrap_or_else(|| json!({}));
        out
    }

    /// Parses a result of any supported version, addresses and routes of
    /// both families.
    pub fn from_json(v: &Value) -> Result<Self> {
        let obj = v
            .as_object()
            .ok_or_else(|| decode(format!("result is not an object: {v}")))?;
        let mut out = CniResult::default();
        for i in list(obj, "interfaces")? {
            {
                // `as u32` would read 2^32 + 1450 as 1450.
                let mtu =
                    match i.get("mtu") {
                        None | Some(Value::Null) => None,
                        Some(m) => {
                            Some(m.as_u64().and_then(|m| u32::try_from(m).ok()).ok_or_else(
                                || decode(format!("result interface MTU {m} is not a u32")),
                            )?)
                        }
                    };
                out.interfaces.push(Interface {
                    name: i["name"].as_str().unwrap_or_default().to_string(),
                    mac: i["mac"].as_str().unwrap_or_default().to_string(),
                    mtu,
                    sandbox: i["sandbox"].as_str().map(str::to_string),
                });
            }
        }
        for ip in list(obj, "ips")? {
            let addr = ip["address"]
                .as_str()
                .ok_or_else(|| decode(format!("result IP without address: {ip}")))?;
            let address: Cidr<IpAddr> = addr
                .parse()
                .map_err(|_| decode(format!("result address {addr:?} is not a CIDR")))?;
            if ip_version_contradicts(ip, address.addr()) {
                return Err(decode(format!(
                    "result address {addr:?} contradicts its version {}",
                    ip["version"]
                )));
            }
            let gateway = optional_ip(ip, "gateway", address.addr())?;
            out.ips.push(IpConfig {
                address,
                gateway,
                interface: match ip.get("interface") {
                    None | Some(Value::Null) => None,
                    Some(i) => Some(
                        i.as_u64()
                            .and_then(|i| usize::try_from(i).ok())
                            .ok_or_else(|| {
                                decode(format!("result IP interface {i} is not an index"))
                            })?,
                    ),
                },
            });
        }
        for r in list(obj, "routes")? {
            let dst = r["dst"]
                .as_str()
                .ok_or_else(|| decode(format!("result route without dst: {r}")))?;
            // What is not a CIDR is a broken result, as libcni decodes it.
            let Ok(dst) = dst.parse::<Cidr<IpAddr>>() else {
                return Err(decode(format!("result route dst {dst:?} is not a CIDR")));
            };
            let gw = optional_ip(r, "gw", dst.addr())?;
            out.routes.push(Route { dst, gw });
        }
        out.dns = obj.get("dns").cloned().filter(|d| d.is_object());
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    /// `a.b.c.d/len` as results write it: an interface address, so host
    /// bits are kept. The rules (no "+24", no "024", found by the
    /// `prev_result` fuzz target) are `mycni_common::net`'s, the same for
    /// every CIDR mycni reads.
    fn parse_cidr(s: &str) -> Option<(Ipv4Addr, u8)> {
        let c: Cidr<Ipv4Addr> = s.parse().ok()?;
        Some((c.addr(), c.prefix()))
    }

    fn sample() -> CniResult {
        CniResult {
            interfaces: vec![
                Interface {
                    name: "mycni1234".into(),
                    mac: "aa:bb:cc:dd:ee:ff".into(),
                    mtu: Some(1450),
                    sandbox: None,
                },
                Interface {
                    name: "eth0".into(),
                    mac: "02:00:00:00:00:01".into(),
                    mtu: Some(1450),
                    sandbox: Some("/run/netns/x".into()),
                },
            ],
            ips: vec![
                IpConfig {
                    address: "10.244.1.5/32".parse().unwrap(),
                    gateway: Some("169.254.1.1".parse().unwrap()),
                    interface: Some(1),
                },
                IpConfig {
                    address: "fd00:10:244:1::5/128".parse().unwrap(),
                    gateway: Some("fe80::1".parse().unwrap()),
                    interface: Some(1),
                },
            ],
            routes: vec![
                Route {
                    dst: "0.0.0.0/0".parse().unwrap(),
                    gw: Some("169.254.1.1".parse().unwrap()),
                },
                Route {
                    dst: "::/0".parse().unwrap(),
                    gw: Some("fe80::1".parse().unwrap()),
                },
            ],
            dns: Some(json!({"nameservers": ["10.96.0.10"]})),
        }
    }

    #[test]
    fn shapes_per_version() {
        let r = sample();
        let old = r.to_json(Version::V0_3_1);
        assert_eq!(old["cniVersion"], "0.3.1");
        assert_eq!(old["ips"][0]["version"], "4");
        assert_eq!(old["ips"][1]["version"], "6");
        assert_eq!(old["ips"][1]["address"], "fd00:10:244:1::5/128");
        assert_eq!(old["routes"][1]["gw"], "fe80::1");
        assert!(old["interfaces"][1].get("mtu").is_none());
        let new = r.to_json(Version::V1_1_0);
        assert!(new["ips"][0].get("version").is_none());
        assert!(new["ips"][1].get("version").is_none());
        assert_eq!(new["interfaces"][1]["mtu"], 1450);
        assert_eq!(new["interfaces"][1]["sandbox"], "/run/netns/x");
        assert_eq!(new["ips"][0]["interface"], 1);
        assert_eq!(new["routes"][0]["dst"], "0.0.0.0/0");
        assert_eq!(new["dns"]["nameservers"][0], "10.96.0.10");
    }

    #[test]
    fn round_trips_every_version() {
        for v in [
            Version::V0_3_1,
            Version::V0_4_0,
            Version::V1_0_0,
            Version::V1_1_0,
        ] {
            let back = CniResult::from_json(&sample().to_json(v)).unwrap();
            assert_eq!(back.ips, sample().ips, "{v:?}");
            assert_eq!(back.routes, sample().routes);
        }
    }

    #[test]
    fn reads_ipv6_and_rejects_garbage() {
        let v6 = json!({"ips":[{"address":"FD00:0::1/64", "gateway": "fd00::ff"}],
            "routes": [{"dst": "::/0", "gw": "fe80::1"}]});
        let r = CniResult::from_json(&v6).unwrap();
        assert_eq!(r.ips[0].address.to_string(), "fd00::1/64");
        assert_eq!(r.ips[0].gateway, Some("fd00::ff".parse().unwrap()));
        assert_eq!(r.routes[0].gw, Some("fe80::1".parse().unwrap()));
        for bad in [
            // A gateway, or a 0.3.x version, of the other family.
            json!({"ips":[{"address":"fd00::1/64", "gateway": "10.0.0.1"}]}),
            json!({"ips":[{"address":"10.0.0.2/24", "gateway": "fd00::1"}]}),
            json!({"ips":[{"address":"fd00::1/64", "version": "4"}]}),
            json!({"ips":[{"address":"10.0.0.2/24", "version": "6"}]}),
            json!({"ips":[{"address":"fd00::1/129"}]}),
            json!({"ips":[], "routes": [{"dst": "::/0", "gw": "169.254.1.1"}]}),
        ] {
            assert_eq!(
                CniResult::from_json(&bad).map(|_| ()).map_err(|e| e.code),
                Err(Code::Decode),
                "{bad}"
            );
        }
        assert_eq!(
            CniResult::from_json(&json!(3)).unwrap_err().code,
            Code::Decode
        );
        assert_eq!(
            CniResult::from_json(&json!({"ips":[{}]})).unwrap_err().code,
            Code::Decode
        );
        assert!(parse_cidr("10.0.0.0/33").is_none());
        assert!(parse_cidr("10.0.0.0").is_none());
    }

    /// What libcni fails to decode is a decode error here too (code 6),
    /// not a result with fewer IPs or routes.
    #[test]
    fn broken_lists_and_routes_are_decode_errors() {
        for bad in [
            json!({"ips": {"address": "10.244.1.5/32"}}),
            json!({"ips": "10.244.1.5/32"}),
            json!({"interfaces": {}, "ips": []}),
            json!({"ips": [], "routes": {"dst": "0.0.0.0/0"}}),
            json!({"ips": [], "routes": [{"dst": "not-a-cidr"}]}),
            json!({"ips": [], "routes": [{"dst": "10.0.0.0/33"}]}),
            json!({"ips": [], "routes": [{"gw": "10.0.0.1"}]}),
            json!({"ips": [{"address": "10.244.1.5/32", "interface": "0"}]}),
        ] {
            assert_eq!(
                CniResult::from_json(&bad).map(|_| ()).map_err(|e| e.code),
                Err(Code::Decode),
                "{bad}"
            );
        }
        // Absent or null lists are empty, as Go decodes them; routes of
        // both families are kept.
        let ok = json!({"interfaces": null, "ips": null,
            "routes": [{"dst": "fd00::/8"}, {"dst": "0.0.0.0/0"}]});
        let r = CniResult::from_json(&ok).unwrap();
        assert!(r.ips.is_empty() && r.interfaces.is_empty());
        assert_eq!(r.routes.len(), 2);
    }

    /// Inputs the fuzz targets (fuzz/) found accepted or changed in silence.
    #[test]
    fn fuzz_regressions() {
        for bad in [
            "10.244.1.5/+32",
            "10.244.1.5/032",
            "10.0.0.0/00",
            "10.0.0.0/",
            "10.0.0.0/ 8",
        ] {
            assert!(parse_cidr(bad).is_none(), "{bad}");
        }
        assert_eq!(parse_cidr("0.0.0.0/0"), Some((Ipv4Addr::UNSPECIFIED, 0)));
        assert_eq!(
            parse_cidr("10.0.0.0/8"),
            Some((Ipv4Addr::new(10, 0, 0, 0), 8))
        );
        let rejected = [
            // A route's gateway was dropped, making it a direct route.
            json!({"ips": [], "routes": [{"dst": "10.0.0.0/8", "gw": "fd00::1"}]}),
            json!({"ips": [], "routes": [{"dst": "10.0.0.0/8", "gw": 167772161}]}),
            json!({"ips": [{"address": "10.244.1.5/32", "gateway": 1}]}),
            // An MTU of 2^32 + 1450 was read as 1450.
            json!({"interfaces": [{"name": "eth0", "mtu": 4_294_968_746_u64}], "ips": []}),
            json!({"interfaces": [{"name": "eth0", "mtu": -1}], "ips": []}),
            json!({"ips": [{"address": "10.244.1.5/+32"}]}),
        ];
        for v in rejected {
            assert!(CniResult::from_json(&v).is_err(), "{v}");
        }
        let ok = json!({"interfaces": [{"name": "eth0", "mtu": null}],
            "ips": [{"address": "10.244.1.5/32", "gateway": null}],
            "routes": [{"dst": "10.0.0.0/8", "gw": null}, {"dst": "::/0", "gw": "fe80::1"}]});
        let r = CniResult::from_json(&ok).unwrap();
        assert_eq!(
            (r.interfaces[0].mtu, r.ips[0].gateway, r.routes.len()),
            (None, None, 2)
        );
    }
}
