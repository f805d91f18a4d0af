//! Compiles the C helpers (c/*.c) to LLVM bitcode and hands them to
//! bpf-linker, which links them into the program like any other bitcode.
//!
//! C because a kfunc call needs BTF for the extern declaration, which rustc
//! does not emit, and because reading kernel structs portably needs CO-RE
//! relocations, which only clang emits (`preserve_access_index`):
//! - c/ct_gate.c: the conntrack gate (kfuncs);
//! - c/skb_drop.c: the `struct sk_buff` fields the `kfree_skb` tracepoint
//!   reads (CO-RE).
//!
//! clang must use the same LLVM major as bpf-linker (22 here):
//! `$MYCNI_CLANG`, else `clang-22`.
use std::path::PathBuf;
use std::process::Command;

const SOURCES: &[&str] = &["ct_gate", "skb_drop"];

fn main() {
    for s in SOURCES {
        println!("cargo::rerun-if-changed=c/{s}.c");
    }
    println!("cargo::rerun-if-env-changed=MYCNI_CLANG");
    // Only the eBPF target links the helpers; clippy of the host build needs nothing.
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() != Ok("bpf") {
        return;
    }
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
    let clang = std::env::var("MYCNI_CLANG").unwrap_or_else(|_| "clang-22".to_owned());
    for s in SOURCES {
        let out = out_dir.join(format!("{s}.bc"));
        let status = Command::new(&clang)
            .args(["-target", "bpfel", "-O2", "-g", "-emit-llvm", "-c"])
            .arg(manifest.join(format!("c/{s}.c")))
            .arg("-o")
            .arg(&out)
            .status();
        match status {
            Ok(st) if st.success() => {}
            Ok(st) => panic!("{clang} failed on c/{s}.c: {st}"),
            Err(e) => panic!("cannot run {clang} (install clang-22: `cargo xtask setup`): {e}"),
        }
        println!("cargo::rustc-link-arg={}", out.display());
    }
}
