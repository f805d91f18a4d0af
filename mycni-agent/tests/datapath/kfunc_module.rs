//! The loader against the running kernel's own BTF: where `nf_conntrack` is
//! a module (every distribution kernel), the conntrack kfuncs resolve only
//! through the module's BTF, and the same load resolved against vmlinux
//! alone (what aya 0.16 does without third_party/aya's patch,
//! `MYCNI_KFUNC_PROBE=vmlinux`) fails; where it is built in (this
//! machine's kernel) both load. Prints, for `cargo xtask kernels`' table,
//! where the kfuncs are and how many instructions the verifier went
//! through per program.
//!
//! One test in its own module (and so its own turn): it sets
//! `MYCNI_KFUNC_PROBE`, which any load a test ran beside it would inherit.

use std::path::Path;

use anyhow::{Context, Result, ensure};
use mycni_agent::datapath::kfuncs::{self, Home};
use mycni_agent::datapath::{Datapath, Prog, embedded_object};
use mycni_testkit::{BpfFs, NetNs};

fn fact(key: &str, value: impl std::fmt::Display) {
    println!("MYCNI-FACT {key}={value}");
}

#[test]
fn module_kfuncs_load_only_through_the_modules_btf() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let object = embedded_object().context("agent built without its eBPF object")?;
    let ns = NetNs::new("kfunc")?;
    let bpffs = BpfFs::new()?;
    let sys_btf = Path::new("/sys/kernel/btf");
    // What the loader does first: nf_conntrack pulled in by autoload.
    kfuncs::pull_in_conntrack(Path::new("/sys/module"))?;
    // The pull-in's transaction parses (it runs only where conntrack is a
    // module and not loaded yet, never on this project's own kernel).
    let check = std::process::Command::new("nft")
        .args(["--check", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin
                .take()
                .map(|mut i| i.write_all(kfuncs::PULL_IN.as_bytes()));
            c.wait()
        })?;
    ensure!(
        check.success(),
        "nft --check rejects the pull-in transaction"
    );
    let home = match kfuncs::locate(sys_btf) {
        Ok(Home::Vmlinux { .. }) => "vmlinux",
        Ok(Home::Module { .. }) => "module",
        Err(e) => {
            // No kfuncs at all (5.10): the load must fail, naming them.
            fact("kfuncs", "absent");
            let err = ns
                .run_in(|| Datapath::load(object, bpffs.path()).map(|_| ()))?
                .expect_err("loaded without conntrack kfuncs");
            ensure!(err.to_string().contains("conntrack kfunc"), "{err}");
            eprintln!("as expected: {e}");
            return Ok(());
        }
    };
    fact("kfuncs", home);
    let loaded = ns.run_in(|| -> Result<Vec<(Prog, Option<u32>)>> {
        let dp = Datapath::load(object, bpffs.path())?;
        Ok(Prog::ALL
            .into_iter()
            .map(|p| (p, dp.verified_instructions(p)))
            .collect())
    })??;
    let count = |p: Prog| {
        loaded
            .iter()
            .find(|(q, _)| *q == p)
            .and_then(|(_, n)| *n)
            .map_or_else(|| "?".to_owned(), |n| n.to_string())
    };
    eprintln!("verified instructions: {loaded:?}");
    fact(
        "insns",
        format!("{}/{}", count(Prog::FromPod), count(Prog::FromUnderlay)),
    );
    // SAFETY (env): the only test of this binary.
    unsafe { std::env::set_var("MYCNI_KFUNC_PROBE", "vmlinux") };
    let bpffs2 = BpfFs::new()?;
    let vmlinux_only = ns.run_in(|| Datapath::load(object, bpffs2.path()).map(|_| ()))?;
    unsafe { std::env::remove_var("MYCNI_KFUNC_PROBE") };
    match (home, vmlinux_only) {
        ("vmlinux", Ok(())) => {}
        ("module", Err(e)) => {
            let e = e.to_string();
            ensure!(e.contains("not found in kernel BTF"), "{e}");
            fact("vmlinux_only_load", "fails");
        }
        (home, r) => anyhow::bail!("kfuncs in {home}, yet resolving in vmlinux alone gave {r:?}"),
    }
    Ok(())
}
