//! What notifications are judged against, and the wake-ups they raise.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::topology::{OverlayState, UnderlaySelect, VxlanSpec};

/// What a notification may concern.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Wake {
    /// What `Kernel::pod_endpoints` returns.
    pub pods: bool,
    /// The agent's routes, nexthops, neighbours, FDB entries or VXLAN device.
    pub overlay: bool,
    /// Which interface and address the underlay is.
    pub underlay: bool,
}

impl Wake {
    pub(super) const ALL: Wake = Wake {
        pods: true,
        overlay: true,
        underlay: true,
    };
    pub(super) const PODS: Wake = Wake {
        pods: true,
        overlay: false,
        underlay: false,
    };

    pub(super) fn overlay(b: bool) -> Wake {
        Wake {
            overlay: b,
            ..Wake::default()
        }
    }

    pub(super) fn underlay(b: bool) -> Wake {
        Wake {
            underlay: b,
            ..Wake::default()
        }
    }

    pub(super) fn any(self) -> bool {
        self.pods || self.overlay || self.underlay
    }

    pub(super) fn or(self, o: Wake) -> Wake {
        Wake {
            pods: self.pods || o.pods,
            overlay: self.overlay || o.overlay,
            underlay: self.underlay || o.underlay,
        }
    }
}

/// What the loop last asked of the kernel: the device and the entries.
#[derive(Debug, Clone)]
pub struct Expected {
    pub vxlan: VxlanSpec,
    pub overlay: OverlayState,
    /// The gateways of `overlay`'s routes (both families): the agent's
    /// nexthops point at these and nothing else.
    pub(super) gateways: BTreeSet<IpAddr>,
}

impl Expected {
    pub fn new(vxlan: VxlanSpec, overlay: OverlayState) -> Self {
        let gateways = overlay
            .routes
            .values()
            .map(|g| IpAddr::V4(*g))
            .chain(overlay.routes6.values().map(|g| IpAddr::V6(*g)))
            .collect();
        Expected {
            vxlan,
            overlay,
            gateways,
        }
    }
}

/// What the watcher compares notifications with, shared with the loop.
#[derive(Debug)]
pub struct Watched {
    pub(super) vxlan_name: String,
    pub(super) underlay: UnderlaySelect,
    /// `vxlan.1`'s ifindex as of the last pass (0 before the first).
    pub(super) vxlan_index: AtomicU32,
    /// `vxlan6.1`'s, on a node with an IPv6 underlay (0: none).
    pub(super) vxlan6_index: AtomicU32,
    /// Whether the underlay is IPv6 (an IPv6-only node).
    pub(super) ipv6_underlay: AtomicBool,
    /// The IPv6 underlay's ifindex on an IPv6-only node, which has no
    /// `Expected` to read it from (0: none).
    pub(super) underlay6_index: AtomicU32,
    /// None before the first pass: then only deletions of the agent's
    /// kind of state wake a pass (the first pass runs anyway).
    pub(super) expected: Mutex<Option<Arc<Expected>>>,
    /// Called on every notification datagram (and on an overrun), before
    /// it is classified: what must hear of any routing change at once.
    pub(super) on_any: std::sync::OnceLock<OnAny>,
}

/// What runs on every notification.
pub(crate) struct OnAny(Box<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for OnAny {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnAny")
    }
}

impl Watched {
    pub fn new(vxlan_name: String, underlay: UnderlaySelect) -> Arc<Self> {
        Arc::new(Watched {
            vxlan_name,
            underlay,
            vxlan_index: AtomicU32::new(0),
            vxlan6_index: AtomicU32::new(0),
            ipv6_underlay: AtomicBool::new(false),
            underlay6_index: AtomicU32::new(0),
            expected: Mutex::new(None),
            on_any: std::sync::OnceLock::new(),
        })
    }

    /// Sets what runs on every notification (once; later calls are
    /// ignored).
    pub(crate) fn on_any_notification(&self, f: Box<dyn Fn() + Send + Sync>) {
        let _ = self.on_any.set(OnAny(f));
    }

    pub(super) fn notified(&self) {
        if let Some(f) = self.on_any.get() {
            (f.0)();
        }
    }

    /// Set before a pass writes, so the notifications of its own writes
    /// agree with it.
    pub fn expect(&self, e: Expected) {
        if let Ok(mut x) = self.expected.lock() {
            *x = Some(Arc::new(e));
        }
    }

    pub(crate) fn set_vxlan_index(&self, index: u32) {
        self.vxlan_index.store(index, Ordering::Relaxed);
    }

    pub(crate) fn set_vxlan6_index(&self, index: u32) {
        self.vxlan6_index.store(index, Ordering::Relaxed);
    }

    /// The underlay is IPv6 (an IPv6-only node): IPv6 addresses and routes
    /// may move it.
    pub(crate) fn set_ipv6_underlay(&self, on: bool) {
        self.ipv6_underlay.store(on, Ordering::Relaxed);
    }

    /// The IPv6 underlay's ifindex, on an IPv6-only node: its link
    /// changing may move the underlay.
    pub(crate) fn set_underlay6_index(&self, index: u32) {
        self.underlay6_index.store(index, Ordering::Relaxed);
    }

    pub(super) fn snapshot(&self) -> Snapshot<'_> {
        Snapshot {
            vxlan_name: &self.vxlan_name,
            underlay: &self.underlay,
            vxlan_index: self.vxlan_index.load(Ordering::Relaxed),
            vxlan6_index: self.vxlan6_index.load(Ordering::Relaxed),
            ipv6_underlay: self.ipv6_underlay.load(Ordering::Relaxed),
            underlay6_index: self.underlay6_index.load(Ordering::Relaxed),
            expected: self.expected.lock().ok().and_then(|x| x.clone()),
        }
    }
}

/// [`Watched`] as of one batch of notifications.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot<'a> {
    pub vxlan_name: &'a str,
    pub underlay: &'a UnderlaySelect,
    pub vxlan_index: u32,
    /// `vxlan6.1`'s ifindex (0: none). Its state is not in `expected`:
    /// a deletion of the agent's route, neighbour or FDB entry on it, or
    /// the device itself deleted or down, wakes a full pass (the agent's
    /// own deletions too: rare, and a full pass then changes nothing);
    /// other changes wait for the resync.
    pub vxlan6_index: u32,
    /// The underlay is IPv6 (an IPv6-only node, no `vxlan.1`).
    pub ipv6_underlay: bool,
    /// Its ifindex there (0: none, or not an IPv6-only node).
    pub underlay6_index: u32,
    pub expected: Option<Arc<Expected>>,
}

impl Snapshot<'_> {
    pub(super) fn is_vxlan(&self, index: u32, name: Option<&str>) -> bool {
        (self.vxlan_index != 0 && index == self.vxlan_index) || name == Some(self.vxlan_name)
    }

    pub(super) fn underlay_index(&self) -> u32 {
        self.expected
            .as_ref()
            .map_or(self.underlay6_index, |e| e.vxlan.underlay_index)
    }
}

/// The loop's wake-up signals, one per kind of pass.
#[derive(Debug, Clone, Default)]
pub(crate) struct Signals {
    pub pods: Arc<Notify>,
    pub overlay: Arc<Notify>,
    pub underlay: Arc<Notify>,
}

impl Signals {
    pub(super) fn raise(&self, w: Wake) {
        if w.pods {
            self.pods.notify_one();
        }
        if w.overlay {
            self.overlay.notify_one();
        }
        if w.underlay {
            self.underlay.notify_one();
        }
    }
}
