//! The store's API: open, allocate (round-robin, idempotent, exhaustion), release, and
//! range sets of either family.

use std::collections::HashSet;
use std::fs;
use std::net::IpAddr;

use super::*;
use crate::ipam::layout::LOCK_FILE;
use crate::ipam::store::{LeaseStore, Pool, Range, StoreError};

/// Whether an allocation failed for want of a free address.
fn exhausted(got: Result<IpAddr, StoreError>) -> bool {
    matches!(got, Err(StoreError::Exhausted { .. }))
}

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
    assert!(exhausted(store.allocate(&r, &reserved, "c9", "eth0")));
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
    assert!(exhausted(store.allocate(&r, &[gw], "last", "eth0")));
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
    let a = alloc(&store, &r, "a", "eth0");
    let b = alloc(&store, &r, "b", "eth0");
    assert_eq!((a, b), (ip("10.3.0.1"), ip("10.3.0.2")));
    assert!(exhausted(store.allocate(&r, &[], "c", "eth0")));
    let backwards = Range {
        start: ip("10.3.0.2"),
        end: ip("10.3.0.1"),
        ..r
    };
    assert_eq!(backwards.size(), 0);
    assert!(exhausted(store.allocate(&backwards, &[], "d", "eth0")));
}

#[test]
fn round_robin_resumes_after_last_reserved_and_wraps() {
    let (_tmp, store) = store();
    let r = range("10.4.0.0/29"); // .1-.6
    write(&store, LAST_RESERVED_FILE, b"10.4.0.4");
    assert_eq!(alloc(&store, &r, "a", "eth0"), ip("10.4.0.5"));
    assert_eq!(read(&store, LAST_RESERVED_FILE), "10.4.0.5");
    assert_eq!(alloc(&store, &r, "b", "eth0"), ip("10.4.0.6"));
    assert_eq!(alloc(&store, &r, "c", "eth0"), ip("10.4.0.1"));
    assert_eq!(read(&store, LAST_RESERVED_FILE), "10.4.0.1");
    assert_eq!(alloc(&store, &r, "d", "eth0"), ip("10.4.0.2"));
}

#[test]
fn round_robin_wraps_at_end_of_range() {
    let r = range("10.4.0.0/29"); // .1-.6
    // Last allocation at the end of the range: wrap even though the end is free.
    let (_tmp1, s1) = store();
    write(&s1, LAST_RESERVED_FILE, b"10.4.0.6");
    assert_eq!(alloc(&s1, &r, "a", "eth0"), ip("10.4.0.1"));
    // The search itself wraps past taken addresses at the end of the range.
    let (_tmp2, s2) = store();
    write(&s2, LAST_RESERVED_FILE, b"10.4.0.4");
    write(&s2, "10.4.0.5", b"x\r\neth0");
    write(&s2, "10.4.0.6", b"y\r\neth0");
    assert_eq!(alloc(&s2, &r, "a", "eth0"), ip("10.4.0.1"));
}

#[test]
fn round_robin_starts_at_range_start_without_usable_last_reserved() {
    let r = range("10.5.0.0/24");
    for content in [&b"10.9.9.9"[..], b"garbage", b"", b"\xff\xfe"] {
        let (_tmp, store) = store();
        write(&store, LAST_RESERVED_FILE, content);
        assert_eq!(
            alloc(&store, &r, "a", "eth0"),
            ip("10.5.0.1"),
            "{content:?}"
        );
    }
    // host-local may leave a trailing newline when edited by hand.
    let (_tmp, store) = store();
    write(&store, LAST_RESERVED_FILE, b"10.5.0.7\n");
    assert_eq!(alloc(&store, &r, "a", "eth0"), ip("10.5.0.8"));
}

#[test]
fn released_ip_is_not_immediately_reused() {
    let (_tmp, store) = store();
    let r = range("10.6.0.0/24");
    let a = alloc(&store, &r, "a", "eth0");
    let b = alloc(&store, &r, "b", "eth0");
    assert_eq!(store.release("a", "eth0", Some(a)).unwrap(), [a]);
    let c = alloc(&store, &r, "c", "eth0");
    assert_eq!((a, b, c), (ip("10.6.0.1"), ip("10.6.0.2"), ip("10.6.0.3")));
}

#[test]
fn allocate_is_idempotent_per_container_and_ifname() {
    let (_tmp, store) = store();
    let r = range("10.7.0.0/24");
    let a = alloc(&store, &r, "c1", "eth0");
    assert_eq!(alloc(&store, &r, "c1", "eth0"), a);
    let b = alloc(&store, &r, "c1", "eth1");
    assert_ne!(a, b);
    assert_eq!(alloc(&store, &r, "c1", "eth1"), b);
    assert_eq!(lease_files(&store), [a, b]);
    assert_eq!(read(&store, &a.to_string()), "c1\r\neth0");
    assert_eq!(read(&store, &b.to_string()), "c1\r\neth1");
    // Found even when it is not where round-robin would look next.
    let c = alloc(&store, &r, "c2", "eth0");
    assert_eq!(alloc(&store, &r, "c1", "eth0"), a);
    assert_eq!(lease_files(&store), [a, b, c]);
}

#[test]
fn allocate_ignores_own_lease_outside_range_and_old_format_lease() {
    let (_tmp, store) = store();
    let r = sub_range("10.8.0.0/24", "10.8.0.10", "10.8.0.20");
    write(&store, "10.8.0.5", b"c1\r\neth0"); // same owner, outside start..=end
    write(&store, "10.8.0.10", b"c1"); // old format: interface unknown
    let a = alloc(&store, &r, "c1", "eth0");
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
    let r = sub_range("10.10.0.0/24", "10.10.0.10", "10.10.0.12");
    let ips: Vec<_> = (0..3)
        .map(|i| alloc(&store, &r, &format!("c{i}"), "eth0"))
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
    assert_eq!(alloc(&store, &r, "c3", "eth0"), ips[1]);
}

#[test]
fn exhaustion_on_slash30() {
    let (_tmp, store) = store();
    let r = range("10.11.0.0/30");
    alloc(&store, &r, "a", "eth0");
    alloc(&store, &r, "b", "eth0");
    assert!(exhausted(store.allocate(&r, &[], "c", "eth0")));
}

// ---- release ----

#[test]
fn release_by_hint_and_by_scan() {
    let (_tmp, store) = store();
    let r = range("10.12.0.0/24");
    let a = alloc(&store, &r, "a", "eth0");
    let b = alloc(&store, &r, "b", "eth0");
    let c = alloc(&store, &r, "c", "eth0");

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
    let a = alloc(&store, &r, "a", "eth0");
    let b = alloc(&store, &r, "b", "eth0");
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
    let a = alloc(&store, &r, "a", "eth0");
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
        [lease("10.244.1.5", "abc", "eth0")]
    );
    let r = range("10.244.1.0/24");
    assert_eq!(alloc(&store, &r, "abc", "eth0"), ip("10.244.1.5"));
    assert_eq!(alloc(&store, &r, "def", "eth0"), ip("10.244.1.6"));
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

// ---- IPv6 and range sets ----

fn pool<'a>(set: usize, ranges: &'a [Range], reserved: &'a [IpAddr]) -> Pool<'a> {
    Pool {
        set,
        ranges,
        reserved,
    }
}

#[test]
fn ipv6_leases_use_host_locals_names_and_one_hint_per_set() {
    let (_tmp, store) = store();
    let v4 = range("10.30.0.0/24");
    let v6 = range("fd00:30::/64");
    let a4 = store.allocate_in(pool(0, &[v4], &[]), "a", "eth0").unwrap();
    let a6 = store.allocate_in(pool(1, &[v6], &[]), "a", "eth0").unwrap();
    assert_eq!((a4, a6), (ip("10.30.0.1"), ip("fd00:30::1")));
    // Idempotent per family.
    assert_eq!(
        store.allocate_in(pool(1, &[v6], &[]), "a", "eth0").unwrap(),
        a6
    );
    let b6 = store
        .allocate_in(pool(1, &[v6], &[ip("fd00:30::2")]), "b", "eth0")
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
    let c4 = store.allocate_in(pool(0, &[v4], &[]), "c", "eth0").unwrap();
    let c6 = store.allocate_in(pool(1, &[v6], &[]), "c", "eth0").unwrap();
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
        [lease("fd00:31::5", "abc", "eth0")]
    );
    let r = range("fd00:31::/120");
    assert_eq!(alloc(&store, &r, "abc", "eth0"), ip("fd00:31::5"));
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
                .allocate_in(pool(0, &set, &[]), &format!("c{i}"), "eth0")
                .unwrap()
        })
        .collect();
    assert_eq!(got, [ip("10.32.0.1"), ip("10.32.0.2"), ip("10.33.0.1")]);
    assert!(matches!(
        store.allocate_in(pool(0, &set, &[]), "c9", "eth0"),
        Err(StoreError::Exhausted { range, .. }) if range == "10.32.0.1-10.32.0.2, 10.33.0.1-10.33.0.1"
    ));
    // Round-robin wraps to the first range.
    store.release("c0", "eth0", None).unwrap();
    assert_eq!(
        store.allocate_in(pool(0, &set, &[]), "c9", "eth0").unwrap(),
        ip("10.32.0.1")
    );
}
