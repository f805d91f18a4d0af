//! Compiles the conntrack gate (c/ct_gate.c) to LLVM bitcode and hands it to
//! bpf-linker, which links it into the program like any other bitcode.
//!
//! C because a kfunc call needs BTF for the extern declaration, which rustc
//! does not emit. clang must use the same LLVM major as bpf-linker (22 here):
//! `$MYCNI_CLANG`, else `clang-22`.
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo::rerun-if-changed=c/ct_gate.c");
    println!("cargo::rerun-if-env-changed=MYCNI_CLANG");
    // Only the eBPF target links the gate; clippy of the host build needs nothing.
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() != Ok("bpf") {
        return;
    }
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default()).join("ct_gate.bc");
    let clang = std::env::var("MYCNI_CLANG").unwrap_or_else(|_| "clang-22".to_owned());
    let status = Command::new(&clang)
        .args(["-target", "bpfel", "-O2", "-g", "-emit-llvm", "-c"])
        .arg(manifest.join("c/ct_gate.c"))
        .arg("-o")
        .arg(&out)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("{clang} failed on c/ct_gate.c: {s}"),
        Err(e) => panic!("cannot run {clang} (install clang-22: `cargo xtask setup`): {e}"),
    }
    println!("cargo::rustc-link-arg={}", out.display());
}
