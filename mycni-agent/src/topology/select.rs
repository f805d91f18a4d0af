//! How the underlay is chosen (`--iface`, `--underlay6`): what the
//! overlay finds the underlay with and the kernel watch classifies
//! interface events by.

use std::net::{IpAddr, Ipv6Addr};

/// Which IPv6 address of the underlay interface `vxlan6.1` sends from
/// (`--underlay6`, ConfigMap key `underlay6`): `auto` (its first global
/// or unique-local one, if it has any), `off`, or one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Underlay6Select {
    #[default]
    Auto,
    Off,
    Address(Ipv6Addr),
}

impl std::str::FromStr for Underlay6Select {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "" | "auto" => Ok(Self::Auto),
            "off" => Ok(Self::Off),
            a => match a.parse::<Ipv6Addr>() {
                Ok(ip)
                    if !ip.is_unspecified()
                        && !ip.is_loopback()
                        && !ip.is_multicast()
                        && !ip.is_unicast_link_local()
                        && ip.to_ipv4_mapped().is_none() =>
                {
                    Ok(Self::Address(ip))
                }
                _ => Err(format!(
                    "{a:?}: not auto, off or a global or unique-local IPv6 address"
                )),
            },
        }
    }
}

impl std::fmt::Display for Underlay6Select {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Off => f.write_str("off"),
            Self::Address(a) => write!(f, "{a}"),
        }
    }
}

/// How the underlay interface is chosen (`--iface`, ConfigMap key
/// `underlay`). The forms follow Calico's IP autodetection methods, the ones
/// operators already know: an exact name, a name pattern, or the interface
/// the node would use to reach an address.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum UnderlaySelect {
    /// The interface of the default route.
    #[default]
    DefaultRoute,
    /// Exactly this interface.
    Name(String),
    /// The first interface (lowest ifindex) whose name matches this glob
    /// (`*`, `?`) and has an IPv4 address (on an IPv6-only node: a global
    /// or unique-local IPv6 one): `interface=eth*`.
    Pattern(String),
    /// The interface of the most specific route to this address:
    /// `can-reach=192.168.1.1`, `can-reach=fd00:77::1`.
    CanReach(IpAddr),
}

/// Linux's IFNAMSIZ less the terminating NUL.
const MAX_IFNAME: usize = 15;

impl std::str::FromStr for UnderlaySelect {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let valid_name_chars = |n: &str| {
            !n.is_empty()
                && n.len() <= MAX_IFNAME
                && !n.contains(['/', ':', '='])
                && !n.chars().any(char::is_whitespace)
        };
        if let Some(glob) = s.strip_prefix("interface=") {
            if !valid_name_chars(glob) {
                return Err(format!(
                    "interface={glob:?}: the pattern must be 1 to {MAX_IFNAME} characters of an interface name, with * and ? as wildcards"
                ));
            }
            return Ok(Self::Pattern(glob.to_string()));
        }
        if let Some(addr) = s.strip_prefix("can-reach=") {
            return addr
                .parse::<IpAddr>()
                .map(Self::CanReach)
                .map_err(|_| format!("can-reach={addr:?}: not an IPv4 or IPv6 address"));
        }
        if s.is_empty() || s == "default-route" {
            return Ok(Self::DefaultRoute);
        }
        if !valid_name_chars(s) || s.contains(['*', '?']) {
            return Err(format!(
                "{s:?} is not an interface name; use a name (eth0), interface=<pattern> (interface=en*), can-reach=<address> or default-route"
            ));
        }
        Ok(Self::Name(s.to_string()))
    }
}

impl std::fmt::Display for UnderlaySelect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::DefaultRoute => f.write_str("default-route"),
            Self::Name(n) => f.write_str(n),
            Self::Pattern(p) => write!(f, "interface={p}"),
            Self::CanReach(a) => write!(f, "can-reach={a}"),
        }
    }
}

/// Shell-style matching of `*` (any run) and `?` (one character), enough
/// for interface names; no character classes.
pub(crate) fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut pi, mut ni) = (0, 0);
    // The last `*` seen and the name position it was tried at: on a
    // mismatch, let that star swallow one more character.
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ni));
                pi += 1;
            }
            Some(c) if *c == '?' || *c == n[ni] => {
                pi += 1;
                ni += 1;
            }
            _ => match star {
                Some((sp, sn)) => {
                    pi = sp + 1;
                    ni = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn underlay_selection_parses_each_form() {
        let parse = |s: &str| s.parse::<UnderlaySelect>();
        assert_eq!(parse("eth0"), Ok(UnderlaySelect::Name("eth0".into())));
        assert_eq!(parse(""), Ok(UnderlaySelect::DefaultRoute));
        assert_eq!(parse("default-route"), Ok(UnderlaySelect::DefaultRoute));
        assert_eq!(
            parse("interface=en*"),
            Ok(UnderlaySelect::Pattern("en*".into()))
        );
        assert_eq!(
            parse("can-reach=192.168.1.1"),
            Ok(UnderlaySelect::CanReach(
                Ipv4Addr::new(192, 168, 1, 1).into()
            ))
        );
        assert_eq!(
            parse("can-reach=fd00:77::1"),
            Ok(UnderlaySelect::CanReach(
                "fd00:77::1".parse::<IpAddr>().expect("ip")
            ))
        );
        for bad in [
            "can-reach=example.com",
            "can-reach=10.0.0.0/8",
            "interface=",
            "eth*",
            "a-name-longer-than-15",
            "eth 0",
            "first-found=1",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
        for s in [
            "eth0",
            "interface=en*",
            "can-reach=10.0.0.1",
            "can-reach=fd00:77::1",
            "default-route",
        ] {
            assert_eq!(parse(s).map(|u| u.to_string()).as_deref(), Ok(s));
        }
    }

    #[test]
    fn glob_matches_like_a_shell() {
        for (p, n, want) in [
            ("eth*", "eth0", true),
            ("eth*", "eth", true),
            ("eth*", "ens3", false),
            ("en*", "enp0s3", true),
            ("e?h0", "eth0", true),
            ("*0", "bond0", true),
            ("*0", "bond1", false),
            ("*", "anything", true),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxbyy", false),
            ("eth0", "eth0", true),
            ("eth0", "eth01", false),
        ] {
            assert_eq!(glob_match(p, n), want, "{p} vs {n}");
        }
    }
}
