//! The addresses the built-in IPAM leases from, as the network config gives them.
//!
//! One type for both families: an address is an `IpAddr` and the arithmetic is done on
//! its bits as a `u128` (`mycni_common::net::Family`), so a /64 of IPv6 and a /24 of IPv4
//! take the same paths through the store.

use std::net::IpAddr;

use mycni_common::net::{Cidr, CidrError, Family};

/// Why a configured range cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    #[error(
        "invalid CIDR {input:?}: {reason} (expected a subnet like \"10.244.1.0/24\" or \
         \"fd00:10:244:1::/64\")"
    )]
    BadCidr { input: String, reason: String },
    #[error(
        "prefix length /{prefix} is too long: an IPv4 range needs /30 or shorter and an IPv6 \
         range /126 or shorter to have a usable address besides the network address (and \
         IPv4's broadcast)"
    )]
    PrefixTooLong { prefix: u8 },
    #[error("{network}/{prefix} has host bits set; the subnet is {expected}/{prefix}")]
    HostBitsSet {
        network: IpAddr,
        prefix: u8,
        expected: IpAddr,
    },
    #[error(
        "range {which} {ip} is outside the usable addresses of {network}/{prefix} \
         ({first}-{last}; the network address, and IPv4's broadcast, cannot be leased)"
    )]
    OutsideSubnet {
        which: &'static str,
        ip: IpAddr,
        network: IpAddr,
        prefix: u8,
        first: IpAddr,
        last: IpAddr,
    },
    #[error("range {which} {ip} is not of the family of the subnet {network}/{prefix}")]
    MixedFamilies {
        which: &'static str,
        ip: IpAddr,
        network: IpAddr,
        prefix: u8,
    },
    #[error("range start {start} is after range end {end}")]
    StartAfterEnd { start: IpAddr, end: IpAddr },
}

/// The addresses leases are taken from: a subnet plus the `start..=end` slice of it that
/// this node may hand out (defaulting to every usable address of the subnet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub network: IpAddr,
    pub prefix: u8,
    pub start: IpAddr,
    pub end: IpAddr,
}

/// Netmask for `prefix` in the family of `of`, saturating so that a hand-built `Range`
/// with a bogus prefix cannot make the shift overflow.
pub(super) fn netmask(of: IpAddr, prefix: u8) -> u128 {
    let width = u32::from(of.max_prefix());
    let full = u128::MAX >> (128 - width);
    let host = full.checked_shr(u32::from(prefix)).unwrap_or(0);
    full & !host
}

/// Every bit of `of`'s family set: the host part of a /0.
pub(super) fn all_ones(of: IpAddr) -> u128 {
    u128::MAX >> (128 - u32::from(of.max_prefix()))
}

/// The longest prefix a range may have: two usable addresses besides the network
/// address and, for IPv4, the broadcast (host-local's rule too).
fn max_range_prefix(of: IpAddr) -> u8 {
    of.max_prefix() - 2
}

impl Range {
    /// Validated here rather than at allocation time so that a bad network config fails the
    /// first ADD with a message about the config instead of an odd lease.
    pub fn new(
        network: IpAddr,
        prefix: u8,
        start: Option<IpAddr>,
        end: Option<IpAddr>,
    ) -> Result<Range, RangeError> {
        for (which, ip) in [("start", start), ("end", end)] {
            if let Some(ip) = ip
                && !ip.same_family(network)
            {
                return Err(RangeError::MixedFamilies {
                    which,
                    ip,
                    network,
                    prefix,
                });
            }
        }
        if prefix > max_range_prefix(network) {
            return Err(RangeError::PrefixTooLong { prefix });
        }
        let mask = netmask(network, prefix);
        let net = network.bits();
        if net & !mask != 0 {
            return Err(RangeError::HostBitsSet {
                network,
                prefix,
                expected: network.with_bits(net & mask),
            });
        }
        // The prefix bound makes both of these in-subnet and first <= last. IPv6 has no
        // broadcast: its last address is leasable (as host-local leases it).
        let first = network.with_bits(net + 1);
        let top = net | (all_ones(network) & !mask);
        let last = network.with_bits(if network.is_ipv4() { top - 1 } else { top });
        let check = |which: &'static str, ip: IpAddr| {
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
    pub fn parse_cidr(s: &str) -> Result<(IpAddr, u8), RangeError> {
        let c: Cidr<IpAddr> = s.trim().parse().map_err(|e| {
            let reason = match e {
                CidrError::BadAddress => "not an IP address".to_owned(),
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
    /// gateway or to other allocators. Never across families.
    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.same_family(self.start) && self.start <= ip && ip <= self.end
    }

    /// Whether `ip` is in the subnet at all (a gateway must be).
    pub fn subnet_contains(&self, ip: IpAddr) -> bool {
        Cidr::new(self.network, self.prefix).is_some_and(|c| c.contains(ip))
    }

    pub fn is_ipv4(&self) -> bool {
        self.network.is_ipv4()
    }

    /// 0 for a hand-built range with `start > end` or of mixed families, which therefore
    /// leases nothing.
    pub fn size(&self) -> u128 {
        if !self.start.same_family(self.end) || self.start > self.end {
            return 0;
        }
        // Saturates only for a hand-built range of all of IPv6, which `new` rejects.
        (self.end.bits() - self.start.bits()).saturating_add(1)
    }

    /// The `n`th address of `start..=end` (`n < size()`).
    pub(super) fn nth(&self, n: u128) -> IpAddr {
        self.start.with_bits(self.start.bits().wrapping_add(n))
    }

    /// How far `ip` is from `start` (`ip` in the range).
    pub(super) fn offset(&self, ip: IpAddr) -> u128 {
        ip.bits().wrapping_sub(self.start.bits())
    }
}
