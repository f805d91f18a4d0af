//! Pods another tool shapes, which the fast path leaves to the kernel.
//!
//! The CNI `bandwidth` plugin (chained after mycni) shapes a pod's ingress
//! with a TBF root qdisc on its host veth, and its egress with an `ingress`
//! qdisc there whose u32 filter (priority 1, protocol all) redirects to an
//! ifb device with a TBF. The fast path would undo both: its program on the
//! veth's ingress runs before that filter (TCX always does; a legacy
//! `cls_bpf` at priority 1 cannot even join it: the `ingress` and `clsact`
//! qdiscs take the same slot) and redirects past the ifb, and
//! `bpf_redirect_peer` into the pod skips the host veth's root qdisc.
//!
//! So a pod veth with a root qdisc other than the default `noqueue`, or
//! with an `ingress` qdisc (mycni's own is a `clsact`), is *shaped*: the
//! agent attaches nothing to it and leaves its addresses out of
//! `mycni_local`, so the programs on other interfaces find no local
//! endpoint for it (`kernel_unknown_dest`) and the kernel routes its packets
//! through its qdiscs. Other pods keep the fast path.
//!
//! The qdiscs are read from the kernel on every pass that reads the pods;
//! the agent's netlink watch wakes such a pass when a qdisc comes or goes,
//! so a pod shaped after the agent attached to it (a chain slower than the
//! agent) is detached within milliseconds.

use std::collections::{BTreeMap, BTreeSet};
use std::io;

use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::tc::{TcAttribute, TcHandle, TcMessage};

use super::attach::dump;

/// A qdisc as the dump reports it: on which interface, where, of what kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Qdisc {
    pub ifindex: u32,
    pub parent: TcHandle,
    pub kind: String,
}

/// Why the fast path leaves an interface alone: the qdiscs that shape it,
/// e.g. `root tbf` and `ingress`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Shaping {
    pub qdiscs: Vec<String>,
}

impl Shaping {
    /// The reason `/readyz`, the log and `inspect` give for `name`.
    pub fn reason(&self, name: &str) -> String {
        format!(
            "{name} is shaped ({}; the CNI bandwidth plugin makes these): left to the kernel path so its shaping holds",
            self.qdiscs.join(", ")
        )
    }
}

/// The interfaces among `ifindexes` that `qdiscs` shape. A root qdisc
/// other than `noqueue` (a veth's default) or an `ingress` qdisc shapes;
/// `clsact` (mycni's legacy attach, or another tool's programs) and the
/// children of a root qdisc do not add anything.
pub fn shaped(qdiscs: &[Qdisc], ifindexes: &BTreeSet<u32>) -> BTreeMap<u32, Shaping> {
    let mut out: BTreeMap<u32, Shaping> = BTreeMap::new();
    for q in qdiscs.iter().filter(|q| ifindexes.contains(&q.ifindex)) {
        let what = if q.kind == "ingress" {
            "ingress qdisc".to_owned()
        } else if q.parent == TcHandle::ROOT && q.kind != "noqueue" {
            format!("root qdisc {}", q.kind)
        } else {
            continue;
        };
        out.entry(q.ifindex).or_default().qdiscs.push(what);
    }
    out
}

/// Every qdisc of the calling thread's network namespace.
pub fn qdiscs() -> io::Result<Vec<Qdisc>> {
    let mut out = vec![];
    for m in dump(RouteNetlinkMessage::GetQueueDiscipline(TcMessage::default()))? {
        let RouteNetlinkMessage::NewQueueDiscipline(q) = m else {
            continue;
        };
        let Ok(ifindex) = u32::try_from(q.header.index) else {
            continue;
        };
        let kind = q.attributes.iter().find_map(|a| match a {
            TcAttribute::Kind(k) => Some(k.clone()),
            _ => None,
        });
        if let Some(kind) = kind {
            out.push(Qdisc {
                ifindex,
                parent: q.header.parent,
                kind,
            });
        }
    }
    Ok(out)
}

/// The name of `ifindex` in the calling thread's network namespace, or
/// its number when it has gone.
pub fn ifname(ifindex: u32) -> String {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: buf has IF_NAMESIZE bytes, as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if p.is_null() {
        return format!("ifindex {ifindex}");
    }
    // SAFETY: on success the kernel wrote a NUL-terminated name into buf.
    unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// The host veths (`mycni*`) of this namespace that are shaped, with the
/// reason: what `inspect` lists, from the kernel alone (the agent may be
/// down).
pub(crate) fn shaped_pod_veths() -> io::Result<Vec<(u32, String, String)>> {
    let qs = qdiscs()?;
    let names: BTreeMap<u32, String> = qs.iter().map(|q| (q.ifindex, ifname(q.ifindex))).collect();
    let veths: BTreeSet<u32> = names
        .iter()
        .filter(|(_, n)| n.starts_with(mycni_common::contract::HOST_VETH_PREFIX))
        .map(|(i, _)| *i)
        .collect();
    Ok(shaped(&qs, &veths)
        .into_iter()
        .map(|(i, s)| {
            let name = names.get(&i).cloned().unwrap_or_default();
            let why = s.reason(&name);
            (i, name, why)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(ifindex: u32, parent: TcHandle, kind: &str) -> Qdisc {
        Qdisc {
            ifindex,
            parent,
            kind: kind.to_owned(),
        }
    }

    #[test]
    fn bandwidths_qdiscs_shape_defaults_and_clsact_do_not() {
        let child = TcHandle { major: 1, minor: 1 };
        let qdiscs = [
            // A veth as the plugin leaves it.
            q(4, TcHandle::ROOT, "noqueue"),
            // bandwidth: ingress and egress shaped.
            q(5, TcHandle::ROOT, "tbf"),
            q(5, TcHandle::INGRESS, "ingress"),
            // mycni's legacy attach.
            q(6, TcHandle::ROOT, "noqueue"),
            q(6, TcHandle::INGRESS, "clsact"),
            // bandwidth, egress only; a child qdisc adds nothing.
            q(7, TcHandle::INGRESS, "ingress"),
            q(7, child, "fq_codel"),
            // Another tool's root qdisc, and an interface not asked about.
            q(8, TcHandle::ROOT, "fq_codel"),
            q(9, TcHandle::ROOT, "tbf"),
        ];
        let s = shaped(&qdiscs, &(4..=8).collect());
        let got: Vec<(u32, Vec<String>)> = s.into_iter().map(|(i, s)| (i, s.qdiscs)).collect();
        assert_eq!(
            got,
            vec![
                (5, vec!["root qdisc tbf".into(), "ingress qdisc".into()]),
                (7, vec!["ingress qdisc".into()]),
                (8, vec!["root qdisc fq_codel".into()]),
            ]
        );
        let why = Shaping {
            qdiscs: vec!["root qdisc tbf".into()],
        }
        .reason("mycni123");
        assert!(
            why.starts_with("mycni123 is shaped (root qdisc tbf;"),
            "{why}"
        );
    }
}
