//! On-disk lease store for the built-in `mycni-ipam` IPAM.
//!
//! The plugin runs once per pod start, so allocating in-process avoids the fork/exec of a
//! delegated IPAM binary. The layout on disk is the one the reference `host-local` plugin's
//! disk backend uses, so an operator can switch a node between the two without losing or
//! duplicating leases, and both take the same `flock` on `<dir>/lock`, so they also exclude
//! each other while a node runs a mix of old and new configurations:
//!
//! ```text
//! <data_dir>/<network>/lock                 flock(LOCK_EX) around every read-modify-write
//! <data_dir>/<network>/last_reserved_ip.0   last IP allocated from range set 0, where
//! <data_dir>/<network>/last_reserved_ip.1   round-robin resumes (one file per set)
//! <data_dir>/<network>/10.244.1.5           "<containerID>\r\n<ifname>"
//! <data_dir>/<network>/fd00:10:244:1::5     the same, for an IPv6 address (RFC 5952 text,
//!                                           as Go's net.IP.String writes it)
//! ```
//!
//! A dual-stack network has one range set per family, so each pod holds one lease file per
//! family, and DEL releases every file naming it.
//!
//! Lease files come into existence complete, so a killed plugin never leaves a half-written
//! lease: the content is written to an anonymous `O_TMPFILE` inode that `linkat(2)` then
//! names (a temp file hard-linked to the name where that is unavailable). `link` refusing to
//! replace an existing name means a lease is never overwritten even by a writer that ignores
//! the lock.
//!
//! This runs on every pod start, where each metadata-changing syscall costs tens of
//! microseconds and replacing a file by rename costs hundreds (ext4 flushes the new data
//! when a rename replaces a file). So each call opens the directory once and reaches its
//! files with `openat`/`linkat`/`unlinkat`, and nothing is created or renamed that an
//! existing file or an in-place write can stand in for.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::net::IpAddr;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use super::lease::{Owner, validate_owner};
use super::lock::Locked;
use super::range::{all_ones, netmask};
use mycni_common::net::Family;

pub use super::lease::Lease;
// Where these lived before the split; `ipam::store::Range` still names them.
pub use super::range::{Range, RangeError};

/// Keeps `<data_dir>/<network>` well below PATH_MAX/NAME_MAX limits.
const MAX_NETWORK_NAME: usize = 200;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "no IP addresses available in range {range} of network {network:?}: every address is \
         leased or reserved. Check the network's lease directory for leaked leases (files \
         naming containers that no longer exist); CNI GC releases them, or widen the range"
    )]
    Exhausted { network: String, range: String },
    #[error(
        "invalid network name {0:?}: it names the lease directory, so it must be non-empty, \
         not \".\" or \"..\", contain no '/' or NUL, and be at most 200 bytes"
    )]
    BadNetworkName(String),
    /// Not in the original API: an owner that is empty or contains whitespace would be
    /// written into a lease file that reads back as a different owner (or as garbage that
    /// GC frees while the container still uses the IP), so it is refused up front.
    #[error(
        "invalid lease owner (container ID {container_id:?}, interface {ifname:?}): both must \
         be non-empty and free of whitespace and control characters, because the lease file \
         stores them as \"<id>\\r\\n<ifname>\""
    )]
    InvalidOwner {
        container_id: String,
        ifname: String,
    },
    #[error("lease store I/O error on {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("lease store: cannot use {}: {reason}", path.display())]
    Corrupt { path: PathBuf, reason: String },
}

pub(super) fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_owned(),
        source,
    }
}

fn not_a_directory(path: &Path) -> StoreError {
    StoreError::Corrupt {
        path: path.to_owned(),
        reason: "exists but is not a directory; the lease store needs a directory here".to_owned(),
    }
}

pub(super) fn create_dir(dir: &Path) -> Result<(), StoreError> {
    match fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
    {
        Ok(()) => Ok(()),
        // "File exists" alone would not tell the operator what is wrong with the path.
        Err(_) if dir.exists() && !dir.is_dir() => Err(not_a_directory(dir)),
        Err(e) => Err(io_err(dir)(e)),
    }
}

/// `(a + b) mod m` for `a, b < m` (`b <= m` for `b` = 1 with `m` = 1), without the
/// overflow of `a + b` near `u128::MAX` (an IPv6 /0 range).
fn add_mod(a: u128, b: u128, m: u128) -> u128 {
    let room = m - a;
    if b >= room { b - room } else { a + b }
}

/// Leases of one network, kept in `<data_dir>/<network>/` in host-local's format.
#[derive(Debug)]
pub struct LeaseStore {
    dir: PathBuf,
    network: String,
}

impl LeaseStore {
    /// The name becomes a path component, so anything that could escape or alias the data
    /// directory is refused before touching the filesystem.
    pub fn open(data_dir: &Path, network: &str) -> Result<LeaseStore, StoreError> {
        if network.is_empty()
            || network == "."
            || network == ".."
            || network.contains(['/', '\0'])
            || network.len() > MAX_NETWORK_NAME
        {
            return Err(StoreError::BadNetworkName(network.to_owned()));
        }
        let dir = data_dir.join(network);
        // stat rather than mkdir: the directory exists on all but a node's first call, and
        // mkdir would take the parent directory's lock for writing even then.
        match fs::metadata(&dir) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Err(not_a_directory(&dir)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => create_dir(&dir)?,
            Err(e) => return Err(io_err(&dir)(e)),
        }
        Ok(LeaseStore {
            dir,
            network: network.to_owned(),
        })
    }

    /// Lets callers (and operators reading error messages) find the lease files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Idempotent so that a runtime retrying ADD for the same container and interface gets
    /// the IP it was already given instead of leaking a second one. One range, of range
    /// set 0: see [`LeaseStore::allocate_in`].
    pub fn allocate(
        &self,
        range: &Range,
        reserved: &[IpAddr],
        container_id: &str,
        ifname: &str,
    ) -> Result<IpAddr, StoreError> {
        self.allocate_in(
            std::slice::from_ref(range),
            reserved,
            0,
            container_id,
            ifname,
        )
    }

    /// One address from range set number `set` (its `ranges`, of one family, tried in
    /// order), never one of `reserved`. Idempotent like [`LeaseStore::allocate`]: the
    /// container's lease in any of the set's ranges is handed back. The set's number names
    /// its round-robin hint file, as in host-local, so the families of a dual-stack network
    /// each resume where they left off.
    pub fn allocate_in(
        &self,
        ranges: &[Range],
        reserved: &[IpAddr],
        set: usize,
        container_id: &str,
        ifname: &str,
    ) -> Result<IpAddr, StoreError> {
        validate_owner(container_id, ifname)?;
        let locked = self.lock()?;
        let entries = locked.scan()?;
        let in_set = |ip: IpAddr| ranges.iter().any(|r| r.contains(ip));

        let mut taken: HashSet<IpAddr> =
            HashSet::with_capacity(entries.len() + reserved.len() + 2 * ranges.len());
        for entry in &entries {
            if !in_set(entry.ip) {
                continue;
            }
            taken.insert(entry.ip);
            if !entry.is_dir
                && locked
                    .read_owner(entry.ip)
                    .is_some_and(|o| o.is_exactly(container_id, ifname))
            {
                return Ok(entry.ip);
            }
        }
        taken.extend(reserved);
        // `Range`'s fields are public, so a hand-built range could include these. IPv6
        // has no broadcast, but its network address is the subnet-router anycast one.
        for r in ranges {
            let mask = netmask(r.network, r.prefix);
            let net = r.network.bits() & mask;
            taken.insert(r.network.with_bits(net));
            if r.is_ipv4() {
                taken.insert(r.network.with_bits(net | (all_ones(r.network) & !mask)));
            }
        }

        let exhausted = || StoreError::Exhausted {
            network: self.network.clone(),
            range: ranges
                .iter()
                .map(|r| format!("{}-{}", r.start, r.end))
                .collect::<Vec<_>>()
                .join(", "),
        };
        // The set's addresses as one sequence, range after range.
        let total = ranges.iter().fold(0u128, |n, r| n.saturating_add(r.size()));
        if total == 0 {
            return Err(exhausted());
        }
        let at = |mut pos: u128| {
            for r in ranges {
                if pos < r.size() {
                    return Some(r.nth(pos));
                }
                pos -= r.size();
            }
            None
        };
        // Round-robin like host-local: resume after the last allocation so a just-released
        // IP is not handed to the next pod while stale state (conntrack, neighbour caches,
        // peers' routes) may still point at the old one.
        let hint = locked.read_hint(set);
        let mut first = 0;
        if let Some(last) = hint.ip {
            let mut before = 0u128;
            for r in ranges {
                if r.contains(last) {
                    first = add_mod(add_mod(before, r.offset(last), total), 1, total);
                    break;
                }
                before = before.saturating_add(r.size());
            }
        }

        let content = format!("{container_id}\r\n{ifname}");
        let mut pending = None;
        // Every skipped candidate is a distinct member of `taken` or a name that link(2)
        // found occupied, so this stops after at most |taken| + |entries| + 1 steps even in
        // a huge range (an IPv6 /64).
        for step in 0..total {
            let Some(ip) = at(add_mod(first, step, total)) else {
                break;
            };
            if taken.contains(&ip) {
                continue;
            }
            if locked.link_lease(&mut pending, content.as_bytes(), ip)? {
                drop(pending);
                locked.write_hint(hint, ip);
                return Ok(ip);
            }
        }
        Err(exhausted())
    }

    /// Idempotent (a missing lease is success) because CNI DEL may be repeated and may
    /// follow a failed ADD that never leased anything. `hint`: see
    /// [`LeaseStore::release_all`].
    pub fn release(
        &self,
        container_id: &str,
        ifname: &str,
        hint: Option<IpAddr>,
    ) -> Result<Vec<IpAddr>, StoreError> {
        self.release_all(container_id, ifname, hint.as_slice())
    }

    /// Releases every lease of the container's interface. `hints` are the addresses it is
    /// believed to hold (prevResult's, one per family): when every one of them is its, and
    /// it holds as many leases as the caller expects (the caller passes no hints
    /// otherwise), they are all there is and no lease file needs reading.
    pub fn release_all(
        &self,
        container_id: &str,
        ifname: &str,
        hints: &[IpAddr],
    ) -> Result<Vec<IpAddr>, StoreError> {
        validate_owner(container_id, ifname)?;
        let locked = self.lock()?;
        // The hints spare reading every lease file on the common path; they are only
        // trusted if each file still names this owner, since prevResult may be stale.
        let mut released = Vec::new();
        let mut all_hinted = !hints.is_empty();
        for &ip in hints {
            if locked
                .read_owner(ip)
                .is_some_and(|o| o.held_by(container_id, ifname))
                && locked.remove_lease(ip)?
            {
                released.push(ip);
            } else {
                all_hinted = false;
            }
        }
        if !all_hinted {
            for entry in locked.scan()? {
                if !entry.is_dir
                    && locked
                        .read_owner(entry.ip)
                        .is_some_and(|o| o.held_by(container_id, ifname))
                    && locked.remove_lease(entry.ip)?
                {
                    released.push(entry.ip);
                }
            }
        }
        released.sort_unstable();
        Ok(released)
    }

    /// Taken under the lock so the listing is a consistent snapshot. Sorted by IP.
    pub fn leases(&self) -> Result<Vec<Lease>, StoreError> {
        Ok(self
            .lock()?
            .read_leases()?
            .into_iter()
            .map(|(ip, owner)| owner.into_lease(ip))
            .collect())
    }

    /// Frees leases leaked by containers that were never DELeted (node crash, runtime bug).
    /// A lease of unknown interface (old host-local format) is kept if its container is kept
    /// with any interface, so a live container's IP is never freed for lack of an ifname.
    /// Garbage leases are always freed: no container can be shown to own them.
    pub fn gc(&self, keep: &HashSet<(String, String)>) -> Result<Vec<Lease>, StoreError> {
        let locked = self.lock()?;
        let keep_pairs: HashSet<(&str, &str)> =
            keep.iter().map(|(c, i)| (c.as_str(), i.as_str())).collect();
        let keep_ids: HashSet<&str> = keep.iter().map(|(c, _)| c.as_str()).collect();
        let mut released = Vec::new();
        for (ip, owner) in locked.read_leases()? {
            let kept = match &owner {
                Owner::Known {
                    id,
                    ifname: Some(i),
                } => keep_pairs.contains(&(id.as_str(), i.as_str())),
                Owner::Known { id, ifname: None } => keep_ids.contains(id.as_str()),
                Owner::Garbage => false,
            };
            if !kept && locked.remove_lease(ip)? {
                released.push(owner.into_lease(ip));
            }
        }
        Ok(released)
    }

    /// See [`Locked::acquire`].
    pub(super) fn lock(&self) -> Result<Locked<'_>, StoreError> {
        Locked::acquire(&self.dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipam::lock::LOCK_FILE;
    use crate::ipam::testutil::*;

    // ---- open ----

    #[test]
    fn open_validates_name_and_creates_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let long = "n".repeat(201);
        for bad in ["", ".", "..", "a/b", "/abs", "a\0b", long.as_str()] {
            match LeaseStore::open(tmp.path(), bad) {
                Err(StoreError::BadNetworkName(n)) => assert_eq!(n, bad),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 0);

        let data = tmp.path().join("var/lib/cni/networks");
        let store = LeaseStore::open(&data, &"n".repeat(200)).unwrap();
        assert_eq!(store.dir(), data.join("n".repeat(200)));
        assert!(store.dir().is_dir());
        // Reopening an existing store is fine.
        LeaseStore::open(&data, &"n".repeat(200)).unwrap();

        fs::write(tmp.path().join("file"), b"").unwrap();
        match LeaseStore::open(tmp.path(), "file") {
            Err(e @ StoreError::Corrupt { .. }) => {
                assert!(e.to_string().contains("not a directory"), "{e}")
            }
            other => panic!("{other:?}"),
        }
    }

    // ---- allocate ----

    #[test]
    fn allocate_skips_network_broadcast_and_reserved() {
        let (_tmp, store) = store();
        let r = range("10.1.0.0/29"); // usable .1-.6
        let reserved = [ip("10.1.0.1"), ip("10.1.0.4")];
        let mut got = Vec::new();
        for i in 0..4 {
            got.push(
                store
                    .allocate(&r, &reserved, &format!("c{i}"), "eth0")
                    .unwrap(),
            );
        }
        assert_eq!(
            got,
            [
                ip("10.1.0.2"),
                ip("10.1.0.3"),
                ip("10.1.0.5"),
                ip("10.1.0.6")
            ]
        );
        assert!(matches!(
            store.allocate(&r, &reserved, "c9", "eth0"),
            Err(StoreError::Exhausted { .. })
        ));
        assert_eq!(lease_files(&store), got);
    }

    #[test]
    fn allocate_whole_slash24_is_distinct() {
        let (_tmp, store) = store();
        let r = range("10.2.0.0/24");
        let gw = ip("10.2.0.1");
        let mut seen = HashSet::new();
        for i in 0..253 {
            let a = store.allocate(&r, &[gw], &format!("c{i}"), "eth0").unwrap();
            assert!(a != gw && r.contains(a), "{a}");
            assert!(seen.insert(a), "{a} handed out twice");
        }
        assert!(!seen.contains(&ip("10.2.0.0")) && !seen.contains(&ip("10.2.0.255")));
        assert!(matches!(
            store.allocate(&r, &[gw], "last", "eth0"),
            Err(StoreError::Exhausted { .. })
        ));
        assert_eq!(lease_files(&store).len(), 253);
    }

    #[test]
    fn allocate_never_hands_out_network_or_broadcast_of_hand_built_range() {
        let (_tmp, store) = store();
        // Bypasses Range::new on purpose: the fields are public.
        let r = Range {
            network: ip("10.3.0.0"),
            prefix: 30,
            start: ip("10.3.0.0"),
            end: ip("10.3.0.3"),
        };
        let a = store.allocate(&r, &[], "a", "eth0").unwrap();
        let b = store.allocate(&r, &[], "b", "eth0").unwrap();
        assert_eq!((a, b), (ip("10.3.0.1"), ip("10.3.0.2")));
        assert!(matches!(
            store.allocate(&r, &[], "c", "eth0"),
            Err(StoreError::Exhausted { .. })
        ));
        let backwards = Range {
            start: ip("10.3.0.2"),
            end: ip("10.3.0.1"),
            ..r
        };
        assert_eq!(backwards.size(), 0);
        assert!(matches!(
            store.allocate(&backwards, &[], "d", "eth0"),
            Err(StoreError::Exhausted { .. })
        ));
    }

    #[test]
    fn round_robin_resumes_after_last_reserved_and_wraps() {
        let (_tmp, store) = store();
        let r = range("10.4.0.0/29"); // .1-.6
        write(&store, LAST_RESERVED_FILE, b"10.4.0.4");
        assert_eq!(
            store.allocate(&r, &[], "a", "eth0").unwrap(),
            ip("10.4.0.5")
        );
        assert_eq!(read(&store, LAST_RESERVED_FILE), "10.4.0.5");
        assert_eq!(
            store.allocate(&r, &[], "b", "eth0").unwrap(),
            ip("10.4.0.6")
        );
        assert_eq!(
            store.allocate(&r, &[], "c", "eth0").unwrap(),
            ip("10.4.0.1")
        );
        assert_eq!(read(&store, LAST_RESERVED_FILE), "10.4.0.1");
        assert_eq!(
            store.allocate(&r, &[], "d", "eth0").unwrap(),
            ip("10.4.0.2")
        );
    }

    #[test]
    fn round_robin_wraps_at_end_of_range() {
        let r = range("10.4.0.0/29"); // .1-.6
        // Last allocation at the end of the range: wrap even though the end is free.
        let (_tmp1, s1) = store();
        write(&s1, LAST_RESERVED_FILE, b"10.4.0.6");
        assert_eq!(s1.allocate(&r, &[], "a", "eth0").unwrap(), ip("10.4.0.1"));
        // The search itself wraps past taken addresses at the end of the range.
        let (_tmp2, s2) = store();
        write(&s2, LAST_RESERVED_FILE, b"10.4.0.4");
        write(&s2, "10.4.0.5", b"x\r\neth0");
        write(&s2, "10.4.0.6", b"y\r\neth0");
        assert_eq!(s2.allocate(&r, &[], "a", "eth0").unwrap(), ip("10.4.0.1"));
    }

    #[test]
    fn round_robin_starts_at_range_start_without_usable_last_reserved() {
        let r = range("10.5.0.0/24");
        for content in [&b"10.9.9.9"[..], b"garbage", b"", b"\xff\xfe"] {
            let (_tmp, store) = store();
            write(&store, LAST_RESERVED_FILE, content);
            assert_eq!(
                store.allocate(&r, &[], "a", "eth0").unwrap(),
                ip("10.5.0.1"),
                "{content:?}"
            );
        }
        // host-local may leave a trailing newline when edited by hand.
        let (_tmp, store) = store();
        write(&store, LAST_RESERVED_FILE, b"10.5.0.7\n");
        assert_eq!(
            store.allocate(&r, &[], "a", "eth0").unwrap(),
            ip("10.5.0.8")
        );
    }

    #[test]
    fn released_ip_is_not_immediately_reused() {
        let (_tmp, store) = store();
        let r = range("10.6.0.0/24");
        let a = store.allocate(&r, &[], "a", "eth0").unwrap();
        let b = store.allocate(&r, &[], "b", "eth0").unwrap();
        assert_eq!(store.release("a", "eth0", Some(a)).unwrap(), [a]);
        let c = store.allocate(&r, &[], "c", "eth0").unwrap();
        assert_eq!((a, b, c), (ip("10.6.0.1"), ip("10.6.0.2"), ip("10.6.0.3")));
    }

    #[test]
    fn allocate_is_idempotent_per_container_and_ifname() {
        let (_tmp, store) = store();
        let r = range("10.7.0.0/24");
        let a = store.allocate(&r, &[], "c1", "eth0").unwrap();
        assert_eq!(store.allocate(&r, &[], "c1", "eth0").unwrap(), a);
        let b = store.allocate(&r, &[], "c1", "eth1").unwrap();
        assert_ne!(a, b);
        assert_eq!(store.allocate(&r, &[], "c1", "eth1").unwrap(), b);
        assert_eq!(lease_files(&store), [a, b]);
        assert_eq!(read(&store, &a.to_string()), "c1\r\neth0");
        assert_eq!(read(&store, &b.to_string()), "c1\r\neth1");
        // Found even when it is not where round-robin would look next.
        let c = store.allocate(&r, &[], "c2", "eth0").unwrap();
        assert_eq!(store.allocate(&r, &[], "c1", "eth0").unwrap(), a);
        assert_eq!(lease_files(&store), [a, b, c]);
    }

    #[test]
    fn allocate_ignores_own_lease_outside_range_and_old_format_lease() {
        let (_tmp, store) = store();
        let r = Range::new(
            ip("10.8.0.0"),
            24,
            Some(ip("10.8.0.10")),
            Some(ip("10.8.0.20")),
        )
        .unwrap();
        write(&store, "10.8.0.5", b"c1\r\neth0"); // same owner, outside start..=end
        write(&store, "10.8.0.10", b"c1"); // old format: interface unknown
        let a = store.allocate(&r, &[], "c1", "eth0").unwrap();
        assert_eq!(a, ip("10.8.0.11"));
        assert_eq!(read(&store, "10.8.0.5"), "c1\r\neth0");
        assert_eq!(read(&store, "10.8.0.10"), "c1");
    }

    #[test]
    fn allocate_rejects_owner_that_would_not_read_back() {
        let (_tmp, store) = store();
        let r = range("10.9.0.0/24");
        for (cid, ifname) in [
            ("", "eth0"),
            ("c1", ""),
            ("c 1", "eth0"),
            ("c1\r\nx", "eth0"),
            ("c1", "eth0\n"),
        ] {
            assert!(
                matches!(
                    store.allocate(&r, &[], cid, ifname),
                    Err(StoreError::InvalidOwner { .. })
                ),
                "{cid:?} {ifname:?}"
            );
            assert!(matches!(
                store.release(cid, ifname, None),
                Err(StoreError::InvalidOwner { .. })
            ));
        }
        assert!(lease_files(&store).is_empty());
    }

    #[test]
    fn exhaustion_reports_and_recovers_after_release() {
        let (_tmp, store) = store();
        let r = Range::new(
            ip("10.10.0.0"),
            24,
            Some(ip("10.10.0.10")),
            Some(ip("10.10.0.12")),
        )
        .unwrap();
        let ips: Vec<_> = (0..3)
            .map(|i| store.allocate(&r, &[], &format!("c{i}"), "eth0").unwrap())
            .collect();
        let err = store.allocate(&r, &[], "c3", "eth0").unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, StoreError::Exhausted { .. }), "{err:?}");
        assert!(msg.contains("no IP addresses available in range"), "{msg}");
        assert!(
            msg.contains("10.10.0.10-10.10.0.12") && msg.contains("net1"),
            "{msg}"
        );
        assert!(msg.contains("leaked") && msg.contains("GC"), "{msg}");
        // A failed allocation leaves nothing behind.
        assert_eq!(lease_files(&store), ips);
        assert!(tmp_files(&store).is_empty());

        assert_eq!(store.release("c1", "eth0", None).unwrap(), [ips[1]]);
        assert_eq!(store.allocate(&r, &[], "c3", "eth0").unwrap(), ips[1]);
    }

    #[test]
    fn exhaustion_on_slash30() {
        let (_tmp, store) = store();
        let r = range("10.11.0.0/30");
        store.allocate(&r, &[], "a", "eth0").unwrap();
        store.allocate(&r, &[], "b", "eth0").unwrap();
        assert!(matches!(
            store.allocate(&r, &[], "c", "eth0"),
            Err(StoreError::Exhausted { .. })
        ));
    }

    // ---- release ----

    #[test]
    fn release_by_hint_and_by_scan() {
        let (_tmp, store) = store();
        let r = range("10.12.0.0/24");
        let a = store.allocate(&r, &[], "a", "eth0").unwrap();
        let b = store.allocate(&r, &[], "b", "eth0").unwrap();
        let c = store.allocate(&r, &[], "c", "eth0").unwrap();

        assert_eq!(store.release("a", "eth0", Some(a)).unwrap(), [a]);
        assert_eq!(lease_files(&store), [b, c]);
        assert_eq!(store.release("b", "eth0", None).unwrap(), [b]);
        assert_eq!(lease_files(&store), [c]);
        // Stale hint to a free IP: falls back to the scan.
        assert_eq!(store.release("c", "eth0", Some(a)).unwrap(), [c]);
        assert!(lease_files(&store).is_empty());
    }

    #[test]
    fn release_with_wrong_owner_hint_keeps_that_lease() {
        let (_tmp, store) = store();
        let r = range("10.13.0.0/24");
        let a = store.allocate(&r, &[], "a", "eth0").unwrap();
        let b = store.allocate(&r, &[], "b", "eth0").unwrap();
        // Hint names b's IP: b must survive, a is found by the scan.
        assert_eq!(store.release("a", "eth0", Some(b)).unwrap(), [a]);
        assert_eq!(lease_files(&store), [b]);
        assert_eq!(read(&store, &b.to_string()), "b\r\neth0");
        // Same container, other interface: not released.
        assert_eq!(store.release("b", "eth1", Some(b)).unwrap(), NONE);
        assert_eq!(lease_files(&store), [b]);
    }

    #[test]
    fn release_unknown_and_repeated_is_ok_and_empty() {
        let (_tmp, store) = store();
        let r = range("10.14.0.0/24");
        assert_eq!(store.release("nobody", "eth0", None).unwrap(), NONE);
        assert_eq!(
            store
                .release("nobody", "eth0", Some(ip("10.14.0.1")))
                .unwrap(),
            NONE
        );
        let a = store.allocate(&r, &[], "a", "eth0").unwrap();
        assert_eq!(store.release("a", "eth0", Some(a)).unwrap(), [a]);
        assert_eq!(store.release("a", "eth0", Some(a)).unwrap(), NONE);
        assert_eq!(store.release("a", "eth0", None).unwrap(), NONE);
    }

    #[test]
    fn release_old_format_matches_any_ifname_and_removes_all_of_owner() {
        let (_tmp, store) = store();
        write(&store, "10.15.0.3", b"old");
        write(&store, "10.15.0.4", b"old\r\neth0");
        write(&store, "10.15.0.5", b"old\r\neth1");
        write(&store, "10.15.0.6", b"older");
        assert_eq!(
            store.release("old", "eth0", None).unwrap(),
            [ip("10.15.0.3"), ip("10.15.0.4")]
        );
        assert_eq!(lease_files(&store), [ip("10.15.0.5"), ip("10.15.0.6")]);
    }

    #[test]
    fn host_local_lease_is_found_and_released() {
        let tmp = tempfile::tempdir().unwrap();
        // Exactly where and how host-local's disk backend writes it.
        let dir = tmp.path().join("mynet");
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("10.244.1.5"), b"abc\r\neth0").unwrap();
        fs::write(dir.join(LAST_RESERVED_FILE), b"10.244.1.5").unwrap();
        let store = LeaseStore::open(tmp.path(), "mynet").unwrap();
        assert_eq!(
            store.leases().unwrap(),
            [Lease {
                ip: ip("10.244.1.5"),
                container_id: "abc".into(),
                ifname: "eth0".into()
            }]
        );
        let r = range("10.244.1.0/24");
        assert_eq!(
            store.allocate(&r, &[], "abc", "eth0").unwrap(),
            ip("10.244.1.5")
        );
        assert_eq!(
            store.allocate(&r, &[], "def", "eth0").unwrap(),
            ip("10.244.1.6")
        );
        assert_eq!(
            store.release("abc", "eth0", None).unwrap(),
            [ip("10.244.1.5")]
        );
        assert!(!dir.join("10.244.1.5").exists());
        assert_eq!(
            fs::read_to_string(dir.join("10.244.1.6")).unwrap(),
            "def\r\neth0"
        );
        assert_eq!(
            fs::read_to_string(dir.join(LAST_RESERVED_FILE)).unwrap(),
            "10.244.1.6"
        );
    }

    // ---- leases / gc ----

    #[test]
    fn leases_parses_formats_and_ignores_other_files() {
        let (_tmp, store) = store();
        write(&store, "10.16.0.9", b"new\r\neth0");
        write(&store, "10.16.0.2", b"  old \n");
        write(&store, "10.16.0.3", b"lf\neth1\n");
        write(&store, "10.16.0.4", b"");
        write(&store, "10.16.0.5", b"\xff\xfe\x00");
        write(&store, "10.16.0.6", b"a\r\nb\r\nc");
        write(&store, "10.16.0.7", &[b'x'; 5000]);
        write(&store, "10.16.0.10", b"dir-sibling\r\neth0");
        fs::create_dir(store.dir().join("10.16.0.8")).unwrap();
        write(&store, LAST_RESERVED_FILE, b"10.16.0.9");
        write(&store, LOCK_FILE, b"");
        write(&store, "README", b"10.16.0.1");
        write(
            &store,
            "010.16.0.1",
            b"leading zero is not host-local's name",
        );

        let garbage = |s: &str| Lease {
            ip: ip(s),
            container_id: String::new(),
            ifname: String::new(),
        };
        let lease = |s: &str, c: &str, i: &str| Lease {
            ip: ip(s),
            container_id: c.into(),
            ifname: i.into(),
        };
        assert_eq!(
            store.leases().unwrap(),
            [
                lease("10.16.0.2", "old", ""),
                lease("10.16.0.3", "lf", "eth1"),
                garbage("10.16.0.4"),
                garbage("10.16.0.5"),
                garbage("10.16.0.6"),
                garbage("10.16.0.7"),
                lease("10.16.0.9", "new", "eth0"),
                lease("10.16.0.10", "dir-sibling", "eth0"),
            ]
        );
    }

    #[test]
    fn gc_releases_everything_not_kept() {
        let (_tmp, store) = store();
        let r = range("10.17.0.0/24");
        let a = store.allocate(&r, &[], "a", "eth0").unwrap();
        let a1 = store.allocate(&r, &[], "a", "eth1").unwrap();
        let b = store.allocate(&r, &[], "b", "eth0").unwrap();
        write(&store, "10.17.0.100", b"old"); // old format, container kept via another ifname
        write(&store, "10.17.0.101", b"gone"); // old format, container gone
        write(&store, "10.17.0.102", b""); // garbage
        write(&store, "10.17.0.103", b"\xff"); // garbage

        // Nothing kept matches an empty owner, even if asked to.
        let kept = keep(&[("a", "eth0"), ("old", "eth0"), ("", "")]);
        let mut released = store.gc(&kept).unwrap();
        released.sort_by_key(|l| l.ip);
        let ips: Vec<_> = released.iter().map(|l| l.ip).collect();
        assert_eq!(
            ips,
            [
                a1,
                b,
                ip("10.17.0.101"),
                ip("10.17.0.102"),
                ip("10.17.0.103")
            ]
        );
        assert_eq!(released[0].container_id, "a");
        assert_eq!(released[0].ifname, "eth1");
        assert_eq!(released[2].container_id, "gone");
        assert_eq!(released[3].container_id, "");
        assert_eq!(lease_files(&store), [a, ip("10.17.0.100")]);

        // Idempotent, and an empty keep set frees the rest.
        assert!(store.gc(&kept).unwrap().is_empty());
        assert_eq!(store.gc(&HashSet::new()).unwrap().len(), 2);
        assert!(lease_files(&store).is_empty());
        assert!(store.dir().join(LAST_RESERVED_FILE).exists());
    }

    // ---- IPv6 and range sets ----

    #[test]
    fn ipv6_leases_use_host_locals_names_and_one_hint_per_set() {
        let (_tmp, store) = store();
        let v4 = range("10.30.0.0/24");
        let v6 = range("fd00:30::/64");
        let a4 = store.allocate_in(&[v4], &[], 0, "a", "eth0").unwrap();
        let a6 = store.allocate_in(&[v6], &[], 1, "a", "eth0").unwrap();
        assert_eq!((a4, a6), (ip("10.30.0.1"), ip("fd00:30::1")));
        // Idempotent per family.
        assert_eq!(store.allocate_in(&[v6], &[], 1, "a", "eth0").unwrap(), a6);
        let b6 = store
            .allocate_in(&[v6], &[ip("fd00:30::2")], 1, "b", "eth0")
            .unwrap();
        assert_eq!(b6, ip("fd00:30::3"));
        assert_eq!(
            names(&store),
            [
                "10.30.0.1",
                "fd00:30::1",
                "fd00:30::3",
                LAST_RESERVED_FILE,
                "last_reserved_ip.1",
                LOCK_FILE
            ]
        );
        assert_eq!(read(&store, "fd00:30::1"), "a\r\neth0");
        assert_eq!(read(&store, "last_reserved_ip.1"), "fd00:30::3");
        assert_eq!(read(&store, LAST_RESERVED_FILE), "10.30.0.1");
        // A DEL with both addresses as hints releases both; one without finds both too.
        assert_eq!(store.release_all("a", "eth0", &[a4, a6]).unwrap(), [a4, a6]);
        let c4 = store.allocate_in(&[v4], &[], 0, "c", "eth0").unwrap();
        let c6 = store.allocate_in(&[v6], &[], 1, "c", "eth0").unwrap();
        assert_eq!(store.release_all("c", "eth0", &[]).unwrap(), [c4, c6]);
        assert_eq!(lease_files(&store), [b6]);
    }

    #[test]
    fn host_local_ipv6_lease_is_found_and_other_spellings_are_not_leases() {
        let (_tmp, store) = store();
        write(&store, "fd00:31::5", b"abc\r\neth0");
        // Not how host-local (Go's net.IP.String) names fd00:31::6.
        write(&store, "fd00:31:0::6", b"xyz\r\neth0");
        assert_eq!(
            store.leases().unwrap(),
            [Lease {
                ip: ip("fd00:31::5"),
                container_id: "abc".into(),
                ifname: "eth0".into()
            }]
        );
        let r = range("fd00:31::/120");
        assert_eq!(
            store.allocate(&r, &[], "abc", "eth0").unwrap(),
            ip("fd00:31::5")
        );
        assert_eq!(
            store.release("abc", "eth0", None).unwrap(),
            [ip("fd00:31::5")]
        );
    }

    #[test]
    fn a_set_of_ranges_is_one_round_robin_sequence() {
        let (_tmp, store) = store();
        let r1 = Range::new(ip("10.32.0.0"), 24, None, Some(ip("10.32.0.2"))).unwrap();
        let r2 = Range::new(ip("10.33.0.0"), 24, None, Some(ip("10.33.0.1"))).unwrap();
        let set = [r1, r2];
        let got: Vec<_> = (0..3)
            .map(|i| {
                store
                    .allocate_in(&set, &[], 0, &format!("c{i}"), "eth0")
                    .unwrap()
            })
            .collect();
        assert_eq!(got, [ip("10.32.0.1"), ip("10.32.0.2"), ip("10.33.0.1")]);
        assert!(matches!(
            store.allocate_in(&set, &[], 0, "c9", "eth0"),
            Err(StoreError::Exhausted { range, .. }) if range == "10.32.0.1-10.32.0.2, 10.33.0.1-10.33.0.1"
        ));
        // Round-robin wraps to the first range.
        store.release("c0", "eth0", None).unwrap();
        assert_eq!(
            store.allocate_in(&set, &[], 0, "c9", "eth0").unwrap(),
            ip("10.32.0.1")
        );
    }

    // ---- crash safety ----
}
