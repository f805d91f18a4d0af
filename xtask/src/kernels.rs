//! `cargo xtask kernels`: the project's tests on Debian's stock kernels,
//! each booted under QEMU, one table at the end.
//!
//! For each kernel of the matrix ([`SERIES`]): the newest Debian package of
//! its series, fetched once into a cache (`fetch`), a busybox initramfs that
//! mounts 9p (`initramfs`), and one boot (`guest`) in which the test
//! binaries built here on the host run in a chroot of the host's /usr (and
//! /etc, through an overlay), with the workspace at its own path, so
//! compiled-in paths hold. The guest prints markers on its serial console;
//! `report` reads them and libtest's summaries into the table
//! (target/kernels.md).
//!
//! Under TCG (no usable KVM on the development machines) a guest is about
//! 5-10 times slower than the host: kernels run one at a time, each booted
//! once for every entry of [`ENTRIES`].

mod fetch;
mod guest;
mod initramfs;
mod json;
mod report;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;

use crate::util::{Cmd, workspace_root};
use crate::{HOST_TOOLCHAIN, setup};

use self::guest::Job;
use self::report::KernelRun;

/// One test run of every guest: a test binary and its arguments.
struct Entry {
    /// Its name in the table and in the guest's markers.
    name: &'static str,
    package: &'static str,
    /// The test target: tests/<target>/main.rs of the package.
    target: &'static str,
    /// Arguments for the test binary: the module filter first.
    args: &'static [&'static str],
}

/// What every guest runs, in order, each with `--test-threads=1` from its
/// package's directory. The guest sees the whole workspace, but runs only
/// the binaries named here (`build` builds no other test binary).
const ENTRIES: &[Entry] = &[
    // The loader against each kernel's BTF: kfuncs in vmlinux or in
    // nf_conntrack's module BTF (and that vmlinux alone fails there), and
    // the verifier's instruction counts.
    Entry {
        name: "kfunc_module",
        package: "mycni-agent",
        target: "datapath",
        args: &["kfunc_module::", "--nocapture"],
    },
    // BPF_PROG_TEST_RUN verdicts of the tc programs: each kernel's
    // kfuncs and verifier. Not the cost measurements (`#[ignore]`d
    // everywhere, run by the benches): under TCG they measure QEMU.
    Entry {
        name: "ebpf_prog",
        package: "mycni-agent",
        target: "datapath",
        args: &["ebpf_prog::", "--skip", "flow_cost::"],
    },
    // Two nodes with agents holding the DaemonSet's capabilities, dual
    // stack, counters from the pins, a NetworkPolicy on the fast path.
    Entry {
        name: "kernel_matrix",
        package: "mycni-e2e",
        target: "lab",
        args: &["kernel_matrix::", "--nocapture"],
    },
];

/// The kernels: (the `--kernel` name, the package's name with `*` for its
/// digits). The std flavour: the cloud ones have no 9p.
const SERIES: &[(&str, &str)] = &[
    // Debian 11, bullseye main: no conntrack kfuncs (5.18 added them).
    ("5.10", "linux-image-5.10.0-*-amd64-unsigned"),
    // Debian 12, bookworm and bookworm-security.
    ("6.1", "linux-image-6.1.0-*-amd64-unsigned"),
    // bookworm-security's linux-6.12: tcx and netkit.
    ("6.12", "linux-image-6.12.*+deb12-amd64-unsigned"),
];

/// Columns of per-kernel facts: (header, key of a `MYCNI-FACT key=value`
/// line on the guest's console). The guest's /init prints those below;
/// a test may print its own.
const FACT_COLUMNS: &[(&str, &str)] = &[
    ("datapath", "datapath"),
    ("attach", "attach"),
    ("kfuncs", "kfuncs"),
    ("IPv4 fast_encap / fast_tc_decap", "ipv4_fast"),
    ("IPv6 fast_encap / fast_tc_decap", "ipv6_fast"),
    ("policy deny / allow ms", "policy_ms"),
    ("verified insns from_pod / from_underlay", "insns"),
    ("tcx (config)", "tcx_config"),
    ("nf_conntrack at start / after", "conntrack"),
];

/// Default hard limit per kernel, boot to power-off. The 6.1 guest needs
/// ~80 s for ebpf_prog on a loaded 2-CPU host; this leaves room for many
/// more entries.
const DEFAULT_TIMEOUT_S: u64 = 15 * 60;

#[derive(Parser, Debug)]
#[command(
    name = "cargo xtask kernels",
    about = "Boots Debian's stock kernels under QEMU and runs the test binaries of ENTRIES \
             (xtask/src/kernels.rs) in each; prints a table (also target/kernels.md). \
             Kernels are cached in ~/.cache/mycni/kernels (MYCNI_KERNEL_CACHE)."
)]
struct Args {
    /// A kernel series to run (5.10, 6.1, 6.12); repeat for more. All when absent.
    #[arg(long = "kernel", value_name = "SERIES")]
    kernels: Vec<String>,
    /// Keep each kernel's console log, initramfs and script in
    /// target/kernels-run/<series>/ (a failed kernel's log and script are
    /// kept anyway).
    #[arg(long)]
    keep_logs: bool,
    /// Seconds one kernel may take, boot to power-off, before QEMU is killed.
    #[arg(long, default_value_t = DEFAULT_TIMEOUT_S)]
    timeout: u64,
    /// Update the private apt index even when it is recent.
    #[arg(long)]
    refresh: bool,
    /// Show the whole console of each guest, not only markers and test lines.
    #[arg(long, short)]
    verbose: bool,
    /// Arguments for every test binary (after `--`), e.g. a test name filter.
    #[arg(last = true)]
    libtest: Vec<String>,
}

/// `cargo xtask kernels ARGS`.
pub fn run(args: &[String]) -> Result<()> {
    let args = Args::parse_from(
        std::iter::once("cargo xtask kernels".to_string()).chain(with_separator(args)),
    );
    let series = selected(&args.kernels)?;
    let root = workspace_root();
    setup::run()?;
    // The agent embeds the object at build time; without it ebpf_prog has
    // nothing to load.
    crate::build_ebpf()?;
    let jobs = build(&root, &args.libtest)?;
    let names: Vec<String> = jobs.iter().map(|j| j.name.clone()).collect();

    let cache = fetch::cache_dir()?;
    std::fs::create_dir_all(&cache).with_context(|| format!("creating {}", cache.display()))?;
    let mut apt = fetch::Apt::new(&cache);
    let mut runs = Vec::new();
    for (key, pattern) in series {
        let mut run = KernelRun {
            key: key.to_string(),
            ..KernelRun::default()
        };
        let matrix = Matrix {
            root: &root,
            cache: &cache,
            jobs: &jobs,
            args: &args,
        };
        if let Err(e) = one_kernel(&mut run, &mut apt, pattern, &matrix) {
            run.problem = Some(format!("{e:#}"));
        }
        let scratch = scratch_dir(&root, key);
        if args.keep_logs || run.failure(&names).is_some() {
            let log = scratch.join("console.log");
            run.log = log.exists().then(|| log.display().to_string());
            if !args.keep_logs {
                // Rebuilt from the cache in a second by the next run.
                let _ = std::fs::remove_file(scratch.join("initramfs.cpio"));
            }
        } else {
            let _ = std::fs::remove_dir_all(&scratch);
        }
        runs.push(run);
    }
    let _ = std::fs::remove_dir(root.join("target/kernels-run"));

    let table = report::table(&runs, &names, FACT_COLUMNS);
    let failures = report::failures(&runs);
    println!("\n{table}");
    if !failures.is_empty() {
        println!("{failures}");
    }
    let out = root.join("target/kernels.md");
    let md = format!("# cargo xtask kernels\n\n{table}\n{failures}");
    std::fs::write(&out, md).with_context(|| format!("writing {}", out.display()))?;
    eprintln!("xtask kernels: table in {}", out.display());
    let failed: Vec<&str> = runs
        .iter()
        .filter(|r| r.failure(&names).is_some())
        .map(|r| r.key.as_str())
        .collect();
    if !failed.is_empty() {
        bail!("failed on kernel(s) {}", failed.join(", "));
    }
    Ok(())
}

/// `args` with the `--` that xtask's own parser takes when it comes first
/// (`cargo xtask kernels -- --exact x`): the process' command line still
/// has it, and without it libtest's flags would be taken for ours.
fn with_separator(args: &[String]) -> Vec<String> {
    let raw: Vec<String> = std::env::args()
        .skip(1)
        .skip_while(|a| a != "kernels")
        .skip(1)
        .collect();
    if raw.first().is_some_and(|a| a == "--") && raw[1..] == *args {
        raw
    } else {
        args.to_vec()
    }
}

/// The series `--kernel` names, in the matrix's order; all without any.
fn selected(wanted: &[String]) -> Result<Vec<(&'static str, &'static str)>> {
    for w in wanted {
        if !SERIES.iter().any(|(k, _)| k == w) {
            let known: Vec<&str> = SERIES.iter().map(|(k, _)| *k).collect();
            bail!("no kernel series {w}: one of {}", known.join(", "));
        }
    }
    Ok(SERIES
        .iter()
        .filter(|(k, _)| wanted.is_empty() || wanted.iter().any(|w| w == k))
        .copied()
        .collect())
}

fn scratch_dir(root: &Path, key: &str) -> PathBuf {
    root.join("target/kernels-run").join(key)
}

/// What every kernel of a run shares.
struct Matrix<'a> {
    /// The workspace, shared with the guest at its own path.
    root: &'a Path,
    /// The kernel cache.
    cache: &'a Path,
    jobs: &'a [Job],
    args: &'a Args,
}

/// Fetches (or finds) the kernel of `pattern`, boots it with the matrix's
/// jobs, and fills in `run`.
fn one_kernel(
    run: &mut KernelRun,
    apt: &mut fetch::Apt,
    pattern: &str,
    matrix: &Matrix,
) -> Result<()> {
    let Matrix {
        root,
        cache,
        jobs,
        args,
    } = *matrix;
    let package = match apt
        .ensure_index(args.refresh)
        .and_then(|()| apt.resolve(pattern))
    {
        Ok(p) => p,
        // Offline with no usable index: the newest kernel already cached.
        Err(e) => fetch::newest_cached(cache, pattern).ok_or(e)?,
    };
    run.package = Some(package.clone());
    let kernel = fetch::kernel(apt, cache, &package, pattern)?;

    let scratch = scratch_dir(root, &run.key);
    if scratch.exists() {
        std::fs::remove_dir_all(&scratch)?;
    }
    std::fs::create_dir_all(&scratch).with_context(|| format!("creating {}", scratch.display()))?;
    let initrd = scratch.join("initramfs.cpio");
    initramfs::build(&kernel, &initrd)?;
    let script = scratch.join("run.sh");
    std::fs::write(&script, guest::run_script(jobs))?;
    let log = scratch.join("console.log");
    eprintln!(
        "xtask kernels: booting {} ({}), console in {}",
        kernel.package,
        kernel.version,
        log.display()
    );
    let console = guest::boot(&guest::Boot {
        label: &run.key,
        vmlinuz: &kernel.vmlinuz,
        initrd: &initrd,
        kernel_dir: &kernel.dir,
        workspace: root,
        script: &script,
        log: &log,
        timeout: Duration::from_secs(args.timeout),
        verbose: args.verbose,
    })?;
    run.wall = Some(console.wall.as_secs_f64());
    run.guest = Some(report::parse(&console.lines));
    match console.exit {
        guest::Exit::TimedOut => bail!("killed after the {} s timeout", args.timeout),
        guest::Exit::Status(s) if !s.success() => bail!("qemu exited with {s}"),
        guest::Exit::Status(_) => Ok(()),
    }
}

/// Builds what the guests run, as `cargo xtask test` builds it (same
/// toolchain, packages and flags, so a full test run and this share every
/// artifact), and finds each entry's test binary.
fn build(root: &Path, libtest: &[String]) -> Result<Vec<Job>> {
    crate::build_e2e_bins(root)?;
    let test: Vec<String> = ["test", "--workspace", "--exclude", "mycni-ebpf"]
        .into_iter()
        .chain(["--locked", "--no-run"])
        .map(str::to_string)
        .chain(test_targets().flat_map(|t| ["--test".to_string(), t.to_string()]))
        .collect();
    eprintln!("xtask kernels: building the test binaries");
    Cmd::new("cargo")
        .args(&test)
        .toolchain(HOST_TOOLCHAIN)
        .cwd(root)
        .run()?;
    // Again, built: only to read where cargo put each binary.
    let messages = Cmd::new("cargo")
        .args(&test)
        .arg("--message-format=json")
        .toolchain(HOST_TOOLCHAIN)
        .cwd(root)
        .output()?;
    let artifacts = test_artifacts(&messages);
    let mut jobs = Vec::new();
    for Entry {
        name,
        package,
        target,
        args: filter,
    } in ENTRIES
    {
        let Some(a) = artifacts
            .iter()
            .find(|a| a.package == *package && a.target == *target)
        else {
            bail!("cargo built no test binary {target} of package {package}");
        };
        if !a.executable.starts_with(root) {
            bail!(
                "{} is outside the workspace, which is all the guest sees",
                a.executable.display()
            );
        }
        let mut args: Vec<String> = filter.iter().map(|s| s.to_string()).collect();
        args.extend(libtest.iter().cloned());
        jobs.push(Job {
            name: job_name(name, &jobs),
            manifest_dir: a.manifest_dir.clone(),
            package: a.package.clone(),
            executable: a.executable.clone(),
            args,
        });
    }
    Ok(jobs)
}

/// The test targets of [`ENTRIES`], each once, in order.
fn test_targets() -> impl Iterator<Item = &'static str> {
    ENTRIES
        .iter()
        .enumerate()
        .filter(|(i, e)| !ENTRIES[..*i].iter().any(|x| x.target == e.target))
        .map(|(_, e)| e.target)
}

/// The entry's name in the table, numbered when an earlier entry has the
/// same. Shell-safe: it goes into the guest's script unquoted.
fn job_name(name: &str, earlier: &[Job]) -> String {
    let base: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut name = base.clone();
    let mut n = 1;
    while earlier.iter().any(|j| j.name == name) {
        n += 1;
        name = format!("{base}-{n}");
    }
    name
}

/// A test binary cargo built.
#[derive(Debug, PartialEq)]
struct Artifact {
    package: String,
    target: String,
    executable: PathBuf,
    manifest_dir: PathBuf,
}

/// The test binaries in cargo's `--message-format=json` output.
fn test_artifacts(messages: &str) -> Vec<Artifact> {
    messages
        .lines()
        .filter(|l| l.starts_with('{'))
        .filter_map(|l| json::parse(l).ok())
        .filter(|m| m.get("reason").and_then(json::Value::as_str) == Some("compiler-artifact"))
        .filter(|m| {
            m.get("profile")
                .and_then(|p| p.get("test"))
                .and_then(json::Value::as_bool)
                == Some(true)
        })
        .filter_map(|m| {
            let manifest = PathBuf::from(m.get("manifest_path")?.as_str()?);
            Some(Artifact {
                package: package_name(m.get("package_id")?.as_str()?)?,
                target: m.get("target")?.get("name")?.as_str()?.to_string(),
                executable: PathBuf::from(m.get("executable")?.as_str()?),
                manifest_dir: manifest.parent()?.to_path_buf(),
            })
        })
        .collect()
}

/// The package name in a cargo package ID: `path+file:///w/tests/e2e#mycni-e2e@0.1.0`,
/// or `path+file:///w/mycni-agent#0.1.0` when the directory has its name.
fn package_name(id: &str) -> Option<String> {
    let (url, fragment) = id.rsplit_once('#')?;
    match fragment.split_once('@') {
        Some((name, _)) => Some(name.to_string()),
        None => url.rsplit('/').next().map(str::to_string),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_names_from_ids() {
        assert_eq!(
            package_name("path+file:///w/tests/e2e#mycni-e2e@0.1.0").as_deref(),
            Some("mycni-e2e")
        );
        assert_eq!(
            package_name("path+file:///w/mycni-agent#0.1.0").as_deref(),
            Some("mycni-agent")
        );
        assert_eq!(
            package_name("registry+https://github.com/rust-lang/crates.io-index#anyhow@1.0.104")
                .as_deref(),
            Some("anyhow")
        );
        assert_eq!(package_name("no fragment"), None);
    }

    #[test]
    fn test_binaries_from_cargo_messages() {
        let out = r#"{"reason":"compiler-artifact","package_id":"path+file:///w/tests/e2e#mycni-e2e@0.1.0","manifest_path":"/w/tests/e2e/Cargo.toml","target":{"kind":["test"],"name":"lab"},"profile":{"test":true},"executable":"/w/target/debug/deps/lab-1","fresh":true}
{"reason":"compiler-artifact","package_id":"path+file:///w/tests/e2e#mycni-e2e@0.1.0","manifest_path":"/w/tests/e2e/Cargo.toml","target":{"kind":["lib"],"name":"mycni_e2e"},"profile":{"test":false},"executable":null,"fresh":true}
{"reason":"compiler-artifact","package_id":"path+file:///w/mycni-agent#0.1.0","manifest_path":"/w/mycni-agent/Cargo.toml","target":{"kind":["test"],"name":"datapath"},"profile":{"test":true},"executable":"/w/target/debug/deps/datapath-2","fresh":true}
{"reason":"build-finished","success":true}
not json
"#;
        assert_eq!(
            test_artifacts(out),
            [
                Artifact {
                    package: "mycni-e2e".into(),
                    target: "lab".into(),
                    executable: "/w/target/debug/deps/lab-1".into(),
                    manifest_dir: "/w/tests/e2e".into(),
                },
                Artifact {
                    package: "mycni-agent".into(),
                    target: "datapath".into(),
                    executable: "/w/target/debug/deps/datapath-2".into(),
                    manifest_dir: "/w/mycni-agent".into(),
                },
            ]
        );
    }

    #[test]
    fn kernels_by_name_in_matrix_order() {
        let all = selected(&[]).unwrap();
        assert_eq!(all.len(), SERIES.len());
        let two = selected(&["6.12".into(), "5.10".into()]).unwrap();
        assert_eq!(
            two.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
            ["5.10", "6.12"]
        );
        assert!(selected(&["4.19".into()]).is_err());
        for (_, pattern) in SERIES {
            assert_eq!(pattern.matches('*').count(), 1, "{pattern}");
        }
    }

    #[test]
    fn each_test_target_is_built_once_and_the_names_differ() {
        assert_eq!(test_targets().collect::<Vec<_>>(), ["datapath", "lab"]);
        let names: Vec<&str> = ENTRIES.iter().map(|e| e.name).collect();
        assert_eq!(names, ["kfunc_module", "ebpf_prog", "kernel_matrix"]);
        // Each runs its own module (the first argument is its filter).
        for e in ENTRIES {
            assert_eq!(e.args.first(), Some(&format!("{}::", e.name).as_str()));
        }
    }

    #[test]
    fn entry_names_are_unique_and_shell_safe() {
        let job = |name: &str| Job {
            name: name.into(),
            manifest_dir: "/".into(),
            package: "p".into(),
            executable: "/x".into(),
            args: vec![],
        };
        assert_eq!(job_name("ebpf_prog", &[]), "ebpf_prog");
        assert_eq!(job_name("ebpf_prog", &[job("ebpf_prog")]), "ebpf_prog-2");
        assert_eq!(job_name("a b;c", &[]), "a_b_c");
    }
}
