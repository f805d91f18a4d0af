//! Invariants shared by the fuzz targets in `fuzz_targets/`.
//!
//! The agent's Node validation (`mycni-agent/src/peers.rs`, std only) is
//! compiled here from its source file rather than through a dependency on
//! `mycni-agent`: that crate pulls kube, k8s-openapi, aya, tokio and rustls,
//! and building them with coverage instrumentation (and AddressSanitizer)
//! took 13m46s on the 2-core machine, against ~2 min for this crate with
//! mycni-plugin alone. The code fuzzed is the same file the agent compiles;
//! peers.rs says it must use std and `mycni_common` only.

use std::net::Ipv4Addr;

use mycni_plugin::types::CniResult;
use mycni_plugin::version::Version;
use serde_json::Value;

#[path = "../../mycni-agent/src/peers.rs"]
#[allow(dead_code)]
pub mod peers;

pub const VERSIONS: [Version; 4] = [
    Version::V0_3_1,
    Version::V0_4_0,
    Version::V1_0_0,
    Version::V1_1_0,
];

fn dns(r: &CniResult) -> Option<&Value> {
    r.dns
        .as_ref()
        .filter(|d| d.as_object().is_some_and(|o| !o.is_empty()))
}

/// What a parsed result must satisfy against the JSON it came from: it
/// renders for every version and parses back to itself, and no field the
/// input gave was silently dropped or changed.
pub fn check_result(input: &Value, r: &CniResult) {
    for v in VERSIONS {
        let out = r.to_json(v);
        assert_eq!(out["cniVersion"], v.as_str());
        let back = match CniResult::from_json(&out) {
            Ok(b) => b,
            Err(e) => panic!("{v:?} rendering {out} does not parse back: {e}"),
        };
        assert_eq!(back.ips, r.ips, "{v:?}");
        assert_eq!(back.routes, r.routes, "{v:?}");
        // No `dns` and an empty one are the same thing; results always carry one.
        assert_eq!(dns(&back), dns(r), "{v:?}");
        assert_eq!(back.interfaces.len(), r.interfaces.len());
        for (b, i) in back.interfaces.iter().zip(&r.interfaces) {
            assert_eq!((&b.name, &b.mac, &b.sandbox), (&i.name, &i.mac, &i.sandbox));
            // `mtu` on interfaces exists from 1.1.0 on.
            let mtu = if v >= Version::V1_1_0 { i.mtu } else { None };
            assert_eq!(b.mtu, mtu, "{v:?}");
        }
    }
    // Every input IP is kept (an unparsable one is an error, never skipped),
    // in the form it was given.
    if let Some(ips) = input.get("ips").and_then(Value::as_array) {
        assert_eq!(ips.len(), r.ips.len());
        for (want, got) in ips.iter().zip(&r.ips) {
            assert_eq!(
                want["address"].as_str(),
                Some(got.address.to_string().as_str()),
                "address re-formats to the input"
            );
            assert!(got.address.prefix() <= 32);
            match want.get("gateway").filter(|g| !g.is_null()) {
                None => assert_eq!(got.gateway, None),
                Some(g) => assert_eq!(
                    g.as_str().and_then(|g| g.parse::<Ipv4Addr>().ok()),
                    Some(got.gateway.unwrap_or_else(|| panic!("gateway {g} dropped"))),
                ),
            }
        }
    }
    if let Some(ifs) = input.get("interfaces").and_then(Value::as_array) {
        assert_eq!(ifs.len(), r.interfaces.len());
        for (want, got) in ifs.iter().zip(&r.interfaces) {
            if let Some(m) = want.get("mtu").and_then(Value::as_u64) {
                assert_eq!(got.mtu.map(u64::from), Some(m), "interface mtu changed");
            }
        }
    }
    // IPv4 routes are kept with their gateway; others are skipped.
    if let Some(routes) = input.get("routes").and_then(Value::as_array) {
        let v4: Vec<&Value> = routes
            .iter()
            .filter(|rt| {
                rt["dst"]
                    .as_str()
                    .and_then(mycni_plugin::types::parse_cidr)
                    .is_some()
            })
            .collect();
        assert_eq!(v4.len(), r.routes.len());
        for (want, got) in v4.iter().zip(&r.routes) {
            assert_eq!(want["dst"].as_str(), Some(got.dst.to_string().as_str()));
            assert_eq!(
                want.get("gw").is_some_and(|g| !g.is_null()),
                got.gw.is_some(),
                "route gateway dropped: {want}"
            );
        }
    }
}
