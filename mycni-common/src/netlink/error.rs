//! Errors keep the errno: callers decide on "gone", "exists" and
//! "interrupted", never on message text.

use std::prelude::rust_2024::*;

use super::request::DUMP_ATTEMPTS;

/// Why an operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Cause {
    /// The kernel (or a system call) answered with this errno.
    #[error("{}", std::io::Error::from_raw_os_error(*.0))]
    Errno(i32),
    /// Every attempt at a dump was interrupted by concurrent changes.
    #[error("interrupted by concurrent changes {} times in a row", DUMP_ATTEMPTS)]
    Interrupted,
    /// Anything without an errno: the connection closed, an answer that
    /// makes no sense, a link that vanished right after its creation.
    #[error("{0}")]
    Other(String),
}

/// A failed netlink operation: what was being done, and why it failed.
#[derive(Debug, thiserror::Error)]
#[error("{op}: {cause}")]
pub struct Error {
    op: String,
    cause: Cause,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(super) fn new(op: impl Into<String>, cause: Cause) -> Self {
        Self {
            op: op.into(),
            cause,
        }
    }

    pub(super) fn io(op: impl Into<String>, e: &std::io::Error) -> Self {
        let cause = match e.raw_os_error() {
            Some(n) => Cause::Errno(n),
            None => Cause::Other(e.to_string()),
        };
        Self::new(op, cause)
    }

    pub(super) fn rtnl(op: impl Into<String>, e: rtnetlink::Error) -> Self {
        let cause = match e {
            rtnetlink::Error::NetlinkError(m) if m.raw_code() != 0 => Cause::Errno(-m.raw_code()),
            other => Cause::Other(other.to_string()),
        };
        Self::new(op, cause)
    }

    /// What was being done ("creating veth a <-> b").
    pub fn op(&self) -> &str {
        &self.op
    }

    pub fn cause(&self) -> &Cause {
        &self.cause
    }

    /// The errno the kernel answered with, if it gave one.
    pub fn errno(&self) -> Option<i32> {
        match self.cause {
            Cause::Errno(n) => Some(n),
            _ => None,
        }
    }

    /// The object (or the device it hangs on) does not exist. The kernel
    /// says so with ENODEV for links, ENOENT for entries and ESRCH for
    /// routes, depending on the table.
    pub fn is_not_found(&self) -> bool {
        matches!(
            self.errno(),
            Some(libc::ENODEV | libc::ENOENT | libc::ESRCH)
        )
    }

    /// The object already exists (EEXIST).
    pub fn is_exists(&self) -> bool {
        self.errno() == Some(libc::EEXIST)
    }

    /// A dump kept being interrupted by concurrent changes.
    pub fn is_interrupted(&self) -> bool {
        matches!(self.cause, Cause::Interrupted)
    }
}

/// Turns "already gone" into success, for deletes.
pub(super) fn gone_is_ok(r: Result<()>) -> Result<()> {
    match r {
        Err(e) if e.is_not_found() => Ok(()),
        other => other,
    }
}
