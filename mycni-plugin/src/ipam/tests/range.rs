//! The addresses a config allows: defaults, validation, CIDR parsing, IPv6.

use super::{ip, range, sub_range};
use crate::ipam::range::*;

#[test]
fn range_defaults_exclude_network_and_broadcast() {
    let r = range("10.244.1.0/24");
    assert_eq!(r.start, ip("10.244.1.1"));
    assert_eq!(r.end, ip("10.244.1.254"));
    assert_eq!(r.size(), 254);
    assert!(r.contains(ip("10.244.1.1")));
    assert!(r.contains(ip("10.244.1.254")));
    assert!(!r.contains(ip("10.244.1.0")));
    assert!(!r.contains(ip("10.244.1.255")));
    assert!(!r.contains(ip("10.244.2.1")));

    let r = sub_range("10.0.0.0/16", "10.0.1.20", "10.0.3.50");
    assert_eq!(r.size(), 2 * 256 + 31);
    assert!(!r.contains(ip("10.0.1.19")));
    assert!(r.contains(ip("10.0.2.0")));
    assert!(!r.contains(ip("10.0.3.51")));

    let r = range("192.168.0.4/30");
    assert_eq!(
        (r.start, r.end, r.size()),
        (ip("192.168.0.5"), ip("192.168.0.6"), 2)
    );
    let r = range("0.0.0.0/0");
    assert_eq!(r.size(), u128::from(u32::MAX) - 1);
}

#[test]
fn range_new_rejects_bad_ranges() {
    let net = ip("10.0.0.0");
    assert_eq!(
        Range::new(net, 31, None, None),
        Err(RangeError::PrefixTooLong { prefix: 31 })
    );
    assert!(matches!(
        Range::new(net, 33, None, None),
        Err(RangeError::PrefixTooLong { .. })
    ));
    let err = Range::new(ip("10.0.0.5"), 24, None, None).unwrap_err();
    assert_eq!(
        err,
        RangeError::HostBitsSet {
            network: ip("10.0.0.5"),
            prefix: 24,
            expected: net
        }
    );
    assert!(err.to_string().contains("10.0.0.0/24"), "{err}");
    for (start, end, which) in [
        (Some(ip("10.0.1.1")), None, "start"),
        (None, Some(ip("10.0.1.1")), "end"),
        (Some(ip("10.0.0.0")), None, "start"),
        (None, Some(ip("10.0.0.255")), "end"),
        (Some(ip("9.255.255.255")), None, "start"),
    ] {
        match Range::new(net, 24, start, end) {
            Err(RangeError::OutsideSubnet { which: w, .. }) => assert_eq!(w, which),
            other => panic!("{start:?} {end:?}: {other:?}"),
        }
    }
    assert_eq!(
        Range::new(net, 24, Some(ip("10.0.0.9")), Some(ip("10.0.0.8"))),
        Err(RangeError::StartAfterEnd {
            start: ip("10.0.0.9"),
            end: ip("10.0.0.8")
        })
    );
    assert!(Range::new(net, 24, Some(ip("10.0.0.9")), Some(ip("10.0.0.9"))).is_ok());
}

#[test]
fn parse_cidr_accepts_and_rejects() {
    assert_eq!(
        Range::parse_cidr("10.244.1.0/24"),
        Ok((ip("10.244.1.0"), 24))
    );
    assert_eq!(Range::parse_cidr(" 10.0.0.0/8\n"), Ok((ip("10.0.0.0"), 8)));
    assert_eq!(Range::parse_cidr("0.0.0.0/0"), Ok((ip("0.0.0.0"), 0)));
    assert_eq!(Range::parse_cidr("10.0.0.1/32"), Ok((ip("10.0.0.1"), 32)));
    for bad in [
        "10.0.0.0/33",
        "x/24",
        "10.0.0.0",
        "10.0.0.0/",
        "10.0.0.0/+8",
        "10.0.0.0/-1",
        "10.0.0.0/024",
        // Taken before the parsers were unified; a leading zero is a
        // second spelling of the same prefix, which no CIDR may have.
        "10.0.0.0/08",
        "10.0.0.0/00",
        "10.0.0.0/24/1",
        "10.0.0/24",
        "fd00::/129",
        "fd00::1:/64",
        "",
    ] {
        match Range::parse_cidr(bad) {
            Err(e @ RangeError::BadCidr { .. }) => {
                assert!(e.to_string().contains("invalid CIDR"), "{e}")
            }
            other => panic!("{bad:?} parsed as {other:?}"),
        }
    }
}

#[test]
fn ipv6_ranges() {
    let r = range("fd00:10:244:1::/64");
    assert_eq!(r.start, ip("fd00:10:244:1::1"));
    // No broadcast in IPv6: the last address is leasable, as in host-local.
    assert_eq!(r.end, ip("fd00:10:244:1:ffff:ffff:ffff:ffff"));
    assert_eq!(r.size(), u128::from(u64::MAX));
    assert!(r.contains(ip("fd00:10:244:1::2")));
    assert!(!r.contains(ip("fd00:10:244:1::")));
    assert!(!r.contains(ip("10.244.1.1")));
    assert!(r.subnet_contains(ip("fd00:10:244:1::")));
    assert!(!r.subnet_contains(ip("fd00:10:244:2::1")));
    assert_eq!(r.nth(4), ip("fd00:10:244:1::5"));
    assert_eq!(r.offset(ip("fd00:10:244:1::5")), 4);
    let r = range("fd00::/126");
    assert_eq!(
        (r.start, r.end, r.size()),
        (ip("fd00::1"), ip("fd00::3"), 3)
    );

    let net = ip("fd00::");
    for p in [127, 128] {
        assert_eq!(
            Range::new(net, p, None, None),
            Err(RangeError::PrefixTooLong { prefix: p })
        );
    }
    assert!(matches!(
        Range::new(ip("fd00::1"), 64, None, None),
        Err(RangeError::HostBitsSet { .. })
    ));
    assert!(matches!(
        Range::new(net, 64, Some(ip("10.0.0.1")), None),
        Err(RangeError::MixedFamilies { which: "start", .. })
    ));
    assert!(matches!(
        Range::new(ip("10.0.0.0"), 24, None, Some(ip("fd00::5"))),
        Err(RangeError::MixedFamilies { which: "end", .. })
    ));
    assert!(matches!(
        Range::new(net, 120, Some(ip("fd00::1:1")), None),
        Err(RangeError::OutsideSubnet { which: "start", .. })
    ));
    assert_eq!(Range::parse_cidr("fd00::/64"), Ok((net, 64)));
}
