//! The pinned maps, typed: opening them (by pin or from the attached
//! programs), reading them, and making them hold exactly a desired content.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use aya::maps::lpm_trie::Key;
use aya::maps::{Array, HashMap, LpmTrie, MapData, PerCpuArray};
use aya::programs::{SchedClassifier, TcAttachType};
use mycni_common::flow::{
    DROP_LIMIT_MAP, FLOW_STAT_EMITTED, FLOW_STAT_LOST, FLOW_STAT_SUPPRESSED, FLOW_STATS_LEN,
    FLOW_STATS_MAP, FLOWS_MAP,
};
use mycni_common::{
    CONFIG_MAP, COUNTERS_LEN, COUNTERS_MAP, DpConfig, DpFamily, DpPath, LOCAL_MAP, LOCAL6_MAP,
    LocalEndpoint, NEXTHOP_GEN_MAP, PEERS_MAP, POLICY_MAP, PathCounter, PeerNode, REMOTE_MAP,
    REMOTE6_MAP, RemoteNode,
};

use super::error::DatapathError;
use super::prog::Prog;

/// Every map the object declares, pinned by these names.
pub(crate) const MAPS: &[&str] = &[
    COUNTERS_MAP,
    CONFIG_MAP,
    REMOTE_MAP,
    LOCAL_MAP,
    PEERS_MAP,
    REMOTE6_MAP,
    LOCAL6_MAP,
    POLICY_MAP,
    NEXTHOP_GEN_MAP,
    // Pinned so that events survive an agent restart (the new agent's
    // reader goes on where the old one stopped) and `bpftool` finds them.
    FLOWS_MAP,
    FLOW_STATS_MAP,
    // Pinned so that the ring reader reports the kernel drops folded after
    // a flow's last event (`flows::ring`).
    DROP_LIMIT_MAP,
];

/// The NetworkPolicy epoch the fast path holds established flows to (0: no
/// check), from its pin under `pin_dir`. None: no fast path here (no pin:
/// the kernel datapath, or programs not loaded yet).
pub(crate) fn read_policy_epoch(pin_dir: &Path) -> Option<u32> {
    let data = pin_dir.open_data(POLICY_MAP).ok()?;
    let map: Array<MapData, u32> = Array::try_from(aya::maps::Map::Array(data)).ok()?;
    map.get(&0, 0).ok()
}

/// Writes the epoch (the policy room, after nftables took the change that
/// stamps with it). False when there is no fast path to tell.
pub fn write_policy_epoch(pin_dir: &Path, epoch: u32) -> Result<bool, aya::maps::MapError> {
    let data = match pin_dir.open_data(POLICY_MAP) {
        Ok(d) => d,
        Err(_) => return Ok(false),
    };
    let mut map: Array<MapData, u32> = Array::try_from(aya::maps::Map::Array(data))?;
    map.set(0, &epoch, 0)?;
    Ok(true)
}

/// The policy epoch's home on the fast path: its pinned map under a pin
/// directory (which may not exist yet: the reads and writes say so).
pub(crate) struct PinnedEpoch(pub PathBuf);

impl crate::epoch::PolicyEpoch for PinnedEpoch {
    fn read(&self) -> Option<u32> {
        read_policy_epoch(&self.0)
    }

    fn write(&self, epoch: u32) -> anyhow::Result<bool> {
        Ok(write_policy_epoch(&self.0, epoch)?)
    }
}

/// The generation of the programs' next-hop cache (`mycni_nexthop_gen`):
/// bumping it makes every cached next hop stale, so the next packet to
/// each peer asks the FIB again. Held open: it is bumped on every kernel
/// notification.
pub struct NexthopGen(std::sync::Mutex<(Array<MapData, u32>, u32)>);

impl NexthopGen {
    pub fn open(pin_dir: &Path) -> Result<Self, aya::maps::MapError> {
        let data = pin_dir.open_data(NEXTHOP_GEN_MAP)?;
        let map: Array<MapData, u32> = Array::try_from(aya::maps::Map::Array(data))?;
        let last = map.get(&0, 0)?;
        Ok(NexthopGen(std::sync::Mutex::new((map, last))))
    }

    /// The generation in force (0: the cache is off).
    pub fn current(&self) -> Result<u32, aya::maps::MapError> {
        let g = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        g.0.get(&0, 0)
    }

    /// A generation no entry holds yet: one after the last this handle
    /// wrote (or found), never 0, which turns the cache off. One write,
    /// no read: it runs on every kernel notification, thousands while a
    /// pass programs thousands of peers.
    pub fn bump(&self) -> Result<u32, aya::maps::MapError> {
        let mut g = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let next = match g.1.wrapping_add(1) {
            0 => 1,
            n => n,
        };
        g.0.set(0, &next, 0)?;
        g.1 = next;
        Ok(next)
    }
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
pub(crate) struct AttachedMaps {
    ids: BTreeMap<&'static str, u32>,
    /// Every attachment found, in the order the devices were visited.
    pub links: Vec<(Prog, u32)>,
}

impl AttachedMaps {
    /// Starts at `vxlan` (its program uses the config, which names the
    /// underlay and `vxlan6.1`, and the local endpoints, which name the pod
    /// veths), then visits those and every pod veth. None when no mycni
    /// program is attached to `vxlan`.
    pub(crate) fn discover(vxlan: u32) -> Result<Option<Self>, DatapathError> {
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
        if let Ok(local) = LOCAL.read(&found) {
            veths.extend(local.values().map(|ep| ep.ifindex));
        }
        if let Ok(local6) = LOCAL6.read(&found) {
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
        // A device gone since its index was read has nothing to show.
        let mut programs = match SchedClassifier::query_tcx(ifindex, TcAttachType::Ingress) {
            Ok((_, programs)) => programs,
            Err(_) => vec![],
        };
        // Legacy tc filters (a kernel without TCX, or MYCNI_TC_ATTACH).
        if let Ok(ids) = super::attach::filter_program_ids(ifindex)
            && !ids.is_empty()
        {
            programs.extend(
                aya::programs::loaded_programs()
                    .filter_map(Result::ok)
                    .filter(|info| ids.contains(&info.id())),
            );
        }
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
            let ids = info.map_ids().map_err(prog.error())?.unwrap_or_default();
            for id in ids {
                let Ok(map) = aya::maps::MapInfo::from_id(id) else {
                    continue;
                };
                // The kernel keeps 15 bytes of a map's name too
                // (`mycni_flow_stats` is `mycni_flow_stat` there).
                if let Some(name) = map.name_as_str().and_then(|n| {
                    MAPS.iter()
                        .find(|m| **m == n || (n.len() == 15 && m.starts_with(n)))
                }) {
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
        COUNTERS_MAP | FLOW_STATS_MAP => aya::maps::Map::PerCpuArray(data),
        FLOWS_MAP => aya::maps::Map::RingBuf(data),
        DROP_LIMIT_MAP => aya::maps::Map::LruHashMap(data),
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

pub(crate) fn read_config<S: MapSource + ?Sized>(pin_dir: &S) -> Result<DpConfig, DatapathError> {
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
    sync_trie_from(pin_dir, name, &read_trie(pin_dir, name)?, want)
}

/// Brings an LPM trie of podCIDRs that holds `have` to `want`, writing
/// only the difference (without reading the map).
fn sync_trie_from<A: MapAddr>(
    pin_dir: &Path,
    name: &'static str,
    have: &BTreeMap<(A, u8), RemoteNode>,
    want: &BTreeMap<(A, u8), RemoteNode>,
) -> Result<SyncStats, DatapathError> {
    let e = map_err(pin_dir, name);
    let mut t: LpmTrie<MapData, A::Key, RemoteNode> =
        open_map(pin_dir, name)?.try_into().map_err(&e)?;
    sync_entries(have, want, |k, v| {
        let key = Key::new(u32::from(k.1), k.0.key());
        match v {
            Some(v) => t.insert(&key, v, 0),
            None => t.remove(&key),
        }
        .map_err(&e)
    })
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
    sync_hash_from(pin_dir, name, &read_hash(pin_dir, name)?, want)
}

/// Brings a hash map keyed by an address that holds `have` to `want`,
/// writing only the difference (without reading the map).
fn sync_hash_from<A: MapAddr, V: aya::Pod + PartialEq>(
    pin_dir: &Path,
    name: &'static str,
    have: &BTreeMap<A, V>,
    want: &BTreeMap<A, V>,
) -> Result<SyncStats, DatapathError> {
    let e = map_err(pin_dir, name);
    let mut h: HashMap<MapData, A::Key, V> = open_map(pin_dir, name)?.try_into().map_err(&e)?;
    sync_entries(have, want, |k, v| {
        match v {
            Some(v) => h.insert(&k.key(), v, 0),
            None => h.remove(&k.key()),
        }
        .map_err(&e)
    })
}

/// An LPM trie of podCIDRs, by name: `mycni_remote`, `mycni_remote6`.
pub struct TrieMap<A> {
    name: &'static str,
    addr: PhantomData<fn() -> A>,
}

/// A hash map keyed by an address, by name: `mycni_local`, `mycni_local6`,
/// `mycni_peers`.
pub struct HashMapOf<A, V> {
    name: &'static str,
    types: PhantomData<fn() -> (A, V)>,
}

/// IPv4 podCIDR -> peer.
pub const REMOTE: TrieMap<Ipv4Addr> = TrieMap::new(REMOTE_MAP);
/// IPv6 podCIDR -> peer.
pub const REMOTE6: TrieMap<Ipv6Addr> = TrieMap::new(REMOTE6_MAP);
/// Pod IPv4 -> endpoint.
pub const LOCAL: HashMapOf<Ipv4Addr, LocalEndpoint> = HashMapOf::new(LOCAL_MAP);
/// Pod IPv6 -> endpoint.
pub const LOCAL6: HashMapOf<Ipv6Addr, LocalEndpoint> = HashMapOf::new(LOCAL6_MAP);
/// Peer host IP -> peer.
pub const PEERS: HashMapOf<Ipv4Addr, PeerNode> = HashMapOf::new(PEERS_MAP);

impl<A: MapAddr> TrieMap<A> {
    const fn new(name: &'static str) -> Self {
        TrieMap {
            name,
            addr: PhantomData,
        }
    }

    pub const fn name(&self) -> &'static str {
        self.name
    }

    pub fn read<S: MapSource + ?Sized>(
        &self,
        src: &S,
    ) -> Result<BTreeMap<(A, u8), RemoteNode>, DatapathError> {
        read_trie(src, self.name)
    }

    /// Makes the map hold exactly `want`.
    pub fn sync(
        &self,
        pin_dir: &Path,
        want: &BTreeMap<(A, u8), RemoteNode>,
    ) -> Result<SyncStats, DatapathError> {
        sync_trie(pin_dir, self.name, want)
    }

    /// Makes the map, known to hold `have` (what this process last wrote),
    /// hold `want`: an event pass's difference, without reading the map.
    pub(crate) fn sync_from(
        &self,
        pin_dir: &Path,
        have: &BTreeMap<(A, u8), RemoteNode>,
        want: &BTreeMap<(A, u8), RemoteNode>,
    ) -> Result<SyncStats, DatapathError> {
        sync_trie_from(pin_dir, self.name, have, want)
    }
}

impl<A: MapAddr, V: aya::Pod + PartialEq> HashMapOf<A, V> {
    const fn new(name: &'static str) -> Self {
        HashMapOf {
            name,
            types: PhantomData,
        }
    }

    pub const fn name(&self) -> &'static str {
        self.name
    }

    pub fn read<S: MapSource + ?Sized>(&self, src: &S) -> Result<BTreeMap<A, V>, DatapathError> {
        read_hash(src, self.name)
    }

    /// Makes the map hold exactly `want`.
    pub fn sync(&self, pin_dir: &Path, want: &BTreeMap<A, V>) -> Result<SyncStats, DatapathError> {
        sync_hash(pin_dir, self.name, want)
    }

    /// [`TrieMap::sync_from`] for a hash map.
    pub(crate) fn sync_from(
        &self,
        pin_dir: &Path,
        have: &BTreeMap<A, V>,
        want: &BTreeMap<A, V>,
    ) -> Result<SyncStats, DatapathError> {
        sync_hash_from(pin_dir, self.name, have, want)
    }
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

/// The programs' flow-event statistics, summed over the CPUs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FlowStats {
    /// Events written to the ring.
    pub emitted: u64,
    /// Events the ring had no room for.
    pub lost: u64,
    /// Path changes of a connection not announced (past its first three,
    /// one a second at most).
    pub suppressed: u64,
}

/// Reads `mycni_flow_stats` under `pin_dir`.
pub fn read_flow_stats<S: MapSource + ?Sized>(pin_dir: &S) -> Result<FlowStats, DatapathError> {
    let e = map_err(pin_dir, FLOW_STATS_MAP);
    let stats: PerCpuArray<MapData, u64> =
        open_map(pin_dir, FLOW_STATS_MAP)?.try_into().map_err(&e)?;
    let sum = |slot: u32| -> Result<u64, DatapathError> {
        // A map of another layout (an older agent's) has fewer slots.
        if slot >= FLOW_STATS_LEN.min(stats.len()) {
            return Ok(0);
        }
        Ok(stats.get(&slot, 0).map_err(&e)?.iter().sum())
    };
    Ok(FlowStats {
        emitted: sum(FLOW_STAT_EMITTED)?,
        lost: sum(FLOW_STAT_LOST)?,
        suppressed: sum(FLOW_STAT_SUPPRESSED)?,
    })
}
