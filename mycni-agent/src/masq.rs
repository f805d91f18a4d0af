//! Masquerade of pod traffic leaving the cluster CIDR, in an nftables table
//! mycni owns alone (`ip mycni`): installing replaces the table atomically,
//! so repeated runs are idempotent and nobody else's rules are touched.

use std::io::Write;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::peers::Cidr;

pub const TABLE: &str = "mycni";

pub fn ruleset(cluster: Cidr) -> String {
    // `table` + `delete table` first makes the replace work whether or not
    // the table exists; nft applies the whole file as one transaction.
    format!(
        "table ip {TABLE}\n\
         delete table ip {TABLE}\n\
         table ip {TABLE} {{\n\
         \tchain postrouting {{\n\
         \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
         \t\tip saddr {cluster} ip daddr != {cluster} masquerade comment \"mycni: pods leaving the cluster CIDR\"\n\
         \t}}\n\
         }}\n"
    )
}

pub(crate) fn nft(script: &str) -> Result<()> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("running nft (is nftables installed?)")?;
    if let Some(mut s) = child.stdin.take() {
        s.write_all(script.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "nft failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

pub fn install(cluster: Cidr) -> Result<()> {
    nft(&ruleset(cluster))
}

pub fn uninstall() -> Result<()> {
    nft(&format!("table ip {TABLE}\ndelete table ip {TABLE}\n"))
}
