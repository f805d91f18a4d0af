//! The policy table, `inet mycni_policy`: a fixed ruleset over the sets of
//! `sets.rs`, written whole once and then changed by set members only.
//!
//! Where it decides: the `forward` hook at filter priority, after
//! kube-proxy's DNAT (prerouting, -100) and before masquerade (postrouting,
//! srcnat 100), so a connection to a Service is judged on its backend and
//! its client's own address. The node's own traffic to and from its pods
//! crosses `output`/`input`, never `forward`: the node and its pods always
//! reach each other, told apart by hook, not by an address a masquerade
//! could fake. A remote node's own traffic arrives from its overlay
//! address, which only an ipBlock can match.
//!
//! What it reads: the connection's conntrack tuple, the client as `ct
//! original` saddr and the server (after DNAT) as `ct reply` saddr, so
//! every packet (the first, a reply, a SYN meeting an old ESTABLISHED
//! entry) is judged as its connection, whichever way it travels. The
//! server's port is the packet's `th dport` in the original direction and
//! its `th sport` in the reply direction (forward runs after DNAT and
//! before the reply's un-DNAT, so both are the backend's port): nft cannot
//! put `ct reply proto-src` in a concatenation (its size depends on the
//! protocol).
//!
//! A connection is judged again under every new policy, not only at its
//! first packet: a policy change cuts a live connection it no longer
//! allows at its next packet, on both datapaths (see the stamp below).
//! Within one policy epoch its verdict cannot change, so an established
//! connection already admitted under the current epoch is accepted first
//! thing (chain `judged`, one conntrack mark compare), as the fast path
//! forwards it; the kernel path judged each of its packets before.
//!
//! Both datapaths bring every new connection here: the fast path forwards
//! only established TCP / assured UDP flows without NAT and leaves SYN,
//! FIN, RST, unconfirmed and DNATed flows to the kernel
//! (mycni-agent/tests/datapath/ebpf_prog/fast_path.rs,
//! `everything_else_is_left_to_the_kernel_untouched`, keeps that so).
//!
//! Every packet it lets through stamps its connection's conntrack mark
//! with the current policy epoch (bits 16-27, `stamp`); the fast path
//! forwards an established flow only while its stamp is current, so a
//! policy change sends each live flow back here once, to be judged again
//! (cut, or stamped and fast again).
//!
//! Fail closed: once any NetworkPolicy exists, a pod veth's packets from
//! or to an address the room has not judged (its Pod unknown yet) are
//! dropped until its rules exist (set `known`); the node's own traffic to
//! it is not (it never crosses forward).
//!
//! What passes first: related packets (ICMP errors about a connection),
//! neighbour discovery. Packets without a connection (conntrack's invalid
//! or untracked) to or from an isolated pod are dropped: there is no tuple
//! to judge them on.
//!
//! What it counts (`counters.rs`): the maps that admit return a named
//! counter with the same lookup that admits (`counter name <key> map
//! @eg_allow4 return`: found, it counts and returns; not found, the rule
//! does not match and the next one is tried, as with `@set`), so the
//! admitting path costs what it did, a lookup per map, plus a per-CPU
//! counter add, and does not grow with the number of policies or rules.
//! Only the dropping path has one more lookup (the pod's denial counter).
//! Every drop counts under a fixed counter by direction and reason.

use std::fmt::Write as _;

use mycni_common::contract::HOST_VETH_PREFIX;
use mycni_common::{POLICY_MARK_MASK, POLICY_MARK_SHIFT};

use super::counters::{UNLOGGED, drop_counter, drop_counters};
use super::sets::{Desired, SetKind, SetName};
use crate::verdict::{
    Direction, NFLOG_GROUP as GROUP, NftVerdict, REPEATS, Reason, log_prefix, repeats_limit,
};

pub const TABLE: &str = "mycni_policy";
pub(crate) const FAMILY: &str = "inet";

fn set_type(kind: SetKind, v6: bool) -> String {
    let a = if v6 { "ipv6_addr" } else { "ipv4_addr" };
    match kind {
        SetKind::EgIso | SetKind::InIso => format!("type {a};"),
        SetKind::Known => format!("type {a}; flags interval;"),
        SetKind::SelfPair => format!("type {a} . {a};"),
        SetKind::EgAny | SetKind::InAny => format!("type {a} . {a} : counter; flags interval;"),
        SetKind::EgAllow | SetKind::InAllow => {
            format!("type {a} . {a} . inet_proto . inet_service : counter; flags interval;")
        }
        SetKind::EgDeny | SetKind::InDeny => format!("type {a} : counter;"),
    }
}

/// `add counter` of one named counter, with its comment. The name goes
/// bare (nft takes no quoted one here): every name is a letter and hex
/// digits, or one of the fixed words of `counters.rs`, none a keyword.
fn add_counter(s: &mut String, name: &str, comment: &str) {
    let _ = writeln!(
        s,
        "add counter {FAMILY} {TABLE} {name} {{ comment \"{comment}\"; }}"
    );
}

/// One family's judging chains: `judge4`/`judge6`, `egress*`, `ingress*`,
/// and the chains a packet is sent to once decided: `admit_*` (logs a new
/// connection a rule admitted, then returns as `return` would) and one
/// `drop_*` per direction and reason (logs a flow's first drop and its
/// repeats up to the node's rate, counts, drops). Only packets so decided pay for the logging: the
/// established path has no rule more than before.
///
/// The allow maps' protocol is `ct original protocol`, not `meta l4proto`:
/// in an interval map's key nft (1.0.6, Debian 12's) converts the 1-byte
/// `meta l4proto` with a byteorder expression that Debian's 6.12 kernel
/// refuses (EOPNOTSUPP, the whole table with it: no pod isolated), while
/// conntrack's own byte loads as it is. Every packet reaching these rules
/// is tracked, and related ones are accepted before, so both name the
/// same protocol.
fn chains(v6: bool) -> String {
    let (n, ip) = if v6 { (6, "ip6") } else { (4, "ip") };
    let t = format!("{FAMILY} {TABLE}");
    let veths = format!("{HOST_VETH_PREFIX}*");
    let (eg, ing) = (Direction::Egress, Direction::Ingress);
    let to = |d, r| drop_chain(d, r, n);
    let mut s = format!(
        "add chain {t} judge{n}\n\
         add chain {t} egress{n}\n\
         add chain {t} ingress{n}\n"
    );
    for d in [eg, ing] {
        let _ = writeln!(s, "add chain {t} {}", admit_chain(d, n));
        let _ = writeln!(
            s,
            "add rule {t} {} ct state new log group {GROUP} prefix \"{}\"",
            admit_chain(d, n),
            log_prefix(NftVerdict::PolicyAllow { direction: d })
        );
        for r in Reason::ALL {
            let chain = to(d, r);
            let (prefix, counter) = (
                log_prefix(NftVerdict::PolicyDrop {
                    direction: d,
                    reason: r,
                }),
                drop_counter(d, r),
            );
            let _ = writeln!(s, "add chain {t} {chain}");
            // A flow's first drop, and one a second after: each flow has a
            // limit of its own, so a flood of one never hides another's.
            let _ = writeln!(
                s,
                "add rule {t} {chain} add @logged{n} {{ {ip} saddr . {ip} daddr . meta l4proto . th dport limit rate 1/second burst 1 packets }} log group {GROUP} prefix \"{prefix}\" counter name \"{counter}\" drop"
            );
            // Its repeats, for the flows room to count (it folds them), up
            // to the node's rate; past it only counted here.
            let _ = writeln!(
                s,
                "add rule {t} {chain} limit name \"{REPEATS}\" log group {GROUP} prefix \"{prefix}\" counter name \"{counter}\" drop"
            );
            let _ = writeln!(
                s,
                "add rule {t} {chain} counter name \"{UNLOGGED}\" counter name \"{counter}\" drop comment \"mycni: {}\"",
                drop_comment(d, r)
            );
        }
    }
    let (ae, ai) = (admit_chain(eg, n), admit_chain(ing, n));
    let _ = write!(
        s,
        "add rule {t} judge{n} iifname \"{veths}\" {ip} saddr != @known{n} goto {}\n\
         add rule {t} judge{n} oifname \"{veths}\" {ip} daddr != @known{n} goto {}\n\
         add rule {t} judge{n} ct state {{ invalid, untracked }} {ip} saddr @eg_iso{n} goto {}\n\
         add rule {t} judge{n} ct state {{ invalid, untracked }} {ip} daddr @in_iso{n} goto {}\n\
         add rule {t} judge{n} ct original {ip} saddr . ct reply {ip} saddr @self{n} accept comment \"mycni: a pod to itself, through its Service too\"\n\
         add rule {t} judge{n} ct original {ip} saddr @eg_iso{n} jump egress{n}\n\
         add rule {t} judge{n} ct reply {ip} saddr @in_iso{n} jump ingress{n}\n\
         add rule {t} egress{n} ct direction original counter name ct reply {ip} saddr . ct original {ip} saddr . ct original protocol . th dport map @eg_allow{n} goto {ae}\n\
         add rule {t} egress{n} ct direction reply counter name ct reply {ip} saddr . ct original {ip} saddr . ct original protocol . th sport map @eg_allow{n} goto {ae}\n\
         add rule {t} egress{n} counter name ct reply {ip} saddr . ct original {ip} saddr map @eg_any{n} goto {ae}\n\
         add rule {t} egress{n} counter name ct original {ip} saddr map @eg_deny{n}\n\
         add rule {t} egress{n} goto {}\n\
         add rule {t} ingress{n} ct direction original counter name ct original {ip} saddr . ct reply {ip} saddr . ct original protocol . th dport map @in_allow{n} goto {ai}\n\
         add rule {t} ingress{n} ct direction reply counter name ct original {ip} saddr . ct reply {ip} saddr . ct original protocol . th sport map @in_allow{n} goto {ai}\n\
         add rule {t} ingress{n} counter name ct original {ip} saddr . ct reply {ip} saddr map @in_any{n} goto {ai}\n\
         add rule {t} ingress{n} counter name ct reply {ip} saddr map @in_deny{n}\n\
         add rule {t} ingress{n} goto {}\n",
        to(eg, Reason::NotJudged),
        to(ing, Reason::NotJudged),
        to(eg, Reason::Invalid),
        to(ing, Reason::Invalid),
        to(eg, Reason::Denied),
        to(ing, Reason::Denied),
    );
    s
}

/// Where a packet a rule admitted goes: `admit_egress4`, ...
fn admit_chain(d: Direction, n: u8) -> String {
    format!("admit_{}{n}", d.label())
}

/// Where a packet dropped for `r` goes: `drop_egress_denied4`, ...
fn drop_chain(d: Direction, r: Reason, n: u8) -> String {
    format!("drop_{}_{}{n}", d.label(), r.label())
}

fn drop_comment(d: Direction, r: Reason) -> &'static str {
    match (d, r) {
        (Direction::Egress, Reason::NotJudged) => "from a pod not judged yet (fail closed)",
        (Direction::Ingress, Reason::NotJudged) => "to a pod not judged yet (fail closed)",
        (Direction::Egress, Reason::Invalid) => "packet without a connection from an isolated pod",
        (Direction::Ingress, Reason::Invalid) => "packet without a connection to an isolated pod",
        (Direction::Egress, Reason::Denied) => "egress no NetworkPolicy allows",
        (Direction::Ingress, Reason::Denied) => "ingress no NetworkPolicy allows",
    }
}

/// The two rules that change with the members: every packet the table let
/// through stamps its connection's mark with `epoch` (its policy bits
/// only), so the fast path knows which live flows were judged under the
/// current policy (`mycni_common::POLICY_MARK_SHIFT`); and an established
/// connection stamped so is admitted before the judging chains, as the fast
/// path forwards it. Within an epoch the verdict is the connection's (the
/// rules read its conntrack tuple, and every change of a set comes with a
/// new epoch), so judging each of its packets again only costs: on the
/// kernel path that was every packet of an isolated pod's connections.
fn stamp(epoch: u32) -> String {
    let t = format!("{FAMILY} {TABLE}");
    let e = (epoch << POLICY_MARK_SHIFT) & POLICY_MARK_MASK;
    let keep = !POLICY_MARK_MASK;
    format!(
        "flush chain {t} stamp\n\
         add rule {t} stamp ct mark and {POLICY_MARK_MASK:#010x} != {e:#010x} ct mark set ct mark and {keep:#010x} or {e:#010x}\n\
         flush chain {t} judged\n\
         add rule {t} judged ct state established ct mark and {POLICY_MARK_MASK:#010x} == {e:#010x} accept\n"
    )
}

fn elements(s: &mut String, verb: &str, name: SetName, members: &[&String]) {
    // Bounded lines: nft parses one statement at a time, and a statement of
    // 100,000 elements costs it more than 100 of 1,000.
    for chunk in members.chunks(1000) {
        let list: Vec<&str> = chunk.iter().map(|m| m.as_str()).collect();
        let _ = writeln!(
            s,
            "{verb} element {FAMILY} {TABLE} {name} {{ {} }}",
            list.join(", ")
        );
    }
}

/// The whole table, replacing whatever is there in one transaction (`add`
/// then `delete` makes the delete succeed whether or not it exists),
/// stamping with `epoch`.
pub fn full_script(d: &Desired, epoch: u32) -> String {
    let t = format!("{FAMILY} {TABLE}");
    let mut s = format!("add table {t}\ndelete table {t}\nadd table {t}\n");
    for (name, _) in drop_counters() {
        add_counter(&mut s, &name, &format!("mycni: {name} drops"));
    }
    for (name, c) in &d.counters {
        add_counter(&mut s, name, &c.comment);
    }
    s.push_str(&repeats_limit(&t));
    for v6 in [false, true] {
        for kind in SetKind::ALL {
            let name = SetName { kind, v6 };
            let what = if kind.counts() { "map" } else { "set" };
            let _ = writeln!(s, "add {what} {t} {name} {{ {} }}", set_type(kind, v6));
        }
    }
    // What the drop chains log a flow's first drop by: a flow logged in the
    // last second is not logged so again (the element's limit; its repeats
    // go under `repeats`), and is forgotten after two.
    let _ = writeln!(
        s,
        "add set {t} logged4 {{ type ipv4_addr . ipv4_addr . inet_proto . inet_service; flags dynamic, timeout; timeout 2s; size 65536; }}"
    );
    let _ = writeln!(
        s,
        "add set {t} logged6 {{ type ipv6_addr . ipv6_addr . inet_proto . inet_service; flags dynamic, timeout; timeout 2s; size 65536; }}"
    );
    let _ = writeln!(
        s,
        "add chain {t} forward {{ type filter hook forward priority filter; policy accept; }}"
    );
    let _ = writeln!(s, "add chain {t} stamp");
    let _ = writeln!(s, "add chain {t} judged");
    s.push_str(&chains(false));
    s.push_str(&chains(true));
    let _ = writeln!(s, "add rule {t} forward ct state related accept");
    let _ = writeln!(
        s,
        "add rule {t} forward icmpv6 type {{ nd-router-solicit, nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert, nd-redirect }} accept"
    );
    let _ = writeln!(s, "add rule {t} forward jump judged");
    let _ = writeln!(s, "add rule {t} forward meta nfproto ipv4 jump judge4");
    let _ = writeln!(s, "add rule {t} forward meta nfproto ipv6 jump judge6");
    let _ = writeln!(s, "add rule {t} forward jump stamp");
    s.push_str(&stamp(epoch));
    for (name, members) in &d.sets {
        let list: Vec<&String> = members.iter().collect();
        elements(&mut s, "add", *name, &list);
    }
    s
}

/// The members that changed from `old` to `new`: deletions first, so a
/// member that moved (a narrower prefix replacing a wider one) never
/// overlaps its old self; counters made before the members that point at
/// them and removed after the last one that did; and the stamp of the new
/// `epoch`, in the same transaction. None when nothing changed.
pub fn diff_script(old: &Desired, new: &Desired, epoch: u32) -> Option<String> {
    let gone = old.minus(new);
    let came = new.minus(old);
    if gone.is_empty() && came.is_empty() {
        return None;
    }
    let t = format!("{FAMILY} {TABLE}");
    let mut s = String::new();
    for (name, members) in &gone {
        elements(&mut s, "delete", *name, members);
    }
    for (name, _) in old.counters_minus(new) {
        let _ = writeln!(s, "delete counter {t} {name}");
    }
    for (name, c) in new.counters_minus(old) {
        add_counter(&mut s, name, &c.comment);
    }
    for (name, members) in &came {
        elements(&mut s, "add", *name, members);
    }
    s.push_str(&stamp(epoch));
    Some(s)
}

/// The second of an apply's two transactions: a fresh epoch, written once
/// the members of the first are all in force. They are not quite when
/// its rules are: the kernel (6.18) switches rules to the new generation
/// before it swaps in the interval maps' new lookup data, so a packet
/// judged in between meets the new stamp with the old members, and a
/// connection the change no longer allows was stamped as judged under it
/// (seen: a stream cut by a deny went on for seconds through `judged`,
/// 2 runs in 5). Nothing stamped before this one is current after it.
pub(crate) fn settle_script(epoch: u32) -> String {
    stamp(epoch)
}

/// The epoch the table's `stamp` chain writes (`nft list chain` text), so
/// an agent started over an existing table goes past it on the kernel
/// path, where no pinned map remembers it.
pub(crate) fn parse_stamped_epoch(listing: &str) -> Option<u32> {
    let after = listing.split_once("ct mark set")?.0;
    let hex = after.rsplit_once("!= 0x")?.1.split_whitespace().next()?;
    let mark = u32::from_str_radix(hex, 16).ok()?;
    Some((mark & POLICY_MARK_MASK) >> POLICY_MARK_SHIFT)
}

/// Deleting an element from one of the table's interval maps costs in
/// proportion to the elements the map holds (the kernel's pipapo set
/// rebuilds its lookup tables per deletion): measured on 6.18 with nft
/// 1.0.6, 250 deletions from a 10,000-element map took 3.0 s, 1,000 took
/// 10 s and all 10,000 took 276 s, while the whole table with those 10,000
/// elements is written in 0.9 s (one transaction, `full_script`). So ~1.2
/// us per deletion per element held, against ~90 us per element written.
/// Past this ratio the table is written whole.
const WHOLE_PER_ELEMENT: usize = 75;

/// Whether writing the table whole is cheaper than deleting what `new`
/// no longer has from `old` one element at a time (see
/// [`WHOLE_PER_ELEMENT`]). The whole write is as atomic; the table's
/// counters start again from 0, which the metrics' tally takes as a
/// restart.
pub(crate) fn whole_is_cheaper(old: &Desired, new: &Desired) -> bool {
    let deleting: usize = old
        .minus(new)
        .iter()
        .map(|(name, gone)| gone.len() * old.members(*name).count())
        .sum();
    deleting > WHOLE_PER_ELEMENT * new.len().max(1)
}

/// Removes the table (the agent's `--network-policy=false`, uninstall).
pub(crate) fn remove_script() -> String {
    let t = format!("{FAMILY} {TABLE}");
    format!("add table {t}\ndelete table {t}\n")
}

#[cfg(test)]
pub(crate) mod scale;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stamped_epoch_is_read_back_as_nft_lists_it() {
        // nft 1.0.6 folds the kept bits into the mask it prints.
        let listing = "table inet mycni_policy {\n\tchain stamp {\n\t\tct mark & 0x0fff0000 != 0x00070000 ct mark set ct mark & 0xf007ffff | 0x00070000\n\t}\n}\n";
        assert_eq!(parse_stamped_epoch(listing), Some(7));
        let ours = format!("table inet mycni_policy {{\n{}}}", stamp(4095));
        assert_eq!(parse_stamped_epoch(&ours), Some(4095));
        assert_eq!(
            parse_stamped_epoch("table inet mycni_policy {\n\tchain stamp {\n\t}\n}\n"),
            None
        );
        assert_eq!(parse_stamped_epoch("garbage != 0xzz ct mark set"), None);
    }
}
