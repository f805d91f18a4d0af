//! Embeds the eBPF object built by `cargo xtask build-ebpf --release`.
//!
//! The object is looked up at one fixed place,
//! `target/ebpf/bpfel-unknown-none/release/mycni-ebpf` (or `$MYCNI_EBPF_OBJECT`),
//! and copied into OUT_DIR. When it is absent the agent is built without an
//! embedded object, says so at runtime and runs the kernel datapath (or loads
//! `--ebpf-object`), so `cargo build` works before the eBPF toolchain is set up.
use std::path::PathBuf;

fn main() {
    println!("cargo::rerun-if-env-changed=MYCNI_EBPF_OBJECT");
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let source = std::env::var_os("MYCNI_EBPF_OBJECT")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("../target/ebpf/bpfel-unknown-none/release/mycni-ebpf"));
    println!("cargo::rerun-if-changed={}", source.display());
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default()).join("mycni-ebpf.o");
    let bytes = std::fs::read(&source).unwrap_or_default();
    if bytes.is_empty() {
        println!(
            "cargo::warning=no eBPF object at {}: run `cargo xtask build-ebpf --release`; building without the fast path",
            source.display()
        );
    }
    if let Err(e) = std::fs::write(&out, &bytes) {
        panic!("cannot write {}: {e}", out.display());
    }
}
