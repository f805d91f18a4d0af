//! What a delegated IPAM binary answered to VERSION, remembered in the
//! plugin's state dir (`<state dir>/ipam-versions/<binary name>.json`) for
//! as long as the binary is the same file: same path, device, inode, size,
//! modification and change times. A runtime that speaks a newer version
//! than the delegate (containerd running the conflist in 1.1.0, Debian's
//! host-local speaking up to 1.0.0) would otherwise cost three execs per
//! ADD: the refused ADD, VERSION and the ADD again.
//!
//! Only ever a hint: a version the entry promises and the delegate refuses
//! is negotiated afresh (and the entry rewritten), so a stale or forged
//! entry costs an exec, never a wrong answer. Written whole or not at all
//! (a temporary file renamed over the name); every failure to read or
//! write it is ignored, as if there were none.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The directory under the state dir.
pub(super) const DIR: &str = "ipam-versions";

/// What identifies one build of a binary at one path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Identity {
    path: PathBuf,
    dev: u64,
    ino: u64,
    size: u64,
    mtime: i64,
    mtime_nsec: i64,
    ctime: i64,
    ctime_nsec: i64,
}

impl Identity {
    fn of(path: &Path) -> Option<Self> {
        let m = fs::metadata(path).ok()?;
        Some(Self {
            path: path.to_path_buf(),
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: m.mtime(),
            mtime_nsec: m.mtime_nsec(),
            ctime: m.ctime(),
            ctime_nsec: m.ctime_nsec(),
        })
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Entry {
    binary: Identity,
    #[serde(rename = "supportedVersions")]
    supported_versions: Vec<String>,
}

/// The cache entry of one binary.
#[derive(Debug)]
pub(super) struct VersionCache {
    file: PathBuf,
    binary: Identity,
}

impl VersionCache {
    /// None when the binary cannot be looked at (it is then not run
    /// either) or has no file name.
    pub(super) fn new(state_dir: &Path, bin: &Path) -> Option<Self> {
        let name = bin.file_name()?;
        let mut file_name = name.to_os_string();
        file_name.push(".json");
        Some(Self {
            file: state_dir.join(DIR).join(file_name),
            binary: Identity::of(bin)?,
        })
    }

    /// The versions the binary listed, if the entry is this binary's.
    pub(super) fn load(&self) -> Option<Vec<String>> {
        let body = fs::read(&self.file).ok()?;
        let entry: Entry = serde_json::from_slice(&body).ok()?;
        (entry.binary == self.binary).then_some(entry.supported_versions)
    }

    /// Remembers `versions` for this binary; best effort.
    pub(super) fn store(&self, versions: &[String]) {
        let entry = Entry {
            binary: self.binary.clone(),
            supported_versions: versions.to_vec(),
        };
        if let Err(e) = self.write(&entry) {
            crate::log::warn(&format!(
                "cannot remember the versions of {} in {}: {e}",
                self.binary.path.display(),
                self.file.display()
            ));
        }
    }

    fn write(&self, entry: &Entry) -> std::io::Result<()> {
        let body = serde_json::to_vec(entry)?;
        let Some(dir) = self.file.parent() else {
            return Ok(());
        };
        fs::create_dir_all(dir)?;
        // Per process, so that two plugins negotiating at once never write
        // into one temporary file.
        let tmp = dir.join(format!(".tmp-{}", std::process::id()));
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(&tmp)?;
        let written = f
            .write_all(&body)
            .and_then(|()| fs::rename(&tmp, &self.file));
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        written
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_the_binarys_until_the_binary_changes() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("ipam");
        fs::write(&bin, "one").unwrap();
        let cache = VersionCache::new(dir.path(), &bin).unwrap();
        assert_eq!(cache.load(), None, "nothing stored yet");
        let versions = vec!["0.4.0".to_string(), "1.0.0".to_string()];
        cache.store(&versions);
        assert!(dir.path().join(DIR).join("ipam.json").is_file());
        let again = VersionCache::new(dir.path(), &bin).unwrap();
        assert_eq!(again.load(), Some(versions.clone()));
        // Another build in the same place: another size, inode or time.
        fs::remove_file(&bin).unwrap();
        fs::write(&bin, "two, longer").unwrap();
        let replaced = VersionCache::new(dir.path(), &bin).unwrap();
        assert_eq!(replaced.load(), None);
        // Another binary of the same name elsewhere does not read it either.
        let other_dir = dir.path().join("other");
        fs::create_dir(&other_dir).unwrap();
        let other = other_dir.join("ipam");
        fs::write(&other, "one").unwrap();
        assert_eq!(VersionCache::new(dir.path(), &other).unwrap().load(), None);
    }

    #[test]
    fn garbage_reads_as_no_entry() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("ipam");
        fs::write(&bin, "x").unwrap();
        fs::create_dir(dir.path().join(DIR)).unwrap();
        fs::write(dir.path().join(DIR).join("ipam.json"), "{not json").unwrap();
        assert_eq!(VersionCache::new(dir.path(), &bin).unwrap().load(), None);
        assert!(VersionCache::new(dir.path(), &dir.path().join("missing")).is_none());
    }
}
