//! What the agent watches, and nothing else: the Kubernetes API (`api`:
//! one snapshot of the Nodes the overlay reads; `policy`: Pods, Namespaces
//! and NetworkPolicies, which wake the policy room alone) and the kernel's
//! notifications (`kernel`). Watches only mark work; the rooms decide what
//! it means.

mod api;
mod cache;
pub mod kernel;
mod kind;
mod nodes;
mod policy;

pub(crate) use api::ApiWatch;
pub(crate) use nodes::node_view;
pub(crate) use policy::{Converters, PolicySnapshot, PolicyWatch};
