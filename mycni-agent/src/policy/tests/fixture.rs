//! Expected reachability tables over the upstream model
//! (`crate::cluster::fixture`), written the way `reachability.go` builds
//! them, checked against both the reference evaluator and the compiled
//! form.

use std::collections::BTreeMap;

pub use crate::cluster::fixture::*;
use crate::cluster::{Cluster, Endpoint, Key, Protocol, allowed};
use crate::policy::compile_pod;

/// Expected reachability between the nine pods; the diagonal is ignored,
/// as upstream does.
#[derive(Debug, Clone, PartialEq)]
pub struct Reach(BTreeMap<(String, String), bool>);

fn all_pods() -> Vec<String> {
    NAMESPACES
        .iter()
        .flat_map(|n| PODS.iter().map(move |p| format!("{n}/{p}")))
        .collect()
}

/// "*" every pod, "x/*" every pod of x, "x/a" one pod.
fn pattern_matches(pattern: &str, pod: &str) -> bool {
    match pattern.strip_suffix("/*") {
        _ if pattern == "*" => true,
        Some(ns) => pod.split('/').next() == Some(ns),
        None => pattern == pod,
    }
}

impl Reach {
    pub fn all(v: bool) -> Reach {
        let pods = all_pods();
        let mut m = BTreeMap::new();
        for s in &pods {
            for d in pods.iter().filter(|d| *d != s) {
                m.insert((s.clone(), d.clone()), v);
            }
        }
        Reach(m)
    }

    /// Sets every (src, dst) pair matching both patterns; later calls win,
    /// like `ExpectPeer`.
    pub fn expect(mut self, src: &str, dst: &str, v: bool) -> Reach {
        for ((s, d), val) in self.0.iter_mut() {
            if pattern_matches(src, s) && pattern_matches(dst, d) {
                *val = v;
            }
        }
        self
    }

    fn render(&self) -> String {
        let pods = all_pods();
        let mut out = String::from("    ");
        for d in &pods {
            out.push_str(&format!("{d} "));
        }
        for s in &pods {
            out.push_str(&format!("\n{s} "));
            for d in &pods {
                let cell = match self.0.get(&(s.clone(), d.clone())) {
                    None => "  - ",
                    Some(true) => "  . ",
                    Some(false) => "  X ",
                };
                out.push_str(cell);
            }
        }
        out
    }
}

fn key_of(pod: &str) -> Key {
    let (ns, name) = pod.split_once('/').unwrap_or((pod, ""));
    Key::new(ns, name)
}

/// Probes every pair with both the reference evaluator and the compiled
/// form (they must agree on every cell), and returns the observed table.
pub fn probe(c: &Cluster, protocol: Protocol, port: u16, v6: bool) -> Reach {
    let mut observed = Reach::all(true);
    for ((s, d), cell) in observed.0.iter_mut() {
        let (sk, dk) = (key_of(s), key_of(d));
        let (sip, dip) = (
            pod_ip(&sk.namespace, &sk.name, v6),
            pod_ip(&dk.namespace, &dk.name, v6),
        );
        let src = Endpoint::Pod {
            pod: sk.clone(),
            ip: sip,
        };
        let dst = Endpoint::Pod {
            pod: dk.clone(),
            ip: dip,
        };
        let reference = allowed(c, &src, &dst, protocol, port).is_allowed();
        let compiled = compile_pod(c, &c.pods[&sk])
            .egress
            .admits(dip, protocol, port)
            && compile_pod(c, &c.pods[&dk])
                .ingress
                .admits(sip, protocol, port);
        assert_eq!(
            reference, compiled,
            "evaluator and compiled form disagree on {s} -> {d} {protocol:?}/{port}"
        );
        *cell = reference;
    }
    observed
}

/// Asserts the table for one protocol/port on one family, printing both
/// tables (`.` allowed, `X` denied) when they differ.
pub fn check(c: &Cluster, protocol: Protocol, port: u16, v6: bool, want: &Reach) {
    let got = probe(c, protocol, port, v6);
    assert!(
        &got == want,
        "{protocol:?}/{port} v6={v6}\nexpected:\n{}\nobserved:\n{}",
        want.render(),
        got.render()
    );
}

/// The common case: the same expectation on TCP 80 and 81 over IPv4.
pub(crate) fn check_tcp(c: &Cluster, want: &Reach) {
    for port in [80, 81] {
        check(c, Protocol::Tcp, port, false, want);
    }
}
