//! The addresses the built-in IPAM leases from, as the network config gives them.

use std::net::Ipv4Addr;

use mycni_common::net::{Cidr, CidrError};

/// Why a configured range cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    #[error("invalid CIDR {input:?}: {reason} (expected an IPv4 subnet like \"10.244.1.0/24\")")]
    BadCidr { input: String, reason: String },
    #[error(
        "prefix length /{prefix} is too long: an IPv4 range needs /30 or shorter to have a \
         usable address besides the network and broadcast addresses"
    )]
    PrefixTooLong { prefix: u8 },
    #[error("{network}/{prefix} has host bits set; the subnet is {expected}/{prefix}")]
    HostBitsSet {
        network: Ipv4Addr,
        prefix: u8,
        expected: Ipv4Addr,
    },
    #[error(
        "range {which} {ip} is outside the usable addresses of {network}/{prefix} \
         ({first}-{last}; the network and broadcast addresses cannot be leased)"
    )]
    OutsideSubnet {
        which: &'static str,
        ip: Ipv4Addr,
        network: Ipv4Addr,
        prefix: u8,
        first: Ipv4Addr,
        last: Ipv4Addr,
    },
    #[error("range start {start} is after range end {end}")]
    StartAfterEnd { start: Ipv4Addr, end: Ipv4Addr },
}

/// The addresses leases are taken from: a subnet plus the `start..=end` slice of it that
/// this node may hand out (defaulting to every usable address of the subnet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub network: Ipv4Addr,
    pub prefix: u8,
    pub start: Ipv4Addr,
    pub end: Ipv4Addr,
}

/// Netmask for `prefix`, saturating so that a hand-built `Range` with a bogus prefix cannot
/// make the shift overflow.
pub(super) fn netmask(prefix: u8) -> u32 {
    match prefix {
        0 => 0,
        p if p >= 32 => u32::MAX,
        p => u32::MAX << (32 - u32::from(p)),
    }
}

impl Range {
    /// Validated here rather than at allocation time so that a bad network config fails the
    /// first ADD with a message about the config instead of an odd lease.
    pub fn new(
        network: Ipv4Addr,
        prefix: u8,
        start: Option<Ipv4Addr>,
        end: Option<Ipv4Addr>,
    ) -> Result<Range, RangeError> {
        if prefix > 30 {
            return Err(RangeError::PrefixTooLong { prefix });
        }
        let mask = netmask(prefix);
        let net = u32::from(network);
        if net & !mask != 0 {
            return Err(RangeError::HostBitsSet {
                network,
                prefix,
                expected: Ipv4Addr::from(net & mask),
            });
        }
        // prefix <= 30 makes both of these in-subnet and first <= last.
        let first = Ipv4Addr::from(net + 1);
        let last = Ipv4Addr::from((net | !mask) - 1);
        let check = |which: &'static str, ip: Ipv4Addr| {
            if ip < first || ip > last {
                Err(RangeError::OutsideSubnet {
                    which,
                    ip,
                    network,
                    prefix,
                    first,
                    last,
                })
            } else {
                Ok(ip)
            }
        };
        let start = check("start", start.unwrap_or(first))?;
        let end = check("end", end.unwrap_or(last))?;
        if start > end {
            return Err(RangeError::StartAfterEnd { start, end });
        }
        Ok(Range {
            network,
            prefix,
            start,
            end,
        })
    }

    /// Network configs carry the subnet as one string; this keeps the split in one place.
    /// Host bits are accepted here and rejected by [`Range::new`], which can name the fix.
    /// The syntax is `mycni_common::net`'s (no "+24", no "024"), surrounding
    /// whitespace aside, which hand-written configs have.
    pub fn parse_cidr(s: &str) -> Result<(Ipv4Addr, u8), RangeError> {
        let c: Cidr<Ipv4Addr> = s.trim().parse().map_err(|e| {
            let reason = match e {
                CidrError::BadAddress => "not an IPv4 address".to_owned(),
                e => e.to_string(),
            };
            RangeError::BadCidr {
                input: s.to_owned(),
                reason,
            }
        })?;
        Ok((c.addr(), c.prefix()))
    }

    /// Only `start..=end` is ours to lease; the rest of the subnet may belong to the
    /// gateway or to other allocators.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        self.start <= ip && ip <= self.end
    }

    /// 0 for a hand-built range with `start > end`, which therefore leases nothing.
    pub fn size(&self) -> u32 {
        let (start, end) = (u32::from(self.start), u32::from(self.end));
        if start > end {
            0
        } else {
            // Saturates only for a hand-built 0.0.0.0-255.255.255.255, which `new` rejects.
            (end - start).saturating_add(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipam::testutil::{ip, range};

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

        let r = Range::new(
            ip("10.0.0.0"),
            16,
            Some(ip("10.0.1.20")),
            Some(ip("10.0.3.50")),
        )
        .unwrap();
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
        assert_eq!(r.size(), u32::MAX - 1);
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
            "::1/64",
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
}
