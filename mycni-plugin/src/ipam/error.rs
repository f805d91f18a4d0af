//! The lease store's error. Its own module so that the store's API, its lock and the lease
//! format all return it without importing one another.

use std::io;
use std::path::{Path, PathBuf};

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

pub(super) fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_owned(),
        source,
    }
}

pub(super) fn not_a_directory(path: &Path) -> StoreError {
    StoreError::Corrupt {
        path: path.to_owned(),
        reason: "exists but is not a directory; the lease store needs a directory here".to_owned(),
    }
}
