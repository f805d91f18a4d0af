//! `mycni-agent check-config`: the settings as `run` would take them,
//! printed by their ConfigMap keys, then what this kernel offers the fast
//! path.

use std::time::Duration;

use anyhow::Result;
use mycni_agent::agent::Config;
use mycni_agent::settings::{
    CLUSTER_CIDR, DATAPATH, DIRECT_ROUTING, FLOW_EVENTS, FLOW_HISTORY, FLOW_POD_SERIES,
    LIVENESS_STALE_AFTER, MASQUERADE, METRICS_ADDR, MTU, NETWORK_POLICY, RESYNC, Setting, UNDERLAY,
    UNDERLAY6,
};

use super::run::RunArgs;

pub(super) fn run(args: RunArgs) -> Result<()> {
    let stale_after = args.stale_after();
    let cfg = args.config()?;
    println!("configuration ok: {}", report(&cfg, stale_after));
    mycni_agent::kernel_check::print(cfg.datapath, cfg.ebpf_object.as_deref())
}

/// Each setting as `key=value`, the value as the setting takes it.
fn values(cfg: &Config, stale_after: Duration) -> [(Setting, String); 14] {
    [
        (CLUSTER_CIDR, cfg.clusters().to_string()),
        (UNDERLAY, cfg.iface.to_string()),
        (UNDERLAY6, cfg.underlay6.to_string()),
        (MTU, cfg.mtu.map_or("auto".to_string(), |m| m.to_string())),
        (DATAPATH, format!("{:?}", cfg.datapath).to_lowercase()),
        (DIRECT_ROUTING, cfg.direct_routing.to_string()),
        (MASQUERADE, cfg.masquerade.to_string()),
        (NETWORK_POLICY, cfg.network_policy.to_string()),
        (FLOW_EVENTS, cfg.flow_events.to_string()),
        (FLOW_HISTORY, cfg.flow_history.to_string()),
        (FLOW_POD_SERIES, cfg.flow_pod_series.to_string()),
        (
            METRICS_ADDR,
            cfg.metrics_addr
                .map_or("off".to_string(), |a| a.to_string()),
        ),
        (RESYNC, format!("{:?}", cfg.resync)),
        (LIVENESS_STALE_AFTER, format!("{stale_after:?}")),
    ]
}

fn report(cfg: &Config, stale_after: Duration) -> String {
    values(cfg, stale_after)
        .iter()
        .map(|(s, v)| format!("{}={v}", s.key))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_names_every_setting_by_its_key() {
        let cfg = super::super::tests::check_config(&[]).expect("defaults");
        let vs = values(&cfg, Duration::from_secs(30));
        for s in mycni_agent::settings::SETTINGS {
            assert!(vs.iter().any(|(v, _)| v == s), "{s:?} not reported");
        }
        assert_eq!(
            report(&cfg, Duration::from_secs(30)),
            "cluster-cidr=10.244.0.0/16 underlay=default-route underlay6=auto mtu=auto \
             datapath=ebpf direct-routing=false masquerade=true network-policy=true \
             flow-events=true flow-history=4095 flow-pod-series=100 \
             metrics-addr=0.0.0.0:9971 resync=300s liveness-stale-after=30s"
        );
    }
}
