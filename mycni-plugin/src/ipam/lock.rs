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
use super::error::{StoreError, io_err};
use super::layout::{FILE_MODE, LOCK_FILE, LOCK_NAME, TMP_PREFIX, create_dir, last_reserved_name};
use super::lease::Owner;

/// A real lease is a container ID plus an interface name (~100 bytes); anything far larger
/// is not a lease we can trust, and capping the read bounds the work per file.
const MAX_LEASE_CONTENT: usize = 4096;
/// The longest hint we can parse is an IPv6 address (at most 45 characters) plus some
/// whitespace; a longer file is garbage and only its length matters (it must be truncated
/// when rewritten).
const MAX_HINT_CONTENT: usize = 64;
/// Distinguishes temp files of threads of one process (the pid alone does not).
static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);
/// Linking an `O_TMPFILE` inode with `AT_EMPTY_PATH` needs CAP_DAC_READ_SEARCH on kernels
/// before 6.10; once that was refused, this process goes straight to `/proc/self/fd`.
pub(super) static EMPTY_PATH_DENIED: AtomicBool = AtomicBool::new(false);

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
    pub(super) fn new_lease(&self, content: &[u8]) -> Result<NewLease<'_>, StoreError> {
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

    pub(super) fn write_temp(&self, content: &[u8]) -> Result<TempFile<'_>, StoreError> {
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

    pub(super) fn link_anonymous_via(
        &self,
        file: &File,
        name: &CStr,
        via_proc: bool,
    ) -> io::Result<()> {
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

    pub(super) fn link_named(&self, temp: &TempFile<'_>, ip: IpAddr) -> Result<bool, StoreError> {
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
