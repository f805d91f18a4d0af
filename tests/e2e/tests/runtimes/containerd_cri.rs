//! A pod's network through the real runtime path: a private containerd,
//! driven over CRI as kubelet drives it, calls the CNI plugin on
//! RunPodSandbox and again on StopPodSandbox.
//!
//! The bin dir holds the `mycni` binary under test beside the reference
//! plugins (containerd needs `loopback` for every pod); the conflist is the
//! one the agent writes: mycni with its built-in IPAM, whose lease files
//! keep host-local's layout.

use std::fs;
use std::net::Ipv4Addr;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use mycni_common::net::Cidr;
use mycni_e2e::cri::ContainerdHarness;
use mycni_e2e::leftovers::files_named;

/// The CNI network containerd will use.
struct CniSetup {
    bin_dir: PathBuf,
    conf_dir: PathBuf,
    /// The `name` in the conflist; libcni's cache files carry it.
    network: &'static str,
    /// Pod addresses must fall in it.
    subnet: Cidr<Ipv4Addr>,
    /// host-local's `dataDir`, if the network uses host-local: the pod's
    /// lease file there must come and go with the pod.
    host_local_data_dir: Option<PathBuf>,
}

/// mycni as the network, as the agent's conflist sets it up.
fn mycni_plugins(dir: &Path) -> Result<CniSetup> {
    let bin_dir = dir.join("bin");
    let conf_dir = dir.join("net.d");
    let ipam_data_dir = dir.join("ipam");
    fs::create_dir_all(&bin_dir)?;
    fs::create_dir_all(&conf_dir)?;
    for entry in fs::read_dir("/usr/lib/cni").context("reference CNI plugins missing")? {
        let entry = entry?;
        symlink(entry.path(), bin_dir.join(entry.file_name()))?;
    }
    let plugin = mycni_e2e::bin("mycni");
    mycni_e2e::missing(&[&plugin])?;
    symlink(&plugin, bin_dir.join("mycni"))?;
    let setup = CniSetup {
        bin_dir,
        conf_dir,
        network: "mycni0",
        subnet: Cidr::parse_network("10.250.0.0/24")?,
        host_local_data_dir: Some(ipam_data_dir.clone()),
    };
    // containerd 1.6's libcni speaks up to 1.0.0; the plugin answers in it.
    let conflist = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": setup.network,
        "plugins": [{
            "type": "mycni",
            "mtu": 1450,
            "logFile": dir.join("mycni.log"),
            "ipam": {
                "type": "mycni-ipam",
                "subnet": setup.subnet.to_string(),
                // Leases must not go to the host's /var/lib/cni/networks.
                "dataDir": ipam_data_dir,
            },
        }],
    });
    fs::write(
        setup.conf_dir.join("00-mycni.conflist"),
        serde_json::to_vec_pretty(&conflist)?,
    )?;
    Ok(setup)
}

#[test]
fn pod_network_through_containerd_cri() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let started = Instant::now();
    let tmp = tempfile::Builder::new()
        .prefix("mycni-cri-cni-")
        .tempdir()?;
    let cni = mycni_plugins(tmp.path())?;
    let h = ContainerdHarness::start(&cni.bin_dir, &cni.conf_dir)?;
    let boot = started.elapsed();

    let (name, namespace, uid) = ("web-0", "default", "6a1c0e55-0000-4000-8000-00000000c0de");
    let id = h.run_pod_sandbox(name, namespace, uid)?;
    let status = h.pod_sandbox_status(&id)?;
    let ip: Ipv4Addr = status
        .ip
        .parse()
        .with_context(|| format!("pod IP {:?}", status.ip))?;
    ensure!(cni.subnet.contains(ip), "pod IP {ip} not in {}", cni.subnet);

    // The sandbox netns, seen the way the plugin left it.
    let addrs = h.pod_netns_exec(&id, "ip", &["-4", "-o", "addr", "show", "dev", "eth0"])?;
    ensure!(
        addrs.contains(&format!("inet {ip}/")),
        "eth0 lacks {ip}: {addrs}"
    );
    let route = h.pod_netns_exec(&id, "ip", &["-4", "route", "show", "default"])?;
    ensure!(
        route.contains("via 169.254.1.1"),
        "pod default route is not via 169.254.1.1: {route:?}"
    );
    // The gateway is virtual (proxy ARP / a static neighbour): ping the node.
    h.node()
        .exec("ip", &["addr", "add", "10.99.0.1/32", "dev", "lo"])?;
    h.node().exec("sysctl", &["-qw", "net.ipv4.ip_forward=1"])?;
    let gateway = "10.99.0.1".to_string();
    h.pod_netns_exec(&id, "ping", &["-c", "1", "-W", "2", &gateway])?;

    // And from a container in the pod, which only shares the sandbox's netns
    // if containerd wired it like kubelet expects.
    let probe = h.run_container(&id, "probe", &["sleep", "3600"])?;
    let out = h.exec_sync(&probe, &["ping", "-c", "1", "-W", "2", &gateway])?;
    ensure!(out.exit_code == 0, "ping {gateway} from the pod: {out:?}");
    let out = h.exec_sync(&probe, &["ip", "-4", "-o", "addr", "show", "eth0"])?;
    ensure!(
        out.stdout.contains(&format!("inet {ip}/")),
        "container's eth0 lacks {ip}: {out:?}"
    );

    // The node side: the route to the pod names its host-side interface.
    let node_route = h
        .node()
        .exec("ip", &["-4", "-o", "route", "get", &ip.to_string()])?;
    let host_if = node_route
        .split_whitespace()
        .skip_while(|w| *w != "dev")
        .nth(1)
        .with_context(|| format!("no route to the pod on the node: {node_route:?}"))?
        .to_owned();
    // A read-only look at the real host: the plugin must not have reached it.
    let host_links = mycni_testkit::sh("ip", &["-o", "link", "show"])?;
    ensure!(
        !host_links.contains(&format!(" {host_if}@")),
        "{host_if} is on the real host: {host_links}"
    );

    // containerd passed kubelet's pod identity in CNI_ARGS; libcni cached it
    // together with the result it will hand back on DEL.
    let cache_file = h
        .cni_cache_dir()
        .join("results")
        .join(format!("{}-{id}-eth0", cni.network));
    let cache = fs::read_to_string(&cache_file)
        .with_context(|| format!("libcni cache {}", cache_file.display()))?;
    for arg in [
        format!(r#"["K8S_POD_NAMESPACE","{namespace}"]"#),
        format!(r#"["K8S_POD_NAME","{name}"]"#),
        format!(r#"["K8S_POD_INFRA_CONTAINER_ID","{id}"]"#),
        format!(r#"["K8S_POD_UID","{uid}"]"#),
    ] {
        ensure!(cache.contains(&arg), "CNI cache lacks {arg}: {cache}");
    }
    let lease = cni
        .host_local_data_dir
        .as_ref()
        .map(|d| d.join(cni.network).join(ip.to_string()));
    if let Some(lease) = &lease {
        ensure!(lease.exists(), "no host-local lease {}", lease.display());
    }
    let netns = h.netns_host_path(&status)?;
    ensure!(netns.exists(), "pod netns {} not found", netns.display());

    h.stop_pod_sandbox(&id)?;
    h.remove_pod_sandbox(&id)?;

    let links = h.node().exec("ip", &["-o", "link", "show"])?;
    ensure!(
        !links.contains(&format!(" {host_if}@")),
        "{host_if} left on the node: {links}"
    );
    if let Some(lease) = &lease {
        ensure!(!lease.exists(), "lease {} left", lease.display());
    }
    // Loopback's cache entry included.
    let cached = files_named(&h.cni_cache_dir(), &id);
    ensure!(cached.is_empty(), "CNI cache left: {cached:?}");
    ensure!(!netns.exists(), "netns {} left", netns.display());

    drop(h);
    eprintln!(
        "containerd up in {:.2} s, whole test {:.2} s",
        boot.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
