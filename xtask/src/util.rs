use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// The workspace root: xtask lives one level below it.
pub fn workspace_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent().unwrap_or(here).to_path_buf()
}

/// A child command that does not inherit the toolchain choice of the cargo
/// that runs xtask: rustup and cargo export RUSTUP_TOOLCHAIN, RUSTC and
/// friends to their children, which would pin every nested cargo to 1.95.
pub struct Cmd {
    inner: Command,
    shown: String,
}

impl Cmd {
    pub fn new(program: &str) -> Self {
        let mut inner = Command::new(program);
        for var in [
            "RUSTUP_TOOLCHAIN",
            "RUSTC",
            "RUSTDOC",
            "RUSTC_WRAPPER",
            "RUSTC_WORKSPACE_WRAPPER",
            "RUSTFLAGS",
            "CARGO_ENCODED_RUSTFLAGS",
            "CARGO_BUILD_RUSTFLAGS",
            "CARGO",
        ] {
            inner.env_remove(var);
        }
        Self {
            inner,
            shown: program.to_string(),
        }
    }

    pub fn arg(mut self, a: impl AsRef<OsStr>) -> Self {
        self.shown.push(' ');
        self.shown.push_str(&a.as_ref().to_string_lossy());
        self.inner.arg(a);
        self
    }

    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        for a in args {
            self = self.arg(a);
        }
        self
    }

    pub fn env(mut self, k: &str, v: impl AsRef<OsStr>) -> Self {
        self.inner.env(k, v);
        self
    }

    pub fn toolchain(self, name: &str) -> Self {
        self.env("RUSTUP_TOOLCHAIN", name)
    }

    pub fn cwd(mut self, dir: &Path) -> Self {
        self.inner.current_dir(dir);
        self
    }

    /// Runs with inherited stdio; a non-zero exit is an error naming the command.
    pub fn run(mut self) -> Result<()> {
        let status = self
            .inner
            .status()
            .with_context(|| format!("cannot start `{}`", self.shown))?;
        if !status.success() {
            bail!("`{}` failed: {status}", self.shown);
        }
        Ok(())
    }

    /// [`Cmd::run`] for a child that tears down what it made on SIGINT (the
    /// lab, the bench, the soak). Ctrl-C reaches the whole foreground
    /// process group; xtask ignores it while the child runs, so it waits for
    /// the child's teardown instead of exiting under it and handing the
    /// terminal back mid-cleanup.
    pub fn run_interruptible(mut self) -> Result<()> {
        // Spawned before SIGINT is ignored: an ignored disposition survives
        // exec, and the child must still see the signal.
        let mut child = self
            .inner
            .spawn()
            .with_context(|| format!("cannot start `{}`", self.shown))?;
        let status = {
            let _ignored = IgnoreSigint::new();
            child.wait()
        }
        .with_context(|| format!("waiting for `{}`", self.shown))?;
        if !status.success() {
            bail!("`{}` failed: {status}", self.shown);
        }
        Ok(())
    }

    /// Runs quietly and returns stdout; a non-zero exit is an error with stderr.
    pub fn output(mut self) -> Result<String> {
        let out = self
            .inner
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("cannot start `{}`", self.shown))?;
        if !out.status.success() {
            bail!(
                "`{}` failed: {}: {}",
                self.shown,
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// SIGINT ignored in this process until dropped, then the previous
/// disposition back.
struct IgnoreSigint {
    previous: libc::sighandler_t,
}

impl IgnoreSigint {
    fn new() -> Self {
        // SAFETY: signal(2) with SIG_IGN installs no handler code.
        let previous = unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
        Self { previous }
    }
}

impl Drop for IgnoreSigint {
    fn drop(&mut self) {
        if self.previous != libc::SIG_ERR {
            // SAFETY: restores the disposition signal(2) returned above.
            unsafe { libc::signal(libc::SIGINT, self.previous) };
        }
    }
}
