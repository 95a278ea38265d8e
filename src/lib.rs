//! larch: PostgreSQL tables into laredo-compatible archives, archives into live engines, both
//! on Kubernetes through an operator.
//!
//! This package is the `larch` binary: `cli` parses arguments and calls the workspace's
//! crates (docs/architecture.md). The modules re-exported below keep one path per concept for
//! the binary and the tests:
//! `larch_core` (shared vocabulary) ← `larch_archive` ← `larch_contract` (what the operator
//! writes for its pods) and `larch_postgres` ← `larch_run` (export, engine, restore) and
//! `larch_operator` (which builds requests, never runs them).

pub mod cli;

pub use larch_archive as archive;
/// What the operator hands its pods: the engine file, the export and restore requests.
pub use larch_contract as contract;
pub use larch_core::{duration, locks, progress, telemetry, tls, units};
pub use larch_operator as operator;
pub use larch_run::{engine, export, leak_check, restore, review};

/// Failure reasons (the termination-message contract), classified by every layer.
pub mod failure {
    pub use larch_core::failure::*;
    pub use larch_postgres::errors::redact;
    pub use larch_run::reasons::{classify, reason_of, render, report};
}

/// Sources: PostgreSQL (logical replication) and archives.
pub mod source {
    pub use larch_archive::source::*;
    pub use larch_postgres as postgres;
    pub use larch_run::archive_source as archive;
}
