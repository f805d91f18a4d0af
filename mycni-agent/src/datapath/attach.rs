//! How the programs are hooked to an interface's ingress: TCX links
//! (Linux >= 6.6), or, where the kernel has no TCX, a `cls_bpf` filter in
//! direct-action mode under a `clsact` qdisc, as tc and Cilium attach.
//!
//! The mode is probed, not read off the version: a `BPF_PROG_QUERY` for
//! TCX ingress on `lo` succeeds only where TCX exists. `MYCNI_TC_ATTACH`
//! (`tcx` or `legacy`, unset: probe) overrides it, for tests and for
//! operators whose other tools expect tc filters.
//!
//! A legacy filter has no `bpf_link` to pin. It lives as long as its
//! interface does, whether the agent runs or not, and is found again by
//! its place: mycni's filters are at [`LEGACY_PRIORITY`] and
//! [`LEGACY_HANDLE`] on the ingress parent, and replacing the filter at
//! that place swaps the program atomically (cls_bpf's change), as
//! swapping a TCX link's program does. So that `inspect`, the detach of
//! gone interfaces and `--datapath kernel` see legacy attachments as they
//! see links, each one also pins its program at `<pin dir>/tc/<prog>_<ifindex>`.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use aya::programs::tc::{
    NlOptions, SchedClassifierLink, TcHandle, qdisc_add_clsact, qdisc_detach_program,
};
use aya::programs::{SchedClassifier, TcAttach, TcAttachType};

use super::error::DatapathError;
use super::prog::Prog;

/// The filter priority of mycni's programs: first on the hook, as a TCX
/// program runs before every tc filter. A program with no opinion on a
/// packet returns `TC_ACT_UNSPEC` (the same value as `TCX_NEXT`) and the
/// filters after it still run.
pub(crate) const LEGACY_PRIORITY: u16 = 1;
/// The filter handle at [`LEGACY_PRIORITY`].
pub(crate) const LEGACY_HANDLE: u32 = 1;

/// How long a legacy attach waits on a pod veth it has not attached to yet.
///
/// The `clsact` qdisc a legacy attach needs takes the slot of the `ingress`
/// qdisc the CNI `bandwidth` plugin makes for egress shaping, and the
/// plugin creates its qdisc exclusively: if the agent got there first, the
/// pod's ADD would fail with EEXIST ("create ingress qdisc: file exists"),
/// on every retry. The agent sees a pod ~5-15 ms after mycni's ADD returns,
/// before the runtime has run the rest of the chain, so it waits this long
/// for the chain to finish (a runtime runs it at once; seconds are a slow
/// node), then finds the pod shaped (`shaping.rs`) or attaches. Until then
/// the pod's own packets take the kernel path; packets to it do not wait.
/// TCX needs no qdisc and does not wait.
pub const LEGACY_SETTLE: Duration = Duration::from_secs(2);

/// The pod veth attachments of `want` a legacy attach must not make yet,
/// and how long until the first of them may be made. `first_seen` is when
/// this process first saw each pod veth; `have` the attachments already in
/// place (this process's, or a previous agent's filter, whose replacement
/// creates no qdisc).
pub fn settling(
    want: &BTreeSet<(Prog, u32)>,
    have: &BTreeSet<(Prog, u32)>,
    first_seen: &BTreeMap<u32, Instant>,
    now: Instant,
) -> (BTreeSet<(Prog, u32)>, Option<Duration>) {
    let mut next: Option<Duration> = None;
    let wait = want
        .iter()
        .filter(|a| a.0 == Prog::FromPod && !have.contains(a))
        .filter(|(_, ifindex)| {
            let seen = first_seen.get(ifindex).copied().unwrap_or(now);
            let left = LEGACY_SETTLE.saturating_sub(now.saturating_duration_since(seen));
            if left.is_zero() {
                return false;
            }
            next = Some(next.map_or(left, |n| n.min(left)));
            true
        })
        .copied()
        .collect();
    (wait, next)
}

/// How programs are attached on this kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttachMode {
    /// TCX links, pinned.
    Tcx,
    /// `clsact` + `cls_bpf` direct-action filters.
    Legacy,
}

impl AttachMode {
    pub const fn name(self) -> &'static str {
        match self {
            AttachMode::Tcx => "tcx",
            AttachMode::Legacy => "legacy tc",
        }
    }

    /// The mode the agent uses here: `MYCNI_TC_ATTACH`, else the probe.
    pub fn choose() -> Self {
        match std::env::var("MYCNI_TC_ATTACH").as_deref() {
            Ok("legacy") => AttachMode::Legacy,
            Ok("tcx") => AttachMode::Tcx,
            // Unknown (EPERM: no CAP_NET_ADMIN) tries TCX, whose attach
            // then fails and says why.
            _ if probe_tcx() == Tcx::No => AttachMode::Legacy,
            _ => AttachMode::Tcx,
        }
    }
}

/// TCX (`BPF_TCX_INGRESS`, Linux 6.6), probed rather than read from the
/// release: `BPF_PROG_QUERY` of it on loopback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tcx {
    Yes,
    /// EINVAL: the kernel does not know the attach type.
    No,
    /// The query failed otherwise (EPERM without CAP_NET_ADMIN).
    Unknown(String),
}

// bpf(2): BPF_PROG_QUERY and BPF_TCX_INGRESS (include/uapi/linux/bpf.h).
const BPF_PROG_QUERY: libc::c_long = 16;
const BPF_TCX_INGRESS: u32 = 46;

/// `union bpf_attr`'s `query` (6.6's layout; older kernels accept the
/// longer struct as long as the bytes they do not know are zero).
#[repr(C)]
#[derive(Default)]
struct QueryAttr {
    target_ifindex: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    count: u32,
    _pad: u32,
    prog_attach_flags: u64,
    link_ids: u64,
    link_attach_flags: u64,
    revision: u64,
}

/// Whether the kernel has TCX: a query of the TCX ingress programs on `lo`
/// (ifindex 1 in every network namespace) for their count alone, an unknown
/// attach type (EINVAL) before 6.6. Reading the programs themselves (aya's
/// `query_tcx`) opens them by id, which needs CAP_SYS_ADMIN.
pub(crate) fn probe_tcx() -> Tcx {
    let mut attr = QueryAttr {
        target_ifindex: 1,
        attach_type: BPF_TCX_INGRESS,
        ..Default::default()
    };
    // SAFETY: a zeroed query attribute with no id buffers (count 0), and
    // its size.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_QUERY,
            &mut attr as *mut QueryAttr,
            std::mem::size_of::<QueryAttr>() as libc::c_uint,
        )
    };
    if r == 0 {
        return Tcx::Yes;
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EINVAL) => Tcx::No,
        _ => Tcx::Unknown(format!("BPF_PROG_QUERY: {e}")),
    }
}

fn marker_dir(pin_dir: &Path) -> PathBuf {
    pin_dir.join("tc")
}

/// Where the legacy attachment of `p` on `ifindex` pins its program.
pub(crate) fn marker_path(pin_dir: &Path, p: Prog, ifindex: u32) -> PathBuf {
    marker_dir(pin_dir).join(format!("{}_{ifindex}", p.name()))
}

/// The legacy attachments recorded under `pin_dir`.
pub fn markers(pin_dir: &Path) -> Result<Vec<(Prog, u32)>, DatapathError> {
    Prog::parse_pins(&marker_dir(pin_dir))
}

fn place() -> NlOptions {
    NlOptions {
        priority: LEGACY_PRIORITY,
        handle: TcHandle::from(LEGACY_HANDLE),
        classid: None,
    }
}

/// Attaches `prog` (named `p`) on ingress of `ifindex` as a `cls_bpf`
/// filter at mycni's place: replaces the program of a filter already there
/// (atomically), else adds the `clsact` qdisc if needed and creates the
/// filter. Returns whether the filter is new.
pub fn attach(
    prog: &mut SchedClassifier,
    p: Prog,
    ifindex: u32,
    pin_dir: &Path,
) -> Result<bool, DatapathError> {
    let parent = TcHandle::from(TcAttachType::Ingress);
    let existing = SchedClassifierLink::attached(
        ifindex,
        parent,
        LEGACY_PRIORITY,
        TcHandle::from(LEGACY_HANDLE),
        None,
    )
    .map_err(|e| DatapathError::Program {
        name: p.name(),
        source: aya::programs::ProgramError::IOError(e),
    })?;
    let (id, fresh) = match prog.attach_to_link(existing) {
        Ok(id) => (id, false),
        Err(_) => {
            // No filter at our place yet (the replace found none).
            match qdisc_add_clsact(ifindex) {
                Ok(()) => {}
                Err(aya::programs::tc::TcError::NetlinkError(e))
                    if e.raw_os_error() == Some(libc::EEXIST) => {}
                Err(e) => {
                    return Err(DatapathError::Program {
                        name: p.name(),
                        source: e.into(),
                    });
                }
            }
            let id = prog
                .attach(
                    ifindex,
                    TcAttach::Netlink {
                        parent,
                        options: place(),
                    },
                )
                .map_err(p.error())?;
            (id, true)
        }
    };
    let link = prog.take_link(id).map_err(p.error())?;
    // Dropping aya's handle of a netlink filter deletes the filter; it must
    // outlive the agent, as a pinned TCX link does. The handle holds no fd.
    std::mem::forget(link);
    let marker = marker_path(pin_dir, p, ifindex);
    std::fs::create_dir_all(marker_dir(pin_dir)).map_err(|source| DatapathError::PinDir {
        path: marker_dir(pin_dir),
        source,
    })?;
    // The marker holds the program now in the filter.
    let _ = std::fs::remove_file(&marker);
    prog.pin(&marker).map_err(|source| DatapathError::Pin {
        path: marker.clone(),
        source,
    })?;
    Ok(fresh)
}

/// Deletes mycni's filter of `p` on `ifindex` and its marker. An interface
/// or filter already gone is fine.
pub fn detach(pin_dir: &Path, p: Prog, ifindex: u32) -> Result<(), DatapathError> {
    match qdisc_detach_program(ifindex, TcHandle::from(TcAttachType::Ingress), p.name()) {
        Ok(()) => {}
        Err(aya::programs::tc::TcError::IoError(e)) if gone(&e) => {}
        Err(aya::programs::tc::TcError::NetlinkError(e))
            if e.raw_os_error()
                .is_some_and(|c| c == libc::ENODEV || c == libc::ENOENT || c == libc::EINVAL) => {}
        Err(e) => {
            return Err(DatapathError::Program {
                name: p.name(),
                source: e.into(),
            });
        }
    }
    let _ = std::fs::remove_file(marker_path(pin_dir, p, ifindex));
    Ok(())
}

fn gone(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENODEV)
}

/// The ids of the programs in `cls_bpf` filters on ingress of `ifindex`
/// (in the calling thread's network namespace): how `inspect` finds a
/// legacy fast path without its pins, as `BPF_PROG_QUERY` finds TCX links.
pub fn filter_program_ids(ifindex: u32) -> io::Result<Vec<u32>> {
    use netlink_packet_route::RouteNetlinkMessage;
    use netlink_packet_route::tc::{TcAttribute, TcFilterBpfOption, TcMessage, TcOption};

    let mut tc = TcMessage::with_index(ifindex as i32);
    tc.header.parent = u32::from(TcHandle::from(TcAttachType::Ingress)).into();
    let mut ids = vec![];
    for m in dump(RouteNetlinkMessage::GetTrafficFilter(tc))? {
        let RouteNetlinkMessage::NewTrafficFilter(f) = m else {
            continue;
        };
        for a in &f.attributes {
            if let TcAttribute::Options(opts) = a {
                for o in opts {
                    if let TcOption::Bpf(TcFilterBpfOption::ProgId(id)) = o {
                        ids.push(*id);
                    }
                }
            }
        }
    }
    Ok(ids)
}

/// Sends `request` as a dump on a socket of the calling thread's network
/// namespace and returns what the kernel answered. Synchronous: tc state is
/// read where aya's own tc calls block anyway.
pub(super) fn dump(
    request: netlink_packet_route::RouteNetlinkMessage,
) -> io::Result<Vec<netlink_packet_route::RouteNetlinkMessage>> {
    use netlink_packet_core::{
        NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
    };
    use netlink_packet_route::RouteNetlinkMessage;
    use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

    let mut socket = Socket::new(NETLINK_ROUTE)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    let mut req = NetlinkMessage::new(header, NetlinkPayload::from(request));
    req.finalize();
    let mut buf = vec![0; req.buffer_len()];
    req.serialize(&mut buf);
    socket.send(&buf, 0)?;
    let mut out = vec![];
    let mut rx = vec![0u8; 64 * 1024];
    loop {
        let n = socket.recv(&mut &mut rx[..], 0)?;
        let mut at = 0;
        while at < n {
            let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&rx[at..n])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            let len = msg.header.length as usize;
            match msg.payload {
                NetlinkPayload::Done(_) => return Ok(out),
                NetlinkPayload::Error(e) => {
                    return Err(e.code.map_or_else(
                        || io::Error::other("netlink error"),
                        |c| io::Error::from_raw_os_error(-c.get()),
                    ));
                }
                NetlinkPayload::InnerMessage(m) => out.push(m),
                _ => {}
            }
            if len == 0 {
                break;
            }
            at += len;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_pod_veth_waits_for_its_chain_an_attached_one_and_other_hooks_do_not() {
        let now = Instant::now();
        let want: BTreeSet<(Prog, u32)> = [
            (Prog::FromVxlan, 3),
            (Prog::FromPod, 10),
            (Prog::FromPod, 11),
            (Prog::FromPod, 12),
        ]
        .into();
        // 11 was attached by a previous agent; 12 was seen long ago.
        let have: BTreeSet<(Prog, u32)> = [(Prog::FromPod, 11)].into();
        let first_seen: BTreeMap<u32, Instant> = [
            (10, now - Duration::from_millis(500)),
            (11, now),
            (12, now - LEGACY_SETTLE),
        ]
        .into();
        let (wait, next) = settling(&want, &have, &first_seen, now);
        assert_eq!(
            wait.into_iter().collect::<Vec<_>>(),
            vec![(Prog::FromPod, 10)]
        );
        assert_eq!(next, Some(LEGACY_SETTLE - Duration::from_millis(500)));
        let (wait, next) = settling(&want, &have, &first_seen, now + LEGACY_SETTLE);
        assert!(wait.is_empty() && next.is_none());
    }
}
