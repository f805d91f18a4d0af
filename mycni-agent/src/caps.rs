//! The capabilities the agent needs, probed at start so a DaemonSet with a
//! missing `capabilities.add` entry fails at once with the name of what is
//! missing, instead of with EPERM from deep inside netlink or bpf(2).
//!
//! CAP_SYS_ADMIN is not among them: the loader uses it only to find
//! `nf_conntrack`'s BTF object where the conntrack kfuncs are in that module
//! (`datapath::kfuncs`), and [`drop_sys_admin`] gives it up once the
//! programs are loaded. Without it the agent runs all the same; on such a
//! kernel it runs the kernel path and says why.

/// A capability, its bit in `CapEff`, and what the agent uses it for.
pub struct Cap {
    pub name: &'static str,
    pub bit: u32,
    pub why: &'static str,
}

pub const NET_ADMIN: Cap = Cap {
    name: "CAP_NET_ADMIN",
    bit: 12,
    why: "vxlan.1, routes, neighbours, FDB, nftables masquerade, tc programs",
};
pub const PERFMON: Cap = Cap {
    name: "CAP_PERFMON",
    bit: 38,
    why: "the verifier's privileged mode, which the fast path's packet parsing needs",
};
pub const BPF: Cap = Cap {
    name: "CAP_BPF",
    bit: 39,
    why: "loading the fast path's maps and programs (bpf(2))",
};

/// CAP_SYS_ADMIN's bit: held, if at all, only until the programs are loaded.
pub(crate) const SYS_ADMIN_BIT: u32 = 21;

/// The effective capability set of this process, from /proc/self/status.
pub fn effective() -> std::io::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .ok_or_else(|| std::io::Error::other("no CapEff line in /proc/self/status"))
}

/// What [`drop_sys_admin`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dropped {
    /// CAP_SYS_ADMIN was in the effective or permitted set before.
    pub held: bool,
    /// It is out of the bounding set too (it was not there, or this process
    /// had CAP_SETPCAP to take it out). False in the DaemonSet, which grants
    /// no CAP_SETPCAP: there `no_new_privs` keeps it from children.
    pub bounding: bool,
    /// Threads besides the caller that had to drop it too.
    pub threads: usize,
}

const CAP_V3: u32 = 0x2008_0522; // _LINUX_CAPABILITY_VERSION_3
const SYS_ADMIN_MASK: u32 = 1 << SYS_ADMIN_BIT; // in the first of the two words

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// The drop, on the calling thread only: Linux keeps capabilities, the
/// bounding set and `no_new_privs` per thread. Raw system calls and no
/// allocation, so a signal handler can run it. Ok(was held, out of the
/// bounding set), or the errno.
fn drop_on_this_thread() -> Result<(bool, bool), i32> {
    // SAFETY: prctl with integer arguments only; PR_CAPBSET_DROP fails
    // (EPERM) without CAP_SETPCAP, which is not an error here.
    let bounding = unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(errno());
        }
        libc::prctl(libc::PR_CAPBSET_READ, SYS_ADMIN_BIT, 0, 0, 0) == 0
            || libc::prctl(libc::PR_CAPBSET_DROP, SYS_ADMIN_BIT, 0, 0, 0) == 0
    };
    let mut head = CapHeader {
        version: CAP_V3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: a version 3 header and the two data structs it reads into.
    if unsafe { libc::syscall(libc::SYS_capget, &mut head, data.as_mut_ptr()) } != 0 {
        return Err(errno());
    }
    let d = &mut data[0];
    let held = (d.effective | d.permitted) & SYS_ADMIN_MASK != 0;
    if (d.effective | d.permitted | d.inheritable) & SYS_ADMIN_MASK != 0 {
        d.effective &= !SYS_ADMIN_MASK;
        d.permitted &= !SYS_ADMIN_MASK;
        d.inheritable &= !SYS_ADMIN_MASK;
        // SAFETY: as above, the structs it writes from; lowering a set
        // needs no capability (the ambient set follows permitted).
        if unsafe { libc::syscall(libc::SYS_capset, &mut head, data.as_ptr()) } != 0 {
            return Err(errno());
        }
    }
    Ok((held, bounding))
}

/// The first errno a thread's handler met (0: none).
static HANDLER_ERRNO: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn on_drop_signal(_: libc::c_int) {
    // SAFETY: errno of this thread, saved and restored around the handler
    // so the interrupted code sees its own.
    let saved = unsafe { *libc::__errno_location() };
    if let Err(e) = drop_on_this_thread() {
        let _ = HANDLER_ERRNO.compare_exchange(
            0,
            e,
            std::sync::atomic::Ordering::Relaxed,
            std::sync::atomic::Ordering::Relaxed,
        );
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = saved };
}

/// Whether thread `tid`'s status still shows CAP_SYS_ADMIN (or no
/// `no_new_privs`; or the bounding set, when `bounding`). A thread gone
/// counts as done.
fn thread_holds(tid: &str, bounding: bool) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")) else {
        return false;
    };
    let mut sets = vec!["CapEff:", "CapPrm:", "CapInh:"];
    if bounding {
        sets.push("CapBnd:");
    }
    status.lines().any(|l| {
        sets.iter().any(|s| {
            l.strip_prefix(s)
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
                .is_some_and(|v| v & (1 << SYS_ADMIN_BIT) != 0)
        }) || l
            .strip_prefix("NoNewPrivs:")
            .is_some_and(|v| v.trim() != "1")
    })
}

/// Gives up CAP_SYS_ADMIN for good, in every thread of the process: out of
/// the effective, permitted and inheritable sets (and so the ambient one),
/// out of the bounding set where the process holds CAP_SETPCAP, and
/// `no_new_privs` set, so no program it runs later (`nft`, as uid 0) gets
/// it back from the bounding set on execve. Called once the programs are
/// loaded, or their load given up: its one use is finding a kernel
/// module's BTF object (BPF_BTF_GET_NEXT_ID, BPF_BTF_GET_FD_BY_ID), whose
/// fd the loaded programs keep.
///
/// Capabilities are per thread and the runtime's threads exist already, so
/// each other thread drops it in a handler of a real-time signal sent to it
/// (as glibc's setuid and Go's `AllThreadsSyscall` do), until
/// `/proc/self/task` lists no thread that holds it. The handler stays
/// installed: a second signal queued to a thread finds nothing to do.
pub(crate) fn drop_sys_admin() -> std::io::Result<Dropped> {
    let (held, bounding) = drop_on_this_thread().map_err(std::io::Error::from_raw_os_error)?;
    let sig = libc::SIGRTMIN() + DROP_SIGNAL_OFFSET;
    // SAFETY: a zeroed sigaction with a handler that only makes raw system
    // calls (async-signal-safe); the old action is read first and kept
    // unless it is the default.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if old.sa_sigaction != libc::SIG_DFL
            && old.sa_sigaction != on_drop_signal as *const () as usize
        {
            return Err(std::io::Error::other(format!(
                "signal SIGRTMIN+{DROP_SIGNAL_OFFSET} is in use; cannot reach the other threads"
            )));
        }
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = on_drop_signal as *const () as usize;
        act.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut act.sa_mask);
        if libc::sigaction(sig, &act, std::ptr::null_mut()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    let pid = std::process::id() as libc::pid_t;
    // SAFETY: gettid has no arguments.
    let me = unsafe { libc::gettid() }.to_string();
    let mut signalled = std::collections::BTreeSet::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        let err = HANDLER_ERRNO.load(std::sync::atomic::Ordering::Relaxed);
        if err != 0 {
            return Err(std::io::Error::from_raw_os_error(err));
        }
        let holding: Vec<String> = std::fs::read_dir("/proc/self/task")?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|tid| *tid != me && thread_holds(tid, bounding))
            .collect();
        if holding.is_empty() {
            return Ok(Dropped {
                held,
                bounding,
                threads: signalled.len(),
            });
        }
        if std::time::Instant::now() > deadline {
            return Err(std::io::Error::other(format!(
                "threads {holding:?} still hold CAP_SYS_ADMIN (is SIGRTMIN+{DROP_SIGNAL_OFFSET} blocked there?)"
            )));
        }
        for tid in holding {
            let Ok(t) = tid.parse::<libc::pid_t>() else {
                continue;
            };
            // SAFETY: tgkill to a thread of this process; ESRCH when it
            // is gone, which the next listing shows.
            unsafe { libc::syscall(libc::SYS_tgkill, pid, t, sig) };
            signalled.insert(t);
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// [`drop_sys_admin`], logged: start-up calls it right after the programs
/// are loaded (or their load given up). An error stops the agent: it would
/// keep CAP_SYS_ADMIN for its whole life.
pub(crate) fn drop_sys_admin_after_load() -> anyhow::Result<()> {
    use anyhow::Context;
    let d = drop_sys_admin().context("dropping CAP_SYS_ADMIN after the programs loaded")?;
    if d.held {
        tracing::info!(
            bounding_set = d.bounding,
            other_threads = d.threads,
            "CAP_SYS_ADMIN dropped (only finding nf_conntrack's BTF object needed it); no_new_privs set"
        );
    }
    Ok(())
}

/// Which real-time signal carries the drop to the other threads.
const DROP_SIGNAL_OFFSET: libc::c_int = 7;

/// The capabilities of `required` missing from `effective`, with a message
/// an operator can act on; Ok when none is.
pub fn check(effective: u64, required: &[Cap]) -> Result<(), String> {
    let missing: Vec<&Cap> = required
        .iter()
        .filter(|c| effective & (1u64 << c.bit) == 0)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = missing
        .iter()
        .map(|c| format!("{} ({})", c.name, c.why))
        .collect();
    Err(format!(
        "missing capabilit{} {}; add {} to the agent container's securityContext.capabilities.add (see deploy/base/daemonset.yaml){}",
        if missing.len() == 1 { "y" } else { "ies" },
        list.join(", "),
        missing
            .iter()
            .map(|c| c.name.trim_start_matches("CAP_"))
            .collect::<Vec<_>>()
            .join(", "),
        if missing.iter().any(|c| c.bit != NET_ADMIN.bit) {
            ", or run with --datapath kernel"
        } else {
            ""
        }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This thread's own effective set (`/proc/self` is the process's
    /// first thread).
    fn thread_effective() -> u64 {
        let status = std::fs::read_to_string("/proc/thread-self/status").expect("status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .expect("CapEff")
    }

    /// In a child process of its own (the drop is for good, and the test
    /// harness runs other tests in threads of this one): threads asleep, in
    /// a blocking read and spawned while the drop runs all end up without
    /// CAP_SYS_ADMIN and with `no_new_privs`, and go on working.
    #[test]
    fn the_drop_reaches_every_thread() {
        const CHILD: &str = "MYCNI_TEST_DROP_CHILD";
        if std::env::var_os(CHILD).is_none() {
            let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
                .args(["caps::tests::the_drop_reaches_every_thread", "--exact"])
                .args(["--nocapture", "--test-threads=1"])
                .env(CHILD, "1")
                .output()
                .expect("running the child");
            assert!(
                out.status.success(),
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            return;
        }
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let sleeper = std::thread::spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(300));
            thread_effective()
        });
        let waiter = std::thread::spawn(move || rx.recv().is_ok());
        // Threads come and go while the drop runs.
        let spawner = std::thread::spawn(|| {
            for _ in 0..20 {
                std::thread::spawn(thread_effective).join().expect("join");
            }
        });
        let held = thread_effective() & (1 << SYS_ADMIN_BIT) != 0;
        let d = drop_sys_admin().expect("drop");
        assert_eq!(d.held, held);
        spawner.join().expect("spawner");
        tx.send(()).expect("send");
        assert!(waiter.join().expect("waiter"));
        let slept = sleeper.join().expect("sleeper");
        assert_eq!(
            slept & (1 << SYS_ADMIN_BIT),
            0,
            "the sleeping thread kept it"
        );
        let me = std::fs::read_to_string("/proc/self/status").expect("status");
        assert!(me.lines().any(|l| l == "NoNewPrivs:\t1"), "{me}");
        for t in std::fs::read_dir("/proc/self/task").expect("tasks") {
            let tid = t.expect("task").file_name().into_string().expect("tid");
            assert!(!thread_holds(&tid, d.bounding), "thread {tid} holds it");
        }
        assert_eq!(thread_effective() & (1 << SYS_ADMIN_BIT), 0);
        assert_eq!(effective().expect("CapEff") & (1 << SYS_ADMIN_BIT), 0);
        // Idempotent: nothing left to drop.
        assert!(!drop_sys_admin().expect("again").held);
    }

    #[test]
    fn names_exactly_the_missing_ones() {
        let all = (1u64 << 12) | (1 << 38) | (1 << 39);
        let (ebpf, kernel) = ([NET_ADMIN, BPF, PERFMON], [NET_ADMIN]);
        assert!(check(all, &ebpf).is_ok());
        assert!(check(1 << 12, &kernel).is_ok());
        let e = check(all & !(1 << 39), &ebpf).unwrap_err();
        assert!(
            e.contains("CAP_BPF") && !e.contains("CAP_PERFMON") && !e.contains("CAP_NET_ADMIN")
        );
        assert!(e.contains("--datapath kernel"));
        let e = check(0, &kernel).unwrap_err();
        assert!(e.contains("CAP_NET_ADMIN") && !e.contains("--datapath kernel"));
    }
}
