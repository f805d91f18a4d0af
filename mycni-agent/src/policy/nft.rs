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
//! original` saddr and the server (after DNAT) as `ct reply` saddr, so the
//! packet that opens a connection is judged as that connection whichever
//! way it travels (a flow picked up mid-stream makes its entry from the
//! packet seen first). The server's port is the packet's `th dport`: nft
//! cannot put `ct reply proto-src` in a concatenation (its size depends on
//! the protocol), and only a connection's first packet is judged, which
//! travels in the original direction, after DNAT, to exactly that port.
//!
//! What passes first: established and related packets (replies of an
//! allowed connection, ICMP errors about it; a live connection's exactness
//! after a policy change is issue 25's), neighbour discovery. Packets
//! conntrack calls invalid to or from an isolated pod are dropped: they
//! have no tuple to be judged on.

use std::fmt::Write as _;

use super::sets::{Desired, SetKind, SetName};

pub const TABLE: &str = "mycni_policy";
pub const FAMILY: &str = "inet";

fn set_type(kind: SetKind, v6: bool) -> String {
    let a = if v6 { "ipv6_addr" } else { "ipv4_addr" };
    match kind {
        SetKind::EgIso | SetKind::InIso => format!("type {a};"),
        SetKind::SelfPair => format!("type {a} . {a};"),
        SetKind::EgAny | SetKind::InAny => format!("type {a} . {a}; flags interval;"),
        SetKind::EgAllow | SetKind::InAllow => {
            format!("type {a} . {a} . inet_proto . inet_service; flags interval;")
        }
    }
}

/// One family's judging chains: `judge4`/`judge6`, `egress*`, `ingress*`.
fn chains(v6: bool) -> String {
    let (n, ip) = if v6 { (6, "ip6") } else { (4, "ip") };
    let t = format!("{FAMILY} {TABLE}");
    format!(
        "add chain {t} judge{n}\n\
         add chain {t} egress{n}\n\
         add chain {t} ingress{n}\n\
         add rule {t} judge{n} ct state invalid {ip} saddr @eg_iso{n} counter drop comment \"mycni: invalid packet from an isolated pod\"\n\
         add rule {t} judge{n} ct state invalid {ip} daddr @in_iso{n} counter drop comment \"mycni: invalid packet to an isolated pod\"\n\
         add rule {t} judge{n} ct original {ip} saddr . ct reply {ip} saddr @self{n} accept comment \"mycni: a pod to itself, through its Service too\"\n\
         add rule {t} judge{n} ct original {ip} saddr @eg_iso{n} jump egress{n}\n\
         add rule {t} judge{n} ct reply {ip} saddr @in_iso{n} jump ingress{n}\n\
         add rule {t} egress{n} ct original {ip} saddr . ct reply {ip} saddr . meta l4proto . th dport @eg_allow{n} return\n\
         add rule {t} egress{n} ct original {ip} saddr . ct reply {ip} saddr @eg_any{n} return\n\
         add rule {t} egress{n} counter drop comment \"mycni: egress no NetworkPolicy allows\"\n\
         add rule {t} ingress{n} ct reply {ip} saddr . ct original {ip} saddr . meta l4proto . th dport @in_allow{n} return\n\
         add rule {t} ingress{n} ct reply {ip} saddr . ct original {ip} saddr @in_any{n} return\n\
         add rule {t} ingress{n} counter drop comment \"mycni: ingress no NetworkPolicy allows\"\n"
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
/// then `delete` makes the delete succeed whether or not it exists).
pub fn full_script(d: &Desired) -> String {
    let t = format!("{FAMILY} {TABLE}");
    let mut s = format!("add table {t}\ndelete table {t}\nadd table {t}\n");
    for v6 in [false, true] {
        for kind in SetKind::ALL {
            let name = SetName { kind, v6 };
            let _ = writeln!(s, "add set {t} {name} {{ {} }}", set_type(kind, v6));
        }
    }
    let _ = writeln!(
        s,
        "add chain {t} forward {{ type filter hook forward priority filter; policy accept; }}"
    );
    s.push_str(&chains(false));
    s.push_str(&chains(true));
    let _ = writeln!(
        s,
        "add rule {t} forward ct state established,related accept"
    );
    let _ = writeln!(
        s,
        "add rule {t} forward icmpv6 type {{ nd-router-solicit, nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert, nd-redirect }} accept"
    );
    let _ = writeln!(s, "add rule {t} forward meta nfproto ipv4 jump judge4");
    let _ = writeln!(s, "add rule {t} forward meta nfproto ipv6 jump judge6");
    for (name, members) in &d.sets {
        let list: Vec<&String> = members.iter().collect();
        elements(&mut s, "add", *name, &list);
    }
    s
}

/// The members that changed from `old` to `new`: deletions first, so a
/// member that moved (a narrower prefix replacing a wider one) never
/// overlaps its old self. None when nothing changed.
pub fn diff_script(old: &Desired, new: &Desired) -> Option<String> {
    let gone = old.minus(new);
    let came = new.minus(old);
    if gone.is_empty() && came.is_empty() {
        return None;
    }
    let mut s = String::new();
    for (name, members) in &gone {
        elements(&mut s, "delete", *name, members);
    }
    for (name, members) in &came {
        elements(&mut s, "add", *name, members);
    }
    Some(s)
}

/// Removes the table (the agent's `--network-policy=false`, uninstall).
pub fn remove_script() -> String {
    let t = format!("{FAMILY} {TABLE}");
    format!("add table {t}\ndelete table {t}\n")
}
