//! `mycni-agent install-cni`: the init container's copy of the plugin
//! into the host's CNI bin dir.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;

// No doc comment here: the subcommand's about is its variant's in `Cmd`.
#[derive(Args)]
pub(super) struct InstallCniArgs {
    #[arg(long, default_value = "/usr/local/bin/mycni")]
    src: PathBuf,
    #[arg(long, default_value = "/host/opt/cni/bin")]
    dst_dir: PathBuf,
}

pub(super) fn run(a: &InstallCniArgs) -> Result<()> {
    install_cni(&a.src, &a.dst_dir)
}

fn install_cni(src: &Path, dst_dir: &Path) -> Result<()> {
    let dst = dst_dir.join("mycni");
    let tmp = dst_dir.join(".mycni.tmp");
    std::fs::copy(src, &tmp)
        .with_context(|| format!("copying {} to {}", src.display(), tmp.display()))?;
    // rename(2) swaps the binary atomically: a runtime exec'ing it mid-update
    // gets the old or the new one, never a torn file.
    std::fs::rename(&tmp, &dst).with_context(|| format!("installing {}", dst.display()))?;
    tracing::info!(dst = %dst.display(), "installed the CNI plugin");
    Ok(())
}
