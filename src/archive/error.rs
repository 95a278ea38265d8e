//! Archive errors. Every message names what is wrong: the object key, the line, the field.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum ArchiveError {
    #[error("{key}: unsupported manifest version {version} (this larch reads version 1 and older)")]
    UnsupportedManifestVersion { key: String, version: i64 },
    #[error("manifest not found at {key}")]
    ManifestNotFound { key: String },
    #[error("object not found: {key}")]
    ObjectNotFound { key: String },
    #[error("{key}: {detail}")]
    Corrupt { key: String, detail: String },
    #[error("{key}: line {line}: {detail}")]
    BadLine {
        key: String,
        line: u64,
        detail: String,
    },
    #[error("{key}: truncated protobuf record: {detail}")]
    Truncated { key: String, detail: String },
    #[error("{key}: integrity check failed: {detail}")]
    Integrity { key: String, detail: String },
    #[error(
        "position {position:?} predates the archive (its oldest reachable position is {oldest:?})"
    )]
    Predates { position: String, oldest: String },
    #[error("invalid position {0:?}: expected a WAL LSN such as 0/16B3748")]
    InvalidPosition(String),
    #[error("key {key:?} escapes the store root")]
    KeyEscapesRoot { key: String },
    #[error(
        "key {key:?} leads outside the store root through the symbolic link {link} -> {target}: refused"
    )]
    LinkEscapesRoot {
        key: String,
        link: String,
        target: String,
    },
    #[error(
        "manifest {key} changed under us (compare-and-swap conflict): another writer owns this prefix"
    )]
    CasConflict { key: String },
    #[error("{0}")]
    Invalid(String),
    #[error(
        "spill directory {dir}: the buffered changes need {needed} bytes on disk, more than the spill limit of {limit} bytes: raise --spill-limit (spec.continuous.spillSize) and the space behind it"
    )]
    SpillLimit {
        dir: String,
        limit: u64,
        needed: u64,
    },
    // The cause is part of the message and deliberately not a `source()`: error chains printed
    // with `{:#}` would repeat it (`Is a directory (os error 21): Is a directory (os error 21)`).
    #[error("storage error on {key}: {cause}")]
    Storage {
        key: String,
        cause: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("{context}: {cause}")]
    Io {
        context: String,
        cause: std::io::Error,
    },
}

impl ArchiveError {
    pub fn storage(
        key: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        ArchiveError::Storage {
            key: key.into(),
            cause: source.into(),
        }
    }

    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        ArchiveError::Io {
            context: context.into(),
            cause: source,
        }
    }

    /// Worth retrying with backoff (rule C5)?
    pub fn is_transient(&self) -> bool {
        matches!(self, ArchiveError::Storage { .. } | ArchiveError::Io { .. })
    }
}

pub type Result<T, E = ArchiveError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_os_error_is_printed_once_in_a_chain() {
        let e = ArchiveError::io(
            "reading /tmp",
            std::io::Error::from_raw_os_error(libc::EISDIR),
        );
        let chain = format!("{:#}", anyhow::Error::new(e).context("larch"));
        assert_eq!(chain.matches("os error 21").count(), 1, "{chain}");
        let e = ArchiveError::storage("k", std::io::Error::from_raw_os_error(libc::EISDIR));
        let chain = format!("{:#}", anyhow::Error::new(e));
        assert_eq!(chain.matches("os error 21").count(), 1, "{chain}");
    }
}
