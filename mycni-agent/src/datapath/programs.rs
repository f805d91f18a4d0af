//! Loading, attaching and detaching the tc eBPF programs of `mycni-ebpf`.
//!
//! Maps are pinned under a bpffs directory (`/sys/fs/bpf/mycni` in
//! production, a test's own bpffs mount in tests) so `bpftool` can read them
//! and a restarted agent reuses them. TCX links are pinned beside them so the
//! programs stay attached while the agent is down.

use std::io;
use std::path::{Path, PathBuf};

use aya::programs::links::{FdLink, LinkError, PinnedLink};
use aya::programs::{LinkOrder, SchedClassifier, TcAttach, TcAttachType};
use aya::{Ebpf, EbpfLoader};

use super::attach::{self, AttachMode};
use super::error::DatapathError;
use super::maps::MAPS;
pub use super::prog::Prog;

/// The object `cargo xtask build-ebpf --release` produced when the agent was
/// built; empty when it was built without one (see build.rs).
static EMBEDDED_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/mycni-ebpf.o"));

/// The embedded object, if the agent was built with one.
pub fn embedded_object() -> Option<&'static [u8]> {
    (!EMBEDDED_OBJECT.is_empty()).then_some(EMBEDDED_OBJECT)
}

/// Loaded programs and their pinned maps.
pub struct Datapath {
    pub(super) bpf: Ebpf,
    pin_dir: PathBuf,
    /// TCX links or legacy tc filters ([`AttachMode::choose`]).
    mode: AttachMode,
}

impl Datapath {
    /// Loads `object`, reusing maps already pinned under `pin_dir` (so
    /// counters and forwarding state survive an agent restart) and pinning
    /// the ones that are not.
    pub fn load(object: &[u8], pin_dir: &Path) -> Result<Self, DatapathError> {
        Self::load_with_log(object, pin_dir, false)
    }

    /// [`Self::load`], with the programs' aya-log statements enabled at
    /// debug level when `log` is set (read them with [`Self::take_logger`]).
    /// Disabled, the level is a load-time 0 and the verifier prunes the
    /// logging code from the hot path.
    pub(crate) fn load_with_log(
        object: &[u8],
        pin_dir: &Path,
        log: bool,
    ) -> Result<Self, DatapathError> {
        for dir in [pin_dir.to_path_buf(), pin_dir.join("links")] {
            std::fs::create_dir_all(&dir).map_err(|source| DatapathError::PinDir {
                path: dir.clone(),
                source,
            })?;
        }
        let sys_btf = Path::new("/sys/kernel/btf");
        if let Err(e) = super::kfuncs::pull_in_conntrack(Path::new("/sys/module")) {
            tracing::warn!(error = %format!("{e:#}"), "cannot make the kernel load nf_conntrack");
        }
        let home = super::kfuncs::locate(sys_btf)?;
        let mut loader = EbpfLoader::new();
        match &home {
            super::kfuncs::Home::Vmlinux { btf } => loader.btf(btf),
            super::kfuncs::Home::Module {
                btf,
                fd,
                first_type_id,
            } => loader.btf(btf).kfunc_module_btf(fd.clone(), *first_type_id),
        };
        let level: u8 = if log { aya_log::Level::Debug as u8 } else { 0 };
        // Absent from an object built without the packet-log feature.
        loader.override_global(aya_log::LEVEL, &level, false);
        let paths: Vec<(&str, PathBuf)> = MAPS.iter().map(|m| (*m, pin_dir.join(m))).collect();
        for (name, path) in &paths {
            loader.map_pin_path(name, path.as_path());
        }
        let mut bpf = loader.load(object)?;
        for p in Prog::ALL {
            let prog: &mut SchedClassifier = bpf
                .program_mut(p.name())
                .ok_or(DatapathError::MissingProgram(p.name()))?
                .try_into()
                .map_err(p.error())?;
            prog.load().map_err(p.error())?;
        }
        let mode = AttachMode::choose();
        tracing::info!(attach = mode.name(), kfuncs = %home.describe(), "eBPF programs loaded");
        Ok(Self {
            bpf,
            pin_dir: pin_dir.to_path_buf(),
            mode,
        })
    }

    /// How this datapath attaches its programs.
    pub(crate) fn attach_mode(&self) -> AttachMode {
        self.mode
    }

    /// Pins again every map whose pin is gone (someone removed it from
    /// bpffs): the programs still use the maps, but the agent and `bpftool`
    /// reach them through the pins. Returns the names re-pinned.
    pub(crate) fn repin_missing_maps(&self) -> Result<Vec<&'static str>, DatapathError> {
        let mut done = vec![];
        for name in MAPS {
            let path = self.pin_dir.join(name);
            if path.exists() {
                continue;
            }
            let Some(map) = self.bpf.map(name) else {
                continue;
            };
            let pinned = map.pin(&path);
            pinned.map_err(|source| DatapathError::Pin {
                path: path.clone(),
                source,
            })?;
            done.push(*name);
        }
        Ok(done)
    }

    /// The reader of the programs' log records (once; None after that or
    /// when the object has no log map).
    pub(crate) fn take_logger(&mut self) -> Option<aya_log::EbpfLogger<&'static dyn log::Log>> {
        aya_log::EbpfLogger::init(&mut self.bpf).ok()
    }

    /// The loaded program's fd, e.g. for BPF_PROG_TEST_RUN in tests.
    pub fn program_fd(&self, p: Prog) -> Result<std::os::fd::BorrowedFd<'_>, DatapathError> {
        use std::os::fd::AsFd;
        let prog: &SchedClassifier = self
            .bpf
            .program(p.name())
            .ok_or(DatapathError::MissingProgram(p.name()))?
            .try_into()
            .map_err(p.error())?;
        let fd = prog.fd().map_err(p.error())?;
        Ok(fd.as_fd())
    }

    /// How many instructions the verifier went through for `p` (Linux
    /// >= 5.16 reports it): how close a kernel's verifier is to its limit.
    pub fn verified_instructions(&self, p: Prog) -> Option<u32> {
        let prog: &SchedClassifier = self.bpf.program(p.name())?.try_into().ok()?;
        prog.info().ok()?.verified_instruction_count()
    }

    /// Where the pinned link of `prog` on `ifindex` lives.
    pub(crate) fn link_pin_path(&self, prog: Prog, ifindex: u32) -> PathBuf {
        link_pin_path(&self.pin_dir, prog, ifindex)
    }

    /// Attaches the from-pod program on ingress of `ifindex`; see [`Self::attach`].
    pub fn attach_from_pod(&mut self, ifindex: u32) -> Result<(), DatapathError> {
        self.attach(Prog::FromPod, ifindex).map(|_| ())
    }

    /// Attaches `prog` on ingress of `ifindex` (in the calling thread's
    /// network namespace) over TCX and pins the link, so the program stays
    /// attached when the agent exits (or, without TCX, as a tc filter:
    /// `attach.rs`). A link already pinned for this
    /// interface gets the new program swapped in atomically: no packet sees
    /// the hook empty. Returns whether the attachment is new.
    pub fn attach(&mut self, p: Prog, ifindex: u32) -> Result<bool, DatapathError> {
        let pin = self.link_pin_path(p, ifindex);
        let marker = attach::marker_path(&self.pin_dir, p, ifindex);
        let prog: &mut SchedClassifier = self
            .bpf
            .program_mut(p.name())
            .ok_or(DatapathError::MissingProgram(p.name()))?
            .try_into()
            .map_err(p.error())?;
        if self.mode == AttachMode::Legacy {
            let fresh = attach::attach(prog, p, ifindex, &self.pin_dir)?;
            // Attached the other way before (TCX, then a forced legacy):
            // the new filter is in place first, so no packet misses both.
            if pin.exists() {
                detach_link(&self.pin_dir, p, ifindex)?;
            }
            return Ok(fresh);
        }
        let prog_err = p.error();
        let fresh_attach = |prog: &mut SchedClassifier| {
            prog.attach(
                ifindex,
                TcAttach::Tcx {
                    attach_type: TcAttachType::Ingress,
                    order: LinkOrder::default(),
                },
            )
            .map_err(prog_err)
        };
        let (link_id, fresh) = match PinnedLink::from_pin(&pin) {
            Ok(old) => {
                let link = FdLink::from(old)
                    .try_into()
                    .map_err(|source| DatapathError::Link {
                        path: pin.clone(),
                        source,
                    })?;
                match prog.attach_to_link(link) {
                    Ok(id) => (id, false),
                    Err(e) => {
                        // The pinned link outlived its interface (defunct):
                        // drop the pin and attach afresh.
                        tracing::warn!(path = %pin.display(), error = %e, "pinned link unusable; attaching afresh");
                        let _ = std::fs::remove_file(&pin);
                        (fresh_attach(prog)?, true)
                    }
                }
            }
            Err(LinkError::SyscallError(e)) if e.io_error.kind() == io::ErrorKind::NotFound => {
                (fresh_attach(prog)?, true)
            }
            Err(source) => return Err(DatapathError::Link { path: pin, source }),
        };
        let link = prog.take_link(link_id).map_err(prog_err)?;
        let fd_link: FdLink = link.try_into().map_err(|source| DatapathError::Link {
            path: pin.clone(),
            source,
        })?;
        if fresh {
            fd_link
                .pin(&pin)
                .map_err(|source| DatapathError::Pin { path: pin, source })?;
        }
        // A replaced link stays pinned at the same path: dropping our handle
        // leaves the attachment in place.
        if marker.exists() {
            attach::detach(&self.pin_dir, p, ifindex)?;
        }
        Ok(fresh)
    }
}

pub(crate) fn link_pin_path(pin_dir: &Path, prog: Prog, ifindex: u32) -> PathBuf {
    pin_dir
        .join("links")
        .join(format!("{}_{ifindex}", prog.name()))
}

/// What is attached, whoever attached it: the links pinned under
/// `pin_dir` and the legacy filters recorded there.
pub fn pinned_links(pin_dir: &Path) -> Result<Vec<(Prog, u32)>, DatapathError> {
    let mut out = Prog::parse_pins(&pin_dir.join("links"))?;
    out.extend(attach::markers(pin_dir)?);
    out.sort();
    out.dedup();
    Ok(out)
}

/// Detaches `prog` from `ifindex`, however it is attached. Absent is fine.
pub fn detach(pin_dir: &Path, prog: Prog, ifindex: u32) -> Result<(), DatapathError> {
    if attach::marker_path(pin_dir, prog, ifindex).exists() {
        attach::detach(pin_dir, prog, ifindex)?;
    }
    detach_link(pin_dir, prog, ifindex)
}

/// Removes the pinned TCX link of `prog` on `ifindex` (the last
/// reference: TCX detaches it). Absent is fine.
fn detach_link(pin_dir: &Path, prog: Prog, ifindex: u32) -> Result<(), DatapathError> {
    let pin = link_pin_path(pin_dir, prog, ifindex);
    match PinnedLink::from_pin(&pin) {
        Ok(link) => {
            let fd = link.unpin().map_err(|e| DatapathError::Link {
                path: pin.clone(),
                source: LinkError::SyscallError(aya::sys::SyscallError {
                    call: "unlink",
                    io_error: e,
                }),
            })?;
            drop(fd);
            Ok(())
        }
        Err(LinkError::SyscallError(e)) if e.io_error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => {
            // Not a link (or unreadable): remove the file so it cannot be
            // mistaken for one again.
            let _ = std::fs::remove_file(&pin);
            Err(DatapathError::Link { path: pin, source })
        }
    }
}

/// Everything mycni pinned: links first (detaching every program), then the
/// maps. What `--datapath kernel` does; the kernel path carries on alone.
pub(crate) fn detach_all(pin_dir: &Path) -> Result<usize, DatapathError> {
    let links = pinned_links(pin_dir)?;
    let n = links.len();
    for (p, ifindex) in links {
        detach(pin_dir, p, ifindex)?;
    }
    for m in MAPS {
        let _ = std::fs::remove_file(pin_dir.join(m));
    }
    let _ = std::fs::remove_dir(pin_dir.join("links"));
    let _ = std::fs::remove_dir(pin_dir.join("tc"));
    Ok(n)
}
