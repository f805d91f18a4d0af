//! What the agent watches, and nothing else: the Kubernetes API (`api`:
//! one snapshot of the objects the subsystems read, Nodes today) and the
//! kernel's notifications (`kernel`). Watches only mark work; the loop's
//! pass decides what it means.

mod api;
pub mod kernel;
mod kind;
mod nodes;

pub use api::ApiWatch;
pub use nodes::node_view;
