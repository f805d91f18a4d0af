//! Invariants shared by the fuzz targets in `fuzz_targets/`.
//!
//! The agents' Node validation is `mycni_common::node` (std only), a
//! dependency like any other: `peer_node` needs nothing of `mycni-agent`,
//! which pulls kube, k8s-openapi, aya, tokio and rustls; building those with
//! coverage instrumentation (and AddressSanitizer) took 13m46s on the 2-core
//! machine, against ~2 min for this crate with mycni-plugin alone.

use std::net::IpAddr;

use mycni_common::net::{Cidr, Family};

use mycni_plugin::types::CniResult;
use mycni_plugin::version::Version;
use serde_json::Value;

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
            // The same address; IPv4 text has one spelling, so it is the
            // input's, while IPv6 text may be written several ways (case,
            // zeros) and comes out in RFC 5952's.
            let text = want["address"].as_str().unwrap_or_default();
            assert_eq!(text.parse::<Cidr<IpAddr>>().ok(), Some(got.address));
            if got.address.addr().is_ipv4() {
                assert_eq!(
                    text,
                    got.address.to_string(),
                    "address re-formats to the input"
                );
            }
            assert!(got.address.prefix() <= got.address.addr().max_prefix());
            match want.get("gateway").filter(|g| !g.is_null()) {
                None => assert_eq!(got.gateway, None),
                Some(g) => {
                    let gw = got.gateway.unwrap_or_else(|| panic!("gateway {g} dropped"));
                    assert_eq!(g.as_str().and_then(|g| g.parse::<IpAddr>().ok()), Some(gw));
                    assert_eq!(
                        gw.is_ipv4(),
                        got.address.addr().is_ipv4(),
                        "gateway of another family"
                    );
                }
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
    // Routes of both families are kept, each with its gateway.
    if let Some(routes) = input.get("routes").and_then(Value::as_array) {
        assert_eq!(routes.len(), r.routes.len());
        for (want, got) in routes.iter().zip(&r.routes) {
            assert_eq!(
                want["dst"]
                    .as_str()
                    .and_then(|d| d.parse::<Cidr<IpAddr>>().ok()),
                Some(got.dst)
            );
            if let Some(gw) = got.gw {
                assert_eq!(
                    gw.is_ipv4(),
                    got.dst.addr().is_ipv4(),
                    "gateway of another family"
                );
            }
            assert_eq!(
                want.get("gw").is_some_and(|g| !g.is_null()),
                got.gw.is_some(),
                "route gateway dropped: {want}"
            );
        }
    }
}
