//! What the node's nftables tables decide, and how they say it: the NFLOG
//! group they all log to, the limit on logged repeats, and every log
//! prefix with its parser. The tables (the policy room's, the underlay
//! filter) write with these, the flows room reads back with them, and
//! neither room knows the other.

/// The side of a pod a NetworkPolicy rule (or a drop) is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Direction {
    Ingress,
    Egress,
}

impl Direction {
    /// As metrics, prefixes, chain and counter names spell it.
    pub fn label(self) -> &'static str {
        match self {
            Direction::Egress => "egress",
            Direction::Ingress => "ingress",
        }
    }
}

/// Why the policy table dropped a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    /// Isolated, and no rule of the policies isolating the pod admits it.
    Denied,
    /// From or to a pod the agent has not judged yet (fail closed).
    NotJudged,
    /// No connection to judge it as (conntrack's invalid or untracked).
    Invalid,
}

impl Reason {
    pub const ALL: [Reason; 3] = [Reason::Denied, Reason::NotJudged, Reason::Invalid];

    pub fn label(self) -> &'static str {
        match self {
            Reason::Denied => "denied",
            Reason::NotJudged => "not_judged",
            Reason::Invalid => "invalid",
        }
    }
}

/// What an nftables rule that logs decided, named by its NFLOG prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NftVerdict {
    /// A new connection of an isolated pod, admitted by a policy rule in
    /// `direction` (which rule: the flows room finds it).
    PolicyAllow { direction: Direction },
    /// The policy table dropped it, in `direction`, for `reason`.
    PolicyDrop {
        direction: Direction,
        reason: Reason,
    },
    /// The underlay filter dropped VXLAN from a host that is not a peer.
    UnderlayDrop,
}

impl NftVerdict {
    pub(crate) fn is_drop(self) -> bool {
        !matches!(self, NftVerdict::PolicyAllow { .. })
    }
}

/// The underlay filter's prefix.
const UNDERLAY_DROP: &str = "mycni underlay-drop";

/// The NFLOG prefix of a rule that decides `v` (at most 127 bytes; these
/// are under 40).
pub(crate) fn log_prefix(v: NftVerdict) -> String {
    match v {
        NftVerdict::PolicyAllow { direction } => format!("mycni allow {}", direction.label()),
        NftVerdict::PolicyDrop { direction, reason } => {
            format!("mycni drop {} {}", direction.label(), reason.label())
        }
        NftVerdict::UnderlayDrop => UNDERLAY_DROP.to_string(),
    }
}

/// The verdict a prefix [`log_prefix`] wrote names; None for any other
/// (another tool's).
pub(crate) fn parse_log_prefix(s: &str) -> Option<NftVerdict> {
    if s == UNDERLAY_DROP {
        return Some(NftVerdict::UnderlayDrop);
    }
    let mut w = s.split(' ');
    if w.next()? != "mycni" {
        return None;
    }
    let dir = |s: Option<&str>| match s? {
        "egress" => Some(Direction::Egress),
        "ingress" => Some(Direction::Ingress),
        _ => None,
    };
    let v = match w.next()? {
        "allow" => NftVerdict::PolicyAllow {
            direction: dir(w.next())?,
        },
        "drop" => {
            let direction = dir(w.next())?;
            let label = w.next()?;
            NftVerdict::PolicyDrop {
                direction,
                reason: Reason::ALL.into_iter().find(|r| r.label() == label)?,
            }
        }
        _ => return None,
    };
    w.next().is_none().then_some(v)
}

/// The NFLOG group every table of mycni's logs its verdicts to (the flows
/// room reads it; `flows::nflog`). Other NFLOG users of a node pick another.
pub(crate) const NFLOG_GROUP: u16 = 1717;

/// Repeated drops of flows already logged that a table still logs, a
/// second, per table (one named limit for all its drop rules): the flows
/// room folds them into per-flow counts (`flows::nflog::Fold`); past it
/// they are only counted. A flow's first drop is always logged (a limit
/// of its own per flow), so a flood of one flow cannot hide another's.
pub(crate) const NFLOG_REPEATS_PER_SECOND: u32 = 2_000;

/// The named limit (`add limit`) of [`NFLOG_REPEATS_PER_SECOND`] in a
/// table: `limit name "repeats"`.
pub(crate) fn repeats_limit(family_table: &str) -> String {
    format!(
        "add limit {family_table} {REPEATS} {{ rate {NFLOG_REPEATS_PER_SECOND}/second burst {NFLOG_REPEATS_PER_SECOND} packets; }}\n"
    )
}

/// The name of the limit [`repeats_limit`] adds.
pub(crate) const REPEATS: &str = "repeats";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_verdict_survives_its_prefix() {
        let mut all = vec![NftVerdict::UnderlayDrop];
        for direction in [Direction::Egress, Direction::Ingress] {
            all.push(NftVerdict::PolicyAllow { direction });
            for reason in Reason::ALL {
                all.push(NftVerdict::PolicyDrop { direction, reason });
            }
        }
        for v in all {
            let p = log_prefix(v);
            assert!(p.len() < 127, "{p}");
            assert_eq!(parse_log_prefix(&p), Some(v), "{p}");
        }
        assert_eq!(parse_log_prefix("other tool"), None);
        assert_eq!(parse_log_prefix("mycni allow sideways"), None);
        assert_eq!(parse_log_prefix("mycni allow egress extra"), None);
        assert_eq!(parse_log_prefix("mycni drop egress lost"), None);
    }
}
