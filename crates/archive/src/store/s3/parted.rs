//! An object written in concurrent parts as ONE multipart upload: part writer `i` owns its own
//! range of part numbers and uploads full [`PART_SIZE`] parts as its data arrives. S3 wants
//! every part but the last to be at least 5 MiB, and a writer's data need not fill its last
//! part, so each writer keeps its first [`PART_SIZE`] bytes (its head) and its last partial
//! part (its tail) in memory: on finish the previous writer's tail and the next one's head
//! are joined into the part numbered first in that writer's range. Memory: at most two parts
//! per writer, whatever the size of its range. The whole object's SHA-256 is computed on
//! finish by reading it back in one streaming pass (digests of parts do not combine).

use async_trait::async_trait;
use aws_sdk_s3::types::CompletedPart;

use super::multipart::Multipart as Target;
use super::{PART_SIZE, S3Store};
use crate::error::{ArchiveError, Result};
use crate::store::parted::{FinishedPart, PartWriter, PartedUpload};
use crate::store::{PutResult, Store};

/// S3's highest part number: kept for the last writer's tail.
const LAST_PART_NUMBER: i32 = 10_000;

/// Starts the multipart upload of `key` for `parts` writers.
pub(super) async fn create(
    store: &S3Store,
    key: &str,
    parts: usize,
) -> Result<Box<dyn PartedUpload>> {
    let full_key = store.full_key(key)?;
    // Each writer's range: its first number for the joined head, then its own full parts.
    let per_writer = (LAST_PART_NUMBER as usize - 1) / parts;
    if per_writer < 2 {
        return Err(ArchiveError::Invalid(format!(
            "{parts} parts are too many for one multipart upload"
        )));
    }
    let target = Target::start(store, key, full_key).await?;
    let writers = (0..parts)
        .map(|i| {
            let first = (1 + i * per_writer) as i32;
            Box::new(S3Part {
                target: target.clone(),
                first_number: first,
                next_number: first + 1,
                last_number: first + per_writer as i32 - 1,
                head: Vec::new(),
                current: Vec::new(),
                uploaded: Vec::new(),
                size: 0,
            }) as Box<dyn PartWriter>
        })
        .collect();
    Ok(Box::new(S3PartedUpload {
        target,
        writers,
        open: true,
    }))
}

struct S3Part {
    target: Target,
    /// Kept for the part joining the previous writer's tail and this writer's head.
    first_number: i32,
    next_number: i32,
    last_number: i32,
    head: Vec<u8>,
    current: Vec<u8>,
    uploaded: Vec<CompletedPart>,
    size: u64,
}

/// What a finished S3 part hands to the upload.
struct Held {
    first_number: i32,
    head: Vec<u8>,
    uploaded: Vec<CompletedPart>,
    tail: Vec<u8>,
}

/// Appends up to what fits in one part; returns the bytes taken.
fn fill(buf: &mut Vec<u8>, data: &[u8]) -> usize {
    let n = (PART_SIZE - buf.len()).min(data.len());
    if buf.capacity() < buf.len() + n {
        // Grow geometrically but never past one part.
        let target = (buf.capacity() * 2).clamp((buf.len() + n).max(64 * 1024), PART_SIZE);
        buf.reserve_exact(target - buf.len());
    }
    buf.extend_from_slice(&data[..n]);
    n
}

#[async_trait]
impl PartWriter for S3Part {
    async fn write(&mut self, mut data: &[u8]) -> Result<()> {
        self.size += data.len() as u64;
        data = &data[fill(&mut self.head, data)..];
        while !data.is_empty() {
            if self.current.len() == PART_SIZE {
                let number = self.next_number;
                if number > self.last_number {
                    return Err(ArchiveError::storage(
                        self.target.store.uri(&self.target.key),
                        "a range of the split is larger than its share of the upload's 10 000 \
                         parts: use fewer ranges (--split)",
                    ));
                }
                self.next_number += 1;
                let body = std::mem::take(&mut self.current);
                self.uploaded
                    .push(self.target.upload_part(number, body.into()).await?);
            }
            data = &data[fill(&mut self.current, data)..];
        }
        Ok(())
    }

    async fn restart(&mut self) -> Result<()> {
        // Its part numbers are uploaded again (replacing the earlier parts); those it does
        // not reach again are not named when the upload completes.
        self.head.clear();
        self.current.clear();
        self.uploaded.clear();
        self.next_number = self.first_number + 1;
        self.size = 0;
        Ok(())
    }

    async fn finish(self: Box<Self>) -> Result<FinishedPart> {
        let S3Part {
            first_number,
            head,
            current,
            uploaded,
            size,
            ..
        } = *self;
        Ok(FinishedPart {
            size,
            state: Box::new(Held {
                first_number,
                head,
                uploaded,
                tail: current,
            }),
        })
    }
}

struct S3PartedUpload {
    target: Target,
    writers: Vec<Box<dyn PartWriter>>,
    /// The multipart upload exists (neither completed nor aborted).
    open: bool,
}

impl Target {
    /// Uploads the held heads and tails between the writers' own parts, in object order;
    /// returns every part, or `Err(carry)` with the whole object when it fits one small put.
    async fn join(
        &self,
        parts: Vec<Held>,
    ) -> Result<std::result::Result<Vec<CompletedPart>, Vec<u8>>> {
        let mut carry: Vec<u8> = Vec::new();
        let mut completed: Vec<CompletedPart> = Vec::new();
        for held in parts {
            carry.extend_from_slice(&held.head);
            // A writer uploaded parts only once its head was full: the carry is a full part.
            if !held.uploaded.is_empty() || carry.len() >= PART_SIZE {
                let body = std::mem::take(&mut carry);
                completed.push(self.upload_part(held.first_number, body.into()).await?);
            }
            completed.extend(held.uploaded);
            carry.extend_from_slice(&held.tail);
        }
        if completed.is_empty() {
            return Ok(Err(carry));
        }
        if !carry.is_empty() {
            completed.push(self.upload_part(LAST_PART_NUMBER, carry.into()).await?);
        }
        Ok(Ok(completed))
    }

    /// The stored object's SHA-256 and size, read back (ranges at once).
    async fn digest(&self) -> Result<(String, u64)> {
        let store: std::sync::Arc<dyn crate::store::Store> =
            std::sync::Arc::new(self.store.clone());
        crate::store::read_back::digest_object(store, &self.key).await
    }
}

impl S3PartedUpload {
    async fn finish_parts(&mut self, parts: Vec<FinishedPart>) -> Result<PutResult> {
        let expected: u64 = parts.iter().map(|p| p.size).sum();
        let held = parts
            .into_iter()
            .map(|p| {
                p.state.downcast::<Held>().map(|h| *h).map_err(|_| {
                    ArchiveError::Invalid("a part of another upload was handed to finish".into())
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let t = self.target.clone();
        match t.join(held).await? {
            Err(small) => {
                // Too small for parts: one put, and the multipart upload goes.
                t.abort().await;
                self.open = false;
                return t.store.put(&t.key, &small).await;
            }
            Ok(completed) => t.complete(completed).await?,
        }
        self.open = false;
        let (sha256, size) = match t.digest().await {
            Ok(d) => d,
            Err(e) => {
                let _ = t.store.delete(&t.key).await;
                return Err(e);
            }
        };
        if size != expected {
            let _ = t.store.delete(&t.key).await;
            return Err(ArchiveError::storage(
                t.store.uri(&t.key),
                format!("the joined object has {size} bytes, its parts {expected}"),
            ));
        }
        Ok(PutResult {
            uri: t.store.uri(&t.key),
            size,
            sha256,
        })
    }
}

#[async_trait]
impl PartedUpload for S3PartedUpload {
    fn take_writers(&mut self) -> Vec<Box<dyn PartWriter>> {
        std::mem::take(&mut self.writers)
    }

    async fn finish(mut self: Box<Self>, parts: Vec<FinishedPart>) -> Result<PutResult> {
        let result = self.finish_parts(parts).await;
        if result.is_err() && self.open {
            self.target.abort().await;
            self.open = false;
        }
        result
    }

    async fn abort(mut self: Box<Self>) {
        if self.open {
            self.target.abort().await;
            self.open = false;
        }
    }
}

impl Drop for S3PartedUpload {
    fn drop(&mut self) {
        // Dropped without finish or abort: abort in the background (best effort; needs a
        // runtime) so no parts linger.
        if self.open
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let target = self.target.clone();
            rt.spawn(async move { target.abort().await });
        }
    }
}
