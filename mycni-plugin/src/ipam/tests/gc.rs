//! Reading the store back: the listing (also across several `getdents` calls) and GC.

use std::collections::HashSet;
use std::fs;

use super::*;
use crate::ipam::layout::LOCK_FILE;

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
    let a = alloc(&store, &r, "a", "eth0");
    let a1 = alloc(&store, &r, "a", "eth1");
    let b = alloc(&store, &r, "b", "eth0");
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

#[test]
fn listing_spans_several_getdents_calls() {
    let (_tmp, store) = store();
    // 2000 names take several DIRENT_BUF-sized reads.
    for i in 0..2000 {
        let name = format!("10.25.{}.{}", i / 250, i % 250 + 1);
        write(&store, &name, b"x\r\neth0");
    }
    assert_eq!(store.leases().unwrap().len(), 2000);
    let r = range("10.25.0.0/16");
    assert_eq!(alloc(&store, &r, "y", "eth0"), ip("10.25.0.251"));
    assert_eq!(store.release("x", "eth0", None).unwrap().len(), 2000);
    assert_eq!(lease_files(&store), [ip("10.25.0.251")]);
}
