//! The network configuration on stdin, through the entry point every command
//! uses (`NetConf::parse`), then the parts a command reads next: the
//! built-in IPAM's section (`Builtin::from_conf`, as ADD/DEL/CHECK do) and
//! `prevResult` (`CniResult::from_json`, as CHECK and DEL do).
#![no_main]

use std::net::IpAddr;

use libfuzzer_sys::fuzz_target;
use mycni_common::net::{Cidr, Family};
use mycni_plugin::config::{NetConf, valid_network_name};
use mycni_plugin::error::Code;
use mycni_plugin::ipam::{BUILTIN_TYPE, Builtin};
use mycni_plugin::types::CniResult;
use mycni_plugin::version::SUPPORTED;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let c = match NetConf::parse(data) {
        Ok(c) => c,
        Err(e) => {
            assert!(!e.msg.is_empty());
            assert!(
                matches!(
                    e.code,
                    Code::Decode | Code::IncompatibleVersion | Code::InvalidConfig
                ),
                "{:?}: {}",
                e.code,
                e.msg
            );
            // The one JSON object the plugin prints for it.
            let out: Value = match serde_json::from_str(&e.to_json("1.1.0")) {
                Ok(v) => v,
                Err(err) => panic!("error JSON does not parse: {err}"),
            };
            assert_eq!(out["code"], e.code as u32);
            assert_eq!(out["msg"], e.msg.as_str());
            return;
        }
    };
    assert!(valid_network_name(&c.name), "{:?}", c.name);
    assert!(SUPPORTED.contains(&c.cni_version.as_str()));
    assert!((68..=65535).contains(&c.mtu));
    assert_eq!(c.ipam.is_some(), c.ipam_type.is_some());
    if let Some(t) = &c.ipam_type {
        assert!(!t.is_empty() && !t.contains('/') && t != "." && t != "..");
    }
    assert_eq!(c.raw, data);
    if let (Some(BUILTIN_TYPE), Some(ipam)) = (c.ipam_type.as_deref(), &c.ipam)
        && let Ok(b) = Builtin::from_conf(ipam)
    {
        // One set per family, primary first; each range within its subnet,
        // never its network address (or IPv4's broadcast), of the set's family.
        assert!(!b.sets.is_empty() && b.sets.len() <= 2);
        if let [x, y] = b.sets.as_slice() {
            assert_ne!(x.is_ipv4(), y.is_ipv4());
        }
        for set in &b.sets {
            assert!(!set.ranges.is_empty());
            for r in &set.ranges {
                assert_eq!(r.is_ipv4(), set.is_ipv4());
                let subnet: Cidr<IpAddr> = Cidr::new(r.network, r.prefix).expect("a CIDR");
                assert!(subnet.is_network(), "host bits in {subnet}");
                assert!(r.prefix <= r.network.max_prefix() - 2);
                assert!(subnet.contains(r.start) && subnet.contains(r.end));
                assert!(subnet.network() < r.start);
                assert!(r.start <= r.end);
                if r.is_ipv4() {
                    assert!(r.end < subnet.last());
                }
                assert!(r.size() >= 1);
                assert!(r.contains(r.start) && r.contains(r.end));
            }
            for gw in &set.gateways {
                assert!(set.ranges.iter().any(|r| r.subnet_contains(*gw)));
            }
        }
    }
    if let Some(prev) = &c.prev_result
        && let Ok(r) = CniResult::from_json(prev)
    {
        mycni_fuzz::check_result(prev, &r);
    }
});
