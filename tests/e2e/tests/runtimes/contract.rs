//! The plugin and the agent never talk to each other; they agree through
//! what one leaves on the node and the other reads. Each test here runs the
//! agent's writer and the plugin's own reader (not the shared definitions in
//! `mycni_common::contract`), so it fails when the two sides drift apart,
//! whichever side changed. It lives here, in neither crate, because
//! neither side owns the contract: both are its users.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use mycni_agent::agent::{self, Config};
use mycni_agent::datapath::Mode;
use mycni_common::net::{Cidr4, Cidr6, PodCidrs};
use mycni_plugin::config::{DEFAULT_LOG_FILE, NetConf};
use mycni_plugin::ipam::{self, Builtin};
use mycni_plugin::version;
use serde_json::Value;

fn config(ipam_data_dir: Option<&str>, plugin_log_file: Option<&str>) -> Config {
    Config {
        node_name: Some("n1".into()),
        pod_name: None,
        pod_namespace: None,
        kubeconfig: None,
        cluster_cidr: Some(Cidr4::parse_network("10.244.0.0/16").expect("valid")),
        cluster_cidr6: None,
        iface: Default::default(),
        vxlan_name: "vx-test".into(),
        vxlan6_name: "vx6-test".into(),
        underlay6: mycni_agent::topology::Underlay6Select::Off,
        vni: 7,
        vxlan_port: 4789,
        cni_conf_dir: "/tmp/net.d".into(),
        state_dir: "/tmp/mycni-state".into(),
        data_dir: "/tmp/mycni-data".into(),
        proc_sys: "/proc/sys".into(),
        metrics_addr: None,
        resync: Duration::from_secs(2),
        masquerade: false,
        network_policy: false,
        flow_history: 16,
        flow_pod_series: 4,
        ipam_data_dir: ipam_data_dir.map(PathBuf::from),
        plugin_log_file: plugin_log_file.map(PathBuf::from),
        datapath: Mode::Kernel,
        ebpf_log: false,
        tc_encap: false,
        flow_events: false,
        direct_routing: false,
        ebpf_object: None,
        pin_dir: "/sys/fs/bpf/mycni".into(),
        mtu: None,
    }
}

/// The conflist as the agent writes it to disk, then each plugin entry as
/// the runtime hands it to the plugin: with the list's `name` and
/// `cniVersion` put in (libcni's `ConfFromBytes` + `injectConf`).
fn plugin_stdin(cfg: &Config, pod_cidr: &str, mtu: u32) -> Vec<(String, Vec<u8>)> {
    let own = Cidr4::parse_network(pod_cidr).expect("valid");
    let text = serde_json::to_string_pretty(&agent::conflist(cfg, own, mtu)).expect("serialises");
    let list: Value = serde_json::from_str(&text).expect("the conflist is JSON");
    let versions: Vec<String> = list["cniVersions"]
        .as_array()
        .expect("cniVersions")
        .iter()
        .map(|v| v.as_str().expect("a string").to_string())
        .collect();
    let mut out = Vec::new();
    for version in versions
        .iter()
        .chain([&list["cniVersion"].as_str().expect("cniVersion").to_string()])
    {
        for p in list["plugins"].as_array().expect("plugins") {
            let mut p = p.clone();
            p["name"] = list["name"].clone();
            p["cniVersion"] = Value::from(version.as_str());
            out.push((version.clone(), serde_json::to_vec(&p).expect("serialises")));
        }
    }
    out
}

#[test]
fn the_plugin_reads_every_field_of_the_agents_conflist() {
    let _turn = crate::turn(module_path!());
    let cfg = config(
        Some("/var/lib/test-leases"),
        Some("/var/log/test-plugin.log"),
    );
    let entries = plugin_stdin(&cfg, "10.244.7.0/24", 1400);
    assert!(!entries.is_empty());
    for (version, stdin) in entries {
        // Every version the conflist announces is one the plugin speaks.
        version::parse_supported(&version).expect("a version the plugin speaks");
        let conf = NetConf::parse(&stdin).expect("the plugin takes the agent's conflist");
        assert_eq!(conf.cni_version.as_str(), version);
        assert_eq!(conf.name, agent::NETWORK_NAME);
        assert_eq!(conf.plugin_type, "mycni");
        assert_eq!(conf.mtu, 1400);
        assert_eq!(conf.ready_file, agent::ready_file(&cfg));
        assert_eq!(conf.vxlan_device, "vx-test");
        assert_eq!(conf.log_file, Path::new("/var/log/test-plugin.log"));
        assert_eq!(conf.ipam_type.as_deref(), Some(ipam::BUILTIN_TYPE));
        let b = Builtin::from_conf(conf.ipam.as_ref().expect("ipam"))
            .expect("the built-in IPAM takes the agent's section");
        let range = b
            .sets
            .first()
            .and_then(|s| s.ranges.first())
            .expect("a range");
        assert_eq!(
            (range.network, range.prefix),
            (Ipv4Addr::new(10, 244, 7, 0).into(), 24)
        );
        assert_eq!(b.data_dir, Path::new("/var/lib/test-leases"));
    }
}

#[test]
fn a_dual_stack_node_gives_the_plugins_ipam_both_podcidrs() {
    let _turn = crate::turn(module_path!());
    let cfg = config(None, None);
    let own = PodCidrs {
        v4: Cidr4::parse_network("10.244.7.0/24").ok(),
        v6: Cidr6::parse_network("fd00:10:244:7::/64").ok(),
    };
    let text = serde_json::to_string(&agent::conflist(&cfg, own, 1450)).expect("serialises");
    let list: Value = serde_json::from_str(&text).expect("JSON");
    let mut p = list["plugins"][0].clone();
    p["name"] = list["name"].clone();
    p["cniVersion"] = list["cniVersion"].clone();
    let conf = NetConf::parse(&serde_json::to_vec(&p).expect("serialises")).expect("parses");
    let b = Builtin::from_conf(conf.ipam.as_ref().expect("ipam")).expect("the IPAM takes both");
    let nets: Vec<String> = b
        .sets
        .iter()
        .flat_map(|s| {
            s.ranges
                .iter()
                .map(|r| format!("{}/{}", r.network, r.prefix))
        })
        .collect();
    // IPv4 first: the primary family, as the overlay's.
    assert_eq!(nets, ["10.244.7.0/24", "fd00:10:244:7::/64"]);
    // One podCIDR: the very bytes of the single-stack conflist.
    let single = PodCidrs { v6: None, ..own };
    assert_eq!(
        serde_json::to_string_pretty(&agent::conflist(&cfg, single, 1450)).expect("json"),
        serde_json::to_string_pretty(&agent::conflist(
            &cfg,
            Cidr4::parse_network("10.244.7.0/24").expect("valid"),
            1450
        ))
        .expect("json")
    );
    assert!(
        !serde_json::to_string(&agent::conflist(&cfg, single, 1450))
            .expect("json")
            .contains("ranges")
    );
}

#[test]
fn an_ipv6_only_node_gives_the_plugin_its_ipv6_podcidr_and_vxlan6() {
    let _turn = crate::turn(module_path!());
    let cfg = config(None, None);
    let own = PodCidrs {
        v4: None,
        v6: Cidr6::parse_network("fd00:10:244:7::/64").ok(),
    };
    let text = serde_json::to_string(&agent::conflist(&cfg, own, 1430)).expect("serialises");
    let list: Value = serde_json::from_str(&text).expect("JSON");
    let mut p = list["plugins"][0].clone();
    p["name"] = list["name"].clone();
    p["cniVersion"] = list["cniVersion"].clone();
    let conf = NetConf::parse(&serde_json::to_vec(&p).expect("serialises")).expect("parses");
    // Its one VXLAN device, which the plugin's STATUS looks for.
    assert_eq!(conf.vxlan_device, "vx6-test");
    assert_eq!(conf.mtu, 1430);
    let b = Builtin::from_conf(conf.ipam.as_ref().expect("ipam")).expect("the IPAM takes it");
    let nets: Vec<String> = b
        .sets
        .iter()
        .flat_map(|s| {
            s.ranges
                .iter()
                .map(|r| format!("{}/{}", r.network, r.prefix))
        })
        .collect();
    assert_eq!(nets, ["fd00:10:244:7::/64"]);
}

#[test]
fn unset_options_leave_the_plugins_defaults() {
    let _turn = crate::turn(module_path!());
    let cfg = config(None, None);
    for (_, stdin) in plugin_stdin(&cfg, "10.244.1.0/24", 1450) {
        let conf = NetConf::parse(&stdin).expect("parses");
        assert_eq!(conf.log_file, Path::new(DEFAULT_LOG_FILE));
        let b = Builtin::from_conf(conf.ipam.as_ref().expect("ipam")).expect("parses");
        assert_eq!(b.data_dir, Path::new(ipam::DEFAULT_DATA_DIR));
    }
}

#[test]
fn the_agents_defaults_are_the_plugins() {
    let _turn = crate::turn(module_path!());
    // The plugin falls back to these when the conflist names none; the
    // agent's flags default to the same.
    let cfg = Config {
        state_dir: mycni_common::contract::DEFAULT_STATE_DIR.into(),
        ..config(None, None)
    };
    assert_eq!(
        agent::ready_file(&cfg),
        Path::new(mycni_plugin::config::DEFAULT_READY_FILE)
    );
    assert_eq!(
        mycni_common::contract::DEFAULT_VXLAN_DEVICE,
        mycni_plugin::config::DEFAULT_VXLAN_DEVICE
    );
}

#[test]
fn the_agent_recognises_the_plugins_veths_and_routes() {
    let _turn = crate::turn(module_path!());
    let alias = mycni_plugin::plugin::alias(agent::NETWORK_NAME, "0123abcd", "eth0");
    assert!(mycni_agent::is_pod_veth(&alias), "{alias}");
    assert!(!mycni_agent::is_pod_veth("eth0"));
    assert!(!mycni_agent::is_pod_veth(""));
    // The agent lists pods by the plugin's route protocol and owns its own.
    assert_eq!(
        mycni_common::contract::RTPROT_MYCNI_PLUGIN,
        mycni_plugin::netlink::RTPROT_MYCNI_PLUGIN
    );
    assert_ne!(
        mycni_common::contract::RTPROT_MYCNI_AGENT,
        mycni_common::contract::RTPROT_MYCNI_PLUGIN
    );
}
