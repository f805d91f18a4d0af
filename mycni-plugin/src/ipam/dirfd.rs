//! The few syscalls the lease store makes relative to its directory fd, so that each call
//! opens the directory once instead of walking the path for every file.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::{self, Read};
use std::net::IpAddr;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd};

/// Room for about 400 lease names, so one `getdents64` usually lists a node's leases.
const DIRENT_BUF: usize = 16 * 1024;

/// An IP's text never contains NUL, so the default (an empty name no call accepts) is
/// unreachable.
pub(super) fn ip_name(ip: IpAddr) -> CString {
    CString::new(ip.to_string()).unwrap_or_default()
}

/// Repeats a libc call that a signal interrupted before it did anything.
pub(super) fn retry_eintr(mut call: impl FnMut() -> libc::c_int) -> io::Result<libc::c_int> {
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

pub(super) fn openat(
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
pub(super) fn linkat(
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

pub(super) fn unlinkat(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    retry_eintr(|| {
        // SAFETY: `name` is NUL-terminated and outlives the call; `dir` is open for its
        // duration.
        unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) }
    })
    .map(drop)
}

/// Reads until EOF or until `buf` is full; a full buffer means there may be more.
pub(super) fn read_into(mut file: &File, buf: &mut [u8]) -> io::Result<usize> {
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
pub(super) fn for_each_dirent(dir: BorrowedFd<'_>, mut f: impl FnMut(&[u8], u8)) -> io::Result<()> {
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
