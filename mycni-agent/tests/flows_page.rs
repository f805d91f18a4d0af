//! The flows page (`/flows/map`) rendered by a real headless browser
//! (Debian's Chromium, installed by `cargo xtask setup`) against the
//! agent's own HTTP server holding a few flows: namespaces, pods, edges
//! coloured by verdict and the drops with their reasons must be in the
//! DOM the page's script built. The screenshot is kept as an artifact:
//! target/tmp/flows-map.png.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use mycni_agent::cluster::{Key, Pod};
use mycni_agent::flows::enrich::{Record, What, Who};
use mycni_agent::flows::record::PolicyRef;
use mycni_agent::flows::room::{KernelNames, Served};
use mycni_agent::flows::store::Store;
use mycni_agent::metrics::Metrics;
use mycni_agent::verdict::Direction;
use mycni_agent::verdict::NftVerdict;
use mycni_agent::verdict::Reason;

const CHROMIUM: &str = "/usr/bin/chromium";

fn pod(ns: &str, name: &str) -> Who {
    Who::Pod(Arc::new(Pod {
        key: Key::new(ns, name),
        labels: [("pod".to_string(), name.to_string())].into(),
        ips: Vec::new(),
        ports: Vec::new(),
        host_network: false,
        node: Some("node-1".into()),
    }))
}

fn record(from: (&str, &str, &str), to: (&str, &str, &str), port: u16, what: What) -> Record {
    let ip = |s: &str| s.parse::<IpAddr>().expect("address");
    Record {
        at: SystemTime::now(),
        src: ip(from.2),
        dst: ip(to.2),
        sport: 40000,
        dport: port,
        proto: 6,
        tcp_flags: 0x02,
        ifindex: 0,
        count: 1,
        from: pod(from.0, from.1),
        to: pod(to.0, to.1),
        what,
    }
}

fn store() -> Arc<Store> {
    let s = Arc::new(Store::new(
        "node-1".into(),
        100,
        Arc::new(KernelNames::default()),
    ));
    let allow = What::Nft {
        verdict: NftVerdict::PolicyAllow {
            direction: Direction::Ingress,
        },
        allowed_by: Arc::new([PolicyRef {
            name: "allow-x-a-from-y".into(),
            namespace: "x".into(),
            kind: "NetworkPolicy".into(),
            rule: Some(0),
        }]),
        denied_by: Arc::new([]),
        reply: false,
    };
    let deny = What::Nft {
        verdict: NftVerdict::PolicyDrop {
            direction: Direction::Ingress,
            reason: Reason::Denied,
        },
        allowed_by: Arc::new([]),
        denied_by: Arc::new([PolicyRef {
            name: "default-deny-ingress".into(),
            namespace: "x".into(),
            kind: "NetworkPolicy".into(),
            rule: None,
        }]),
        reply: false,
    };
    let a = ("y", "a", "10.244.1.4");
    let xa = ("x", "a", "10.244.0.4");
    let xb = ("x", "b", "10.244.0.5");
    s.push(record(a, xa, 80, allow));
    s.push(record(xb, xa, 81, deny));
    s.push(record(
        xa,
        a,
        80,
        What::Datapath {
            kind: 0,
            source: None,
            reason: 15,
        },
    ));
    s
}

fn serve(metrics: Arc<Metrics>) -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        rt.block_on(async move {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            tx.send(l.local_addr().expect("addr")).expect("send");
            axum::serve(l, mycni_agent::api::router(metrics))
                .await
                .expect("serve");
        });
    });
    rx.recv_timeout(Duration::from_secs(10)).expect("server up")
}

fn chromium(profile: &Path, args: &[&str], url: &str) -> std::process::Output {
    Command::new(CHROMIUM)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=5000",
            "--window-size=1000,700",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .output()
        .expect("run chromium (install it with `cargo xtask setup`)")
}

#[test]
fn the_flows_page_renders_the_map_and_the_drops_in_chromium() {
    assert!(
        Path::new(CHROMIUM).exists(),
        "{CHROMIUM} is missing: `cargo xtask setup` installs Debian's chromium"
    );
    let metrics = Arc::new(Metrics::default());
    metrics.register_feed(Arc::new(Served(store())));
    let addr = serve(metrics);
    let url = format!("http://{addr}/flows/map");
    let profile = tempfile::tempdir().expect("profile dir");
    let out = chromium(profile.path(), &["--dump-dom"], &url);
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        dom.contains("data-rendered=\"3\""),
        "the page's script did not draw the 3 flows: {dom}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "data-namespace=\"x\"",
        "data-namespace=\"y\"",
        "data-pod=\"x/a\"",
        "data-pod=\"y/a\"",
        "class=\"edge forwarded\" d=",
        "class=\"edge dropped\" d=",
        "data-from=\"x/b\" data-to=\"x/a\" data-port=\"81/tcp\"",
        "<td class=\"reason\">POLICY_DENIED</td><td>x/default-deny-ingress</td>",
        "on node-1",
    ] {
        assert!(
            dom.contains(want),
            "no {want:?} in the rendered page: {dom}"
        );
    }
    let shot: PathBuf = Path::new(env!("CARGO_TARGET_TMPDIR")).join("flows-map.png");
    let _ = std::fs::remove_file(&shot);
    let out = chromium(
        profile.path(),
        &[&format!("--screenshot={}", shot.display())],
        &url,
    );
    let size = std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0);
    assert!(
        size > 10_000,
        "no screenshot at {} ({size} bytes): {}",
        shot.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("screenshot: {}", shot.display());
}
