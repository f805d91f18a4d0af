//! What can go wrong loading, attaching and using the fast path.

use std::io;
use std::path::PathBuf;

use aya::programs::links::LinkError;
use thiserror::Error;

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
    #[error("{0}")]
    Kfuncs(#[from] super::kfuncs::KfuncError),
    #[error("cannot list {path}: {source}")]
    ListPins { path: PathBuf, source: io::Error },
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
    #[error(
        "the counters pinned at {path} have {entries} entries, this build counts in {expected}: an older agent's layout, which the agent rebuilds when it starts"
    )]
    CounterLayout {
        path: PathBuf,
        entries: u32,
        expected: u32,
    },
    #[error("map {name} at {path}: {source}")]
    Map {
        name: &'static str,
        path: PathBuf,
        source: aya::maps::MapError,
    },
}
