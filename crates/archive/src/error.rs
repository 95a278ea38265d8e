//! Archive errors. Every message names what is wrong: the object key, the line, the field.

use larch_core::failure::{self, Classify, Reason};
use thiserror::Error;

/// The environment variable that raises the cap on objects read whole (manifests), which
/// [`ArchiveError::TooLarge`] names.
pub const MAX_GET_BYTES_ENV: &str = "LARCH_MAX_MANIFEST_BYTES";

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
    /// A wait for other processes that ran out (not bad input: trying again may succeed).
    #[error("{0}")]
    GaveUpWaiting(String),
    #[error(
        "{key}: {size} bytes, over the {limit} bytes read whole for a manifest (a manifest is a few MiB; set {env} to raise the cap)",
        env = MAX_GET_BYTES_ENV
    )]
    TooLarge { key: String, size: u64, limit: u64 },
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

impl Classify for ArchiveError {
    fn reason(&self) -> Option<Reason> {
        match self {
            ArchiveError::KeyEscapesRoot { .. }
            | ArchiveError::Invalid(_)
            | ArchiveError::InvalidPosition(_) => Some(Reason::InvalidConfig),
            ArchiveError::Storage { cause, .. } => Some(storage_reason(&cause.to_string())),
            _ => None,
        }
    }
}

/// The archive layer's [`failure::Classifier`]: its own error type.
pub fn reason_of(cause: &(dyn std::error::Error + 'static)) -> Option<Reason> {
    failure::reason_if::<ArchiveError>(cause)
}

/// An S3 error by the code in its text: a missing bucket and refused credentials need someone
/// to act, anything else (a refused connection, a 5xx) is worth retrying.
fn storage_reason(text: &str) -> Reason {
    if text.contains("NoSuchBucket") {
        Reason::BucketNotFound
    } else if [
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
    ]
    .iter()
    .any(|c| text.contains(c))
    {
        Reason::StorageAccessDenied
    } else {
        Reason::StorageUnavailable
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

    #[test]
    fn archive_errors_classify_themselves() {
        let classify = |e: ArchiveError| failure::classify_with(&anyhow::Error::from(e), reason_of);
        let escape = ArchiveError::KeyEscapesRoot {
            key: "../x/".into(),
        };
        assert_eq!(classify(escape), Reason::InvalidConfig);
        let bucket = ArchiveError::storage(
            "s3://b/k",
            "S3 GetObject: service error: code: Some(\"NoSuchBucket\")",
        );
        assert_eq!(classify(bucket), Reason::BucketNotFound);
        let denied = ArchiveError::storage("s3://b/k", "S3 PutObject: InvalidAccessKeyId");
        assert_eq!(classify(denied), Reason::StorageAccessDenied);
        let down = ArchiveError::storage(
            "s3://b/k",
            "S3 GetObject: dispatch failure: Connection refused",
        );
        assert_eq!(classify(down), Reason::StorageUnavailable);
        let missing = ArchiveError::ManifestNotFound {
            key: "t/manifest.json".into(),
        };
        assert_eq!(classify(missing), Reason::Failed);
        let absent = ArchiveError::GaveUpWaiting("split worker 1 (of 2) did not start".into());
        assert_eq!(classify(absent), Reason::Failed, "retried, not bad input");
    }
}
