//! Streaming uploads to S3: one `PutObject` below [`PART_SIZE`], a multipart upload in
//! `PART_SIZE` parts above it, so a writer holds at most one part in memory.

use async_trait::async_trait;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::CompletedPart;
use bytes::Bytes;
use sha2::{Digest, Sha256};

use super::multipart::Multipart;
use super::{PART_SIZE, S3Store};
use crate::error::{ArchiveError, Result};
use crate::store::{ObjectWriter, PutResult, Store};

struct MultipartUpload {
    upload: Multipart,
    parts: Vec<CompletedPart>,
}

/// Streaming upload: buffers up to one part; the multipart upload starts only once more than
/// [`PART_SIZE`] bytes were written.
pub(super) struct S3Writer {
    store: S3Store,
    key: String,
    full_key: String,
    buf: Vec<u8>,
    hasher: Sha256,
    size: u64,
    upload: Option<MultipartUpload>,
    /// A part upload failed (and the upload was aborted): the writer is dead.
    failed: bool,
}

impl S3Writer {
    pub(super) fn new(store: S3Store, key: &str, full_key: String) -> S3Writer {
        S3Writer {
            store,
            key: key.to_string(),
            full_key,
            buf: Vec::new(),
            hasher: Sha256::new(),
            size: 0,
            upload: None,
            failed: false,
        }
    }

    /// Sends the buffered bytes as the next part, starting the multipart upload if needed.
    async fn flush_part(&mut self) -> Result<()> {
        if self.upload.is_none() {
            let upload = Multipart::start(&self.store, &self.key, self.full_key.clone()).await?;
            self.upload = Some(MultipartUpload {
                upload,
                parts: Vec::new(),
            });
        }
        let upload = self.upload.as_mut().expect("started above");
        let number = upload.parts.len() as i32 + 1;
        // Hand the part to the request; the next one is allocated only when data arrives.
        let body = Bytes::from(std::mem::take(&mut self.buf));
        let part = upload.upload.upload_part(number, body).await?;
        upload.parts.push(part);
        Ok(())
    }

    async fn abort_upload(&mut self) {
        if let Some(upload) = self.upload.take() {
            upload.upload.abort().await;
        }
    }

    async fn complete(&mut self) -> Result<()> {
        if self.upload.is_none() {
            let body = Bytes::from(std::mem::take(&mut self.buf));
            self.store
                .client
                .put_object()
                .bucket(&self.store.bucket)
                .key(&self.full_key)
                .body(ByteStream::from(body))
                .send()
                .await
                .map_err(|e| self.store.storage_error(&self.key, "PutObject", e))?;
            return Ok(());
        }
        // Parts are flushed only when more data follows, so the last part is never empty.
        if !self.buf.is_empty() {
            self.flush_part().await?;
        }
        let upload = self.upload.as_ref().expect("multipart upload in progress");
        upload.upload.complete(upload.parts.clone()).await?;
        // Completed: nothing left to abort.
        self.upload = None;
        Ok(())
    }
}

impl Drop for S3Writer {
    fn drop(&mut self) {
        // Dropped without finish or abort: abort the multipart upload in the background so no
        // parts linger (best effort; needs a runtime).
        if let Some(upload) = self.upload.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(async move { upload.upload.abort().await });
        }
    }
}

#[async_trait]
impl ObjectWriter for S3Writer {
    async fn write(&mut self, mut data: &[u8]) -> Result<()> {
        if self.failed {
            return Err(ArchiveError::storage(
                self.store.uri(&self.key),
                "S3 upload already failed",
            ));
        }
        self.hasher.update(data);
        self.size += data.len() as u64;
        while !data.is_empty() {
            if self.buf.len() == PART_SIZE
                && let Err(e) = self.flush_part().await
            {
                self.failed = true;
                self.abort_upload().await;
                return Err(e);
            }
            let n = (PART_SIZE - self.buf.len()).min(data.len());
            // Grow geometrically but never past one part: memory stays bounded by PART_SIZE.
            let need = self.buf.len() + n;
            if need > self.buf.capacity() {
                let target = (self.buf.capacity() * 2).clamp(need.max(64 * 1024), PART_SIZE);
                self.buf.reserve_exact(target - self.buf.len());
            }
            self.buf.extend_from_slice(&data[..n]);
            data = &data[n..];
        }
        Ok(())
    }

    async fn finish(mut self: Box<Self>) -> Result<PutResult> {
        if self.failed {
            return Err(ArchiveError::storage(
                self.store.uri(&self.key),
                "S3 upload already failed",
            ));
        }
        if let Err(e) = self.complete().await {
            self.failed = true;
            self.abort_upload().await;
            return Err(e);
        }
        let hasher = std::mem::take(&mut self.hasher);
        Ok(PutResult {
            uri: self.store.uri(&self.key),
            size: self.size,
            sha256: hex::encode(hasher.finalize()),
        })
    }

    async fn abort(mut self: Box<Self>) {
        self.abort_upload().await;
    }
}
