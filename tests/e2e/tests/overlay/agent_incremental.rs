//! Node events as incremental passes, end to end: the real agent with no
//! periodic full pass to hide a mistake (`--resync 60m`), Nodes changed one
//! at a time (MAC, host IP, podCIDR, delete, add, a VTEP MAC shared and
//! then given up, a podCIDR overlap and its end), and what the kernel then
//! holds compared with what a restarted agent's full pass makes of the
//! same Nodes: the same routes, neighbours and FDB entries, and nothing
//! for that full pass to change.

use std::time::Duration;

use anyhow::{Context, Result};
use mycni_lab::Lab;

use crate::common;
use common::{lab_with, peer_node, set_pod_cidrs, wait_until, without_nhid};

/// Route, neighbour and FDB state of vxlan.1 on lab node 1, as text, in
/// an order of its own (dumps list entries in hash order).
fn overlay(l: &Lab) -> Result<String> {
    let ns = l.spec.node_name(1);
    let routes = mycni_testkit::sh("ip", &["-n", &ns, "route", "show", "proto", "110"])?;
    let neigh = mycni_testkit::sh("ip", &["-n", &ns, "neigh", "show", "dev", "vxlan.1"])?;
    let fdb = mycni_testkit::sh("bridge", &["-n", &ns, "fdb", "show", "dev", "vxlan.1"])?;
    let mut lines: Vec<String> = without_nhid(&routes)
        .lines()
        .chain(neigh.lines())
        .chain(fdb.lines().filter(|l| l.contains(" dst ")))
        .map(str::to_string)
        .collect();
    lines.sort();
    Ok(lines.join("\n"))
}

fn mac(i: usize) -> String {
    format!("02:00:00:00:70:{i:02x}")
}

fn set_annotation(l: &Lab, name: &str, key: &str, value: &str) -> Result<()> {
    let api = l.api.as_ref().context("api")?;
    api.update_node(name, |n| {
        n.metadata
            .annotations
            .get_or_insert_default()
            .insert(key.into(), value.into());
    })?;
    Ok(())
}

#[test]
fn node_events_leave_what_a_full_pass_would() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let t = lab_with(1, 0, &["--resync", "60m"])?;
    let l = &t.0;
    let api = l.api.as_ref().context("api")?;
    const N: usize = 12;
    for i in 0..N {
        api.create_node(peer_node(
            &format!("p{i}"),
            &[&format!("10.244.{}.0/24", 70 + i)],
            &mac(i),
            &format!("192.168.77.{}", 170 + i),
        ))?;
    }
    wait_until("all peers programmed", Duration::from_secs(10), || {
        Ok(overlay(l)?.matches(" lladdr ").count() == N)
    })?;
    // Let the watch settle, so what follows are event passes.
    std::thread::sleep(Duration::from_millis(300));

    // One change at a time, each waited for where it shows.
    set_annotation(l, "p0", "mycni.dev/vtep-mac", "02:00:00:00:7f:00")?;
    wait_until("MAC change", Duration::from_secs(5), || {
        Ok(overlay(l)?.contains("10.244.70.0 lladdr 02:00:00:00:7f:00"))
    })?;
    set_annotation(l, "p1", "mycni.dev/host-ip", "192.168.77.250")?;
    wait_until("host IP change", Duration::from_secs(5), || {
        Ok(overlay(l)?.contains(&format!("{} dst 192.168.77.250", mac(1))))
    })?;
    api.update_node("p2", |n| set_pod_cidrs(n, &["10.244.99.0/24"]))?;
    wait_until("podCIDR change", Duration::from_secs(5), || {
        let o = overlay(l)?;
        Ok(o.contains("10.244.99.0/24 via 10.244.99.0") && !o.contains("10.244.72.0"))
    })?;
    api.delete_node("p3")?;
    wait_until("delete", Duration::from_secs(5), || {
        Ok(!overlay(l)?.contains("10.244.73.0"))
    })?;
    api.create_node(peer_node(
        "p-new",
        &["10.244.98.0/24"],
        "02:00:00:00:7f:98",
        "192.168.77.198",
    ))?;
    wait_until("add", Duration::from_secs(5), || {
        Ok(overlay(l)?.contains("10.244.98.0 lladdr 02:00:00:00:7f:98"))
    })?;
    // p4 takes p5's VTEP MAC: both go, until p4 gives it up.
    set_annotation(l, "p4", "mycni.dev/vtep-mac", &mac(5))?;
    wait_until("shared MAC rejects both", Duration::from_secs(5), || {
        let o = overlay(l)?;
        Ok(!o.contains("10.244.74.0") && !o.contains("10.244.75.0"))
    })?;
    set_annotation(l, "p4", "mycni.dev/vtep-mac", "02:00:00:00:7f:04")?;
    wait_until("both back", Duration::from_secs(5), || {
        let o = overlay(l)?;
        Ok(o.contains("10.244.74.0 lladdr 02:00:00:00:7f:04")
            && o.contains(&format!("10.244.75.0 lladdr {}", mac(5))))
    })?;
    // p6 widens over p7's podCIDR: both go, until it narrows again.
    api.update_node("p6", |n| set_pod_cidrs(n, &["10.244.76.0/23"]))?;
    wait_until("overlap rejects both", Duration::from_secs(5), || {
        let o = overlay(l)?;
        Ok(!o.contains("10.244.76.0") && !o.contains("10.244.77.0"))
    })?;
    api.update_node("p6", |n| set_pod_cidrs(n, &["10.244.76.0/24"]))?;
    wait_until("both back", Duration::from_secs(5), || {
        let o = overlay(l)?;
        Ok(o.contains("10.244.76.0/24 via") && o.contains("10.244.77.0/24 via"))
    })?;
    // A Node replaced with the same content: nothing to do.
    api.update_node("p8", |_| {})?;
    std::thread::sleep(Duration::from_millis(500));
    let after_events = overlay(l)?;

    // A restarted agent's first pass is full: it dumps the kernel and
    // computes every Node again. It must find nothing to change.
    l.stop_agent(1);
    l.start_agent(1)?;
    wait_until(
        "the restarted agent's first pass",
        Duration::from_secs(10),
        || {
            Ok(l.metrics(1).is_ok_and(|m| {
                m.lines().any(|x| {
                    x.strip_prefix("mycni_reconcile_runs_total ")
                        .and_then(|v| v.trim().parse::<f64>().ok())
                        .is_some_and(|v| v >= 1.0)
                })
            }))
        },
    )?;
    let after_full = overlay(l)?;
    assert_eq!(after_events, after_full);
    let actions = l
        .metrics(1)?
        .lines()
        .find_map(|x| x.strip_prefix("mycni_kernel_updates_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .context("no mycni_kernel_updates_total")?;
    assert_eq!(actions, 0.0, "the full pass changed what the events left");
    Ok(())
}
