//! CHECK against drift, and sandboxes of the same pod telling each other apart.

use anyhow::Result;
use mycni_testkit::NetNs;
use mycni_testkit::cni::with_prev;

use crate::{K8S_ARGS, call, netns_path, node, pod_ip};

#[test]
fn check_detects_drift() -> Result<()> {
    let node = node()?;
    let conf = node.conf("1.1.0", "10.244.6.0/24");
    let pod = NetNs::new("pod")?;
    let path = netns_path(&pod);
    let c = call("c1", &path, K8S_ARGS);
    let add = node.run("mycni", "ADD", &c, &conf)?;
    assert!(add.ok);
    let prev = with_prev(&conf, &add.json);
    let host = add.json["interfaces"][0]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    type Drift<'a> = (
        &'a str,
        Box<dyn Fn() -> Result<()> + 'a>,
        Box<dyn Fn() -> Result<()> + 'a>,
    );
    let drifts: Vec<Drift> = vec![
        (
            "neighbour",
            Box::new(|| {
                pod.exec("ip", &["neigh", "del", "169.254.1.1", "dev", "eth0"])
                    .map(drop)
            }),
            Box::new(|| {
                pod.exec(
                    "ip",
                    &[
                        "neigh",
                        "replace",
                        "169.254.1.1",
                        "dev",
                        "eth0",
                        "lladdr",
                        add.json["interfaces"][0]["mac"]
                            .as_str()
                            .unwrap_or_default(),
                        "nud",
                        "permanent",
                    ],
                )
                .map(drop)
            }),
        ),
        (
            "mtu",
            Box::new(|| {
                pod.exec("ip", &["link", "set", "eth0", "mtu", "1400"])
                    .map(drop)
            }),
            Box::new(|| {
                pod.exec("ip", &["link", "set", "eth0", "mtu", "1450"])
                    .map(drop)
            }),
        ),
        (
            "host route",
            Box::new(|| {
                node.ns
                    .exec(
                        "ip",
                        &["route", "del", &format!("{}/32", pod_ip(&add.json))],
                    )
                    .map(drop)
            }),
            Box::new(|| {
                node.ns
                    .exec(
                        "ip",
                        &[
                            "route",
                            "add",
                            &format!("{}/32", pod_ip(&add.json)),
                            "dev",
                            &host,
                            "scope",
                            "link",
                        ],
                    )
                    .map(drop)
            }),
        ),
        (
            "proxy_arp",
            Box::new(|| {
                node.ns
                    .exec(
                        "sysctl",
                        &["-qw", &format!("net.ipv4.conf.{host}.proxy_arp=0")],
                    )
                    .map(drop)
            }),
            Box::new(|| {
                node.ns
                    .exec(
                        "sysctl",
                        &["-qw", &format!("net.ipv4.conf.{host}.proxy_arp=1")],
                    )
                    .map(drop)
            }),
        ),
        (
            "default route",
            Box::new(|| pod.exec("ip", &["route", "del", "default"]).map(drop)),
            Box::new(|| {
                pod.exec(
                    "ip",
                    &[
                        "route",
                        "add",
                        "default",
                        "via",
                        "169.254.1.1",
                        "dev",
                        "eth0",
                        "onlink",
                    ],
                )
                .map(drop)
            }),
        ),
    ];
    for (what, breaks, repairs) in drifts {
        assert!(node.run("mycni", "CHECK", &c, &prev)?.ok, "before {what}");
        breaks()?;
        let r = node.run("mycni", "CHECK", &c, &prev)?;
        assert_eq!(r.code(), Some(103), "{what}: {}", r.stdout);
        repairs()?;
    }
    assert!(node.run("mycni", "CHECK", &c, &prev)?.ok);
    Ok(())
}

#[test]
fn late_del_of_an_old_sandbox_spares_the_new_one() -> Result<()> {
    let node = node()?;
    let conf = node.conf("1.0.0", "10.244.7.0/24");
    let old = NetNs::new("pod")?;
    let new = NetNs::new("pod")?;
    let (old_p, new_p) = (netns_path(&old), netns_path(&new));
    let a = node.run("mycni", "ADD", &call("old", &old_p, K8S_ARGS), &conf)?;
    assert!(a.ok);
    // Same pod, new sandbox, the old one never DELed: same host veth name.
    let b = node.run("mycni", "ADD", &call("new", &new_p, K8S_ARGS), &conf)?;
    assert!(b.ok, "{}", b.stdout);
    assert_eq!(
        a.json["interfaces"][0]["name"],
        b.json["interfaces"][0]["name"]
    );
    let del = node.run(
        "mycni",
        "DEL",
        &call("old", &old_p, K8S_ARGS),
        &with_prev(&conf, &a.json),
    )?;
    assert!(del.ok);
    // The new sandbox keeps its veth, route and lease; the old lease is gone.
    assert!(
        node.run(
            "mycni",
            "CHECK",
            &call("new", &new_p, K8S_ARGS),
            &with_prev(&conf, &b.json)
        )?
        .ok
    );
    assert_eq!(node.lease_count(), 1);
    Ok(())
}
