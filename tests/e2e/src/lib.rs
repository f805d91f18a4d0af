//! The harness of mycni's end-to-end tests (`tests/e2e/tests/`): where the
//! binaries under test are, the two real runtimes the plugin is run by (a
//! private containerd driven over CRI, a private podman on its CNI
//! backend) and what they may leave on the host.
//!
//! The tests run the workspace's binaries as processes: `mycni-agent`,
//! `mycni` (the plugin), `mycni-lab` (the pods' echo server) and
//! `mycni-apiserver`. They belong to other packages, so cargo neither builds
//! them for these tests nor tells them where they are (`CARGO_BIN_EXE_*` is
//! only set for a package's own binaries): `cargo xtask test` builds every
//! binary first (`cargo build --workspace --bins`), and the tests find them
//! in the target directory their own executable runs from.

use std::path::PathBuf;

use mycni_lab::Bins;

pub mod cri;
pub mod leftovers;
pub mod podman;

/// The directory cargo put this build's binaries in: a test executable
/// lives in its `deps/` subdirectory (`target/<profile>/deps/<test>-<hash>`).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let deps = exe.parent().map(PathBuf::from).unwrap_or_default();
    if deps.ends_with("deps") {
        deps.parent().map(PathBuf::from).unwrap_or(deps)
    } else {
        deps
    }
}

/// A workspace binary of this build, by name (`mycni`, `mycni-agent`,
/// `mycni-lab`, `mycni-apiserver`). It may not exist: callers that run it
/// say so (see [`missing`]).
pub fn bin(name: &str) -> PathBuf {
    bin_dir().join(name)
}

/// The binaries a lab runs, from this build.
pub fn bins() -> Bins {
    Bins {
        agent: bin("mycni-agent"),
        plugin: bin("mycni"),
        apiserver: bin("mycni-apiserver"),
        lab: bin("mycni-lab"),
    }
}

/// The binaries in `paths` that are not built, as one error naming them
/// and the command that builds them; `Ok` when all exist.
pub fn missing(paths: &[&std::path::Path]) -> anyhow::Result<()> {
    let absent: Vec<String> = paths
        .iter()
        .filter(|p| !p.exists())
        .map(|p| p.display().to_string())
        .collect();
    if absent.is_empty() {
        return Ok(());
    }
    anyhow::bail!(
        "{} not built: run the suite with `cargo xtask test`, or `cargo build --workspace --exclude mycni-ebpf --bins` first",
        absent.join(", ")
    )
}
