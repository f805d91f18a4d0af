//! Counters and readiness parsed from made-up pages, the fast share, the
//! peer routes and how a node is described.

use super::*;

/// Peer routes: `direct`, through `vxlan.1`, through `vxlan6.1`.
fn peer_routes(direct: usize, vxlan: usize, vxlan6: usize) -> PeerRoutes {
    PeerRoutes {
        direct,
        vxlan,
        vxlan6,
    }
}

#[test]
fn counters_parse_from_the_metrics_page() {
    let m = "# TYPE mycni_datapath_packets_total counter\n\
             mycni_datapath_packets_total{path=\"fast_encap\",fast=\"true\"} 120\n\
             mycni_datapath_packets_total{path=\"kernel_tcp_control\",fast=\"false\"} 7\n\
             mycni_datapath_bytes_total{path=\"fast_encap\",fast=\"true\"} 99999\n";
    let c = parse_counters(m);
    assert_eq!(c.len(), 2);
    assert_eq!(c["fast_encap"], 120);
    assert_eq!(c["kernel_tcp_control"], 7);
    // An agent of this build: one series per path and family.
    let m = "mycni_datapath_packets_total{path=\"fast_encap\",fast=\"true\",family=\"other\"} 0\n\
             mycni_datapath_packets_total{path=\"fast_encap\",fast=\"true\",family=\"ipv4\"} 120\n\
             mycni_datapath_packets_total{path=\"fast_encap\",fast=\"true\",family=\"ipv6\"} 30\n\
             mycni_datapath_packets_total{path=\"kernel_not_ipv4\",fast=\"false\",family=\"other\"} 5\n\
             mycni_datapath_bytes_total{path=\"fast_encap\",fast=\"true\",family=\"ipv6\"} 99999\n";
    let c = parse_counters(m);
    assert_eq!(
        (c.len(), c["fast_encap"], c["kernel_not_ipv4"]),
        (2, 150, 5)
    );
    let f = parse_family_counters(m);
    assert_eq!(f.len(), 3);
    assert_eq!(f[family_label(IpFamily::V6)]["fast_encap"], 30);
    assert_eq!(f["ipv4"]["fast_encap"], 120);
    assert_eq!(f["other"]["kernel_not_ipv4"], 5);
}

#[test]
fn a_fast_share_of_one_family_counts_that_family_alone() {
    let page = |v4: u64, v6_fast: u64, v6_kernel: u64| {
        parse_family_counters(&format!(
            "mycni_datapath_packets_total{{path=\"fast_encap\",fast=\"true\",family=\"ipv4\"}} {v4}\n\
             mycni_datapath_packets_total{{path=\"fast_encap\",fast=\"true\",family=\"ipv6\"}} {v6_fast}\n\
             mycni_datapath_packets_total{{path=\"kernel_unknown_dest\",fast=\"false\",family=\"ipv6\"}} {v6_kernel}\n\
             mycni_datapath_packets_total{{path=\"kernel_not_ipv4\",fast=\"false\",family=\"other\"}} {v4}\n"
        ))
    };
    let (before, after) = (page(0, 0, 0), page(1000, 30, 70));
    let v6 = PathShare::between_family(&before, &after, IpFamily::V6);
    assert_eq!((v6.pod, v6.fast), (100, 30));
    assert_eq!(v6.kernel["kernel_unknown_dest"], 70);
    let v4 = PathShare::between_family(&before, &after, IpFamily::V4);
    assert_eq!((v4.pod, v4.fast), (1000, 1000));
    // No IPv6 counted at all (an IPv4-only lab, or an older agent).
    let none = PathShare::between_family(&before, &FamilyCounters::new(), IpFamily::V6);
    assert_eq!(none.fast_pct(), None);
}

#[test]
fn agent_flags_take_the_last_value_in_either_form() {
    let args: Vec<String> = [
        "run",
        "--tc-encap",
        "true",
        "--resync=1s",
        "--tc-encap=false",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    assert_eq!(flag_value(&args, "--tc-encap").as_deref(), Some("false"));
    assert_eq!(flag_value(&args, "--resync").as_deref(), Some("1s"));
    assert_eq!(flag_value(&args, "--datapath"), None);
}

#[test]
fn the_kernel_paths_reason_comes_from_readyz() {
    let r = "HTTP/1.1 200 OK ready: overlay up, 2 peers; datapath kernel: this agent was built without the eBPF object (cargo xtask build-ebpf --release)\n";
    assert_eq!(
        kernel_reason(r),
        "this agent was built without the eBPF object (cargo xtask build-ebpf --release)"
    );
    assert!(kernel_reason("HTTP/1.1 503 x").contains("no reason"));
}

#[test]
fn the_fast_share_counts_pod_traffic_only() {
    let c =
        |v: &[(&str, u64)]| -> Counters { v.iter().map(|(k, n)| (k.to_string(), *n)).collect() };
    let before = c(&[("fast_encap", 100), ("kernel_underlay_other", 5)]);
    let after = c(&[
        ("fast_encap", 190),
        ("fast_tc_decap", 0),
        ("fast_vxlan_mtu", 10),
        ("kernel_tcp_control", 20),
        ("kernel_underlay_other", 500),
        ("some_future_path", 10),
    ]);
    let s = PathShare::between(&before, &after);
    // 90 + 10 fast, 20 + 10 kernel; the underlay's own traffic left out.
    assert_eq!((s.pod, s.fast, s.crossed_vxlan), (130, 100, 10));
    assert_eq!(s.kernel.len(), 2);
    assert_eq!(s.fast_pct().map(|p| (p * 10.0).round()), Some(769.0));
    assert_eq!(s.crossed_pct(), Some(10.0));
    let d = s.describe();
    assert!(d.starts_with("76.9% fast of 130 pod packets, 10.0% of those through vxlan.1; kernel: kernel_tcp_control 20"), "{d}");
    assert_eq!(
        PathShare::default().describe(),
        "the programs saw no pod packets"
    );
    assert_eq!(
        NodeDatapath::Kernel("--datapath kernel".into()).to_string(),
        "kernel (--datapath kernel)"
    );
}

#[test]
fn peer_routes_tell_direct_from_vxlan() {
    let routes = "10.244.2.0/24 via 10.244.2.0 dev vxlan.1 onlink \n\
                  10.244.3.0/24 via 192.168.77.13 dev eth0 \n";
    let r = PeerRoutes::parse(routes);
    assert_eq!(r, peer_routes(1, 1, 0));
    assert_eq!(PeerRoutes::parse(""), PeerRoutes::default());
    let all_direct = peer_routes(2, 0, 0);
    assert_eq!(
        describe_node(&NodeDatapath::EbpfTcEncap, &all_direct),
        "ebpf, direct routing to 2 peers (no VXLAN)"
    );
    assert_eq!(
        describe_node(&NodeDatapath::EbpfTcEncap, &r),
        "ebpf, direct routing to 1 peer, tc encap to 1"
    );
    assert_eq!(
        describe_node(&NodeDatapath::Kernel("--datapath kernel".into()), &r),
        "kernel (--datapath kernel), direct routing to 1 peer, via vxlan.1 to 1"
    );
    let overlay = peer_routes(0, 2, 0);
    assert_eq!(
        describe_node(&NodeDatapath::EbpfTcEncap, &overlay),
        "ebpf with tc encap"
    );
    // Direct routing leaves the IPv6 podCIDRs on the overlay.
    let v6 = peer_routes(0, 2, 0);
    assert_eq!(
        describe_ipv6_overlay(&NodeDatapath::EbpfTcEncap, &all_direct, &v6),
        "; IPv6 to 2 over the overlay (tc encap)"
    );
    assert_eq!(
        describe_ipv6_overlay(&NodeDatapath::EbpfTcEncap, &overlay, &v6),
        ""
    );
    assert_eq!(
        describe_ipv6_overlay(
            &NodeDatapath::EbpfTcEncap,
            &all_direct,
            &PeerRoutes::default()
        ),
        ""
    );
}

#[test]
fn an_ipv6_only_node_reaches_its_peers_through_vxlan6() {
    let routes6 = "fd00:10:244:2::/64 via fd00:77::12 dev vxlan6.1 proto 110 onlink \n\
                   fd00:10:244:3::/64 nhid 12 via fd00:77::13 dev vxlan6.1 proto 110 onlink \n";
    let r6 = PeerRoutes::parse(routes6);
    assert_eq!(r6, peer_routes(0, 0, 2));
    let none = PeerRoutes::default();
    assert_eq!(
        describe_node_routes(&NodeDatapath::EbpfTcEncap, &none, &r6),
        "ebpf, 2 peers through vxlan6.1 over the IPv6 underlay"
    );
    assert_eq!(
        describe_node_routes(&NodeDatapath::EbpfVxlan, &none, &r6),
        "ebpf, 2 peers through vxlan6.1 over the IPv6 underlay"
    );
    assert_eq!(
        describe_node_routes(
            &NodeDatapath::Kernel("--datapath kernel".into()),
            &none,
            &PeerRoutes::parse(routes6.lines().next().unwrap_or_default())
        ),
        "kernel (--datapath kernel), 1 peer through vxlan6.1 over the IPv6 underlay"
    );
    // A dual-stack node keeps its summary, and names a peer it reaches
    // over the IPv6 underlay alone.
    let dual = peer_routes(0, 2, 0);
    assert_eq!(
        describe_node_routes(&NodeDatapath::EbpfTcEncap, &dual, &dual),
        "ebpf with tc encap"
    );
    let one6 = peer_routes(0, 1, 1);
    assert_eq!(
        describe_node_routes(&NodeDatapath::EbpfTcEncap, &dual, &one6),
        "ebpf with tc encap; IPv6 to 1 peer through vxlan6.1 over the IPv6 underlay"
    );
}

#[test]
fn an_ipv6_only_share_names_its_fast_paths() {
    let c =
        |v: &[(&str, u64)]| -> Counters { v.iter().map(|(k, n)| (k.to_string(), *n)).collect() };
    let after = c(&[("fast_local", 300), ("kernel_unknown_dest", 700)]);
    let s = PathShare::between(&Counters::new(), &after);
    assert_eq!(
        s.describe_by_path(),
        "30.0% fast of 1000 pod packets (fast_local 300); kernel: kernel_unknown_dest 700"
    );
    // The line of a node with vxlan.1 is as it was.
    assert_eq!(
        s.describe(),
        "30.0% fast of 1000 pod packets, 0.0% of those through vxlan.1; kernel: \
         kernel_unknown_dest 700"
    );
    // What did cross vxlan.1 is named all the same.
    let crossed = PathShare::between(
        &Counters::new(),
        &c(&[("fast_local", 300), ("fast_decap", 100)]),
    );
    assert_eq!(
        crossed.describe_by_path(),
        "100.0% fast of 400 pod packets (fast_local 300, fast_decap 100), 25.0% of those \
         through vxlan.1"
    );
    let mut sum = s.clone();
    sum.add(&crossed);
    assert_eq!(
        (sum.fast_paths["fast_local"], sum.fast_paths["fast_decap"]),
        (600, 100)
    );
}
