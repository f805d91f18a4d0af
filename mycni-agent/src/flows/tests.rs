//! The room's pure parts: enrichment, the JSON and line formats, the store
//! and its filters, against the policy fixture's model cluster.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use mycni_common::DpPath;
use mycni_common::flow::{FLOW_DROP, FLOW_NEW, FlowEvent, FlowSource};
use serde_json::json;

use super::enrich::{Directory, Names};
use super::record::Line;
use super::room::KernelNames;
use super::store::{Filter, Store};
use super::{NftLog, NftVerdict, Observation};
use crate::cluster::Cluster;
use crate::cluster::fixture::{model, np, pod_ip};
use crate::verdict::Direction;
use crate::verdict::Reason;

fn cluster() -> Arc<Cluster> {
    let mut c = model();
    c.add_policy(np(
        "x",
        "b-from-a",
        json!({"podSelector": {"matchLabels": {"pod": "b"}},
               "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "a"}}}],
                            "ports": [{"port": 80}]}]}),
    ));
    Arc::new(c)
}

fn dir() -> Directory {
    let host: IpAddr = "192.168.77.11".parse().expect("address");
    Directory::new(cluster(), HashSet::from([host]))
}

fn at() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_nanos(1_764_000_000_123_456_789)
}

fn event(src: IpAddr, dst: IpAddr, kind: u8, reason: u16, flags: u8) -> FlowEvent {
    let bytes = |ip: IpAddr| {
        let mut b = [0u8; 16];
        match ip {
            IpAddr::V4(a) => b[..4].copy_from_slice(&a.octets()),
            IpAddr::V6(a) => b = a.octets(),
        }
        b
    };
    FlowEvent {
        ts_ns: 0,
        src: bytes(src),
        dst: bytes(dst),
        sport: 40000,
        dport: 80,
        ifindex: 0,
        count: 1,
        reason,
        proto: 6,
        family: if src.is_ipv6() { 6 } else { 4 },
        tcp_flags: flags,
        source: FlowSource::Pod as u8,
        kind,
        _pad: [0; 5],
    }
}

fn nft(src: IpAddr, dst: IpAddr, verdict: NftVerdict) -> Observation {
    Observation::Nft(NftLog {
        at: at(),
        verdict,
        src,
        dst,
        sport: 40000,
        dport: 80,
        proto: 6,
        tcp_flags: 0x02,
        in_ifindex: 0,
        out_ifindex: 0,
        count: 1,
    })
}

struct NoNames;
impl Names for NoNames {
    fn drop_reason(&self, n: u16) -> String {
        HashMap::from([(16u16, "IP_RPFILTER".to_string())])
            .get(&n)
            .cloned()
            .unwrap_or_else(|| n.to_string())
    }
    fn interface(&self, _: u32) -> String {
        String::new()
    }
}

fn line(o: Observation) -> Line {
    dir().record(o).line("node-1", &NoNames)
}

#[test]
fn a_datapath_event_names_both_pods_and_the_path() {
    let (a, b) = (pod_ip("x", "a", false), pod_ip("x", "b", false));
    let l = line(Observation::Datapath {
        at: at(),
        event: event(a, b, FLOW_NEW, DpPath::KernelTcpControl as u16, 0x02),
    });
    let v = serde_json::to_value(&l).expect("json");
    assert_eq!(v["flow"]["verdict"], "FORWARDED");
    assert_eq!(v["flow"]["source"]["namespace"], "x");
    assert_eq!(v["flow"]["source"]["pod_name"], "a");
    assert_eq!(v["flow"]["destination"]["pod_name"], "b");
    assert_eq!(v["flow"]["IP"]["ipVersion"], "IPv4");
    assert_eq!(v["flow"]["l4"]["TCP"]["destination_port"], 80);
    assert_eq!(v["flow"]["l4"]["TCP"]["flags"], json!({"SYN": true}));
    assert_eq!(v["flow"]["path"], "kernel");
    assert_eq!(v["flow"]["path_reason"], "kernel_tcp_control");
    assert_eq!(v["flow"]["trace_observation_point"], "FROM_ENDPOINT");
    assert_eq!(v["flow"]["event"], "new");
    assert_eq!(v["time"], "2025-11-24T16:00:00.123456789Z");
    let fast = line(Observation::Datapath {
        at: at(),
        event: event(a, b, 1, DpPath::FastEncap as u16, 0x10),
    });
    assert_eq!(fast.flow.path.as_deref(), Some("fast_encap"));
    assert_eq!(fast.flow.path_reason, None);
}

#[test]
fn a_kernel_drop_carries_the_kernels_reason() {
    let (a, b) = (pod_ip("x", "a", false), pod_ip("y", "c", false));
    let l = line(Observation::Datapath {
        at: at(),
        event: event(a, b, FLOW_DROP, 16, 0),
    });
    assert_eq!(l.flow.verdict, "DROPPED");
    assert_eq!(l.flow.drop_reason_desc.as_deref(), Some("IP_RPFILTER"));
}

#[test]
fn a_cut_reply_names_the_isolated_pod_at_its_source() {
    // x/b's reply to x/c, dropped when the table re-judged the connection
    // c -> b (b's ingress): the isolated pod is the packet's source.
    let (c, b) = (pod_ip("x", "c", false), pod_ip("x", "b", false));
    let r = dir().record(nft(
        b,
        c,
        NftVerdict::PolicyDrop {
            direction: Direction::Ingress,
            reason: Reason::Denied,
        },
    ));
    let l = r.line("node-1", &NoNames);
    assert_eq!(l.flow.is_reply, Some(true));
    assert_eq!(l.flow.ingress_denied_by.len(), 1, "{}", l.human());
    assert!(l.human().contains("POLICY_DENIED; reply;"), "{}", l.human());
    let (isolated, other, other_ip, port) = r.isolated().expect("a policy drop");
    assert_eq!(isolated.pod().map(|p| p.key.name.as_str()), Some("b"));
    assert_eq!(other.pod().map(|p| p.key.name.as_str()), Some("c"));
    assert_eq!((other_ip, port), (c, 40000));
    let (_, to) = super::events::event_for(&r).expect("an event");
    assert_eq!(to.name.as_deref(), Some("b"));
}

#[test]
fn a_policy_drop_names_the_isolated_pod_and_its_policies() {
    // x/c may not reach x/b: b is isolated for ingress by b-from-a.
    let (c, b) = (pod_ip("x", "c", false), pod_ip("x", "b", false));
    let l = line(nft(
        c,
        b,
        NftVerdict::PolicyDrop {
            direction: Direction::Ingress,
            reason: Reason::Denied,
        },
    ));
    assert_eq!(l.flow.verdict, "DROPPED");
    assert_eq!(l.flow.drop_reason_desc.as_deref(), Some("POLICY_DENIED"));
    assert_eq!(l.flow.traffic_direction.as_deref(), Some("INGRESS"));
    let names: Vec<String> = l
        .flow
        .ingress_denied_by
        .iter()
        .map(|p| format!("{}/{}", p.namespace, p.name))
        .collect();
    assert_eq!(names, ["x/b-from-a"]);
    let human = l.human();
    assert!(
        human.contains("x/c (") && human.contains("-> x/b ("),
        "{human}"
    );
    assert!(
        human.contains("DROPPED POLICY_DENIED; ingress isolated by x/b-from-a"),
        "{human}"
    );
}

#[test]
fn a_policy_allow_names_the_rule_that_admitted_it() {
    let (a, b) = (pod_ip("x", "a", true), pod_ip("x", "b", true));
    let l = line(nft(
        a,
        b,
        NftVerdict::PolicyAllow {
            direction: Direction::Ingress,
        },
    ));
    assert_eq!(l.flow.verdict, "FORWARDED");
    assert_eq!(l.flow.ip.ip_version, "IPv6");
    let by: Vec<(String, Option<usize>)> = l
        .flow
        .ingress_allowed_by
        .iter()
        .map(|p| (p.name.clone(), p.rule))
        .collect();
    assert_eq!(by, [("b-from-a".to_string(), Some(0))]);
    assert!(l.human().contains("ingress allowed by x/b-from-a#0"));
}

#[test]
fn addresses_that_are_no_pod_are_the_host_or_the_world() {
    let host: IpAddr = "192.168.77.11".parse().expect("address");
    let world: IpAddr = "8.8.8.8".parse().expect("address");
    let l = line(Observation::Datapath {
        at: at(),
        event: event(
            host,
            world,
            FLOW_NEW,
            DpPath::KernelUnknownDest as u16,
            0x02,
        ),
    });
    assert_eq!(l.flow.source.labels, ["reserved:host"]);
    assert_eq!(l.flow.source.node_name, "node-1");
    assert_eq!(l.flow.destination.labels, ["reserved:world"]);
}

fn store(n: usize) -> Arc<Store> {
    let s = Arc::new(Store::new(
        "node-1".into(),
        n,
        Arc::new(KernelNames::default()),
    ));
    let d = dir();
    for (i, (from, to)) in [("a", "b"), ("c", "b"), ("a", "c")].iter().enumerate() {
        let mut o = nft(
            pod_ip("x", from, false),
            pod_ip("x", to, false),
            NftVerdict::PolicyDrop {
                direction: Direction::Ingress,
                reason: Reason::Denied,
            },
        );
        if let Observation::Nft(log) = &mut o {
            log.dport = 80 + i as u16;
        }
        s.push(d.record(o));
    }
    s
}

#[test]
fn the_store_keeps_the_newest_and_filters_by_every_field() {
    let s = store(2);
    assert_eq!(s.held(), 2, "capacity 2: the oldest went");
    let all = s.matching(&Filter::default());
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].flow.destination.pod_name, "b");
    let q = |query: &str| {
        s.matching(&Filter::from_query(query).expect("query"))
            .iter()
            .map(|l| l.flow.ports().map_or(0, |p| p.1))
            .collect::<Vec<_>>()
    };
    assert_eq!(q("pod=x/c"), [81, 82]);
    assert_eq!(q("pod=a"), [82]);
    assert_eq!(q("port=81"), [81]);
    assert_eq!(q("verdict=dropped&protocol=TCP"), [81, 82]);
    assert_eq!(q("verdict=FORWARDED"), Vec::<u16>::new());
    assert_eq!(q("reason=policy_denied&policy=x/b-from-a"), [81]);
    assert_eq!(q("namespace=y"), Vec::<u16>::new());
    assert_eq!(q("last=1"), [82]);
    assert!(Filter::from_query("port=http").is_err());
    assert!(Filter::from_query("colour=red").is_err());
}

#[test]
fn a_filter_survives_its_query() {
    let f = Filter {
        pod: Some("x/a b".into()),
        namespace: Some("x".into()),
        verdict: Some("DROPPED".into()),
        reason: Some("IP_RPFILTER".into()),
        policy: Some("x/deny&all".into()),
        port: Some(53),
        protocol: Some("udp".into()),
        last: Some(7),
        follow: true,
    };
    assert_eq!(Filter::from_query(&f.to_query()), Ok(f));
}

#[tokio::test]
async fn a_follower_gets_only_new_matching_flows() {
    use futures::StreamExt;
    let s = store(10);
    let mut live = s.follow(Filter::from_query("pod=x/c").expect("query"));
    let d = dir();
    s.push(d.record(nft(
        pod_ip("x", "a", false),
        pod_ip("x", "b", false),
        NftVerdict::UnderlayDrop,
    )));
    s.push(d.record(nft(
        pod_ip("x", "c", false),
        pod_ip("x", "a", false),
        NftVerdict::UnderlayDrop,
    )));
    let got = tokio::time::timeout(Duration::from_secs(5), live.next())
        .await
        .expect("a line within 5 s")
        .expect("a line");
    let l: Line = serde_json::from_str(&got).expect("a flow line");
    assert_eq!(l.flow.source.pod_name, "c");
    assert_eq!(
        l.flow.drop_reason_desc.as_deref(),
        Some("UNDERLAY_NOT_PEER")
    );
}

#[test]
fn explain_names_the_deciding_rule_and_the_isolating_policies() {
    use super::explain::{Asked, explain, parse, render};
    use crate::cluster::{Key, Protocol};
    let c = cluster();
    let (src, dst, port, proto) = parse("x/a/x/b/80/tcp").expect("parses");
    assert_eq!(src, Asked::Pod(Key::new("x", "a")));
    let e = explain(&c, None, &src, &dst, port, proto).expect("explained");
    assert_eq!(e.verdict, "allowed");
    assert_eq!(e.ingress.rules, ["x/b-from-a ingress[0]"]);
    assert_eq!(e.egress.judgement, "open");
    assert_eq!(e.destination.selected_by, ["x/b-from-a"]);
    let e = explain(
        &c,
        None,
        &Asked::Pod(Key::new("x", "c")),
        &dst,
        80,
        Protocol::Tcp,
    )
    .expect("explained");
    assert_eq!(e.verdict, "denied");
    assert_eq!(e.ingress.isolated_by, ["x/b-from-a"]);
    assert!(
        render(&e).contains("isolated by x/b-from-a and no rule"),
        "{}",
        render(&e)
    );
    let (src, ..) = parse("10.0.0.1/x/b/81/udp").expect("parses an address");
    assert_eq!(src, Asked::Ip("10.0.0.1".parse().expect("ip")));
    assert!(parse("x/a/x/b/80").is_err());
    assert!(parse("x/a/x/b/80/icmp").is_err());
    assert!(
        explain(
            &c,
            None,
            &Asked::Pod(Key::new("x", "nope")),
            &dst,
            80,
            Protocol::Tcp
        )
        .is_err()
    );
}

#[test]
fn decisions_outlive_a_flood_of_connections() {
    let s = Store::new("node-1".into(), 8, Arc::new(KernelNames::default()));
    let d = dir();
    let (a, b) = (pod_ip("x", "a", false), pod_ip("x", "b", false));
    s.push(d.record(nft(
        a,
        b,
        NftVerdict::PolicyDrop {
            direction: Direction::Ingress,
            reason: Reason::Denied,
        },
    )));
    for _ in 0..20 {
        s.push(d.record(Observation::Datapath {
            at: at(),
            event: event(a, b, FLOW_NEW, DpPath::KernelTcpControl as u16, 0x02),
        }));
    }
    let lines = s.matching(&Filter::default());
    assert_eq!(lines.len(), 9, "8 of everything and the drop kept apart");
    assert_eq!(s.held(), 9);
    assert_eq!(
        lines[0].flow.verdict, "DROPPED",
        "the drop first: it came first"
    );
    assert_eq!(
        s.matching(&Filter::from_query("verdict=DROPPED").expect("query"))
            .len(),
        1
    );
}

#[test]
fn a_repeated_shape_is_attributed_once_and_alike() {
    use super::enrich::What;
    let attribution = |r: &super::enrich::Record| match &r.what {
        What::Nft {
            allowed_by,
            denied_by,
            reply,
            ..
        } => (allowed_by.clone(), denied_by.clone(), *reply),
        What::Datapath { .. } => panic!("an nftables record"),
    };
    let d = dir();
    let (a, b, c) = (
        pod_ip("x", "a", false),
        pod_ip("x", "b", false),
        pod_ip("x", "c", false),
    );
    let allow = NftVerdict::PolicyAllow {
        direction: Direction::Ingress,
    };
    let drop = NftVerdict::PolicyDrop {
        direction: Direction::Ingress,
        reason: Reason::Denied,
    };
    let first = attribution(&d.record(nft(a, b, allow)));
    let again = attribution(&d.record(nft(a, b, allow)));
    // The second answer is the first one's list, not an evaluation's copy.
    assert!(Arc::ptr_eq(&first.0, &again.0));
    assert_eq!(first.0.len(), 1);
    // A drop of the same pair is another shape, as are a cut reply and the
    // connection it belongs to, whose isolated ends differ.
    let cut = attribution(&d.record(nft(b, c, drop)));
    let cut_again = attribution(&d.record(nft(b, c, drop)));
    let refused = attribution(&d.record(nft(c, b, drop)));
    assert!(cut.2 && cut_again.2 && !refused.2);
    assert_eq!(cut.1, cut_again.1);
    assert_eq!(cut.1.len(), 1);
    assert_eq!(refused.1, cut.1);
    assert!(first.1.is_empty() && cut.0.is_empty());
}

/// What the room pays per record at the policy bench's scale: an admitted
/// connection's NFLOG record (the same pair and port again, as a connect
/// loop makes them, and a new port every time, which no cache helps) and
/// a datapath event. An ignored measurement: `cargo test -p mycni-agent
/// --release --lib flows::tests::room_cost -- --ignored --nocapture`.
#[test]
#[ignore]
fn room_cost_per_record_at_the_policy_benchs_scale() {
    use std::time::Instant;
    let (client, server): (IpAddr, IpAddr) = (
        "10.244.1.5".parse().expect("address"),
        "10.244.2.5".parse().expect("address"),
    );
    let allow = |dport: u16| {
        let mut o = nft(
            client,
            server,
            NftVerdict::PolicyAllow {
                direction: Direction::Ingress,
            },
        );
        if let Observation::Nft(log) = &mut o {
            log.dport = dport;
        }
        o
    };
    for (policies, prefixes) in [(1, 0), (10, 0), (1_000, 0), (1, 10_000)] {
        let d = Directory::new(
            Arc::new(crate::cluster::fixture::bench_cluster(policies, prefixes)),
            HashSet::new(),
        );
        let n = 2_000u32;
        let per = |f: &dyn Fn(u32)| {
            let t = Instant::now();
            for i in 0..n {
                f(i);
            }
            t.elapsed() / n
        };
        let same = per(&|_| drop(d.record(allow(5001))));
        let fresh = per(&|i| drop(d.record(allow(30_000 + i as u16))));
        let datapath = per(&|_| {
            drop(d.record(Observation::Datapath {
                at: at(),
                event: event(client, server, FLOW_NEW, DpPath::FastEncap as u16, 0x02),
            }))
        });
        eprintln!(
            "{policies:>5} policies, {prefixes:>6} prefixes: allow record {same:.1?} (same shape), \
             {fresh:.1?} (a new port each), datapath event {datapath:.1?}"
        );
    }
}

#[test]
fn explain_with_a_kubeconfig_adds_both_ends_nodes_in_time_order() {
    use super::explain::{Asked, ends_nodes, explain, merge_last_seen};
    use crate::cluster::{Key, Protocol};
    let c = cluster();
    let mut e = explain(
        &c,
        None,
        &Asked::Pod(Key::new("x", "a")),
        &Asked::Pod(Key::new("x", "b")),
        80,
        Protocol::Tcp,
    )
    .expect("explained");
    // x/a runs on node-0, x/b on node-1 (the fixture's model).
    assert_eq!(ends_nodes(&e, "node-0"), ["node-1"]);
    assert_eq!(ends_nodes(&e, "node-2"), ["node-0", "node-1"]);
    let (a, b) = (pod_ip("x", "a", false), pod_ip("x", "b", false));
    let d = dir();
    let line = |node: &str, secs: u64| {
        let mut o = nft(
            a,
            b,
            NftVerdict::PolicyAllow {
                direction: Direction::Ingress,
            },
        );
        if let Observation::Nft(log) = &mut o {
            log.at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_764_000_000 + secs);
        }
        d.record(o).line(node, &NoNames)
    };
    e.last_seen = vec![line("node-0", 1), line("node-0", 30)];
    merge_last_seen(&mut e, vec![(2..14).map(|s| line("node-1", s)).collect()]);
    let seen: Vec<(&str, &str)> = e
        .last_seen
        .iter()
        .map(|l| (l.node_name.as_str(), &l.time[17..19]))
        .collect();
    // The last ten by time, from both nodes: node-1's 4..13, then node-0's 30.
    assert_eq!(seen.len(), 10, "{seen:?}");
    assert_eq!(seen.last(), Some(&("node-0", "30")), "{seen:?}");
    assert!(seen[..9].iter().all(|(n, _)| *n == "node-1"), "{seen:?}");
    assert!(
        super::explain::render(&e).contains("last seen by node-1, node-0:"),
        "{}",
        super::explain::render(&e)
    );
}

fn node_object(
    name: &str,
    host: &str,
    pod_cidrs: &[&str],
) -> Arc<k8s_openapi::api::core::v1::Node> {
    use k8s_openapi::api::core::v1::{Node, NodeSpec};
    use mycni_common::contract::ANNOTATION_HOST_IP;
    let mut n = Node::default();
    n.metadata.name = Some(name.into());
    n.metadata.annotations = Some([(ANNOTATION_HOST_IP.to_string(), host.to_string())].into());
    n.spec = Some(NodeSpec {
        pod_cidrs: Some(pod_cidrs.iter().map(|c| c.to_string()).collect()),
        ..NodeSpec::default()
    });
    Arc::new(n)
}

#[test]
fn other_nodes_addresses_are_named_remote_nodes() {
    let nodes = vec![
        node_object("node-1", "192.168.77.11", &["10.244.1.0/24"]),
        node_object(
            "node-2",
            "192.168.77.12",
            &["10.244.2.0/24", "fd00:10:244:2::/64"],
        ),
        node_object("node-3", "not an address", &["garbage"]),
    ];
    let addrs = super::node_addrs(&nodes, "node-1");
    let named = |ip: &str| {
        addrs
            .get(&ip.parse::<IpAddr>().expect("ip"))
            .map(|n| n.to_string())
    };
    // This node's own are the host's, not a remote node's.
    assert_eq!(named("192.168.77.11"), None);
    assert_eq!(named("192.168.77.12").as_deref(), Some("node-2"));
    assert_eq!(named("10.244.2.0").as_deref(), Some("node-2"));
    assert_eq!(named("fd00:10:244:2::").as_deref(), Some("node-2"));
    assert_eq!(addrs.len(), 3, "{addrs:?}");
    let d = dir().with_nodes(Arc::new(addrs));
    let vtep: IpAddr = "10.244.2.0".parse().expect("ip");
    let pod = pod_ip("x", "a", false);
    let l = d
        .record(Observation::Datapath {
            at: at(),
            event: event(vtep, pod, FLOW_NEW, DpPath::FastDecap as u16, 0x02),
        })
        .line("node-1", &NoNames);
    assert_eq!(l.flow.source.labels, ["reserved:remote-node"]);
    assert_eq!(l.flow.source.node_name, "node-2");
    assert!(
        l.human().contains("10.244.2.0 (node node-2)"),
        "{}",
        l.human()
    );
    let world: IpAddr = "192.168.77.99".parse().expect("ip");
    assert!(matches!(d.who(world), super::enrich::Who::World));
}

#[tokio::test]
async fn the_room_goes_on_when_there_is_no_policy_room() {
    use super::room::{KernelNames, Settings, spawn};
    let metrics = Arc::new(crate::metrics::Metrics::default());
    // Enforcement off: the policy room never starts, its sender is gone.
    let (cluster_tx, cluster_rx) = tokio::sync::watch::channel(cluster());
    drop(cluster_tx);
    let (_nodes_tx, nodes_rx) = tokio::sync::watch::channel(super::Nodes::default());
    let (sink, store, task) = spawn(
        Settings {
            node: "node-1".into(),
            history: 100,
            pod_series: 10,
        },
        &metrics,
        cluster_rx,
        nodes_rx,
        HashSet::new(),
        Arc::new(KernelNames::default()),
        None,
    );
    let (a, b) = (pod_ip("x", "a", false), pod_ip("x", "b", false));
    for _ in 0..3 {
        sink.send(Observation::Datapath {
            at: at(),
            event: event(a, b, FLOW_NEW, DpPath::FastEncap as u16, 0x02),
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut held = 0;
    for _ in 0..100 {
        held = store.matching(&Filter::default()).len();
        if held == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    task.abort();
    assert_eq!(held, 3, "the room stopped taking records");
}
