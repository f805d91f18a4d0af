//! Batches of changes against the real kernel, in network namespaces that
//! exist only for the test (made as in `netlink.rs`). Needs root.
#![cfg(feature = "netlink")]

mod common;
use common::{ip, netns, v4};

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use mycni_common::net::{Cidr, Mac};
use mycni_common::netlink::{Batch, Netlink, Route, VxlanConfig};

const PROTO: u8 = 0x6f;

fn run<T>(f: impl AsyncFnOnce() -> T) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .expect("runtime")
        .block_on(f())
}

fn mac(i: usize) -> Mac {
    Mac([2, 0xbb, 0, 0, (i >> 8) as u8, i as u8])
}

fn gw(i: usize) -> Ipv4Addr {
    ip(10, 100 + (i >> 8) as u8, i as u8, 0)
}

fn cidr(i: usize) -> Cidr<Ipv4Addr> {
    Cidr::new(gw(i), 24).expect("a /24")
}

fn host(i: usize) -> Ipv4Addr {
    ip(192, 168, 80 + (i >> 8) as u8, i as u8)
}

/// A VXLAN device `vx0` over a veth to a second namespace; its ifindex.
async fn vxlan(nl: &Netlink, peer: &std::fs::File) -> u32 {
    let u = nl
        .create_veth_in("u0", "u1", peer, 1500)
        .await
        .expect("vx0 setup");
    nl.set_up(u.index).await.expect("vx0 setup");
    nl.add_address(u.index, v4("192.168.77.1/24"))
        .await
        .expect("vx0 setup");
    nl.create_vxlan(&VxlanConfig {
        name: "vx0",
        vni: 9,
        dev: u.index,
        local: ip(192, 168, 77, 1).into(),
        port: 8472,
        learning: false,
        udp_csum: false,
        mtu: 1450,
        mac: Mac([2, 0xaa, 0, 0, 0, 9]),
    })
    .await
    .expect("vx0 setup");
    let vx = nl
        .link_by_name("vx0")
        .await
        .expect("vx0 setup")
        .expect("vx0");
    nl.set_mac_mtu_and_up(vx.index, Mac([2, 0xaa, 0, 0, 0, 9]), 1450)
        .await
        .expect("vx0 setup");
    vx.index
}

/// Several datagrams' worth of FDB entries, neighbours and routes, one
/// request in the middle refused: that one fails alone, with its errno,
/// and everything else is in place; a delete of what is gone succeeds.
#[test]
fn each_change_of_a_batch_has_its_own_result() {
    const N: usize = 300;
    let (node, peer) = (netns(), netns());
    run(async || {
        let nl = Netlink::in_netns(&node).expect("netlink");
        let vx = vxlan(&nl, &peer).await;
        let mut b = Batch::new();
        for i in 0..N {
            b.replace_fdb_entry(vx, mac(i), host(i));
        }
        for i in 0..N {
            // A link that does not exist: ENODEV for this one alone.
            let link = if i == N / 2 { 9999 } else { vx };
            b.replace_permanent_neighbour(link, gw(i), mac(i));
        }
        for i in 0..N {
            b.replace_route(Route {
                dst: cidr(i),
                gateway: Some(gw(i)),
                oif: Some(vx),
                protocol: PROTO,
                onlink: true,
            });
        }
        // Gone already: success, as for one delete.
        b.delete_neighbour(vx, ip(10, 99, 0, 0));
        assert_eq!(b.len(), 3 * N + 1);
        let results = nl.apply_batch(b).await;
        assert_eq!(results.len(), 3 * N + 1);
        let failed: Vec<usize> = (0..results.len())
            .filter(|&i| results[i].is_err())
            .collect();
        assert_eq!(failed, [N + N / 2], "{:?}", results[N + N / 2]);
        let e = results[N + N / 2].as_ref().unwrap_err();
        assert_eq!(e.errno(), Some(libc::ENODEV), "{e}");
        assert!(e.to_string().contains("neighbour"), "{e}");

        let fdb = nl.fdb_entries(vx).await.unwrap();
        assert_eq!(fdb.len(), N);
        assert!(
            fdb.iter()
                .all(|f| (0..N).any(|i| f.mac == mac(i) && f.dst == Some(host(i))))
        );
        let neigh: BTreeSet<Ipv4Addr> = nl
            .permanent_neighbours(vx)
            .await
            .unwrap()
            .into_iter()
            .map(|n| n.ip)
            .collect();
        assert_eq!(neigh.len(), N - 1);
        assert!(!neigh.contains(&gw(N / 2)));
        let routes = nl.routes_by_protocol(PROTO).await.unwrap();
        assert_eq!(routes.len(), N);

        // Changes and deletes in one batch, in order.
        let mut b = Batch::new();
        for i in 0..N {
            b.delete_route(cidr(i), PROTO);
            b.delete_neighbour(vx, gw(i));
        }
        b.replace_fdb_entry(vx, mac(0), host(1));
        b.delete_fdb_entry(vx, mac(1));
        let results = nl.apply_batch(b).await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        assert!(nl.routes_by_protocol(PROTO).await.unwrap().is_empty());
        assert!(nl.permanent_neighbours(vx).await.unwrap().is_empty());
        assert_eq!(
            nl.fdb_entry(vx, mac(0)).await.unwrap().and_then(|f| f.dst),
            Some(host(1))
        );
        assert_eq!(nl.fdb_entry(vx, mac(1)).await.unwrap(), None);

        // An empty batch sends nothing.
        assert!(nl.apply_batch(Batch::new()).await.is_empty());
    });
}
