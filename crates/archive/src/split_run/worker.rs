//! A worker's side of a split run: one range's rows encoded in every format of the plan and
//! stored where the plan says, then its [`Checkpoint`].
//!
//! Into a multipart upload a range writes its full parts under its own part numbers as they
//! fill, and keeps its first [`PART_SIZE`] bytes (its head) and its last partial part (its
//! tail) apart, stored as objects of the run once the range is done: the coordinator joins
//! each range's tail with the next one's head into the parts between them (S3 wants every
//! part but the last to be at least 5 MiB). Memory: two parts per format.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::oneshot;

use super::{Checkpoint, Plan, PlannedUpload, RangeOutput, StoredPiece, UploadedPart, run_dir};
use crate::error::{ArchiveError, Result};
use crate::format::Encoder;
use crate::store::s3::PART_SIZE;
use crate::store::{ObjectWriter, Store};
use crate::writer::SnapshotRows;

/// Encoded bytes gathered before they go to the range's outputs.
const CHUNK: usize = 1 << 20;

/// The key of one of range `range`'s objects in format `upload` (`suffix`: `""`, `.head`,
/// `.tail`).
fn piece_key(
    key_prefix: &str,
    plan: &Plan,
    upload: &PlannedUpload,
    range: usize,
    suffix: &str,
) -> String {
    format!(
        "{}range-{range}{}{suffix}",
        run_dir(key_prefix, &plan.run_id),
        upload.format.extension()
    )
}

/// Where one format's bytes of the range go.
enum Output {
    /// One object of the run (a store without shared uploads).
    Whole {
        key: String,
        writer: Box<dyn ObjectWriter>,
        size: u64,
    },
    /// Parts of the plan's multipart upload.
    Parts(Box<PartsOutput>),
}

struct PartsOutput {
    store: Arc<dyn Store>,
    key: String,
    upload_id: String,
    next_number: i32,
    last_number: i32,
    head: Vec<u8>,
    current: Vec<u8>,
    uploaded: Vec<UploadedPart>,
    size: u64,
    head_key: String,
    tail_key: String,
}

/// Appends to `buf` up to one part; returns the bytes taken.
fn fill(buf: &mut Vec<u8>, data: &[u8]) -> usize {
    let n = (PART_SIZE - buf.len()).min(data.len());
    buf.extend_from_slice(&data[..n]);
    n
}

impl PartsOutput {
    async fn write(&mut self, mut data: &[u8]) -> Result<()> {
        self.size += data.len() as u64;
        data = &data[fill(&mut self.head, data)..];
        while !data.is_empty() {
            if self.current.len() == PART_SIZE {
                self.upload_current().await?;
            }
            data = &data[fill(&mut self.current, data)..];
        }
        Ok(())
    }

    async fn upload_current(&mut self) -> Result<()> {
        let number = self.next_number;
        if number > self.last_number {
            return Err(ArchiveError::Invalid(format!(
                "a range of the split is larger than its share of the 10 000 parts of {}: \
                 use more ranges (--split)",
                self.key
            )));
        }
        let shared = self
            .store
            .shared_uploads()
            .expect("planned on a store with shared uploads");
        let body = Bytes::from(std::mem::take(&mut self.current));
        let size = body.len() as u64;
        let etag = shared
            .upload_part(&self.key, &self.upload_id, number, body)
            .await?;
        self.next_number += 1;
        self.uploaded.push(UploadedPart { number, etag, size });
        crate::crashpoint::crash_point(crate::crashpoint::SPLIT_AFTER_PART);
        Ok(())
    }

    /// Stores the head and the tail; what the checkpoint records.
    async fn finish(self) -> Result<RangeOutput> {
        let head = self.store.put(&self.head_key, &self.head).await?;
        let tail = self.store.put(&self.tail_key, &self.current).await?;
        Ok(RangeOutput {
            size: self.size,
            whole: None,
            head: Some(StoredPiece {
                key: self.head_key,
                size: head.size,
            }),
            parts: self.uploaded,
            tail: Some(StoredPiece {
                key: self.tail_key,
                size: tail.size,
            }),
        })
    }
}

impl Output {
    async fn start(
        store: &Arc<dyn Store>,
        key_prefix: &str,
        plan: &Plan,
        range: usize,
        u: &PlannedUpload,
    ) -> Result<Output> {
        match (&u.upload_id, store.shared_uploads()) {
            (Some(id), Some(_)) => {
                let first = plan.first_part(range);
                Ok(Output::Parts(Box::new(PartsOutput {
                    store: store.clone(),
                    key: u.key.clone(),
                    upload_id: id.clone(),
                    next_number: first + 1,
                    last_number: first + plan.parts_per_range() - 1,
                    head: Vec::new(),
                    current: Vec::new(),
                    uploaded: Vec::new(),
                    size: 0,
                    head_key: piece_key(key_prefix, plan, u, range, ".head"),
                    tail_key: piece_key(key_prefix, plan, u, range, ".tail"),
                })))
            }
            (Some(_), None) => Err(ArchiveError::Invalid(format!(
                "the split plan names a multipart upload of {}, but {} has none: the worker's \
                 store differs from the coordinator's",
                u.key,
                store.name()
            ))),
            (None, _) => {
                let key = piece_key(key_prefix, plan, u, range, "");
                Ok(Output::Whole {
                    writer: store.create(&key).await?,
                    key,
                    size: 0,
                })
            }
        }
    }

    async fn write(&mut self, data: &[u8]) -> Result<()> {
        match self {
            Output::Whole { writer, size, .. } => {
                *size += data.len() as u64;
                writer.write(data).await?;
                crate::crashpoint::crash_point(crate::crashpoint::SPLIT_AFTER_PART);
                Ok(())
            }
            Output::Parts(p) => p.write(data).await,
        }
    }

    async fn finish(self) -> Result<RangeOutput> {
        match self {
            Output::Whole { key, writer, size } => {
                let put = writer.finish().await?;
                Ok(RangeOutput {
                    size,
                    whole: Some(StoredPiece {
                        key,
                        size: put.size,
                    }),
                    ..Default::default()
                })
            }
            Output::Parts(p) => p.finish().await,
        }
    }

    async fn abort(self) {
        if let Output::Whole { writer, .. } = self {
            writer.abort().await;
        }
        // Uploaded parts stay in the upload until it is completed (without them: no
        // checkpoint names them) or aborted.
    }
}

/// Writes range `range` of `plan` from `rows` (every row of the range, in order), then its
/// checkpoint; `verdict` (the producer's) must be a success for the checkpoint to be written.
pub async fn write_range<R: SnapshotRows>(
    store: &Arc<dyn Store>,
    key_prefix: &str,
    plan: &Plan,
    (range, worker): (usize, u16),
    rows: R,
    verdict: Option<oneshot::Receiver<Result<()>>>,
) -> Result<Checkpoint> {
    let mut outputs = Vec::with_capacity(plan.uploads.len());
    for u in &plan.uploads {
        match Output::start(store, key_prefix, plan, range, u).await {
            Ok(o) => outputs.push((Encoder::new(u.format)?, o)),
            Err(e) => {
                for (_, o) in outputs {
                    o.abort().await;
                }
                return Err(e);
            }
        }
    }
    let written = encode(rows, verdict, &mut outputs).await;
    let rows = match written {
        Ok(rows) => rows,
        Err(e) => {
            for (_, o) in outputs {
                o.abort().await;
            }
            return Err(e);
        }
    };
    let mut ended = Vec::with_capacity(outputs.len());
    let mut outputs = outputs.into_iter();
    while let Some((enc, mut o)) = outputs.next() {
        let finished = match enc.finish() {
            Ok(rest) => o.write(&rest).await,
            Err(e) => Err(e),
        };
        match finished {
            Ok(()) => ended.push(o.finish().await?),
            Err(e) => {
                o.abort().await;
                for (_, o) in outputs {
                    o.abort().await;
                }
                return Err(e);
            }
        }
    }
    let checkpoint = Checkpoint {
        run_id: plan.run_id.clone(),
        range,
        rows,
        outputs: ended,
        worker,
    };
    super::write_checkpoint(store.as_ref(), key_prefix, &checkpoint).await?;
    Ok(checkpoint)
}

/// Encodes every row into every output (the encoders' last bytes stay in them); the row
/// count once the producer's verdict is a success.
async fn encode<R: SnapshotRows>(
    mut rows: R,
    verdict: Option<oneshot::Receiver<Result<()>>>,
    outputs: &mut [(Encoder, Output)],
) -> Result<u64> {
    let mut count = 0u64;
    let mut batch = Vec::new();
    while rows.next_rows(&mut batch).await {
        count += batch.len() as u64;
        for row in batch.drain(..) {
            for (enc, _) in outputs.iter_mut() {
                enc.row(&row)?;
            }
        }
        for (enc, out) in outputs.iter_mut() {
            if enc.pending() >= CHUNK {
                out.write(&enc.take()).await?;
            }
        }
    }
    if let Some(verdict) = verdict {
        verdict.await.unwrap_or_else(|_| {
            Err(ArchiveError::Invalid(
                "the row producer vanished before finishing".into(),
            ))
        })?;
    }
    Ok(count)
}
