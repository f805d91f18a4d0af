//! The IPAM's tests, one file per module under test, and the helpers they share. Apart
//! from the modules so that no module's tests import the store that imports it.

mod builtin;
mod gc;
mod lock;
mod range;
mod store;

use std::collections::HashSet;
use std::fs;
use std::net::IpAddr;

use tempfile::TempDir;

use super::layout::TMP_PREFIX;
use super::range::Range;
use super::store::{Lease, LeaseStore};

pub(super) const NONE: [IpAddr; 0] = [];
pub(super) const LAST_RESERVED_FILE: &str = "last_reserved_ip.0";

pub(super) fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub(super) fn range(cidr: &str) -> Range {
    let (net, prefix) = Range::parse_cidr(cidr).unwrap();
    Range::new(net, prefix, None, None).unwrap()
}

/// `start..=end` of `cidr`.
pub(super) fn sub_range(cidr: &str, start: &str, end: &str) -> Range {
    let (net, prefix) = Range::parse_cidr(cidr).unwrap();
    Range::new(net, prefix, Some(ip(start)), Some(ip(end))).unwrap()
}

pub(super) fn store() -> (TempDir, LeaseStore) {
    let tmp = tempfile::tempdir().unwrap();
    let store = LeaseStore::open(tmp.path(), "net1").unwrap();
    (tmp, store)
}

/// Names in the store directory that parse as IPs, sorted.
pub(super) fn lease_files(store: &LeaseStore) -> Vec<IpAddr> {
    let mut v: Vec<IpAddr> = fs::read_dir(store.dir())
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().to_str()?.parse().ok())
        .collect();
    v.sort();
    v
}

/// Every name in the store directory, sorted.
pub(super) fn names(store: &LeaseStore) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(store.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

pub(super) fn tmp_files(store: &LeaseStore) -> Vec<String> {
    fs::read_dir(store.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(TMP_PREFIX))
        .collect()
}

pub(super) fn write(store: &LeaseStore, name: &str, content: &[u8]) {
    fs::write(store.dir().join(name), content).unwrap();
}

pub(super) fn read(store: &LeaseStore, name: &str) -> String {
    fs::read_to_string(store.dir().join(name)).unwrap()
}

pub(super) fn keep(pairs: &[(&str, &str)]) -> HashSet<(String, String)> {
    pairs
        .iter()
        .map(|(c, i)| (c.to_string(), i.to_string()))
        .collect()
}

/// One address for `cid`'s `ifname`, nothing reserved.
pub(super) fn alloc(store: &LeaseStore, r: &Range, cid: &str, ifname: &str) -> IpAddr {
    store.allocate(r, &[], cid, ifname).unwrap()
}

pub(super) fn lease(ip_text: &str, container_id: &str, ifname: &str) -> Lease {
    Lease {
        ip: ip(ip_text),
        container_id: container_id.into(),
        ifname: ifname.into(),
    }
}

/// A lease file whose content names no container.
pub(super) fn garbage(ip_text: &str) -> Lease {
    lease(ip_text, "", "")
}

/// The permission bits of a file.
pub(super) fn mode(meta: &fs::Metadata) -> u32 {
    std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777
}
