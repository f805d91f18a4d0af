//! One locked call: stale temp files, linking a new lease every way it can be named, the
//! hint file written in place, odd files under the lock, and the lock itself.

use std::collections::HashSet;
use std::ffi::CString;
use std::fs::{self, OpenOptions};
use std::io;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use super::*;
use crate::ipam::dirfd::ip_name;
use crate::ipam::layout::{FILE_MODE, LOCK_FILE, LOCK_NAME, last_reserved_name};
use crate::ipam::lock::{EMPTY_PATH_DENIED, NewLease};
use crate::ipam::store::LeaseStore;

#[test]
fn stale_temp_files_are_removed_and_lease_content_is_exact() {
    let (_tmp, store) = store();
    write(&store, ".tmp-123-0", b"half");
    write(&store, ".tmp-999999-42", b"");
    let r = range("10.18.0.0/24");
    let a = alloc(&store, &r, "0123456789abcdef", "eth0");
    assert!(tmp_files(&store).is_empty(), "{:?}", tmp_files(&store));
    assert_eq!(
        fs::read(store.dir().join(a.to_string())).unwrap(),
        b"0123456789abcdef\r\neth0"
    );
    // The lease is its own inode again once the temp name is gone.
    let meta = fs::metadata(store.dir().join(a.to_string())).unwrap();
    assert_eq!(meta.nlink(), 1);
    assert_eq!(mode(&meta), FILE_MODE);
}

#[test]
fn existing_lease_is_never_overwritten() {
    let (_tmp, store) = store();
    // The scan sees this one and skips it...
    write(&store, "10.19.0.1", b"other\r\neth0");
    let r = range("10.19.0.0/24");
    assert_eq!(alloc(&store, &r, "me", "eth0"), ip("10.19.0.2"));
    assert_eq!(read(&store, "10.19.0.1"), "other\r\neth0");
    // ...and one created behind the scan's back is refused by link(2), however the new
    // lease's file was made.
    write(&store, "10.19.0.3", b"sneaky\r\neth0");
    let taken = ip("10.19.0.3");
    let content = b"me\r\neth1";
    let locked = store.lock().unwrap();
    let mut linked = Vec::new();
    // AT_EMPTY_PATH, then /proc/self/fd (what a process without the capability uses).
    for (via_proc, free) in [(false, ip("10.19.0.4")), (true, ip("10.19.0.5"))] {
        let NewLease::Anonymous(file) = locked.new_lease(content).unwrap() else {
            eprintln!("no O_TMPFILE on this filesystem; only the fallback is tested");
            break;
        };
        let err = locked
            .link_anonymous_via(&file, &ip_name(taken), via_proc)
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists, "{err}");
        assert_eq!(read(&store, "10.19.0.3"), "sneaky\r\neth0");
        locked
            .link_anonymous_via(&file, &ip_name(free), via_proc)
            .unwrap();
        linked.push(free);
    }
    // The named temp file used where O_TMPFILE is unavailable.
    let temp = locked.write_temp(content).unwrap();
    assert!(!locked.link_named(&temp, taken).unwrap());
    assert!(locked.link_named(&temp, ip("10.19.0.6")).unwrap());
    drop(temp);
    linked.push(ip("10.19.0.6"));
    // And the combination allocate uses.
    let mut pending = None;
    assert!(!locked.link_lease(&mut pending, content, taken).unwrap());
    assert!(
        locked
            .link_lease(&mut pending, content, ip("10.19.0.7"))
            .unwrap()
    );
    drop(pending);
    linked.push(ip("10.19.0.7"));
    drop(locked);

    assert_eq!(read(&store, "10.19.0.3"), "sneaky\r\neth0");
    for lease in linked {
        let path = store.dir().join(lease.to_string());
        assert_eq!(fs::read(&path).unwrap(), content, "{lease}");
        let meta = fs::metadata(&path).unwrap();
        assert_eq!(meta.nlink(), 1, "{lease}");
        assert_eq!(mode(&meta), FILE_MODE, "{lease}");
    }
    assert!(tmp_files(&store).is_empty());
}

#[test]
fn allocate_links_through_proc_once_empty_path_was_refused() {
    let (_tmp, store) = store();
    let r = range("10.27.0.0/24");
    // As after a refused AT_EMPTY_PATH; other tests may run meanwhile, and both ways
    // of linking are correct for them.
    EMPTY_PATH_DENIED.store(true, Ordering::Relaxed);
    let got = store.allocate(&r, &[], "a", "eth0");
    EMPTY_PATH_DENIED.store(false, Ordering::Relaxed);
    assert_eq!(got.unwrap(), ip("10.27.0.1"));
    assert_eq!(read(&store, "10.27.0.1"), "a\r\neth0");
    assert_eq!(names(&store), ["10.27.0.1", LAST_RESERVED_FILE, LOCK_FILE]);
}

#[test]
fn unlinked_new_lease_leaves_nothing_behind() {
    // What a SIGKILL between creating the lease's file and naming it leaves behind.
    let (_tmp, store) = store();
    let locked = store.lock().unwrap();
    let before = names(&store);
    let lease = locked.new_lease(b"c\r\neth0").unwrap();
    if matches!(lease, NewLease::Anonymous(_)) {
        assert_eq!(names(&store), before);
    }
    drop(lease);
    drop(locked);
    assert_eq!(names(&store), before);
}

#[test]
fn temp_left_by_killed_fallback_writer_is_removed_by_next_call() {
    let (_tmp, store) = store();
    let r = range("10.22.0.0/24");
    for call in ["allocate", "release", "leases"] {
        let locked = store.lock().unwrap();
        // A SIGKILL runs no destructors.
        std::mem::forget(locked.write_temp(b"half").unwrap());
        drop(locked);
        assert_eq!(tmp_files(&store).len(), 1, "{call}");
        match call {
            "allocate" => assert_eq!(alloc(&store, &r, "a", "eth0"), ip("10.22.0.1")),
            "release" => assert_eq!(store.release("x", "eth0", None).unwrap(), NONE),
            _ => assert_eq!(store.leases().unwrap().len(), 1),
        }
        assert!(tmp_files(&store).is_empty(), "{call}");
    }
}

#[test]
fn missing_lock_file_and_directory_are_recreated() {
    let tmp = tempfile::tempdir().unwrap();
    let store = LeaseStore::open(&tmp.path().join("a/b"), "net1").unwrap();
    let lock = store.dir().join(LOCK_FILE);
    assert!(!lock.exists());
    let r = range("10.23.0.0/24");
    assert_eq!(alloc(&store, &r, "a", "eth0"), ip("10.23.0.1"));
    assert!(lock.is_file());
    assert_eq!(mode(&fs::metadata(&lock).unwrap()), FILE_MODE);
    fs::remove_file(&lock).unwrap();
    assert_eq!(alloc(&store, &r, "b", "eth0"), ip("10.23.0.2"));
    assert!(lock.is_file());
    // The whole tree removed after `open`, say by an operator cleaning up.
    fs::remove_dir_all(tmp.path().join("a")).unwrap();
    assert_eq!(store.release("a", "eth0", None).unwrap(), NONE);
    assert!(store.dir().is_dir() && lock.is_file());
    assert_eq!(alloc(&store, &r, "c", "eth0"), ip("10.23.0.1"));
}

#[test]
fn last_reserved_is_rewritten_in_place_to_exactly_the_new_ip() {
    let r = range("10.24.0.0/16");
    let oversized = "9".repeat(10_000);
    for (old, want) in [
        (None, "10.24.0.1"),
        (Some("10.24.0.8"), "10.24.0.9"),
        (Some("10.24.0.9"), "10.24.0.10"),
        (Some("10.24.0.99\n"), "10.24.0.100"),
        (Some("10.24.1.255"), "10.24.2.0"),
        // Torn by a kill between overwriting "10.24.0.100" and truncating.
        (Some("10.24.0.990"), "10.24.0.1"),
        (Some("garbage longer than any IP address"), "10.24.0.1"),
        (Some(oversized.as_str()), "10.24.0.1"),
    ] {
        let (_tmp, store) = store();
        let path = store.dir().join(LAST_RESERVED_FILE);
        if let Some(old) = old {
            write(&store, LAST_RESERVED_FILE, old.as_bytes());
        }
        let inode = old.map(|_| fs::metadata(&path).unwrap().ino());
        assert_eq!(alloc(&store, &r, "a", "eth0"), ip(want), "{old:?}");
        assert_eq!(read(&store, LAST_RESERVED_FILE), want, "{old:?}");
        let meta = fs::metadata(&path).unwrap();
        if let Some(inode) = inode {
            assert_eq!(meta.ino(), inode, "{old:?}");
        } else {
            assert_eq!(mode(&meta), FILE_MODE);
        }
    }
}

#[test]
fn unusable_last_reserved_does_not_fail_allocation() {
    let (_tmp, store) = store();
    fs::create_dir(store.dir().join(LAST_RESERVED_FILE)).unwrap();
    let r = range("10.28.0.0/24");
    assert_eq!(alloc(&store, &r, "a", "eth0"), ip("10.28.0.1"));
    assert_eq!(alloc(&store, &r, "b", "eth0"), ip("10.28.0.2"));
    assert!(store.dir().join(LAST_RESERVED_FILE).is_dir());
}

#[test]
fn fifo_under_an_ip_name_does_not_hang_the_store() {
    let (_tmp, store) = store();
    let path = store.dir().join("10.26.0.1");
    let cpath = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `cpath` is NUL-terminated and outlives the call.
    assert_eq!(unsafe { libc::mkfifo(cpath.as_ptr(), 0o600) }, 0);
    let fifo = garbage("10.26.0.1");
    assert_eq!(store.leases().unwrap(), std::slice::from_ref(&fifo));
    let r = range("10.26.0.0/24");
    assert_eq!(alloc(&store, &r, "a", "eth0"), ip("10.26.0.2"));
    assert_eq!(store.gc(&keep(&[("a", "eth0")])).unwrap(), [fifo]);
    assert!(!path.exists());
}

#[test]
fn c_names_match_the_layout() {
    assert_eq!(last_reserved_name(0).to_str().unwrap(), LAST_RESERVED_FILE);
    assert_eq!(
        last_reserved_name(1).to_str().unwrap(),
        "last_reserved_ip.1"
    );
    assert_eq!(LOCK_NAME.to_str().unwrap(), LOCK_FILE);
}

// ---- locking and concurrency ----

#[test]
fn allocate_waits_for_lock_held_like_host_local() {
    let (_tmp, store) = store();
    // host-local: open <dir>/lock, flock(LOCK_EX).
    let held = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(store.dir().join("lock"))
        .unwrap();
    assert_eq!(unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX) }, 0);

    let store = Arc::new(store);
    let (tx, rx) = mpsc::channel();
    let worker = {
        let store = Arc::clone(&store);
        thread::spawn(move || {
            let r = range("10.20.0.0/24");
            tx.send(alloc(&store, &r, "a", "eth0")).unwrap();
        })
    };
    thread::sleep(Duration::from_millis(300));
    assert!(
        rx.try_recv().is_err(),
        "allocate completed while the lock was held"
    );
    assert!(lease_files(&store).is_empty());
    drop(held);
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(10)).unwrap(),
        ip("10.20.0.1")
    );
    worker.join().unwrap();
}

#[test]
fn concurrent_allocations_are_distinct_and_all_release() {
    const THREADS: usize = 16;
    const PER_THREAD: usize = 10;
    let tmp = tempfile::tempdir().unwrap();
    let data: Arc<Path> = tmp.path().into();
    let barrier = Arc::new(Barrier::new(THREADS));
    let r = range("10.21.0.0/24");
    let gw = ip("10.21.0.1");

    let run = |release: bool| -> Vec<IpAddr> {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (data, barrier) = (Arc::clone(&data), Arc::clone(&barrier));
                thread::spawn(move || {
                    // Each thread opens its own store, like separate plugin processes.
                    let store = LeaseStore::open(&data, "net1").unwrap();
                    barrier.wait();
                    let mut out = Vec::new();
                    for i in 0..PER_THREAD {
                        let cid = format!("c{t}-{i}");
                        if release {
                            let hint = (i % 2 == 0).then(|| ip("10.21.0.2"));
                            out.extend(store.release(&cid, "eth0", hint).unwrap());
                        } else {
                            out.push(store.allocate(&r, &[gw], &cid, "eth0").unwrap());
                        }
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    };

    let allocated = run(false);
    let distinct: HashSet<_> = allocated.iter().copied().collect();
    assert_eq!(allocated.len(), THREADS * PER_THREAD);
    assert_eq!(distinct.len(), THREADS * PER_THREAD);
    assert!(!distinct.contains(&gw));
    let store = LeaseStore::open(&data, "net1").unwrap();
    assert_eq!(lease_files(&store).len(), THREADS * PER_THREAD);
    assert!(tmp_files(&store).is_empty());
    for l in store.leases().unwrap() {
        let (t, i) = l.container_id[1..].split_once('-').unwrap();
        assert!(t.parse::<usize>().unwrap() < THREADS && i.parse::<usize>().unwrap() < PER_THREAD);
        assert_eq!(l.ifname, "eth0");
    }

    let released: HashSet<_> = run(true).into_iter().collect();
    assert_eq!(released, distinct);
    assert!(lease_files(&store).is_empty());
    assert!(tmp_files(&store).is_empty());
}
