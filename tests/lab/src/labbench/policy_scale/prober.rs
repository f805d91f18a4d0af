//! The probes: from inside a client pod, a new TCP connection to a server
//! every interval, each its own socket, left in flight while the next ones
//! start, and judged by what the kernel says of it: connected (the policy
//! admits the pair), refused, or no answer within the timeout (dropped:
//! the policy table drops a denied SYN, and the client's first
//! retransmission comes a second later, well after the timeout). The
//! verdict belongs to the moment the SYN left, which is when the
//! enforcing node's table judged it (a few microseconds later).
//!
//! Connections close with a reset (SO_LINGER 0), so a thousand a second
//! leave no TIME_WAIT on either end.

use std::collections::VecDeque;
use std::fs::File;
use std::net::SocketAddrV4;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// What one probe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Connected.
    Open,
    /// No answer within the timeout.
    Dropped,
    /// Refused (a reset or an ICMP error): not what a policy does here.
    Refused,
    /// Any other error.
    Error,
}

/// One probe: when its SYN left (since the prober's epoch), and its verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Probe {
    pub(super) at: Duration,
    pub(super) verdict: Verdict,
}

/// One direction probed: a client namespace to a server.
#[derive(Debug, Clone)]
pub(super) struct Pair {
    /// Which node enforces it (the server's), for the report.
    pub(super) label: String,
    pub(super) client_ns: String,
    pub(super) server: SocketAddrV4,
}

/// Probes in flight, in their own threads, until dropped.
pub(super) struct Prober {
    pub(super) epoch: Instant,
    pub(super) timeout: Duration,
    /// Per pair, in the order they were judged (near, not exactly, the
    /// order they started: drops are judged a timeout late).
    records: Vec<Arc<Mutex<Vec<Probe>>>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Result<()>>>,
}

impl Prober {
    pub(super) fn start(pairs: &[Pair], interval: Duration, timeout: Duration) -> Result<Prober> {
        let epoch = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let mut records = Vec::new();
        let mut threads = Vec::new();
        for pair in pairs {
            let rec: Arc<Mutex<Vec<Probe>>> = Arc::default();
            records.push(rec.clone());
            let netns = File::open(Path::new("/run/netns").join(&pair.client_ns))
                .with_context(|| format!("opening the netns {}", pair.client_ns))?;
            let (stop, server) = (stop.clone(), pair.server);
            let pace = Pace {
                epoch,
                interval,
                timeout,
            };
            threads.push(std::thread::spawn(move || {
                // SAFETY: setns on this thread only, which then lives in
                // the client's namespace; the fd is valid for the call.
                if unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    bail!("setns: {}", std::io::Error::last_os_error());
                }
                probe_loop(server, pace, &stop, &rec)
            }));
        }
        Ok(Prober {
            epoch,
            timeout,
            records,
            stop,
            threads,
        })
    }

    /// Now, on the probes' clock.
    pub(super) fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    /// A copy of pair `k`'s probes so far, in the order they started.
    pub(super) fn probes(&self, k: usize) -> Vec<Probe> {
        let mut v = self.records[k]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        v.sort_by_key(|p| p.at);
        v
    }

    /// Whether every pair's probes that started in the `span` before the
    /// last judged moment (a timeout ago), and after `since`, show `want`,
    /// with at least `min` of them each.
    pub(super) fn settled(
        &self,
        since: Duration,
        want: Verdict,
        span: Duration,
        min: usize,
    ) -> bool {
        let judged = self.now().saturating_sub(self.timeout);
        let from = since.max(judged.saturating_sub(span));
        self.records.iter().all(|rec| {
            let rec = rec.lock().unwrap_or_else(PoisonError::into_inner);
            // Judged out of order by at most a timeout: stop looking once
            // past that before the window.
            let window: Vec<&Probe> = rec
                .iter()
                .rev()
                .take_while(|p| p.at + self.timeout >= from)
                .filter(|p| p.at >= from && p.at < judged)
                .collect();
            window.len() >= min && window.iter().all(|p| p.verdict == want)
        })
    }

    /// Whether a probe thread has ended (an error: they run until dropped).
    pub(super) fn failed(&self) -> bool {
        self.threads.iter().any(JoinHandle::is_finished)
    }

    /// Stops the threads; their error, if one ended early.
    pub(super) fn stop(mut self) -> Result<()> {
        self.stop.store(true, Ordering::SeqCst);
        let mut result = Ok(());
        for t in self.threads.drain(..) {
            match t.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => result = Err(e),
                Err(_) => result = Err(anyhow::anyhow!("a probe thread panicked")),
            }
        }
        result
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// When a probe thread connects and judges: from `epoch` (the probes'
/// clock), one connect every `interval`, dropped after `timeout`.
#[derive(Debug, Clone, Copy)]
struct Pace {
    epoch: Instant,
    interval: Duration,
    timeout: Duration,
}

fn probe_loop(
    server: SocketAddrV4,
    pace: Pace,
    stop: &AtomicBool,
    rec: &Mutex<Vec<Probe>>,
) -> Result<()> {
    let Pace {
        epoch,
        interval,
        timeout,
    } = pace;
    let mut inflight: VecDeque<(Duration, OwnedFd)> = VecDeque::new();
    let mut next = Instant::now();
    let judge = |at: Duration, verdict: Verdict| {
        rec.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Probe { at, verdict });
    };
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= next {
            let at = now.duration_since(epoch);
            match connect_nonblocking(server) {
                Ok(Some(fd)) => inflight.push_back((at, fd)),
                Ok(None) => judge(at, Verdict::Open),
                Err(e) => judge(at, classify(e.raw_os_error().unwrap_or(0))),
            }
            next += interval;
            if next < now {
                // Behind (the machine was busy): no burst to catch up.
                next = now + interval;
            }
        }
        let mut fds: Vec<libc::pollfd> = inflight
            .iter()
            .map(|(_, fd)| libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLOUT,
                revents: 0,
            })
            .collect();
        let wait = next.saturating_duration_since(Instant::now());
        let ts = libc::timespec {
            tv_sec: wait.as_secs() as libc::time_t,
            tv_nsec: wait.subsec_nanos() as libc::c_long,
        };
        // SAFETY: fds is a valid array of fds.len() pollfds for the call.
        let n = unsafe {
            libc::ppoll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                &ts,
                std::ptr::null(),
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                bail!("ppoll: {e}");
            }
            continue;
        }
        let now = epoch.elapsed();
        let mut keep = VecDeque::with_capacity(inflight.len());
        for ((at, fd), p) in inflight.drain(..).zip(&fds) {
            if p.revents != 0 {
                judge(at, classify(so_error(&fd)));
            } else if now >= at + timeout {
                judge(at, Verdict::Dropped);
            } else {
                keep.push_back((at, fd));
            }
        }
        inflight = keep;
    }
    Ok(())
}

fn classify(errno: i32) -> Verdict {
    match errno {
        0 => Verdict::Open,
        libc::ECONNREFUSED => Verdict::Refused,
        _ => Verdict::Error,
    }
}

/// A socket's pending error (0: connected).
fn so_error(fd: &OwnedFd) -> i32 {
    let mut err: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: err and len are valid for writing for the call.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            (&raw mut err).cast(),
            &mut len,
        )
    };
    if rc != 0 { -1 } else { err }
}

/// A non-blocking connect with SO_LINGER 0: the socket while in flight,
/// None if it connected at once.
fn connect_nonblocking(server: SocketAddrV4) -> std::io::Result<Option<OwnedFd>> {
    // SAFETY: plain socket(2); the fd is owned below.
    let raw = unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: raw is a new fd nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: linger is valid for the call's length.
    unsafe {
        libc::setsockopt(
            raw,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&raw const linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: server.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*server.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: addr is a valid sockaddr_in for the call's length.
    let rc = unsafe {
        libc::connect(
            raw,
            (&raw const addr).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        return Ok(None);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EINPROGRESS) {
        Ok(Some(fd))
    } else {
        Err(e)
    }
}

/// When a change showed in `probes` (sorted by start): the start of the
/// first probe showing `want` after the last that did not, among those
/// that started in `from..until`; `from` itself if every one did. None
/// if the last one did not (or there were none): not enforced in time.
pub(super) fn flipped_at(
    probes: &[Probe],
    from: Duration,
    until: Duration,
    want: Verdict,
) -> Option<Duration> {
    let window: Vec<&Probe> = probes
        .iter()
        .filter(|p| p.at >= from && p.at < until)
        .collect();
    if window.last()?.verdict != want {
        return None;
    }
    match window.iter().rposition(|p| p.verdict != want) {
        None => Some(from),
        Some(k) => Some(window[k + 1].at),
    }
}

/// Probes of `probes` in `from..until` that were neither `Open` nor
/// `Dropped`: what no policy change explains.
pub(super) fn anomalies(probes: &[Probe], from: Duration, until: Duration) -> usize {
    probes
        .iter()
        .filter(|p| p.at >= from && p.at < until)
        .filter(|p| matches!(p.verdict, Verdict::Refused | Verdict::Error))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn probes(v: &[(u64, Verdict)]) -> Vec<Probe> {
        v.iter()
            .map(|(t, verdict)| Probe {
                at: ms(*t),
                verdict: *verdict,
            })
            .collect()
    }

    #[test]
    fn the_flip_is_the_first_new_verdict_after_the_last_old_one() {
        use Verdict::*;
        let p = probes(&[
            (0, Dropped),
            (2, Dropped),
            (4, Open),
            (6, Dropped),
            (8, Open),
            (10, Open),
            (12, Open),
        ]);
        // A flap at 4 is not enforcement: 8 is.
        assert_eq!(flipped_at(&p, ms(1), ms(20), Open), Some(ms(8)));
        // Not yet by 7.
        assert_eq!(flipped_at(&p, ms(1), ms(7), Open), None);
        // Every probe of the window already shows it.
        assert_eq!(flipped_at(&p, ms(7), ms(20), Open), Some(ms(7)));
        assert_eq!(flipped_at(&p, ms(30), ms(40), Open), None);
        let back = probes(&[(0, Open), (2, Open), (4, Dropped), (6, Error), (8, Dropped)]);
        assert_eq!(flipped_at(&back, ms(0), ms(10), Dropped), Some(ms(8)));
        assert_eq!(anomalies(&back, ms(0), ms(10)), 1);
    }

    #[test]
    fn errors_are_told_apart() {
        assert_eq!(classify(0), Verdict::Open);
        assert_eq!(classify(libc::ECONNREFUSED), Verdict::Refused);
        assert_eq!(classify(libc::EHOSTUNREACH), Verdict::Error);
    }
}
