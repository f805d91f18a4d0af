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
//! <data_dir>/<network>/last_reserved_ip.0   last allocated IP, where round-robin resumes
//! <data_dir>/<network>/10.244.1.5           "<containerID>\r\n<ifname>"
//! ```
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
use std::ffi::{CStr, CString};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use mycni_common::net::{Cidr, CidrError};

/// host-local names this file `last_reserved_ip.<range index>`; we manage a single range.
const LAST_RESERVED_NAME: &CStr = c"last_reserved_ip.0";
const LOCK_FILE: &str = "lock";
const LOCK_NAME: &CStr = c"lock";
/// Prefix of our temp files. host-local writes none, so under the lock any such file is a
/// leftover from a crashed writer.
const TMP_PREFIX: &str = ".tmp-";
/// Keeps `<data_dir>/<network>` well below PATH_MAX/NAME_MAX limits.
const MAX_NETWORK_NAME: usize = 200;
/// A real lease is a container ID plus an interface name (~100 bytes); anything far larger
/// is not a lease we can trust, and capping the read bounds the work per file.
const MAX_LEASE_CONTENT: usize = 4096;
/// The longest hint we can parse is "255.255.255.255" plus some whitespace; a longer file is
/// garbage and only its length matters (it must be truncated when rewritten).
const MAX_HINT_CONTENT: usize = 64;
/// Lease files hold container IDs only, but host-local creates them 0600 and an operator
/// switching back and forth should see uniform permissions.
const FILE_MODE: u32 = 0o600;
/// Room for about 400 lease names, so one `getdents64` usually lists a node's leases.
const DIRENT_BUF: usize = 16 * 1024;

/// Distinguishes temp files of threads of one process (the pid alone does not).
static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);
/// Linking an `O_TMPFILE` inode with `AT_EMPTY_PATH` needs CAP_DAC_READ_SEARCH on kernels
/// before 6.10; once that was refused, this process goes straight to `/proc/self/fd`.
static EMPTY_PATH_DENIED: AtomicBool = AtomicBool::new(false);

/// Why a configured range cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    #[error("invalid CIDR {input:?}: {reason} (expected an IPv4 subnet like \"10.244.1.0/24\")")]
    BadCidr { input: String, reason: String },
    #[error(
        "prefix length /{prefix} is too long: an IPv4 range needs /30 or shorter to have a \
         usable address besides the network and broadcast addresses"
    )]
    PrefixTooLong { prefix: u8 },
    #[error("{network}/{prefix} has host bits set; the subnet is {expected}/{prefix}")]
    HostBitsSet {
        network: Ipv4Addr,
        prefix: u8,
        expected: Ipv4Addr,
    },
    #[error(
        "range {which} {ip} is outside the usable addresses of {network}/{prefix} \
         ({first}-{last}; the network and broadcast addresses cannot be leased)"
    )]
    OutsideSubnet {
        which: &'static str,
        ip: Ipv4Addr,
        network: Ipv4Addr,
        prefix: u8,
        first: Ipv4Addr,
        last: Ipv4Addr,
    },
    #[error("range start {start} is after range end {end}")]
    StartAfterEnd { start: Ipv4Addr, end: Ipv4Addr },
}

/// The addresses leases are taken from: a subnet plus the `start..=end` slice of it that
/// this node may hand out (defaulting to every usable address of the subnet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub network: Ipv4Addr,
    pub prefix: u8,
    pub start: Ipv4Addr,
    pub end: Ipv4Addr,
}

/// Netmask for `prefix`, saturating so that a hand-built `Range` with a bogus prefix cannot
/// make the shift overflow.
fn netmask(prefix: u8) -> u32 {
    match prefix {
        0 => 0,
        p if p >= 32 => u32::MAX,
        p => u32::MAX << (32 - u32::from(p)),
    }
}

impl Range {
    /// Validated here rather than at allocation time so that a bad network config fails the
    /// first ADD with a message about the config instead of an odd lease.
    pub fn new(
        network: Ipv4Addr,
        prefix: u8,
        start: Option<Ipv4Addr>,
        end: Option<Ipv4Addr>,
    ) -> Result<Range, RangeError> {
        if prefix > 30 {
            return Err(RangeError::PrefixTooLong { prefix });
        }
        let mask = netmask(prefix);
        let net = u32::from(network);
        if net & !mask != 0 {
            return Err(RangeError::HostBitsSet {
                network,
                prefix,
                expected: Ipv4Addr::from(net & mask),
            });
        }
        // prefix <= 30 makes both of these in-subnet and first <= last.
        let first = Ipv4Addr::from(net + 1);
        let last = Ipv4Addr::from((net | !mask) - 1);
        let check = |which: &'static str, ip: Ipv4Addr| {
            if ip < first || ip > last {
                Err(RangeError::OutsideSubnet {
                    which,
                    ip,
                    network,
                    prefix,
                    first,
                    last,
                })
            } else {
                Ok(ip)
            }
        };
        let start = check("start", start.unwrap_or(first))?;
        let end = check("end", end.unwrap_or(last))?;
        if start > end {
            return Err(RangeError::StartAfterEnd { start, end });
        }
        Ok(Range {
            network,
            prefix,
            start,
            end,
        })
    }

    /// Network configs carry the subnet as one string; this keeps the split in one place.
    /// Host bits are accepted here and rejected by [`Range::new`], which can name the fix.
    /// The syntax is `mycni_common::net`'s (no "+24", no "024"), surrounding
    /// whitespace aside, which hand-written configs have.
    pub fn parse_cidr(s: &str) -> Result<(Ipv4Addr, u8), RangeError> {
        let c: Cidr<Ipv4Addr> = s.trim().parse().map_err(|e| {
            let reason = match e {
                CidrError::BadAddress => "not an IPv4 address".to_owned(),
                e => e.to_string(),
            };
            RangeError::BadCidr {
                input: s.to_owned(),
                reason,
            }
        })?;
        Ok((c.addr(), c.prefix()))
    }

    /// Only `start..=end` is ours to lease; the rest of the subnet may belong to the
    /// gateway or to other allocators.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        self.start <= ip && ip <= self.end
    }

    /// 0 for a hand-built range with `start > end`, which therefore leases nothing.
    pub fn size(&self) -> u32 {
        let (start, end) = (u32::from(self.start), u32::from(self.end));
        if start > end {
            0
        } else {
            // Saturates only for a hand-built 0.0.0.0-255.255.255.255, which `new` rejects.
            (end - start).saturating_add(1)
        }
    }
}

/// One lease file, as read back. An `ifname` of "" means the file was written by an old
/// host-local that stored only the container ID; a `container_id` of "" means the content
/// could not be interpreted, which makes the lease garbage for [`LeaseStore::gc`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub ip: Ipv4Addr,
    pub container_id: String,
    pub ifname: String,
}

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

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_owned(),
        source,
    }
}

fn is_token(s: &str) -> bool {
    !s.is_empty() && !s.chars().any(|c| c.is_whitespace() || c.is_control())
}

fn validate_owner(container_id: &str, ifname: &str) -> Result<(), StoreError> {
    if is_token(container_id) && is_token(ifname) {
        Ok(())
    } else {
        Err(StoreError::InvalidOwner {
            container_id: container_id.to_owned(),
            ifname: ifname.to_owned(),
        })
    }
}

/// Who a lease file says holds the IP.
#[derive(Debug, PartialEq, Eq)]
enum Owner {
    /// `ifname` is `None` for the old host-local format that stored only the container ID.
    Known { id: String, ifname: Option<String> },
    /// Empty, binary, oversized or unreadable content: the file occupies the IP, but no
    /// container can be shown to own it.
    Garbage,
}

impl Owner {
    /// Tolerates both host-local formats and stray whitespace (CRLF or LF, trailing newline).
    fn parse(content: &[u8]) -> Owner {
        let Ok(text) = std::str::from_utf8(content) else {
            return Owner::Garbage;
        };
        let text = text.trim();
        let (id, ifname) = match text.split_once('\n') {
            Some((id, ifname)) => (id.trim(), Some(ifname.trim())),
            None => (text, None),
        };
        if !is_token(id) || ifname.is_some_and(|i| !is_token(i)) {
            return Owner::Garbage;
        }
        Owner::Known {
            id: id.to_owned(),
            ifname: ifname.map(str::to_owned),
        }
    }

    /// Release semantics: a lease of unknown interface belongs to every interface of its
    /// container, otherwise an old-format lease could never be released by DEL.
    fn held_by(&self, container_id: &str, ifname: &str) -> bool {
        match self {
            Owner::Known { id, ifname: i } => {
                id == container_id && i.as_deref().is_none_or(|i| i == ifname)
            }
            Owner::Garbage => false,
        }
    }

    /// Idempotent-ADD semantics: only an exact match may be handed back, so that two
    /// interfaces of one container never share an old-format lease's IP.
    fn is_exactly(&self, container_id: &str, ifname: &str) -> bool {
        matches!(self, Owner::Known { id, ifname: Some(i) } if id == container_id && i == ifname)
    }

    fn into_lease(self, ip: Ipv4Addr) -> Lease {
        match self {
            Owner::Known { id, ifname } => Lease {
                ip,
                container_id: id,
                ifname: ifname.unwrap_or_default(),
            },
            Owner::Garbage => Lease {
                ip,
                container_id: String::new(),
                ifname: String::new(),
            },
        }
    }
}

fn not_a_directory(path: &Path) -> StoreError {
    StoreError::Corrupt {
        path: path.to_owned(),
        reason: "exists but is not a directory; the lease store needs a directory here".to_owned(),
    }
}

fn create_dir(dir: &Path) -> Result<(), StoreError> {
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

/// An IP's text never contains NUL, so the default (an empty name no call accepts) is
/// unreachable.
fn ip_name(ip: Ipv4Addr) -> CString {
    CString::new(ip.to_string()).unwrap_or_default()
}

/// Repeats a libc call that a signal interrupted before it did anything.
fn retry_eintr(mut call: impl FnMut() -> libc::c_int) -> io::Result<libc::c_int> {
    loop {
        let ret = call();
        if ret >= 0 {
            return Ok(ret);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

fn openat(
    dir: BorrowedFd<'_>,
    name: &CStr,
    flags: libc::c_int,
    mode: libc::c_uint,
) -> io::Result<File> {
    let fd = retry_eintr(|| {
        // SAFETY: `name` is NUL-terminated and outlives the call, and `dir` is open for the
        // duration of the borrow; openat touches no other memory of ours.
        unsafe {
            libc::openat(
                dir.as_raw_fd(),
                name.as_ptr(),
                flags | libc::O_CLOEXEC,
                mode,
            )
        }
    })?;
    // SAFETY: openat just returned this fd, so nothing else owns it.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// `old_dir` is a raw fd because it may be `AT_FDCWD` or the file itself (`AT_EMPTY_PATH`).
fn linkat(
    old_dir: libc::c_int,
    old: &CStr,
    new_dir: BorrowedFd<'_>,
    new: &CStr,
    flags: libc::c_int,
) -> io::Result<()> {
    retry_eintr(|| {
        // SAFETY: both names are NUL-terminated and outlive the call; the fds are open for
        // its duration (`old_dir` is borrowed from the caller or AT_FDCWD).
        unsafe {
            libc::linkat(
                old_dir,
                old.as_ptr(),
                new_dir.as_raw_fd(),
                new.as_ptr(),
                flags,
            )
        }
    })
    .map(drop)
}

fn unlinkat(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    retry_eintr(|| {
        // SAFETY: `name` is NUL-terminated and outlives the call; `dir` is open for its
        // duration.
        unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) }
    })
    .map(drop)
}

/// Reads until EOF or until `buf` is full; a full buffer means there may be more.
fn read_into(mut file: &File, buf: &mut [u8]) -> io::Result<usize> {
    let mut len = 0;
    while len < buf.len() {
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(len)
}

/// Lists a directory through an fd the caller already holds (`fs::read_dir` would open
/// the path again), calling `f(name, d_type)` for every entry including "." and "..".
fn for_each_dirent(dir: BorrowedFd<'_>, mut f: impl FnMut(&[u8], u8)) -> io::Result<()> {
    // Offsets of `struct linux_dirent64 { u64 d_ino; i64 d_off; u16 d_reclen; u8 d_type;
    // char d_name[]; }`.
    const RECLEN: usize = 16;
    const TYPE: usize = 18;
    const NAME: usize = 19;
    // The offset lives on the fd: without the rewind a second listing through the same fd
    // would come back empty.
    // SAFETY: lseek on an open fd has no memory-safety preconditions.
    if unsafe { libc::lseek(dir.as_raw_fd(), 0, libc::SEEK_SET) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; DIRENT_BUF];
    loop {
        let filled = loop {
            // SAFETY: the kernel writes at most `buf.len()` bytes to `buf`, which is valid
            // for writes of that many bytes and outlives the call.
            let ret = unsafe {
                libc::syscall(
                    libc::SYS_getdents64,
                    dir.as_raw_fd(),
                    buf.as_mut_ptr(),
                    buf.len(),
                )
            };
            if let Ok(n) = usize::try_from(ret) {
                break n.min(buf.len());
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        };
        if filled == 0 {
            return Ok(());
        }
        let mut records = &buf[..filled];
        while records.len() > NAME {
            let reclen = usize::from(u16::from_ne_bytes([records[RECLEN], records[RECLEN + 1]]));
            if reclen <= NAME || reclen > records.len() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "malformed getdents64 record",
                ));
            }
            let name = &records[NAME..reclen];
            let name = name.split(|&b| b == 0).next().unwrap_or(name);
            f(name, records[TYPE]);
            records = &records[reclen..];
        }
    }
}

/// A lease's content before it has a name.
enum NewLease<'a> {
    /// An `O_TMPFILE` inode: it has no name until linked, so a killed plugin leaves nothing
    /// behind and there is no temp name to remove afterwards.
    Anonymous(File),
    /// Where the filesystem has no `O_TMPFILE` or its inode cannot be linked.
    Named(TempFile<'a>),
}

/// A named temp file that is unlinked on drop, so no error path leaves one behind; a killed
/// process's leftover is removed by the next locked scan.
struct TempFile<'a> {
    dir: BorrowedFd<'a>,
    name: CString,
}

impl Drop for TempFile<'_> {
    fn drop(&mut self) {
        // Best effort: a leftover is removed by the next locked scan anyway.
        let _ = unlinkat(self.dir, &self.name);
    }
}

/// `last_reserved_ip.0` as read under the lock, kept open so that recording the next
/// allocation costs a `pwrite` instead of a second open.
struct Hint {
    file: Option<File>,
    /// Bytes in the file when read (`u64::MAX` if unknown), which tells whether writing a
    /// new value must also truncate.
    len: u64,
    ip: Option<Ipv4Addr>,
}

/// One directory entry whose name is an IPv4 address.
struct Entry {
    ip: Ipv4Addr,
    /// Directories occupy their IP's name but are not leases we can read or remove.
    is_dir: bool,
}

/// The store for the duration of one call: the directory fd that every file is reached
/// through, and the `flock` on `<dir>/lock`, held until drop (closing the file releases it).
struct Locked<'s> {
    path: &'s Path,
    dir: OwnedFd,
    _lock: File,
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
    fn scan(&self) -> Result<Vec<Entry>, StoreError> {
        let mut entries = Vec::new();
        let mut stale = Vec::new();
        for_each_dirent(self.fd(), |name, d_type| {
            let Ok(name) = std::str::from_utf8(name) else {
                return;
            };
            if let Ok(ip) = name.parse::<Ipv4Addr>() {
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
    fn read_owner(&self, ip: Ipv4Addr) -> Option<Owner> {
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
    fn read_leases(&self) -> Result<Vec<(Ipv4Addr, Owner)>, StoreError> {
        let mut out: Vec<(Ipv4Addr, Owner)> = self
            .scan()?
            .into_iter()
            .filter(|e| !e.is_dir)
            .filter_map(|e| self.read_owner(e.ip).map(|o| (e.ip, o)))
            .collect();
        out.sort_unstable_by_key(|(ip, _)| *ip);
        Ok(out)
    }

    /// `Ok(false)` if the file was already gone, which keeps release idempotent.
    fn remove_lease(&self, ip: Ipv4Addr) -> Result<bool, StoreError> {
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
    fn link_lease<'a>(
        &'a self,
        pending: &mut Option<NewLease<'a>>,
        content: &[u8],
        ip: Ipv4Addr,
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
    fn link_anonymous(&self, file: &File, ip: Ipv4Addr) -> Result<Option<bool>, StoreError> {
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

    fn link_named(&self, temp: &TempFile<'_>, ip: Ipv4Addr) -> Result<bool, StoreError> {
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
    fn read_hint(&self) -> Hint {
        let none = Hint {
            file: None,
            len: u64::MAX,
            ip: None,
        };
        let (file, writable) = match openat(self.fd(), LAST_RESERVED_NAME, libc::O_RDWR, 0) {
            Ok(file) => (file, true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return none,
            // Not writable for us (say, made read-only by hand): still worth following.
            Err(_) => match openat(self.fd(), LAST_RESERVED_NAME, libc::O_RDONLY, 0) {
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
    fn write_hint(&self, hint: Hint, ip: Ipv4Addr) {
        let text = ip.to_string();
        let (file, old_len) = match hint.file {
            Some(file) => (file, hint.len),
            None => match openat(
                self.fd(),
                LAST_RESERVED_NAME,
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
    /// the IP it was already given instead of leaking a second one.
    pub fn allocate(
        &self,
        range: &Range,
        reserved: &[Ipv4Addr],
        container_id: &str,
        ifname: &str,
    ) -> Result<Ipv4Addr, StoreError> {
        validate_owner(container_id, ifname)?;
        let locked = self.lock()?;
        let entries = locked.scan()?;

        let mut taken: HashSet<u32> = HashSet::with_capacity(entries.len() + reserved.len() + 2);
        for entry in &entries {
            if !range.contains(entry.ip) {
                continue;
            }
            taken.insert(u32::from(entry.ip));
            if !entry.is_dir
                && locked
                    .read_owner(entry.ip)
                    .is_some_and(|o| o.is_exactly(container_id, ifname))
            {
                return Ok(entry.ip);
            }
        }
        taken.extend(reserved.iter().map(|&ip| u32::from(ip)));
        // `Range`'s fields are public, so a hand-built range could include these.
        let mask = netmask(range.prefix);
        let net = u32::from(range.network) & mask;
        taken.extend([net, net | !mask]);

        let exhausted = || StoreError::Exhausted {
            network: self.network.clone(),
            range: format!("{}-{}", range.start, range.end),
        };
        let (start, end) = (u32::from(range.start), u32::from(range.end));
        if start > end {
            return Err(exhausted());
        }
        let size = u64::from(end - start) + 1;
        // Round-robin like host-local: resume after the last allocation so a just-released
        // IP is not handed to the next pod while stale state (conntrack, ARP caches, peers'
        // routes) may still point at the old one.
        let hint = locked.read_hint();
        let first = match hint.ip {
            Some(last) if range.contains(last) => (u64::from(u32::from(last) - start) + 1) % size,
            _ => 0,
        };

        let content = format!("{container_id}\r\n{ifname}");
        let mut pending = None;
        // Every skipped candidate is a distinct member of `taken` or a name that link(2)
        // found occupied, so this stops after at most |taken| + |entries| + 1 steps even in
        // a huge range.
        for step in 0..size {
            let candidate = start + ((first + step) % size) as u32;
            if taken.contains(&candidate) {
                continue;
            }
            let ip = Ipv4Addr::from(candidate);
            if locked.link_lease(&mut pending, content.as_bytes(), ip)? {
                drop(pending);
                locked.write_hint(hint, ip);
                return Ok(ip);
            }
        }
        Err(exhausted())
    }

    /// Idempotent (a missing lease is success) because CNI DEL may be repeated and may
    /// follow a failed ADD that never leased anything.
    pub fn release(
        &self,
        container_id: &str,
        ifname: &str,
        hint: Option<Ipv4Addr>,
    ) -> Result<Vec<Ipv4Addr>, StoreError> {
        validate_owner(container_id, ifname)?;
        let locked = self.lock()?;
        // The hint spares reading every lease file on the common path; it is only trusted
        // if the file still names this owner, since prevResult may be stale.
        if let Some(ip) = hint
            && locked
                .read_owner(ip)
                .is_some_and(|o| o.held_by(container_id, ifname))
            && locked.remove_lease(ip)?
        {
            return Ok(vec![ip]);
        }
        let mut released = Vec::new();
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

    /// Per call rather than per store: flock is per open file description, so opening the
    /// file each time makes threads of one process exclude each other too, and the lock is
    /// never held between calls. The directory fd is per call too, so that a directory
    /// removed and recreated between calls is used rather than the deleted one.
    fn lock(&self) -> Result<Locked<'_>, StoreError> {
        let open_dir = || {
            OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECTORY)
                .open(&self.dir)
        };
        let dir = match open_dir() {
            // Removed since `open`: recreate it, as `open` would have.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                create_dir(&self.dir)?;
                open_dir()
            }
            other => other,
        }
        .map_err(io_err(&self.dir))?;
        let dir = OwnedFd::from(dir);
        let lock_err = |e| io_err(&self.dir.join(LOCK_FILE))(e);
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
            path: &self.dir,
            dir,
            _lock: file,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::sync::{Arc, Barrier};
    use std::thread;
    use std::time::Duration;
    use tempfile::TempDir;

    const NONE: [Ipv4Addr; 0] = [];
    const LAST_RESERVED_FILE: &str = "last_reserved_ip.0";

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    fn range(cidr: &str) -> Range {
        let (net, prefix) = Range::parse_cidr(cidr).unwrap();
        Range::new(net, prefix, None, None).unwrap()
    }

    fn store() -> (TempDir, LeaseStore) {
        let tmp = tempfile::tempdir().unwrap();
        let store = LeaseStore::open(tmp.path(), "net1").unwrap();
        (tmp, store)
    }

    /// Names in the store directory that parse as IPs, sorted.
    fn lease_files(store: &LeaseStore) -> Vec<Ipv4Addr> {
        let mut v: Vec<Ipv4Addr> = fs::read_dir(store.dir())
            .unwrap()
            .filter_map(|e| e.unwrap().file_name().to_str()?.parse().ok())
            .collect();
        v.sort();
        v
    }

    /// Every name in the store directory, sorted.
    fn names(store: &LeaseStore) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(store.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    fn tmp_files(store: &LeaseStore) -> Vec<String> {
        fs::read_dir(store.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(TMP_PREFIX))
            .collect()
    }

    fn write(store: &LeaseStore, name: &str, content: &[u8]) {
        fs::write(store.dir().join(name), content).unwrap();
    }

    fn read(store: &LeaseStore, name: &str) -> String {
        fs::read_to_string(store.dir().join(name)).unwrap()
    }

    fn keep(pairs: &[(&str, &str)]) -> HashSet<(String, String)> {
        pairs
            .iter()
            .map(|(c, i)| (c.to_string(), i.to_string()))
            .collect()
    }

    // ---- Range ----

    #[test]
    fn range_defaults_exclude_network_and_broadcast() {
        let r = range("10.244.1.0/24");
        assert_eq!(r.start, ip("10.244.1.1"));
        assert_eq!(r.end, ip("10.244.1.254"));
        assert_eq!(r.size(), 254);
        assert!(r.contains(ip("10.244.1.1")));
        assert!(r.contains(ip("10.244.1.254")));
        assert!(!r.contains(ip("10.244.1.0")));
        assert!(!r.contains(ip("10.244.1.255")));
        assert!(!r.contains(ip("10.244.2.1")));

        let r = Range::new(
            ip("10.0.0.0"),
            16,
            Some(ip("10.0.1.20")),
            Some(ip("10.0.3.50")),
        )
        .unwrap();
        assert_eq!(r.size(), 2 * 256 + 31);
        assert!(!r.contains(ip("10.0.1.19")));
        assert!(r.contains(ip("10.0.2.0")));
        assert!(!r.contains(ip("10.0.3.51")));

        let r = range("192.168.0.4/30");
        assert_eq!(
            (r.start, r.end, r.size()),
            (ip("192.168.0.5"), ip("192.168.0.6"), 2)
        );
        let r = range("0.0.0.0/0");
        assert_eq!(r.size(), u32::MAX - 1);
    }

    #[test]
    fn range_new_rejects_bad_ranges() {
        let net = ip("10.0.0.0");
        assert_eq!(
            Range::new(net, 31, None, None),
            Err(RangeError::PrefixTooLong { prefix: 31 })
        );
        assert!(matches!(
            Range::new(net, 33, None, None),
            Err(RangeError::PrefixTooLong { .. })
        ));
        let err = Range::new(ip("10.0.0.5"), 24, None, None).unwrap_err();
        assert_eq!(
            err,
            RangeError::HostBitsSet {
                network: ip("10.0.0.5"),
                prefix: 24,
                expected: net
            }
        );
        assert!(err.to_string().contains("10.0.0.0/24"), "{err}");
        for (start, end, which) in [
            (Some(ip("10.0.1.1")), None, "start"),
            (None, Some(ip("10.0.1.1")), "end"),
            (Some(ip("10.0.0.0")), None, "start"),
            (None, Some(ip("10.0.0.255")), "end"),
            (Some(ip("9.255.255.255")), None, "start"),
        ] {
            match Range::new(net, 24, start, end) {
                Err(RangeError::OutsideSubnet { which: w, .. }) => assert_eq!(w, which),
                other => panic!("{start:?} {end:?}: {other:?}"),
            }
        }
        assert_eq!(
            Range::new(net, 24, Some(ip("10.0.0.9")), Some(ip("10.0.0.8"))),
            Err(RangeError::StartAfterEnd {
                start: ip("10.0.0.9"),
                end: ip("10.0.0.8")
            })
        );
        assert!(Range::new(net, 24, Some(ip("10.0.0.9")), Some(ip("10.0.0.9"))).is_ok());
    }

    #[test]
    fn parse_cidr_accepts_and_rejects() {
        assert_eq!(
            Range::parse_cidr("10.244.1.0/24"),
            Ok((ip("10.244.1.0"), 24))
        );
        assert_eq!(Range::parse_cidr(" 10.0.0.0/8\n"), Ok((ip("10.0.0.0"), 8)));
        assert_eq!(Range::parse_cidr("0.0.0.0/0"), Ok((ip("0.0.0.0"), 0)));
        assert_eq!(Range::parse_cidr("10.0.0.1/32"), Ok((ip("10.0.0.1"), 32)));
        for bad in [
            "10.0.0.0/33",
            "x/24",
            "10.0.0.0",
            "10.0.0.0/",
            "10.0.0.0/+8",
            "10.0.0.0/-1",
            "10.0.0.0/024",
            // Taken before the parsers were unified; a leading zero is a
            // second spelling of the same prefix, which no CIDR may have.
            "10.0.0.0/08",
            "10.0.0.0/00",
            "10.0.0.0/24/1",
            "10.0.0/24",
            "::1/64",
            "",
        ] {
            match Range::parse_cidr(bad) {
                Err(e @ RangeError::BadCidr { .. }) => {
                    assert!(e.to_string().contains("invalid CIDR"), "{e}")
                }
                other => panic!("{bad:?} parsed as {other:?}"),
            }
        }
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

    // ---- crash safety ----

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
    fn listing_spans_several_getdents_calls() {
        let (_tmp, store) = store();
        // 2000 names take several DIRENT_BUF-sized reads.
        for i in 0..2000 {
            let name = format!("10.25.{}.{}", i / 250, i % 250 + 1);
            write(&store, &name, b"x\r\neth0");
        }
        assert_eq!(store.leases().unwrap().len(), 2000);
        let r = range("10.25.0.0/16");
        assert_eq!(
            store.allocate(&r, &[], "y", "eth0").unwrap(),
            ip("10.25.0.251")
        );
        assert_eq!(store.release("x", "eth0", None).unwrap().len(), 2000);
        assert_eq!(lease_files(&store), [ip("10.25.0.251")]);
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
        assert_eq!(LAST_RESERVED_NAME.to_str().unwrap(), LAST_RESERVED_FILE);
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

        let run = |release: bool| -> Vec<Ipv4Addr> {
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
