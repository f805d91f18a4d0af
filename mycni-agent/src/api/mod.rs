//! The agent's HTTP API: the server (`/metrics`, the probes, the rooms'
//! `/inspect/...` answers, `/flows`) and the one client the CLI asks it
//! with.

pub mod client;
mod server;

pub use server::{router, serve};
