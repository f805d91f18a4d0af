//! `cargo xtask lab` and `cargo xtask soak`: the local multi-node cluster,
//! its benchmark and its soak (see tests/lab/src/lib.rs).
//!
//! xtask builds what they run and hands its arguments, as they are, to the
//! internal `mycni-lab` binary, which declares every flag (and whose help
//! `cargo xtask lab --help` shows): the lab tests drive the same code, and a
//! flag or a default lives in one place.

use std::path::PathBuf;

use anyhow::{Result, bail};

use crate::util::{Cmd, workspace_root};
use crate::{HOST_TOOLCHAIN, setup};

/// mycni-lab's commands, as far as xtask needs to know them: what to build
/// first.
const LAB_COMMANDS: [&str; 10] = [
    "up", "test", "status", "down", "pod", "table", "netpol", "bench", "soak", "help",
];

/// What a `cargo xtask lab` command line needs built before it runs.
#[derive(Debug, PartialEq, Eq)]
enum Build {
    /// The eBPF object (which the agent embeds), then every release binary
    /// a lab runs: anything that brings up a lab.
    Everything,
    /// Only `mycni-lab`, and only when it is missing: help.
    LabIfMissing,
    /// Nothing: the command works on a lab brought up earlier, with the
    /// binaries it was brought up with.
    Nothing,
}

/// The first of `args` that names a mycni-lab command; none means the
/// default, up then test. Flag values never collide with a command's name
/// (numbers, `ebpf`/`kernel`, `true`/`false`, paths).
fn build_for(args: &[String]) -> Build {
    if args.iter().any(|a| a == "--help" || a == "-h") {
        return Build::LabIfMissing;
    }
    match args
        .iter()
        .find(|a| LAB_COMMANDS.contains(&a.as_str()))
        .map(String::as_str)
    {
        None | Some("up" | "bench" | "soak") => Build::Everything,
        Some("help") => Build::LabIfMissing,
        Some(_) => Build::Nothing,
    }
}

fn lab_binary() -> PathBuf {
    workspace_root().join("target/release/mycni-lab")
}

/// `cargo xtask lab [ARGS]`: builds what the command needs, then runs
/// `mycni-lab ARGS`.
pub fn run(args: &[String]) -> Result<()> {
    prepare(build_for(args))?;
    lab_command(args).run_interruptible()
}

/// `cargo xtask soak [ARGS]`: `mycni-lab soak ARGS`, after building.
pub fn soak(args: &[String]) -> Result<()> {
    let mut full = vec!["soak".to_string()];
    full.extend(args.iter().cloned());
    run(&full)
}

fn prepare(build: Build) -> Result<()> {
    let lab = lab_binary();
    match build {
        Build::Everything => {
            setup::run()?;
            // The agent embeds the object at build time: without it every
            // node would come up on the kernel path, and the bench and the
            // soak measure the fast path.
            crate::build_ebpf()?;
            build_release()
        }
        Build::LabIfMissing if !lab.exists() => {
            setup::run()?;
            Cmd::new("cargo")
                .args(["build", "--release", "--locked", "--package", "mycni-lab"])
                .args(["--bin", "mycni-lab"])
                .toolchain(HOST_TOOLCHAIN)
                .cwd(&workspace_root())
                .run()
        }
        Build::LabIfMissing | Build::Nothing => {
            if !lab.exists() {
                bail!(
                    "{} is missing: `cargo xtask lab` builds it (and brings a lab up)",
                    lab.display()
                );
            }
            Ok(())
        }
    }
}

/// `mycni-lab ARGS`, with the reports' default places in target/ (the
/// binary's `--out` flags read them from the environment).
fn lab_command(args: &[String]) -> Cmd {
    let root = workspace_root();
    Cmd::new(&lab_binary().to_string_lossy())
        .args(args)
        .env("MYCNI_LAB_BENCH_OUT", root.join("target/lab-bench.md"))
        .env("MYCNI_LAB_SOAK_OUT", root.join("target/soak.md"))
}

pub fn build_release() -> Result<()> {
    Cmd::new("cargo")
        .args(["build", "--release", "--locked"])
        .args(["--package", "mycni-agent", "--package", "mycni-plugin"])
        .args(["--package", "mycni-lab", "--package", "mycni-apiserver"])
        .arg("--bins")
        .toolchain(HOST_TOOLCHAIN)
        .cwd(&workspace_root())
        .run()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(line: &str) -> Build {
        let args: Vec<String> = line.split_whitespace().map(String::from).collect();
        build_for(&args)
    }

    #[test]
    fn what_a_command_line_builds() {
        assert_eq!(build(""), Build::Everything);
        assert_eq!(build("--datapath kernel"), Build::Everything);
        assert_eq!(
            build("--nodes 2 up --direct-routing true"),
            Build::Everything
        );
        assert_eq!(build("bench --runs 1 --seconds 1"), Build::Everything);
        assert_eq!(build("soak"), Build::Everything);
        assert_eq!(build("down"), Build::Nothing);
        assert_eq!(build("--nodes 4 status"), Build::Nothing);
        assert_eq!(build("test"), Build::Nothing);
        assert_eq!(build("pod add --namespace x --name d"), Build::Nothing);
        assert_eq!(build("table --node-rows"), Build::Nothing);
        assert_eq!(build("--help"), Build::LabIfMissing);
        assert_eq!(build("bench -h"), Build::LabIfMissing);
        assert_eq!(build("help bench"), Build::LabIfMissing);
    }
}
