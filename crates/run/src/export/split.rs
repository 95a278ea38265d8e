//! A split export of one table (`--split N`): the table cut into ranges of its pages
//! ([`larch_postgres::split`]), each copied over a connection of its own that imports the one
//! exported snapshot, masked and sampled like any baseline, and encoded by a worker of its own
//! into its part of the epoch's one snapshot object
//! ([`ArchiveWriter::write_snapshot_split`]). The manifest commit is the single commit point.

use std::sync::Arc;

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::{mpsc, oneshot};

use super::subset::{Sampler, Subset};
use super::transform::{Masking, TableTransform};
use super::{
    BATCHES_IN_FLIGHT, BaselineSink, PreviousShape, baseline_verdict, describe_epoch, forward_rows,
};
use larch_archive::manifest::Artifact;
use larch_archive::model::TableId;
use larch_archive::source::SourceError;
use larch_archive::value::Row;
use larch_archive::writer::{ArchiveWriter, Attempt, SnapshotPart};
use larch_core::failure;
use larch_core::progress::{Progress, Reporter};
use larch_postgres::{PostgresSource, SharedSnapshot};

/// Exports `table` (its source initialised) as a new epoch in at most `parts` ranges read
/// concurrently from one snapshot; fewer when the table has fewer pages, one when it cannot be
/// cut by `ctid` (said in a log line).
pub async fn snapshot_split(
    source: Arc<PostgresSource>,
    table: &TableId,
    writer: &mut ArchiveWriter,
    progress: &Arc<Progress>,
    masking: Option<&Masking>,
    subset: Option<&Subset>,
    parts: usize,
) -> anyhow::Result<Artifact> {
    let shared = Arc::new(source.shared_snapshot(std::slice::from_ref(table)).await?);
    let ranges = shared.split_ranges(table, parts).await?;
    progress.set_total(source.estimate_rows(table).await);
    let reporter = Reporter::start(progress.clone());
    writer.set_snapshot_time(shared.taken_at());
    let previous = PreviousShape::of(writer);
    let epoch = describe_epoch(&source, table, writer, masking, subset);
    let result = match epoch {
        Ok(shape) => {
            let predicates = ranges.iter().map(|r| r.predicate()).collect();
            let written = write_ranges(&shared, table, writer, progress, shape, predicates).await;
            if written.is_err() {
                // The archive keeps the epoch it had, and the columns that describe it.
                previous.restore(writer);
            }
            written
        }
        Err(e) => Err(e),
    };
    reporter.finish(result.is_ok());
    // Every copy has ended once the writer has their verdicts; a failed one may still be
    // unwinding: its connection then ends the snapshot's session when it drops.
    if let Ok(shared) = Arc::try_unwrap(shared) {
        let ended = shared.finish().await;
        if result.is_ok() {
            ended?;
        }
    }
    result
}

/// Times a range is copied when its connection fails (a terminated backend, a dropped
/// connection) before the epoch fails.
const RANGE_ATTEMPTS: u32 = 3;

/// Copies and writes every range; a range whose connection failed is copied again from its
/// start while the snapshot is held (at most [`RANGE_ATTEMPTS`] times); any other first
/// failure (with its reason) fails the epoch.
async fn write_ranges(
    shared: &Arc<SharedSnapshot>,
    table: &TableId,
    writer: &mut ArchiveWriter,
    progress: &Arc<Progress>,
    (transform, sampler): (Option<Arc<TableTransform>>, Option<Sampler>),
    predicates: Vec<Option<String>>,
) -> anyhow::Result<Artifact> {
    let reason = Arc::new(std::sync::OnceLock::new());
    let mut parts = Vec::with_capacity(predicates.len());
    for predicate in predicates {
        let (retry_tx, retry_rx) = mpsc::channel(1);
        let range = RangeCopy {
            shared: shared.clone(),
            table: table.clone(),
            predicate,
            shape: (transform.clone(), sampler.clone()),
            progress: progress.clone(),
            reason: reason.clone(),
        };
        let (rows, verdict) = range.attempt(1, retry_tx);
        parts.push(SnapshotPart {
            rows,
            verdict: Some(verdict),
            retries: Some(retry_rx),
        });
    }
    let position = shared.position().to_string();
    writer
        .write_snapshot_split(&position, parts)
        .await
        .map_err(|e| failure::tag_opt(reason.get().copied(), anyhow::Error::from(e)))
}

/// One range's copy, attempted again while its failures are lost connections.
struct RangeCopy {
    shared: Arc<SharedSnapshot>,
    table: TableId,
    predicate: Option<String>,
    shape: (Option<Arc<TableTransform>>, Option<Sampler>),
    progress: Arc<Progress>,
    reason: Arc<std::sync::OnceLock<failure::Reason>>,
}

impl RangeCopy {
    /// Starts attempt `n` in the background: its rows and its verdict. When it fails on its
    /// connection and attempts are left, the next attempt goes to `retry_tx`; otherwise
    /// `retry_tx` is dropped (the part fails with the verdict).
    fn attempt(
        self,
        n: u32,
        retry_tx: mpsc::Sender<Attempt<mpsc::Receiver<Vec<Row>>>>,
    ) -> Attempt<mpsc::Receiver<Vec<Row>>> {
        let (src_tx, src_rx) = mpsc::channel::<(TableId, Vec<Row>)>(BATCHES_IN_FLIGHT);
        let (mask_tx, mask_rx) = oneshot::channel();
        let sink = BaselineSink {
            rows: src_tx,
            mask: std::sync::Mutex::new(Some(mask_rx)),
        };
        let (transform_tx, transform_rx) = oneshot::channel();
        let _ = transform_tx.send(self.shape.clone());
        let (row_tx, row_rx) = mpsc::channel::<Vec<Row>>(BATCHES_IN_FLIGHT);
        let (verdict_tx, verdict_rx) = oneshot::channel();
        let lost = Arc::new(AtomicBool::new(false));
        let this_reason = Arc::new(std::sync::OnceLock::new());
        let forward = forward_rows(src_rx, transform_rx, mask_tx, row_tx, self.progress.clone());
        tokio::spawn(async move {
            let (shared, table, predicate) = (&self.shared, &self.table, self.predicate.as_deref());
            let copy = async {
                let copied = shared.copy_range(table, predicate, &sink).await;
                drop(sink);
                if let Err(SourceError::Other(cause)) = &copied
                    && crate::reasons::classify(cause) == failure::Reason::ConnectionFailed
                {
                    lost.store(true, Ordering::Relaxed);
                }
                copied.map(|_| shared.position().to_string())
            };
            let ended = baseline_verdict(copy, forward, verdict_tx, this_reason.clone());
            ended.await;
            if lost.load(Ordering::Relaxed) && n < RANGE_ATTEMPTS {
                tracing::warn!(table = %table, range = predicate.unwrap_or("all"), attempt = n, "the range's connection failed: copying the range again from its start");
                let again = self.attempt(n + 1, retry_tx.clone());
                let _ = retry_tx.send(again).await;
            } else if let Some(r) = this_reason.get() {
                let _ = self.reason.set(*r);
            }
        });
        (row_rx, verdict_rx)
    }
}
