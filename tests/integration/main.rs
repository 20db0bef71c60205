//! Integration tests: the real binary mounted on a real SeaweedFS, driven with std::fs and shell
//! tools. Each `[S-...]` tag names the SEMANTICS.md statement a test exercises.

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
mod tree;
mod write;
