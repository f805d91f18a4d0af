//! The network configuration on stdin, through the entry point every command
//! uses (`NetConf::parse`), then the parts a command reads next: the
//! built-in IPAM's section (`Builtin::from_conf`, as ADD/DEL/CHECK do) and
//! `prevResult` (`CniResult::from_json`, as CHECK and DEL do).
#![no_main]

use libfuzzer_sys::fuzz_target;
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
        let r = b.range;
        let net = u32::from(r.network);
        let mask = if r.prefix == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(r.prefix))
        };
        assert!(r.prefix <= 30);
        assert_eq!(net & !mask, 0, "host bits in {}/{}", r.network, r.prefix);
        // Never the network or broadcast address, never outside the subnet.
        assert!(net < u32::from(r.start));
        assert!(r.start <= r.end);
        assert!(u32::from(r.end) < net | !mask);
        assert!(r.size() >= 1);
        assert!(r.contains(r.start) && r.contains(r.end));
    }
    if let Some(prev) = &c.prev_result
        && let Ok(r) = CniResult::from_json(prev)
    {
        mycni_fuzz::check_result(prev, &r);
    }
});
