//! Object stores: where archives live. Each store passes the conformance suite in
//! `tests/it/store_conformance.rs` (local, S3 on SeaweedFS, in-memory alike).

pub mod atomic_file;
pub mod local;
pub mod memory;
pub mod parted;
pub mod read_back;
pub mod s3;
pub mod spec;

use std::fmt::Debug;
use std::pin::Pin;

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use tokio::io::AsyncRead;

use super::error::Result;

/// What a completed write stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PutResult {
    pub uri: String,
    pub size: u64,
    /// Lowercase hex SHA-256 of the bytes written.
    pub sha256: String,
}

pub use crate::error::MAX_GET_BYTES_ENV;
/// The default cap on objects read whole: a manifest of a long history is a few MiB, so one
/// this large is damaged or hostile, and reading it would cost that much memory.
pub const DEFAULT_MAX_GET_BYTES: u64 = 64 << 20;

/// The cap [`Store::get`] applies: `$LARCH_MAX_MANIFEST_BYTES` (bytes) when set and valid,
/// else [`DEFAULT_MAX_GET_BYTES`].
pub fn max_get_bytes() -> u64 {
    static CAP: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *CAP.get_or_init(|| match std::env::var(MAX_GET_BYTES_ENV) {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| {
            tracing::warn!(value = %v, "{MAX_GET_BYTES_ENV} is not a number of bytes; using the default");
            DEFAULT_MAX_GET_BYTES
        }),
        Err(_) => DEFAULT_MAX_GET_BYTES,
    })
}

/// Refuses an object of `size` bytes to be read whole under `key` when over `limit`.
pub fn check_get_size(key: &str, size: u64, limit: u64) -> Result<()> {
    if size > limit {
        return Err(super::error::ArchiveError::TooLarge {
            key: key.to_string(),
            size,
            limit,
        });
    }
    Ok(())
}

/// A small object read whole (manifests), with the revision used for compare-and-swap.
#[derive(Clone, Debug)]
pub struct GetResult {
    pub bytes: Bytes,
    pub revision: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    pub key: String,
    pub size: u64,
    pub modified: Option<DateTime<Utc>>,
}

pub type ObjectReader = Pin<Box<dyn AsyncRead + Send>>;

/// A streaming upload. Nothing is visible under the key until `finish` succeeds; `abort`
/// (or dropping without `finish`) leaves nothing behind.
#[async_trait]
pub trait ObjectWriter: Send {
    async fn write(&mut self, data: &[u8]) -> Result<()>;
    async fn finish(self: Box<Self>) -> Result<PutResult>;
    async fn abort(self: Box<Self>);
}

#[async_trait]
pub trait Store: Send + Sync + Debug {
    /// Identifier for logs (`local:/path`, `s3://bucket/prefix`).
    fn name(&self) -> String;
    /// The URI recorded in the manifest for `key` (informational, R1).
    fn uri(&self, key: &str) -> String;
    /// Reads a small object whole, refusing one over [`max_get_bytes`] before reading it.
    /// `None` when absent.
    async fn get(&self, key: &str) -> Result<Option<GetResult>>;
    /// Opens an object for streaming reads. `None` when absent.
    async fn open(&self, key: &str) -> Result<Option<ObjectReader>>;
    /// Opens an object kept as a file, for a reader on a blocking thread (no async reader's
    /// copies and hand-offs between threads); `None` when the store keeps no files (use
    /// [`Store::open`]), `Some(Ok(None))` when the object is absent.
    fn open_file(&self, _key: &str) -> Option<Result<Option<std::fs::File>>> {
        None
    }
    /// Starts a streaming upload that replaces `key` when finished.
    async fn create(&self, key: &str) -> Result<Box<dyn ObjectWriter>>;
    /// Writes `bytes` under `key` only if its current revision is `expected` (`""`: must not
    /// exist). Returns the new revision, or `ArchiveError::CasConflict`.
    async fn put_cas(&self, key: &str, bytes: Bytes, expected: &str) -> Result<String>;
    /// Deletes `key`; deleting a missing key is not an error.
    async fn delete(&self, key: &str) -> Result<()>;
    /// Lists objects whose key starts with `prefix`.
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>>;
    /// Size and time of one object (the store's own clock); `None` when absent.
    async fn head(&self, key: &str) -> Result<Option<ObjectInfo>> {
        check_key(key)?;
        Ok(self.list(key).await?.into_iter().find(|o| o.key == key))
    }

    /// A native upload of `key` in `parts` concurrently written parts (S3's multipart upload).
    /// `None` (the default): [`parted::create`] spills the parts to files in
    /// [`Store::part_dir`] and joins them with one streaming `create`.
    async fn create_parted_native(
        &self,
        _key: &str,
        _parts: usize,
    ) -> Result<Option<Box<dyn parted::PartedUpload>>> {
        Ok(None)
    }

    /// Multipart uploads that other processes add parts to (S3), for a split export whose
    /// ranges are copied by separate workers. `None` (the default): the store has none, and
    /// each range is written as an object of its own, joined by the coordinator.
    fn shared_uploads(&self) -> Option<&dyn SharedUploads> {
        None
    }

    /// Removes the writes under the folder `prefix` that never finished (the temp files of a
    /// killed writer), then the folders left empty. Default: nothing (an object store's
    /// unfinished writes are invisible, or multipart uploads: [`SharedUploads`]).
    async fn clear_unfinished(&self, prefix: &str) -> Result<()> {
        check_key_prefix(prefix)
    }

    /// Starts the upload of `key` from a spilled part file in [`Store::part_dir`] that already
    /// holds the object's first `size` bytes, hashed into `hashed`: the file itself becomes the
    /// object when the writer finishes (no copy), and the writer owns it from then on. `None`
    /// (the default): the store cannot take a file, and the part is copied into a `create`.
    async fn adopt_part_file(
        &self,
        _key: &str,
        _file: &std::path::Path,
        _hashed: sha2::Sha256,
        _size: u64,
    ) -> Result<Option<Box<dyn ObjectWriter>>> {
        Ok(None)
    }

    /// Where the spilled parts of `key` are written (default: the system's temp directory).
    fn part_dir(&self, key: &str) -> Result<std::path::PathBuf> {
        check_key(key)?;
        Ok(std::env::temp_dir())
    }

    /// Writes a whole object (convenience over `create`).
    async fn put(&self, key: &str, bytes: &[u8]) -> Result<PutResult> {
        let mut w = self.create(key).await?;
        if let Err(e) = w.write(bytes).await {
            w.abort().await;
            return Err(e);
        }
        w.finish().await
    }
}

/// A multipart upload neither completed nor aborted.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct UploadInProgress {
    pub key: String,
    pub upload_id: String,
    /// When it was started, by the store's clock.
    pub initiated: Option<DateTime<Utc>>,
}

/// One object's multipart upload named by its id, so that several processes can upload its
/// parts: started by one, parts uploaded by any (a part uploaded again under the same number
/// replaces the earlier one), completed or aborted by one.
#[async_trait]
pub trait SharedUploads: Send + Sync {
    /// Starts an upload of `key`; returns its id.
    async fn start(&self, key: &str) -> Result<String>;
    /// Uploads part `number` (1..=10 000); returns its ETag.
    async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        number: i32,
        body: Bytes,
    ) -> Result<String>;
    /// Joins the parts named (number, ETag), in order, into the object.
    async fn complete(&self, key: &str, upload_id: &str, parts: &[(i32, String)]) -> Result<()>;
    /// Drops the upload and every part of it (a failure is logged).
    async fn abort(&self, key: &str, upload_id: &str);
    /// The uploads in progress under `prefix`.
    async fn in_progress(&self, prefix: &str) -> Result<Vec<UploadInProgress>>;
}

/// Refuses keys that could leave the store root: absolute paths, `..` or `.` segments,
/// empty segments or backslashes.
pub fn check_key(key: &str) -> Result<()> {
    let bad = key.is_empty()
        || key.starts_with('/')
        || key.contains('\\')
        || key.contains('\0')
        || key.split('/').any(|seg| seg == ".." || seg == ".");
    if bad {
        return Err(super::error::ArchiveError::KeyEscapesRoot {
            key: key.to_string(),
        });
    }
    Ok(())
}

/// Checks a key prefix the same way (an empty prefix is allowed: the archive root).
pub fn check_key_prefix(prefix: &str) -> Result<()> {
    if prefix.is_empty() {
        return Ok(());
    }
    check_key(prefix.trim_end_matches('/')).map_err(|_| {
        super::error::ArchiveError::KeyEscapesRoot {
            key: prefix.to_string(),
        }
    })
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_that_escape_are_refused() {
        for k in ["../x", "a/../../x", "/etc/passwd", "a/./b", "a\\b", ""] {
            assert!(check_key(k).is_err(), "{k}");
        }
        assert!(check_key("public.events/epoch=1/snapshot-0_1.jsonl").is_ok());
        assert!(check_key_prefix("").is_ok());
        assert!(check_key_prefix("a/").is_ok());
        assert!(check_key_prefix("../").is_err());
    }
}
