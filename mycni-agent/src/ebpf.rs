//! Loading, attaching and reading the tc eBPF programs of `mycni-ebpf`.
//!
//! Maps are pinned under a bpffs directory (`/sys/fs/bpf/mycni` in
//! production, a test's own bpffs mount in tests) so `bpftool` can read them
//! and a restarted agent reuses them. TCX links are pinned beside them so the
//! programs stay attached while the agent is down.

use std::io;
use std::path::{Path, PathBuf};

use aya::maps::{MapData, PerCpuArray};
use aya::programs::links::{FdLink, LinkError, PinnedLink};
use aya::programs::{LinkOrder, SchedClassifier, TcAttach, TcAttachType};
use aya::{Ebpf, EbpfLoader};
use mycni_common::{COUNTERS_MAP, Path as DpPath, PathCounter};
use thiserror::Error;

/// The object `cargo xtask build-ebpf --release` produced when the agent was
/// built; empty when it was built without one (see build.rs).
static EMBEDDED_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/mycni-ebpf.o"));

/// Program attached on ingress of every pod's host-side veth.
pub const PROG_FROM_POD: &str = "mycni_from_pod";

/// Every map the object declares, pinned by these names.
pub const MAPS: &[&str] = &[COUNTERS_MAP];

#[derive(Debug, Error)]
pub enum DatapathError {
    #[error(
        "this agent was built without an eBPF object (run `cargo xtask build-ebpf --release` before building it, or pass --ebpf-object)"
    )]
    NoObject,
    #[error("cannot create pin directory {path}: {source}")]
    PinDir { path: PathBuf, source: io::Error },
    #[error("loading the eBPF object failed: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("program {0} is missing from the eBPF object")]
    MissingProgram(&'static str),
    #[error("program {name}: {source}")]
    Program {
        name: &'static str,
        source: aya::programs::ProgramError,
    },
    #[error("pinned link {path}: {source}")]
    Link { path: PathBuf, source: LinkError },
    #[error("pinning link at {path}: {source}")]
    Pin {
        path: PathBuf,
        source: aya::pin::PinError,
    },
    #[error("map {name} at {path}: {source}")]
    Map {
        name: &'static str,
        path: PathBuf,
        source: aya::maps::MapError,
    },
}

/// The embedded object, if the agent was built with one.
pub fn embedded_object() -> Option<&'static [u8]> {
    (!EMBEDDED_OBJECT.is_empty()).then_some(EMBEDDED_OBJECT)
}

/// Loaded programs and their pinned maps.
pub struct Datapath {
    bpf: Ebpf,
    pin_dir: PathBuf,
}

impl Datapath {
    /// Loads `object`, reusing maps already pinned under `pin_dir` (so
    /// counters and forwarding state survive an agent restart) and pinning
    /// the ones that are not.
    pub fn load(object: &[u8], pin_dir: &Path) -> Result<Self, DatapathError> {
        for dir in [pin_dir.to_path_buf(), pin_dir.join("links")] {
            std::fs::create_dir_all(&dir).map_err(|source| DatapathError::PinDir {
                path: dir.clone(),
                source,
            })?;
        }
        let mut loader = EbpfLoader::new();
        let paths: Vec<(&str, PathBuf)> = MAPS.iter().map(|m| (*m, pin_dir.join(m))).collect();
        for (name, path) in &paths {
            loader.map_pin_path(name, path.as_path());
        }
        let mut bpf = loader.load(object)?;
        let prog: &mut SchedClassifier = bpf
            .program_mut(PROG_FROM_POD)
            .ok_or(DatapathError::MissingProgram(PROG_FROM_POD))?
            .try_into()
            .map_err(|source| DatapathError::Program {
                name: PROG_FROM_POD,
                source,
            })?;
        prog.load().map_err(|source| DatapathError::Program {
            name: PROG_FROM_POD,
            source,
        })?;
        Ok(Self {
            bpf,
            pin_dir: pin_dir.to_path_buf(),
        })
    }

    /// Where the pinned link of `ifindex`'s from-pod program lives.
    pub fn link_pin_path(&self, ifindex: u32) -> PathBuf {
        self.pin_dir
            .join("links")
            .join(format!("{PROG_FROM_POD}_{ifindex}"))
    }

    /// Attaches the from-pod program on ingress of `ifindex` (in the calling
    /// thread's network namespace) over TCX and pins the link, so the program
    /// stays attached when the agent exits. A link already pinned for this
    /// interface gets the new program swapped in atomically.
    pub fn attach_from_pod(&mut self, ifindex: u32) -> Result<(), DatapathError> {
        let pin = self.link_pin_path(ifindex);
        let prog: &mut SchedClassifier = self
            .bpf
            .program_mut(PROG_FROM_POD)
            .ok_or(DatapathError::MissingProgram(PROG_FROM_POD))?
            .try_into()
            .map_err(|source| DatapathError::Program {
                name: PROG_FROM_POD,
                source,
            })?;
        let prog_err = |source| DatapathError::Program {
            name: PROG_FROM_POD,
            source,
        };
        let (link_id, fresh) = match PinnedLink::from_pin(&pin) {
            Ok(old) => {
                let link = FdLink::from(old)
                    .try_into()
                    .map_err(|source| DatapathError::Link {
                        path: pin.clone(),
                        source,
                    })?;
                (prog.attach_to_link(link).map_err(prog_err)?, false)
            }
            Err(LinkError::SyscallError(e)) if e.io_error.kind() == io::ErrorKind::NotFound => {
                let id = prog
                    .attach(
                        ifindex,
                        TcAttach::Tcx {
                            attach_type: TcAttachType::Ingress,
                            order: LinkOrder::default(),
                        },
                    )
                    .map_err(prog_err)?;
                (id, true)
            }
            Err(source) => return Err(DatapathError::Link { path: pin, source }),
        };
        let link = prog.take_link(link_id).map_err(prog_err)?;
        let fd_link: FdLink = link.try_into().map_err(|source| DatapathError::Link {
            path: pin.clone(),
            source,
        })?;
        if fresh {
            fd_link
                .pin(&pin)
                .map_err(|source| DatapathError::Pin { path: pin, source })?;
        }
        // A replaced link stays pinned at the same path: dropping our handle
        // leaves the attachment in place.
        Ok(())
    }
}

/// Sums the per-CPU counters of the map pinned under `pin_dir`, one entry per
/// path, in `Path::ALL` order. Works while no agent runs (what `inspect` and
/// tests use).
pub fn read_counters(pin_dir: &Path) -> Result<Vec<(DpPath, PathCounter)>, DatapathError> {
    let path = pin_dir.join(COUNTERS_MAP);
    let map_err = |source| DatapathError::Map {
        name: COUNTERS_MAP,
        path: path.clone(),
        source,
    };
    let data = MapData::from_pin(&path).map_err(map_err)?;
    let map = aya::maps::Map::PerCpuArray(data);
    let counters: PerCpuArray<MapData, PathCounter> = map.try_into().map_err(map_err)?;
    let mut out = Vec::with_capacity(DpPath::ALL.len());
    for p in DpPath::ALL {
        let per_cpu = counters.get(&(p as u32), 0).map_err(map_err)?;
        let sum = per_cpu
            .iter()
            .fold(PathCounter::default(), |acc, c| PathCounter {
                packets: acc.packets + c.packets,
                bytes: acc.bytes + c.bytes,
            });
        out.push((p, sum));
    }
    Ok(out)
}
