//! The policy table (`inet mycni_policy`) on the real kernel, without an
//! agent: a node namespace routing between three pod namespaces, a
//! kube-proxy-like DNAT per pod, and the table written from the room's
//! own desired state (`policy::sets`, `policy::nft`), first whole and then
//! by set members only, case after case. Every pair is probed by pod IP
//! and through its Service on TCP and UDP, IPv4 and IPv6, and compared
//! with the reference evaluator (`cluster::allowed`).

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use mycni_agent::cluster::{
    Cluster, ContainerPort, Endpoint, Key, Namespace, Pod, Protocol, allowed, policy_from_k8s,
};
use mycni_agent::policy::compile_node;
use mycni_agent::policy::counters::parse_counters;
use mycni_agent::policy::nft::{diff_script, full_script};
use mycni_agent::policy::sets::{Desired, desired};
use mycni_testkit::NetNs;
use serde_json::{Value, json};

const NODE: &str = "n1";

/// (namespace, name, spec) of a NetworkPolicy.
type PolicySpec<'a> = (&'a str, &'a str, Value);
const PORTS: [u16; 2] = [80, 81];

struct TestPod {
    key: Key,
    ns: NetNs,
    ip4: IpAddr,
    ip6: IpAddr,
    vip4: IpAddr,
    vip6: IpAddr,
}

struct Node {
    ns: NetNs,
    pods: Vec<TestPod>,
}

fn sh_in(ns: &NetNs, cmd: &str) -> Result<String> {
    let args: Vec<&str> = cmd.split_whitespace().collect();
    ns.exec(args[0], &args[1..])
        .with_context(|| format!("in {}: {cmd}", ns.name()))
}

fn nft_in(ns: &NetNs, script: &str) -> Result<()> {
    let mut child = std::process::Command::new("ip")
        .args(["netns", "exec", ns.name(), "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(script.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "nft: {}\n{script}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Pods (namespace, name, labels) on one node, each in its own subnet so
/// that every pair crosses the node's forward hook.
fn node(pods: &[(&str, &str)]) -> Result<Node> {
    let node = NetNs::new("pnode")?;
    sh_in(&node, "sysctl -qw net.ipv4.ip_forward=1")?;
    sh_in(&node, "sysctl -qw net.ipv6.conf.all.forwarding=1")?;
    let mut out = Vec::new();
    let mut dnat = String::from(
        "table inet svc {\n chain pre { type nat hook prerouting priority -100; }\n chain out { type nat hook output priority -100; }\n}\n",
    );
    for (k, (ns, name)) in pods.iter().enumerate() {
        let k = k + 1;
        let pod = NetNs::new("ppod")?;
        // The plugin's prefix: fail-closed rules match pod veths by it.
        let veth = format!("mycnipv{k}");
        sh_in(
            &node,
            &format!(
                "ip link add {veth} type veth peer name eth0 netns {}",
                pod.name()
            ),
        )?;
        sh_in(&node, &format!("ip addr add 10.9.{k}.1/24 dev {veth}"))?;
        sh_in(
            &node,
            &format!("ip -6 addr add fd09:{k}::1/64 dev {veth} nodad"),
        )?;
        sh_in(&node, &format!("ip link set {veth} up"))?;
        sh_in(&pod, &format!("ip addr add 10.9.{k}.2/24 dev eth0"))?;
        sh_in(
            &pod,
            &format!("ip -6 addr add fd09:{k}::2/64 dev eth0 nodad"),
        )?;
        // No DAD anywhere: a tentative address sends nothing for a second.
        sh_in(&pod, "sysctl -qw net.ipv6.conf.eth0.accept_dad=0")?;
        sh_in(
            &node,
            &format!("sysctl -qw net.ipv6.conf.{veth}.accept_dad=0"),
        )?;
        sh_in(&pod, "ip link set eth0 up")?;
        sh_in(&pod, &format!("ip route add default via 10.9.{k}.1"))?;
        sh_in(&pod, &format!("ip -6 route add default via fd09:{k}::1"))?;
        let t = TestPod {
            key: Key::new(*ns, *name),
            ns: pod,
            ip4: format!("10.9.{k}.2").parse()?,
            ip6: format!("fd09:{k}::2").parse()?,
            vip4: format!("10.96.0.{k}").parse()?,
            vip6: format!("fd96::{k}").parse()?,
        };
        for chain in ["pre", "out"] {
            dnat.push_str(&format!(
                "add rule inet svc {chain} ip daddr {} dnat ip to {}\nadd rule inet svc {chain} ip6 daddr {} dnat ip6 to {}\n",
                t.vip4, t.ip4, t.vip6, t.ip6
            ));
        }
        out.push(t);
    }
    nft_in(&node, &dnat)?;
    // The pods' default routes send Service addresses to the node.
    Ok(Node {
        ns: node,
        pods: out,
    })
}

/// TCP accept-and-close and UDP echo on 80 and 81, both families.
fn serve(pod: &TestPod) -> Result<()> {
    for port in PORTS {
        let (tcp, udp) = pod.ns.run_in(|| {
            let tcp = TcpListener::bind(SocketAddr::from(([0u16; 8], port)));
            let udp = UdpSocket::bind(SocketAddr::from(([0u16; 8], port)));
            (tcp, udp)
        })?;
        let (tcp, udp) = (tcp?, udp?);
        std::thread::spawn(move || {
            for c in tcp.incoming().flatten() {
                let mut c = c;
                let _ = c.write_all(b"k");
            }
        });
        std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            while let Ok((n, from)) = udp.recv_from(&mut buf) {
                let _ = udp.send_to(&buf[..n], from);
            }
        });
    }
    Ok(())
}

fn probe(from: &TestPod, to: IpAddr, proto: Protocol, port: u16) -> Result<bool> {
    let addr = SocketAddr::new(to, port);
    let t = Duration::from_millis(400);
    from.ns.run_in(move || match proto {
        Protocol::Tcp => TcpStream::connect_timeout(&addr, t)
            .and_then(|mut s| {
                s.set_read_timeout(Some(t))?;
                let mut b = [0u8; 1];
                s.read_exact(&mut b)
            })
            .is_ok(),
        _ => {
            let bind: SocketAddr = if to.is_ipv6() {
                (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
            } else {
                (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
            };
            let Ok(s) = UdpSocket::bind(bind) else {
                return false;
            };
            let _ = s.set_read_timeout(Some(t));
            let mut b = [0u8; 8];
            s.send_to(b"ping", addr).is_ok() && s.recv_from(&mut b).is_ok()
        }
    })
}

fn cluster(node: &Node, labels: &[&[(&str, &str)]], policies: &[(&str, &str, Value)]) -> Cluster {
    let mut c = Cluster::default();
    for ns in ["x", "y"] {
        c.add_namespace(Namespace {
            name: ns.into(),
            labels: [("ns", ns), ("kubernetes.io/metadata.name", ns)]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        });
    }
    for (p, l) in node.pods.iter().zip(labels) {
        c.add_pod(Pod {
            key: p.key.clone(),
            labels: l
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ips: vec![p.ip4, p.ip6],
            ports: PORTS
                .iter()
                .flat_map(|port| {
                    [Protocol::Tcp, Protocol::Udp].map(|proto| ContainerPort {
                        name: Some(format!(
                            "serve-{port}-{}",
                            if proto == Protocol::Tcp { "tcp" } else { "udp" }
                        )),
                        protocol: proto,
                        port: *port,
                    })
                })
                .collect(),
            host_network: false,
            node: Some(NODE.into()),
        });
    }
    for (ns, name, spec) in policies {
        let np: k8s_openapi::api::networking::v1::NetworkPolicy = serde_json::from_value(json!({
            "metadata": {"namespace": ns, "name": name}, "spec": spec
        }))
        .expect("a NetworkPolicy");
        let p = policy_from_k8s(&np).expect("valid policy");
        assert!(p.dropped.is_empty(), "{:?}", p.dropped);
        c.add_policy(p.value);
    }
    c
}

/// Every ordered pair of distinct pods, by IP and by Service, TCP and UDP,
/// 80 and 81, both families, against the evaluator: the cells that differ.
/// Probed all at once: a denied probe costs its whole timeout.
fn mismatches(node: &Node, c: &Cluster) -> Result<Vec<String>> {
    let mut cells = Vec::new();
    for src in &node.pods {
        for dst in &node.pods {
            if src.key == dst.key {
                continue;
            }
            for (dst_ip, vip, src_ip) in
                [(dst.ip4, dst.vip4, src.ip4), (dst.ip6, dst.vip6, src.ip6)]
            {
                for proto in [Protocol::Tcp, Protocol::Udp] {
                    for port in PORTS {
                        let want = allowed(
                            c,
                            &Endpoint::Pod {
                                pod: src.key.clone(),
                                ip: src_ip,
                            },
                            &Endpoint::Pod {
                                pod: dst.key.clone(),
                                ip: dst_ip,
                            },
                            proto,
                            port,
                        )
                        .is_allowed();
                        for (how, to) in [("ip", dst_ip), ("svc", vip)] {
                            cells.push((src, dst, how, to, proto, port, want));
                        }
                    }
                }
            }
        }
    }
    let results: Vec<Result<bool>> = std::thread::scope(|s| {
        let handles: Vec<_> = cells
            .iter()
            .map(|(src, _, _, to, proto, port, _)| s.spawn(move || probe(src, *to, *proto, *port)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("probe panicked")))
            })
            .collect()
    });
    let mut bad = Vec::new();
    for ((src, dst, how, to, proto, port, want), got) in cells.iter().zip(results) {
        let got = got?;
        if got != *want {
            bad.push(format!(
                "{} -> {} {how} {to} {proto:?}/{port}: got {got}, want {want}",
                src.key, dst.key
            ));
        }
    }
    Ok(bad)
}

#[test]
fn the_table_enforces_the_evaluators_verdicts_by_ip_and_service() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let node = node(&[("x", "a"), ("x", "b"), ("y", "c")])?;
    for p in &node.pods {
        serve(p)?;
    }
    let labels: [&[(&str, &str)]; 3] = [&[("pod", "a")], &[("pod", "b")], &[("pod", "c")]];
    let a = json!({"matchLabels": {"pod": "a"}});
    let cases: Vec<(&str, Vec<PolicySpec>)> = vec![
        ("open", vec![]),
        (
            "deny ingress x",
            vec![("x", "deny", json!({"podSelector": {}}))],
        ),
        (
            "x/a from pod=b on TCP 80",
            vec![(
                "x",
                "a-from-b",
                json!({"podSelector": a, "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}], "ports": [{"port": 80}]}]}),
            )],
        ),
        (
            "x/a from ns=y on UDP only",
            vec![(
                "x",
                "a-udp",
                json!({"podSelector": a, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}], "ports": [{"protocol": "UDP", "port": "serve-81-udp"}]}]}),
            )],
        ),
        (
            "y/c egress deny (replies to c's clients pass)",
            vec![(
                "y",
                "c-egress",
                json!({"podSelector": {}, "policyTypes": ["Egress"]}),
            )],
        ),
        (
            "x/a egress to an ipBlock with an except",
            vec![(
                "x",
                "a-block",
                json!({"podSelector": a, "policyTypes": ["Egress"], "egress": [{"to": [{"ipBlock": {"cidr": "10.9.0.0/16", "except": ["10.9.2.0/24"]}}, {"ipBlock": {"cidr": "fd09::/16", "except": ["fd09:2::/64"]}}]}]}),
            )],
        ),
        (
            "deny all both ways in x",
            vec![(
                "x",
                "deny-all",
                json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
            )],
        ),
        ("open again", vec![]),
    ];
    let mut applied: Option<Desired> = None;
    let mut failures = Vec::new();
    for (name, policies) in &cases {
        let c = cluster(&node, &labels, policies);
        let want = desired(&compile_node(&c, NODE), !policies.is_empty());
        // The first case writes the table whole, every later one only the
        // members that changed, as the room does.
        match &applied {
            None => nft_in(&node.ns, &full_script(&want, 1))?,
            Some(old) => {
                if let Some(s) = diff_script(old, &want, 2) {
                    nft_in(&node.ns, &s)?;
                }
            }
        }
        applied = Some(want);
        let bad = mismatches(&node, &c)?;
        if !bad.is_empty() {
            failures.push(format!("{name}:\n  {}", bad.join("\n  ")));
        }
    }
    if !failures.is_empty() {
        bail!(
            "the table disagrees with the evaluator:\n{}",
            failures.join("\n")
        );
    }
    Ok(())
}

/// The node's own traffic to its pods crosses `output`, not `forward`: a
/// default deny of everything leaves it open.
#[test]
fn the_node_reaches_its_pods_under_deny_all() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let node = node(&[("x", "a")])?;
    serve(&node.pods[0])?;
    let c = cluster(
        &node,
        &[&[("pod", "a")]],
        &[(
            "x",
            "deny-all",
            json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
        )],
    );
    nft_in(
        &node.ns,
        &full_script(&desired(&compile_node(&c, NODE), true), 1),
    )?;
    let p = &node.pods[0];
    for to in [p.ip4, p.ip6] {
        let addr = SocketAddr::new(to, 80);
        let ok = node
            .ns
            .run_in(move || TcpStream::connect_timeout(&addr, Duration::from_secs(2)))?;
        if let Err(e) = ok {
            bail!(
                "the node cannot reach its pod at {addr} under deny-all: {e}\n{}",
                sh_in(&node.ns, "nft list ruleset")?
            );
        }
    }
    Ok(())
}

/// A policy change (a new epoch) judges every live connection again, so it
/// cuts one it no longer allows at its next packet (on the kernel
/// datapath; the fast path's established flows are issue 25's), and lets it
/// go on once allowed again; a connection the change still allows is
/// untouched, and judged once, not at each packet.
#[test]
fn a_live_connection_is_cut_by_a_deny_and_resumes_when_lifted() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let node = node(&[("x", "a"), ("x", "b")])?;
    let (a, b) = (&node.pods[0], &node.pods[1]);
    let labels: [&[(&str, &str)]; 2] = [&[("pod", "a")], &[("pod", "b")]];
    let open = desired(&compile_node(&cluster(&node, &labels, &[]), NODE), false);
    nft_in(&node.ns, &full_script(&open, 1))?;
    // An echo stream b -> a on 80 and one on 81, by Service.
    let echo = |port: u16| -> Result<TcpStream> {
        let l =
            a.ns.run_in(move || TcpListener::bind(SocketAddr::from(([0u16; 8], port))))??;
        std::thread::spawn(move || {
            if let Ok((mut c, _)) = l.accept() {
                let mut buf = [0u8; 64];
                while let Ok(n) = c.read(&mut buf) {
                    if n == 0 || c.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        });
        let to = SocketAddr::new(a.vip4, port);
        let s =
            b.ns.run_in(move || TcpStream::connect_timeout(&to, Duration::from_secs(1)))??;
        s.set_read_timeout(Some(Duration::from_millis(500)))?;
        Ok(s)
    };
    let round_trip = |s: &mut TcpStream| -> bool {
        let mut buf = [0u8; 4];
        s.write_all(b"ping").is_ok() && s.read_exact(&mut buf).is_ok()
    };
    let (mut s80, mut s81) = (echo(80)?, echo(81)?);
    assert!(round_trip(&mut s80) && round_trip(&mut s81), "streams up");

    // x/a now admits x/b on 81 only.
    let only_81 = desired(
        &compile_node(
            &cluster(
                &node,
                &labels,
                &[(
                    "x",
                    "a-81",
                    json!({"podSelector": {"matchLabels": {"pod": "a"}},
                       "ingress": [{"from": [{"podSelector": {}}], "ports": [{"port": 81}]}]}),
                )],
            ),
            NODE,
        ),
        true,
    );
    nft_in(
        &node.ns,
        &diff_script(&open, &only_81, 2).context("the change writes members")?,
    )?;
    assert!(
        !round_trip(&mut s80),
        "the stream on 80 went on after the deny"
    );
    assert!(
        round_trip(&mut s81),
        "the stream on 81 was cut though still allowed"
    );
    // Admitted under this epoch, the connection is not judged again (chain
    // `judged`): the rule counters, which count every packet judged, stand
    // still over 20 round trips (80 packets and their ACKs).
    let judged = || -> Result<u64> {
        let json = sh_in(&node.ns, "nft -j list counters table inet mycni_policy")?;
        Ok(parse_counters(&json)?
            .iter()
            .filter(|(name, _)| name.starts_with('r'))
            .map(|(_, (packets, _))| packets)
            .sum())
    };
    let before = judged()?;
    for _ in 0..20 {
        assert!(round_trip(&mut s81), "the stream on 81 stopped");
    }
    let after = judged()?;
    assert!(
        after - before < 5,
        "an admitted connection was judged again: {before} -> {after} packets"
    );

    nft_in(
        &node.ns,
        &diff_script(&only_81, &open, 3).context("the change writes members")?,
    )?;
    // TCP retransmits what the deny dropped: the stream resumes, in order.
    s80.set_read_timeout(Some(Duration::from_secs(3)))?;
    let mut buf = [0u8; 4];
    s80.read_exact(&mut buf)?;
    assert_eq!(&buf, b"ping");
    assert!(round_trip(&mut s80), "the stream on 80 did not resume");
    Ok(())
}

/// Once any NetworkPolicy exists, a pod whose Pod the room has not seen
/// yet is cut off both ways (it may be one a policy isolates); with none,
/// it is not. Its node still reaches it.
#[test]
fn an_unknown_pod_is_cut_off_once_policy_exists() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let node = node(&[("x", "a"), ("y", "new")])?;
    for p in &node.pods {
        serve(p)?;
    }
    let (a, new) = (&node.pods[0], &node.pods[1]);
    // The room knows only x/a.
    let mut c = cluster(&node, &[&[("pod", "a")], &[]], &[]);
    c.pods.remove(&new.key);
    let mut applied = desired(&compile_node(&c, NODE), false);
    nft_in(&node.ns, &full_script(&applied, 1))?;
    let both = |want: bool| -> Result<()> {
        for (from, to) in [(a, new.ip4), (new, a.ip4), (a, new.ip6), (new, a.ip6)] {
            let got = probe(from, to, Protocol::Tcp, 80)?;
            anyhow::ensure!(got == want, "{} -> {to}: {got}, want {want}", from.key);
        }
        Ok(())
    };
    both(true)?;
    // A policy somewhere else, selecting nobody here.
    let np: k8s_openapi::api::networking::v1::NetworkPolicy = serde_json::from_value(json!({
        "metadata": {"namespace": "z", "name": "elsewhere"},
        "spec": {"podSelector": {}}
    }))?;
    c.add_policy(policy_from_k8s(&np).context("valid")?.value);
    let closed = desired(&compile_node(&c, NODE), true);
    nft_in(
        &node.ns,
        &diff_script(&applied, &closed, 2).context("a change")?,
    )?;
    applied = closed;
    both(false)?;
    let addr = SocketAddr::new(new.ip4, 80);
    let from_node = node
        .ns
        .run_in(move || TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok())?;
    anyhow::ensure!(from_node, "the node cannot reach its unknown pod");
    // Its Pod arrives: judged (open: no policy selects it), it talks again.
    c = cluster(&node, &[&[("pod", "a")], &[("pod", "new")]], &[]);
    c.add_policy(policy_from_k8s(&np).context("valid")?.value);
    let known = desired(&compile_node(&c, NODE), true);
    nft_in(
        &node.ns,
        &diff_script(&applied, &known, 3).context("a change")?,
    )?;
    both(true)
}

/// What the table logs to NFLOG, read by the agent's own reader
/// (`flows::nflog`) in the node's namespace: a denied flow at once, its
/// repeats within the second as one record with their count (and with its
/// direction and reason), an admitted new connection of an isolated pod once, with
/// the rule's direction; a connection between pods no policy isolates,
/// nothing.
#[test]
fn the_table_logs_its_verdicts_to_nflog_once_per_flow() -> Result<()> {
    let _turn = crate::turn(module_path!());
    use mycni_agent::flows::nflog::{NflogCounts, spawn};
    use mycni_agent::flows::{NftLog, Observation, Sink};
    use mycni_agent::policy::counters::drop_counter;
    use mycni_agent::verdict::{Direction, NftVerdict, Reason};

    let node = node(&[("x", "a"), ("x", "b"), ("y", "c")])?;
    for p in &node.pods {
        serve(p)?;
    }
    let (a, b, c) = (&node.pods[0], &node.pods[1], &node.pods[2]);
    let labels: [&[(&str, &str)]; 3] = [&[("pod", "a")], &[("pod", "b")], &[("pod", "c")]];
    // x/a admits x/b on 80 and nobody else.
    let want = desired(
        &compile_node(
            &cluster(
                &node,
                &labels,
                &[(
                    "x",
                    "a-from-b-80",
                    json!({"podSelector": {"matchLabels": {"pod": "a"}},
                       "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}],
                                    "ports": [{"port": 80}]}]}),
                )],
            ),
            NODE,
        ),
        true,
    );
    nft_in(&node.ns, &full_script(&want, 1))?;
    let (sink, mut rx) = Sink::new(1024);
    let counts = std::sync::Arc::new(NflogCounts::default());
    // The socket is made (and the group bound) in the node's namespace.
    let _reader = node.ns.run_in(|| spawn(sink, counts.clone()))??;

    anyhow::ensure!(!probe(c, a.ip4, Protocol::Tcp, 80)?, "y/c reached x/a");
    anyhow::ensure!(!probe(c, a.ip4, Protocol::Tcp, 80)?, "y/c reached x/a");
    anyhow::ensure!(probe(b, a.ip4, Protocol::Tcp, 80)?, "x/b did not reach x/a");
    anyhow::ensure!(probe(c, b.ip4, Protocol::Tcp, 80)?, "y/c did not reach x/b");
    // Past the second the reader holds a flow's repeats for.
    std::thread::sleep(mycni_agent::flows::nflog::FOLD + Duration::from_millis(600));
    let mut logs = Vec::new();
    while let Ok(o) = rx.try_recv() {
        if let Observation::Nft(l) = o {
            logs.push(l);
        }
    }
    let of = |v: NftVerdict, from: &TestPod| {
        logs.iter()
            .filter(|l| l.verdict == v && l.src == from.ip4 && l.dst == a.ip4)
            .count()
    };
    let denied = NftVerdict::PolicyDrop {
        direction: Direction::Ingress,
        reason: Reason::Denied,
    };
    let admitted = NftVerdict::PolicyAllow {
        direction: Direction::Ingress,
    };
    // Two connections of y/c within a second, each a SYN: one flow (the
    // once-a-second key is addresses, protocol, port, not the source
    // port), so the first SYN at once and the second folded into a
    // record of its own once the flow's second is over: every dropped
    // packet counted once, as the table's own counter counts them.
    let drops: Vec<&NftLog> = logs
        .iter()
        .filter(|l| l.verdict == denied && l.src == c.ip4 && l.dst == a.ip4)
        .collect();
    let counted: u32 = drops.iter().map(|l| l.count).sum();
    let kernel = sh_in(&node.ns, "nft -j list counters table inet mycni_policy")?;
    let kernel = parse_counters(&kernel)?
        .get(&drop_counter(Direction::Ingress, Reason::Denied))
        .map(|(packets, _)| *packets)
        .context("no ingress denied counter")?;
    anyhow::ensure!(
        drops.len() == 2 && drops[0].count == 1 && u64::from(counted) == kernel && kernel >= 2,
        "drops logged (the table counted {kernel}): {drops:#?}"
    );
    anyhow::ensure!(of(admitted, b) == 1, "admissions logged: {logs:#?}");
    let d = logs
        .iter()
        .find(|l| l.verdict == denied)
        .context("a drop")?;
    anyhow::ensure!(
        d.proto == 6 && d.dport == 80 && d.tcp_flags & 0x02 != 0 && d.in_ifindex != 0,
        "{d:?}"
    );
    anyhow::ensure!(
        !logs.iter().any(|l| l.dst == b.ip4),
        "a connection to a pod no policy isolates was logged: {logs:#?}"
    );
    anyhow::ensure!(counts.unreadable.load(std::sync::atomic::Ordering::Relaxed) == 0);
    Ok(())
}
