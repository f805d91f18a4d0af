//! What the running kernel offers the fast path, for `mycni-agent
//! check-config`: its release, BTF, where the conntrack kfuncs are, whether
//! `nf_conntrack` is built in or loaded, whether TCX is there (and so how
//! the programs would attach), and one verdict line.
//!
//! Read-only and quick: it reads sysfs and vmlinux's BTF and asks the kernel
//! one `BPF_PROG_QUERY`; it loads, attaches and pins nothing, and does not
//! make the kernel load `nf_conntrack` (the agent does, at start). Probing
//! ([`Probe::run`]) is apart from what is said about it ([`Probe::render`],
//! [`Probe::verdict`]), which the unit tests cover.

use std::io::Write;
use std::path::Path;

use crate::datapath::attach::Tcx;

use aya_obj::btf::BtfKind;

use crate::datapath::Mode;
use crate::datapath::kfuncs::{self, Home, KfuncError};

/// Where the conntrack kfuncs are, as far as this process can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kfuncs {
    /// In vmlinux's BTF (conntrack built in).
    Vmlinux,
    /// In `nf_conntrack`'s BTF, and this process reached its BTF object.
    Module,
    /// In `nf_conntrack`'s BTF, but its BTF object is out of this process's
    /// reach: the error, which names CAP_SYS_ADMIN.
    ModuleObject(String),
    /// Not in vmlinux's BTF, and `nf_conntrack` is a module not loaded yet:
    /// its BTF cannot be read before it is.
    ModuleNotLoaded,
    /// `nf_conntrack` is loaded but has no BTF of its own
    /// (CONFIG_DEBUG_INFO_BTF_MODULES is off).
    NoModuleBtf,
    /// This kfunc is missing, and the Linux release it arrived in.
    Absent {
        name: &'static str,
        since: &'static str,
    },
    /// The BTF could not be read or parsed.
    Unreadable(String),
}

/// `nf_conntrack` in `/sys/module`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conntrack {
    BuiltIn,
    Loaded,
    /// Not loaded; whether `/lib/modules/<release>/modules.dep` lists it
    /// (None: no such file here, as in a container).
    NotLoaded {
        available: Option<bool>,
    },
}

/// What was found, the input of [`Probe::render`] and [`Probe::verdict`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// `uname -r`.
    pub release: String,
    /// `/sys/kernel/btf/vmlinux` exists.
    pub btf: bool,
    pub kfuncs: Kfuncs,
    pub conntrack: Conntrack,
    pub tcx: Tcx,
    /// The agent has an eBPF object (embedded, or `--ebpf-object`).
    pub object: bool,
    /// `MYCNI_TC_ATTACH` (`tcx` or `legacy`), which the agent obeys
    /// instead of the probe.
    pub forced: Option<&'static str>,
}

impl Probe {
    /// Probes the running kernel; `object`: whether the agent has its eBPF
    /// object.
    pub fn run(object: bool) -> Self {
        let release = release();
        let sys_btf = Path::new("/sys/kernel/btf");
        let btf = sys_btf.join("vmlinux").exists();
        let modules_dep = Path::new("/lib/modules").join(&release).join("modules.dep");
        let conntrack = conntrack(Path::new("/sys/module"), &modules_dep);
        let kfuncs = if btf {
            locate(sys_btf, conntrack)
        } else {
            Kfuncs::Unreadable("no /sys/kernel/btf/vmlinux".to_owned())
        };
        Probe {
            release,
            btf,
            kfuncs,
            conntrack,
            tcx: crate::datapath::attach::probe_tcx(),
            object,
            forced: match std::env::var("MYCNI_TC_ATTACH").as_deref() {
                Ok("tcx") => Some("tcx"),
                Ok("legacy") => Some("legacy"),
                _ => None,
            },
        }
    }

    /// How the programs attach, as the agent chooses (`datapath::attach`):
    /// `MYCNI_TC_ATTACH`, else TCX where the kernel has it, else the legacy
    /// clsact qdisc with cls_bpf filters. None: not probed.
    fn attach_mode(&self) -> Option<&'static str> {
        match (self.forced, &self.tcx) {
            (Some("legacy"), _) | (None, Tcx::No) => Some("clsact + cls_bpf"),
            (Some(_), _) | (None, Tcx::Yes) => Some("tcx"),
            (None, Tcx::Unknown(_)) => None,
        }
    }

    /// [`Self::attach_mode`] for the report's `attach:` line.
    pub fn attach(&self) -> String {
        match (self.attach_mode(), self.forced) {
            (Some(m), Some(f)) => format!("{m} (MYCNI_TC_ATTACH={f})"),
            (Some(m), None) => m.to_owned(),
            (None, _) => "tcx on Linux >= 6.6, else clsact + cls_bpf".to_owned(),
        }
    }

    /// One line: the fast path, or the kernel path and why, for `mode`.
    pub fn verdict(&self, mode: Mode) -> String {
        let kernel = |why: &str| format!("kernel path: {why}");
        if mode == Mode::Kernel {
            return kernel("--datapath kernel");
        }
        if !self.object {
            return kernel("this agent was built without the eBPF object");
        }
        if !self.btf {
            return kernel("no BTF (/sys/kernel/btf/vmlinux; CONFIG_DEBUG_INFO_BTF)");
        }
        let attach = self
            .attach_mode()
            .map_or("attach not probed".to_owned(), |m| format!("attach: {m}"));
        match &self.kfuncs {
            Kfuncs::Vmlinux | Kfuncs::Module => format!("fast path ({attach})"),
            Kfuncs::ModuleObject(e) => format!(
                "fast path if the agent starts with CAP_SYS_ADMIN (the DaemonSet adds it), else kernel path: {e}"
            ),
            Kfuncs::ModuleNotLoaded => format!(
                "fast path if nf_conntrack has the kfuncs ({attach}): the agent loads it at start; check-config does not, so its BTF is not read"
            ),
            Kfuncs::NoModuleBtf => {
                kernel("nf_conntrack has no BTF (CONFIG_DEBUG_INFO_BTF_MODULES)")
            }
            Kfuncs::Absent { name, since } => kernel(&format!(
                "no conntrack kfunc {name} (Linux >= {since} with nf_conntrack and BTF)"
            )),
            Kfuncs::Unreadable(e) => kernel(e),
        }
    }

    /// The report, a `key: value` line each, the verdict last.
    pub fn render(&self, mode: Mode) -> String {
        let kfuncs = match &self.kfuncs {
            Kfuncs::Vmlinux => "in vmlinux's BTF".to_owned(),
            Kfuncs::Module => format!("in {}'s BTF", kfuncs::MODULE),
            Kfuncs::ModuleObject(_) => format!(
                "in {}'s BTF; its BTF object needs CAP_SYS_ADMIN, which this process lacks",
                kfuncs::MODULE
            ),
            Kfuncs::ModuleNotLoaded => {
                format!("not in vmlinux's BTF; {} not loaded", kfuncs::MODULE)
            }
            Kfuncs::NoModuleBtf => format!("not in vmlinux's BTF; {} has no BTF", kfuncs::MODULE),
            Kfuncs::Absent { name, since } => format!("{name} missing (Linux >= {since})"),
            Kfuncs::Unreadable(e) => format!("unknown: {e}"),
        };
        let conntrack = match self.conntrack {
            Conntrack::BuiltIn => "built in",
            Conntrack::Loaded => "module, loaded",
            Conntrack::NotLoaded {
                available: Some(true),
            } => "module, not loaded (the agent loads it at start)",
            Conntrack::NotLoaded {
                available: Some(false),
            } => "not loaded, and not in modules.dep",
            Conntrack::NotLoaded { available: None } => "not loaded (modules.dep not readable)",
        };
        let tcx = match &self.tcx {
            Tcx::Yes => "yes".to_owned(),
            Tcx::No => "no (Linux < 6.6)".to_owned(),
            Tcx::Unknown(e) => format!("not probed: {e}"),
        };
        format!(
            "kernel: {}\nbtf: {}\nconntrack kfuncs: {kfuncs}\nnf_conntrack: {conntrack}\ntcx: {tcx}\nattach: {}\nverdict: {}\n",
            self.release,
            if self.btf {
                "/sys/kernel/btf/vmlinux"
            } else {
                "none"
            },
            self.attach(),
            self.verdict(mode),
        )
    }
}

/// `check-config`'s kernel report, on stdout, for `--datapath` and
/// `--ebpf-object`.
pub fn print(mode: Mode, ebpf_object: Option<&Path>) -> anyhow::Result<()> {
    let object = ebpf_object.is_some() || crate::datapath::embedded_object().is_some();
    let report = Probe::run(object).render(mode);
    Ok(std::io::stdout().write_all(report.as_bytes())?)
}

fn release() -> String {
    // SAFETY: uname fills the zeroed struct; `release` is NUL-terminated.
    unsafe {
        let mut u: libc::utsname = std::mem::zeroed();
        if libc::uname(&mut u) != 0 {
            return "unknown".to_owned();
        }
        std::ffi::CStr::from_ptr(u.release.as_ptr())
            .to_string_lossy()
            .into_owned()
    }
}

/// `nf_conntrack` under `sys_module`: a loaded module has `initstate`, a
/// built-in one only its parameters.
fn conntrack(sys_module: &Path, modules_dep: &Path) -> Conntrack {
    let dir = sys_module.join(kfuncs::MODULE);
    if dir.join("initstate").exists() {
        Conntrack::Loaded
    } else if dir.exists() {
        Conntrack::BuiltIn
    } else {
        let available = std::fs::read_to_string(modules_dep).ok().map(|dep| {
            dep.lines().any(|l| {
                l.split(':')
                    .next()
                    .and_then(|m| m.rsplit('/').next())
                    .is_some_and(|f| f.starts_with("nf_conntrack.ko"))
            })
        });
        Conntrack::NotLoaded { available }
    }
}

/// [`kfuncs::locate`], told apart: it answers vmlinux when the module's BTF
/// is not there to search, so the kfuncs are looked up in what it found.
fn locate(sys_btf: &Path, conntrack: Conntrack) -> Kfuncs {
    match kfuncs::locate(sys_btf) {
        Ok(Home::Module { .. }) => Kfuncs::Module,
        Ok(Home::Vmlinux { btf }) => {
            let missing = kfuncs::REQUIRED
                .iter()
                .find(|(name, _)| btf.id_by_type_name_kind(name, BtfKind::Func).is_err());
            match (missing, conntrack) {
                (None, _) => Kfuncs::Vmlinux,
                (
                    Some(_),
                    Conntrack::NotLoaded {
                        available: Some(true) | None,
                    },
                ) => Kfuncs::ModuleNotLoaded,
                (Some(_), Conntrack::Loaded) => Kfuncs::NoModuleBtf,
                (Some(&(name, since)), _) => Kfuncs::Absent { name, since },
            }
        }
        Err(KfuncError::Absent { name, since }) => Kfuncs::Absent { name, since },
        Err(e @ KfuncError::ModuleObject(_)) => Kfuncs::ModuleObject(e.to_string()),
        Err(e) => Kfuncs::Unreadable(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe() -> Probe {
        Probe {
            release: "6.12.0-1-amd64".to_owned(),
            btf: true,
            kfuncs: Kfuncs::Module,
            conntrack: Conntrack::Loaded,
            tcx: Tcx::Yes,
            object: true,
            forced: None,
        }
    }

    #[test]
    fn the_verdict_names_the_first_thing_missing() {
        let p = probe();
        assert_eq!(p.verdict(Mode::Ebpf), "fast path (attach: tcx)");
        assert_eq!(p.verdict(Mode::Kernel), "kernel path: --datapath kernel");
        let old = Probe {
            tcx: Tcx::No,
            ..probe()
        };
        assert_eq!(
            old.verdict(Mode::Ebpf),
            "fast path (attach: clsact + cls_bpf)"
        );
        let forced = Probe {
            forced: Some("legacy"),
            ..probe()
        };
        assert_eq!(forced.attach(), "clsact + cls_bpf (MYCNI_TC_ATTACH=legacy)");
        assert_eq!(
            forced.verdict(Mode::Ebpf),
            "fast path (attach: clsact + cls_bpf)"
        );
        let no_object = Probe {
            object: false,
            ..probe()
        };
        assert!(
            no_object
                .verdict(Mode::Ebpf)
                .contains("without the eBPF object")
        );
        let no_btf = Probe {
            btf: false,
            kfuncs: Kfuncs::Unreadable("no /sys/kernel/btf/vmlinux".into()),
            ..probe()
        };
        assert!(
            no_btf
                .verdict(Mode::Ebpf)
                .starts_with("kernel path: no BTF")
        );
        let absent = Probe {
            kfuncs: Kfuncs::Absent {
                name: "bpf_ct_change_timeout",
                since: "6.0",
            },
            ..probe()
        };
        assert_eq!(
            absent.verdict(Mode::Ebpf),
            "kernel path: no conntrack kfunc bpf_ct_change_timeout (Linux >= 6.0 with nf_conntrack and BTF)"
        );
        let unprivileged = Probe {
            kfuncs: Kfuncs::ModuleObject("finding nf_conntrack's BTF object: EPERM".into()),
            ..probe()
        };
        let v = unprivileged.verdict(Mode::Ebpf);
        assert!(v.contains("CAP_SYS_ADMIN") && v.contains("EPERM"), "{v}");
    }

    #[test]
    fn the_report_has_one_line_per_item_and_the_verdict_last() {
        let p = Probe {
            kfuncs: Kfuncs::ModuleNotLoaded,
            conntrack: Conntrack::NotLoaded {
                available: Some(true),
            },
            tcx: Tcx::Unknown("BPF_PROG_QUERY: Operation not permitted (os error 1)".into()),
            ..probe()
        };
        let text = p.render(Mode::Ebpf);
        let keys: Vec<&str> = text.lines().filter_map(|l| l.split(": ").next()).collect();
        assert_eq!(
            keys,
            [
                "kernel",
                "btf",
                "conntrack kfuncs",
                "nf_conntrack",
                "tcx",
                "attach",
                "verdict"
            ]
        );
        assert!(text.contains("kernel: 6.12.0-1-amd64\n"), "{text}");
        assert!(text.contains("nf_conntrack: module, not loaded"), "{text}");
        assert!(text.contains("tcx: not probed: BPF_PROG_QUERY"), "{text}");
        assert!(
            text.contains("verdict: fast path if nf_conntrack"),
            "{text}"
        );
    }

    #[test]
    fn conntrack_is_told_apart_from_sysfs_and_modules_dep() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let sys = dir.path().join("module");
        let dep = dir.path().join("modules.dep");
        assert_eq!(
            conntrack(&sys, &dep),
            Conntrack::NotLoaded { available: None }
        );
        std::fs::write(
            &dep,
            "kernel/net/netfilter/nf_conntrack.ko.xz: kernel/lib/libcrc32c.ko.xz\n",
        )?;
        assert_eq!(
            conntrack(&sys, &dep),
            Conntrack::NotLoaded {
                available: Some(true)
            }
        );
        std::fs::write(&dep, "kernel/net/netfilter/nf_conntrack_ftp.ko:\n")?;
        assert_eq!(
            conntrack(&sys, &dep),
            Conntrack::NotLoaded {
                available: Some(false)
            }
        );
        std::fs::create_dir_all(sys.join("nf_conntrack/parameters"))?;
        assert_eq!(conntrack(&sys, &dep), Conntrack::BuiltIn);
        std::fs::write(sys.join("nf_conntrack/initstate"), "live\n")?;
        assert_eq!(conntrack(&sys, &dep), Conntrack::Loaded);
        Ok(())
    }

    #[test]
    fn this_kernel_is_probed_without_changing_it() {
        let before = Path::new("/sys/module/nf_conntrack").exists();
        let p = Probe::run(true);
        assert!(!p.release.is_empty());
        assert_eq!(Path::new("/sys/module/nf_conntrack").exists(), before);
        // The development kernel: 6.18, BTF, conntrack built in (Absent
        // while kfuncs' own test forces the probe, in another thread).
        if p.conntrack == Conntrack::BuiltIn && p.btf {
            assert!(
                matches!(p.kfuncs, Kfuncs::Vmlinux | Kfuncs::Absent { .. }),
                "{:?}",
                p.kfuncs
            );
        }
    }
}
