//! Debian's stock kernels, fetched without installing them: a private apt
//! state (its own sources, lists and cache under the kernel cache, so the
//! machine's apt sources and lists are never touched), `apt-get download`
//! of the newest package whose name matches a series' pattern, `dpkg-deb
//! -x`, then kmod's `depmod` (Debian ships no modules.dep; the guest's
//! modprobe needs it with modules.alias and modules.softdep).
//!
//! Cache: `<cache>/<package-name>/` holds the extracted package (boot/,
//! lib/modules/<version>/), `<cache>/apt/` the apt state. A kernel whose
//! directory is complete is never fetched again; a newer package name in
//! the index means a new fetch, and the older kernels of its series are
//! removed (~100-400 MB each).

use std::cmp::Ordering;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, bail};

use crate::util::Cmd;

/// Suites the kernels come from. bullseye's own security suite is left
/// out: its index lists kernels whose .debs the mirror no longer serves.
const SOURCES: &str = "\
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bullseye main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security bookworm-security main
";

/// An index younger than this is used as it is: a second run in a day
/// needs no network, and a kernel released since shows up within it.
const INDEX_MAX_AGE: Duration = Duration::from_secs(12 * 3600);

/// Written last into a kernel's directory: one without it is a fetch that
/// was interrupted, and is fetched again.
const COMPLETE: &str = ".mycni-complete";

/// A kernel ready to boot.
#[derive(Debug, Clone)]
pub struct Kernel {
    pub package: String,
    /// The extracted package: boot/ and lib/modules/<version>/.
    pub dir: PathBuf,
    /// `uname -r` of the kernel, the one directory in lib/modules.
    pub version: String,
    pub vmlinuz: PathBuf,
}

/// `$MYCNI_KERNEL_CACHE`, or `~/.cache/mycni/kernels`.
pub fn cache_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("MYCNI_KERNEL_CACHE").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .context("neither MYCNI_KERNEL_CACHE nor HOME is set")?;
    Ok(base.join("mycni/kernels"))
}

/// The private apt state under the cache, its index refreshed at most once
/// per run and only when older than [`INDEX_MAX_AGE`].
pub struct Apt {
    dir: PathBuf,
    refreshed: bool,
}

impl Apt {
    pub fn new(cache: &Path) -> Self {
        Self {
            dir: cache.join("apt"),
            refreshed: false,
        }
    }

    fn options(&self) -> Vec<String> {
        let d = self.dir.display();
        vec![
            format!("-o=Dir::Etc::sourcelist={d}/sources.list"),
            // Only the list above: none of the machine's sources.list.d.
            "-o=Dir::Etc::sourceparts=-".into(),
            format!("-o=Dir::State::Lists={d}/lists"),
            format!("-o=Dir::Cache={d}/cache"),
            // Package lists are all it needs; the machine's appstream
            // config would add 11 MB of DEP-11 metadata per update.
            "-o=Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false".into(),
            // The downloads land in a root-owned cache directory that
            // apt's unprivileged _apt user cannot write.
            "-o=APT::Sandbox::User=root".into(),
            "-qq".into(),
        ]
    }

    fn lists_age(&self) -> Option<Duration> {
        let stamp = std::fs::metadata(self.dir.join("lists/.mycni-updated")).ok()?;
        SystemTime::now()
            .duration_since(stamp.modified().ok()?)
            .ok()
    }

    /// Updates the index when it is missing or stale. A failed update with
    /// an older index still there is a warning: the cached kernels can
    /// still run offline.
    pub fn ensure_index(&mut self, force: bool) -> Result<()> {
        if self.refreshed {
            return Ok(());
        }
        self.refreshed = true;
        let age = self.lists_age();
        // Other suites in a newer xtask mean another index, whatever its age.
        let same_sources =
            std::fs::read_to_string(self.dir.join("sources.list")).is_ok_and(|s| s == SOURCES);
        if !force && same_sources && age.is_some_and(|a| a < INDEX_MAX_AGE) {
            return Ok(());
        }
        for sub in ["lists/partial", "cache/archives/partial"] {
            std::fs::create_dir_all(self.dir.join(sub))
                .with_context(|| format!("creating {}", self.dir.join(sub).display()))?;
        }
        std::fs::write(self.dir.join("sources.list"), SOURCES)?;
        eprintln!(
            "xtask kernels: apt-get update (private index in {})",
            self.dir.display()
        );
        let updated = Cmd::new("apt-get")
            .args(self.options())
            .arg("update")
            .output();
        match updated {
            Ok(_) => {
                std::fs::write(self.dir.join("lists/.mycni-updated"), "")?;
                Ok(())
            }
            Err(e) if age.is_some() => {
                eprintln!("xtask kernels: warning: {e:#}; using the index from before");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Every package name in the index starting with `prefix`.
    fn names(&self, prefix: &str) -> Result<Vec<String>> {
        let out = Cmd::new("apt-cache")
            .args(self.options())
            .args(["search", "--names-only"])
            .arg(format!("^{}", regex_escape(prefix)))
            .output()?;
        Ok(out
            .lines()
            .filter_map(|l| l.split(" - ").next())
            .map(|n| n.trim().to_string())
            .collect())
    }

    /// The newest package matching `pattern` (see [`matches`]).
    pub fn resolve(&self, pattern: &str) -> Result<String> {
        let prefix = pattern.split('*').next().unwrap_or(pattern);
        let names = self.names(prefix)?;
        newest(pattern, names.iter().map(String::as_str))
            .map(str::to_string)
            .with_context(|| format!("no package matching {pattern} in the apt index"))
    }

    fn download(&self, package: &str, into: &Path) -> Result<PathBuf> {
        Cmd::new("apt-get")
            .args(self.options())
            .args(["download", package])
            .cwd(into)
            .output()?;
        let deb = std::fs::read_dir(into)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|x| x == "deb"))
            .with_context(|| format!("apt-get download {package} left no .deb"))?;
        Ok(deb)
    }
}

/// `text` as a POSIX regular expression that matches it literally.
fn regex_escape(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if !c.is_ascii_alphanumeric() && c != '-' && c != '_' {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Whether `name` matches `pattern`, whose one `*` stands for one or more
/// ASCII digits: `linux-image-6.1.0-*-amd64-unsigned` takes the std
/// flavour's `-57-` and leaves `-57-cloud-`, `-57-rt-` alone.
pub fn matches(pattern: &str, name: &str) -> bool {
    let Some((head, tail)) = pattern.split_once('*') else {
        return pattern == name;
    };
    name.len() > head.len() + tail.len()
        && name.starts_with(head)
        && name.ends_with(tail)
        && name[head.len()..name.len() - tail.len()]
            .bytes()
            .all(|b| b.is_ascii_digit())
}

/// The greatest of the names matching `pattern`, as `sort -V | tail -1`.
pub fn newest<'a>(pattern: &str, names: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    names
        .filter(|n| matches(pattern, n))
        .max_by(|a, b| version_cmp(a, b))
}

/// `sort -V`'s order (Debian's version comparison): runs of digits compare
/// as numbers, the text between them character by character with letters
/// before other characters and `~` before everything, even the end.
pub fn version_cmp(a: &str, b: &str) -> Ordering {
    fn order(c: Option<u8>) -> i32 {
        match c {
            None => 0,
            Some(b'~') => -1,
            Some(c) if c.is_ascii_alphabetic() => i32::from(c),
            Some(c) => i32::from(c) + 256,
        }
    }
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        while (i < a.len() && !a[i].is_ascii_digit()) || (j < b.len() && !b[j].is_ascii_digit()) {
            let ca = a.get(i).copied().filter(|c| !c.is_ascii_digit());
            let cb = b.get(j).copied().filter(|c| !c.is_ascii_digit());
            let (oa, ob) = (order(ca), order(cb));
            if oa != ob {
                return oa.cmp(&ob);
            }
            i += usize::from(ca.is_some());
            j += usize::from(cb.is_some());
        }
        let da = a[i..].iter().take_while(|c| c.is_ascii_digit()).count();
        let db = b[j..].iter().take_while(|c| c.is_ascii_digit()).count();
        let na = trim_zeros(&a[i..i + da]);
        let nb = trim_zeros(&b[j..j + db]);
        let by_number = na.len().cmp(&nb.len()).then_with(|| na.cmp(nb));
        if by_number != Ordering::Equal {
            return by_number;
        }
        i += da;
        j += db;
    }
    Ordering::Equal
}

fn trim_zeros(digits: &[u8]) -> &[u8] {
    let zeros = digits.iter().take_while(|&&d| d == b'0').count();
    &digits[zeros..]
}

/// The kernel `package`, from the cache or fetched into it.
pub fn kernel(apt: &Apt, cache: &Path, package: &str, pattern: &str) -> Result<Kernel> {
    let dir = cache.join(package);
    if !dir.join(COMPLETE).exists() {
        fetch(apt, cache, package)?;
        prune(cache, pattern, package);
    }
    open(package, &dir)
}

/// The newest complete kernel in the cache matching `pattern`: what runs
/// when the index cannot be read or updated.
pub fn newest_cached(cache: &Path, pattern: &str) -> Option<String> {
    let names: Vec<String> = std::fs::read_dir(cache)
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join(COMPLETE).exists())
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .collect();
    newest(pattern, names.iter().map(String::as_str)).map(str::to_string)
}

fn open(package: &str, dir: &Path) -> Result<Kernel> {
    let modules = dir.join("lib/modules");
    let mut versions: Vec<String> = std::fs::read_dir(&modules)
        .with_context(|| format!("reading {}", modules.display()))?
        .filter_map(|e| e.ok()?.file_name().to_str().map(str::to_string))
        .collect();
    let (Some(version), None) = (versions.pop(), versions.pop()) else {
        bail!(
            "{} should hold exactly one kernel version",
            modules.display()
        );
    };
    let vmlinuz = dir.join(format!("boot/vmlinuz-{version}"));
    if !vmlinuz.is_file() {
        bail!("{} is missing", vmlinuz.display());
    }
    Ok(Kernel {
        package: package.to_string(),
        dir: dir.to_path_buf(),
        version,
        vmlinuz,
    })
}

fn fetch(apt: &Apt, cache: &Path, package: &str) -> Result<()> {
    let started = std::time::Instant::now();
    let work = cache.join(format!(".fetch-{package}"));
    let dir = cache.join(package);
    for d in [&work, &dir] {
        if d.exists() {
            std::fs::remove_dir_all(d).with_context(|| format!("removing {}", d.display()))?;
        }
    }
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    eprintln!("xtask kernels: fetching {package}");
    let deb = apt
        .download(package, &work)
        .with_context(|| format!("downloading {package}"))?;
    let root = work.join("root");
    Cmd::new("dpkg-deb")
        .arg("-x")
        .arg(&deb)
        .arg(&root)
        .output()
        .with_context(|| format!("extracting {}", deb.display()))?;
    let kernel = open(package, &root)?;
    // kmod's depmod, not busybox's: it also writes modules.alias,
    // .softdep and the .bin indexes the guest's kmod modprobe reads.
    Cmd::new("/usr/sbin/depmod")
        .arg("-b")
        .arg(&root)
        .arg(&kernel.version)
        .output()
        .context("depmod (kmod)")?;
    std::fs::write(root.join(COMPLETE), "")?;
    std::fs::rename(&root, &dir)
        .with_context(|| format!("moving {} to {}", root.display(), dir.display()))?;
    std::fs::remove_dir_all(&work)?;
    eprintln!(
        "xtask kernels: {package} ready in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Removes the other kernels of `keep`'s series. Best effort: a leftover
/// only costs disk.
fn prune(cache: &Path, pattern: &str, keep: &str) {
    let Ok(entries) = std::fs::read_dir(cache) else {
        return;
    };
    for e in entries.filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().into_owned();
        if name != keep && matches(pattern, &name) {
            eprintln!("xtask kernels: removing {name}, superseded by {keep}");
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P61: &str = "linux-image-6.1.0-*-amd64-unsigned";
    const P612: &str = "linux-image-6.12.*+deb12-amd64-unsigned";

    #[test]
    fn patterns_take_only_the_std_flavour() {
        assert!(matches(P61, "linux-image-6.1.0-57-amd64-unsigned"));
        assert!(!matches(P61, "linux-image-6.1.0-57-cloud-amd64-unsigned"));
        assert!(!matches(P61, "linux-image-6.1.0-57-rt-amd64-unsigned"));
        assert!(!matches(P61, "linux-image-6.1.0--amd64-unsigned"));
        assert!(!matches(P61, "linux-image-6.12.118+deb12-amd64-unsigned"));
        assert!(matches(P612, "linux-image-6.12.118+deb12-amd64-unsigned"));
        assert!(!matches(
            P612,
            "linux-image-6.12.118+deb12-cloud-amd64-unsigned"
        ));
        assert!(!matches(P612, "linux-image-6.1.0-57-amd64-unsigned"));
        assert!(matches("exact", "exact"));
    }

    #[test]
    fn newest_is_what_sort_v_puts_last() {
        // As `apt-cache search` prints them, in the index's order.
        let out = "\
linux-image-6.1.0-9-amd64-unsigned - Linux 6.1 for 64-bit PCs
linux-image-6.1.0-57-cloud-amd64-unsigned - Linux 6.1 for x86-64 cloud
linux-image-6.1.0-57-amd64-unsigned - Linux 6.1 for 64-bit PCs
linux-image-6.1.0-56-amd64-unsigned - Linux 6.1 for 64-bit PCs
linux-image-6.12.95+deb12-amd64-unsigned - Linux 6.12 for 64-bit PCs
linux-image-6.12.118+deb12-amd64-unsigned - Linux 6.12 for 64-bit PCs
linux-image-6.12.118+deb12-rt-amd64-unsigned - Linux 6.12, PREEMPT_RT
linux-image-6.12.99+deb12-amd64-unsigned - Linux 6.12 for 64-bit PCs
";
        let names: Vec<&str> = out.lines().filter_map(|l| l.split(" - ").next()).collect();
        assert_eq!(
            newest(P61, names.iter().copied()),
            Some("linux-image-6.1.0-57-amd64-unsigned")
        );
        assert_eq!(
            newest(P612, names.iter().copied()),
            Some("linux-image-6.12.118+deb12-amd64-unsigned")
        );
        assert_eq!(
            newest("linux-image-5.10.0-*-amd64-unsigned", names.iter().copied()),
            None
        );
    }

    #[test]
    fn version_order_is_sort_v() {
        use Ordering::*;
        for (a, b, want) in [
            ("6.1.0-9", "6.1.0-57", Less),
            ("6.12.118+deb12", "6.12.95+deb12", Greater),
            ("6.1.0-57", "6.12.1", Less),
            ("1.0", "1.0", Equal),
            ("1.01", "1.1", Equal),
            ("1.0~rc1", "1.0", Less),
            ("1.0a", "1.0+", Less),
            ("1.0", "1.0a", Less),
            ("", "0", Equal),
        ] {
            assert_eq!(version_cmp(a, b), want, "{a} vs {b}");
            assert_eq!(version_cmp(b, a), want.reverse(), "{b} vs {a}");
        }
    }
}
