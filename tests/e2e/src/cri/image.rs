//! The test image, made locally from Debian's busybox-static: nothing can be
//! pulled from a registry here.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use anyhow::{Context, Result, bail};

use mycni_testkit::sh;

/// Where busybox-static installs its binary.
pub const BUSYBOX: &str = "/bin/busybox";

/// Applets linked into /bin: what tests run inside a pod.
const APPLETS: &[&str] = &[
    "sh", "sleep", "ip", "ping", "cat", "ls", "echo", "true", "false", "hostname", "ifconfig",
    "route", "nc", "wget", "ps", "grep", "sysctl", "mount", "sed", "awk", "head", "tail", "wc",
];

/// Writes a docker-archive tar (what `docker save` makes) holding one layer
/// with busybox and its applets, tagged `reference`.
///
/// docker-archive rather than an OCI layout: `ctr images import` accepts both,
/// but the docker format names the config and layer by plain file names and
/// needs no manifest or index digests, only the layer's diff ID.
pub fn build_busybox_archive(work: &Path, reference: &str, out: &Path) -> Result<()> {
    if !Path::new(BUSYBOX).exists() {
        bail!("{BUSYBOX} is missing: apt-get install busybox-static");
    }
    let rootfs = work.join("rootfs");
    for d in ["bin", "etc", "tmp", "proc", "sys", "dev", "root"] {
        fs::create_dir_all(rootfs.join(d))?;
    }
    fs::copy(BUSYBOX, rootfs.join("bin/busybox")).context("copy busybox")?;
    for applet in APPLETS {
        symlink("busybox", rootfs.join("bin").join(applet))?;
    }
    fs::write(rootfs.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n")?;
    fs::write(rootfs.join("etc/group"), "root:x:0:\n")?;

    let layer = work.join("layer.tar");
    let rootfs_s = rootfs.to_string_lossy();
    let layer_s = layer.to_string_lossy();
    // Numeric root ownership and a fixed mtime keep the layer's digest the
    // same on every run.
    sh(
        "tar",
        &[
            "--numeric-owner",
            "--owner=0",
            "--group=0",
            "--mtime=@0",
            "--sort=name",
            "-C",
            &rootfs_s,
            "-cf",
            &layer_s,
            ".",
        ],
    )?;
    let diff_id = sh("sha256sum", &[&layer_s])?;
    let diff_id = diff_id
        .split_whitespace()
        .next()
        .context("sha256sum printed nothing")?;

    // The sandbox container runs the image's command, so it must stay up
    // like the pause image does.
    let config = serde_json::json!({
        "architecture": go_arch()?,
        "os": "linux",
        "config": {
            "Cmd": ["/bin/sleep", "inf"],
            "Env": ["PATH=/bin"],
            "WorkingDir": "/",
        },
        "rootfs": { "type": "layers", "diff_ids": [format!("sha256:{diff_id}")] },
        "history": [{ "created_by": "mycni-tests" }],
    });
    fs::write(work.join("config.json"), serde_json::to_vec(&config)?)?;
    let manifest = serde_json::json!([{
        "Config": "config.json",
        "RepoTags": [reference],
        "Layers": ["layer.tar"],
    }]);
    fs::write(work.join("manifest.json"), serde_json::to_vec(&manifest)?)?;

    let work_s = work.to_string_lossy();
    sh(
        "tar",
        &[
            "-C",
            &work_s,
            "-cf",
            &out.to_string_lossy(),
            "manifest.json",
            "config.json",
            "layer.tar",
        ],
    )?;
    Ok(())
}

/// The image's architecture must match the host's, or `ctr images import`
/// filters the image out and CRI cannot find it.
fn go_arch() -> Result<&'static str> {
    Ok(match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "riscv64" => "riscv64",
        "s390x" => "s390x",
        "powerpc64" => "ppc64le",
        other => bail!("no OCI architecture name known for {other}"),
    })
}
