//! The eBPF pipeline end to end: the object built by `cargo xtask build-ebpf`
//! is loaded by mycni-agent's library, attached over TCX to a veth inside a
//! test namespace, and the packets of a ping are read back from the per-CPU
//! counter map pinned in the test's own bpffs.

use mycni_agent::datapath::{Datapath, embedded_object, read_family_counters};
use mycni_common::{COUNTERS_MAP, DpFamily, DpPath, PathCounter};
use mycni_testkit::{BpfFs, VethPair, sh};

#[test]
fn ping_is_counted_in_pinned_map() -> anyhow::Result<()> {
    let _turn = crate::turn(module_path!());
    let object = embedded_object().ok_or_else(|| {
        anyhow::anyhow!("agent built without eBPF object: run via `cargo xtask test`")
    })?;
    let bpffs = BpfFs::new()?;
    let net = VethPair::new("10.123.0.1", "10.123.0.2")?;
    // Without a config every frame counts under kernel_no_config: no ARP.
    net.pin_neighbours("10.123.0.1", "10.123.0.2")?;
    let ifindex = net.host_ifindex()?;

    // Attach inside the node namespace, then drop every userspace handle: the
    // pinned link must keep the program attached on its own.
    net.node.run_in(|| -> anyhow::Result<()> {
        let mut dp = Datapath::load(object, bpffs.path())?;
        dp.attach_from_pod(ifindex)?;
        Ok(())
    })??;

    net.pod
        .exec("ping", &["-c", "5", "-i", "0.05", "-W", "1", "10.123.0.1"])?;

    let counters = ipv4_counters(bpffs.path())?;
    let get = |p: DpPath| {
        counters
            .iter()
            .find(|(q, _)| *q == p)
            .map(|(_, c)| *c)
            .unwrap_or_default()
    };
    // No agent wrote the config: exactly the 5 echo requests, 98 bytes each
    // (14 Ethernet + 20 IP + 8 ICMP + 56 payload), in the IPv4 rows.
    let icmp = get(DpPath::KernelNoConfig);
    assert_eq!(icmp.packets, 5, "counters: {counters:?}");
    assert_eq!(icmp.bytes, 5 * 98, "counters: {counters:?}");
    assert_eq!(get(DpPath::FastVxlanNoEncap).packets, 0);

    // bpftool reads the same pinned map, with field names from BTF.
    let map = bpffs.path().join(COUNTERS_MAP);
    let dump = sh(
        "bpftool",
        &["map", "dump", "pinned", &map.to_string_lossy()],
    )?;
    eprintln!("bpftool map dump pinned {}:\n{dump}", map.display());
    assert!(
        dump.contains("\"packets\""),
        "no BTF field names in: {dump}"
    );
    Ok(())
}

#[test]
fn reattach_swaps_program_in_pinned_link() -> anyhow::Result<()> {
    let _turn = crate::turn(module_path!());
    let object = embedded_object().ok_or_else(|| {
        anyhow::anyhow!("agent built without eBPF object: run via `cargo xtask test`")
    })?;
    let bpffs = BpfFs::new()?;
    let net = VethPair::new("10.123.1.1", "10.123.1.2")?;
    net.pin_neighbours("10.123.1.1", "10.123.1.2")?;
    let ifindex = net.host_ifindex()?;
    // A second load (an agent restart) reuses the pinned map and link: the
    // counter keeps counting from where it was, and only one program runs.
    for _ in 0..2 {
        net.node.run_in(|| -> anyhow::Result<()> {
            let mut dp = Datapath::load(object, bpffs.path())?;
            dp.attach_from_pod(ifindex)?;
            Ok(())
        })??;
        net.pod
            .exec("ping", &["-c", "2", "-i", "0.05", "-W", "1", "10.123.1.1"])?;
    }
    let counters = ipv4_counters(bpffs.path())?;
    let icmp = counters
        .iter()
        .find(|(p, _)| *p == DpPath::KernelNoConfig)
        .map(|(_, c)| c.packets);
    assert_eq!(icmp, Some(4), "counters: {counters:?}");
    Ok(())
}

/// The IPv4 rows of the pinned counters. The pod's veth also sends its own
/// IPv6 at link-up (MLD reports, router solicitations), whenever the kernel's
/// random delay puts them, and with no config those count under the same
/// reason in the IPv6 rows: a count of the pings must leave them out.
fn ipv4_counters(pin: &std::path::Path) -> anyhow::Result<Vec<(DpPath, PathCounter)>> {
    Ok(read_family_counters(pin)?
        .into_iter()
        .filter(|(f, _, _)| *f == DpFamily::Ipv4)
        .map(|(_, p, c)| (p, c))
        .collect())
}

/// Upgrades from the counters' older layouts: one 32-entry row (before
/// address families), and three rows of 32 (before the `vxlan6.1` paths).
/// The new agent cannot reuse the pin, rebuilds the map and runs the fast
/// path; `inspect` (and the metrics) meanwhile refuse the old map by name
/// rather than misread it.
#[test]
fn counters_pinned_by_an_older_agent_are_rebuilt() -> anyhow::Result<()> {
    let _turn = crate::turn(module_path!());
    use mycni_agent::datapath::DatapathError;
    use mycni_agent::datapath::{DatapathRoom, Mode};
    use mycni_agent::metrics::Metrics;
    use mycni_common::COUNTERS_LEN;
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    let object = embedded_object().ok_or_else(|| {
        anyhow::anyhow!("agent built without eBPF object: run via `cargo xtask test`")
    })?;
    for (what, old_len) in [("without families", 32u32), ("without vxlan6.1", 3 * 32)] {
        anyhow::ensure!(old_len != COUNTERS_LEN);
        let bpffs = BpfFs::new()?;
        let pin = bpffs.path().join(COUNTERS_MAP);
        sh(
            "bpftool",
            &[
                "map",
                "create",
                &pin.to_string_lossy(),
                "type",
                "percpu_array",
                "key",
                "4",
                "value",
                "16",
                "entries",
                &old_len.to_string(),
                "name",
                COUNTERS_MAP,
            ],
        )?;
        match read_family_counters(bpffs.path()) {
            Err(e @ DatapathError::CounterLayout { entries, .. }) if entries == old_len => {
                eprintln!("{what}: old layout refused: {e}");
            }
            other => anyhow::bail!("{what}: the {old_len}-entry map was read: {other:?}"),
        }

        let proc_sys = tempfile::tempdir()?;
        let metrics = Arc::new(Metrics::default());
        let section = mycni_agent::datapath::Section {
            mode: Mode::Ebpf,
            tc_encap: true,
            log: false,
            pin_dir: bpffs.path().to_path_buf(),
            proc_sys: proc_sys.path().to_path_buf(),
        };
        let fp = DatapathRoom::start(&section, Some(object), metrics.clone());
        anyhow::ensure!(fp.active(), "{what}: not loaded: {}", fp.describe());
        anyhow::ensure!(metrics.ebpf_load_failures.load(Ordering::Relaxed) == 0);
        let counters = read_family_counters(bpffs.path())?;
        anyhow::ensure!(counters.len() == COUNTERS_LEN as usize);
        anyhow::ensure!(
            counters
                .iter()
                .any(|(f, p, _)| *f == DpFamily::Ipv6 && *p == DpPath::KernelVxlan6Mtu)
        );
        let shown = sh(
            "bpftool",
            &["map", "show", "pinned", &pin.to_string_lossy()],
        )?;
        anyhow::ensure!(
            shown.contains(&format!("max_entries {COUNTERS_LEN}")),
            "{what}: {shown}"
        );
    }
    Ok(())
}
