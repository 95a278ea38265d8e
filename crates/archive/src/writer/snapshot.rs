//! Base snapshots: streamed from the source's rows or folded from the archive itself
//! (compaction), committed at a new epoch.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, oneshot};

use super::ArchiveWriter;
use super::uploads::send_chunks;
use crate::error::{ArchiveError, Result};
use crate::format::Format;
use crate::manifest::{Artifact, ArtifactKind};
use crate::position;
use crate::value::Row;

impl ArchiveWriter {
    /// Writes a base snapshot at a new epoch from a stream of rows (every row of the table at
    /// `position`), then commits it (W5, W6). Buffered changes are dropped: the snapshot covers
    /// them. Memory stays bounded: rows go straight to streaming uploads.
    pub async fn write_snapshot(
        &mut self,
        position: &str,
        rows: mpsc::Receiver<Row>,
    ) -> Result<Artifact> {
        self.write_snapshot_verified(position, rows, None).await
    }

    /// The artifact of a base snapshot at `position`, the next epoch's; filled as it is
    /// written.
    pub(super) fn next_snapshot_artifact(&mut self, position: &str) -> Artifact {
        Artifact {
            kind: ArtifactKind::Snapshot,
            epoch: self.manifest.epoch + 1,
            from_position: None,
            to_position: position.to_string(),
            created_at: self.config.clock.now(),
            row_count: 0,
            change_count: 0,
            formats: BTreeMap::new(),
            first_commit_time: None,
            last_commit_time: None,
            snapshot_time: self.next_snapshot_time.take(),
        }
    }

    /// `write_snapshot` for a row stream whose producer reports success or failure once it
    /// ends: the snapshot commits only on success, so a producer that fails half-way never
    /// leaves a partial snapshot in the manifest.
    pub async fn write_snapshot_verified(
        &mut self,
        position: &str,
        mut rows: impl SnapshotRows,
        verdict: Option<oneshot::Receiver<Result<()>>>,
    ) -> Result<Artifact> {
        let mut artifact = self.next_snapshot_artifact(position);
        let mut uploads = self
            .start_uploads(&artifact, &self.config.snapshot_formats)
            .await?;
        let mut count: i64 = 0;
        let counter = self.row_progress.clone();
        let streamed: Result<()> = async {
            let mut batch = Vec::new();
            while rows.next_rows(&mut batch).await {
                let n = batch.len() as u64;
                let mut bytes = 0;
                for row in batch.drain(..) {
                    bytes += row.as_str().len() as u64;
                    for (_, enc, _) in uploads.iter_mut() {
                        enc.row(&row)
                            .map_err(|e| self.naming_the_row(e, Some(&row)))?;
                    }
                }
                count += n as i64;
                if let Some(p) = &counter {
                    p.add(n, bytes);
                }
                send_chunks(&mut uploads).await?;
            }
            match verdict {
                None => Ok(()),
                Some(v) => v.await.unwrap_or_else(|_| {
                    Err(ArchiveError::Invalid(
                        "the row producer vanished before finishing".into(),
                    ))
                }),
            }
        }
        .await;
        let ((), written, primary_bytes) =
            self.end_uploads(uploads, streamed, &mut artifact).await?;
        artifact.row_count = count;
        if let Err(e) = self.commit(artifact.clone(), Some(artifact.epoch)).await {
            self.cleanup(&written).await;
            return Err(e);
        }
        self.buffer.clear();
        self.buffer_commit_times = None;
        self.churn = 0;
        self.rows_estimate = count as u64;
        self.last_snapshot_at = Some(Instant::now());
        self.last_snapshot_bytes = primary_bytes;
        Ok(artifact)
    }

    /// Writes a new base snapshot at the head from the archive itself (the newest snapshot
    /// folded with its diff chain), without asking the source for a new baseline. Memory stays
    /// within the spill's memory limit whatever the size of the diffs ([`crate::fold`]).
    /// Buffered changes must have been flushed first; an open transaction stays open.
    pub async fn compact(&mut self) -> Result<Artifact> {
        self.compact_reporting(None).await
    }

    /// [`Self::compact`], counting the rows written in `progress` (against the newest
    /// snapshot's `row_count`).
    pub async fn compact_reporting(
        &mut self,
        progress: Option<Arc<larch_core::progress::Progress>>,
    ) -> Result<Artifact> {
        if !self.buffer.is_empty() {
            return Err(ArchiveError::Invalid(
                "flush buffered changes before compacting".into(),
            ));
        }
        let plan = crate::plan::plan_head(&self.manifest);
        let expected = plan.snapshot.as_ref().map(|s| s.row_count);
        // The head's time: the last diff's commit time, else the base snapshot's.
        self.next_snapshot_time = plan
            .diffs
            .last()
            .or(plan.snapshot.as_ref())
            .and_then(Artifact::end_time);
        if !position::same(&plan.head_position, &self.manifest.head_position) {
            return Err(ArchiveError::Invalid(format!(
                "cannot compact: the chain from the newest snapshot reaches {:?}, not the head {:?}",
                plan.head_position, self.manifest.head_position
            )));
        }
        let mut formats = self.config.snapshot_formats.clone();
        formats.extend(self.config.diff_formats.iter().copied());
        formats.extend(Format::ALL);
        formats.dedup();
        let reader = crate::reader::ArchiveReader::new(
            self.stores[0].clone(),
            &self.config.key_prefix,
            formats,
        )?;
        // The open transaction keeps its share of the memory.
        let limit = self.config.spill.memory_limit;
        let budget = limit
            .saturating_sub(self.pending.memory_bytes())
            .max(limit / 4);
        let head = crate::fold::head_rows(
            reader,
            plan,
            self.key_fields.clone(),
            self.spill.clone(),
            budget,
        );
        let position = self.manifest.head_position.clone();
        if let Some(p) = &progress {
            p.set_total(expected.map(|n| n.max(0) as u64));
        }
        self.row_progress = progress;
        let written = self
            .write_snapshot_verified(&position, head.rows, Some(head.verdict))
            .await;
        self.row_progress = None;
        written
    }
}

/// The rows of a snapshot as they arrive: one at a time (taken a few at once) or in batches.
pub trait SnapshotRows: Send {
    /// Moves the next rows into `batch` (empty on entry); false once the stream has ended.
    fn next_rows(&mut self, batch: &mut Vec<Row>) -> impl Future<Output = bool> + Send;
}

/// Rows a snapshot takes from a row-at-a-time channel at once.
const ROWS_PER_RECEIVE: usize = 256;

impl SnapshotRows for mpsc::Receiver<Row> {
    async fn next_rows(&mut self, batch: &mut Vec<Row>) -> bool {
        self.recv_many(batch, ROWS_PER_RECEIVE).await > 0
    }
}

impl SnapshotRows for mpsc::Receiver<Vec<Row>> {
    async fn next_rows(&mut self, batch: &mut Vec<Row>) -> bool {
        match self.recv().await {
            Some(rows) => {
                *batch = rows;
                true
            }
            None => false,
        }
    }
}
