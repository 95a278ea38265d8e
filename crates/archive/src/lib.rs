//! The archive: a base snapshot plus a chain of diffs, indexed by a per-table manifest, exactly
//! as laredo writes it (`docs/archive.md`) under larch's rules
//! (`docs/rules.md`: R1–R8, W1–W10, C1–C5).

pub mod crashpoint;
pub mod error;
/// Manifests and artifacts for tests of this and the layers above.
#[doc(hidden)]
pub mod fixtures;
pub mod fold;
pub mod format;
pub mod identity;
pub mod manifest;
pub mod masking;
pub mod model;
pub mod orphans;
pub mod partitioning;
pub mod plan;
pub mod point_in_time;
pub mod policy;
pub mod position;
pub mod reader;
pub mod retention;
pub mod source;
pub mod spill;
pub mod split_run;
pub mod store;
pub mod value;
pub mod verify;
pub mod writer;

pub use error::{ArchiveError, Result};
