//! The agent's kernel adapter against the real kernel in a test namespace:
//! what `apply` programs, `dump` reads back exactly, so a reconcile pass
//! after a good one changes nothing.

use std::net::Ipv4Addr;

use mycni_agent::overlay::{self, OverlayKernel};
use mycni_agent::topology::{OverlayState, VxlanSpec};
use mycni_common::net::{Cidr4, Mac};
use mycni_common::node::Peer;
use mycni_testkit::NetNs;

fn peer(name: &str, cidr: &str, mac: u8, ip: u8) -> Peer {
    Peer {
        name: name.into(),
        pod_cidr: Cidr4::parse_network(cidr).expect("test CIDR"),
        pod_cidr6: None,
        vtep_mac: Mac([2, 0, 0, 0, 0, mac]),
        host_ip: Ipv4Addr::new(192, 168, 55, ip),
        underlay6: None,
    }
}

fn in_node<T: Send>(ns: &NetNs, f: impl AsyncFnOnce(OverlayKernel, VxlanSpec) -> T + Send) -> T {
    ns.run_in(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let k = OverlayKernel::new().expect("netlink");
            let u = k.underlay(Some("eth0")).await.expect("underlay");
            let spec = VxlanSpec {
                name: "vxlan.1".into(),
                vni: 1,
                port: 8472,
                underlay_index: u.index,
                local_ip: u.ip,
                mtu: u.mtu - 50,
                mac: Mac([2, 0xaa, 0, 0, 0, 1]),
                address: Ipv4Addr::new(10, 244, 0, 0),
                address6: None,
            };
            f(k, spec).await
        })
    })
    .expect("thread in netns")
}

fn node() -> NetNs {
    let ns = NetNs::new("agk").expect("netns");
    ns.exec(
        "ip",
        &[
            "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p",
        ],
    )
    .expect("ip");
    ns.exec("ip", &["addr", "add", "192.168.55.1/24", "dev", "eth0"])
        .expect("ip");
    ns.exec("ip", &["link", "set", "eth0", "up"]).expect("ip");
    ns.exec("ip", &["link", "set", "eth0p", "up"]).expect("ip");
    ns
}

#[test]
fn applied_state_reads_back_exactly() {
    let _turn = crate::turn(module_path!());
    let ns = node();
    let (first, second) = in_node(&ns, async |k, spec| {
        let (idx, created) = k.ensure_vxlan(&spec).await.unwrap();
        assert!(created);
        let want = overlay::desired(&[
            peer("a", "10.244.1.0/24", 1, 2),
            peer("b", "10.244.2.0/24", 2, 3),
        ]);
        let acts = overlay::diff(&want, &OverlayState::default());
        assert_eq!(k.apply(idx, 0, &acts).await, 0);
        let have = k.dump(idx, 0).await.unwrap();
        let first = overlay::diff(&want, &have);
        // A second device setup must adopt, not recreate, and keep entries.
        let (idx2, created2) = k.ensure_vxlan(&spec).await.unwrap();
        assert_eq!((idx2, created2), (idx, false));
        let second = overlay::diff(&want, &k.dump(idx, 0).await.unwrap());
        (first, second)
    });
    assert!(first.is_empty(), "after apply, dump differs: {first:?}");
    assert!(
        second.is_empty(),
        "after re-adopting the device: {second:?}"
    );
    let fdb = ns
        .exec("bridge", &["fdb", "show", "dev", "vxlan.1"])
        .unwrap();
    assert!(
        fdb.contains("02:00:00:00:00:01 dst 192.168.55.2 self permanent"),
        "{fdb}"
    );
    let routes = ns.exec("ip", &["route", "show", "proto", "110"]).unwrap();
    // `nhid N` comes between the two where the route goes through a
    // nexthop object.
    assert!(
        routes
            .lines()
            .any(|l| l.starts_with("10.244.2.0/24 ") && l.contains(" via 10.244.2.0 dev vxlan.1")),
        "{routes}"
    );
}

#[test]
fn stale_entries_and_foreign_ones() {
    let _turn = crate::turn(module_path!());
    let ns = node();
    // Someone else's route on vxlan.1 must survive; ours must go.
    let left = in_node(&ns, async |k, spec| {
        let (idx, _) = k.ensure_vxlan(&spec).await.unwrap();
        let want = overlay::desired(&[peer("a", "10.244.1.0/24", 1, 2)]);
        k.apply(idx, 0, &overlay::diff(&want, &OverlayState::default()))
            .await;
        idx
    });
    ns.exec("ip", &["route", "add", "10.99.0.0/24", "dev", "vxlan.1"])
        .unwrap();
    let _ = left;
    let empty = in_node(&ns, async |k, spec| {
        let (idx, _) = k.ensure_vxlan(&spec).await.unwrap();
        let have = k.dump(idx, 0).await.unwrap();
        let acts = overlay::diff(&OverlayState::default(), &have);
        assert_eq!(acts.len(), 3, "{acts:?}");
        assert_eq!(k.apply(idx, 0, &acts).await, 0);
        k.dump(idx, 0).await.unwrap()
    });
    assert_eq!(empty, OverlayState::default());
    let routes = ns.exec("ip", &["route"]).unwrap();
    assert!(routes.contains("10.99.0.0/24 dev vxlan.1"), "{routes}");
}
