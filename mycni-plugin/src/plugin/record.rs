//! The pod record the agent reads (`contract::PodRecord`): which Pod a host
//! veth and its addresses belong to, as the runtime named it in `CNI_ARGS`.

use std::fs;
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use mycni_common::contract::{POD_RECORDS_DIR, PodRecord};

use crate::config::{Env, NetConf};
use crate::error::{CniError, Code, Result};

/// `<state dir>/pods` (see [`NetConf::state_dir`]).
fn records_dir(conf: &NetConf) -> Option<PathBuf> {
    Some(conf.state_dir()?.join(POD_RECORDS_DIR))
}

fn io_error(path: &Path, what: &str, e: std::io::Error) -> CniError {
    CniError::new(
        Code::Io,
        format!("cannot {what} pod record {}: {e}", path.display()),
    )
}

/// Writes the record of this ADD, whole or not at all (a temporary file
/// renamed over the name), so the agent never reads half of one. Nothing
/// is written when the runtime did not say which Pod this is: there is
/// nothing for the agent to learn.
pub(super) fn write(conf: &NetConf, env: &Env, host_veth: &str, ips: &[IpAddr]) -> Result<()> {
    let (Some(namespace), Some(name)) = (&env.args.pod_namespace, &env.args.pod_name) else {
        return Ok(());
    };
    let Some(dir) = records_dir(conf) else {
        return Ok(());
    };
    let record = PodRecord {
        namespace: namespace.clone(),
        name: name.clone(),
        container_id: env.container_id.clone(),
        ifname: env.ifname.clone(),
        host_veth: host_veth.to_string(),
        ips: ips.to_vec(),
    };
    let body = serde_json::to_vec(&record)
        .map_err(|e| CniError::new(Code::Io, format!("cannot encode the pod record: {e}")))?;
    let path = dir.join(host_veth);
    let tmp = dir.join(format!(".tmp-{host_veth}"));
    let open = || {
        fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(&tmp)
    };
    // The directory exists on all but a node's first ADD: made only then.
    let opened = match open() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(&dir)
                .map_err(|e| io_error(&dir, "create the directory of the", e))?;
            open()
        }
        other => other,
    };
    let mut f = opened.map_err(|e| io_error(&tmp, "create", e))?;
    f.write_all(&body).map_err(|e| io_error(&tmp, "write", e))?;
    fs::rename(&tmp, &path).map_err(|e| io_error(&path, "publish", e))
}

/// Removes the record of `host_veth` if it names this container: a newer
/// sandbox of the same pod (same veth name) keeps its own.
pub(super) fn remove(conf: &NetConf, env: &Env, host_veth: &str) -> Result<()> {
    let Some(dir) = records_dir(conf) else {
        return Ok(());
    };
    let path = dir.join(host_veth);
    let theirs = match fs::read(&path) {
        Ok(body) => serde_json::from_slice::<PodRecord>(&body)
            .is_ok_and(|r| r.container_id != env.container_id || r.ifname != env.ifname),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_error(&path, "read", e)),
    };
    if theirs {
        return Ok(());
    }
    match fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_error(&path, "remove", e)),
        _ => Ok(()),
    }
}

/// Removes the records no host veth of this node is left for (GC: the
/// runtime's DEL never came).
pub(super) fn prune(conf: &NetConf, live_veths: &std::collections::HashSet<String>) -> Result<()> {
    let Some(dir) = records_dir(conf) else {
        return Ok(());
    };
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_error(&dir, "list", e)),
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !live_veths.contains(name.trim_start_matches(".tmp-")) {
            let _ = fs::remove_file(entry.path());
        }
    }
    Ok(())
}
