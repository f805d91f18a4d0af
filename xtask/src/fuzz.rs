//! `cargo xtask fuzz`: every cargo-fuzz target in `fuzz/` for a fixed time,
//! starting from its committed seed corpus.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::EBPF_TOOLCHAIN;
use crate::util::{Cmd, workspace_root};

/// The targets in `fuzz/fuzz_targets/`, each with a seed corpus in
/// `fuzz/corpus/<target>/`.
pub const TARGETS: &[&str] = &["cni_config", "prev_result", "cni_args", "peer_node"];

/// cargo-fuzz builds with a nightly (`-Zsanitizer`); the eBPF crate's, which setup
/// installs, so no other toolchain has to be downloaded.
pub const FUZZ_TOOLCHAIN: &str = EBPF_TOOLCHAIN;

/// Seconds per target in `cargo xtask test`.
pub const TEST_SECONDS: u64 = 15;

/// Runs `only` (or every target) for `seconds` each, built without a
/// sanitizer unless `asan`. The parsers are safe Rust, where
/// AddressSanitizer finds little, and without it the build takes ~90 s
/// instead of ~125 s here and the targets run 4-6 times as many inputs per
/// second; `--asan` builds (once, into its own target directory) with it.
///
/// The committed corpus is read, never written: libFuzzer writes what it
/// finds to the first corpus directory, a scratch one under `fuzz/target/`.
/// A crash (panic, failed invariant, sanitizer report, timeout) fails the
/// run after the other targets have had their turn, naming the input.
pub fn run(seconds: u64, only: Option<&str>, asan: bool) -> Result<()> {
    let targets: Vec<&str> = match only {
        None => TARGETS.to_vec(),
        Some(t) if TARGETS.contains(&t) => vec![t],
        Some(t) => bail!(
            "no fuzz target {t:?}; the targets are {}",
            TARGETS.join(", ")
        ),
    };
    let root = workspace_root();
    let fuzz = root.join("fuzz");
    // The same flags for build and run, or `cargo fuzz run` rebuilds.
    let (sanitizer, target_dir) = if asan {
        ("address", fuzz.join("target/asan"))
    } else {
        ("none", fuzz.join("target/plain"))
    };
    let flags = |cmd: Cmd| {
        cmd.args(["--sanitizer", sanitizer])
            .arg("--target-dir")
            .arg(&target_dir)
    };
    let started = Instant::now();
    eprintln!("xtask: building the fuzz targets ({FUZZ_TOOLCHAIN}, sanitizer: {sanitizer})");
    flags(Cmd::new("cargo").args(["fuzz", "build"]))
        .toolchain(FUZZ_TOOLCHAIN)
        .cwd(&root)
        .run()?;
    eprintln!(
        "xtask: fuzz targets built in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let mut failed = Vec::new();
    for target in targets {
        let seeds = fuzz.join("corpus").join(target);
        if !seeds.is_dir() {
            bail!(
                "{} is missing: every target has a committed seed corpus",
                seeds.display()
            );
        }
        let scratch = fuzz.join("target/corpus").join(target);
        if scratch.exists() {
            std::fs::remove_dir_all(&scratch)
                .with_context(|| format!("removing {}", scratch.display()))?;
        }
        std::fs::create_dir_all(&scratch)
            .with_context(|| format!("creating {}", scratch.display()))?;
        // cargo-fuzz's artifact directory; listed before and after to name
        // what this run wrote.
        let artifacts = fuzz.join("artifacts").join(target);
        let before = files(&artifacts);
        eprintln!(
            "xtask: fuzz {target} for {seconds} s (seeds: {})",
            seeds.display()
        );
        let outcome = flags(Cmd::new("cargo").args(["fuzz", "run"]))
            .arg(target)
            .arg(&scratch)
            .arg(&seeds)
            .arg("--")
            .arg(format!("-max_total_time={seconds}"))
            // A parser taking 10 s on one input is a bug too.
            .arg("-timeout=10")
            .args(["-verbosity=0", "-print_final_stats=1"])
            .toolchain(FUZZ_TOOLCHAIN)
            .cwd(&root)
            .run();
        if let Err(e) = outcome {
            let found: Vec<PathBuf> = files(&artifacts).difference(&before).cloned().collect();
            if found.is_empty() {
                eprintln!("xtask: fuzz {target} FAILED ({e:#}) without writing an input");
            }
            for f in &found {
                eprintln!(
                    "xtask: fuzz {target} FAILED on {}\n       reproduce: cargo +{FUZZ_TOOLCHAIN} fuzz run --sanitizer {sanitizer} {target} {}",
                    f.display(),
                    f.display()
                );
            }
            failed.push(target);
        }
    }
    if !failed.is_empty() {
        bail!("fuzz targets failed: {}", failed.join(", "));
    }
    eprintln!(
        "xtask: fuzzing done in {:.0} s, no crash",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn files(dir: &Path) -> BTreeSet<PathBuf> {
    std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default()
}
