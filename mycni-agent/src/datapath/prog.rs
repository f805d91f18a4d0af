//! The programs of `mycni-ebpf` by name: what loading, attaching, the
//! maps' discovery and `inspect` all name (kept apart so none of them
//! imports another for it).

use std::io;
use std::path::Path;

use super::error::DatapathError;

/// The programs, by the interface they run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Prog {
    /// Ingress of every pod's host-side veth.
    FromPod,
    /// Ingress of `vxlan.1` and of `vxlan6.1`.
    FromVxlan,
    /// Ingress of the underlay device (tc decapsulation).
    FromUnderlay,
}

impl Prog {
    pub const ALL: [Prog; 3] = [Prog::FromPod, Prog::FromVxlan, Prog::FromUnderlay];

    /// What aya says went wrong with this program, as the agent says it.
    pub(super) fn error(self) -> impl Fn(aya::programs::ProgramError) -> DatapathError + Copy {
        move |source| DatapathError::Program {
            name: self.name(),
            source,
        }
    }

    /// The `(program, ifindex)` pairs named by the pins in `dir`
    /// (`<prog>_<ifindex>`).
    pub(super) fn parse_pins(dir: &Path) -> Result<Vec<(Prog, u32)>, DatapathError> {
        let dir = dir.to_path_buf();
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(vec![]),
            Err(source) => return Err(DatapathError::ListPins { path: dir, source }),
        };
        let mut out = vec![];
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            for p in Prog::ALL {
                if let Some(ifindex) = name
                    .strip_prefix(p.name())
                    .and_then(|r| r.strip_prefix('_'))
                    .and_then(|r| r.parse().ok())
                {
                    out.push((p, ifindex));
                }
            }
        }
        out.sort();
        Ok(out)
    }

    pub const fn name(self) -> &'static str {
        match self {
            Prog::FromPod => "mycni_from_pod",
            Prog::FromVxlan => "mycni_from_vxlan",
            Prog::FromUnderlay => "mycni_from_underlay",
        }
    }
}
