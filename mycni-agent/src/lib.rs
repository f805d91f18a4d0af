//! mycni-agent: the node agent of the mycni CNI.
//!
//! The library holds everything the binary does, behind narrow seams, so that
//! tests drive the same code the DaemonSet runs.

pub mod ebpf;
