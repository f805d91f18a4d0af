//! The node rulesets: kube-proxy's for N Services and a synthetic FORWARD
//! chain, pure functions of their size (tested without root), and their
//! installation in the node namespaces.

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use mycni_testkit::sh;

use super::{CLUSTER_CIDR, Options};

/// A ruleset to install with `iptables-restore` in every node namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rules {
    None,
    KubeProxy,
    Synthetic,
}

impl Rules {
    pub(super) fn label(self, o: &Options) -> String {
        match self {
            Rules::None => "none".into(),
            Rules::KubeProxy => format!("kube-proxy, {} svc", o.services),
            Rules::Synthetic => format!("synthetic, {} FORWARD", o.synthetic_rules),
        }
    }
}

/// A kube-proxy chain suffix: 16 characters of base32 like kube-proxy's
/// (which hashes the service port name with SHA-256); here a fixed mix of
/// the indices, so the ruleset is deterministic.
pub(super) fn chain_id(kind: u64, service: usize, endpoint: usize) -> String {
    pub(super) const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut x = (kind << 56) ^ ((service as u64) << 8) ^ endpoint as u64;
    let mut out = String::with_capacity(16);
    for _ in 0..2 {
        // splitmix64
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        for k in 0..8 {
            out.push(ALPHABET[((z >> (5 * k)) & 31) as usize] as char);
        }
    }
    out
}

/// Service `k`'s ClusterIP: 10.96.0.10 upwards, never a pod address.
pub fn cluster_ip(k: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 10)) + k as u32)
}

/// What kube-proxy in iptables mode (1.28-style) writes for `services`
/// ClusterIP Services with `endpoints` ready endpoints each: nat
/// KUBE-SERVICES with one rule per ClusterIP:port jumping to a KUBE-SVC-*
/// chain, which masquerade-marks traffic from outside the cluster CIDR and
/// picks a KUBE-SEP-* chain with `statistic --mode random`; each KUBE-SEP-*
/// marks hairpin traffic and DNATs. Filter: KUBE-FORWARD (drop INVALID,
/// accept marked and established), the NEW-only service, external-service
/// and load-balancer-firewall jumps, KUBE-NODEPORTS and KUBE-FIREWALL.
pub fn kube_proxy_ruleset(services: usize, endpoints: usize) -> String {
    let mut s = String::new();
    let w = &mut s;
    // writeln! into a String cannot fail.
    let _ = writeln!(w, "*filter");
    for c in [
        "KUBE-EXTERNAL-SERVICES",
        "KUBE-FIREWALL",
        "KUBE-FORWARD",
        "KUBE-KUBELET-CANARY",
        "KUBE-NODEPORTS",
        "KUBE-PROXY-CANARY",
        "KUBE-PROXY-FIREWALL",
        "KUBE-SERVICES",
    ] {
        let _ = writeln!(w, ":{c} - [0:0]");
    }
    for r in [
        "-A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL",
        "-A INPUT -m comment --comment \"kubernetes health check service ports\" -j KUBE-NODEPORTS",
        "-A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES",
        "-A INPUT -j KUBE-FIREWALL",
        "-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL",
        "-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD",
        "-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
        "-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES",
        "-A OUTPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL",
        "-A OUTPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
        "-A OUTPUT -j KUBE-FIREWALL",
        "-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment \"block incoming localnet connections\" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP",
        "-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP",
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark 0x4000/0x4000 -j ACCEPT",
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
    ] {
        let _ = writeln!(w, "{r}");
    }
    let _ = writeln!(w, "COMMIT");

    let _ = writeln!(w, "*nat");
    for c in [
        "KUBE-MARK-MASQ",
        "KUBE-NODEPORTS",
        "KUBE-POSTROUTING",
        "KUBE-SERVICES",
    ] {
        let _ = writeln!(w, ":{c} - [0:0]");
    }
    for k in 0..services {
        let _ = writeln!(w, ":KUBE-SVC-{} - [0:0]", chain_id(1, k, 0));
        for e in 0..endpoints {
            let _ = writeln!(w, ":KUBE-SEP-{} - [0:0]", chain_id(2, k, e));
        }
    }
    for r in [
        "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
        "-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
        "-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING",
        "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000",
        "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
        "-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0",
        "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully",
    ] {
        let _ = writeln!(w, "{r}");
    }
    for k in 0..services {
        let ip = cluster_ip(k);
        let port = if k % 2 == 0 { 80 } else { 443 };
        let target = 8000 + (k % 1000);
        let name = format!("bench/svc-{k}:web");
        let svc = chain_id(1, k, 0);
        let _ = writeln!(
            w,
            "-A KUBE-SERVICES -d {ip}/32 -p tcp -m comment --comment \"{name} cluster IP\" -m tcp --dport {port} -j KUBE-SVC-{svc}"
        );
        let _ = writeln!(
            w,
            "-A KUBE-SVC-{svc} ! -s {CLUSTER_CIDR} -d {ip}/32 -p tcp -m comment --comment \"{name} cluster IP\" -m tcp --dport {port} -j KUBE-MARK-MASQ"
        );
        for e in 0..endpoints {
            // Endpoints spread over the nodes' podCIDRs, away from the
            // low addresses the lab's pods get.
            let ep = Ipv4Addr::new(10, 244, 1 + (e % 2) as u8, 100 + ((k + e) % 150) as u8);
            let sep = chain_id(2, k, e);
            let left = endpoints - e;
            if left > 1 {
                let _ = writeln!(
                    w,
                    "-A KUBE-SVC-{svc} -m comment --comment \"{name} -> {ep}:{target}\" -m statistic --mode random --probability {:.11} -j KUBE-SEP-{sep}",
                    1.0 / left as f64
                );
            } else {
                let _ = writeln!(
                    w,
                    "-A KUBE-SVC-{svc} -m comment --comment \"{name} -> {ep}:{target}\" -j KUBE-SEP-{sep}"
                );
            }
            let _ = writeln!(
                w,
                "-A KUBE-SEP-{sep} -s {ep}/32 -m comment --comment \"{name}\" -j KUBE-MARK-MASQ"
            );
            let _ = writeln!(
                w,
                "-A KUBE-SEP-{sep} -p tcp -m comment --comment \"{name}\" -m tcp -j DNAT --to-destination {ep}:{target}"
            );
        }
    }
    let _ = writeln!(
        w,
        "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"
    );
    let _ = writeln!(w, "COMMIT");
    s
}

/// Synthetic: `n` filter FORWARD rules that never match pod-to-pod
/// traffic (per-ClusterIP port filters), so every forwarded packet walks
/// all of them; the kind of per-packet cost kube-proxy's rules do not have.
pub fn synthetic_ruleset(n: usize) -> String {
    let mut s = String::from("*filter\n");
    for k in 0..n {
        let _ = writeln!(
            s,
            "-A FORWARD -d {}/32 -p tcp -m comment --comment \"mycni-bench synthetic {k}\" -m tcp --dport 80 -j DROP",
            cluster_ip(k)
        );
    }
    s.push_str("COMMIT\n");
    s
}

/// Rules (`-A` lines) in an iptables-restore file.
pub fn rule_count(ruleset: &str) -> usize {
    ruleset.lines().filter(|l| l.starts_with("-A ")).count()
}

pub(super) fn ns_cmd(ns: &str, program: &str) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, program]);
    c
}

pub(super) fn nft_tables(ns: &str) -> Result<Vec<String>> {
    let out = sh("ip", &["netns", "exec", ns, "nft", "list", "tables"])?;
    Ok(out
        .lines()
        .filter_map(|l| l.strip_prefix("table "))
        .map(|t| t.trim().to_string())
        .collect())
}

/// A ruleset installed in every node namespace; removing it deletes the
/// iptables-nft tables it created (the agent's own `ip mycni` table stays).
pub(super) struct Installed {
    /// (node namespace, tables this install created)
    pub(super) nodes: Vec<(String, Vec<String>)>,
}

impl Installed {
    pub(super) fn install(
        node_namespaces: &[String],
        ruleset: &str,
    ) -> Result<(Installed, Duration)> {
        let mut inst = Installed { nodes: vec![] };
        let start = Instant::now();
        for ns in node_namespaces {
            let before = nft_tables(ns)?;
            for t in ["ip nat", "ip filter"] {
                if before.iter().any(|b| b == t) {
                    bail!("{ns} already has table {t}: the bench only adds rules to clean nodes");
                }
            }
            // Record before installing: a half-applied restore is removed too.
            inst.nodes.push((ns.clone(), vec![]));
            let mut child = ns_cmd(ns, "iptables-restore")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .context("running iptables-restore (is iptables installed?)")?;
            if let Some(mut w) = child.stdin.take() {
                w.write_all(ruleset.as_bytes())?;
            }
            let out = child.wait_with_output()?;
            let after = nft_tables(ns)?;
            if let Some(last) = inst.nodes.last_mut() {
                last.1 = after.into_iter().filter(|t| !before.contains(t)).collect();
            }
            if !out.status.success() {
                let err = String::from_utf8_lossy(&out.stderr).into_owned();
                inst.remove();
                bail!("iptables-restore in {ns}: {err}");
            }
        }
        Ok((inst, start.elapsed()))
    }

    pub(super) fn remove(&mut self) {
        for (ns, tables) in self.nodes.drain(..) {
            for t in tables {
                let mut args = vec!["netns", "exec", &ns, "nft", "delete", "table"];
                args.extend(t.split_whitespace());
                if let Err(e) = sh("ip", &args) {
                    eprintln!("bench: removing table {t} in {ns}: {e:#}");
                }
            }
        }
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        self.remove();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_proxy_ruleset_has_kube_proxys_shape() {
        let r = kube_proxy_ruleset(100, 2);
        // Per service: KUBE-SERVICES jump, masquerade mark, 2 x (statistic
        // or final jump, hairpin mark, DNAT) = 8; plus 15 filter and 8 nat
        // fixed rules.
        assert_eq!(rule_count(&r), 100 * 8 + 15 + 8);
        assert_eq!(
            r.matches("--mode random --probability 0.50000000000")
                .count(),
            100
        );
        assert_eq!(r.matches("-j DNAT --to-destination 10.244.").count(), 200);
        assert!(r.contains("-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP"));
        assert_eq!(r.matches("COMMIT").count(), 2);
        // Every chain jumped to is declared.
        for l in r.lines().filter(|l| l.starts_with("-A ")) {
            if let Some(target) = l.split(" -j ").nth(1) {
                let chain = target.split_whitespace().next().expect("target");
                if chain.starts_with("KUBE-") {
                    assert!(r.contains(&format!(":{chain} - [0:0]")), "{chain}");
                }
            }
        }
    }

    #[test]
    fn chain_names_are_distinct_and_kube_proxy_like() {
        let r = kube_proxy_ruleset(2000, 2);
        let decl: Vec<&str> = r
            .lines()
            .filter(|l| l.starts_with(":KUBE-SVC-") || l.starts_with(":KUBE-SEP-"))
            .collect();
        assert_eq!(decl.len(), 2000 * 3);
        let set: std::collections::BTreeSet<&str> = decl.iter().copied().collect();
        assert_eq!(set.len(), decl.len());
        let id = chain_id(1, 7, 0);
        assert_eq!(id.len(), 16);
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_uppercase() || (b'2'..=b'7').contains(&b))
        );
        // iptables caps chain names at 28 characters.
        assert!(format!("KUBE-SEP-{id}").len() <= 28);
    }

    #[test]
    fn cluster_ips_stay_out_of_the_pod_cidr() {
        for k in [0, 1, 1999, 59_999] {
            let ip = cluster_ip(k).octets();
            assert_eq!((ip[0], ip[1]), (10, 96), "{k}");
        }
    }

    #[test]
    fn synthetic_ruleset_is_n_forward_rules() {
        let r = synthetic_ruleset(50);
        assert_eq!(rule_count(&r), 50);
        assert!(
            r.lines()
                .filter(|l| l.starts_with("-A "))
                .all(|l| l.starts_with("-A FORWARD -d 10.96."))
        );
    }
}
