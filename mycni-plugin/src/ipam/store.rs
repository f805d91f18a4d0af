//! On-disk lease store for the built-in `mycni-ipam` IPAM: its API (open, allocate,
//! release). Listing and GC are in `gc`, the files and their names in `layout`, one locked
//! call on the directory in `lock`.
//!
//! The plugin runs once per pod start, so allocating in-process avoids the fork/exec of a
//! delegated IPAM binary. The layout on disk is the one the reference `host-local` plugin's
//! disk backend uses, and both take the same `flock` on `<dir>/lock`, so they also exclude
//! each other while a node runs a mix of old and new configurations.
//!
//! Lease files come into existence complete, so a killed plugin never leaves a half-written
//! lease: the content is written to an anonymous `O_TMPFILE` inode that `linkat(2)` then
//! names (a temp file hard-linked to the name where that is unavailable). `link` refusing to
//! replace an existing name means a lease is never overwritten even by a writer that ignores
//! the lock.
//!
//! Nothing is fsync'ed, as in host-local: a lease must outlive the plugin (a kill, an OOM,
//! a runtime's timeout), which the page cache gives, not a power loss. After one, every
//! pod's network namespace is gone with the machine and the runtime makes new sandboxes
//! (new ADDs): a lease lost with the page cache belonged to a pod that no longer exists,
//! and one that survives is freed by DEL or GC like any leftover. An fsync per ADD (the
//! lease and its directory) would wait for a journal commit, 0.45 ms median on this
//! project's VM (ext4, idle disk) and more on a busy one, for none of that.
//!
//! This runs on every pod start, where each metadata-changing syscall costs tens of
//! microseconds and replacing a file by rename costs hundreds (ext4 flushes the new data
//! when a rename replaces a file). So each call opens the directory once and reaches its
//! files with `openat`/`linkat`/`unlinkat`, and nothing is created or renamed that an
//! existing file or an in-place write can stand in for.

use std::collections::HashSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use super::layout::network_dir;
use super::lease::validate_owner;
use super::lock::Locked;
use super::range::{all_ones, netmask};
use mycni_common::net::Family;

// Where these lived before the split; `ipam::store::Range` and `ipam::store::StoreError`
// still name them.
pub use super::error::StoreError;
pub use super::lease::Lease;
pub use super::range::{Range, RangeError};

/// `(a + b) mod m` for `a, b < m` (`b <= m` for `b` = 1 with `m` = 1), without the
/// overflow of `a + b` near `u128::MAX` (an IPv6 /0 range).
fn add_mod(a: u128, b: u128, m: u128) -> u128 {
    let room = m - a;
    if b >= room { b - room } else { a + b }
}

/// Where [`LeaseStore::allocate_in`] takes an address from: range set number `set` (its
/// `ranges`, of one family, tried in order), never one of `reserved`. The set's number
/// names its round-robin hint file, as in host-local, so the families of a dual-stack
/// network each resume where they left off.
#[derive(Debug, Clone, Copy)]
pub struct Pool<'a> {
    pub set: usize,
    pub ranges: &'a [Range],
    pub reserved: &'a [IpAddr],
}

/// Leases of one network, kept in `<data_dir>/<network>/` in host-local's format.
#[derive(Debug)]
pub struct LeaseStore {
    dir: PathBuf,
    network: String,
}

impl LeaseStore {
    /// Refuses a name that could escape or alias the data directory (see
    /// `layout::network_dir`), and creates the directory on a node's first call.
    pub fn open(data_dir: &Path, network: &str) -> Result<LeaseStore, StoreError> {
        Ok(LeaseStore {
            dir: network_dir(data_dir, network)?,
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
        let pool = Pool {
            set: 0,
            ranges: std::slice::from_ref(range),
            reserved,
        };
        self.allocate_in(pool, container_id, ifname)
    }

    /// One address from `pool` (see [`Pool`]). Idempotent like [`LeaseStore::allocate`]:
    /// the container's lease in any of the pool's ranges is handed back.
    pub fn allocate_in(
        &self,
        pool: Pool<'_>,
        container_id: &str,
        ifname: &str,
    ) -> Result<IpAddr, StoreError> {
        let Pool {
            set,
            ranges,
            reserved,
        } = pool;
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
        // `Ok(true)`: the file named this owner and is gone now.
        let release = |ip| -> Result<bool, StoreError> {
            Ok(locked
                .read_owner(ip)
                .is_some_and(|o| o.held_by(container_id, ifname))
                && locked.remove_lease(ip)?)
        };
        for &ip in hints {
            if release(ip)? {
                released.push(ip);
            } else {
                all_hinted = false;
            }
        }
        if !all_hinted {
            for entry in locked.scan()? {
                if !entry.is_dir && release(entry.ip)? {
                    released.push(entry.ip);
                }
            }
        }
        released.sort_unstable();
        Ok(released)
    }

    /// See [`Locked::acquire`].
    pub(super) fn lock(&self) -> Result<Locked<'_>, StoreError> {
        Locked::acquire(&self.dir)
    }
}
