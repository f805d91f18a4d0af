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
//! Every packet to or from an isolated pod is judged, not only a
//! connection's first: a policy change cuts a live connection it no
//! longer allows at its next packet, on both datapaths (see the stamp
//! below). A pod no policy isolates costs three set lookups per forwarded
//! packet on the kernel path.
//!
//! Both datapaths bring every new connection here: the fast path forwards
//! only established TCP / assured UDP flows without NAT and leaves SYN,
//! FIN, RST, unconfirmed and DNATed flows to the kernel
//! (tests/e2e/tests/ebpf_prog/fast_path.rs,
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

use super::counters::{Reason, drop_counter, drop_counters};
use super::model::Direction;
use super::sets::{Desired, SetKind, SetName};

pub const TABLE: &str = "mycni_policy";
pub const FAMILY: &str = "inet";

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

/// One family's judging chains: `judge4`/`judge6`, `egress*`, `ingress*`.
fn chains(v6: bool) -> String {
    let (n, ip) = if v6 { (6, "ip6") } else { (4, "ip") };
    let t = format!("{FAMILY} {TABLE}");
    let veths = format!("{HOST_VETH_PREFIX}*");
    let c = |d, r| drop_counter(d, r);
    let (eg, ing) = (Direction::Egress, Direction::Ingress);
    format!(
        "add chain {t} judge{n}\n\
         add chain {t} egress{n}\n\
         add chain {t} ingress{n}\n\
         add rule {t} judge{n} iifname \"{veths}\" {ip} saddr != @known{n} counter name \"{}\" drop comment \"mycni: from a pod not judged yet (fail closed)\"\n\
         add rule {t} judge{n} oifname \"{veths}\" {ip} daddr != @known{n} counter name \"{}\" drop comment \"mycni: to a pod not judged yet (fail closed)\"\n\
         add rule {t} judge{n} ct state {{ invalid, untracked }} {ip} saddr @eg_iso{n} counter name \"{}\" drop comment \"mycni: packet without a connection from an isolated pod\"\n\
         add rule {t} judge{n} ct state {{ invalid, untracked }} {ip} daddr @in_iso{n} counter name \"{}\" drop comment \"mycni: packet without a connection to an isolated pod\"\n\
         add rule {t} judge{n} ct original {ip} saddr . ct reply {ip} saddr @self{n} accept comment \"mycni: a pod to itself, through its Service too\"\n\
         add rule {t} judge{n} ct original {ip} saddr @eg_iso{n} jump egress{n}\n\
         add rule {t} judge{n} ct reply {ip} saddr @in_iso{n} jump ingress{n}\n\
         add rule {t} egress{n} ct direction original counter name ct original {ip} saddr . ct reply {ip} saddr . meta l4proto . th dport map @eg_allow{n} return\n\
         add rule {t} egress{n} ct direction reply counter name ct original {ip} saddr . ct reply {ip} saddr . meta l4proto . th sport map @eg_allow{n} return\n\
         add rule {t} egress{n} counter name ct original {ip} saddr . ct reply {ip} saddr map @eg_any{n} return\n\
         add rule {t} egress{n} counter name ct original {ip} saddr map @eg_deny{n}\n\
         add rule {t} egress{n} counter name \"{}\" drop comment \"mycni: egress no NetworkPolicy allows\"\n\
         add rule {t} ingress{n} ct direction original counter name ct reply {ip} saddr . ct original {ip} saddr . meta l4proto . th dport map @in_allow{n} return\n\
         add rule {t} ingress{n} ct direction reply counter name ct reply {ip} saddr . ct original {ip} saddr . meta l4proto . th sport map @in_allow{n} return\n\
         add rule {t} ingress{n} counter name ct reply {ip} saddr . ct original {ip} saddr map @in_any{n} return\n\
         add rule {t} ingress{n} counter name ct reply {ip} saddr map @in_deny{n}\n\
         add rule {t} ingress{n} counter name \"{}\" drop comment \"mycni: ingress no NetworkPolicy allows\"\n",
        c(eg, Reason::NotJudged),
        c(ing, Reason::NotJudged),
        c(eg, Reason::Invalid),
        c(ing, Reason::Invalid),
        c(eg, Reason::Denied),
        c(ing, Reason::Denied),
    )
}

/// The one rule that changes with the members: every packet the table let
/// through stamps its connection's mark with `epoch` (its policy bits
/// only), so the fast path knows which live flows were judged under the
/// current policy (`mycni_common::POLICY_MARK_SHIFT`).
fn stamp(epoch: u32) -> String {
    let t = format!("{FAMILY} {TABLE}");
    let e = (epoch << POLICY_MARK_SHIFT) & POLICY_MARK_MASK;
    let keep = !POLICY_MARK_MASK;
    format!(
        "flush chain {t} stamp\n\
         add rule {t} stamp ct mark and {POLICY_MARK_MASK:#010x} != {e:#010x} ct mark set ct mark and {keep:#010x} or {e:#010x}\n"
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
    for v6 in [false, true] {
        for kind in SetKind::ALL {
            let name = SetName { kind, v6 };
            let what = if kind.counts() { "map" } else { "set" };
            let _ = writeln!(s, "add {what} {t} {name} {{ {} }}", set_type(kind, v6));
        }
    }
    let _ = writeln!(
        s,
        "add chain {t} forward {{ type filter hook forward priority filter; policy accept; }}"
    );
    let _ = writeln!(s, "add chain {t} stamp");
    s.push_str(&chains(false));
    s.push_str(&chains(true));
    let _ = writeln!(s, "add rule {t} forward ct state related accept");
    let _ = writeln!(
        s,
        "add rule {t} forward icmpv6 type {{ nd-router-solicit, nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert, nd-redirect }} accept"
    );
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

/// Removes the table (the agent's `--network-policy=false`, uninstall).
pub fn remove_script() -> String {
    let t = format!("{FAMILY} {TABLE}");
    format!("add table {t}\ndelete table {t}\n")
}
