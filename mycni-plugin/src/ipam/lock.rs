//! One locked call on the lease store: the directory fd every file is reached through, the
//! `flock` host-local also takes, and the ways a new lease gets its name.

use std::ffi::{CStr, CString};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::dirfd::{for_each_dirent, ip_name, linkat, openat, read_into, retry_eintr, unlinkat};
use super::lease::Owner;
use super::store::{StoreError, create_dir, io_err};

/// host-local names this file `last_reserved_ip.<range set index>`: the index of the range
/// set in `ranges`, which is also ours (one set per family, in the config's order).
const LAST_RESERVED_PREFIX: &str = "last_reserved_ip.";
pub(super) const LOCK_FILE: &str = "lock";
const LOCK_NAME: &CStr = c"lock";
/// Prefix of our temp files. host-local writes none, so under the lock any such file is a
/// leftover from a crashed writer.
pub(super) const TMP_PREFIX: &str = ".tmp-";
/// A real lease is a container ID plus an interface name (~100 bytes); anything far larger
/// is not a lease we can trust, and capping the read bounds the work per file.
const MAX_LEASE_CONTENT: usize = 4096;
/// The longest hint we can parse is an IPv6 address (at most 45 characters) plus some
/// whitespace; a longer file is garbage and only its length matters (it must be truncated
/// when rewritten).
const MAX_HINT_CONTENT: usize = 64;
/// Lease files hold container IDs only, but host-local creates them 0600 and an operator
/// switching back and forth should see uniform permissions.
const FILE_MODE: u32 = 0o600;

/// Distinguishes temp files of threads of one process (the pid alone does not).
static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);
/// Linking an `O_TMPFILE` inode with `AT_EMPTY_PATH` needs CAP_DAC_READ_SEARCH on kernels
/// before 6.10; once that was refused, this process goes straight to `/proc/self/fd`.
static EMPTY_PATH_DENIED: AtomicBool = AtomicBool::new(false);

/// A lease's content before it has a name.
pub(super) enum NewLease<'a> {
    /// An `O_TMPFILE` inode: it has no name until linked, so a killed plugin leaves nothing
    /// behind and there is no temp name to remove afterwards.
    Anonymous(File),
    /// Where the filesystem has no `O_TMPFILE` or its inode cannot be linked.
    Named(TempFile<'a>),
}

/// A named temp file that is unlinked on drop, so no error path leaves one behind; a killed
/// process's leftover is removed by the next locked scan.
pub(super) struct TempFile<'a> {
    dir: BorrowedFd<'a>,
    name: CString,
}

impl Drop for TempFile<'_> {
    fn drop(&mut self) {
        // Best effort: a leftover is removed by the next locked scan anyway.
        let _ = unlinkat(self.dir, &self.name);
    }
}

/// The round-robin hint file of range set `set`.
pub(super) fn last_reserved_name(set: usize) -> CString {
    // Digits never contain NUL.
    CString::new(format!("{LAST_RESERVED_PREFIX}{set}")).unwrap_or_default()
}

/// `last_reserved_ip.<set>` as read under the lock, kept open so that recording the next
/// allocation costs a `pwrite` instead of a second open.
pub(super) struct Hint {
    name: CString,
    file: Option<File>,
    /// Bytes in the file when read (`u64::MAX` if unknown), which tells whether writing a
    /// new value must also truncate.
    len: u64,
    pub(super) ip: Option<IpAddr>,
}

/// One directory entry whose name is an IP address as host-local writes it.
pub(super) struct Entry {
    pub(super) ip: IpAddr,
    /// Directories occupy their IP's name but are not leases we can read or remove.
    pub(super) is_dir: bool,
}

/// The store for the duration of one call: the directory fd that every file is reached
/// through, and the `flock` on `<dir>/lock`, held until drop (closing the file releases it).
pub(super) struct Locked<'s> {
    path: &'s Path,
    dir: OwnedFd,
    _lock: File,
}

impl<'s> Locked<'s> {
    /// Per call rather than per store: flock is per open file description, so opening the
    /// file each time makes threads of one process exclude each other too, and the lock is
    /// never held between calls. The directory fd is per call too, so that a directory
    /// removed and recreated between calls is used rather than the deleted one.
    pub(super) fn acquire(path: &'s Path) -> Result<Locked<'s>, StoreError> {
        let open_dir = || {
            OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECTORY)
                .open(path)
        };
        let dir = match open_dir() {
            // Removed since `open`: recreate it, as `open` would have.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                create_dir(path)?;
                open_dir()
            }
            other => other,
        }
        .map_err(io_err(path))?;
        let dir = OwnedFd::from(dir);
        let lock_err = |e| io_err(&path.join(LOCK_FILE))(e);
        // Without O_CREAT first: the file exists on all but the first call, and a creating
        // open is the slower path in the kernel even when it finds the file.
        let file = match openat(dir.as_fd(), LOCK_NAME, libc::O_RDWR, 0) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => openat(
                dir.as_fd(),
                LOCK_NAME,
                libc::O_RDWR | libc::O_CREAT,
                FILE_MODE,
            ),
            other => other,
        }
        .map_err(lock_err)?;
        retry_eintr(|| {
            // SAFETY: the fd belongs to `file`, which outlives the call; flock has no
            // memory-safety preconditions.
            unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) }
        })
        .map_err(lock_err)?;
        Ok(Locked {
            path,
            dir,
            _lock: file,
        })
    }
}

impl Locked<'_> {
    fn fd(&self) -> BorrowedFd<'_> {
        self.dir.as_fd()
    }

    fn io_err(&self, name: &str) -> impl FnOnce(io::Error) -> StoreError + use<> {
        let path = self.path.join(name);
        move |source| StoreError::Io { path, source }
    }

    /// The single directory pass every locked operation starts from. Removes temp files,
    /// which is only safe because the lock excludes every writer that could own them.
    pub(super) fn scan(&self) -> Result<Vec<Entry>, StoreError> {
        let mut entries = Vec::new();
        let mut stale = Vec::new();
        for_each_dirent(self.fd(), |name, d_type| {
            let Ok(name) = std::str::from_utf8(name) else {
                return;
            };
            // Only the canonical text (Go's and Rust's agree: RFC 5952 for IPv6) names a
            // lease: another spelling of the address is not a file `ip_name` reaches.
            if let Ok(ip) = name.parse::<IpAddr>()
                && ip.to_string() == name
            {
                let is_dir = match d_type {
                    libc::DT_DIR => true,
                    // Some filesystems leave the type out; rare, so the path walk is fine.
                    libc::DT_UNKNOWN => fs::symlink_metadata(self.path.join(name))
                        .is_ok_and(|m| m.file_type().is_dir()),
                    _ => false,
                };
                entries.push(Entry { ip, is_dir });
            } else if name.starts_with(TMP_PREFIX) {
                stale.push(name.to_owned());
            }
        })
        .map_err(io_err(self.path))?;
        for name in stale {
            if let Ok(name) = CString::new(name) {
                // Best effort: a stale temp file costs only disk space.
                let _ = unlinkat(self.fd(), &name);
            }
        }
        Ok(entries)
    }

    /// `None` when the file is gone (nothing to report); other failures become
    /// [`Owner::Garbage`] because one bad file must not block the whole store.
    pub(super) fn read_owner(&self, ip: IpAddr) -> Option<Owner> {
        // O_NONBLOCK: a FIFO under an IP's name must not hang a call that holds the lock.
        let file = match openat(
            self.fd(),
            &ip_name(ip),
            libc::O_RDONLY | libc::O_NONBLOCK,
            0,
        ) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
            Err(_) => return Some(Owner::Garbage),
        };
        let mut buf = [0u8; MAX_LEASE_CONTENT + 1];
        match read_into(&file, &mut buf) {
            Ok(n) if n <= MAX_LEASE_CONTENT => Some(Owner::parse(&buf[..n])),
            _ => Some(Owner::Garbage),
        }
    }

    /// Sorted by IP so listings are stable.
    pub(super) fn read_leases(&self) -> Result<Vec<(IpAddr, Owner)>, StoreError> {
        let mut out: Vec<(IpAddr, Owner)> = self
            .scan()?
            .into_iter()
            .filter(|e| !e.is_dir)
            .filter_map(|e| self.read_owner(e.ip).map(|o| (e.ip, o)))
            .collect();
        out.sort_unstable_by_key(|(ip, _)| *ip);
        Ok(out)
    }

    /// `Ok(false)` if the file was already gone, which keeps release idempotent.
    pub(super) fn remove_lease(&self, ip: IpAddr) -> Result<bool, StoreError> {
        match unlinkat(self.fd(), &ip_name(ip)) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(self.io_err(&ip.to_string())(e)),
        }
    }

    /// No fsync: it cost 1-8 ms per pod start, and it only guards against power loss,
    /// after which every pod the lease could protect is dead too; an empty lease file left
    /// by one is read as garbage and freed by GC.
    fn new_lease(&self, content: &[u8]) -> Result<NewLease<'_>, StoreError> {
        match openat(self.fd(), c".", libc::O_TMPFILE | libc::O_WRONLY, FILE_MODE) {
            Ok(mut file) => {
                file.write_all(content).map_err(io_err(self.path))?;
                Ok(NewLease::Anonymous(file))
            }
            // EOPNOTSUPP: the filesystem has no O_TMPFILE; EISDIR: the kernel predates it
            // (3.11) and took the flag for O_DIRECTORY; EINVAL: either, per open(2).
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)
                ) =>
            {
                Ok(NewLease::Named(self.write_temp(content)?))
            }
            Err(e) => Err(io_err(self.path)(e)),
        }
    }

    fn write_temp(&self, content: &[u8]) -> Result<TempFile<'_>, StoreError> {
        let pid = std::process::id();
        loop {
            let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
            let name = format!("{TMP_PREFIX}{pid}-{n}");
            let cname = CString::new(name.as_str()).unwrap_or_default();
            let mut file = match openat(
                self.fd(),
                &cname,
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
                FILE_MODE,
            ) {
                Ok(f) => f,
                // A crashed process with our pid left this name (and its removal failed):
                // just take the next number.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(self.io_err(&name)(e)),
            };
            let temp = TempFile {
                dir: self.fd(),
                name: cname,
            };
            file.write_all(content).map_err(self.io_err(&name))?;
            return Ok(temp);
        }
    }

    /// Gives the new lease `ip`'s name, creating the file on first use and switching to a
    /// named temp file if the anonymous one cannot be linked. `Ok(false)` if the name is
    /// taken: link(2) never replaces a name, so an existing lease survives even a writer
    /// that skipped the lock.
    pub(super) fn link_lease<'a>(
        &'a self,
        pending: &mut Option<NewLease<'a>>,
        content: &[u8],
        ip: IpAddr,
    ) -> Result<bool, StoreError> {
        let lease = match pending.take() {
            Some(lease) => lease,
            None => self.new_lease(content)?,
        };
        let temp = match lease {
            NewLease::Anonymous(file) => match self.link_anonymous(&file, ip)? {
                Some(linked) => {
                    *pending = Some(NewLease::Anonymous(file));
                    return Ok(linked);
                }
                None => self.write_temp(content)?,
            },
            NewLease::Named(temp) => temp,
        };
        let linked = self.link_named(&temp, ip)?;
        *pending = Some(NewLease::Named(temp));
        Ok(linked)
    }

    /// `Ok(None)` if this process cannot name an anonymous file here at all (no capability
    /// for `AT_EMPTY_PATH` and no `/proc`).
    fn link_anonymous(&self, file: &File, ip: IpAddr) -> Result<Option<bool>, StoreError> {
        let name = ip_name(ip);
        let denied_before = EMPTY_PATH_DENIED.load(Ordering::Relaxed);
        let mut via_proc = denied_before;
        loop {
            let linked = match self.link_anonymous_via(file, &name, via_proc) {
                Ok(()) => true,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
                // Refused AT_EMPTY_PATH reads as ENOENT; /proc needs no capability.
                Err(e) if e.kind() == io::ErrorKind::NotFound && !via_proc => {
                    via_proc = true;
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(self.io_err(&ip.to_string())(e)),
            };
            if via_proc && !denied_before {
                EMPTY_PATH_DENIED.store(true, Ordering::Relaxed);
            }
            return Ok(Some(linked));
        }
    }

    fn link_anonymous_via(&self, file: &File, name: &CStr, via_proc: bool) -> io::Result<()> {
        if via_proc {
            let proc_path =
                CString::new(format!("/proc/self/fd/{}", file.as_raw_fd())).unwrap_or_default();
            linkat(
                libc::AT_FDCWD,
                &proc_path,
                self.fd(),
                name,
                libc::AT_SYMLINK_FOLLOW,
            )
        } else {
            linkat(file.as_raw_fd(), c"", self.fd(), name, libc::AT_EMPTY_PATH)
        }
    }

    fn link_named(&self, temp: &TempFile<'_>, ip: IpAddr) -> Result<bool, StoreError> {
        match linkat(
            self.fd().as_raw_fd(),
            &temp.name,
            self.fd(),
            &ip_name(ip),
            0,
        ) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(self.io_err(&ip.to_string())(e)),
        }
    }

    /// Missing or unparsable means "start from the beginning of the range", as in
    /// host-local. Opened read-write so that [`Locked::write_hint`] can reuse it.
    pub(super) fn read_hint(&self, set: usize) -> Hint {
        let name = last_reserved_name(set);
        let none = Hint {
            name: name.clone(),
            file: None,
            len: u64::MAX,
            ip: None,
        };
        let (file, writable) = match openat(self.fd(), &name, libc::O_RDWR, 0) {
            Ok(file) => (file, true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return none,
            // Not writable for us (say, made read-only by hand): still worth following.
            Err(_) => match openat(self.fd(), &name, libc::O_RDONLY, 0) {
                Ok(file) => (file, false),
                Err(_) => return none,
            },
        };
        let mut buf = [0u8; MAX_HINT_CONTENT + 1];
        let Ok(len) = read_into(&file, &mut buf) else {
            return none;
        };
        let file = writable.then_some(file);
        if len > MAX_HINT_CONTENT {
            return Hint { file, ..none };
        }
        Hint {
            name,
            file,
            len: len as u64,
            ip: std::str::from_utf8(&buf[..len])
                .ok()
                .and_then(|s| s.trim().parse().ok()),
        }
    }

    /// Written in place: when a rename replaces a file, or O_TRUNC empties one, ext4 starts
    /// writeback of the data right away (auto_da_alloc), which cost ~0.2 ms and at times
    /// several ms per allocation. A value torn by a kill reads back as garbage or as some
    /// other IP, both harmless for a round-robin hint, and errors are ignored: failing here
    /// would strand a lease the caller never learns about.
    pub(super) fn write_hint(&self, hint: Hint, ip: IpAddr) {
        let text = ip.to_string();
        let (file, old_len) = match hint.file {
            Some(file) => (file, hint.len),
            None => match openat(
                self.fd(),
                &hint.name,
                libc::O_WRONLY | libc::O_CREAT,
                FILE_MODE,
            ) {
                Ok(file) => (file, u64::MAX),
                Err(_) => return,
            },
        };
        let new_len = text.len() as u64;
        // Cut the old tail rather than pad it with whitespace: host-local parses the file
        // without trimming. Only a shorter IP needs the cut, so usually this is one pwrite.
        if file.write_all_at(text.as_bytes(), 0).is_ok() && old_len > new_len {
            let _ = file.set_len(new_len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipam::store::{Lease, LeaseStore};
    use crate::ipam::testutil::*;
    use std::collections::HashSet;
    use std::fs;
    use std::sync::mpsc;
    use std::sync::{Arc, Barrier};
    use std::thread;
    use std::time::Duration;

    #[test]
    fn stale_temp_files_are_removed_and_lease_content_is_exact() {
        let (_tmp, store) = store();
        write(&store, ".tmp-123-0", b"half");
        write(&store, ".tmp-999999-42", b"");
        let r = range("10.18.0.0/24");
        let a = store.allocate(&r, &[], "0123456789abcdef", "eth0").unwrap();
        assert!(tmp_files(&store).is_empty(), "{:?}", tmp_files(&store));
        assert_eq!(
            fs::read(store.dir().join(a.to_string())).unwrap(),
            b"0123456789abcdef\r\neth0"
        );
        // The lease is its own inode again once the temp name is gone.
        let meta = fs::metadata(store.dir().join(a.to_string())).unwrap();
        assert_eq!(std::os::unix::fs::MetadataExt::nlink(&meta), 1);
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
            FILE_MODE
        );
    }

    #[test]
    fn existing_lease_is_never_overwritten() {
        let (_tmp, store) = store();
        // The scan sees this one and skips it...
        write(&store, "10.19.0.1", b"other\r\neth0");
        let r = range("10.19.0.0/24");
        assert_eq!(
            store.allocate(&r, &[], "me", "eth0").unwrap(),
            ip("10.19.0.2")
        );
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
            assert_eq!(std::os::unix::fs::MetadataExt::nlink(&meta), 1, "{lease}");
            assert_eq!(
                std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
                FILE_MODE,
                "{lease}"
            );
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
                "allocate" => assert_eq!(
                    store.allocate(&r, &[], "a", "eth0").unwrap(),
                    ip("10.22.0.1")
                ),
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
        assert_eq!(
            store.allocate(&r, &[], "a", "eth0").unwrap(),
            ip("10.23.0.1")
        );
        assert!(lock.is_file());
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&fs::metadata(&lock).unwrap().permissions())
                & 0o777,
            FILE_MODE
        );
        fs::remove_file(&lock).unwrap();
        assert_eq!(
            store.allocate(&r, &[], "b", "eth0").unwrap(),
            ip("10.23.0.2")
        );
        assert!(lock.is_file());
        // The whole tree removed after `open`, say by an operator cleaning up.
        fs::remove_dir_all(tmp.path().join("a")).unwrap();
        assert_eq!(store.release("a", "eth0", None).unwrap(), NONE);
        assert!(store.dir().is_dir() && lock.is_file());
        assert_eq!(
            store.allocate(&r, &[], "c", "eth0").unwrap(),
            ip("10.23.0.1")
        );
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
            let inode =
                old.map(|_| std::os::unix::fs::MetadataExt::ino(&fs::metadata(&path).unwrap()));
            assert_eq!(
                store.allocate(&r, &[], "a", "eth0").unwrap(),
                ip(want),
                "{old:?}"
            );
            assert_eq!(read(&store, LAST_RESERVED_FILE), want, "{old:?}");
            let meta = fs::metadata(&path).unwrap();
            if let Some(inode) = inode {
                assert_eq!(std::os::unix::fs::MetadataExt::ino(&meta), inode, "{old:?}");
            } else {
                assert_eq!(
                    std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
                    FILE_MODE
                );
            }
        }
    }

    #[test]
    fn unusable_last_reserved_does_not_fail_allocation() {
        let (_tmp, store) = store();
        fs::create_dir(store.dir().join(LAST_RESERVED_FILE)).unwrap();
        let r = range("10.28.0.0/24");
        assert_eq!(
            store.allocate(&r, &[], "a", "eth0").unwrap(),
            ip("10.28.0.1")
        );
        assert_eq!(
            store.allocate(&r, &[], "b", "eth0").unwrap(),
            ip("10.28.0.2")
        );
        assert!(store.dir().join(LAST_RESERVED_FILE).is_dir());
    }

    #[test]
    fn fifo_under_an_ip_name_does_not_hang_the_store() {
        let (_tmp, store) = store();
        let path = store.dir().join("10.26.0.1");
        let cpath = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `cpath` is NUL-terminated and outlives the call.
        assert_eq!(unsafe { libc::mkfifo(cpath.as_ptr(), 0o600) }, 0);
        let garbage = Lease {
            ip: ip("10.26.0.1"),
            container_id: String::new(),
            ifname: String::new(),
        };
        assert_eq!(store.leases().unwrap(), std::slice::from_ref(&garbage));
        let r = range("10.26.0.0/24");
        assert_eq!(
            store.allocate(&r, &[], "a", "eth0").unwrap(),
            ip("10.26.0.2")
        );
        assert_eq!(store.gc(&keep(&[("a", "eth0")])).unwrap(), [garbage]);
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
                tx.send(store.allocate(&r, &[], "a", "eth0").unwrap())
                    .unwrap();
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
            assert!(
                t.parse::<usize>().unwrap() < THREADS && i.parse::<usize>().unwrap() < PER_THREAD
            );
            assert_eq!(l.ifname, "eth0");
        }

        let released: HashSet<_> = run(true).into_iter().collect();
        assert_eq!(released, distinct);
        assert!(lease_files(&store).is_empty());
        assert!(tmp_files(&store).is_empty());
    }
}
