//! What a container runtime started by a test can leave on the host, found
//! and removed: processes that outlive it, cgroups, mounts, files. The
//! runtime harnesses (`cri`, `podman`) clean up with these on drop, and the
//! tests check with them that a pod left nothing behind.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

/// Files under `dir` (recursively) whose name contains `needle`: e.g. the
/// entries libcni's cache keeps per container ID.
pub fn files_named(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return found;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.is_dir() {
            found.extend(files_named(&path, needle));
        } else if e.file_name().to_string_lossy().contains(needle) {
            found.push(path);
        }
    }
    found
}

/// SIGTERM, a grace period for a runtime to close its stores, then SIGKILL.
pub fn stop_child(child: &mut Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: plain kill(2) on our own child, which is not yet reaped.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// PIDs of processes whose command line names `dir`: what a runtime started
/// and that outlives it (containerd's shims are started with `-address
/// <dir>/containerd.sock`, podman's conmon with `--exit-dir <dir>/...`).
pub fn processes_mentioning(dir: &Path) -> Vec<i32> {
    // The trailing slash keeps another harness's tempdir, whose name could
    // extend ours, out of the match.
    let needle = format!("{}/", dir.display());
    let me = std::process::id();
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me)
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(&needle))
                .unwrap_or(false)
        })
        .filter_map(|pid| i32::try_from(pid).ok())
        .collect()
}

/// SIGKILL, then waits (3 s at most) until none of `pids` runs.
pub fn kill_and_wait(pids: &[i32]) {
    for pid in pids {
        // SAFETY: kill(2) on a PID that was running a process of ours a moment ago.
        unsafe { libc::kill(*pid, libc::SIGKILL) };
    }
    // They are not our children: init reaps them, maybe much later, so a
    // zombie counts as gone.
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline && pids.iter().any(|p| alive(*p)) {
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn alive(pid: i32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the parenthesised command name, which may hold spaces.
    let state = stat
        .rsplit(')')
        .next()
        .and_then(|r| r.split_whitespace().next());
    !matches!(state, Some("Z" | "X") | None)
}

/// PIDs of the processes in the cgroup `parent` or below it, in each v1
/// hierarchy or the v2 tree: what a runtime started there, e.g. container
/// processes whose command line names nothing of the harness.
pub fn processes_in_cgroups(parent: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for path in cgroup_dirs(parent) {
        collect_cgroup_procs(&path, &mut pids);
    }
    // Never this process, whatever cgroup it was started in.
    let me = i32::try_from(std::process::id()).unwrap_or(0);
    pids.retain(|p| *p != me);
    pids.sort_unstable();
    pids.dedup();
    pids
}

fn collect_cgroup_procs(path: &Path, pids: &mut Vec<i32>) {
    if let Ok(procs) = fs::read_to_string(path.join("cgroup.procs")) {
        pids.extend(procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    if let Ok(entries) = fs::read_dir(path) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_cgroup_procs(&e.path(), pids);
            }
        }
    }
}

/// The directories of the cgroup `parent` that exist, one per v1 hierarchy
/// or the v2 tree; none for the root cgroup, which is the whole machine's.
fn cgroup_dirs(parent: &str) -> Vec<PathBuf> {
    let rel = parent.trim_start_matches('/');
    if rel.is_empty() {
        return Vec::new();
    }
    let mut roots = vec![PathBuf::from("/sys/fs/cgroup")];
    if let Ok(entries) = fs::read_dir("/sys/fs/cgroup") {
        roots.extend(entries.flatten().map(|e| e.path()));
    }
    roots
        .into_iter()
        .map(|root| root.join(rel))
        .filter(|p| p.is_dir())
        .collect()
}

/// Removes the cgroup `parent` and everything below it, in each v1
/// hierarchy or the v2 tree. Only empty cgroups can go; a cgroup still
/// holding a process stays, as it must.
pub fn remove_cgroups(parent: &str) {
    for path in cgroup_dirs(parent) {
        remove_cgroup_tree(&path);
    }
}

fn remove_cgroup_tree(path: &Path) {
    if let Ok(entries) = fs::read_dir(path) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    // A cgroup directory's files are the kernel's: rmdir takes them along.
    let _ = fs::remove_dir(path);
}

/// Mount points at or below `dir` in this process's mount namespace,
/// parents before children.
pub fn mounts_under(dir: &Path) -> Vec<String> {
    mount_points("/proc/self/mountinfo", dir)
}

/// Mount points at or below `dir` in the mount namespace of process `pid`
/// (a runtime's private one, whose mounts the host does not see), parents
/// before children.
pub fn mounts_of(pid: u32, dir: &Path) -> Vec<String> {
    mount_points(&format!("/proc/{pid}/mountinfo"), dir)
}

fn mount_points(mountinfo: &str, dir: &Path) -> Vec<String> {
    let prefix = dir.to_string_lossy().into_owned();
    fs::read_to_string(mountinfo)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(&prefix))
        .map(str::to_owned)
        .collect()
}
