//! Only peer nodes may tunnel in: an nftables rule that drops VXLAN
//! datagrams for this host from any address that is not a peer Node's host
//! IP. `vxlan.1` checks nothing about the sender (learning is off, but any
//! host that can reach UDP 8472 could otherwise inject frames into pods,
//! with any inner source address).
//!
//! The rule lives in a table of its own per family, `ip mycni_underlay`
//! (and `ip6 mycni_underlay` for `vxlan6.1`), not in the
//! masquerade table: `tables::masq::install` replaces that table wholesale and only
//! runs with `--masquerade`, while this rule must always exist and its set
//! changes with every peer change. Two tables keep the two lifecycles apart,
//! and neither replace can open a window in the other.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::Result;

use super::metrics::UnderlayFilterMetrics;
use crate::metrics::Metrics;
use crate::nft;
use crate::verdict::{NFLOG_GROUP, NftVerdict, REPEATS, log_prefix, repeats_limit};

pub const TABLE: &str = "mycni_underlay";
pub(crate) const SET: &str = "peers";
const CHAIN: &str = "input";

/// An address family the filter keeps a table for: `ip mycni_underlay` for
/// `vxlan.1`'s IPv4 socket, `ip6 mycni_underlay` for `vxlan6.1`'s IPv6
/// one. Two tables of one name in two families, not one `inet` table: the
/// IPv4 one stays exactly as agents before the IPv6 underlay left it, so
/// an upgrade replaces nothing and leaves no stale table behind.
pub trait Family: Ord + Copy + std::fmt::Display {
    /// The nftables family.
    const NFT: &'static str;
    const SET_TYPE: &'static str;
    /// The source address match.
    const SADDR: &'static str;
}

impl Family for Ipv4Addr {
    const NFT: &'static str = "ip";
    const SET_TYPE: &'static str = "ipv4_addr";
    const SADDR: &'static str = "ip saddr";
}

impl Family for Ipv6Addr {
    const NFT: &'static str = "ip6";
    const SET_TYPE: &'static str = "ipv6_addr";
    const SADDR: &'static str = "ip6 saddr";
}

/// The chain and its one rule, as `add` commands.
///
/// The input hook sees only datagrams this host delivers to its own
/// sockets, i.e. to the VXLAN devices' UDP sockets: traffic forwarded
/// through the node with destination port 8472 (a pod speaking VXLAN to
/// some other host) is not our tunnel and is left alone, which prerouting
/// would only match with an extra `fib daddr type local`. It also runs
/// after reassembly, so fragments cannot slip past the port match.
/// Priority -10 is before the `filter` priority chains (iptables INPUT,
/// kube-proxy, firewalls), which then never spend work on these datagrams,
/// and before conntrack confirms the flow, so spoofed datagrams leave no
/// entries. One per family: `vxlan.1` has an IPv4 local address, so the
/// kernel opens an IPv4 socket for it only, and `vxlan6.1` an IPv6 one
/// (drivers/net/vxlan/vxlan_core.c, `vxlan_sock_add`); the IPv6 table is
/// there whether or not `vxlan6.1` is, so the device never has a moment
/// without it.
///
/// A dropped datagram goes through the chain `stranger`, which logs it to the
/// flows' NFLOG group (a sender's first once a second, set `logged`; its
/// repeats up to the table's rate, folded by the flows room), then drops
/// it; the counter stays on the input rule.
fn chain_and_rule<A: Family>(port: u16) -> String {
    let f = A::NFT;
    let saddr = A::SADDR;
    let (prefix, group) = (log_prefix(NftVerdict::UnderlayDrop), NFLOG_GROUP);
    format!(
        "add chain {f} {TABLE} stranger\n\
         flush chain {f} {TABLE} stranger\n\
         add rule {f} {TABLE} stranger add @logged {{ {saddr} limit rate 1/second burst 1 packets }} log group {group} prefix \"{prefix}\" drop\n\
         add rule {f} {TABLE} stranger limit name \"{REPEATS}\" log group {group} prefix \"{prefix}\" drop\n\
         add rule {f} {TABLE} stranger drop\n\
         add chain {f} {TABLE} {CHAIN} {{ type filter hook input priority -10; policy accept; }}\n\
         flush chain {f} {TABLE} {CHAIN}\n\
         add rule {f} {TABLE} {CHAIN} udp dport {port} {saddr} != @{SET} counter goto stranger comment \"mycni: VXLAN from a host that is not a peer node\"\n"
    )
}

/// Senders whose dropped VXLAN was logged in the last seconds.
fn logged_set<A: Family>() -> String {
    format!(
        "add set {} {TABLE} logged {{ type {}; flags dynamic, timeout; timeout 2s; size 4096; }}\n{}",
        A::NFT,
        A::SET_TYPE,
        repeats_limit(&format!("{} {TABLE}", A::NFT))
    )
}

fn elements<A: Family>(peers: &BTreeSet<A>) -> String {
    let mut s = String::new();
    for (i, ip) in peers.iter().enumerate() {
        let _ = write!(s, "{}{ip}", if i == 0 { "" } else { ", " });
    }
    s
}

fn ensure_one<A: Family>(port: u16) -> String {
    let f = A::NFT;
    format!(
        "add table {f} {TABLE}\n\
         add set {f} {TABLE} {SET} {{ type {}; }}\n{}{}",
        A::SET_TYPE,
        logged_set::<A>(),
        chain_and_rule::<A>(port)
    )
}

/// At start: creates the tables, sets and rules if missing, and replaces
/// the rules (the port may have changed), but keeps the sets' elements. An
/// agent restarted while the API is away keeps its peers' tunnels up until
/// the first pass, after the Node list, writes the sets again.
pub(crate) fn ensure_script(port: u16) -> String {
    ensure_one::<Ipv4Addr>(port) + &ensure_one::<Ipv6Addr>(port)
}

fn replace_one<A: Family>(port: u16, peers: &BTreeSet<A>) -> String {
    let f = A::NFT;
    // `add table` then `delete table` makes the delete succeed whether or
    // not the table exists; nft applies the whole file atomically.
    let mut s = format!(
        "add table {f} {TABLE}\n\
         delete table {f} {TABLE}\n\
         add table {f} {TABLE}\n\
         add set {f} {TABLE} {SET} {{ type {}; }}\n",
        A::SET_TYPE
    );
    if !peers.is_empty() {
        let _ = writeln!(s, "add element {f} {TABLE} {SET} {{ {} }}", elements(peers));
    }
    s.push_str(&logged_set::<A>());
    s.push_str(&chain_and_rule::<A>(port));
    s
}

/// Both tables, replaced in one transaction with the sets holding the
/// peers: for a first write after a failure, whatever state the tables
/// were left in (deleted, set of another type, chain of another priority).
pub(crate) fn replace_script(
    port: u16,
    peers: &BTreeSet<Ipv4Addr>,
    peers6: &BTreeSet<Ipv6Addr>,
) -> String {
    replace_one(port, peers) + &replace_one(port, peers6)
}

fn update_one<A: Family>(peers: &BTreeSet<A>) -> String {
    let f = A::NFT;
    let mut s = format!("flush set {f} {TABLE} {SET}\n");
    if !peers.is_empty() {
        let _ = writeln!(s, "add element {f} {TABLE} {SET} {{ {} }}", elements(peers));
    }
    s
}

/// The sets alone, flushed and refilled in one transaction: no datagram
/// ever meets a half-written set. An empty set drops all VXLAN of its
/// family.
pub(crate) fn update_script(peers: &BTreeSet<Ipv4Addr>, peers6: &BTreeSet<Ipv6Addr>) -> String {
    update_one(peers) + &update_one(peers6)
}

pub(crate) fn uninstall_script() -> String {
    format!(
        "add table ip {TABLE}\ndelete table ip {TABLE}\nadd table ip6 {TABLE}\ndelete table ip6 {TABLE}\n"
    )
}

/// Removes the tables (`mycni-agent uninstall`).
pub fn uninstall() -> Result<()> {
    nft::apply(&uninstall_script())
}

/// The peers' host IPs, per underlay family.
type Peers = (BTreeSet<Ipv4Addr>, BTreeSet<Ipv6Addr>);

/// The filter as the reconcile loop keeps it.
pub struct UnderlayFilter {
    port: u16,
    metrics: Arc<UnderlayFilterMetrics>,
    /// The table, set and rule are known to be in place.
    installed: bool,
    /// The sets as last written; None: unknown (start) or a write failed.
    written: Option<Peers>,
}

impl UnderlayFilter {
    /// Puts the rule in place, keeping the set's elements. Never fails: an
    /// error is logged and counted and the next `sync` replaces the table.
    pub fn start(port: u16, metrics: Arc<Metrics>) -> Self {
        let mut f = UnderlayFilter {
            port,
            metrics: metrics.collector::<UnderlayFilterMetrics>(),
            installed: false,
            written: None,
        };
        match nft::apply(&ensure_script(port)) {
            Ok(()) => f.installed = true,
            Err(e) => f.failed("installing the underlay filter", &e),
        }
        f
    }

    /// Makes the sets hold exactly the peers' host IPs, `peers` those of
    /// their IPv4 underlay and `peers6` of their IPv6 one; writes only when
    /// they changed since the last good write, so the blocking `nft` run (a
    /// few ms) is rare. Errors are logged and counted, not returned: the
    /// overlay must still follow the Nodes, and the next pass writes again.
    pub fn sync(
        &mut self,
        peers: impl IntoIterator<Item = Ipv4Addr>,
        peers6: impl IntoIterator<Item = Ipv6Addr>,
    ) {
        let want: Peers = (peers.into_iter().collect(), peers6.into_iter().collect());
        if self.installed && self.written.as_ref() == Some(&want) {
            return;
        }
        let updated = self.installed
            && match nft::apply(&update_script(&want.0, &want.1)) {
                Ok(()) => true,
                Err(e) => {
                    // Someone removed the table or the set: put it all back
                    // in this pass, not one resync later.
                    self.failed("updating the underlay filter's peer set", &e);
                    false
                }
            };
        let result = if updated {
            Ok(())
        } else {
            nft::apply(&replace_script(self.port, &want.0, &want.1))
        };
        match result {
            Ok(()) => {
                tracing::info!(
                    peers = want.0.len(),
                    peers_ipv6 = want.1.len(),
                    "underlay filter: VXLAN accepted from peer host IPs only"
                );
                self.metrics
                    .peers
                    .store((want.0.len() + want.1.len()) as u64, Ordering::Relaxed);
                self.installed = true;
                self.written = Some(want);
            }
            Err(e) => {
                self.failed("replacing the underlay filter", &e);
                self.installed = false;
                self.written = None;
            }
        }
    }

    fn failed(&self, what: &str, e: &anyhow::Error) {
        self.metrics.errors.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(error = %format!("{e:#}"), "{what} failed; retrying on the next pass");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ips: &[[u8; 4]]) -> BTreeSet<Ipv4Addr> {
        ips.iter().map(|o| Ipv4Addr::from(*o)).collect()
    }

    fn set6(ips: &[&str]) -> BTreeSet<Ipv6Addr> {
        ips.iter().map(|s| s.parse().expect("test IPv6")).collect()
    }

    #[test]
    fn update_flushes_and_refills_in_one_script() {
        assert_eq!(
            update_script(
                &set(&[[192, 168, 77, 13], [192, 168, 77, 12]]),
                &set6(&["fd00:77::3", "fd00:77::2"])
            ),
            "flush set ip mycni_underlay peers\n\
             add element ip mycni_underlay peers { 192.168.77.12, 192.168.77.13 }\n\
             flush set ip6 mycni_underlay peers\n\
             add element ip6 mycni_underlay peers { fd00:77::2, fd00:77::3 }\n"
        );
    }

    #[test]
    fn no_peers_leaves_the_set_empty_so_all_vxlan_drops() {
        assert_eq!(
            update_script(&BTreeSet::new(), &BTreeSet::new()),
            "flush set ip mycni_underlay peers\nflush set ip6 mycni_underlay peers\n"
        );
        let r = replace_script(8472, &BTreeSet::new(), &BTreeSet::new());
        assert!(!r.contains("add element"), "{r}");
        assert!(
            r.contains(
                "add rule ip mycni_underlay input udp dport 8472 ip saddr != @peers counter goto stranger"
            ),
            "{r}"
        );
        assert!(
            r.contains(
                "add rule ip6 mycni_underlay input udp dport 8472 ip6 saddr != @peers counter goto stranger"
            ),
            "{r}"
        );
    }

    #[test]
    fn replace_rebuilds_the_whole_table() {
        assert_eq!(
            replace_script(4789, &set(&[[10, 0, 0, 2]]), &set6(&["fd00::2"])),
            "add table ip mycni_underlay\n\
             delete table ip mycni_underlay\n\
             add table ip mycni_underlay\n\
             add set ip mycni_underlay peers { type ipv4_addr; }\n\
             add element ip mycni_underlay peers { 10.0.0.2 }\n\
             add set ip mycni_underlay logged { type ipv4_addr; flags dynamic, timeout; timeout 2s; size 4096; }\n\
             add limit ip mycni_underlay repeats { rate 2000/second burst 2000 packets; }\n\
             add chain ip mycni_underlay stranger\n\
             flush chain ip mycni_underlay stranger\n\
             add rule ip mycni_underlay stranger add @logged { ip saddr limit rate 1/second burst 1 packets } log group 1717 prefix \"mycni underlay-drop\" drop\n\
             add rule ip mycni_underlay stranger limit name \"repeats\" log group 1717 prefix \"mycni underlay-drop\" drop\n\
             add rule ip mycni_underlay stranger drop\n\
             add chain ip mycni_underlay input { type filter hook input priority -10; policy accept; }\n\
             flush chain ip mycni_underlay input\n\
             add rule ip mycni_underlay input udp dport 4789 ip saddr != @peers counter goto stranger comment \"mycni: VXLAN from a host that is not a peer node\"\n\
             add table ip6 mycni_underlay\n\
             delete table ip6 mycni_underlay\n\
             add table ip6 mycni_underlay\n\
             add set ip6 mycni_underlay peers { type ipv6_addr; }\n\
             add element ip6 mycni_underlay peers { fd00::2 }\n\
             add set ip6 mycni_underlay logged { type ipv6_addr; flags dynamic, timeout; timeout 2s; size 4096; }\n\
             add limit ip6 mycni_underlay repeats { rate 2000/second burst 2000 packets; }\n\
             add chain ip6 mycni_underlay stranger\n\
             flush chain ip6 mycni_underlay stranger\n\
             add rule ip6 mycni_underlay stranger add @logged { ip6 saddr limit rate 1/second burst 1 packets } log group 1717 prefix \"mycni underlay-drop\" drop\n\
             add rule ip6 mycni_underlay stranger limit name \"repeats\" log group 1717 prefix \"mycni underlay-drop\" drop\n\
             add rule ip6 mycni_underlay stranger drop\n\
             add chain ip6 mycni_underlay input { type filter hook input priority -10; policy accept; }\n\
             flush chain ip6 mycni_underlay input\n\
             add rule ip6 mycni_underlay input udp dport 4789 ip6 saddr != @peers counter goto stranger comment \"mycni: VXLAN from a host that is not a peer node\"\n"
        );
    }

    #[test]
    fn start_keeps_the_set_and_replaces_the_rule() {
        let s = ensure_script(8472);
        assert!(!s.contains("delete"), "{s}");
        assert!(!s.contains("flush set"), "{s}");
        assert!(s.contains("flush chain ip mycni_underlay input\n"), "{s}");
        assert!(s.contains("flush chain ip6 mycni_underlay input\n"), "{s}");
        assert!(
            s.contains("add set ip6 mycni_underlay peers { type ipv6_addr; }\n"),
            "{s}"
        );
        assert_eq!(s.matches("add rule").count(), 8, "{s}");
    }

    #[test]
    fn uninstall_works_whether_or_not_the_table_exists() {
        assert_eq!(
            uninstall_script(),
            "add table ip mycni_underlay\ndelete table ip mycni_underlay\n\
             add table ip6 mycni_underlay\ndelete table ip6 mycni_underlay\n"
        );
    }
}
