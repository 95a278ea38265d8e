//! Why a run (export, engine, restore) failed: the runs' own error types, then the PostgreSQL
//! and archive layers' ([`larch_postgres::reasons`]).

use std::path::Path;

use larch_core::failure::{self, Reason};

use crate::engine::column_mismatch::ColumnMismatch;
use crate::engine::config::ConfigError;

/// The runs' [`failure::Classifier`]: their own error types, then the layers below.
pub fn reason_of(cause: &(dyn std::error::Error + 'static)) -> Option<Reason> {
    failure::reason_if::<ConfigError>(cause)
        .or_else(|| failure::reason_if::<ColumnMismatch>(cause))
        .or_else(|| larch_postgres::reasons::reason_of(cause))
}

/// Why `err` happened: its tag, the first cause of a type larch knows, a SQLSTATE in its text,
/// else [`Reason::Failed`].
pub fn classify(err: &anyhow::Error) -> Reason {
    failure::classify_with(err, reason_of)
}

// The runs have no error type of their own whose text must be withheld: what is redacted is
// a data error's server text, in the PostgreSQL layer ([`larch_postgres::errors::redact`]).

/// `err` in one line, as a termination message or a log line may show it.
pub fn render(err: &anyhow::Error) -> String {
    failure::render(err, larch_postgres::errors::redact)
}

/// Writes the termination message of `err` to `path`; returns the exit status for it.
pub fn report(path: Option<&Path>, err: &anyhow::Error) -> i32 {
    failure::report_with(path, err, reason_of, larch_postgres::errors::redact)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_layer_is_asked() {
        let config = anyhow::Error::from(ConfigError {
            file: "engine.yaml".into(),
            message: "sources.seed.type: unknown".into(),
        });
        assert_eq!(classify(&config), Reason::InvalidConfig);
        let wire = anyhow::Error::from(pgwire_replication::PgWireError::Server(
            "permission denied to start WAL sender (SQLSTATE 42501)".into(),
        ));
        assert_eq!(classify(&wire), Reason::PermissionDenied);
        let bucket = anyhow::Error::from(larch_archive::ArchiveError::storage(
            "s3://b/k",
            "S3 GetObject: NoSuchBucket",
        ))
        .context("reading the manifest");
        assert_eq!(classify(&bucket), Reason::BucketNotFound);
    }
}
