//! What the bench's columns measure, the agents' datapath each needs, and
//! the checks that a column's traffic takes the path it is named after.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::time::Duration;

use anyhow::{Result, bail};
use mycni_testkit::sh;

use super::rulesets::Rules;
use super::{POD_MTU, VETH_A, VETH_A_IP, VETH_B, VETH_B_IP};
use crate::{IpFamily, Lab};

/// What one column measures; the order is the table's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Variant {
    Direct,
    Underlay,
    Overlay,
    Kernel,
    FastVxlan,
    Fast,
    KernelDirect,
    FastDirect,
    /// The kernel path and the tc-encap fast path between the same two
    /// pods over their IPv6 addresses (IPv6 inner, the IPv4 underlay).
    Kernel6,
    Fast6,
    /// The tc-encap fast path with the programs' flow events off
    /// (`--flow-events=false`): what the events cost, `Fast` over it.
    FastQuiet,
}

/// The agents' datapath flags while a lab variant runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Agents {
    /// `--datapath kernel --direct-routing <direct>`: no tc program
    /// attached anywhere.
    Kernel { direct: bool },
    /// `--datapath ebpf --tc-encap <tc_encap> --direct-routing <direct>
    /// --flow-events <events>`.
    Fast {
        tc_encap: bool,
        direct: bool,
        events: bool,
    },
}

impl Agents {
    /// The agent flags, each with its value, so a switch replaces every
    /// one the previous variant set.
    pub(super) fn flags(self) -> Vec<(&'static str, &'static str)> {
        let b = |v: bool| if v { "true" } else { "false" };
        match self {
            Agents::Kernel { direct } => vec![
                ("--datapath", "kernel"),
                ("--direct-routing", b(direct)),
                ("--flow-events", "true"),
            ],
            Agents::Fast {
                tc_encap,
                direct,
                events,
            } => vec![
                ("--datapath", "ebpf"),
                ("--tc-encap", b(tc_encap)),
                ("--direct-routing", b(direct)),
                ("--flow-events", b(events)),
            ],
        }
    }

    pub(super) fn direct(self) -> bool {
        match self {
            Agents::Kernel { direct } | Agents::Fast { direct, .. } => direct,
        }
    }
}

impl Variant {
    /// The table's order, which is also an even run's.
    pub(super) const ALL: [Variant; 11] = [
        Variant::Direct,
        Variant::Underlay,
        Variant::Overlay,
        Variant::Kernel,
        Variant::FastVxlan,
        Variant::Fast,
        Variant::KernelDirect,
        Variant::FastDirect,
        Variant::Kernel6,
        Variant::Fast6,
        Variant::FastQuiet,
    ];

    /// The order of one run. Variants sharing the agents' flags sit next to
    /// each other, and each switch changes one thing (kernel <-> kernel
    /// direct <-> fast direct <-> fast <-> fast via vxlan.1), so a run costs
    /// four agent restarts (each IPv6 column sits beside its IPv4 twin,
    /// which runs the same agents); odd runs go the other way, so drift in
    /// the machine's load does not always favour the same column, and
    /// start where the previous run ended, without a restart.
    pub(super) fn run_order(run: usize) -> [Variant; 11] {
        let even = [
            Variant::Direct,
            Variant::Underlay,
            Variant::Overlay,
            Variant::Kernel6,
            Variant::Kernel,
            Variant::KernelDirect,
            Variant::FastDirect,
            Variant::FastQuiet,
            Variant::Fast,
            Variant::Fast6,
            Variant::FastVxlan,
        ];
        if run.is_multiple_of(2) {
            even
        } else {
            let mut odd = even;
            // The direct veth needs no agent: it stays first either way.
            odd[1..].reverse();
            odd
        }
    }

    pub(super) fn label(self) -> &'static str {
        match self {
            Variant::Direct => "direct veth",
            Variant::Underlay => "underlay (node->node)",
            Variant::Overlay => "overlay (node->node)",
            Variant::Kernel => "kernel path",
            Variant::FastVxlan => "fast path via vxlan.1",
            Variant::Fast => "fast path (tc encap)",
            Variant::KernelDirect => "kernel path, direct routing",
            Variant::FastDirect => "fast path, direct routing",
            Variant::Kernel6 => "kernel path, IPv6",
            Variant::Fast6 => "fast path (tc encap), IPv6",
            Variant::FastQuiet => "fast path (tc encap), flow events off",
        }
    }

    /// The address family of the pods' traffic (the references' is IPv4).
    pub(super) fn family(self) -> IpFamily {
        match self {
            Variant::Kernel6 | Variant::Fast6 => IpFamily::V6,
            _ => IpFamily::V4,
        }
    }

    /// The agents' datapath while this variant runs; None: not the lab.
    pub(super) fn agents(self) -> Option<Agents> {
        match self {
            Variant::Direct => None,
            Variant::Fast | Variant::Fast6 => Some(Agents::Fast {
                tc_encap: true,
                direct: false,
                events: true,
            }),
            Variant::FastQuiet => Some(Agents::Fast {
                tc_encap: true,
                direct: false,
                events: false,
            }),
            Variant::FastVxlan => Some(Agents::Fast {
                tc_encap: false,
                direct: false,
                events: true,
            }),
            Variant::FastDirect => Some(Agents::Fast {
                tc_encap: true,
                direct: true,
                events: true,
            }),
            Variant::KernelDirect => Some(Agents::Kernel { direct: true }),
            // The references with no tc program attached anywhere; the
            // overlay one needs vxlan.1's routes, which direct routing
            // replaces.
            Variant::Underlay | Variant::Overlay | Variant::Kernel | Variant::Kernel6 => {
                Some(Agents::Kernel { direct: false })
            }
        }
    }

    pub(super) fn is_fast(self) -> bool {
        matches!(self.agents(), Some(Agents::Fast { .. }))
    }

    /// Whether the pods' traffic must bypass vxlan.1 entirely.
    pub(super) fn is_direct(self) -> bool {
        self.agents().is_some_and(Agents::direct)
    }

    /// Whether this variant measures pod -> pod (else a reference).
    pub(super) fn pod_to_pod(self) -> bool {
        matches!(
            self,
            Variant::Kernel
                | Variant::FastVxlan
                | Variant::Fast
                | Variant::KernelDirect
                | Variant::FastDirect
                | Variant::Kernel6
                | Variant::Fast6
                | Variant::FastQuiet
        )
    }

    /// The node rulesets this variant runs with: the pod rulesets are
    /// about forwarding pod traffic, which the pod variants do; the fast
    /// path via vxlan.1 is a reference for the tc encap and runs without,
    /// which keeps the bench's time in bounds. The IPv6 columns run
    /// without too: the rulesets are iptables (IPv4) rules, which IPv6
    /// traffic never walks, and ip6tables twins would add two columns'
    /// worth of time to say what the IPv4 rows already do.
    pub(super) fn rulesets(self) -> &'static [Rules] {
        match self {
            Variant::Kernel | Variant::Fast | Variant::KernelDirect | Variant::FastDirect => {
                &[Rules::None, Rules::KubeProxy, Rules::Synthetic]
            }
            Variant::Direct
            | Variant::Underlay
            | Variant::Overlay
            | Variant::FastVxlan
            | Variant::Kernel6
            | Variant::Fast6
            | Variant::FastQuiet => &[Rules::None],
        }
    }
}

/// Node `i`'s VTEP address: the lab gives it podCIDR 10.244.i.0/24, and the
/// agent puts the podCIDR's network address on vxlan.1 as a /32.
pub(super) fn vtep_address(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 244, i as u8, 0)
}

/// The first IPv4 address in `ip -4 -o addr show` output.
pub(super) fn first_inet(out: &str) -> Option<Ipv4Addr> {
    let mut words = out.split_whitespace();
    words.find(|w| *w == "inet")?;
    words.next()?.split('/').next()?.parse().ok()
}

/// The output device in `ip route get` output.
pub(super) fn route_dev(out: &str) -> Option<&str> {
    let mut words = out.split_whitespace();
    words.find(|w| *w == "dev")?;
    words.next()
}

/// Fails unless `ns` sends traffic for `ip` out of `dev`: a reference
/// measured over another path would be the floor of nothing.
pub(super) fn check_route(ns: &str, ip: IpAddr, dev: &str) -> Result<()> {
    let family = if ip.is_ipv6() { "-6" } else { "-4" };
    let out = sh("ip", &["-n", ns, family, "route", "get", &ip.to_string()])?;
    if route_dev(&out) != Some(dev) {
        bail!("{ns} does not route {ip} out of {dev}: {}", out.trim());
    }
    Ok(())
}

/// The direct-veth variant's two namespaces; deleted on drop.
pub(super) struct DirectVeth;

impl DirectVeth {
    pub(super) fn up() -> Result<DirectVeth> {
        let d = DirectVeth;
        for ns in [VETH_A, VETH_B] {
            sh("ip", &["netns", "add", ns])?;
            sh("ip", &["-n", ns, "link", "set", "lo", "up"])?;
        }
        sh(
            "ip",
            &[
                "-n", VETH_A, "link", "add", "eth0", "mtu", POD_MTU, "type", "veth", "peer",
                "name", "eth0", "mtu", POD_MTU, "netns", VETH_B,
            ],
        )?;
        for (ns, ip) in [(VETH_A, VETH_A_IP), (VETH_B, VETH_B_IP)] {
            sh(
                "ip",
                &["-n", ns, "addr", "add", &format!("{ip}/30"), "dev", "eth0"],
            )?;
            sh("ip", &["-n", ns, "link", "set", "eth0", "up"])?;
        }
        Ok(d)
    }

    pub(super) fn down() {
        for ns in [VETH_A, VETH_B] {
            if Path::new("/run/netns").join(ns).exists() {
                let _ = sh("ip", &["netns", "del", ns]);
            }
        }
    }
}

impl Drop for DirectVeth {
    fn drop(&mut self) {
        DirectVeth::down();
    }
}

/// Switches every agent to `agents` and waits until the fast path, if on,
/// has every pod and peer in its maps (the agent attaches new veths on a
/// pass), and the peers' routes are the ones `--direct-routing` asks for.
/// An agent that comes up on another datapath than asked (no eBPF object,
/// a load failure) fails the bench with its reason.
pub(super) fn switch(lab: &mut Lab, agents: Agents) -> Result<()> {
    let flags = agents.flags();
    let shown: Vec<String> = flags.iter().map(|(f, v)| format!("{f} {v}")).collect();
    eprintln!("bench: agents -> {}", shown.join(" "));
    lab.set_agent_flags(&flags)?;
    let s = lab.spec.clone();
    if let Agents::Fast { .. } = agents {
        for i in 1..=s.nodes {
            // The gauges count both families' maps (mycni_local and
            // mycni_local6, mycni_remote and mycni_remote6).
            let families = s.stack.families().len();
            let local = format!(
                "mycni_datapath_entries{{map=\"local\"}} {}",
                s.pods * families
            );
            let remote = format!(
                "mycni_datapath_entries{{map=\"remote\"}} {}",
                (s.nodes - 1) * families
            );
            crate::wait_for(
                &format!("{} to fill its fast-path maps", s.node_name(i)),
                Duration::from_secs(30),
                || {
                    lab.metrics(i)
                        .map(|m| m.lines().any(|l| l == local) && m.lines().any(|l| l == remote))
                        .unwrap_or(false)
                },
            )?;
        }
    }
    // The first pass after a restart replaces the previous agent's routes;
    // ready means it ran, but a column must not rest on that.
    let direct = agents.direct();
    let settled = crate::wait_for("the peers' routes", Duration::from_secs(10), || {
        lab.check_routing(direct).is_ok()
    });
    if settled.is_err() {
        lab.check_routing(direct)?;
    }
    wait_agents_idle(lab);
    Ok(())
}

/// CPU time (user + system, clock ticks) a process has used, from
/// /proc/<pid>/stat; None once it is gone.
fn cpu_ticks(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces: count from its ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15, the 12th and 13th after ')'.
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// Waits (at most 10 s) until the agents have been quiet for half a
/// second: a restarted agent lists Nodes, reconciles, loads and attaches
/// programs and fills maps, and on a 2-CPU machine that work landing in
/// the next column's first measure would be read as that datapath's cost.
pub(super) fn wait_agents_idle(lab: &Lab) {
    let pids: Vec<String> = (1..=lab.spec.nodes)
        .filter_map(|i| std::fs::read_to_string(lab.spec.node_dir(i).join("agent.pid")).ok())
        .map(|p| p.trim().to_string())
        .collect();
    let total = || pids.iter().filter_map(|p| cpu_ticks(p)).sum::<u64>();
    let start = std::time::Instant::now();
    let mut last = total();
    while start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(500));
        let now = total();
        // One tick is 10 ms at USER_HZ 100: under 2 % of a CPU.
        if now.saturating_sub(last) <= 1 {
            eprintln!(
                "bench: agents quiet after {:.1} s",
                start.elapsed().as_secs_f64()
            );
            return;
        }
        last = now;
    }
    eprintln!("bench: the agents are still busy after 10 s; measuring anyway");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_outputs_parse() {
        let addr = "7: vxlan.1    inet 10.244.2.0/32 scope global vxlan.1\\       valid_lft forever preferred_lft forever\n";
        assert_eq!(first_inet(addr), Some(vtep_address(2)));
        assert_eq!(first_inet(""), None);
        let get = "10.244.2.0 via 10.244.2.0 dev vxlan.1 src 10.244.1.0 uid 0 \n    cache \n";
        assert_eq!(route_dev(get), Some("vxlan.1"));
        let get = "192.168.77.12 dev eth0 src 192.168.77.11 uid 0 \n    cache \n";
        assert_eq!(route_dev(get), Some("eth0"));
        assert_eq!(route_dev("RTNETLINK answers: Network is unreachable"), None);
    }

    #[test]
    fn runs_alternate_and_switch_one_flag_at_a_time() {
        let even = Variant::run_order(0);
        let odd = Variant::run_order(1);
        assert_eq!(even[0], Variant::Direct);
        assert_eq!(odd[0], Variant::Direct);
        // An odd run starts where the even one before it ended.
        assert_eq!(odd[1], even[10]);
        let mut sorted = odd;
        sorted.sort();
        assert_eq!(sorted, Variant::ALL);
        // Five restarts per run: kernel, kernel direct, fast direct, fast
        // with events off, fast, fast via vxlan.1.
        let agents: Vec<Agents> = even.iter().filter_map(|v| v.agents()).collect();
        let switches = agents.windows(2).filter(|w| w[0] != w[1]).count();
        assert_eq!(switches, 5);
        assert!(Variant::FastDirect.is_direct() && Variant::KernelDirect.is_direct());
        assert!(!Variant::Overlay.is_direct() && !Variant::Fast.is_direct());
        // The IPv6 columns: the IPv4 twins' agents, pod to pod, no rules.
        assert_eq!(Variant::Fast6.agents(), Variant::Fast.agents());
        assert_eq!(Variant::Kernel6.agents(), Variant::Kernel.agents());
        assert!(Variant::Fast6.is_fast() && !Variant::Kernel6.is_fast());
        assert!(Variant::Fast6.pod_to_pod() && Variant::Kernel6.pod_to_pod());
        assert_eq!(Variant::Fast6.rulesets(), &[Rules::None]);
        assert_eq!(Variant::Kernel6.family(), IpFamily::V6);
        assert_eq!(Variant::Kernel.family(), IpFamily::V4);
        assert_eq!(
            Variant::FastDirect.agents().map(Agents::flags),
            Some(vec![
                ("--datapath", "ebpf"),
                ("--tc-encap", "true"),
                ("--direct-routing", "true"),
                ("--flow-events", "true")
            ])
        );
    }

    #[test]
    fn cpu_ticks_read_this_process() {
        let me = std::process::id().to_string();
        assert!(cpu_ticks(&me).is_some());
        assert_eq!(cpu_ticks("0"), None);
    }
}
