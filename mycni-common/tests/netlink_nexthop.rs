//! Nexthop objects and the routes through them, against the real kernel,
//! in network namespaces that exist only for the test (made as in
//! `netlink.rs`: a helper thread unshares one and opens it; the kernel
//! removes it once the file is closed). Needs root and Linux 5.3+.
#![cfg(feature = "netlink")]

mod common;
use common::{ip, netns, v4};

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use mycni_common::net::Cidr;
use mycni_common::netlink::{Link, Netlink, Nexthop, NexthopRoute, Route, nexthop_events};
use rtnetlink::packet_core::NetlinkPayload;

const PROTO: u8 = 0x6e;
const OTHER: u8 = 0xaa;

/// Runs `f` on a thread inside `ns`, for what must be made there.
fn in_ns<T: Send>(ns: &File, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setns(2) moves only this short-lived thread.
            assert_eq!(
                unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) },
                0
            );
            f()
        })
        .join()
        .expect("setns thread")
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .expect("runtime")
}

/// A veth in `node` with carrier (a nexthop's device needs it), its peer
/// up in `peer`, and 192.168.9.1/24 on it.
async fn link(nl: &Netlink, peer: &File) -> Link {
    let h = nl
        .create_veth_in("h0", "p0", peer, 1500)
        .await
        .expect("veth");
    let there = Netlink::in_netns(peer).expect("netlink in peer");
    let p = there
        .link_by_name("p0")
        .await
        .expect("listing p0")
        .expect("p0");
    there.set_up(p.index).await.expect("p0 up");
    nl.set_up(h.index).await.expect("h0 up");
    nl.add_address(h.index, v4("192.168.9.1/24"))
        .await
        .expect("address");
    h
}

fn onlink(id: u32, gw: Ipv4Addr, oif: u32) -> Nexthop {
    Nexthop {
        id,
        gateway: Some(IpAddr::V4(gw)),
        oif: Some(oif),
        protocol: PROTO,
        onlink: true,
    }
}

#[test]
fn nexthops_and_the_routes_through_them() {
    let (node, peer) = (netns(), netns());
    runtime().block_on(async {
        let nl = Netlink::in_netns(&node).expect("netlink");
        assert!(nl.nexthops_supported().await.unwrap());
        assert!(nl.nexthops().await.unwrap().is_empty());
        let h = link(&nl, &peer).await;

        let a = onlink(1, ip(10, 1, 0, 0), h.index);
        nl.add_nexthop(&a).await.unwrap();
        let twice = nl.add_nexthop(&a).await;
        assert!(twice.as_ref().is_err_and(|e| e.is_exists()), "{twice:?}");
        assert_eq!(nl.nexthop(1).await.unwrap(), Some(a));
        assert_eq!(nl.nexthop(2).await.unwrap(), None);
        // A gateway needs a device; 10.2.0.0 is on no subnet of h0.
        let no_dev = nl
            .add_nexthop(&Nexthop {
                id: 5,
                oif: None,
                ..a
            })
            .await;
        assert!(no_dev.is_err(), "{no_dev:?}");
        let not_onlink = nl
            .add_nexthop(&Nexthop {
                id: 2,
                gateway: Some(IpAddr::V4(ip(10, 2, 0, 0))),
                onlink: false,
                ..a
            })
            .await;
        assert!(not_onlink.is_err(), "{not_onlink:?}");
        // Straight to a neighbour on the link's subnet.
        let direct = Nexthop {
            id: 3,
            gateway: Some(IpAddr::V4(ip(192, 168, 9, 2))),
            onlink: false,
            ..a
        };
        nl.replace_nexthop(&direct).await.unwrap();

        let ra = NexthopRoute {
            dst: v4("10.1.0.0/24"),
            nhid: 1,
            protocol: PROTO,
        };
        nl.replace_nexthop_route(ra).await.unwrap();
        nl.replace_nexthop_route(NexthopRoute {
            dst: v4("10.3.0.0/24"),
            nhid: 3,
            protocol: PROTO,
        })
        .await
        .unwrap();
        let mut listed = nl.routes_with_nexthops_by_protocol(PROTO).await.unwrap();
        listed.sort_by_key(|(r, _)| r.dst);
        let ids: Vec<(Cidr<Ipv4Addr>, Option<u32>)> =
            listed.iter().map(|(r, id)| (r.dst, *id)).collect();
        assert_eq!(
            ids,
            [(v4("10.1.0.0/24"), Some(1)), (v4("10.3.0.0/24"), Some(3))]
        );
        // nexthop_compat_mode (on in a new namespace) shows the nexthop's
        // gateway and device on the route too.
        assert_eq!(
            (listed[0].0.gateway, listed[0].0.oif, listed[0].0.onlink),
            (Some(ip(10, 1, 0, 0)), Some(h.index), true)
        );

        // Replacing the nexthop moves every route through it.
        let moved = onlink(1, ip(10, 1, 0, 1), h.index);
        nl.replace_nexthop(&moved).await.unwrap();
        assert_eq!(nl.nexthop(1).await.unwrap(), Some(moved));
        let listed = nl.routes_with_nexthops_by_protocol(PROTO).await.unwrap();
        assert!(
            listed.iter().any(|(r, id)| r.dst == ra.dst
                && *id == Some(1)
                && r.gateway == Some(ip(10, 1, 0, 1))),
            "{listed:?}"
        );

        // A route holding its gateway itself is replaced by one through a
        // nexthop, not doubled.
        let own_gw = Route {
            dst: v4("10.4.0.0/24"),
            gateway: Some(ip(10, 4, 0, 0)),
            oif: Some(h.index),
            protocol: PROTO,
            onlink: true,
        };
        nl.add_route(own_gw).await.unwrap();
        let listed = nl.routes_with_nexthops_by_protocol(PROTO).await.unwrap();
        assert!(listed.contains(&(own_gw, None)), "{listed:?}");
        nl.replace_nexthop(&onlink(4, ip(10, 4, 0, 0), h.index))
            .await
            .unwrap();
        nl.replace_nexthop_route(NexthopRoute {
            dst: own_gw.dst,
            nhid: 4,
            protocol: PROTO,
        })
        .await
        .unwrap();
        let to_4: Vec<Option<u32>> = nl
            .routes_with_nexthops_by_protocol(PROTO)
            .await
            .unwrap()
            .into_iter()
            .filter(|(r, _)| r.dst == own_gw.dst)
            .map(|(_, id)| id)
            .collect();
        assert_eq!(to_4, [Some(4)]);

        // Deleting a nexthop deletes its routes; twice is fine.
        nl.delete_nexthop(1).await.unwrap();
        nl.delete_nexthop(1).await.unwrap();
        assert_eq!(nl.nexthop(1).await.unwrap(), None);
        let left: Vec<Cidr<Ipv4Addr>> = nl
            .routes_with_nexthops_by_protocol(PROTO)
            .await
            .unwrap()
            .into_iter()
            .map(|(r, _)| r.dst)
            .collect();
        assert!(!left.contains(&ra.dst), "{left:?}");
        // The plain listing still sees the routes through nexthops.
        let plain = nl.routes_by_protocol(PROTO).await.unwrap();
        assert_eq!(plain.len(), left.len(), "{plain:?}");
    });
}

#[test]
fn dumps_filter_by_protocol_and_device() {
    let (node, peer, other) = (netns(), netns(), netns());
    runtime().block_on(async {
        let nl = Netlink::in_netns(&node).expect("netlink");
        let h = link(&nl, &peer).await;
        let g = nl.create_veth_in("g0", "q0", &other, 1500).await.unwrap();
        let there = Netlink::in_netns(&other).expect("netlink in other");
        let q = there.link_by_name("q0").await.unwrap().expect("q0");
        there.set_up(q.index).await.unwrap();
        nl.set_up(g.index).await.unwrap();

        let ours = onlink(10, ip(10, 1, 0, 0), h.index);
        let theirs = Nexthop {
            protocol: OTHER,
            ..onlink(11, ip(10, 2, 0, 0), g.index)
        };
        for n in [&ours, &theirs] {
            nl.add_nexthop(n).await.unwrap();
        }
        let mut all = nl.nexthops().await.unwrap();
        all.sort_by_key(|n| n.id);
        assert_eq!(all, [ours, theirs]);
        assert_eq!(nl.nexthops_by_protocol(PROTO).await.unwrap(), [ours]);
        assert_eq!(nl.nexthops_by_protocol(OTHER).await.unwrap(), [theirs]);
        assert_eq!(nl.nexthops_of_link(g.index).await.unwrap(), [theirs]);
        assert_eq!(nl.nexthops_of_link(h.index).await.unwrap(), [ours]);

        // A nexthop goes with its device.
        nl.delete_link(g.index).await.unwrap();
        assert_eq!(nl.nexthops().await.unwrap(), [ours]);
    });
}

#[test]
fn many_nexthops_at_once_and_the_ones_that_failed() {
    let (node, peer) = (netns(), netns());
    runtime().block_on(async {
        let nl = Netlink::in_netns(&node).expect("netlink");
        let h = link(&nl, &peer).await;
        // More than one datagram's worth, one of them on no device.
        let mut many: Vec<Nexthop> = (0..300u32)
            .map(|i| onlink(100 + i, ip(10, 100, (i / 256) as u8, i as u8), h.index))
            .collect();
        many[260].oif = Some(999_999);
        let failed = nl.replace_nexthops(&many).await.unwrap();
        let ids: Vec<u32> = failed.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids, [360], "{failed:?}");
        assert!(failed[0].1.errno().is_some(), "{failed:?}");
        assert_eq!(nl.nexthops_by_protocol(PROTO).await.unwrap().len(), 299);
        // Again, with new gateways: replaced in place.
        many[260].oif = Some(h.index);
        for n in &mut many {
            n.gateway = Some(IpAddr::V4(ip(10, 101, 0, 1)));
        }
        assert!(nl.replace_nexthops(&many).await.unwrap().is_empty());
        let all = nl.nexthops_by_protocol(PROTO).await.unwrap();
        assert_eq!(all.len(), 300);
        assert!(
            all.iter()
                .all(|n| n.gateway == Some(IpAddr::V4(ip(10, 101, 0, 1))))
        );
        assert!(nl.replace_nexthops(&[]).await.unwrap().is_empty());
    });
}

#[test]
fn a_deleted_nexthop_is_notified() {
    let (node, peer) = (netns(), netns());
    let rt = runtime();
    let rh = rt.handle().clone();
    // The subscription belongs to the namespace of the thread that makes
    // it, and its socket to the runtime it is registered with.
    let (conn, mut events) = in_ns(&node, || {
        let _in_rt = rh.enter();
        nexthop_events().expect("subscribing")
    });
    rt.block_on(async {
        tokio::spawn(conn);
        let nl = Netlink::in_netns(&node).expect("netlink");
        let h = link(&nl, &peer).await;
        nl.add_nexthop(&onlink(7, ip(10, 7, 0, 0), h.index))
            .await
            .unwrap();
        nl.delete_nexthop(7).await.unwrap();
        // The dev-dependencies have no tokio timer: poll until a deadline.
        let deadline = Instant::now() + Duration::from_secs(5);
        let deleted = loop {
            match events.try_recv() {
                Ok((m, _)) => {
                    if let NetlinkPayload::InnerMessage(m) = m.payload
                        && m.is_delete()
                    {
                        break m.nexthop();
                    }
                }
                Err(_) if Instant::now() < deadline => tokio::task::yield_now().await,
                Err(_) => panic!("no deletion notified within 5 s"),
            }
        };
        let n = deleted.expect("a deletion with the nexthop");
        assert_eq!((n.id, n.protocol), (7, PROTO));
    });
}

#[test]
fn nexthops_need_a_runtime_like_everything_else() {
    let node = netns();
    let rt = runtime();
    let nl = rt.block_on(async { Netlink::in_netns(&node).expect("netlink") });
    // Outside the runtime, the first nexthop operation cannot connect;
    // inside it, it can.
    let no_rt = futures::executor::block_on(nl.nexthops());
    assert!(no_rt.is_err(), "{no_rt:?}");
    assert!(rt.block_on(nl.nexthops()).unwrap().is_empty());
}
