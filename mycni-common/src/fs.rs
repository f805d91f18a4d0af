//! Files other processes read while they are being replaced.

use std::format;
use std::io;
use std::path::Path;

/// Writes a temporary file in the same directory, then renames it over
/// `path`: a reader (the runtime reading the conflist, the plugin reading
/// the ready file, the agent reading its VTEP MAC back) never sees a
/// half-written file. The directory is created if missing.
pub fn write_atomic(path: &Path, content: &[u8]) -> io::Result<()> {
    let at = |what: &str, p: &Path, e: io::Error| {
        io::Error::new(e.kind(), format!("{what} {}: {e}", p.display()))
    };
    let dir = path
        .parent()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path without parent"))?;
    std::fs::create_dir_all(dir).map_err(|e| at("creating", dir, e))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, content).map_err(|e| at("writing", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| at("renaming to", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    #[test]
    fn replaces_whole_and_leaves_no_temporary() {
        let dir = std::env::temp_dir().join(format!("mycni-fs-{}", std::process::id()));
        let f = dir.join("sub/ready");
        write_atomic(&f, b"one").expect("first write");
        write_atomic(&f, b"two").expect("second write");
        assert_eq!(std::fs::read(&f).expect("read"), b"two");
        let left: Vec<_> = std::fs::read_dir(dir.join("sub")).expect("dir").collect();
        assert_eq!(left.len(), 1, "{left:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
