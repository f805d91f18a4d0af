//! What a lease file says: host-local's `"<containerID>\r\n<ifname>"`, or its older
//! container-ID-only form.

use std::net::IpAddr;

use super::error::StoreError;

/// One lease file, as read back. An `ifname` of "" means the file was written by an old
/// host-local that stored only the container ID; a `container_id` of "" means the content
/// could not be interpreted, which makes the lease garbage that GC frees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub ip: IpAddr,
    pub container_id: String,
    pub ifname: String,
}

pub(super) fn is_token(s: &str) -> bool {
    !s.is_empty() && !s.chars().any(|c| c.is_whitespace() || c.is_control())
}

pub(super) fn validate_owner(container_id: &str, ifname: &str) -> Result<(), StoreError> {
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
pub(super) enum Owner {
    /// `ifname` is `None` for the old host-local format that stored only the container ID.
    Known { id: String, ifname: Option<String> },
    /// Empty, binary, oversized or unreadable content: the file occupies the IP, but no
    /// container can be shown to own it.
    Garbage,
}

impl Owner {
    /// Tolerates both host-local formats and stray whitespace (CRLF or LF, trailing newline).
    pub(super) fn parse(content: &[u8]) -> Owner {
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
    pub(super) fn held_by(&self, container_id: &str, ifname: &str) -> bool {
        match self {
            Owner::Known { id, ifname: i } => {
                id == container_id && i.as_deref().is_none_or(|i| i == ifname)
            }
            Owner::Garbage => false,
        }
    }

    /// Idempotent-ADD semantics: only an exact match may be handed back, so that two
    /// interfaces of one container never share an old-format lease's IP.
    pub(super) fn is_exactly(&self, container_id: &str, ifname: &str) -> bool {
        matches!(self, Owner::Known { id, ifname: Some(i) } if id == container_id && i == ifname)
    }

    pub(super) fn into_lease(self, ip: IpAddr) -> Lease {
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
