//! The one CIDR and the one MAC type of mycni, with the one parser each.
//!
//! The plugin reads CIDRs from network configs and results, the agent from
//! Node objects and its flags; before this module each had its own parser
//! with slightly different rules (one took `/08`, one `+24`). Every text
//! form is now checked by the rules here, which are the strictest any of
//! them had:
//!
//! - `<address>/<prefix>`, the address as `std` parses it (no leading zeros
//!   in IPv4 octets), the prefix plain decimal: no sign, no leading zero,
//!   no spaces, at most 32 for IPv4 and 128 for IPv6;
//! - a MAC is exactly six `:`-separated octets of two hex digits each.
//!
//! Host bits are a caller's choice: an interface address (`10.244.1.5/24`)
//! has them, a network (`10.244.1.0/24`) must not. [`Cidr::from_str`] keeps
//! them, [`Cidr::parse_network`] rejects them.
//!
//! [`Cidr`] is generic over the address family so that IPv4-only callers
//! (everything today) get `Ipv4Addr` back without a fallible conversion,
//! while dual-stack code can use `Cidr<IpAddr>` with the same parser.

use core::fmt;
use core::hash::Hash;
use core::str::FromStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::string::String;

mod sealed {
    pub trait Sealed {}
    impl Sealed for std::net::Ipv4Addr {}
    impl Sealed for std::net::Ipv6Addr {}
    impl Sealed for std::net::IpAddr {}
}

/// An address type a [`Cidr`] can hold: `Ipv4Addr`, `Ipv6Addr` or `IpAddr`.
pub trait Family:
    sealed::Sealed + Copy + Eq + Ord + Hash + fmt::Debug + fmt::Display + FromStr
{
    /// The longest prefix of this address's family (32 or 128).
    fn max_prefix(self) -> u8;
    /// The address as an integer, right-aligned.
    fn bits(self) -> u128;
    /// An address of `self`'s family from `bits` (truncated to the family).
    fn with_bits(self, bits: u128) -> Self;
    /// Whether `other` is of the same family as `self`.
    fn same_family(self, other: Self) -> bool;
}

impl Family for Ipv4Addr {
    fn max_prefix(self) -> u8 {
        32
    }
    fn bits(self) -> u128 {
        u128::from(u32::from(self))
    }
    fn with_bits(self, bits: u128) -> Self {
        // Truncation is the point: the mask arithmetic is done in u128.
        Ipv4Addr::from(bits as u32)
    }
    fn same_family(self, _: Self) -> bool {
        true
    }
}

impl Family for Ipv6Addr {
    fn max_prefix(self) -> u8 {
        128
    }
    fn bits(self) -> u128 {
        u128::from(self)
    }
    fn with_bits(self, bits: u128) -> Self {
        Ipv6Addr::from(bits)
    }
    fn same_family(self, _: Self) -> bool {
        true
    }
}

impl Family for IpAddr {
    fn max_prefix(self) -> u8 {
        match self {
            IpAddr::V4(a) => a.max_prefix(),
            IpAddr::V6(a) => a.max_prefix(),
        }
    }
    fn bits(self) -> u128 {
        match self {
            IpAddr::V4(a) => a.bits(),
            IpAddr::V6(a) => a.bits(),
        }
    }
    fn with_bits(self, bits: u128) -> Self {
        match self {
            IpAddr::V4(a) => IpAddr::V4(a.with_bits(bits)),
            IpAddr::V6(a) => IpAddr::V6(a.with_bits(bits)),
        }
    }
    fn same_family(self, other: Self) -> bool {
        self.is_ipv4() == other.is_ipv4()
    }
}

/// Why a CIDR's text was refused. The messages are what the callers show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CidrError {
    /// No `/`.
    MissingPrefix,
    /// The part before `/` is not an address of the expected family.
    BadAddress,
    /// The part after `/` is not plain decimal within the family's bound.
    BadPrefix { max: u8 },
    /// The address has bits set past the prefix (only [`Cidr::parse_network`]).
    HostBits,
}

impl fmt::Display for CidrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CidrError::MissingPrefix => write!(f, "missing \"/<prefix length>\""),
            CidrError::BadAddress => write!(f, "not an IP address of the expected family"),
            CidrError::BadPrefix { max } => {
                write!(f, "prefix length must be a number from 0 to {max}")
            }
            CidrError::HostBits => write!(f, "host bits are set"),
        }
    }
}

impl std::error::Error for CidrError {}

/// An address and a prefix length, the prefix within its family's bound.
/// Ordered by address, then prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr<A: Family = IpAddr> {
    addr: A,
    prefix: u8,
}

impl<A: Family> Cidr<A> {
    /// None when `prefix` is longer than the family allows.
    pub fn new(addr: A, prefix: u8) -> Option<Self> {
        (prefix <= addr.max_prefix()).then_some(Cidr { addr, prefix })
    }

    /// The address as given (host bits included, see [`Cidr::network`]).
    pub fn addr(self) -> A {
        self.addr
    }

    pub fn prefix(self) -> u8 {
        self.prefix
    }

    /// The netmask as an integer of the family's width.
    fn mask(self) -> u128 {
        let width = u32::from(self.addr.max_prefix());
        let full = u128::MAX >> (128 - width);
        // `checked_shr`: a /0 shifts by the full width, which `>>` forbids.
        let host = full.checked_shr(u32::from(self.prefix)).unwrap_or(0);
        full & !host
    }

    /// The first address of the network (host bits cleared).
    pub fn network(self) -> A {
        self.addr.with_bits(self.addr.bits() & self.mask())
    }

    /// The last address of the network (host bits set).
    pub fn last(self) -> A {
        let width = u32::from(self.addr.max_prefix());
        let full = u128::MAX >> (128 - width);
        self.addr
            .with_bits(self.addr.bits() | (full & !self.mask()))
    }

    /// This network, host bits cleared.
    pub fn trunc(self) -> Self {
        Cidr {
            addr: self.network(),
            prefix: self.prefix,
        }
    }

    /// Whether the address has no host bits set.
    pub fn is_network(self) -> bool {
        self.network() == self.addr
    }

    /// Whether `ip` is inside the network (never across families).
    pub fn contains(self, ip: A) -> bool {
        self.addr.same_family(ip) && ip.bits() & self.mask() == self.addr.bits() & self.mask()
    }

    /// True when `other` lies entirely inside `self`.
    pub fn covers(self, other: Self) -> bool {
        other.prefix >= self.prefix && self.contains(other.addr)
    }

    pub fn overlaps(self, other: Self) -> bool {
        self.covers(other) || other.covers(self)
    }

    /// Parses a network: like `from_str`, and no host bits may be set
    /// (`10.244.1.1/24` means the writer meant something else).
    pub fn parse_network(s: &str) -> Result<Self, CidrError> {
        let c: Self = s.parse()?;
        if c.is_network() {
            Ok(c)
        } else {
            Err(CidrError::HostBits)
        }
    }
}

impl Cidr<IpAddr> {
    /// The IPv4 view of an IPv4 CIDR.
    pub fn as_v4(self) -> Option<Cidr<Ipv4Addr>> {
        match self.addr {
            IpAddr::V4(addr) => Some(Cidr {
                addr,
                prefix: self.prefix,
            }),
            IpAddr::V6(_) => None,
        }
    }
}

impl From<Cidr<Ipv4Addr>> for Cidr<IpAddr> {
    fn from(c: Cidr<Ipv4Addr>) -> Self {
        Cidr {
            addr: IpAddr::V4(c.addr),
            prefix: c.prefix,
        }
    }
}

impl From<Cidr<Ipv6Addr>> for Cidr<IpAddr> {
    fn from(c: Cidr<Ipv6Addr>) -> Self {
        Cidr {
            addr: IpAddr::V6(c.addr),
            prefix: c.prefix,
        }
    }
}

/// The prefix length's text: plain decimal, "0" or no leading zero, no sign
/// (`u8::from_str` alone would take "+24" and "024", which the fuzz targets
/// found accepted and then re-rendered differently).
fn parse_prefix(p: &str, max: u8) -> Result<u8, CidrError> {
    let bad = CidrError::BadPrefix { max };
    let canonical = match p.as_bytes() {
        [b'0'] => true,
        [b'1'..=b'9', rest @ ..] => rest.len() <= 2 && rest.iter().all(u8::is_ascii_digit),
        _ => false,
    };
    if !canonical {
        return Err(bad);
    }
    let n: u16 = p.parse().map_err(|_| bad)?;
    u8::try_from(n).ok().filter(|n| *n <= max).ok_or(bad)
}

impl<A: Family> FromStr for Cidr<A> {
    type Err = CidrError;

    /// `<address>/<prefix>`, host bits kept (see [`Cidr::parse_network`]).
    fn from_str(s: &str) -> Result<Self, CidrError> {
        let (a, p) = s.split_once('/').ok_or(CidrError::MissingPrefix)?;
        let addr: A = a.parse().map_err(|_| CidrError::BadAddress)?;
        let prefix = parse_prefix(p, addr.max_prefix())?;
        Ok(Cidr { addr, prefix })
    }
}

impl<A: Family> fmt::Display for Cidr<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl<A: Family> serde::Serialize for Cidr<A> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de, A: Family> serde::Deserialize<'de> for Cidr<A> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// An Ethernet MAC address; text is `aa:bb:cc:dd:ee:ff` (lower case out,
/// either case in).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Mac(pub [u8; 6]);

impl Mac {
    pub const ZERO: Mac = Mac([0; 6]);

    pub const fn octets(self) -> [u8; 6] {
        self.0
    }

    /// Neither zero nor a group (multicast or broadcast) address: one host.
    pub fn is_unicast(self) -> bool {
        self != Mac::ZERO && self.0[0] & 1 == 0
    }
}

impl From<[u8; 6]> for Mac {
    fn from(b: [u8; 6]) -> Self {
        Mac(b)
    }
}

impl From<Mac> for [u8; 6] {
    fn from(m: Mac) -> Self {
        m.0
    }
}

/// The wrong number of bytes for a MAC (netlink gives addresses as slices).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MacError;

impl fmt::Display for MacError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not a MAC address (six hex octets separated by ':')")
    }
}

impl std::error::Error for MacError {}

impl TryFrom<&[u8]> for Mac {
    type Error = MacError;
    fn try_from(b: &[u8]) -> Result<Self, MacError> {
        <[u8; 6]>::try_from(b).map(Mac).map_err(|_| MacError)
    }
}

impl FromStr for Mac {
    type Err = MacError;

    fn from_str(s: &str) -> Result<Self, MacError> {
        let mut m = [0u8; 6];
        let mut parts = s.split(':');
        for byte in &mut m {
            let p = parts.next().ok_or(MacError)?;
            // Two hex digits; `from_str_radix` alone would also take "+f"
            // (found by the `peer_node` fuzz target).
            if p.len() != 2 || !p.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(MacError);
            }
            *byte = u8::from_str_radix(p, 16).map_err(|_| MacError)?;
        }
        match parts.next() {
            None => Ok(Mac(m)),
            Some(_) => Err(MacError),
        }
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl serde::Serialize for Mac {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Mac {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// An IPv4 CIDR. The IPv4 side is the one every node of a cluster with
/// an IPv4 range has, and most of the agent's code speaks of it.
pub type Cidr4 = Cidr<Ipv4Addr>;
/// An IPv6 CIDR, by the same parser.
pub type Cidr6 = Cidr<Ipv6Addr>;

/// The cluster's pod ranges (kube-controller-manager `--cluster-cidr`,
/// one per family, at least one). No IPv6 range: the agent does not do
/// IPv6, and ignores every IPv6 podCIDR. No IPv4 range: an IPv6-only
/// cluster, whose nodes have no `vxlan.1` (see [`crate::node::select_all`]); every
/// IPv4 podCIDR is ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterCidrs {
    pub v4: Option<Cidr4>,
    pub v6: Option<Cidr6>,
}

impl From<Cidr4> for ClusterCidrs {
    fn from(v4: Cidr4) -> Self {
        ClusterCidrs {
            v4: Some(v4),
            v6: None,
        }
    }
}

impl ClusterCidrs {
    /// Both families' ranges, at least one of them.
    pub fn new(v4: Option<Cidr4>, v6: Option<Cidr6>) -> Result<Self, String> {
        if v4.is_none() && v6.is_none() {
            return Err("no cluster CIDR of either family".into());
        }
        Ok(ClusterCidrs { v4, v6 })
    }

    /// An IPv6-only cluster: its nodes have no IPv4 podCIDR, hence no
    /// `vxlan.1`, and reach each other over `vxlan6.1` alone.
    pub fn ipv6_only(&self) -> bool {
        self.v4.is_none() && self.v6.is_some()
    }
}

/// As `--cluster-cidr` takes them: `10.244.0.0/16,fd00:10:244::/56`.
impl fmt::Display for ClusterCidrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.v4, &self.v6) {
            (Some(v4), Some(v6)) => write!(f, "{v4},{v6}"),
            (Some(v4), None) => write!(f, "{v4}"),
            (None, Some(v6)) => write!(f, "{v6}"),
            (None, None) => f.write_str("none"),
        }
    }
}

/// A node's own podCIDRs, as far as they are known and valid.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodCidrs {
    pub v4: Option<Cidr4>,
    pub v6: Option<Cidr6>,
}

/// As an operator reads them in a log: `10.244.2.0/24, fd00:10:244:2::/64`.
impl fmt::Display for PodCidrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.v4, &self.v6) {
            (Some(v4), Some(v6)) => write!(f, "{v4}, {v6}"),
            (Some(v4), None) => write!(f, "{v4}"),
            (None, Some(v6)) => write!(f, "{v6}"),
            (None, None) => f.write_str("none"),
        }
    }
}

impl From<Option<Cidr4>> for PodCidrs {
    fn from(v4: Option<Cidr4>) -> Self {
        PodCidrs { v4, v6: None }
    }
}

impl From<Cidr4> for PodCidrs {
    fn from(v4: Cidr4) -> Self {
        PodCidrs {
            v4: Some(v4),
            v6: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::format;
    use std::string::{String, ToString};
    use std::vec::Vec;

    #[test]
    fn accepts_the_canonical_forms() {
        let c: Cidr4 = "10.244.1.5/24".parse().unwrap();
        assert_eq!((c.addr(), c.prefix()), (Ipv4Addr::new(10, 244, 1, 5), 24));
        assert_eq!(c.network(), Ipv4Addr::new(10, 244, 1, 0));
        assert_eq!(c.last(), Ipv4Addr::new(10, 244, 1, 255));
        assert!(!c.is_network());
        assert_eq!(
            Cidr4::parse_network("10.244.1.5/24"),
            Err(CidrError::HostBits)
        );
        assert!(Cidr4::parse_network("0.0.0.0/0").is_ok());
        assert!(Cidr4::parse_network("10.0.0.1/32").is_ok());
        let v6: Cidr<Ipv6Addr> = "fd00::/8".parse().unwrap();
        assert_eq!(v6.prefix(), 8);
        assert!("fd00::/128".parse::<Cidr<IpAddr>>().is_ok());
        assert!("10.0.0.0/8".parse::<Cidr<IpAddr>>().is_ok());
        assert!("::/0".parse::<Cidr<IpAddr>>().is_ok());
    }

    #[test]
    fn rejects_what_any_old_parser_rejected() {
        for bad in [
            "10.244.1.0/33",
            "10.244.1.0",
            "x/24",
            "10.244.1.0/+24",
            "10.244.1.0/024",
            "10.0.0.0/08",
            "10.0.0.0/00",
            "10.0.0.0/",
            "10.0.0.0/ 8",
            " 10.0.0.0/8",
            "10.0.0.0/-1",
            "10.0.0.0/24/1",
            "10.0.0/24",
            "010.0.0.0/8",
            "::1/64",
            "",
        ] {
            assert!(bad.parse::<Cidr4>().is_err(), "{bad}");
        }
        for bad in ["fd00::/129", "fd00::/0128", "fd00::/+64", "10.0.0.0/8"] {
            assert!(bad.parse::<Cidr<Ipv6Addr>>().is_err(), "{bad}");
        }
        assert_eq!(
            "10.0.0.0/33".parse::<Cidr<IpAddr>>(),
            Err(CidrError::BadPrefix { max: 32 })
        );
        assert!(Cidr4::new(Ipv4Addr::UNSPECIFIED, 33).is_none());
        assert!(Cidr::new(Ipv6Addr::UNSPECIFIED, 128).is_some());
    }

    #[test]
    fn set_relations() {
        let p = |s: &str| Cidr4::parse_network(s).unwrap();
        assert!(p("10.244.0.0/16").covers(p("10.244.1.0/24")));
        assert!(!p("10.244.1.0/24").covers(p("10.244.0.0/16")));
        assert!(p("10.244.1.0/24").overlaps(p("10.244.0.0/16")));
        assert!(!p("10.244.1.0/24").overlaps(p("10.244.2.0/24")));
        assert!(p("0.0.0.0/0").contains(Ipv4Addr::BROADCAST));
        let any = |s: &str| s.parse::<Cidr<IpAddr>>().unwrap();
        assert!(!any("0.0.0.0/0").contains("::".parse().unwrap()));
        assert!(!any("::/0").overlaps(any("0.0.0.0/0")));
        assert_eq!(any("10.1.0.0/16").as_v4(), Some(p("10.1.0.0/16")));
        assert_eq!(any("fd00::/8").as_v4(), None);
    }

    #[test]
    fn macs() {
        assert_eq!(
            "02:AB:cd:00:00:01".parse(),
            Ok(Mac([2, 0xab, 0xcd, 0, 0, 1]))
        );
        assert_eq!(
            Mac([2, 0xab, 0xcd, 0, 0, 1]).to_string(),
            "02:ab:cd:00:00:01"
        );
        for bad in [
            "02:00:00:00:00:+1",
            "+2:00:00:00:00:01",
            "02:00:00:00:00:1",
            "02:00:00:00:00:001",
            "02-00-00-00-00-01",
            "02:00:00:00:00:0g",
            "02:00:00:00:00:01:",
            "02:00:00:00:00",
            "",
        ] {
            assert_eq!(bad.parse::<Mac>(), Err(MacError), "{bad}");
        }
        assert!(Mac([2, 0, 0, 0, 0, 1]).is_unicast());
        assert!(!Mac([1, 0, 0x5e, 0, 0, 1]).is_unicast());
        assert!(!Mac::ZERO.is_unicast());
        assert_eq!(Mac::try_from(&[1u8, 2, 3][..]), Err(MacError));
    }

    #[test]
    fn serde_uses_the_text_form() {
        let c: Cidr4 = "10.244.1.0/24".parse().unwrap();
        assert_eq!(serde_json::to_string(&c).unwrap(), "\"10.244.1.0/24\"");
        assert_eq!(
            serde_json::from_str::<Cidr4>("\"10.244.1.0/24\"").unwrap(),
            c
        );
        assert!(serde_json::from_str::<Cidr4>("\"10.244.1.0/+24\"").is_err());
        let m = Mac([2, 0, 0, 0, 0, 1]);
        assert_eq!(serde_json::to_string(&m).unwrap(), "\"02:00:00:00:00:01\"");
        assert_eq!(
            serde_json::from_str::<Mac>("\"02:00:00:00:00:01\"").unwrap(),
            m
        );
    }

    fn any_cidr() -> impl Strategy<Value = Cidr<IpAddr>> {
        prop_oneof![
            (any::<u32>(), 0u8..=32).prop_map(|(a, p)| Cidr {
                addr: IpAddr::V4(Ipv4Addr::from(a)),
                prefix: p
            }),
            (any::<u128>(), 0u8..=128).prop_map(|(a, p)| Cidr {
                addr: IpAddr::V6(Ipv6Addr::from(a)),
                prefix: p
            }),
        ]
    }

    proptest! {
        #[test]
        fn cidr_round_trips(c in any_cidr()) {
            let s = c.to_string();
            prop_assert_eq!(s.parse::<Cidr<IpAddr>>(), Ok(c));
            prop_assert_eq!(Cidr::<IpAddr>::parse_network(&s).is_ok(), c.is_network());
            prop_assert!(c.trunc().is_network());
            prop_assert!(c.trunc().covers(c) && c.contains(c.addr()) && c.contains(c.last()));
            if let Some(v4) = c.as_v4() {
                prop_assert_eq!(s.parse::<Cidr4>(), Ok(v4));
                prop_assert_eq!(Cidr::from(v4), c);
            } else {
                prop_assert!(s.parse::<Cidr4>().is_err());
            }
        }

        /// Whatever the parser takes renders back to the very same text: no
        /// second spelling of a CIDR gets through.
        #[test]
        fn accepted_text_is_canonical(s in "[0-9a-f:./+ -]{0,24}") {
            if let Ok(c) = s.parse::<Cidr<IpAddr>>() {
                prop_assert_eq!(c.to_string(), s.clone());
            }
            if let Ok(c) = s.parse::<Cidr4>() {
                prop_assert_eq!(c.to_string(), s);
            }
        }

        #[test]
        fn signed_or_padded_prefixes_are_rejected(c in any_cidr(), pad in "[+0 ]{1,3}") {
            let s = format!("{}/{}{}", c.addr(), pad, c.prefix());
            prop_assert!(s.parse::<Cidr<IpAddr>>().is_err(), "{}", s);
        }

        #[test]
        fn prefix_bounds_per_family(c in any_cidr(), extra in 1u16..200) {
            let p = u16::from(c.addr().max_prefix()) + extra;
            let s = format!("{}/{}", c.addr(), p);
            prop_assert!(s.parse::<Cidr<IpAddr>>().is_err(), "{}", s);
        }

        #[test]
        fn mac_round_trips(b in any::<[u8; 6]>()) {
            let m = Mac(b);
            prop_assert_eq!(m.to_string().parse::<Mac>(), Ok(m));
            prop_assert_eq!(m.to_string().to_uppercase().parse::<Mac>(), Ok(m));
        }

        #[test]
        fn accepted_mac_text_is_canonical(s in "[0-9a-fA-F:+ -]{0,20}") {
            if let Ok(m) = s.parse::<Mac>() {
                prop_assert_eq!(m.to_string(), s.to_ascii_lowercase());
            }
        }

        #[test]
        fn signed_mac_octets_are_rejected(b in any::<[u8; 6]>(), i in 0usize..6) {
            let mut parts: Vec<String> = b.iter().map(|x| format!("{x:02x}")).collect();
            parts[i] = format!("+{:x}", b[i] & 0xf);
            prop_assert!(parts.join(":").parse::<Mac>().is_err());
        }
    }
}
