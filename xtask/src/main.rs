//! `cargo xtask`: the developer entry point of mycni.
//!
//! xtask builds with the machine's stock stable toolchain (it is what installs
//! the pinned ones), and runs every other cargo command with an explicit
//! `RUSTUP_TOOLCHAIN`, so a fresh machine needs nothing but `cargo xtask ...`.

mod docs;
mod fuzz;
mod kernels;
mod lab;
mod setup;
mod shape;
mod util;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use std::collections::BTreeSet;

use clap::{CommandFactory, Parser, Subcommand};

use crate::util::{Cmd, workspace_root};

/// Toolchain for the host crates: aya 0.16 declares rust-version 1.98.
pub const HOST_TOOLCHAIN: &str = "1.98.0";
/// Nightly for the eBPF crate. Its LLVM major (22) must match bpf-linker's;
/// nightlies from mid-August 2026 on use LLVM 23 and fail with "Invalid record".
pub const EBPF_TOOLCHAIN: &str = "nightly-2026-07-01";
pub const EBPF_TARGET: &str = "bpfel-unknown-none";

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "mycni developer tasks",
    version
)]
struct Cli {
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install what the build and tests need and is missing (Debian packages,
    /// Rust toolchains, bpf-linker built against LLVM 22), mount bpffs.
    /// Idempotent: a second run only checks.
    Setup,
    /// Build the eBPF object (mycni-ebpf) for bpfel-unknown-none, with BTF.
    ///
    /// The object lands in target/ebpf/bpfel-unknown-none/release/mycni-ebpf,
    /// which mycni-agent embeds at build time.
    BuildEbpf {
        /// Accepted as before; there is one flavour, the optimised object
        /// the agent embeds. (A debug-assertions flavour no longer fit the
        /// verifier's 512-byte stack in `mycni_from_underlay`.)
        #[arg(long)]
        release: bool,
    },
    /// Build the CNI plugin as it ships (the image copies this binary):
    /// alone, so no other package's features reach its dependencies,
    /// statically linked and not position-independent, in target/plugin.
    ///
    /// The binary lands in target/plugin/<arch>-unknown-linux-musl/release/
    /// mycni; `bench plugin` measures it.
    BuildPlugin,
    /// The README's test command: setup, shape, docs, build-ebpf, fmt check, clippy
    /// (host crates, and the eBPF crate on its own target), then every test,
    /// including the privileged network-namespace tests, then every fuzz
    /// target for 15 s (skipped when `args` are given).
    Test {
        /// The inner loop, never the README's test command: shape, docs,
        /// fmt check, clippy and the unit tests of every crate (`--lib
        /// --bins`: no root, no end-to-end tests, no kernel matrix, no fuzzing).
        #[arg(long)]
        quick: bool,
        /// Extra arguments for `cargo test` (e.g. a test name filter).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The codebase's shape rules (ARCHITECTURE.md): no source file over
    /// 800 lines, no import cycle between sibling modules, the agent's
    /// `metrics` a sink. `test` runs it first.
    Shape,
    /// The pages' checks: every relative link in README.md, ARCHITECTURE.md
    /// and docs/*.md resolves (file and #anchor), every `cargo xtask`
    /// command they name exists, the README's test command is the one
    /// .ci/run runs, and the README stays under 250 lines. `test` runs it
    /// after `shape`.
    Docs,
    /// Runs the cargo-fuzz targets in fuzz/ (config, prevResult, CNI_ARGS,
    /// peer Node parsers), each for a fixed time from its committed seed
    /// corpus in fuzz/corpus/<target>, which it never writes. Fails on any
    /// crash and names the input (kept in fuzz/artifacts/<target>).
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 20)]
        seconds: u64,
        /// Build with AddressSanitizer (slower to build and run; the
        /// default build has no sanitizer).
        #[arg(long)]
        asan: bool,
        /// One target (cni_config, prev_result, cni_args, peer_node); all when absent.
        target: Option<String>,
    },
    /// Benchmarks that print figures side by side with the reference:
    /// `bench plugin`, `bench agent`, `bench datapath` (= `lab bench`),
    /// `bench policy`.
    /// Builds what the benchmark runs, then hands every argument to the
    /// bench binary: `cargo xtask bench --help` lists them.
    #[command(disable_help_flag = true)]
    Bench {
        /// `plugin|agent|datapath|policy [FLAGS]`, see `cargo xtask bench --help`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The local multi-node lab (node network namespaces running the real
    /// agent and plugin against a Kubernetes API fixture), its datapath
    /// benchmark (`lab bench`) and soak. Without a command: up, then the
    /// connectivity test. Builds what the command runs, then hands every
    /// argument to the lab binary: `cargo xtask lab --help` lists them.
    #[command(disable_help_flag = true)]
    Lab {
        /// `[FLAGS] [up|test|status|down|bench|soak] [FLAGS]`, see `cargo xtask lab --help`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The long reliability cases (~5 min): `cargo xtask lab soak`, see
    /// `cargo xtask soak --help`. Prints a table (also target/soak.md) and
    /// fails on any leak or broken flow.
    #[command(disable_help_flag = true)]
    Soak {
        /// Arguments for the soak, see `cargo xtask soak --help`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The tests on Debian's stock kernels (5.10, 6.1, 6.12), each booted
    /// under QEMU with the host's /usr and /etc and the workspace shared
    /// over 9p: fetches and caches the kernels, builds the test binaries,
    /// runs the entries of xtask/src/kernels.rs in every guest and prints a
    /// table (also target/kernels.md). See `cargo xtask kernels --help`.
    #[command(disable_help_flag = true)]
    Kernels {
        /// `[--kernel 5.10|6.1|6.12 ...] [--keep-logs] [-- LIBTEST ARGS]`,
        /// see `cargo xtask kernels --help`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Command::Setup => setup::run(),
        Command::BuildEbpf { release: _ } => build_ebpf().map(|_| ()),
        Command::BuildPlugin => build_plugin().map(|_| ()),
        Command::Test { quick: false, args } => test(&args),
        Command::Test { quick: true, args } => test_quick(&args),
        Command::Shape => shape::run(),
        Command::Docs => docs::run(),
        Command::Fuzz {
            seconds,
            asan,
            target,
        } => setup::run().and_then(|()| fuzz::run(seconds, target.as_deref(), asan)),
        Command::Bench { args } => bench(&args),
        Command::Lab { args } => lab::run(&args),
        Command::Soak { args } => lab::soak(&args),
        Command::Kernels { args } => kernels::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The chain says what failed; a backtrace of xtask itself never helps.
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The names of xtask's commands, for the pages' check that every
/// `cargo xtask <command>` they show exists.
pub fn subcommands() -> BTreeSet<String> {
    Cli::command()
        .get_subcommands()
        .map(|c| c.get_name().to_string())
        .collect()
}

/// Builds the eBPF object and checks that it carries BTF for the map types,
/// because `bpftool map dump` is only readable with it.
pub fn build_ebpf() -> Result<PathBuf> {
    let root = workspace_root();
    const PROFILE: &str = "release";
    // debuginfo + --btf: bpf-linker turns DWARF into BTF for maps and programs.
    let rustflags = [
        "--cfg=bpf_target_arch=\"x86_64\"",
        "-Cdebuginfo=2",
        "-Clink-arg=--btf",
    ]
    .join("\x1f");
    Cmd::new("cargo")
        .args(["build", "--package", "mycni-ebpf", "--bins", "--locked"])
        .args(["--target", EBPF_TARGET, "-Z", "build-std=core"])
        .args(["--profile", PROFILE])
        .arg("--target-dir")
        .arg(root.join("target/ebpf"))
        .toolchain(EBPF_TOOLCHAIN)
        .env("CARGO_ENCODED_RUSTFLAGS", &rustflags)
        .cwd(&root)
        .run()?;
    let object = ebpf_object(PROFILE);
    let btf = Cmd::new("bpftool")
        .args(["btf", "dump", "file"])
        .arg(&object)
        .output()
        .context("bpftool btf dump of the eBPF object")?;
    if !btf.contains("'PathCounter'") {
        bail!(
            "{} has no BTF for PathCounter: the map would dump as hex; is bpf-linker called with --btf?",
            object.display()
        );
    }
    eprintln!("xtask: built {} (BTF ok)", object.display());
    Ok(object)
}

pub fn ebpf_object(profile: &str) -> PathBuf {
    workspace_root()
        .join("target/ebpf")
        .join(EBPF_TARGET)
        .join(profile)
        .join("mycni-ebpf")
}

/// The target the plugin is built for: the host's architecture with musl,
/// named explicitly so its flags reach only the plugin's own crates, never
/// the build scripts and proc macros cargo compiles for the host.
///
/// musl, not glibc: a static glibc binary sizes the CPU's caches at start
/// (`init_cacheinfo`: dozens of `cpuid` instructions, each a trap to the
/// hypervisor in a VM), 0.38 ms of CPU for a static "hello" against musl's
/// 0.07 (`perf stat -r 300`, 2-CPU VM), paid by every ADD and DEL.
pub fn plugin_target() -> String {
    format!("{}-unknown-linux-musl", std::env::consts::ARCH)
}

/// Builds the plugin binary that ships, and returns its path.
///
/// The runtime starts the plugin once per verb and waits for it, so its
/// start-up is part of every ADD. Built with the workspace, the plugin's
/// dependencies get the agent's and the lab's features too (tokio's
/// multi-threaded scheduler, ...); built alone, with its own target dir,
/// they have only what the plugin asks for. Static (`crt-static`): no
/// dynamic loader, no shared libraries to map and relocate, and no
/// dependency on the glibc of the node it is copied to. Not
/// position-independent (`relocation-model=static`), as the Go reference
/// plugins are built: no relocations at start. A VERSION call took 0.77 ms
/// of CPU dynamically linked, 0.39 static-pie, 0.35 static (`perf stat -r
/// 300`, 2-CPU VM). One codegen unit with fat LTO: a smaller binary (3.3
/// MB, not 4.4) that faults in fewer pages (61 for an ADD, not 70) and
/// takes 4 % less CPU per ADD; opt-level "s" saved 3 more pages and
/// nothing measurable. On musl, whose own allocator cost ADD 0.25 ms of
/// CPU, with dlmalloc as the global allocator (`mycni-plugin`'s main.rs).
pub fn build_plugin() -> Result<PathBuf> {
    let root = workspace_root();
    let target = plugin_target();
    // Here as well as in `setup`: the image's builder runs only this.
    setup::rust_target(HOST_TOOLCHAIN, &target)?;
    Cmd::new("cargo")
        .args(["build", "--release", "--locked"])
        .args(["--package", "mycni-plugin", "--bins", "--target", &target])
        .args(["--config", "profile.release.lto=\"fat\""])
        .args(["--config", "profile.release.codegen-units=1"])
        .arg("--target-dir")
        .arg(root.join("target/plugin"))
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            ["-Ctarget-feature=+crt-static", "-Crelocation-model=static"].join("\x1f"),
        )
        .toolchain(HOST_TOOLCHAIN)
        .cwd(&root)
        .run()?;
    Ok(plugin_binary())
}

/// Where [`build_plugin`] leaves the plugin.
pub fn plugin_binary() -> PathBuf {
    workspace_root()
        .join("target/plugin")
        .join(plugin_target())
        .join("release/mycni")
}

fn test(extra: &[String]) -> Result<()> {
    let root = workspace_root();
    setup::run()?;
    shape::run()?;
    docs::run()?;
    build_ebpf()?;
    static_checks(&root)?;
    build_e2e_bins(&root)?;
    eprintln!("xtask: cargo test");
    Cmd::new("cargo")
        .args(["test", "--workspace", "--exclude", "mycni-ebpf", "--locked"])
        .args(extra)
        .toolchain(HOST_TOOLCHAIN)
        .cwd(&root)
        .run()?;
    if !extra.is_empty() {
        eprintln!(
            "xtask: the shipped plugin's run and fuzzing skipped (test arguments given); \
             `cargo xtask fuzz` runs the fuzzing"
        );
        return Ok(());
    }
    shipped_plugin_blackbox(&root)?;
    legacy_tc_datapath(&root)?;
    vendored_aya_patch(&root)?;
    // Debian's stock kernels under QEMU (~11 min on 2 cores under TCG):
    // the fast path where users run it, not only on this machine's kernel.
    kernels::run(&[])?;
    fuzz::run(fuzz::TEST_SECONDS, None, false)
}

/// `cargo xtask test --quick`: what needs neither root nor the eBPF
/// object, for the edit-build-test loop. The unit tests only (`--lib
/// --bins`, no doc-tests): every integration test binary is left to
/// `cargo xtask test`, which also runs what this does.
fn test_quick(extra: &[String]) -> Result<()> {
    let root = workspace_root();
    setup::run()?;
    shape::run()?;
    docs::run()?;
    static_checks(&root)?;
    eprintln!("xtask: cargo test --lib --bins (unit tests)");
    Cmd::new("cargo")
        .args(["test", "--workspace", "--exclude", "mycni-ebpf", "--locked"])
        .args(["--lib", "--bins"])
        .args(extra)
        .toolchain(HOST_TOOLCHAIN)
        .cwd(&root)
        .run()?;
    eprintln!("xtask: quick pass done; `cargo xtask test` runs everything");
    Ok(())
}

/// fmt check and clippy, the host crates' and the eBPF crate's.
fn static_checks(root: &std::path::Path) -> Result<()> {
    eprintln!("xtask: cargo fmt --check");
    Cmd::new("cargo")
        .args(["fmt", "--all", "--check"])
        .toolchain(HOST_TOOLCHAIN)
        .cwd(root)
        .run()?;
    // The fuzz crate is its own workspace, so `cargo fmt --all` misses it.
    Cmd::new("cargo")
        .args(["fmt", "--check", "--manifest-path"])
        .arg(root.join("fuzz/Cargo.toml"))
        .toolchain(HOST_TOOLCHAIN)
        .cwd(root)
        .run()?;
    eprintln!("xtask: clippy (host crates)");
    Cmd::new("cargo")
        .args(["clippy", "--workspace", "--exclude", "mycni-ebpf"])
        .args(["--all-targets", "--locked", "--", "-D", "warnings"])
        // Pedantic, so named: a function taking several bools is asked
        // for a struct or an enum (clippy.toml caps parameters at 5).
        .args(["-D", "clippy::fn_params_excessive_bools"])
        .toolchain(HOST_TOOLCHAIN)
        .cwd(root)
        .run()?;
    eprintln!("xtask: clippy (mycni-ebpf on {EBPF_TARGET})");
    Cmd::new("cargo")
        .args(["clippy", "--package", "mycni-ebpf", "--locked"])
        .args(["--target", EBPF_TARGET, "-Z", "build-std=core", "--release"])
        .arg("--target-dir")
        .arg(root.join("target/ebpf"))
        .args(["--", "-D", "warnings"])
        .toolchain(EBPF_TOOLCHAIN)
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            "--cfg=bpf_target_arch=\"x86_64\"",
        )
        .cwd(root)
        .run()
}

/// The tests of the fast path whose agents attach through TCX, again
/// with the legacy tc attach (clsact + cls_bpf) forced: Debian 12's 6.1
/// has no TCX, and the kernel matrix runs one lab there, not these.
///
/// Modules of the `datapath` test binaries (tests/e2e/tests/datapath, and
/// mycni-agent/tests/datapath for `fastpath6`), each given to libtest as
/// the filter `<module>::`: a test's name starts with its module's, and no
/// other module of those binaries has a name ending in one of these (a
/// unit test below holds that).
const DATAPATH_TEST_BINARY: &str = "datapath";
const DATAPATH_TESTS: &[&str] = &[
    "fastpath",
    "fastpath6",
    "agent_fastpath6",
    "datapath_v2",
    "legacy_tc",
];

fn legacy_tc_datapath(root: &std::path::Path) -> Result<()> {
    eprintln!("xtask: the datapath tests again with MYCNI_TC_ATTACH=legacy");
    // Selected with the workspace's packages, as `cargo test` built them,
    // so nothing is built again.
    Cmd::new("cargo")
        .args(["test", "--workspace", "--exclude", "mycni-ebpf", "--locked"])
        .args(["--test", DATAPATH_TEST_BINARY, "--"])
        .args(DATAPATH_TESTS.iter().map(|m| format!("{m}::")))
        .env("MYCNI_TC_ATTACH", "legacy")
        .toolchain(HOST_TOOLCHAIN)
        .cwd(root)
        .run()
}

/// The unit tests of mycni's patch of aya (third_party/aya/MYCNI-PATCH.md),
/// against aya's own published lock, in a target dir of their own.
fn vendored_aya_patch(root: &std::path::Path) -> Result<()> {
    eprintln!("xtask: the vendored aya's patch tests");
    Cmd::new("cargo")
        .args(["test", "--locked", "--lib", "--manifest-path"])
        .arg(root.join("third_party/aya/Cargo.toml"))
        .arg("--target-dir")
        .arg(root.join("target/third_party"))
        .arg("mycni_patch")
        .toolchain(HOST_TOOLCHAIN)
        .cwd(root)
        .run()
}

/// The end-to-end tests (mycni-e2e) run mycni-agent, mycni, mycni-lab and
/// mycni-apiserver as processes and find them next to their own
/// executable; cargo builds another package's binaries only for that
/// package's own tests.
pub fn build_e2e_bins(root: &std::path::Path) -> Result<()> {
    eprintln!("xtask: building the binaries the end-to-end tests run");
    Cmd::new("cargo")
        .args(["build", "--workspace", "--exclude", "mycni-ebpf"])
        .args(["--bins", "--locked"])
        .toolchain(HOST_TOOLCHAIN)
        .cwd(root)
        .run()
}

/// The plugin's black-box suite once more, against the binary the image
/// ships: `cargo test` ran it on a debug build for glibc, and the shipped
/// one is built another way (musl, static, dlmalloc, fat LTO, no PIE).
/// ~50 s on a fresh tree, the suite 5 of them. Selected with the
/// workspace's packages, as `cargo test` built it: `--package mycni-plugin`
/// alone unifies other features and builds the suite a second time.
fn shipped_plugin_blackbox(root: &std::path::Path) -> Result<()> {
    let shipped = build_plugin()?;
    eprintln!(
        "xtask: the plugin's black-box tests against the shipped build ({})",
        shipped.display()
    );
    Cmd::new("cargo")
        .args(["test", "--workspace", "--exclude", "mycni-ebpf"])
        .args(["--test", "blackbox", "--locked"])
        .env("MYCNI_TEST_PLUGIN", &shipped)
        .toolchain(HOST_TOOLCHAIN)
        .cwd(root)
        .run()
}

/// `cargo xtask bench ARGS`: builds what the named benchmark runs (all of
/// the lab's binaries and the eBPF object for `datapath`, which is `lab
/// bench`, and for `policy` and `policy-scale`), then runs `mycni-bench
/// ARGS`, which owns the flags.
fn bench(args: &[String]) -> Result<()> {
    let root = workspace_root();
    let which = args
        .iter()
        .find(|a| !a.starts_with('-'))
        .map(String::as_str);
    if which == Some("datapath") {
        let mut lab_args = vec!["bench".to_string()];
        lab_args.extend(args.iter().filter(|a| *a != "datapath").cloned());
        return lab::run(&lab_args);
    }
    setup::run()?;
    if matches!(which, Some("policy" | "policy-scale")) {
        // A lab of its own on the fast path: the agent embeds the eBPF
        // object at build time, and every lab binary runs. The lab's build
        // has mycni-bench too; building it again alone would unify other
        // features and recompile half the dependencies (6 min), so its
        // --help goes the same way and costs nothing once the lab is built.
        build_ebpf()?;
        lab::build_release()?;
    } else {
        build_bench(which, &root)?;
    }
    // Each report (and its chart beside it) lands in target/, as `lab
    // bench`'s does.
    Cmd::new(&root.join("target/release/mycni-bench").to_string_lossy())
        .args(args)
        .env("MYCNI_BENCH_PLUGIN", plugin_binary())
        .env(
            "MYCNI_BENCH_PLUGIN_OUT",
            root.join("target/bench-plugin.md"),
        )
        .env("MYCNI_BENCH_AGENT_OUT", root.join("target/bench-agent.md"))
        .env(
            "MYCNI_BENCH_POLICY_OUT",
            root.join("target/bench-policy.md"),
        )
        .env(
            "MYCNI_BENCH_POLICY_SCALE_OUT",
            root.join("target/bench-policy-scale.md"),
        )
        .run_interruptible()
}

/// `mycni-bench` and what the `plugin` or `agent` bench runs. The plugin
/// bench measures the plugin that ships ([`build_plugin`]), not one built
/// beside the lab, whose features would reach its dependencies.
fn build_bench(which: Option<&str>, root: &std::path::Path) -> Result<()> {
    let what: &[&str] = match which {
        Some("plugin") => {
            build_plugin()?;
            &["--bin", "mycni-bench"]
        }
        Some("agent") => &[
            "--package",
            "mycni-agent",
            "--package",
            "mycni-apiserver",
            "--bins",
        ],
        _ => &["--bin", "mycni-bench"],
    };
    Cmd::new("cargo")
        .args(["build", "--release", "--locked", "--package", "mycni-lab"])
        .args(what)
        .toolchain(HOST_TOOLCHAIN)
        .cwd(root)
        .run()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `mod x;` lines of a test binary's main.rs.
    fn modules(main_rs: &str) -> Vec<String> {
        let path = workspace_root().join(main_rs);
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(!text.is_empty(), "{} unreadable", path.display());
        text.lines()
            .filter_map(|l| l.strip_prefix("mod ")?.strip_suffix(';'))
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn the_legacy_pass_filters_select_exactly_its_modules() {
        let all: Vec<String> = [
            "tests/e2e/tests/datapath/main.rs",
            "mycni-agent/tests/datapath/main.rs",
        ]
        .iter()
        .flat_map(|m| modules(m))
        .collect();
        for wanted in DATAPATH_TESTS {
            assert!(all.iter().any(|m| m == wanted), "no module {wanted}");
        }
        // `<m>::` also matches the tests of every module whose name ends
        // in `m`: those must be wanted too.
        for m in &all {
            if DATAPATH_TESTS.iter().any(|w| m.ends_with(w)) {
                assert!(DATAPATH_TESTS.contains(&m.as_str()), "{m} matched");
            }
        }
    }
}
