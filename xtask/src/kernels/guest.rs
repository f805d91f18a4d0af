//! One guest: the script it runs, the QEMU command line, and its serial
//! console read line by line under a hard timeout.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// What the guest runs for one entry of the matrix.
#[derive(Debug, Clone)]
pub struct Job {
    /// The entry's name in markers and in the table.
    pub name: String,
    /// Where cargo test would run it: the package's directory.
    pub manifest_dir: PathBuf,
    pub package: String,
    pub executable: PathBuf,
    pub args: Vec<String>,
}

/// `text` quoted for sh: single quotes, with each `'` as `'\''`.
pub fn sh_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// The script the guest's /init runs in the chroot (the host's /bin/sh):
/// each job from its package's directory, one test thread (the guest has
/// one CPU, and the network-namespace tests assume the host's serial
/// order), between a start and a result marker.
pub fn run_script(jobs: &[Job]) -> String {
    let mut s = String::from(
        "# Written by `cargo xtask kernels`; run by the guest's /init.\n\
         up() { cut -d' ' -f1 /proc/uptime; }\n",
    );
    for j in jobs {
        let dir = sh_quote(&j.manifest_dir.to_string_lossy());
        let mut cmd = sh_quote(&j.executable.to_string_lossy());
        for a in std::iter::once("--test-threads=1").chain(j.args.iter().map(String::as_str)) {
            cmd.push(' ');
            cmd.push_str(&sh_quote(a));
        }
        let _ = write!(
            s,
            "echo \"MYCNI-START {name} uptime=$(up)\"\n\
             cd {dir} && CARGO_MANIFEST_DIR={dir} CARGO_PKG_NAME={pkg} {cmd} 2>&1\n\
             echo \"MYCNI-RESULT {name} rc=$? uptime=$(up)\"\n",
            name = j.name,
            pkg = sh_quote(&j.package),
        );
    }
    s
}

/// How the guest ran, as the host saw it.
#[derive(Debug)]
pub struct Console {
    pub lines: Vec<String>,
    /// QEMU's start to its exit (or to the kill at the timeout).
    pub wall: Duration,
    pub exit: Exit,
}

#[derive(Debug)]
pub enum Exit {
    Status(ExitStatus),
    TimedOut,
}

/// Where the guest's pieces are.
pub struct Boot<'a> {
    pub label: &'a str,
    pub vmlinuz: &'a Path,
    pub initrd: &'a Path,
    /// The extracted kernel package, shared read-only: its modules for
    /// autoload, its config for facts.
    pub kernel_dir: &'a Path,
    /// The workspace, shared read-write at the same path in the guest.
    pub workspace: &'a Path,
    pub script: &'a Path,
    pub log: &'a Path,
    pub timeout: Duration,
    pub verbose: bool,
}

/// `-accel kvm` only where KVM can run a stock kernel: real VT-x or
/// AMD-V, and /dev/kvm usable. A /dev/kvm without them (a nested PVM
/// hypervisor, as on the development machines) crawls or fails under
/// a stock kernel.
fn accel() -> &'static [&'static str] {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let hw = cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
    let kvm = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok();
    if hw && kvm {
        &["-accel", "kvm", "-cpu", "host"]
    } else {
        // TCG's default CPU model: `-cpu host` exists only under KVM.
        &["-accel", "tcg"]
    }
}

/// A path as a QEMU option value: commas doubled.
fn qemu_path(p: &Path) -> String {
    p.to_string_lossy().replace(',', ",,")
}

fn qemu_command(b: &Boot) -> Result<Command> {
    for p in [b.workspace, b.script] {
        if p.to_string_lossy().contains(char::is_whitespace) {
            bail!(
                "{} has whitespace: it goes on the kernel command line",
                p.display()
            );
        }
    }
    let mut c = Command::new("qemu-system-x86_64");
    c.args(accel());
    c.args(["-nodefaults", "-nographic", "-no-reboot"]);
    c.args(["-m", "1536", "-smp", "1"]);
    // No network device at all: the tests make their own in namespaces.
    c.args(["-nic", "none"]);
    c.args(["-serial", "stdio"]);
    c.arg("-kernel").arg(b.vmlinuz);
    c.arg("-initrd").arg(b.initrd);
    for (tag, path, ro) in [
        ("usr", Path::new("/usr"), true),
        ("etc", Path::new("/etc"), true),
        ("kernel", b.kernel_dir, true),
        ("ws", b.workspace, false),
    ] {
        let mut v = format!(
            "local,path={},mount_tag={tag},security_model=none",
            qemu_path(path)
        );
        if ro {
            v.push_str(",readonly=on");
        }
        c.arg("-virtfs").arg(v);
    }
    c.arg("-append").arg(format!(
        "console=ttyS0 panic=-1 quiet mycni.ws={} mycni.run={}",
        b.workspace.display(),
        b.script.display()
    ));
    Ok(c)
}

enum Event {
    Line(String),
    Eof,
}

fn forward(stream: impl Read + Send + 'static, tx: mpsc::Sender<Event>) {
    std::thread::spawn(move || {
        let mut r = BufReader::new(stream);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match r.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buf);
                    let line = line.trim_end_matches(['\n', '\r']).to_string();
                    if tx.send(Event::Line(line)).is_err() {
                        return;
                    }
                }
            }
        }
        let _ = tx.send(Event::Eof);
    });
}

/// Lines worth showing while the guest runs, without `--verbose`.
fn shown(line: &str) -> bool {
    line.contains("MYCNI-")
        || line.starts_with("test ")
        || line.contains("Kernel panic")
        || line.contains("BUG:")
        || line.contains("qemu-system")
}

/// Boots the guest and collects its console until it powers off, the
/// console closes, or `timeout` passes (then QEMU is killed).
pub fn boot(b: &Boot) -> Result<Console> {
    let mut cmd = qemu_command(b)?;
    let mut log =
        std::fs::File::create(b.log).with_context(|| format!("creating {}", b.log.display()))?;
    let started = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot start qemu-system-x86_64 (package qemu-system-x86)")?;
    let (tx, rx) = mpsc::channel();
    if let Some(out) = child.stdout.take() {
        forward(out, tx.clone());
    }
    if let Some(err) = child.stderr.take() {
        forward(err, tx.clone());
    }
    drop(tx);
    let deadline = started + b.timeout;
    let mut lines = Vec::new();
    let mut open = 2;
    let mut timed_out = false;
    while open > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Event::Line(l)) => {
                let _ = writeln!(log, "{l}");
                if b.verbose || shown(&l) {
                    eprintln!("[{}] {l}", b.label);
                }
                lines.push(l);
            }
            Ok(Event::Eof) => open -= 1,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                timed_out = true;
                break;
            }
        }
    }
    if timed_out {
        let _ = writeln!(log, "xtask: killed after {} s", b.timeout.as_secs());
        // Only the QEMU this call started, by its own handle.
        let _ = child.kill();
    }
    let status = child.wait().context("waiting for qemu")?;
    Ok(Console {
        lines,
        wall: started.elapsed(),
        exit: if timed_out {
            Exit::TimedOut
        } else {
            Exit::Status(status)
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_runs_each_job_between_markers() {
        let jobs = [Job {
            name: "ebpf_prog".into(),
            manifest_dir: "/w/tests/e2e".into(),
            package: "mycni-e2e".into(),
            executable: "/w/target/debug/deps/ebpf_prog-1".into(),
            args: vec!["fast_path".into(), "it's".into()],
        }];
        let s = run_script(&jobs);
        assert!(s.contains("echo \"MYCNI-START ebpf_prog uptime=$(up)\"\n"));
        assert!(s.contains(
            "cd '/w/tests/e2e' && CARGO_MANIFEST_DIR='/w/tests/e2e' CARGO_PKG_NAME='mycni-e2e' \
             '/w/target/debug/deps/ebpf_prog-1' '--test-threads=1' 'fast_path' 'it'\\''s' 2>&1\n"
        ));
        assert!(s.contains("echo \"MYCNI-RESULT ebpf_prog rc=$? uptime=$(up)\"\n"));
    }

    #[test]
    fn the_command_line_shares_usr_the_kernel_and_the_workspace() {
        let b = Boot {
            label: "6.1",
            vmlinuz: Path::new("/c/k/boot/vmlinuz-6.1.0-57-amd64"),
            initrd: Path::new("/w/target/kernels-run/6.1/initramfs.cpio"),
            kernel_dir: Path::new("/c/k,1"),
            workspace: Path::new("/w"),
            script: Path::new("/w/target/kernels-run/6.1/run.sh"),
            log: Path::new("/dev/null"),
            timeout: Duration::from_secs(1),
            verbose: false,
        };
        let c = qemu_command(&b).unwrap();
        let args: Vec<String> = c
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let line = args.join(" ");
        assert!(line.contains("-nodefaults -nographic -no-reboot -m 1536 -smp 1 -nic none"));
        assert!(!line.contains("-cpu host") || line.contains("-accel kvm"));
        assert!(
            line.contains("-virtfs local,path=/usr,mount_tag=usr,security_model=none,readonly=on")
        );
        assert!(
            line.contains("-virtfs local,path=/etc,mount_tag=etc,security_model=none,readonly=on")
        );
        assert!(line.contains(
            "-virtfs local,path=/c/k,,1,mount_tag=kernel,security_model=none,readonly=on"
        ));
        assert!(line.contains("-virtfs local,path=/w,mount_tag=ws,security_model=none "));
        assert_eq!(
            args.last().map(String::as_str),
            Some(
                "console=ttyS0 panic=-1 quiet mycni.ws=/w mycni.run=/w/target/kernels-run/6.1/run.sh"
            )
        );
        let spaced = Boot {
            workspace: Path::new("/my work"),
            ..b
        };
        assert!(qemu_command(&spaced).is_err());
    }
}
