//! What the lab-based tests share: the binaries and a lab torn down on drop.

use std::path::PathBuf;

use anyhow::{Result, bail};
use mycni_tests::lab::{Bins, Lab, Spec};
use mycni_tests::unique;

pub fn bins() -> Bins {
    let lab = PathBuf::from(env!("CARGO_BIN_EXE_mycni-lab"));
    let dir = lab.parent().map(PathBuf::from).unwrap_or_default();
    Bins {
        agent: dir.join("mycni-agent"),
        plugin: dir.join("mycni"),
        apiserver: PathBuf::from(env!("CARGO_BIN_EXE_mycni-apiserver")),
        lab,
    }
}

/// A lab that is torn down when the test ends, pass or fail.
pub struct TestLab(pub Lab);

impl Drop for TestLab {
    fn drop(&mut self) {
        self.0.down();
    }
}

/// A lab with the API fixture in this process and a 1 s resync.
pub fn lab(nodes: usize, pods: usize) -> Result<TestLab> {
    let b = bins();
    if !b.agent.exists() || !b.plugin.exists() {
        bail!(
            "{} or {} is not built: run the suite with `cargo xtask test`",
            b.agent.display(),
            b.plugin.display()
        );
    }
    let prefix = unique("mycni-t-lab");
    let root = std::env::temp_dir().join(&prefix);
    Ok(TestLab(Lab::up(Spec {
        prefix,
        nodes,
        pods,
        root,
        bins: b,
        agent_args: vec!["--resync".into(), "1s".into()],
        in_process_api: true,
    })?))
}
