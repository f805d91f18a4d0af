//! The built-in IPAM's config (one range set per family) and a delegate's answer.

use crate::ipam::*;
use serde_json::json;

fn code(ipam: Value) -> Option<Code> {
    Builtin::from_conf(&ipam).err().map(|e| e.code)
}

#[test]
fn one_range_set_per_family_primary_first() {
    let b = Builtin::from_conf(&json!({"type": "mycni-ipam",
        "ranges": [[{"subnet": "fd00:1::/64", "gateway": "fd00:1::1"}],
                   [{"subnet": "10.1.0.0/24"}]]}))
    .unwrap();
    assert_eq!(b.sets.len(), 2);
    assert!(!b.sets[0].is_ipv4() && b.sets[1].is_ipv4());
    assert_eq!(b.sets[0].gateways, ["fd00:1::1".parse::<IpAddr>().unwrap()]);
    // The single-subnet form, and it before `ranges` as in host-local.
    let b = Builtin::from_conf(&json!({"type": "mycni-ipam", "subnet": "10.1.0.0/24",
        "ranges": [[{"subnet": "fd00:1::/64"}]]}))
    .unwrap();
    assert!(b.sets[0].is_ipv4() && !b.sets[1].is_ipv4());
    let b = Builtin::from_conf(&json!({"subnet": "fd00:1::/120"})).unwrap();
    assert_eq!(b.sets.len(), 1);
    assert_eq!(b.sets[0].ranges[0].size(), 255);
    // Two ranges of one family in one set.
    let b = Builtin::from_conf(&json!({"ranges": [[{"subnet": "10.1.0.0/24"},
        {"subnet": "10.2.0.0/24"}]]}))
    .unwrap();
    assert_eq!(b.sets[0].ranges.len(), 2);
}

#[test]
fn bad_range_sets_have_spec_codes() {
    for (ipam, want) in [
        // Mixed families in one set, and in one range.
        (
            json!({"ranges": [[{"subnet": "10.1.0.0/24"}, {"subnet": "fd00::/64"}]]}),
            Code::InvalidConfig,
        ),
        (
            json!({"ranges": [[{"subnet": "fd00::/64", "rangeStart": "10.0.0.1"}]]}),
            Code::InvalidConfig,
        ),
        // A gateway outside its subnet, or of the other family.
        (
            json!({"ranges": [[{"subnet": "fd00:1::/64", "gateway": "fd00:2::1"}]]}),
            Code::InvalidConfig,
        ),
        (
            json!({"ranges": [[{"subnet": "fd00:1::/64", "gateway": "10.0.0.1"}]]}),
            Code::InvalidConfig,
        ),
        (json!({"subnet": "fd00::1/128"}), Code::InvalidConfig),
        (json!({"subnet": "fd00::/127"}), Code::InvalidConfig),
        (json!({"subnet": "fd00::1/64"}), Code::InvalidConfig),
        (json!({"ranges": []}), Code::InvalidConfig),
        (json!({"ranges": [[]]}), Code::InvalidConfig),
        (
            json!({"ranges": [[{"subnet": "10.1.0.0/16"}, {"subnet": "10.1.2.0/24"}]]}),
            Code::InvalidConfig,
        ),
        (
            json!({"ranges": [[{"subnet": "10.1.0.0/24"}], [{"subnet": "10.2.0.0/24"}]]}),
            Code::UnsupportedField,
        ),
    ] {
        assert_eq!(code(ipam.clone()), Some(want), "{ipam}");
    }
}

/// The contract's dual-stack section (what the agent will write) reads
/// as one range set per family, primary first; the single-subnet one
/// as before.
#[test]
fn the_contracts_ipam_sections_read() {
    use mycni_common::contract::IpamConf;
    let v6: Cidr = "fd00:10:244:7::/64".parse().unwrap();
    let v4: Cidr = "10.244.7.0/24".parse().unwrap();
    for (cidrs, first_v4) in [
        (vec![v6, v4], false),
        (vec![v4, v6], true),
        (vec![v6], false),
    ] {
        let section = IpamConf::new(Some("/var/lib/x".into()), &cidrs);
        let b = Builtin::from_conf(&serde_json::to_value(&section).unwrap()).unwrap();
        assert_eq!(b.sets.len(), cidrs.len());
        assert_eq!(b.sets[0].is_ipv4(), first_v4);
        for (set, c) in b.sets.iter().zip(&cidrs) {
            assert_eq!(
                (set.ranges[0].network, set.ranges[0].prefix),
                (c.addr(), c.prefix())
            );
        }
        assert_eq!(b.data_dir, PathBuf::from("/var/lib/x"));
    }
}

#[test]
fn delegated_results_give_one_address_per_family() {
    let two =
        br#"{"cniVersion":"1.0.0","ips":[{"address":"fd00::5/64"},{"address":"10.1.0.5/24"}]}"#;
    let ips = delegated_ips("host-local", two).unwrap();
    assert_eq!(ips[0].address.to_string(), "fd00::5/64");
    let same =
        br#"{"cniVersion":"1.0.0","ips":[{"address":"10.2.0.5/24"},{"address":"10.1.0.5/24"}]}"#;
    assert_eq!(
        delegated_ips("host-local", same).unwrap_err().code,
        Code::Ipam
    );
    let none = br#"{"cniVersion":"1.0.0","ips":[]}"#;
    assert_eq!(
        delegated_ips("host-local", none).unwrap_err().code,
        Code::Ipam
    );
}
