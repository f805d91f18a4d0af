//! The loaded object watching interfaces, and the events it reports.

use super::*;

/// How long a test waits for the event of a packet it sent (the kernel
/// drops it within microseconds; this is slack for a loaded machine).
pub(crate) const WAIT: Duration = Duration::from_millis(1500);
/// How long it listens for events that must not come.
pub(crate) const QUIET: Duration = Duration::from_millis(400);

/// The loaded object, the tracepoint attached, watching some interfaces of
/// one namespace, and its ring.
pub(crate) struct Watch {
    /// Kept: dropping it detaches the tracepoint.
    pub(crate) dp: Datapath,
    ring: RingBuf<MapData>,
    names: DropReasons,
    /// Every event read so far, for failure messages.
    pub(crate) seen: Vec<FlowEvent>,
}

impl Watch {
    /// Loads the object in `node` and watches `ifindexes` there.
    pub(crate) fn new(node: &NetNs, bpffs: &BpfFs, ifindexes: &[u32]) -> Result<Self> {
        let object = embedded_object().ok_or_else(|| {
            anyhow::anyhow!(
                "agent built without eBPF object: run `cargo xtask build-ebpf --release` first"
            )
        })?;
        let (dp, ring) = node.run_in(|| -> Result<_> {
            let mut dp = Datapath::load(object, bpffs.path())?;
            dp.attach_kernel_drops()?;
            ensure!(dp.kernel_drops_attached());
            let netns = current_netns()?;
            let want = ifindexes
                .iter()
                .map(|&ifindex| DropIface { ifindex, netns })
                .collect();
            dp.sync_kernel_drops(&want)?;
            let ring = dp
                .take_flow_ring()
                .context("no flow ring in the object")??;
            Ok((dp, ring))
        })??;
        Ok(Self {
            dp,
            ring,
            names: DropReasons::from_kernel()?,
            seen: vec![],
        })
    }

    /// The events of the flow `f` that arrive within `wait`, returning as
    /// soon as `want` have arrived (and then listening `QUIET` longer, so
    /// an extra one is caught too).
    pub(crate) fn events(&mut self, f: &Flow, want: usize, wait: Duration) -> Vec<FlowEvent> {
        let start = Instant::now();
        let mut got: Vec<FlowEvent> = vec![];
        let mut until = start + wait;
        while Instant::now() < until {
            while let Some(item) = self.ring.next() {
                assert!(item.len() >= size_of::<FlowEvent>(), "short event");
                // SAFETY: the ring holds FlowEvents (checked length);
                // unaligned read of plain data.
                let e: FlowEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
                self.seen.push(e);
                if f.matches(&e) {
                    got.push(e);
                    if got.len() == want {
                        until = until.min(Instant::now() + QUIET);
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        got
    }

    /// The one event the flow's next packet gives, checked against it.
    pub(crate) fn one(&mut self, f: &Flow, reason: &str, count: u32) -> Result<FlowEvent> {
        let got = self.events(f, 1, WAIT);
        let [e] = got[..] else {
            bail!(
                "{} events for {f:?}, want 1 ({reason}): {}\nall events: {}",
                got.len(),
                self.show(&got),
                self.show(&self.seen.clone())
            );
        };
        let name = self.names.name(e.reason);
        ensure!(
            name == reason,
            "reason {name}, want {reason}: {}",
            self.show(&[e])
        );
        ensure!(e.count == count, "count {}, want {count}", e.count);
        ensure!(e.kind == FLOW_DROP && e.source == FlowSource::KernelDrop as u8);
        eprintln!("event: {}", self.show(&[e]));
        Ok(e)
    }

    pub(crate) fn none(&mut self, f: &Flow, what: &str) -> Result<()> {
        let got = self.events(f, 0, QUIET);
        ensure!(got.is_empty(), "{what}: unexpected {}", self.show(&got));
        Ok(())
    }

    pub(crate) fn show(&self, es: &[FlowEvent]) -> String {
        es.iter()
            .map(|e| {
                format!(
                    "[{} if{} {} -> {} proto {} flags {:#x} x{}]",
                    self.names.name(e.reason),
                    e.ifindex,
                    SocketAddr::new(event_ip(e.family, e.src), e.sport),
                    SocketAddr::new(event_ip(e.family, e.dst), e.dport),
                    e.proto,
                    e.tcp_flags,
                    e.count
                )
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The 5-tuple and interface an event must carry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Flow {
    pub(crate) ifindex: u32,
    pub(crate) src: SocketAddr,
    pub(crate) dst: SocketAddr,
    pub(crate) proto: u8,
}

impl Flow {
    pub(crate) fn matches(&self, e: &FlowEvent) -> bool {
        let family = if self.src.is_ipv4() { 4 } else { 6 };
        e.family == family
            && e.ifindex == self.ifindex
            && e.src == ip_bytes(self.src.ip())
            && e.dst == ip_bytes(self.dst.ip())
            && e.sport == self.src.port()
            && e.dport == self.dst.port()
            && e.proto == self.proto
    }
}

/// An address as `FlowEvent` holds it: IPv4 in the first 4 bytes.
pub(crate) fn ip_bytes(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(a) => {
            let mut b = [0; 16];
            b[..4].copy_from_slice(&a.octets());
            b
        }
        IpAddr::V6(a) => a.octets(),
    }
}

pub(crate) fn event_ip(family: u8, b: [u8; 16]) -> IpAddr {
    if family == 6 {
        Ipv6Addr::from(b).into()
    } else {
        Ipv4Addr::new(b[0], b[1], b[2], b[3]).into()
    }
}
