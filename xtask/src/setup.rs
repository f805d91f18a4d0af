//! `cargo xtask setup`: install what is missing, and only that, saying why.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};

use crate::util::{Cmd, workspace_root};
use crate::{EBPF_TOOLCHAIN, HOST_TOOLCHAIN};

/// Debian packages and the reason each is needed.
const PACKAGES: &[(&str, &str)] = &[
    ("llvm-22-dev", "bpf-linker is built against LLVM 22"),
    ("libpolly-22-dev", "bpf-linker links LLVM 22's Polly"),
    ("libzstd-dev", "bpf-linker links LLVM, which links zstd"),
    ("zlib1g-dev", "bpf-linker links LLVM, which links zlib"),
    ("clang-22", "compiles the eBPF conntrack kfunc shim"),
    (
        "bpftool",
        "checks the object's BTF and inspects pinned maps",
    ),
    (
        "iproute2",
        "network namespaces, veth, vxlan in tests and the lab",
    ),
    ("iputils-ping", "connectivity checks in tests and the lab"),
    ("iperf3", "TCP stream tests and benchmarks"),
    (
        "ethtool",
        "turns segmentation and checksum offloads on and off in the datapath tests",
    ),
    ("sockperf", "latency benchmarks"),
    ("iptables", "masquerade and kube-proxy-like rules in tests"),
    ("nftables", "masquerade rules"),
    (
        "containernetworking-plugins",
        "reference CNI plugins (host-local, ptp, portmap, ...) for tests and benchmarks",
    ),
    ("containerd", "the real container runtime in the CRI tests"),
    ("runc", "containerd's and podman's OCI runtime"),
    (
        "podman",
        "the second real runtime: the podman test runs a container on its CNI backend",
    ),
    ("busybox-static", "the test image for containerd and podman"),
    (
        "qemu-system-x86",
        "boots Debian's stock kernels for `cargo xtask kernels`",
    ),
    (
        "kmod",
        "depmod for the kernels' modules and the guests' modprobe (aliases, softdeps)",
    ),
    (
        "xz-utils",
        "decompresses 6.12's .ko.xz modules for the kernels guests' initramfs",
    ),
    (
        "libcap2-bin",
        "capsh: the capability tests run the agent without one capability at a time",
    ),
    (
        "protobuf-compiler",
        "k8s-cri's build script compiles the CRI proto",
    ),
    (
        "chromium",
        "a real headless browser: the flows page's test renders it and keeps a screenshot",
    ),
    (
        "prometheus",
        "promtool: checks the agent's /metrics and the alerting rules in deploy/monitoring",
    ),
];

const CARGO_BIN_LINKER: &str = "bpf-linker";
const BPF_LINKER_VERSION: &str = "0.13";
const CARGO_FUZZ_VERSION: &str = "0.13";

pub fn run() -> Result<()> {
    let started = Instant::now();
    packages()?;
    toolchain(HOST_TOOLCHAIN, &["clippy", "rustfmt"])?;
    rust_target(HOST_TOOLCHAIN, &crate::plugin_target())?;
    toolchain(EBPF_TOOLCHAIN, &["rust-src", "clippy", "rustfmt"])?;
    bpf_linker()?;
    cargo_fuzz()?;
    bpffs()?;
    directory_override()?;
    eprintln!(
        "xtask setup: done in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn packages() -> Result<()> {
    let missing: Vec<&(&str, &str)> = PACKAGES
        .iter()
        .filter(|(name, _)| {
            let status = Cmd::new("dpkg-query")
                .args(["-W", "-f=${Status}", name])
                .output()
                .unwrap_or_default();
            status.trim() != "install ok installed"
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    for (name, why) in &missing {
        eprintln!("xtask setup: installing {name}: {why}");
    }
    Cmd::new("apt-get")
        .args(["update", "-qq"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .run()?;
    Cmd::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(missing.iter().map(|(n, _)| *n))
        .env("DEBIAN_FRONTEND", "noninteractive")
        .run()
        .context("apt-get install (setup needs root)")
}

fn toolchain(name: &str, components: &[&str]) -> Result<()> {
    let installed = Cmd::new("rustup").args(["toolchain", "list"]).output()?;
    let present = installed
        .lines()
        .any(|l| l.starts_with(&format!("{name}-")) || l.split_whitespace().next() == Some(name));
    if !present {
        eprintln!("xtask setup: installing Rust toolchain {name} with {components:?}");
        return Cmd::new("rustup")
            .args(["toolchain", "install", name, "--profile", "minimal"])
            .arg("--component")
            .arg(components.join(","))
            .run();
    }
    let have = Cmd::new("rustup")
        .args(["component", "list", "--installed", "--toolchain", name])
        .output()?;
    for c in components {
        if !have
            .lines()
            .any(|l| l.starts_with(&format!("{c}-")) || l == *c)
        {
            eprintln!("xtask setup: adding {c} to {name}");
            Cmd::new("rustup")
                .args(["component", "add", "--toolchain", name, c])
                .run()?;
        }
    }
    Ok(())
}

/// Adds the standard library for `target` to `toolchain` if it lacks it
/// (the plugin ships built for musl).
pub fn rust_target(toolchain: &str, target: &str) -> Result<()> {
    let have = Cmd::new("rustup")
        .args(["target", "list", "--installed", "--toolchain", toolchain])
        .output()?;
    if have.lines().any(|l| l.trim() == target) {
        return Ok(());
    }
    eprintln!("xtask setup: adding the {target} target to {toolchain}");
    Cmd::new("rustup")
        .args(["target", "add", "--toolchain", toolchain, target])
        .run()
}

fn cargo_bin(name: &str) -> PathBuf {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from("/root/.cargo"));
    home.join("bin").join(name)
}

fn bpf_linker() -> Result<()> {
    let bin = cargo_bin(CARGO_BIN_LINKER);
    let version = Cmd::new(&bin.to_string_lossy())
        .arg("--version")
        .output()
        .unwrap_or_default();
    if version.contains(&format!("bpf-linker {BPF_LINKER_VERSION}")) {
        return Ok(());
    }
    eprintln!(
        "xtask setup: building bpf-linker {BPF_LINKER_VERSION} against LLVM 22 (links the eBPF object; takes a few minutes)"
    );
    Cmd::new("cargo")
        .args(["install", "bpf-linker", "--version"])
        .arg(format!("~{BPF_LINKER_VERSION}"))
        .args(["--no-default-features", "--features", "llvm-22"])
        .toolchain(HOST_TOOLCHAIN)
        // llvm-sys reads the first, bpf-linker's own build.rs the second;
        // without it the build finds /usr/lib64 and fails on -lLLVM.
        .env("LLVM_SYS_221_PREFIX", "/usr/lib/llvm-22")
        .env("LLVM_PREFIX", "/usr/lib/llvm-22")
        .run()
}

/// `cargo fuzz` runs the targets in `fuzz/` (`cargo xtask fuzz`, and the
/// last step of `cargo xtask test`). It builds with the host toolchain; the
/// fuzz targets themselves build with the nightly (`crate::FUZZ_TOOLCHAIN`).
fn cargo_fuzz() -> Result<()> {
    let bin = cargo_bin("cargo-fuzz");
    let version = Cmd::new(&bin.to_string_lossy())
        .arg("--version")
        .output()
        .unwrap_or_default();
    if version.contains(&format!("cargo-fuzz {CARGO_FUZZ_VERSION}")) {
        return Ok(());
    }
    eprintln!(
        "xtask setup: building cargo-fuzz {CARGO_FUZZ_VERSION} (runs the fuzz targets in fuzz/; takes a minute or two)"
    );
    Cmd::new("cargo")
        .args(["install", "cargo-fuzz", "--locked", "--version"])
        .arg(format!("~{CARGO_FUZZ_VERSION}"))
        .toolchain(HOST_TOOLCHAIN)
        .run()
}

fn bpffs() -> Result<()> {
    let mounts = std::fs::read_to_string("/proc/mounts").context("reading /proc/mounts")?;
    if mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some("/sys/fs/bpf"))
    {
        return Ok(());
    }
    eprintln!("xtask setup: mounting bpffs at /sys/fs/bpf (the agent pins maps and links there)");
    Cmd::new("mount")
        .args(["-t", "bpf", "bpf", "/sys/fs/bpf"])
        .run()
}

/// Makes plain `cargo build` / `cargo test` in this checkout use the pinned
/// host toolchain too (a rust-toolchain.toml would break `cargo xtask` on a
/// machine that does not have it yet, since RUSTUP_AUTO_INSTALL=0 here).
fn directory_override() -> Result<()> {
    let root = workspace_root();
    let current = Cmd::new("rustup")
        .args(["show", "active-toolchain"])
        .cwd(&root)
        .output()
        .unwrap_or_default();
    if current.starts_with(HOST_TOOLCHAIN) {
        return Ok(());
    }
    eprintln!(
        "xtask setup: `rustup override set {HOST_TOOLCHAIN}` for {} (aya 0.16 needs Rust 1.98)",
        root.display()
    );
    Cmd::new("rustup")
        .args(["override", "set", HOST_TOOLCHAIN, "--path"])
        .arg(&root)
        .run()
}
