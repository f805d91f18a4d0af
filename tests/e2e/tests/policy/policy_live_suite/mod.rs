//! NetworkPolicy on live connections and from a pod's first packet, on a
//! model lab (x/a on node 1, x/b on node 2, both serving TCP and UDP
//! echoes on 80 and 81), shared by the eBPF (`policy_live.rs`) and kernel
//! (`policy_live_kernel.rs`) datapaths:
//!
//! 1. a TCP stream and a UDP flow a -> b, on the fast path where there is
//!    one, stop within 1 s of their allow's removal while a stream of the
//!    same pods on a port still allowed keeps going;
//! 2. relabelling a out of the policy cuts that stream too;
//! 3. a SYN reusing the 5-tuple of a connection whose conntrack entry is
//!    still ESTABLISHED on both nodes never reaches b after the deny;
//! 4. a pod created after a default deny sends nothing it may not from its
//!    first packet, and reaches what it may within 100 ms of its ADD on
//!    its own node (and on another node once its status.podIPs is out).

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::networking::v1::NetworkPolicySpec;
use mycni_apiserver::{ApiServer as Api, network_policy, pod, pod_status};
use mycni_lab::{Lab, Pod};
use mycni_testkit::{NetNs, in_netns};
use serde_json::{Value, json};

use crate::common::{self, ns_sh};

/// How long a round trip may take before it counts as cut: the lab's RTT
/// is well under a millisecond, so 200 ms is a lost packet, not a slow one.
const ROUND_TRIP: Duration = Duration::from_millis(200);

pub fn run(tag: &str, datapath: &str) -> Result<()> {
    let t = common::model_lab(tag, &["--datapath", datapath])?;
    let l = &t.0;
    let fast = datapath == "ebpf";
    l.check_datapath(datapath)?;
    let api = l.api.as_ref().context("the model lab's API fixture")?;
    let [a, b, ya] = l.pods_named(["x/a", "x/b", "y/a"])?;
    ensure!(a.node != b.node, "x/a and x/b on one node: {a:?} {b:?}");
    live_flows(l, api, fast, &a, &b)?;
    relabelled_peer(api, &a, &b)?;
    reused_syn(l, api, &a, &b)?;
    api.delete_network_policy("x", "b-from-a")?;
    new_pod(l, api, &a, &b, &ya)
}

fn spec(v: Value) -> Result<NetworkPolicySpec> {
    Ok(serde_json::from_value(v)?)
}

/// b's ingress from pods labelled `from` on `ports` (API port objects).
fn b_from(from: &str, ports: Value) -> Result<NetworkPolicySpec> {
    spec(json!({
        "podSelector": {"matchLabels": {"pod": "b"}},
        "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": from}}}], "ports": ports}]
    }))
}

fn tcp_stream(ns: &str, to: SocketAddr) -> Result<TcpStream> {
    let s = in_netns(ns, || {
        TcpStream::connect_timeout(&to, Duration::from_secs(1))
    })??;
    s.set_read_timeout(Some(ROUND_TRIP))?;
    Ok(s)
}

fn udp_flow(ns: &str, to: SocketAddr) -> Result<UdpSocket> {
    let s = in_netns(ns, || -> std::io::Result<UdpSocket> {
        let s = UdpSocket::bind(("0.0.0.0", 0))?;
        s.connect(to)?;
        Ok(s)
    })??;
    s.set_read_timeout(Some(ROUND_TRIP))?;
    Ok(s)
}

fn tcp_ok(s: &mut TcpStream) -> bool {
    let mut back = [0u8; 4];
    s.write_all(b"ping").is_ok() && s.read_exact(&mut back).is_ok() && &back == b"ping"
}

fn udp_ok(s: &UdpSocket) -> bool {
    let mut back = [0u8; 16];
    s.send(b"ping").is_ok() && s.recv(&mut back).is_ok_and(|n| &back[..n] == b"ping")
}

/// A connection within 250 ms (a dropped SYN is only retried after 1 s).
fn reachable(ns: &str, to: SocketAddr) -> Result<bool> {
    in_netns(ns, || {
        TcpStream::connect_timeout(&to, Duration::from_millis(250)).is_ok()
    })
}

fn settles(ns: &str, to: SocketAddr, want: bool) -> Result<Duration> {
    common::wait_until(
        &format!("{ns} -> {to} reachable={want}"),
        Duration::from_secs(3),
        || reachable(ns, to).map(|r| r == want),
    )
}

/// Sends round trips on `ok` every 20 ms from `since` until one fails;
/// how long after `since` the failing one was sent. Fails the test if
/// none fails within `limit`.
fn cut_after(
    what: &str,
    since: Instant,
    limit: Duration,
    mut ok: impl FnMut() -> bool,
) -> Result<Duration> {
    loop {
        let sent = since.elapsed();
        if !ok() {
            return Ok(sent);
        }
        ensure!(sent < limit, "{what} still flows {sent:?} after the change");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Packets node `i` counted under the datapath paths `paths`, both
/// families.
fn paths(l: &Lab, i: usize, paths: &[&str]) -> Result<u64> {
    let c = l.counters(i)?;
    Ok(paths.iter().map(|p| c.get(*p).copied().unwrap_or(0)).sum())
}

/// 1: two flows cut, a third of the same pods untouched.
fn live_flows(l: &Lab, api: &Api, fast: bool, a: &Pod, b: &Pod) -> Result<()> {
    api.create_network_policy(network_policy(
        "x",
        "b-from-a",
        b_from(
            "a",
            json!([{"port": 80, "protocol": "TCP"}, {"port": 80, "protocol": "UDP"},
                   {"port": 81, "protocol": "TCP"}]),
        )?,
    ))?;
    let (b80, b81) = (SocketAddr::from((b.ip, 80)), SocketAddr::from((b.ip, 81)));
    settles(&a.ns, b80, true).context("a -> b:80 under the allow")?;
    let mut s80 = tcp_stream(&a.ns, b80)?;
    let u80 = udp_flow(&a.ns, b80)?;
    let mut s81 = tcp_stream(&a.ns, b81)?;
    let fast_paths = ["fast_encap", "fast_direct", "fast_vxlan_encap"];
    let fast_in = ["fast_tc_decap", "fast_decap", "fast_direct_in"];
    let before = (paths(l, a.node, &fast_paths)?, paths(l, b.node, &fast_in)?);
    for _ in 0..30 {
        ensure!(tcp_ok(&mut s80), "tcp 80 stalled under the allow");
        ensure!(udp_ok(&u80), "udp 80 stalled under the allow");
        ensure!(tcp_ok(&mut s81), "tcp 81 stalled under the allow");
    }
    let after = (paths(l, a.node, &fast_paths)?, paths(l, b.node, &fast_in)?);
    if fast {
        // 90 round trips, each a request out of node a and in at node b.
        ensure!(
            after.0 - before.0 >= 60 && after.1 - before.1 >= 60,
            "the flows did not ride the fast path: out {:?} in {:?}",
            (before.0, after.0),
            (before.1, after.1)
        );
    }
    let stale_before = paths(l, b.node, &["kernel_policy_stale"])?;

    api.update_network_policy("x", "b-from-a", |np| {
        np.spec = b_from("a", json!([{"port": 81, "protocol": "TCP"}])).ok();
    })?;
    let change = Instant::now();
    let limit = Duration::from_secs(1);
    // Both watched at once: a failed round trip waits out its timeout.
    let udp =
        std::thread::spawn(move || cut_after("the UDP flow on 80", change, limit, || udp_ok(&u80)));
    let tcp_cut = cut_after("the TCP stream on 80", change, limit, || tcp_ok(&mut s80))?;
    let udp_cut = udp
        .join()
        .map_err(|_| anyhow::anyhow!("the UDP watcher panicked"))??;
    for _ in 0..20 {
        ensure!(tcp_ok(&mut s81), "the stream on 81, still allowed, stalled");
        std::thread::sleep(Duration::from_millis(10));
    }
    ensure!(
        !reachable(&a.ns, b80)?,
        "a new connection to 80 after the deny"
    );
    if fast {
        let stale = paths(l, b.node, &["kernel_policy_stale"])? - stale_before;
        ensure!(stale > 0, "no packet of b's node sent back as stale");
    }
    eprintln!("live flows cut after: tcp {tcp_cut:?}, udp {udp_cut:?}; tcp 81 kept going");
    Ok(())
}

/// 2: the allow's peer relabelled out.
fn relabelled_peer(api: &Api, a: &Pod, b: &Pod) -> Result<()> {
    let b81 = SocketAddr::from((b.ip, 81));
    let mut s81 = tcp_stream(&a.ns, b81)?;
    ensure!(tcp_ok(&mut s81), "a -> b:81 before the relabel");
    let relabel = |v: &str| {
        api.update_pod("x", "a", |p| {
            p.metadata
                .labels
                .get_or_insert_default()
                .insert("pod".into(), v.into());
        })
    };
    relabel("a-out")?;
    let cut = cut_after(
        "a's stream after a left the peer set",
        Instant::now(),
        Duration::from_secs(1),
        || tcp_ok(&mut s81),
    )?;
    relabel("a")?;
    let back = settles(&a.ns, b81, true)?;
    eprintln!("relabelled peer: cut after {cut:?}, allowed again after {back:?}");
    Ok(())
}

/// `SO_LINGER` 0: close sends a RST and leaves no TIME_WAIT behind.
fn abort(s: TcpStream) -> Result<()> {
    let lg = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket and a linger of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&lg as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    ensure!(rc == 0, "SO_LINGER: {}", std::io::Error::last_os_error());
    drop(s);
    Ok(())
}

/// A TCP connection from `sport` (bound with SO_REUSEADDR).
fn connect_from(
    ns: &str,
    sport: u16,
    to: SocketAddr,
    timeout: Duration,
) -> Result<std::io::Result<TcpStream>> {
    in_netns(ns, || -> std::io::Result<TcpStream> {
        // SAFETY: plain socket calls on a descriptor this closure owns.
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let s: TcpStream = std::os::fd::FromRawFd::from_raw_fd(fd);
            let one: libc::c_int = 1;
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_REUSEADDR,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
            let sa = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: sport.to_be(),
                sin_addr: libc::in_addr { s_addr: 0 },
                sin_zero: [0; 8],
            };
            if libc::bind(
                fd,
                (&sa as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            // connect with a timeout: non-blocking connect, then poll.
            s.set_nonblocking(true)?;
            let IpAddr::V4(ip) = to.ip() else {
                return Err(std::io::Error::other("IPv4 only"));
            };
            let da = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: to.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(ip).to_be(),
                },
                sin_zero: [0; 8],
            };
            let rc = libc::connect(
                fd,
                (&da as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            );
            if rc != 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINPROGRESS)
            {
                return Err(std::io::Error::last_os_error());
            }
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLOUT,
                revents: 0,
            };
            if libc::poll(&mut p, 1, timeout.as_millis() as libc::c_int) != 1 {
                return Err(std::io::Error::from(std::io::ErrorKind::TimedOut));
            }
            if let Some(e) = s.take_error()? {
                return Err(e);
            }
            s.set_nonblocking(false)?;
            Ok(s)
        }
    })
}

/// The IPv4 conntrack entries of node `i` that mention `needle`.
fn conntrack(l: &Lab, i: usize, needle: &str) -> Result<Vec<String>> {
    let all = ns_sh(&l.spec.node_name(i), "cat", &["/proc/net/nf_conntrack"])?;
    Ok(all
        .lines()
        .filter(|x| x.contains(needle))
        .map(str::to_string)
        .collect())
}

/// Packets counted by the named counter `name` of the test's own table
/// `inet mycni_t` in the netns `ns`.
fn counted(ns: &str, name: &str) -> Result<u64> {
    let out = ns_sh(ns, "nft", &["list", "counter", "inet", "mycni_t", name])?;
    out.split_whitespace()
        .skip_while(|w| *w != "packets")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("no packets in {out}"))
}

/// 3: a SYN on a live conntrack entry's 5-tuple after the deny.
fn reused_syn(l: &Lab, api: &Api, a: &Pod, b: &Pod) -> Result<()> {
    let b81 = SocketAddr::from((b.ip, 81));
    let sport = 40_781;
    // a's end forgets the connection without telling anyone: its RST and
    // FIN never leave a's netns, so both nodes keep the entry ESTABLISHED.
    let script = format!(
        "add table inet mycni_t\n\
         add chain inet mycni_t out {{ type filter hook output priority 0; }}\n\
         add rule inet mycni_t out ip daddr {} tcp dport 81 tcp flags & (fin | rst) != 0 drop\n",
        b.ip
    );
    nft_script(&a.ns, &script)?;
    let mut c = connect_from(&a.ns, sport, b81, Duration::from_secs(1))?
        .context("a -> b:81 from the chosen port before the deny")?;
    c.set_read_timeout(Some(ROUND_TRIP))?;
    ensure!(tcp_ok(&mut c), "round trip before the deny");
    abort(c)?;
    nft_script(
        &b.ns,
        &format!(
            "add table inet mycni_t\n\
             add counter inet mycni_t syn\n\
             add chain inet mycni_t in {{ type filter hook input priority 0; }}\n\
             add rule inet mycni_t in tcp sport {sport} tcp flags & (syn | ack) == syn counter name syn\n"
        ),
    )?;
    api.update_network_policy("x", "b-from-a", |np| {
        np.spec = b_from("nobody", json!([{"port": 81, "protocol": "TCP"}])).ok();
    })?;
    settles(&a.ns, b81, false).context("a -> b:81 denied")?;
    let tuple = format!("sport={sport} dport=81");
    for i in [a.node, b.node] {
        let entries = conntrack(l, i, &tuple)?;
        ensure!(
            entries.iter().any(|e| e.contains("ESTABLISHED")),
            "node {i} holds no ESTABLISHED entry for {tuple}: {entries:?}"
        );
    }
    let again = connect_from(&a.ns, sport, b81, Duration::from_millis(1500))?;
    ensure!(
        again.is_err(),
        "a SYN on the old 5-tuple connected after the deny"
    );
    let arrived = counted(&b.ns, "syn")?;
    ensure!(
        arrived == 0,
        "{arrived} SYNs on the old 5-tuple reached b after the deny"
    );
    for ns in [&a.ns, &b.ns] {
        nft_script(ns, "delete table inet mycni_t\n")?;
    }
    eprintln!("reused SYN: dropped, conntrack still ESTABLISHED on both nodes");
    Ok(())
}

fn nft_script(ns: &str, script: &str) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let f = dir.path().join("rules.nft");
    std::fs::write(&f, script)?;
    ns_sh(ns, "nft", &["-f", &f.to_string_lossy()])?;
    Ok(())
}

/// 4: a pod made after a default deny.
fn new_pod(l: &Lab, api: &Api, a: &Pod, b: &Pod, ya: &Pod) -> Result<()> {
    let egress = spec(json!({
        "podSelector": {"matchLabels": {"pod": "n"}},
        "policyTypes": ["Egress"],
        "egress": [{"to": [{"podSelector": {"matchExpressions":
                      [{"key": "pod", "operator": "In", "values": ["a", "b"]}]}}],
                    "ports": [{"port": 80, "protocol": "TCP"}]}]
    }))?;
    let ingress = spec(json!({
        "podSelector": {"matchExpressions": [{"key": "pod", "operator": "In", "values": ["a", "b"]}]},
        "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "n"}}}],
                     "ports": [{"port": 80, "protocol": "TCP"}]}]
    }))?;
    let deny = spec(json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}))?;
    api.create_network_policy(network_policy("x", "deny-all", deny))?;
    api.create_network_policy(network_policy("x", "n-egress", egress))?;
    api.create_network_policy(network_policy("x", "ab-from-n", ingress))?;
    let a80 = SocketAddr::from((a.ip, 80));
    settles(&b.ns, a80, false).context("x under the default deny")?;

    // Whatever of node a's pods sends y/a UDP to 80 in this step is x/n.
    nft_script(
        &ya.ns,
        &format!(
            "add table inet mycni_t\n\
             add counter inet mycni_t heard\n\
             add chain inet mycni_t in {{ type filter hook prerouting priority -300; }}\n\
             add rule inet mycni_t in ip saddr {} udp dport 80 counter name heard\n",
            mycni_lab::pod_cidr(a.node)
        ),
    )?;
    // The kubelet's order: the object (the scheduler's), the sandbox (ADD),
    // the status. The pod's processes start after the ADD, so its first
    // packet is sent right after the ADD returns.
    let node = l.spec.node_name(a.node);
    api.create_pod(pod("x", "n", &[("pod", "n")], Some(&node)))?;
    let ns = NetNs::new("np-new")?;
    let cid = "policy-live-new";
    let add = l.cni(
        a.node,
        "ADD",
        mycni_lab::Sandbox::new(cid, &ns.path().to_string_lossy(), "x/n"),
    );
    let added = Instant::now();
    let result = add.context("ADD of x/n")?;
    let ip = result["ips"][0]["address"]
        .as_str()
        .and_then(|s| s.split('/').next())
        .context("x/n's address")?
        .to_string();
    let new = NewPod {
        ns: ns.name(),
        ip: &ip,
        added,
    };
    let outcome = first_packets(api, &new, &Heard { a, b, ya });
    let del = l.cni(
        a.node,
        "DEL",
        mycni_lab::Sandbox::new(cid, &ns.path().to_string_lossy(), "x/n"),
    );
    let _ = api.delete_pod("x", "n");
    for name in ["deny-all", "n-egress", "ab-from-n"] {
        let _ = api.delete_network_policy("x", name);
    }
    nft_script(&ya.ns, "delete table inet mycni_t\n")?;
    outcome?;
    del.map(|_| ())
}

/// x/n, just added: its netns, its address, when its ADD returned.
struct NewPod<'a> {
    ns: &'a str,
    ip: &'a str,
    added: Instant,
}

/// Who x/n's first packets go to: a (its own node) and b (the other)
/// must hear them, y/a (the stranger) must not.
struct Heard<'a> {
    a: &'a Pod,
    b: &'a Pod,
    ya: &'a Pod,
}

/// The new pod's first second: a stranger (y/a, unisolated, not allowed
/// by n's egress) hears a UDP datagram from it every millisecond, and
/// connections to a (same node) and b (other node) are tried until they
/// work. y/a must count none of them.
fn first_packets(api: &Api, new: &NewPod, heard: &Heard) -> Result<()> {
    let NewPod { ns, ip, added } = *new;
    let Heard { a, b, ya } = *heard;
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let to_ya = SocketAddr::from((ya.ip, 80));
    let sender = {
        let (ns, stop, sent) = (ns.to_string(), stop.clone(), sent.clone());
        std::thread::spawn(move || {
            in_netns(&ns, || -> Result<()> {
                let s = UdpSocket::bind(("0.0.0.0", 0))?;
                while !stop.load(Ordering::Relaxed) {
                    if s.send_to(b"stranger", to_ya).is_ok() {
                        sent.fetch_add(1, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Ok(())
            })?
        })
    };
    let reach = |to: SocketAddr| -> Result<Duration> {
        loop {
            let ok = in_netns(ns, || {
                TcpStream::connect_timeout(&to, Duration::from_millis(20)).is_ok()
            })?;
            if ok {
                return Ok(added.elapsed());
            }
            if added.elapsed() > Duration::from_secs(3) {
                bail!("x/n never reached {to}");
            }
        }
    };
    let own_node = reach(SocketAddr::from((a.ip, 80)));
    // The other node learns n's address from its status.
    api.set_pod_status("x", "n", pod_status(&[ip], None))?;
    let other_node = reach(SocketAddr::from((b.ip, 80)));
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    let _ = sender.join();
    let (own_node, other_node) = (own_node?, other_node?);
    let stranger = counted(&ya.ns, "heard")?;
    eprintln!(
        "new pod: {} datagrams to a stranger, {stranger} arrived; a (own node) after {own_node:?}, \
         b (node {}) after {other_node:?}",
        sent.load(Ordering::Relaxed),
        b.node
    );
    ensure!(stranger == 0, "{stranger} datagrams of x/n reached y/a");
    ensure!(
        sent.load(Ordering::Relaxed) > 100,
        "the stranger test sent too little"
    );
    ensure!(
        own_node <= Duration::from_millis(100),
        "x/n reached a on its own node only {own_node:?} after the ADD"
    );
    Ok(())
}
