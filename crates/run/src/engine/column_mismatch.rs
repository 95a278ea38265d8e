//! An engine error of its own, apart from the pipeline so that the runs' error registry
//! (`crate::reasons`) can name it without depending on the pipeline that reports through it.

use larch_core::failure::{Classify, Reason};

/// An index or key field that is not a column of the archive's manifest: the table cannot be
/// served as configured, whatever the retries.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ColumnMismatch(pub String);

impl Classify for ColumnMismatch {
    fn reason(&self) -> Option<Reason> {
        Some(Reason::ColumnNotFound)
    }
}
