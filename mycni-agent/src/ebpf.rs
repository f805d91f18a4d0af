//! Loading, attaching and reading the tc eBPF programs of `mycni-ebpf`.
//!
//! Maps are pinned under a bpffs directory (`/sys/fs/bpf/mycni` in
//! production, a test's own bpffs mount in tests) so `bpftool` can read them
//! and a restarted agent reuses them. TCX links are pinned beside them so the
//! programs stay attached while the agent is down.

use std::io;
use std::path::{Path, PathBuf};

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use aya::maps::lpm_trie::Key;
use aya::maps::{Array, HashMap, LpmTrie, MapData, PerCpuArray};
use aya::programs::links::{FdLink, LinkError, PinnedLink};
use aya::programs::{LinkOrder, SchedClassifier, TcAttach, TcAttachType};
use aya::{Ebpf, EbpfLoader};
use mycni_common::{
    CONFIG_MAP, COUNTERS_LEN, COUNTERS_MAP, DpConfig, DpFamily, DpPath, LOCAL_MAP, LOCAL6_MAP,
    LocalEndpoint, PEERS_MAP, PathCounter, PeerNode, REMOTE_MAP, REMOTE6_MAP, RemoteNode,
};
use thiserror::Error;

/// The object `cargo xtask build-ebpf --release` produced when the agent was
/// built; empty when it was built without one (see build.rs).
static EMBEDDED_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/mycni-ebpf.o"));

/// The programs, by the interface they run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Prog {
    /// Ingress of every pod's host-side veth.
    FromPod,
    /// Ingress of `vxlan.1` and of `vxlan6.1`.
    FromVxlan,
    /// Ingress of the underlay device (tc decapsulation).
    FromUnderlay,
}

impl Prog {
    pub const ALL: [Prog; 3] = [Prog::FromPod, Prog::FromVxlan, Prog::FromUnderlay];

    pub const fn name(self) -> &'static str {
        match self {
            Prog::FromPod => "mycni_from_pod",
            Prog::FromVxlan => "mycni_from_vxlan",
            Prog::FromUnderlay => "mycni_from_underlay",
        }
    }
}

/// Program attached on ingress of every pod's host-side veth.
pub const PROG_FROM_POD: &str = "mycni_from_pod";

/// Every map the object declares, pinned by these names.
pub const MAPS: &[&str] = &[
    COUNTERS_MAP,
    CONFIG_MAP,
    REMOTE_MAP,
    LOCAL_MAP,
    PEERS_MAP,
    REMOTE6_MAP,
    LOCAL6_MAP,
];

#[derive(Debug, Error)]
pub enum DatapathError {
    #[error(
        "this agent was built without an eBPF object (run `cargo xtask build-ebpf --release` before building it, or pass --ebpf-object)"
    )]
    NoObject,
    #[error("cannot create pin directory {path}: {source}")]
    PinDir { path: PathBuf, source: io::Error },
    #[error("loading the eBPF object failed: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("cannot list {path}: {source}")]
    ListPins { path: PathBuf, source: io::Error },
    #[error("program {0} is missing from the eBPF object")]
    MissingProgram(&'static str),
    #[error("program {name}: {source}")]
    Program {
        name: &'static str,
        source: aya::programs::ProgramError,
    },
    #[error("pinned link {path}: {source}")]
    Link { path: PathBuf, source: LinkError },
    #[error("pinning link at {path}: {source}")]
    Pin {
        path: PathBuf,
        source: aya::pin::PinError,
    },
    #[error(
        "the counters pinned at {path} have {entries} entries, this build counts in {expected}: an older agent's layout, which the agent rebuilds when it starts"
    )]
    CounterLayout {
        path: PathBuf,
        entries: u32,
        expected: u32,
    },
    #[error("map {name} at {path}: {source}")]
    Map {
        name: &'static str,
        path: PathBuf,
        source: aya::maps::MapError,
    },
}

/// The embedded object, if the agent was built with one.
pub fn embedded_object() -> Option<&'static [u8]> {
    (!EMBEDDED_OBJECT.is_empty()).then_some(EMBEDDED_OBJECT)
}

/// Loaded programs and their pinned maps.
pub struct Datapath {
    bpf: Ebpf,
    pin_dir: PathBuf,
}

impl Datapath {
    /// Loads `object`, reusing maps already pinned under `pin_dir` (so
    /// counters and forwarding state survive an agent restart) and pinning
    /// the ones that are not.
    pub fn load(object: &[u8], pin_dir: &Path) -> Result<Self, DatapathError> {
        Self::load_with_log(object, pin_dir, false)
    }

    /// [`Self::load`], with the programs' aya-log statements enabled at
    /// debug level when `log` is set (read them with [`Self::take_logger`]).
    /// Disabled, the level is a load-time 0 and the verifier prunes the
    /// logging code from the hot path.
    pub fn load_with_log(object: &[u8], pin_dir: &Path, log: bool) -> Result<Self, DatapathError> {
        for dir in [pin_dir.to_path_buf(), pin_dir.join("links")] {
            std::fs::create_dir_all(&dir).map_err(|source| DatapathError::PinDir {
                path: dir.clone(),
                source,
            })?;
        }
        let mut loader = EbpfLoader::new();
        let level: u8 = if log { aya_log::Level::Debug as u8 } else { 0 };
        loader.override_global(aya_log::LEVEL, &level, true);
        let paths: Vec<(&str, PathBuf)> = MAPS.iter().map(|m| (*m, pin_dir.join(m))).collect();
        for (name, path) in &paths {
            loader.map_pin_path(name, path.as_path());
        }
        let mut bpf = loader.load(object)?;
        for p in Prog::ALL {
            let prog: &mut SchedClassifier = bpf
                .program_mut(p.name())
                .ok_or(DatapathError::MissingProgram(p.name()))?
                .try_into()
                .map_err(|source| DatapathError::Program {
                    name: p.name(),
                    source,
                })?;
            prog.load().map_err(|source| DatapathError::Program {
                name: p.name(),
                source,
            })?;
        }
        Ok(Self {
            bpf,
            pin_dir: pin_dir.to_path_buf(),
        })
    }

    /// Pins again every map whose pin is gone (someone removed it from
    /// bpffs): the programs still use the maps, but the agent and `bpftool`
    /// reach them through the pins. Returns the names re-pinned.
    pub fn repin_missing_maps(&self) -> Result<Vec<&'static str>, DatapathError> {
        let mut done = vec![];
        for name in MAPS {
            let path = self.pin_dir.join(name);
            if path.exists() {
                continue;
            }
            let Some(map) = self.bpf.map(name) else {
                continue;
            };
            let pinned = map.pin(&path);
            pinned.map_err(|source| DatapathError::Pin {
                path: path.clone(),
                source,
            })?;
            done.push(*name);
        }
        Ok(done)
    }

    /// The reader of the programs' log records (once; None after that or
    /// when the object has no log map).
    pub fn take_logger(&mut self) -> Option<aya_log::EbpfLogger<&'static dyn log::Log>> {
        aya_log::EbpfLogger::init(&mut self.bpf).ok()
    }

    /// The loaded program's fd, e.g. for BPF_PROG_TEST_RUN in tests.
    pub fn program_fd(&self, p: Prog) -> Result<std::os::fd::BorrowedFd<'_>, DatapathError> {
        use std::os::fd::AsFd;
        let prog: &SchedClassifier = self
            .bpf
            .program(p.name())
            .ok_or(DatapathError::MissingProgram(p.name()))?
            .try_into()
            .map_err(|source| DatapathError::Program {
                name: p.name(),
                source,
            })?;
        let fd = prog.fd().map_err(|source| DatapathError::Program {
            name: p.name(),
            source,
        })?;
        Ok(fd.as_fd())
    }

    /// Where the pinned link of `prog` on `ifindex` lives.
    pub fn link_pin_path(&self, prog: Prog, ifindex: u32) -> PathBuf {
        link_pin_path(&self.pin_dir, prog, ifindex)
    }

    /// Attaches the from-pod program on ingress of `ifindex`; see [`Self::attach`].
    pub fn attach_from_pod(&mut self, ifindex: u32) -> Result<(), DatapathError> {
        self.attach(Prog::FromPod, ifindex).map(|_| ())
    }

    /// Attaches `prog` on ingress of `ifindex` (in the calling thread's
    /// network namespace) over TCX and pins the link, so the program stays
    /// attached when the agent exits. A link already pinned for this
    /// interface gets the new program swapped in atomically: no packet sees
    /// the hook empty. Returns whether the attachment is new.
    pub fn attach(&mut self, p: Prog, ifindex: u32) -> Result<bool, DatapathError> {
        let pin = self.link_pin_path(p, ifindex);
        let prog: &mut SchedClassifier = self
            .bpf
            .program_mut(p.name())
            .ok_or(DatapathError::MissingProgram(p.name()))?
            .try_into()
            .map_err(|source| DatapathError::Program {
                name: p.name(),
                source,
            })?;
        let prog_err = |source| DatapathError::Program {
            name: p.name(),
            source,
        };
        let fresh_attach = |prog: &mut SchedClassifier| {
            prog.attach(
                ifindex,
                TcAttach::Tcx {
                    attach_type: TcAttachType::Ingress,
                    order: LinkOrder::default(),
                },
            )
            .map_err(prog_err)
        };
        let (link_id, fresh) = match PinnedLink::from_pin(&pin) {
            Ok(old) => {
                let link = FdLink::from(old)
                    .try_into()
                    .map_err(|source| DatapathError::Link {
                        path: pin.clone(),
                        source,
                    })?;
                match prog.attach_to_link(link) {
                    Ok(id) => (id, false),
                    Err(e) => {
                        // The pinned link outlived its interface (defunct):
                        // drop the pin and attach afresh.
                        tracing::warn!(path = %pin.display(), error = %e, "pinned link unusable; attaching afresh");
                        let _ = std::fs::remove_file(&pin);
                        (fresh_attach(prog)?, true)
                    }
                }
            }
            Err(LinkError::SyscallError(e)) if e.io_error.kind() == io::ErrorKind::NotFound => {
                (fresh_attach(prog)?, true)
            }
            Err(source) => return Err(DatapathError::Link { path: pin, source }),
        };
        let link = prog.take_link(link_id).map_err(prog_err)?;
        let fd_link: FdLink = link.try_into().map_err(|source| DatapathError::Link {
            path: pin.clone(),
            source,
        })?;
        if fresh {
            fd_link
                .pin(&pin)
                .map_err(|source| DatapathError::Pin { path: pin, source })?;
        }
        // A replaced link stays pinned at the same path: dropping our handle
        // leaves the attachment in place.
        Ok(fresh)
    }
}

pub fn link_pin_path(pin_dir: &Path, prog: Prog, ifindex: u32) -> PathBuf {
    pin_dir
        .join("links")
        .join(format!("{}_{ifindex}", prog.name()))
}

/// The links pinned under `pin_dir`: what is attached, whoever attached it.
pub fn pinned_links(pin_dir: &Path) -> Result<Vec<(Prog, u32)>, DatapathError> {
    let dir = pin_dir.join("links");
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(vec![]),
        Err(source) => return Err(DatapathError::ListPins { path: dir, source }),
    };
    let mut out = vec![];
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        for p in Prog::ALL {
            if let Some(ifindex) = name
                .strip_prefix(p.name())
                .and_then(|r| r.strip_prefix('_'))
                .and_then(|r| r.parse().ok())
            {
                out.push((p, ifindex));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Detaches `prog` from `ifindex` by removing its pinned link (the last
/// reference: TCX detaches it). Absent is fine.
pub fn detach(pin_dir: &Path, prog: Prog, ifindex: u32) -> Result<(), DatapathError> {
    let pin = link_pin_path(pin_dir, prog, ifindex);
    match PinnedLink::from_pin(&pin) {
        Ok(link) => {
            let fd = link.unpin().map_err(|e| DatapathError::Link {
                path: pin.clone(),
                source: LinkError::SyscallError(aya::sys::SyscallError {
                    call: "unlink",
                    io_error: e,
                }),
            })?;
            drop(fd);
            Ok(())
        }
        Err(LinkError::SyscallError(e)) if e.io_error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => {
            // Not a link (or unreadable): remove the file so it cannot be
            // mistaken for one again.
            let _ = std::fs::remove_file(&pin);
            Err(DatapathError::Link { path: pin, source })
        }
    }
}

/// Everything mycni pinned: links first (detaching every program), then the
/// maps. What `--datapath kernel` does; the kernel path carries on alone.
pub fn detach_all(pin_dir: &Path) -> Result<usize, DatapathError> {
    let links = pinned_links(pin_dir)?;
    let n = links.len();
    for (p, ifindex) in links {
        detach(pin_dir, p, ifindex)?;
    }
    for m in MAPS {
        let _ = std::fs::remove_file(pin_dir.join(m));
    }
    let _ = std::fs::remove_dir(pin_dir.join("links"));
    Ok(n)
}

/// Where the fast path's maps are opened: under the directory the agent
/// pinned them in, or by id, from the programs attached in this network
/// namespace (what `inspect` finds when nobody tells it the directory).
pub trait MapSource {
    fn open_data(&self, name: &'static str) -> Result<MapData, aya::maps::MapError>;
    /// Where `name` was looked for, for error messages.
    fn locate(&self, name: &'static str) -> PathBuf;
}

impl MapSource for Path {
    fn open_data(&self, name: &'static str) -> Result<MapData, aya::maps::MapError> {
        MapData::from_pin(self.join(name))
    }
    fn locate(&self, name: &'static str) -> PathBuf {
        self.join(name)
    }
}

impl MapSource for PathBuf {
    fn open_data(&self, name: &'static str) -> Result<MapData, aya::maps::MapError> {
        self.as_path().open_data(name)
    }
    fn locate(&self, name: &'static str) -> PathBuf {
        self.join(name)
    }
}

/// The fast path as the kernel holds it in this network namespace: the
/// mycni programs attached at TCX ingress of `vxlan.1`, of the underlay and
/// of the pods' veths, and the maps they use, by id. Needs no bpffs path,
/// and sees only this namespace's agent (a lab runs several on one kernel,
/// each with its own pins).
#[derive(Debug, Default)]
pub struct AttachedMaps {
    ids: BTreeMap<&'static str, u32>,
    /// Every attachment found, in the order the devices were visited.
    pub links: Vec<(Prog, u32)>,
}

impl AttachedMaps {
    /// Starts at `vxlan` (its program uses the config, which names the
    /// underlay and `vxlan6.1`, and the local endpoints, which name the pod
    /// veths), then visits those and every pod veth. None when no mycni
    /// program is attached to `vxlan`.
    pub fn discover(vxlan: u32) -> Result<Option<Self>, DatapathError> {
        let mut found = Self::default();
        found.visit(vxlan)?;
        if found.links.is_empty() {
            return Ok(None);
        }
        if let Ok(cfg) = read_config(&found) {
            // The underlay and vxlan6.1, where the config names them.
            for i in [cfg.underlay_ifindex, cfg.vxlan6_ifindex] {
                if i != 0 && i != vxlan {
                    found.visit(i)?;
                }
            }
        }
        // Every pod veth, so the attachments shown are all of them (and
        // the maps only `mycni_from_pod` uses are found): those of IPv4
        // pods, then of pods with IPv6 alone (an IPv6-only node's).
        let mut veths: Vec<u32> = Vec::new();
        if let Ok(local) = read_local(&found) {
            veths.extend(local.values().map(|ep| ep.ifindex));
        }
        if let Ok(local6) = read_local6(&found) {
            for ep in local6.values() {
                if !veths.contains(&ep.ifindex) {
                    veths.push(ep.ifindex);
                }
            }
        }
        for i in veths {
            found.visit(i)?;
        }
        Ok(Some(found))
    }

    fn visit(&mut self, ifindex: u32) -> Result<(), DatapathError> {
        let programs = match SchedClassifier::query_tcx(ifindex, TcAttachType::Ingress) {
            Ok((_, programs)) => programs,
            // A device gone since its index was read has nothing to show.
            Err(_) => return Ok(()),
        };
        for info in programs {
            // The kernel keeps 15 bytes of a program's name.
            let Some(prog) = info.name_as_str().and_then(|n| {
                Prog::ALL
                    .into_iter()
                    .find(|p| n.len() >= 14 && p.name().starts_with(n))
            }) else {
                continue;
            };
            self.links.push((prog, ifindex));
            let ids = info
                .map_ids()
                .map_err(|source| DatapathError::Program {
                    name: prog.name(),
                    source,
                })?
                .unwrap_or_default();
            for id in ids {
                let Ok(map) = aya::maps::MapInfo::from_id(id) else {
                    continue;
                };
                if let Some(name) = map
                    .name_as_str()
                    .and_then(|n| MAPS.iter().find(|m| **m == n))
                {
                    self.ids.insert(name, id);
                }
            }
        }
        Ok(())
    }
}

impl MapSource for AttachedMaps {
    fn open_data(&self, name: &'static str) -> Result<MapData, aya::maps::MapError> {
        let id = self
            .ids
            .get(name)
            .ok_or_else(|| aya::maps::MapError::InvalidName {
                name: format!("{name} (used by no attached mycni program)"),
            })?;
        MapData::from_id(*id)
    }
    fn locate(&self, name: &'static str) -> PathBuf {
        match self.ids.get(name) {
            Some(id) => PathBuf::from(format!("map id {id}")),
            None => PathBuf::from("no attached program"),
        }
    }
}

fn open_map<S: MapSource + ?Sized>(
    src: &S,
    name: &'static str,
) -> Result<aya::maps::Map, DatapathError> {
    let data = src.open_data(name).map_err(map_err(src, name))?;
    Ok(match name {
        COUNTERS_MAP => aya::maps::Map::PerCpuArray(data),
        CONFIG_MAP => aya::maps::Map::Array(data),
        REMOTE_MAP | REMOTE6_MAP => aya::maps::Map::LpmTrie(data),
        _ => aya::maps::Map::HashMap(data),
    })
}

fn map_err<S: MapSource + ?Sized>(
    src: &S,
    name: &'static str,
) -> impl Fn(aya::maps::MapError) -> DatapathError + use<S> {
    let path = src.locate(name);
    move |source| DatapathError::Map {
        name,
        path: path.clone(),
        source,
    }
}

pub fn read_config<S: MapSource + ?Sized>(pin_dir: &S) -> Result<DpConfig, DatapathError> {
    let e = map_err(pin_dir, CONFIG_MAP);
    let a: Array<MapData, DpConfig> = open_map(pin_dir, CONFIG_MAP)?.try_into().map_err(&e)?;
    a.get(&0, 0).map_err(e)
}

pub fn write_config(pin_dir: &Path, cfg: &DpConfig) -> Result<(), DatapathError> {
    let e = map_err(pin_dir, CONFIG_MAP);
    let mut a: Array<MapData, DpConfig> = open_map(pin_dir, CONFIG_MAP)?.try_into().map_err(&e)?;
    if a.get(&0, 0).ok().as_ref() != Some(cfg) {
        a.set(0, cfg, 0).map_err(e)?;
    }
    Ok(())
}

/// What a sync changed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SyncStats {
    pub set: usize,
    pub removed: usize,
    pub total: usize,
}

/// An address family the maps are keyed by: the key is the address's
/// bytes in network order, 4 or 16 of them.
pub trait MapAddr: Copy + Ord {
    type Key: aya::Pod;
    /// Bits in an address: the prefix of a host's LPM key.
    const BITS: u8;
    fn key(&self) -> Self::Key;
    fn from_key(k: Self::Key) -> Self;
}

impl MapAddr for Ipv4Addr {
    type Key = [u8; 4];
    const BITS: u8 = 32;
    fn key(&self) -> [u8; 4] {
        self.octets()
    }
    fn from_key(k: [u8; 4]) -> Self {
        Ipv4Addr::from(k)
    }
}

impl MapAddr for Ipv6Addr {
    type Key = [u8; 16];
    const BITS: u8 = 128;
    fn key(&self) -> [u8; 16] {
        self.octets()
    }
    fn from_key(k: [u8; 16]) -> Self {
        Ipv6Addr::from(k)
    }
}

/// Reads an LPM trie of podCIDRs (`mycni_remote`, `mycni_remote6`).
fn read_trie<A: MapAddr, S: MapSource + ?Sized>(
    pin_dir: &S,
    name: &'static str,
) -> Result<BTreeMap<(A, u8), RemoteNode>, DatapathError> {
    let e = map_err(pin_dir, name);
    let t: LpmTrie<MapData, A::Key, RemoteNode> =
        open_map(pin_dir, name)?.try_into().map_err(&e)?;
    let mut out = BTreeMap::new();
    for kv in t.iter() {
        let (k, v) = kv.map_err(&e)?;
        out.insert((A::from_key(k.data()), k.prefix_len() as u8), v);
    }
    Ok(out)
}

pub fn read_remote<S: MapSource + ?Sized>(
    pin_dir: &S,
) -> Result<BTreeMap<(Ipv4Addr, u8), RemoteNode>, DatapathError> {
    read_trie(pin_dir, REMOTE_MAP)
}

pub fn read_remote6<S: MapSource + ?Sized>(
    pin_dir: &S,
) -> Result<BTreeMap<(Ipv6Addr, u8), RemoteNode>, DatapathError> {
    read_trie(pin_dir, REMOTE6_MAP)
}

/// The diff both forwarding maps share: remove what `want` lacks (`write`
/// with None), write what differs, count both.
fn sync_entries<K: Ord, V: PartialEq>(
    have: &BTreeMap<K, V>,
    want: &BTreeMap<K, V>,
    mut write: impl FnMut(&K, Option<&V>) -> Result<(), DatapathError>,
) -> Result<SyncStats, DatapathError> {
    let mut st = SyncStats {
        total: want.len(),
        ..Default::default()
    };
    for k in have.keys().filter(|k| !want.contains_key(k)) {
        write(k, None)?;
        st.removed += 1;
    }
    for (k, v) in want {
        if have.get(k) != Some(v) {
            write(k, Some(v))?;
            st.set += 1;
        }
    }
    Ok(st)
}

/// Makes an LPM trie of podCIDRs hold exactly `want` (podCIDR -> peer).
fn sync_trie<A: MapAddr>(
    pin_dir: &Path,
    name: &'static str,
    want: &BTreeMap<(A, u8), RemoteNode>,
) -> Result<SyncStats, DatapathError> {
    let have = read_trie(pin_dir, name)?;
    let e = map_err(pin_dir, name);
    let mut t: LpmTrie<MapData, A::Key, RemoteNode> =
        open_map(pin_dir, name)?.try_into().map_err(&e)?;
    sync_entries(&have, want, |k, v| {
        let key = Key::new(u32::from(k.1), k.0.key());
        match v {
            Some(v) => t.insert(&key, v, 0),
            None => t.remove(&key),
        }
        .map_err(&e)
    })
}

/// Makes `mycni_remote` hold exactly `want` (podCIDR -> peer).
pub fn sync_remote(
    pin_dir: &Path,
    want: &BTreeMap<(Ipv4Addr, u8), RemoteNode>,
) -> Result<SyncStats, DatapathError> {
    sync_trie(pin_dir, REMOTE_MAP, want)
}

/// Makes `mycni_remote6` hold exactly `want` (IPv6 podCIDR -> peer).
pub fn sync_remote6(
    pin_dir: &Path,
    want: &BTreeMap<(Ipv6Addr, u8), RemoteNode>,
) -> Result<SyncStats, DatapathError> {
    sync_trie(pin_dir, REMOTE6_MAP, want)
}

/// Reads a hash map keyed by an address.
fn read_hash<A: MapAddr, V: aya::Pod, S: MapSource + ?Sized>(
    pin_dir: &S,
    name: &'static str,
) -> Result<BTreeMap<A, V>, DatapathError> {
    let e = map_err(pin_dir, name);
    let h: HashMap<MapData, A::Key, V> = open_map(pin_dir, name)?.try_into().map_err(&e)?;
    let mut out = BTreeMap::new();
    for kv in h.iter() {
        let (k, v) = kv.map_err(&e)?;
        out.insert(A::from_key(k), v);
    }
    Ok(out)
}

/// Makes a hash map keyed by an address hold exactly `want`.
fn sync_hash<A: MapAddr, V: aya::Pod + PartialEq>(
    pin_dir: &Path,
    name: &'static str,
    want: &BTreeMap<A, V>,
) -> Result<SyncStats, DatapathError> {
    let have = read_hash(pin_dir, name)?;
    let e = map_err(pin_dir, name);
    let mut h: HashMap<MapData, A::Key, V> = open_map(pin_dir, name)?.try_into().map_err(&e)?;
    sync_entries(&have, want, |k, v| {
        match v {
            Some(v) => h.insert(&k.key(), v, 0),
            None => h.remove(&k.key()),
        }
        .map_err(&e)
    })
}

pub fn read_local<S: MapSource + ?Sized>(
    pin_dir: &S,
) -> Result<BTreeMap<Ipv4Addr, LocalEndpoint>, DatapathError> {
    read_hash(pin_dir, LOCAL_MAP)
}

/// Makes `mycni_local` hold exactly `want` (pod IP -> endpoint).
pub fn sync_local(
    pin_dir: &Path,
    want: &BTreeMap<Ipv4Addr, LocalEndpoint>,
) -> Result<SyncStats, DatapathError> {
    sync_hash(pin_dir, LOCAL_MAP, want)
}

pub fn read_local6<S: MapSource + ?Sized>(
    pin_dir: &S,
) -> Result<BTreeMap<Ipv6Addr, LocalEndpoint>, DatapathError> {
    read_hash(pin_dir, LOCAL6_MAP)
}

/// Makes `mycni_local6` hold exactly `want` (pod IPv6 -> endpoint).
pub fn sync_local6(
    pin_dir: &Path,
    want: &BTreeMap<Ipv6Addr, LocalEndpoint>,
) -> Result<SyncStats, DatapathError> {
    sync_hash(pin_dir, LOCAL6_MAP, want)
}

pub fn read_peers<S: MapSource + ?Sized>(
    pin_dir: &S,
) -> Result<BTreeMap<Ipv4Addr, PeerNode>, DatapathError> {
    read_hash(pin_dir, PEERS_MAP)
}

/// Makes `mycni_peers` hold exactly `want` (peer host IP -> peer).
pub fn sync_peers(
    pin_dir: &Path,
    want: &BTreeMap<Ipv4Addr, PeerNode>,
) -> Result<SyncStats, DatapathError> {
    sync_hash(pin_dir, PEERS_MAP, want)
}

/// Sums the per-CPU counters of the map pinned under `pin_dir`, one entry per
/// path (all families together), in `DpPath::ALL` order. Works while no
/// agent runs (what `inspect` and tests use).
pub fn read_counters<S: MapSource + ?Sized>(
    pin_dir: &S,
) -> Result<Vec<(DpPath, PathCounter)>, DatapathError> {
    let mut out: Vec<(DpPath, PathCounter)> = DpPath::ALL
        .into_iter()
        .map(|p| (p, PathCounter::default()))
        .collect();
    for (_, p, c) in read_family_counters(pin_dir)? {
        let sum = &mut out[p as usize].1;
        sum.packets += c.packets;
        sum.bytes += c.bytes;
    }
    Ok(out)
}

/// The per-CPU counters of the map pinned under `pin_dir`, summed over the
/// CPUs: one entry per family and path, in index order
/// (`mycni_common::counter_slots`).
pub fn read_family_counters<S: MapSource + ?Sized>(
    pin_dir: &S,
) -> Result<Vec<(DpFamily, DpPath, PathCounter)>, DatapathError> {
    let e = map_err(pin_dir, COUNTERS_MAP);
    let counters: PerCpuArray<MapData, PathCounter> =
        open_map(pin_dir, COUNTERS_MAP)?.try_into().map_err(&e)?;
    // Read while an agent of another build still owns the pins (before an
    // upgrade's restart), the rows would not mean what this build thinks.
    if counters.len() != COUNTERS_LEN {
        return Err(DatapathError::CounterLayout {
            path: pin_dir.locate(COUNTERS_MAP),
            entries: counters.len(),
            expected: COUNTERS_LEN,
        });
    }
    let mut out = Vec::with_capacity(COUNTERS_LEN as usize);
    for (i, f, p) in mycni_common::counter_slots() {
        let per_cpu = counters.get(&i, 0).map_err(&e)?;
        let sum = per_cpu
            .iter()
            .fold(PathCounter::default(), |acc, c| PathCounter {
                packets: acc.packets + c.packets,
                bytes: acc.bytes + c.bytes,
            });
        out.push((f, p, sum));
    }
    Ok(out)
}
