//! Long-lived flows across nodes that faults must not break: a TCP echo
//! stream on one connection for the whole case (a reset fails it) and a UDP
//! request/response flow, each recording its longest gap between answers.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use crate::{ECHO_PORT, Pod};
use mycni_testkit::in_netns;

/// Port of the UDP echo the flows bring up in the destination pod.
pub const UDP_ECHO_PORT: u16 = 7778;

#[derive(Debug, Clone, Default)]
pub struct FlowStats {
    pub rounds: u64,
    pub longest_gap: Duration,
    /// Set when the flow broke (reset, corrupted data): the case fails.
    pub error: Option<String>,
}

/// The longest gap so far of each flow, readable while they run.
#[derive(Default)]
struct Live {
    tcp_last: Option<Instant>,
    udp_last: Option<Instant>,
}

pub struct Flows {
    stop: Arc<AtomicBool>,
    live: Arc<Mutex<Live>>,
    /// None once `stop` has taken them.
    tcp: Option<JoinHandle<FlowStats>>,
    udp: Option<JoinHandle<FlowStats>>,
    udp_server: Option<JoinHandle<()>>,
}

/// A case that fails midway drops its flows without `stop`: the threads
/// must end all the same, or the UDP echo server keeps its port bound in
/// the pod and every later case fails to start its flows.
impl Drop for Flows {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for h in [self.tcp.take(), self.udp.take()].into_iter().flatten() {
            let _ = h.join();
        }
        if let Some(h) = self.udp_server.take() {
            let _ = h.join();
        }
    }
}

const TICK: Duration = Duration::from_millis(5);

impl Flows {
    /// Starts both flows from `src` to `dst` (pods on different nodes).
    pub fn start(src: &Pod, dst: &Pod) -> Result<Flows> {
        let stop = Arc::new(AtomicBool::new(false));
        let live = Arc::new(Mutex::new(Live::default()));

        // Sockets belong to the netns they are created in, whichever thread
        // uses them afterwards.
        let server = in_netns(&dst.ns, || UdpSocket::bind(("0.0.0.0", UDP_ECHO_PORT)))??;
        server.set_read_timeout(Some(Duration::from_millis(100)))?;
        let s2 = stop.clone();
        let udp_server = std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while !s2.load(Ordering::Relaxed) {
                if let Ok((n, from)) = server.recv_from(&mut buf) {
                    let _ = server.send_to(&buf[..n], from);
                }
            }
        });
        // From here on, returning early drops `f`, which ends the threads.
        let mut f = Flows {
            stop: stop.clone(),
            live: live.clone(),
            tcp: None,
            udp: None,
            udp_server: Some(udp_server),
        };

        let tcp_addr = SocketAddr::from((dst.ip, ECHO_PORT));
        let mut conn = in_netns(&src.ns, || {
            TcpStream::connect_timeout(&tcp_addr, Duration::from_secs(2))
        })??;
        conn.set_read_timeout(Some(Duration::from_secs(30)))?;
        conn.set_nodelay(true)?;
        let (s2, l2) = (stop.clone(), live.clone());
        f.tcp = Some(std::thread::spawn(move || {
            let mut st = FlowStats::default();
            let buf = [0x5au8; 512];
            let mut back = [0u8; 512];
            let mut last = Instant::now();
            while !s2.load(Ordering::Relaxed) {
                let r = conn
                    .write_all(&buf)
                    .and_then(|()| conn.read_exact(&mut back));
                if let Err(e) = r {
                    st.error = Some(format!("TCP stream broke: {e}"));
                    break;
                }
                if back != buf {
                    st.error = Some("TCP stream corrupted".into());
                    break;
                }
                st.rounds += 1;
                st.longest_gap = st.longest_gap.max(last.elapsed());
                last = Instant::now();
                if let Ok(mut l) = l2.lock() {
                    l.tcp_last = Some(last);
                }
                std::thread::sleep(TICK);
            }
            st
        }));

        let udp_addr = SocketAddr::from((dst.ip, UDP_ECHO_PORT));
        let client = in_netns(&src.ns, || UdpSocket::bind(("0.0.0.0", 0)))??;
        client.set_read_timeout(Some(TICK * 4))?;
        let (s2, l2) = (stop.clone(), live.clone());
        let udp = std::thread::spawn(move || {
            let mut st = FlowStats::default();
            let mut last = Instant::now();
            let mut seq: u64 = 0;
            let mut buf = [0u8; 64];
            while !s2.load(Ordering::Relaxed) {
                seq += 1;
                if client.send_to(&seq.to_be_bytes(), udp_addr).is_err() {
                    // No route yet (a fault in progress): a gap, not a break.
                    std::thread::sleep(TICK);
                    continue;
                }
                // Answers to older requests may still arrive: any answer
                // counts as the flow being alive.
                let deadline = Instant::now() + TICK * 2;
                while Instant::now() < deadline {
                    if let Ok((n, _)) = client.recv_from(&mut buf)
                        && n == 8
                    {
                        st.rounds += 1;
                        st.longest_gap = st.longest_gap.max(last.elapsed());
                        last = Instant::now();
                        if let Ok(mut l) = l2.lock() {
                            l.udp_last = Some(last);
                        }
                        break;
                    }
                }
                std::thread::sleep(TICK);
            }
            st.longest_gap = st.longest_gap.max(last.elapsed());
            st
        });

        f.udp = Some(udp);
        f.wait_flowing(Duration::from_secs(5))?;
        Ok(f)
    }

    /// Waits until both flows have answered within the last 100 ms.
    pub fn wait_flowing(&self, timeout: Duration) -> Result<Duration> {
        let t0 = Instant::now();
        loop {
            let mark = Instant::now();
            std::thread::sleep(Duration::from_millis(100));
            if let Ok(l) = self.live.lock()
                && l.tcp_last.is_some_and(|t| t > mark)
                && l.udp_last.is_some_and(|t| t > mark)
            {
                return Ok(t0.elapsed());
            }
            if t0.elapsed() > timeout {
                bail!("flows not answering within {timeout:?}");
            }
        }
    }

    /// Stops both flows and returns (tcp, udp).
    pub fn stop(mut self) -> Result<(FlowStats, FlowStats)> {
        self.stop.store(true, Ordering::Relaxed);
        let join = |h: Option<JoinHandle<FlowStats>>, what: &str| {
            h.map(|h| h.join())
                .unwrap_or_else(|| Ok(FlowStats::default()))
                .map_err(|_| anyhow::anyhow!("{what} flow thread panicked"))
        };
        let tcp = join(self.tcp.take(), "TCP")?;
        let udp = join(self.udp.take(), "UDP")?;
        if let Some(h) = self.udp_server.take() {
            let _ = h.join();
        }
        Ok((tcp, udp))
    }
}
