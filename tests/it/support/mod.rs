//! Real components shared by the integration tests. Each starts once per test process, on
//! loopback only, and is stopped (and its data removed) when the process exits, however it exits.

// Helpers are shared by several test modules; not every module uses every helper.
#![allow(dead_code)]

pub mod postgres;
pub mod seaweedfs;

pub use seaweedfs::seaweedfs;
