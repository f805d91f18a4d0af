//! Where the lease store keeps what, on disk: the layout the reference `host-local`
//! plugin's disk backend uses, so that an operator can switch a node between the two
//! without losing or duplicating leases.
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

use std::ffi::{CStr, CString};
use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use super::error::{StoreError, io_err, not_a_directory};

/// host-local names this file `last_reserved_ip.<range set index>`: the index of the range
/// set in `ranges`, which is also ours (one set per family, in the config's order).
const LAST_RESERVED_PREFIX: &str = "last_reserved_ip.";
pub(super) const LOCK_FILE: &str = "lock";
pub(super) const LOCK_NAME: &CStr = c"lock";
/// Prefix of our temp files. host-local writes none, so under the lock any such file is a
/// leftover from a crashed writer.
pub(super) const TMP_PREFIX: &str = ".tmp-";
/// Lease files hold container IDs only, but host-local creates them 0600 and an operator
/// switching back and forth should see uniform permissions.
pub(super) const FILE_MODE: u32 = 0o600;
/// Keeps `<data_dir>/<network>` well below PATH_MAX/NAME_MAX limits.
const MAX_NETWORK_NAME: usize = 200;

/// The round-robin hint file of range set `set`.
pub(super) fn last_reserved_name(set: usize) -> CString {
    // Digits never contain NUL.
    CString::new(format!("{LAST_RESERVED_PREFIX}{set}")).unwrap_or_default()
}

/// `<data_dir>/<network>`, there and a directory. The name becomes a path component, so
/// anything that could escape or alias the data directory is refused before touching the
/// filesystem.
pub(super) fn network_dir(data_dir: &Path, network: &str) -> Result<PathBuf, StoreError> {
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
    Ok(dir)
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
