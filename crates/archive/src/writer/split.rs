//! A base snapshot written from several row streams at once (a split export's ranges, in
//! order): each stream is encoded by a task of its own into its own part of ONE object per
//! format and store ([`crate::store::parted`]): in stream order, or (an uncompressed format
//! spilled to files) chunk by chunk as they are written. The
//! epoch still has one snapshot artifact; the manifest commit stays the single commit point,
//! and a failure anywhere aborts every part (nothing is left under the artifact's keys).

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

use super::ArchiveWriter;
use super::snapshot::SnapshotRows;
use crate::error::{ArchiveError, Result};
use crate::format::{Encoder, Format};
use crate::identity::laredo_row_key;
use crate::manifest::{Artifact, FormatRef, artifact_key};
use crate::store::Store;
use crate::store::parted::{self, FinishedPart, PartWriter, PartedUpload};
use crate::value::Row;

/// One stream of a split snapshot: its rows, and (optionally) its producer's verdict, sent
/// once it has ended: the snapshot commits only when every producer succeeded. A producer
/// that failed may send another attempt (the stream from its start) on `retries`: the part
/// is then written again from its start; it fails when the producer closes `retries`.
pub struct SnapshotPart<R> {
    pub rows: R,
    pub verdict: Option<oneshot::Receiver<Result<()>>>,
    pub retries: Option<mpsc::Receiver<Attempt<R>>>,
}

/// Another attempt at a stream: its rows and its producer's verdict.
pub type Attempt<R> = (R, oneshot::Receiver<Result<()>>);

/// Why an attempt at a part failed.
enum Failed {
    /// Its producer's verdict: another attempt may follow.
    Producer(ArchiveError),
    /// Encoding or storing it.
    Own(ArchiveError),
}

/// Bytes an encoder gathers before they go to its part.
const PART_CHUNK: usize = 1 << 20;

/// One format's upload on one store.
struct Joined {
    format: Format,
    store: Arc<dyn Store>,
    key: String,
    upload: Box<dyn PartedUpload>,
}

/// What a part's task needs to name a row it cannot encode.
#[derive(Clone)]
struct RowNaming {
    table: String,
    key_fields: Vec<String>,
}

impl RowNaming {
    fn name(&self, e: ArchiveError, row: &Row) -> ArchiveError {
        match e {
            ArchiveError::Invalid(text) if text.contains(crate::format::RECORD_LIMIT) => {
                let key = laredo_row_key(Some(row), &self.key_fields);
                ArchiveError::Invalid(format!(
                    "table {}, row with key {}: {text}",
                    self.table,
                    super::shortened(&key)
                ))
            }
            other => other,
        }
    }
}

impl ArchiveWriter {
    /// Writes a base snapshot at a new epoch from `parts` (every row of the table at
    /// `position`, split into streams whose rows follow each other in this order), each
    /// encoded concurrently, then commits it. Memory stays bounded: every part streams to its
    /// store (a spilled part file, or S3 parts as they fill).
    pub async fn write_snapshot_split<R: SnapshotRows + 'static>(
        &mut self,
        position: &str,
        parts: Vec<SnapshotPart<R>>,
    ) -> Result<Artifact> {
        let mut artifact = self.next_snapshot_artifact(position);
        let mut joined = self.start_joined(&artifact, parts.len()).await?;
        let count = match self.encode_parts(parts, &mut joined).await {
            Ok((count, finished)) => {
                let written = finish_joined(joined, finished, &mut artifact).await;
                match written {
                    Ok(w) => (count, w),
                    Err((e, written)) => {
                        self.cleanup(&written).await;
                        return Err(e);
                    }
                }
            }
            Err(e) => {
                for j in joined {
                    j.upload.abort().await;
                }
                return Err(e);
            }
        };
        let (count, (written, primary_bytes)) = count;
        artifact.row_count = count;
        if let Err(e) = self.commit(artifact.clone(), Some(artifact.epoch)).await {
            self.cleanup(&written).await;
            return Err(e);
        }
        self.buffer.clear();
        self.buffer_commit_times = None;
        self.churn = 0;
        self.rows_estimate = count as u64;
        self.last_snapshot_at = Some(std::time::Instant::now());
        self.last_snapshot_bytes = primary_bytes;
        Ok(artifact)
    }

    /// One upload in `parts` parts per snapshot format and store.
    async fn start_joined(&self, artifact: &Artifact, parts: usize) -> Result<Vec<Joined>> {
        let mut joined: Vec<Joined> = Vec::new();
        for format in &self.config.snapshot_formats {
            let key = artifact_key(&self.config.key_prefix, artifact, format.extension());
            for store in &self.stores {
                let layout = if format.chunks_stand_alone() {
                    parted::Layout::AsWritten
                } else {
                    parted::Layout::PartsInOrder
                };
                match parted::create(store.clone(), &key, parts, layout).await {
                    Ok(upload) => joined.push(Joined {
                        format: *format,
                        store: store.clone(),
                        key: key.clone(),
                        upload,
                    }),
                    Err(e) => {
                        for j in joined {
                            j.upload.abort().await;
                        }
                        return Err(e);
                    }
                }
            }
        }
        Ok(joined)
    }

    /// Encodes every part in a task of its own; returns the row count and, per upload, its
    /// finished parts in order. The first failure stops the other tasks.
    async fn encode_parts<R: SnapshotRows + 'static>(
        &self,
        parts: Vec<SnapshotPart<R>>,
        joined: &mut [Joined],
    ) -> Result<(i64, Vec<Vec<FinishedPart>>)> {
        let n = parts.len();
        let mut writers: Vec<Vec<Box<dyn PartWriter>>> = joined
            .iter_mut()
            .map(|j| j.upload.take_writers().into_iter().rev().collect())
            .collect();
        let naming = RowNaming {
            table: self.config.table.clone(),
            key_fields: self.key_fields.clone(),
        };
        let mut tasks = JoinSet::new();
        for (index, part) in parts.into_iter().enumerate() {
            let mut outputs = Vec::with_capacity(joined.len());
            for (j, w) in joined.iter().zip(writers.iter_mut()) {
                let writer = w.pop().ok_or_else(|| {
                    ArchiveError::Invalid("an upload has fewer part writers than parts".into())
                })?;
                outputs.push((j.format, writer));
            }
            let naming = naming.clone();
            tasks.spawn(async move { (index, encode_part(part, outputs, naming).await) });
        }
        let mut finished: Vec<Vec<Option<FinishedPart>>> = joined
            .iter()
            .map(|_| (0..n).map(|_| None).collect())
            .collect();
        let mut count = 0i64;
        while let Some(done) = tasks.join_next().await {
            let ended = done
                .map_err(|e| {
                    ArchiveError::Invalid(format!("a part of the split snapshot panicked: {e}"))
                })
                .and_then(|(index, result)| result.map(|r| (index, r)));
            let (index, (rows, parts)) = match ended {
                Ok(ended) => ended,
                Err(e) => {
                    // The other parts stop, and are gone, before the uploads are aborted: no
                    // part lands after the abort.
                    tasks.shutdown().await;
                    return Err(e);
                }
            };
            count += rows;
            for (slot, part) in finished.iter_mut().zip(parts) {
                slot[index] = Some(part);
            }
        }
        let finished = finished
            .into_iter()
            .map(|parts| {
                parts
                    .into_iter()
                    .map(|p| p.expect("every part ended"))
                    .collect()
            })
            .collect();
        Ok((count, finished))
    }
}

/// Encodes one stream into its part of each upload, again from its start for each further
/// attempt its producer sends after a failure; returns its row count and the finished parts
/// (in the order of `outputs`).
async fn encode_part<R: SnapshotRows>(
    part: SnapshotPart<R>,
    mut outputs: Vec<(Format, Box<dyn PartWriter>)>,
    naming: RowNaming,
) -> Result<(i64, Vec<FinishedPart>)> {
    let SnapshotPart {
        mut rows,
        mut verdict,
        mut retries,
    } = part;
    loop {
        let e = match encode_attempt(&mut rows, verdict.take(), &mut outputs, &naming).await {
            Ok((count, encoders)) => {
                let mut finished = Vec::with_capacity(encoders.len());
                for (enc, (_, mut writer)) in encoders.into_iter().zip(outputs) {
                    writer.write(&enc.finish()?).await?;
                    finished.push(writer.finish().await?);
                }
                return Ok((count, finished));
            }
            Err(Failed::Own(e)) => return Err(e),
            Err(Failed::Producer(e)) => e,
        };
        let next = match retries.as_mut() {
            Some(r) => r.recv().await,
            None => None,
        };
        let Some((again, again_verdict)) = next else {
            return Err(e);
        };
        tracing::warn!(error = %e, "a part of the split snapshot failed: writing it again from its start");
        for (_, writer) in outputs.iter_mut() {
            writer.restart().await?;
        }
        (rows, verdict) = (again, Some(again_verdict));
    }
}

/// One attempt: every row of `rows` encoded into the outputs; the row count and the encoders
/// holding the last bytes, once the producer's verdict is a success.
async fn encode_attempt<R: SnapshotRows>(
    rows: &mut R,
    verdict: Option<oneshot::Receiver<Result<()>>>,
    outputs: &mut [(Format, Box<dyn PartWriter>)],
    naming: &RowNaming,
) -> std::result::Result<(i64, Vec<Encoder>), Failed> {
    let mut encoders = Vec::with_capacity(outputs.len());
    for (format, _) in outputs.iter() {
        encoders.push(Encoder::new(*format).map_err(Failed::Own)?);
    }
    let mut count = 0i64;
    let mut batch = Vec::new();
    while rows.next_rows(&mut batch).await {
        count += batch.len() as i64;
        for row in batch.drain(..) {
            for enc in encoders.iter_mut() {
                enc.row(&row)
                    .map_err(|e| Failed::Own(naming.name(e, &row)))?;
            }
        }
        for (enc, (_, writer)) in encoders.iter_mut().zip(outputs.iter_mut()) {
            if enc.pending() >= PART_CHUNK {
                writer.write(&enc.take()).await.map_err(Failed::Own)?;
            }
        }
    }
    if let Some(verdict) = verdict {
        verdict
            .await
            .unwrap_or_else(|_| {
                Err(ArchiveError::Invalid(
                    "the row producer vanished before finishing".into(),
                ))
            })
            .map_err(Failed::Producer)?;
    }
    Ok((count, encoders))
}

/// Joins each upload's parts and records each format in `artifact`; returns what was stored
/// and the first format's size. On failure the rest are aborted and the error comes with
/// what was already stored.
async fn finish_joined(
    joined: Vec<Joined>,
    finished: Vec<Vec<FinishedPart>>,
    artifact: &mut Artifact,
) -> std::result::Result<(super::uploads::Written, u64), (ArchiveError, super::uploads::Written)> {
    let mut written = Vec::new();
    let mut failure = None;
    let mut first_bytes = None;
    for (j, parts) in joined.into_iter().zip(finished) {
        if failure.is_some() {
            j.upload.abort().await;
            continue;
        }
        match j.upload.finish(parts).await {
            Ok(r) => {
                written.push((j.store, j.key));
                first_bytes.get_or_insert(r.size);
                artifact
                    .formats
                    .entry(j.format.id().to_string())
                    .or_insert(FormatRef {
                        uri: r.uri,
                        size_bytes: r.size as i64,
                        sha256: Some(r.sha256),
                    });
            }
            Err(e) => failure = Some(e),
        }
    }
    match failure {
        Some(e) => Err((e, written)),
        None => Ok((written, first_bytes.unwrap_or(0))),
    }
}
