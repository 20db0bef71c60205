//! Integration tests: the real binary mounted on a real SeaweedFS, driven with std::fs and shell
//! tools. Each `[S-...]` tag names the SEMANTICS.md statement a test exercises.

// Tests and benchmark tools may keep a table of steps in one function.
#![allow(clippy::too_many_lines)]

mod cache;
mod common;
mod diskcache;
mod faults;
mod layout;
mod lifecycle;
mod metrics;
mod namespace;
mod nvidia;
mod rdma;
mod read;
mod roundtrip;
mod security;
mod semantics;
mod soak;
mod staged;
mod startup;
mod system;
mod transport;
mod tree;
mod write;
