//! The agent's settings an operator edits: each one's flag, environment
//! variable and ConfigMap key, declared once here and read by the flag
//! parser (`cli/` in the binary), by the error text that names a bad value,
//! by `check-config`'s report and by the deploy tests, which hold the
//! manifests' ConfigMap and DaemonSet to this table.
//!
//! Ground floor: imports nothing from the rooms.

use std::fmt;

/// The ConfigMap the DaemonSet fills the agent's environment from
/// (kustomize adds a hash suffix).
pub const CONFIG_MAP: &str = "mycni-config";

/// One setting: how a flag, the environment and the ConfigMap spell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// The long flag, without `--`.
    pub flag: &'static str,
    /// The environment variable the DaemonSet maps the key to.
    pub env: &'static str,
    /// The ConfigMap key, the name an error gives the setting: in a
    /// cluster it is what the operator edits, not the flag.
    pub key: &'static str,
}

impl Setting {
    /// Where an operator sets it, as error text names it:
    /// ``ConfigMap mycni-config key `mtu`, env MYCNI_MTU``.
    pub fn source(&self) -> Source {
        Source(*self)
    }

    /// A bad value's error, naming the setting: the parser's reason, then
    /// where the value came from.
    pub fn invalid(&self, why: impl fmt::Display) -> String {
        format!("{why} ({})", self.source())
    }

    /// A parser's result with [`Setting::invalid`]'s text on its error.
    pub fn check<T>(&self, r: Result<T, String>) -> Result<T, String> {
        r.map_err(|e| self.invalid(e))
    }
}

/// [`Setting::source`]'s text.
#[derive(Debug, Clone, Copy)]
pub struct Source(Setting);

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ConfigMap {CONFIG_MAP} key `{}`, env {}",
            self.0.key, self.0.env
        )
    }
}

const fn setting(flag: &'static str, env: &'static str, key: &'static str) -> Setting {
    Setting { flag, env, key }
}

// Overlay and underlay.
pub const CLUSTER_CIDR: Setting = setting("cluster-cidr", "MYCNI_CLUSTER_CIDR", "cluster-cidr");
pub const UNDERLAY: Setting = setting("iface", "MYCNI_IFACE", "underlay");
pub const UNDERLAY6: Setting = setting("underlay6", "MYCNI_UNDERLAY6", "underlay6");
pub const MTU: Setting = setting("mtu", "MYCNI_MTU", "mtu");
pub const DIRECT_ROUTING: Setting =
    setting("direct-routing", "MYCNI_DIRECT_ROUTING", "direct-routing");
pub const MASQUERADE: Setting = setting("masquerade", "MYCNI_MASQUERADE", "masquerade");
// Datapath.
pub const DATAPATH: Setting = setting("datapath", "MYCNI_DATAPATH", "datapath");
// Policy.
pub const NETWORK_POLICY: Setting =
    setting("network-policy", "MYCNI_NETWORK_POLICY", "network-policy");
// Flows.
pub const FLOW_EVENTS: Setting = setting("flow-events", "MYCNI_FLOW_EVENTS", "flow-events");
pub const FLOW_HISTORY: Setting = setting("flow-history", "MYCNI_FLOW_HISTORY", "flow-history");
pub const FLOW_POD_SERIES: Setting = setting(
    "flow-pod-series",
    "MYCNI_FLOW_POD_SERIES",
    "flow-pod-series",
);
// Metrics and health.
pub const METRICS_ADDR: Setting = setting("metrics-addr", "MYCNI_METRICS_ADDR", "metrics-addr");
pub const LIVENESS_STALE_AFTER: Setting = setting(
    "liveness-stale-after",
    "MYCNI_LIVENESS_STALE_AFTER",
    "liveness-stale-after",
);
/// The loop's full pass. Its errors name the key `resync`, but the
/// deploy's ConfigMap does not carry it (it is not in [`DEPLOYED`]): only
/// the flag or the environment set it.
pub const RESYNC: Setting = setting("resync", "MYCNI_RESYNC", "resync");

/// Every setting with a ConfigMap key, in `check-config`'s order.
pub const SETTINGS: &[Setting] = &[
    CLUSTER_CIDR,
    UNDERLAY,
    UNDERLAY6,
    MTU,
    DATAPATH,
    DIRECT_ROUTING,
    MASQUERADE,
    NETWORK_POLICY,
    FLOW_EVENTS,
    FLOW_HISTORY,
    FLOW_POD_SERIES,
    METRICS_ADDR,
    RESYNC,
    LIVENESS_STALE_AFTER,
];

/// The settings the deploy's ConfigMap holds (deploy/base/config.env) and
/// the DaemonSet maps into the agent's environment, in that file's order.
pub const DEPLOYED: &[Setting] = &[
    CLUSTER_CIDR,
    MTU,
    UNDERLAY,
    UNDERLAY6,
    DATAPATH,
    DIRECT_ROUTING,
    MASQUERADE,
    NETWORK_POLICY,
    FLOW_EVENTS,
    FLOW_HISTORY,
    FLOW_POD_SERIES,
    METRICS_ADDR,
    LIVENESS_STALE_AFTER,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_text_names_the_key_and_the_env() {
        assert_eq!(
            MTU.invalid("\"10\" is not an MTU"),
            "\"10\" is not an MTU (ConfigMap mycni-config key `mtu`, env MYCNI_MTU)"
        );
        assert_eq!(
            UNDERLAY.source().to_string(),
            "ConfigMap mycni-config key `underlay`, env MYCNI_IFACE"
        );
    }

    #[test]
    fn each_name_is_declared_once() {
        for (i, a) in SETTINGS.iter().enumerate() {
            for b in &SETTINGS[i + 1..] {
                assert!(
                    a.flag != b.flag && a.env != b.env && a.key != b.key,
                    "{a:?} and {b:?} share a name"
                );
            }
        }
        for d in DEPLOYED {
            assert!(SETTINGS.contains(d), "{d:?} deployed but not a setting");
        }
    }
}
