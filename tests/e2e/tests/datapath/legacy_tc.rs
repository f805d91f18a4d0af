//! The programs attached as legacy tc filters (`clsact` + `cls_bpf`), as on
//! a kernel without TCX (Debian 12's 6.1), forced here with
//! `MYCNI_TC_ATTACH=legacy` on a kernel that has both: `tc filter show`
//! lists mycni's filters where TCX lists nothing, the fast path carries
//! traffic, and restarting the agents in the other mode, both ways, leaves
//! exactly one mycni program on every hook.

use crate::common;

use std::collections::BTreeMap;

use anyhow::{Context, Result, ensure};
use aya::programs::{SchedClassifier, TcAttachType};
use common::lab_stack;
use mycni_agent::datapath::attach::{LEGACY_SETTLE, filter_program_ids};
use mycni_agent::datapath::pinned_links;
use mycni_lab::{Lab, Stack};
use mycni_testkit::{in_netns, sh};

const MODE_ENV: &str = "MYCNI_TC_ATTACH";

/// The names of mycni programs on one hook: over TCX, and in tc filters.
type OnHook = (Vec<String>, Vec<String>);

/// Per hook (ifindex) of node `i`, what is on it.
fn hooks(l: &Lab, i: usize) -> Result<BTreeMap<u32, OnHook>> {
    let links = pinned_links(&l.spec.pin_dir(i))?;
    ensure!(!links.is_empty(), "node {i}: nothing attached");
    in_netns(&l.spec.node_name(i), || -> Result<_> {
        let mut out = BTreeMap::new();
        for (_, ifindex) in links {
            let tcx: Vec<String> = SchedClassifier::query_tcx(ifindex, TcAttachType::Ingress)
                .map(|(_, progs)| progs)
                .unwrap_or_default()
                .iter()
                .filter_map(|p| p.name_as_str().map(str::to_owned))
                .filter(|n| n.starts_with("mycni_"))
                .collect();
            let ids = filter_program_ids(ifindex)?;
            let tc: Vec<String> = aya::programs::loaded_programs()
                .filter_map(Result::ok)
                .filter(|p| ids.contains(&p.id()))
                .filter_map(|p| p.name_as_str().map(str::to_owned))
                .filter(|n| n.starts_with("mycni_"))
                .collect();
            out.insert(ifindex, (tcx, tc));
        }
        Ok(out)
    })?
}

/// Every hook of every node holds one mycni program, the way `legacy` says.
fn one_per_hook(l: &Lab, legacy: bool) -> Result<()> {
    for i in 1..=2 {
        for (ifindex, (tcx, tc)) in hooks(l, i)? {
            let (mine, other) = if legacy { (&tc, &tcx) } else { (&tcx, &tc) };
            ensure!(
                mine.len() == 1 && other.is_empty(),
                "node {i} ifindex {ifindex} ({}): TCX {tcx:?}, tc filters {tc:?}",
                if legacy { "legacy" } else { "tcx" }
            );
        }
    }
    Ok(())
}

fn restart_agents(l: &mut Lab, mode: &str) -> Result<()> {
    // SAFETY (env): this binary's one test sets it between agents' starts.
    unsafe { std::env::set_var(MODE_ENV, mode) };
    l.set_fast_path(true)?;
    // Ready follows the first full pass, which attaches; one more for luck.
    std::thread::sleep(std::time::Duration::from_secs(2));
    Ok(())
}

#[test]
fn legacy_filters_carry_the_fast_path_and_modes_switch_both_ways() -> Result<()> {
    let _turn = crate::turn(module_path!());
    // SAFETY (env): set before the lab starts its agents, which inherit it.
    unsafe { std::env::set_var(MODE_ENV, "legacy") };
    let mut t = lab_stack(2, 1, Stack::Ipv4Only, &[])?;
    let l = &mut t.0;
    // A legacy attach to a new pod waits for its CNI chain to finish.
    std::thread::sleep(LEGACY_SETTLE + std::time::Duration::from_secs(1));
    let ready = l.readyz(1)?;
    ensure!(ready.contains("legacy tc attach"), "{ready}");
    one_per_hook(l, true)?;
    let pod = l.pods()?.into_iter().next().context("no pod")?;
    let veth = sh(
        "ip",
        &[
            "-n",
            &l.spec.node_name(pod.node),
            "-o",
            "link",
            "show",
            "type",
            "veth",
        ],
    )?;
    // The pod's host veth (the node's underlay eth0 is a veth too).
    let name = veth
        .lines()
        .filter_map(|l| l.split(':').nth(1))
        .map(|n| n.trim().split('@').next().unwrap_or("").to_owned())
        .find(|n| n != "eth0")
        .context("no pod veth on the pod's node")?;
    let shown = sh(
        "ip",
        &[
            "netns",
            "exec",
            &l.spec.node_name(pod.node),
            "tc",
            "filter",
            "show",
            "dev",
            &name,
            "ingress",
        ],
    )?;
    eprintln!("tc filter show dev {name} ingress:\n{shown}");
    ensure!(
        shown.contains("mycni_from_pod")
            && shown.contains("pref 1 ")
            && shown.contains("direct-action"),
        "{shown}"
    );
    let (table, failed) = l.matrix()?;
    ensure!(
        failed == 0,
        "unreachable pairs with legacy filters:\n{table}"
    );

    restart_agents(l, "tcx")?;
    one_per_hook(l, false)?;
    let (_, failed) = l.matrix()?;
    ensure!(failed == 0, "unreachable pairs after legacy -> tcx");

    restart_agents(l, "legacy")?;
    one_per_hook(l, true)?;
    let (_, failed) = l.matrix()?;
    ensure!(failed == 0, "unreachable pairs after tcx -> legacy");
    unsafe { std::env::remove_var(MODE_ENV) };
    Ok(())
}
