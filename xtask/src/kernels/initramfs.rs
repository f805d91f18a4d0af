//! The guest's initramfs: the host's busybox-static, the guest's /init, and
//! the modules mounting 9p needs (virtio_pci, 9pnet_virtio, 9p and what they
//! depend on), decompressed, with the order to insmod them in. Written as
//! an uncompressed newc cpio: ~3 MB that the kernel unpacks faster than it
//! would decompress them under TCG.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, Result, bail};

use super::fetch::Kernel;

/// What /init loads itself, before the host's /usr (and kmod) is there.
const BOOT_MODULES: &[&str] = &["virtio_pci", "9pnet_virtio", "9p"];

/// The guest's PID 1.
const INIT: &str = include_str!("init.sh");

/// The host's busybox-static (package busybox-static): a static binary, so
/// it runs in an initramfs that has no libc.
const BUSYBOX: &str = "/bin/busybox";

/// Writes the initramfs for `kernel` to `out`.
pub fn build(kernel: &Kernel, out: &Path) -> Result<()> {
    let mods = kernel.dir.join("lib/modules").join(&kernel.version);
    let dep = std::fs::read_to_string(mods.join("modules.dep"))
        .with_context(|| format!("reading {}/modules.dep", mods.display()))?;
    let builtin = std::fs::read_to_string(mods.join("modules.builtin")).unwrap_or_default();
    let order = load_order(&dep, &builtin, BOOT_MODULES)?;

    let mut cpio = Cpio::default();
    for d in ["bin", "dev", "proc", "sys", "m"] {
        cpio.dir(d);
    }
    // The kernel opens it for init's stdin, stdout and stderr before
    // /init runs and devtmpfs is mounted.
    cpio.char_dev("dev/console", 5, 1);
    let busybox = std::fs::read(BUSYBOX)
        .with_context(|| format!("reading {BUSYBOX} (package busybox-static)"))?;
    cpio.file("bin/busybox", 0o755, &busybox);
    cpio.file("init", 0o755, INIT.as_bytes());
    let mut list = String::new();
    for rel in &order {
        let name = format!("m/{}.ko", module_name_of(rel));
        cpio.file(&name, 0o644, &decompressed(&mods.join(rel))?);
        list.push_str(&name);
        list.push('\n');
    }
    cpio.file("modules.load", 0o644, list.as_bytes());
    std::fs::write(out, cpio.finish()).with_context(|| format!("writing {}", out.display()))
}

/// A module file's contents, uncompressed: busybox insmod takes plain
/// ELF only, and 6.12's modules are .ko.xz.
fn decompressed(path: &Path) -> Result<Vec<u8>> {
    let tool = match path.extension().and_then(|e| e.to_str()) {
        Some("xz") => "xz",
        Some("zst") => "zstd",
        Some("gz") => "gzip",
        _ => return std::fs::read(path).with_context(|| format!("reading {}", path.display())),
    };
    // Not `Cmd`: its output is text, and this is a binary.
    let out = std::process::Command::new(tool)
        .arg("-dc")
        .arg(path)
        .output()
        .with_context(|| format!("cannot start {tool}"))?;
    if !out.status.success() {
        bail!(
            "{tool} -dc {} failed: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}

/// A module's name from its path in modules.dep: the file name without
/// `.ko` and any compression suffix, `-` as `_` (as the kernel names it).
fn module_name_of(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    let stem = file.split(".ko").next().unwrap_or(file);
    stem.replace('-', "_")
}

/// The modules.dep paths to insmod, dependencies first, for `wanted`;
/// built-in modules (modules.builtin) need nothing and are left out.
pub fn load_order(dep: &str, builtin: &str, wanted: &[&str]) -> Result<Vec<String>> {
    let entries: Vec<(&str, Vec<&str>)> = dep
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(m, deps)| (m.trim(), deps.split_whitespace().collect()))
        .collect();
    let builtin: BTreeSet<String> = builtin.lines().map(module_name_of).collect();
    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    for w in wanted {
        let w = w.replace('-', "_");
        if builtin.contains(&w) {
            continue;
        }
        let Some((path, _)) = entries.iter().find(|(p, _)| module_name_of(p) == w) else {
            bail!("module {w} is neither in modules.dep nor built in");
        };
        visit(path, &entries, &mut seen, &mut order, 0)?;
    }
    Ok(order)
}

fn visit(
    path: &str,
    entries: &[(&str, Vec<&str>)],
    seen: &mut BTreeSet<String>,
    order: &mut Vec<String>,
    depth: usize,
) -> Result<()> {
    if depth > 64 {
        bail!("modules.dep has a dependency loop through {path}");
    }
    if seen.contains(path) {
        return Ok(());
    }
    let Some((_, deps)) = entries.iter().find(|(p, _)| *p == path) else {
        bail!("{path} is a dependency without its own line in modules.dep");
    };
    for d in deps {
        visit(d, entries, seen, order, depth + 1)?;
    }
    seen.insert(path.to_string());
    order.push(path.to_string());
    Ok(())
}

/// A newc ("070701") cpio archive, the format the kernel unpacks.
#[derive(Default)]
struct Cpio {
    buf: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn dir(&mut self, name: &str) {
        self.entry(name, 0o040_755, (0, 0), &[]);
    }

    fn file(&mut self, name: &str, perm: u32, data: &[u8]) {
        self.entry(name, 0o100_000 | perm, (0, 0), data);
    }

    fn char_dev(&mut self, name: &str, major: u32, minor: u32) {
        self.entry(name, 0o020_600, (major, minor), &[]);
    }

    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) {
        self.ino += 1;
        let size = u32::try_from(data.len()).unwrap_or(u32::MAX);
        let namesize = u32::try_from(name.len() + 1).unwrap_or(u32::MAX);
        let fields = [
            self.ino, mode, 0, 0, 1, 0, size, 0, 0, rdev.0, rdev.1, namesize, 0,
        ];
        self.buf.extend_from_slice(b"070701");
        for f in fields {
            self.buf.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.buf.extend_from_slice(name.as_bytes());
        self.buf.push(0);
        self.pad();
        self.buf.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }

    fn finish(mut self) -> Vec<u8> {
        self.ino = 0;
        self.entry("TRAILER!!!", 0, (0, 0), &[]);
        self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Shaped as kmod's depmod writes it for Debian's 6.1 (paths shortened).
    const DEP: &str = "\
kernel/fs/netfs/netfs.ko:
kernel/fs/fscache/fscache.ko: kernel/fs/netfs/netfs.ko
kernel/fs/9p/9p.ko: kernel/net/9p/9pnet.ko kernel/fs/fscache/fscache.ko kernel/fs/netfs/netfs.ko
kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/virtio/virtio_pci_modern_dev.ko:
kernel/drivers/virtio/virtio_pci_legacy_dev.ko:
kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_pci_legacy_dev.ko kernel/drivers/virtio/virtio_pci_modern_dev.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/net/9p/9pnet.ko:
kernel/net/9p/9pnet_virtio.ko: kernel/net/9p/9pnet.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/char/hw_random/virtio-rng.ko: kernel/drivers/virtio/virtio.ko
";

    fn names(order: &[String]) -> Vec<String> {
        order.iter().map(|p| module_name_of(p)).collect()
    }

    #[test]
    fn dependencies_load_first_and_once() {
        let order = load_order(DEP, "", BOOT_MODULES).unwrap();
        assert_eq!(
            names(&order),
            [
                "virtio_pci_legacy_dev",
                "virtio_pci_modern_dev",
                "virtio_ring",
                "virtio",
                "virtio_pci",
                "9pnet",
                "9pnet_virtio",
                "netfs",
                "fscache",
                "9p"
            ]
        );
        // Every module after everything it depends on.
        for (i, path) in order.iter().enumerate() {
            let deps = DEP
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{path}:")))
                .unwrap();
            for d in deps.split_whitespace() {
                let at = order.iter().position(|p| p == d).unwrap();
                assert!(at < i, "{d} after {path}");
            }
        }
    }

    #[test]
    fn builtins_are_skipped_and_names_normalised() {
        // 6.12: virtio_pci is built in, modules are .ko.xz.
        let dep = "kernel/net/9p/9pnet.ko.xz:\nkernel/drivers/char/hw_random/virtio-rng.ko.xz: kernel/net/9p/9pnet.ko.xz\n";
        let builtin = "kernel/drivers/virtio/virtio_pci.ko\n";
        let order = load_order(dep, builtin, &["virtio_pci", "virtio-rng"]).unwrap();
        assert_eq!(
            order,
            [
                "kernel/net/9p/9pnet.ko.xz",
                "kernel/drivers/char/hw_random/virtio-rng.ko.xz"
            ]
        );
        assert_eq!(module_name_of("a/b/virtio-rng.ko.xz"), "virtio_rng");
        assert!(load_order(dep, builtin, &["nosuch"]).is_err());
        let looped = "a.ko: b.ko\nb.ko: a.ko\n";
        assert!(load_order(looped, "", &["a"]).is_err());
    }

    #[test]
    fn cpio_is_newc_and_aligned() {
        let mut c = Cpio::default();
        c.dir("bin");
        c.file("init", 0o755, b"#!/bin/sh\n");
        c.char_dev("dev/console", 5, 1);
        let out = c.finish();
        assert!(out.len().is_multiple_of(4));
        assert!(out.starts_with(b"070701"));
        let text = String::from_utf8_lossy(&out);
        assert_eq!(text.matches("070701").count(), 4);
        // The file's header: ino 2, regular 0755, size 10, name "init\0".
        let at = text.find("init\0").unwrap();
        let header = &text[at - 110..at];
        assert_eq!(&header[6..14], "00000002");
        assert_eq!(&header[14..22], "000081ed");
        assert_eq!(&header[54..62], "0000000a");
        assert_eq!(&header[94..102], "00000005");
        // The device's rdev: 5:1.
        let at = text.find("dev/console\0").unwrap();
        let header = &text[at - 110..at];
        assert_eq!(&header[78..86], "00000005");
        assert_eq!(&header[86..94], "00000001");
        assert!(text.contains("TRAILER!!!"));
    }
}
