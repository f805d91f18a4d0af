//! Every setting's documented forms, and a bad value's error naming its
//! ConfigMap key, through the whole command line as `check-config` takes it.

use std::time::Duration;

use clap::Parser;
use mycni_agent::agent::Config;
use mycni_agent::datapath::Mode;
use mycni_agent::topology::{Underlay6Select, UnderlaySelect};

use super::{Cli, Cmd};

struct Parsed {
    cfg: Config,
    mtu: Option<u32>,
    stale_after: Duration,
    underlay: UnderlaySelect,
}

fn parse(args: &[&str]) -> Result<Parsed, String> {
    let cli = Cli::try_parse_from(["mycni-agent", "check-config"].iter().chain(args).copied())
        .map_err(|e| e.to_string())?;
    match cli.cmd {
        Some(Cmd::CheckConfig(a)) => {
            let stale_after = a.stale_after();
            let cfg = a.config().map_err(|e| e.to_string())?;
            let (mtu, underlay) = (cfg.mtu, cfg.iface.clone());
            Ok(Parsed {
                cfg,
                mtu,
                stale_after,
                underlay,
            })
        }
        _ => Err("not check-config".into()),
    }
}

#[test]
fn every_setting_parses_its_documented_forms() {
    let c = parse(&[]).expect("defaults");
    assert_eq!(
        (c.mtu, &c.underlay, c.cfg.masquerade, c.cfg.direct_routing),
        (None, &UnderlaySelect::DefaultRoute, true, false)
    );
    assert_eq!(c.cfg.resync, Duration::from_secs(300));
    assert_eq!(c.stale_after, Duration::from_secs(30));
    assert_eq!(
        (c.cfg.underlay6, c.cfg.vxlan6_name.as_str()),
        (Underlay6Select::Auto, "vxlan6.1")
    );
    for (arg, want) in [
        ("--underlay6=off", Underlay6Select::Off),
        ("--underlay6=auto", Underlay6Select::Auto),
        (
            "--underlay6=fd00:77::1",
            Underlay6Select::Address("fd00:77::1".parse().expect("ip")),
        ),
    ] {
        assert_eq!(parse(&[arg]).expect(arg).cfg.underlay6, want);
    }
    for bad in ["fe80::1", "::1", "192.168.1.1", "eth0", "::ffff:10.0.0.1"] {
        let e = parse(&[&format!("--underlay6={bad}")])
            .map(|_| ())
            .expect_err(bad);
        assert!(
            e.contains("`underlay6`") && e.contains("MYCNI_UNDERLAY6"),
            "{e}"
        );
    }
    // The heartbeat, not the resync, bounds it: a long resync keeps
    // a stuck loop found within 30 s, and stays valid with it.
    let c = parse(&["--resync=60s"]).expect("long resync");
    assert_eq!(c.stale_after, Duration::from_secs(30));
    let c = parse(&["--resync=60s", "--liveness-stale-after=30s"]).expect("long resync");
    assert_eq!(c.stale_after, Duration::from_secs(30));
    // A short resync beats as often, and allows a short limit.
    let c = parse(&["--resync=1s", "--liveness-stale-after=3s"]).expect("lab settings");
    assert_eq!(c.stale_after, Duration::from_secs(3));
    let c = parse(&[
        "--cluster-cidr=10.32.0.0/12",
        "--mtu=1400",
        "--iface=interface=en*",
        "--datapath=kernel",
        "--direct-routing=true",
        "--masquerade=false",
        "--metrics-addr=off",
        "--resync=5s",
        "--liveness-stale-after=1m",
    ])
    .expect("all set");
    assert_eq!(c.cfg.clusters().to_string(), "10.32.0.0/12");
    assert_eq!(c.cfg.cluster_cidr6, None);
    for both in [
        "--cluster-cidr=10.32.0.0/12,fd00:10:244::/56",
        "--cluster-cidr=fd00:10:244::/56, 10.32.0.0/12",
    ] {
        let c = parse(&[both]).expect("dual-stack");
        assert_eq!(
            c.cfg.cluster_cidr.map(|c| c.to_string()).as_deref(),
            Some("10.32.0.0/12")
        );
        assert_eq!(
            c.cfg.cluster_cidr6.map(|c| c.to_string()).as_deref(),
            Some("fd00:10:244::/56")
        );
    }
    // IPv6-only: an IPv6 range alone.
    let c = parse(&["--cluster-cidr=fd00:10:244::/56"]).expect("IPv6-only");
    assert_eq!(c.cfg.cluster_cidr, None);
    assert!(c.cfg.clusters().ipv6_only());
    assert_eq!(c.cfg.clusters().to_string(), "fd00:10:244::/56");
    let c = parse(&[
        "--cluster-cidr=10.32.0.0/12",
        "--mtu=1400",
        "--iface=interface=en*",
        "--datapath=kernel",
        "--direct-routing=true",
        "--masquerade=false",
        "--metrics-addr=off",
        "--resync=5s",
        "--liveness-stale-after=1m",
    ])
    .expect("all set");
    assert_eq!(c.mtu, Some(1400));
    assert_eq!(c.underlay, UnderlaySelect::Pattern("en*".into()));
    assert_eq!(c.cfg.datapath, Mode::Kernel);
    assert!(c.cfg.direct_routing && !c.cfg.masquerade && c.cfg.metrics_addr.is_none());
    assert_eq!(c.stale_after, Duration::from_secs(60));
    let c = parse(&["--iface=can-reach=192.168.1.1", "--mtu=auto"]).expect("can-reach");
    assert_eq!(
        c.underlay,
        UnderlaySelect::CanReach(std::net::Ipv4Addr::new(192, 168, 1, 1).into())
    );
    assert_eq!(c.mtu, None);
}

#[test]
fn a_bad_value_names_its_configmap_key() {
    for (arg, key) in [
        ("--cluster-cidr=10.244.0.1/33", "cluster-cidr"),
        ("--cluster-cidr=,", "cluster-cidr"),
        ("--cluster-cidr=fd00::/56,fd01::/56", "cluster-cidr"),
        ("--cluster-cidr=10.244.0.0/16,10.245.0.0/16", "cluster-cidr"),
        (
            "--cluster-cidr=10.244.0.0/16,fd00::/56,fd01::/56",
            "cluster-cidr",
        ),
        ("--cluster-cidr=10.244.0.0/16,fd00::1/56", "cluster-cidr"),
        ("--mtu=100", "mtu"),
        ("--mtu=1500b", "mtu"),
        ("--iface=can-reach=gateway", "underlay"),
        ("--iface=eth*", "underlay"),
        ("--datapath=xdp", "datapath"),
        ("--direct-routing=yes", "direct-routing"),
        ("--masquerade=1", "masquerade"),
        ("--network-policy=off", "network-policy"),
        ("--flow-events=yes", "flow-events"),
        ("--flow-history=-1", "flow-history"),
        ("--flow-pod-series=many", "flow-pod-series"),
        ("--metrics-addr=9971", "metrics-addr"),
        ("--resync=0s", "resync"),
        ("--liveness-stale-after=2x", "liveness-stale-after"),
        // Valid alone, but shorter than 3 heartbeats (10 s each).
        ("--liveness-stale-after=29s", "liveness-stale-after"),
    ] {
        let e = parse(&[arg])
            .err()
            .unwrap_or_else(|| panic!("{arg} accepted"));
        assert!(
            e.contains(&format!("ConfigMap mycni-config key `{key}`")),
            "{arg}: {e}"
        );
    }
}

/// The configuration `check-config` makes of these flags.
pub(super) fn check_config(args: &[&str]) -> Result<Config, String> {
    parse(args).map(|p| p.cfg)
}

#[test]
fn each_setting_of_the_table_is_a_flag_of_run_reading_its_env() {
    use clap::CommandFactory;
    let cmd = Cli::command();
    let run = cmd.find_subcommand("run").expect("run");
    for s in mycni_agent::settings::SETTINGS {
        let arg = run
            .get_arguments()
            .find(|a| a.get_long() == Some(s.flag))
            .unwrap_or_else(|| panic!("no --{}", s.flag));
        assert_eq!(
            arg.get_env().and_then(|e| e.to_str()),
            Some(s.env),
            "--{}",
            s.flag
        );
    }
}
