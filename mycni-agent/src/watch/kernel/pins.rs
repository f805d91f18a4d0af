//! The watch on the fast path's pin directory: a removed pin wakes a
//! pass that loads the programs again.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// Watches the pin directory of the fast path's maps: a pin removed (by
/// hand, or a bpffs cleanup) wakes a full pass, whose sync pins the maps
/// again. The programs keep their maps meanwhile, so forwarding does not
/// notice; a restarted agent or `inspect` would, finding no pins. The
/// agent itself removes map pins only at start-up, before this runs, so
/// its own changes wake nothing. The directory itself removed, the watch
/// is armed again once the pass has made it anew.
pub(crate) fn spawn_pins(
    pin_dir: &std::path::Path,
    overlay: Arc<Notify>,
) -> std::io::Result<JoinHandle<()>> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    use tokio::io::unix::AsyncFd;

    let path = std::ffi::CString::new(pin_dir.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: inotify_init1 takes flags only and returns a new descriptor
    // or -1.
    let raw = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `raw` is a descriptor we just opened and own alone.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let arm = move |fd: &OwnedFd| {
        // SAFETY: a valid descriptor and a NUL-terminated path.
        let wd = unsafe {
            libc::inotify_add_watch(
                fd.as_raw_fd(),
                path.as_ptr(),
                libc::IN_DELETE | libc::IN_MOVED_FROM | libc::IN_DELETE_SELF,
            )
        };
        if wd < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    arm(&fd)?;
    // SAFETY: an OwnedFd returns the descriptor it owns, open until the
    // AsyncFd (which owns it) drops it.
    let fd = unsafe { AsyncFd::register(fd) }.map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(tokio::spawn(async move {
        let mut buf = [0u8; 4096];
        loop {
            let n = match fd.readable().await {
                Ok(mut guard) => match guard.try_io(|f| {
                    // SAFETY: reads into a buffer of the length given.
                    let n =
                        unsafe { libc::read(f.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                    if n < 0 {
                        Err(std::io::Error::last_os_error())
                    } else {
                        Ok(n.unsigned_abs())
                    }
                }) {
                    Ok(Ok(n)) => n,
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "watching the map pins failed");
                        return;
                    }
                    Err(_would_block) => continue,
                },
                Err(e) => {
                    tracing::warn!(error = %e, "watching the map pins failed");
                    return;
                }
            };
            if n == 0 {
                continue;
            }
            // Every event here is a removal from the pin directory (or of
            // it): each calls for the same pass.
            tracing::debug!("a map pin was removed");
            overlay.notify_one();
            if watch_ended(&buf[..n]) {
                // The pass that was just woken makes the directory again.
                while arm(fd.get_ref()).is_err() {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }))
}

/// Whether a read of `struct inotify_event`s says the watch is gone
/// (IN_IGNORED: its directory was removed).
pub(super) fn watch_ended(events: &[u8]) -> bool {
    const HEADER: usize = 16; // wd, mask, cookie, len
    let mut rest = events;
    while let Some(h) = rest.get(..HEADER) {
        let mask = u32::from_ne_bytes([h[4], h[5], h[6], h[7]]);
        if mask & libc::IN_IGNORED != 0 {
            return true;
        }
        let len = u32::from_ne_bytes([h[12], h[13], h[14], h[15]]) as usize;
        rest = rest.get(HEADER + len..).unwrap_or_default();
    }
    false
}
