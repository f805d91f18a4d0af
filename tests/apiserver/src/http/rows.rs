//! Each kind's table columns and cells, as the real server's printers
//! (pkg/printers/internalversion/printers.go) fill them.

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use serde_json::{Value, json};

use crate::store::{Kind, Stored, now_secs};

/// A column: name, format, priority (1: only with `-o wide`), description.
type Column = (&'static str, &'static str, u8, &'static str);

const NAME: Column = ("Name", "name", 0, "Name must be unique within a namespace.");
const AGE: Column = (
    "Age",
    "",
    0,
    "CreationTimestamp is a timestamp representing the server time when this object was created.",
);

pub(super) fn columns(kind: Kind) -> Vec<Column> {
    match kind {
        Kind::Node => vec![
            NAME,
            ("Status", "", 0, "The status of the node"),
            ("Roles", "", 0, "The roles of the node"),
            AGE,
            ("Version", "", 0, "Kubelet Version reported by the node."),
            (
                "Internal-IP",
                "",
                1,
                "List of addresses reachable to the node. Queried from cloud provider, if available.",
            ),
            (
                "External-IP",
                "",
                1,
                "List of addresses reachable to the node. Queried from cloud provider, if available.",
            ),
            (
                "OS-Image",
                "",
                1,
                "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy)).",
            ),
            (
                "Kernel-Version",
                "",
                1,
                "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64).",
            ),
            (
                "Container-Runtime",
                "",
                1,
                "ContainerRuntime Version reported by the node through runtime remote API (e.g. containerd://1.4.2).",
            ),
        ],
        Kind::Namespace => vec![NAME, ("Status", "", 0, "The status of the namespace"), AGE],
        Kind::Pod => vec![
            NAME,
            (
                "Ready",
                "",
                0,
                "The aggregate readiness state of this pod for accepting traffic.",
            ),
            (
                "Status",
                "",
                0,
                "The aggregate status of the containers in this pod.",
            ),
            (
                "Restarts",
                "",
                0,
                "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.",
            ),
            AGE,
            (
                "IP",
                "",
                1,
                "IP address allocated to the pod. Routable at least within the cluster. Empty if not yet allocated.",
            ),
            (
                "Node",
                "",
                1,
                "NodeName is a request to schedule this pod onto a specific node.",
            ),
            (
                "Nominated Node",
                "",
                1,
                "nominatedNodeName is set only when this pod preempts other pods on the node.",
            ),
            (
                "Readiness Gates",
                "",
                1,
                "If specified, all readiness gates will be evaluated for pod readiness.",
            ),
        ],
        Kind::Event => vec![
            NAME,
            ("Reason", "", 0, "Why the action was taken."),
            (
                "Note",
                "",
                0,
                "A human-readable description of the status of this operation.",
            ),
            AGE,
        ],
        Kind::NetworkPolicy => vec![
            NAME,
            (
                "Pod-Selector",
                "",
                0,
                "Selects the pods to which this NetworkPolicy object applies.",
            ),
            AGE,
        ],
    }
}

/// `kubectl`'s age format.
fn human_age(secs: i64) -> String {
    let s = secs.max(0);
    match s {
        0..120 => format!("{s}s"),
        120..600 => format!("{}m{}s", s / 60, s % 60),
        600..10_800 => format!("{}m", s / 60),
        10_800..28_800 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        28_800..172_800 => format!("{}h", s / 3600),
        172_800..691_200 => format!("{}d{}h", s / 86_400, (s % 86_400) / 3600),
        691_200..63_072_000 => format!("{}d", s / 86_400),
        _ => format!("{}y{}d", s / 31_536_000, (s % 31_536_000) / 86_400),
    }
}

fn age(t: Option<&Time>) -> String {
    t.map_or("<unknown>".to_string(), |t| {
        human_age(now_secs() - t.0.as_second())
    })
}

fn or_none(s: Option<&str>) -> String {
    s.filter(|s| !s.is_empty()).unwrap_or("<none>").to_string()
}

/// A row's cells, or `None` if the stored object does not decode.
pub(super) fn cells(obj: &Stored) -> Option<Vec<Value>> {
    Some(match obj.kind {
        Kind::Node => node_cells(&obj.typed()?, obj),
        Kind::Namespace => {
            let ns: Namespace = obj.typed()?;
            let phase = ns.status.as_ref().and_then(|s| s.phase.clone());
            vec![
                json!(obj.name),
                json!(phase.unwrap_or_default()),
                json!(age(ns.metadata.creation_timestamp.as_ref())),
            ]
        }
        Kind::Pod => pod_cells(&obj.typed()?, obj),
        Kind::Event => {
            let ev: k8s_openapi::api::events::v1::Event = obj.typed()?;
            vec![
                json!(obj.name),
                json!(ev.reason.unwrap_or_default()),
                json!(ev.note.unwrap_or_default()),
                json!(age(ev.metadata.creation_timestamp.as_ref())),
            ]
        }
        Kind::NetworkPolicy => {
            let np: NetworkPolicy = obj.typed()?;
            let sel = np.spec.as_ref().and_then(|s| s.pod_selector.as_ref());
            vec![
                json!(obj.name),
                json!(format_selector(sel)),
                json!(age(np.metadata.creation_timestamp.as_ref())),
            ]
        }
    })
}

/// `metav1.FormatLabelSelector`: requirements sorted by key, `<none>` for
/// the empty selector (which selects everything).
fn format_selector(sel: Option<&LabelSelector>) -> String {
    let Some(sel) = sel else {
        return "<none>".into();
    };
    let mut reqs: Vec<(String, String)> = Vec::new();
    for (k, v) in sel.match_labels.iter().flatten() {
        reqs.push((k.clone(), format!("{k}={v}")));
    }
    for e in sel.match_expressions.iter().flatten() {
        let mut values = e.values.clone().unwrap_or_default();
        values.sort();
        let k = &e.key;
        let text = match e.operator.as_str() {
            "In" => format!("{k} in ({})", values.join(",")),
            "NotIn" => format!("{k} notin ({})", values.join(",")),
            "Exists" => k.clone(),
            "DoesNotExist" => format!("!{k}"),
            other => format!("{k} {other} ({})", values.join(",")),
        };
        reqs.push((k.clone(), text));
    }
    if reqs.is_empty() {
        return "<none>".into();
    }
    reqs.sort();
    reqs.into_iter()
        .map(|(_, t)| t)
        .collect::<Vec<_>>()
        .join(",")
}

/// `printPod`, without the restart times and sidecar details.
fn pod_cells(pod: &Pod, obj: &Stored) -> Vec<Value> {
    let status = pod.status.as_ref();
    let containers = pod.spec.as_ref().map_or(0, |s| s.containers.len());
    let statuses = status
        .and_then(|s| s.container_statuses.clone())
        .unwrap_or_default();
    let ready = statuses.iter().filter(|c| c.ready).count();
    let restarts: i32 = statuses.iter().map(|c| c.restart_count).sum();
    let mut reason = status
        .and_then(|s| s.reason.clone().or_else(|| s.phase.clone()))
        .unwrap_or_default();
    for c in &statuses {
        let state = c.state.as_ref();
        if let Some(r) = state
            .and_then(|s| s.waiting.as_ref())
            .and_then(|w| w.reason.clone())
            .or_else(|| {
                state
                    .and_then(|s| s.terminated.as_ref())
                    .and_then(|t| t.reason.clone())
            })
        {
            reason = r;
        }
    }
    if pod.metadata.deletion_timestamp.is_some() {
        reason = "Terminating".into();
    }
    vec![
        json!(obj.name),
        json!(format!("{ready}/{containers}")),
        json!(reason),
        json!(restarts.to_string()),
        json!(age(pod.metadata.creation_timestamp.as_ref())),
        json!(or_none(status.and_then(|s| s.pod_ip.as_deref()))),
        json!(or_none(
            pod.spec.as_ref().and_then(|s| s.node_name.as_deref())
        )),
        json!(or_none(
            status.and_then(|s| s.nominated_node_name.as_deref())
        )),
        json!("<none>"),
    ]
}

fn node_cells(node: &Node, obj: &Stored) -> Vec<Value> {
    let status = node.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
    let mut state = match ready.map(|c| c.status.as_str()) {
        Some("True") => "Ready".to_string(),
        Some("False") => "NotReady".to_string(),
        _ => "Unknown".to_string(),
    };
    if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
        state.push_str(",SchedulingDisabled");
    }
    let mut roles: Vec<String> = obj
        .labels
        .iter()
        .filter_map(|(k, v)| {
            if let Some(r) = k.strip_prefix("node-role.kubernetes.io/") {
                (!r.is_empty()).then(|| r.to_string())
            } else if k == "kubernetes.io/role" && !v.is_empty() {
                Some(v.clone())
            } else {
                None
            }
        })
        .collect();
    roles.sort();
    roles.dedup();
    let roles = if roles.is_empty() {
        "<none>".to_string()
    } else {
        roles.join(",")
    };
    let info = status.and_then(|s| s.node_info.as_ref());
    let address = |kind: &str| {
        status
            .and_then(|s| s.addresses.as_ref())
            .and_then(|a| a.iter().find(|a| a.type_ == kind))
            .map_or("<none>".to_string(), |a| a.address.clone())
    };
    let or_unknown = |s: Option<&String>| {
        s.filter(|s| !s.is_empty())
            .cloned()
            .unwrap_or_else(|| "<unknown>".to_string())
    };
    vec![
        json!(obj.name),
        json!(state),
        json!(roles),
        json!(age(node.metadata.creation_timestamp.as_ref())),
        json!(info.map(|i| i.kubelet_version.clone()).unwrap_or_default()),
        json!(address("InternalIP")),
        json!(address("ExternalIP")),
        json!(or_unknown(info.map(|i| &i.os_image))),
        json!(or_unknown(info.map(|i| &i.kernel_version))),
        json!(or_unknown(info.map(|i| &i.container_runtime_version))),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    #[test]
    fn ages() {
        assert_eq!(human_age(5), "5s");
        assert_eq!(human_age(150), "2m30s");
        assert_eq!(human_age(3600), "60m");
        assert_eq!(human_age(5 * 3600 + 60), "5h1m");
        assert_eq!(human_age(3 * 86_400), "3d0h");
    }

    #[test]
    fn selectors_print_as_kubectl_does() {
        assert_eq!(format_selector(None), "<none>");
        assert_eq!(format_selector(Some(&LabelSelector::default())), "<none>");
        let sel = LabelSelector {
            match_labels: Some([("pod".to_string(), "a".to_string())].into()),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "env".into(),
                operator: "In".into(),
                values: Some(vec!["prod".into(), "dev".into()]),
            }]),
        };
        assert_eq!(format_selector(Some(&sel)), "env in (dev,prod),pod=a");
    }
}
