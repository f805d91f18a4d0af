//! NetworkPolicy truth tables on the lab, as the upstream `Netpol` suite
//! builds them: every model pod probes every other one, on TCP and UDP, on
//! 80 and 81, by pod IP and through its Service's ClusterIP, on each family
//! the lab has; the outcome is a reachability table per (protocol, port,
//! family, path), compared with an expected one (the diagonal ignored).
//!
//! - this file: expectations ([`Reach`], [`Expect`]), a case's steps
//!   ([`Action`], [`Step`], [`Case`]) and the objects they leave in the API
//!   ([`World`]), pure;
//! - `cases`: the upstream cases of `shared/notes/networkpolicy.md`;
//! - `table`: observed tables, the comparison, how they print;
//! - `run`: probing the lab, applying a case's steps through the API
//!   fixture, settling;
//! - `suite`: every case in phases (node rows, a pod added), as
//!   `cargo xtask lab netpol` and the e2e tests run them.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::model::{NAMESPACES, Proto, namespace_labels, namespace_object, pod_object};
use crate::{IpFamily, Pod, Spec, pod_label};

pub mod cases;
pub mod run;
pub mod suite;
pub mod table;

pub use run::{CaseReport, ProbeSet, StepReport};
pub use table::{Comparison, Observed};

/// How a probe reaches its destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Via {
    PodIp,
    Service,
}

impl Via {
    pub fn label(self) -> &'static str {
        match self {
            Via::PodIp => "pod IP",
            Via::Service => "Service",
        }
    }
}

/// One column of the truth tables: what a probe is, apart from its ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Column {
    pub proto: Proto,
    /// The nominal port: the number in the port's name (`serve-80-tcp`),
    /// which a pod may map to another number.
    pub port: u16,
    pub family: IpFamily,
    pub via: Via,
}

impl std::fmt::Display for Column {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{} {} via {}",
            self.proto.api(),
            self.port,
            self.family,
            self.via.label()
        )
    }
}

/// "*" anything, "x/*" every pod of x, "x/a" one pod, "node1" a node.
pub fn pattern_matches(pattern: &str, who: &str) -> bool {
    if pattern == "*" {
        return true;
    }
    match pattern.strip_suffix("/*") {
        Some(ns) => who.split_once('/').map(|(n, _)| n) == Some(ns),
        None => pattern == who,
    }
}

/// An expected reachability table, written as upstream's `reachability.go`
/// builds them: a default, then (source, destination) patterns, later ones
/// winning. Independent of which pods exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reach {
    default: bool,
    rules: Vec<(String, String, bool)>,
}

impl Reach {
    pub fn all(v: bool) -> Reach {
        Reach {
            default: v,
            rules: Vec::new(),
        }
    }

    pub fn expect(mut self, src: &str, dst: &str, v: bool) -> Reach {
        self.rules.push((src.to_string(), dst.to_string(), v));
        self
    }

    pub fn get(&self, src: &str, dst: &str) -> bool {
        self.rules
            .iter()
            .rev()
            .find(|(s, d, _)| pattern_matches(s, src) && pattern_matches(d, dst))
            .map_or(self.default, |r| r.2)
    }
}

/// Which columns an override of [`Expect`] covers (None: any).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct On {
    pub proto: Option<Proto>,
    pub port: Option<u16>,
    pub family: Option<IpFamily>,
}

impl On {
    pub fn covers(&self, c: &Column) -> bool {
        self.proto.is_none_or(|p| p == c.proto)
            && self.port.is_none_or(|p| p == c.port)
            && self.family.is_none_or(|f| f == c.family)
    }
}

/// The expected tables of every column: a table for all, and overrides
/// for some protocols, ports or families (the last that covers wins).
/// Pod IP and Service columns always expect the same: policy judges the
/// backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expect {
    pub all: Reach,
    pub on: Vec<(On, Reach)>,
}

impl Expect {
    pub fn get(&self, c: &Column) -> &Reach {
        self.on
            .iter()
            .rev()
            .find(|(on, _)| on.covers(c))
            .map_or(&self.all, |(_, r)| r)
    }
}

impl From<Reach> for Expect {
    fn from(all: Reach) -> Expect {
        Expect {
            all,
            on: Vec::new(),
        }
    }
}

/// A change a step makes through the API, as kubectl would.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Create or replace a NetworkPolicy (`kubectl apply`).
    Apply {
        ns: String,
        name: String,
        spec: Value,
    },
    Delete {
        ns: String,
        name: String,
    },
    /// `kubectl label pod` (None removes the label).
    LabelPod {
        ns: String,
        name: String,
        key: String,
        value: Option<String>,
    },
    /// `kubectl label namespace`.
    LabelNamespace {
        ns: String,
        key: String,
        value: Option<String>,
    },
}

impl Action {
    pub fn apply(ns: &str, name: &str, spec: Value) -> Action {
        Action::Apply {
            ns: ns.into(),
            name: name.into(),
            spec,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Action::Apply { ns, name, .. } => format!("apply {ns}/{name}"),
            Action::Delete { ns, name } => format!("delete {ns}/{name}"),
            Action::LabelPod {
                ns,
                name,
                key,
                value,
            } => format!("label pod {ns}/{name} {}", label_arg(key, value)),
            Action::LabelNamespace { ns, key, value } => {
                format!("label namespace {ns} {}", label_arg(key, value))
            }
        }
    }
}

fn label_arg(key: &str, value: &Option<String>) -> String {
    match value {
        Some(v) => format!("{key}={v}"),
        None => format!("{key}-"),
    }
}

/// A step: actions, then the tables they must lead to.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub actions: Vec<Action>,
    pub expect: Expect,
}

/// A case: steps in order; what it applied is deleted after it, and its
/// relabels end where they started.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    pub name: String,
    pub steps: Vec<Step>,
}

impl Case {
    pub fn new(name: &str) -> Case {
        Case {
            name: name.to_string(),
            steps: Vec::new(),
        }
    }

    /// One step with these policies and this expectation.
    pub fn one(name: &str, policies: Vec<Action>, expect: impl Into<Expect>) -> Case {
        Case::new(name).step(policies, expect)
    }

    pub fn step(mut self, actions: Vec<Action>, expect: impl Into<Expect>) -> Case {
        self.steps.push(Step {
            actions,
            expect: expect.into(),
        });
        self
    }

    /// Every policy the case applies, to delete after it.
    pub fn policies(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for a in self.steps.iter().flat_map(|s| &s.actions) {
            if let Action::Apply { ns, name, .. } = a
                && !out.iter().any(|(n, m)| n == ns && m == name)
            {
                out.push((ns.clone(), name.clone()));
            }
        }
        out
    }
}

/// A NetworkPolicy object.
pub fn policy_object(ns: &str, name: &str, spec: &Value) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"namespace": ns, "name": name}, "spec": spec})
}

/// The objects a case's steps leave in the API, kept beside the fixture
/// so a test can judge them with another evaluator (the agent's
/// `cluster::allowed`) without reading them back.
#[derive(Debug, Clone, Default)]
pub struct World {
    pub namespaces: BTreeMap<String, Value>,
    /// By `x/a`.
    pub pods: BTreeMap<String, Value>,
    /// By `x/name`.
    pub policies: BTreeMap<String, Value>,
}

impl World {
    /// The model's namespaces and the lab's pods with a Kubernetes side,
    /// as the lab created them (status included).
    pub fn of_lab(spec: &Spec, pods: &[Pod]) -> World {
        let mut w = World::default();
        for ns in NAMESPACES {
            w.namespaces
                .insert(ns.to_string(), namespace_object(ns, &namespace_labels(ns)));
        }
        for p in pods {
            let Some(k) = &p.kube else { continue };
            w.namespaces
                .entry(k.namespace.clone())
                .or_insert_with(|| namespace_object(&k.namespace, &namespace_labels(&k.namespace)));
            let mut obj = pod_object(k, &spec.node_name(p.node));
            obj["status"] = crate::model::pod_status(p)["status"].clone();
            w.pods.insert(pod_label(p), obj);
        }
        w
    }

    pub fn apply(&mut self, a: &Action) {
        match a {
            Action::Apply { ns, name, spec } => {
                self.policies
                    .insert(format!("{ns}/{name}"), policy_object(ns, name, spec));
            }
            Action::Delete { ns, name } => {
                self.policies.remove(&format!("{ns}/{name}"));
            }
            Action::LabelPod {
                ns,
                name,
                key,
                value,
            } => {
                if let Some(p) = self.pods.get_mut(&format!("{ns}/{name}")) {
                    set_label(p, key, value);
                }
            }
            Action::LabelNamespace { ns, key, value } => {
                if let Some(n) = self.namespaces.get_mut(ns) {
                    set_label(n, key, value);
                }
            }
        }
    }
}

fn set_label(obj: &mut Value, key: &str, value: &Option<String>) {
    let labels = &mut obj["metadata"]["labels"];
    if !labels.is_object() {
        *labels = json!({});
    }
    if let Some(m) = labels.as_object_mut() {
        match value {
            Some(v) => {
                m.insert(key.to_string(), Value::String(v.clone()));
            }
            None => {
                m.remove(key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_patterns_win_and_overrides_pick_columns() {
        let r = Reach::all(true)
            .expect("*", "x/*", false)
            .expect("y/*", "x/a", true);
        assert!(!r.get("z/b", "x/b"));
        assert!(r.get("y/c", "x/a"));
        assert!(!r.get("z/c", "x/a"));
        assert!(r.get("x/a", "y/b"));
        assert!(!r.get("node1", "x/a"));
        let e = Expect {
            all: Reach::all(false),
            on: vec![(
                On {
                    proto: Some(Proto::Tcp),
                    port: Some(81),
                    ..On::default()
                },
                Reach::all(true),
            )],
        };
        let col = |proto, port| Column {
            proto,
            port,
            family: IpFamily::V6,
            via: Via::Service,
        };
        assert!(e.get(&col(Proto::Tcp, 81)).get("a/a", "b/b"));
        assert!(!e.get(&col(Proto::Udp, 81)).get("a/a", "b/b"));
    }

    #[test]
    fn the_world_follows_actions() {
        let mut w = World::default();
        w.namespaces
            .insert("y".into(), namespace_object("y", &namespace_labels("y")));
        w.apply(&Action::LabelNamespace {
            ns: "y".into(),
            key: "team".into(),
            value: Some("blue".into()),
        });
        assert_eq!(w.namespaces["y"]["metadata"]["labels"]["team"], "blue");
        w.apply(&Action::apply("x", "p", json!({"podSelector": {}})));
        assert_eq!(w.policies["x/p"]["kind"], "NetworkPolicy");
        w.apply(&Action::Delete {
            ns: "x".into(),
            name: "p".into(),
        });
        assert!(w.policies.is_empty());
    }
}
