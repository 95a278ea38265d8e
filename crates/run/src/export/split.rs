//! A split export of one table (`--split N`): the table cut into ranges of its pages
//! ([`larch_postgres::split`]), each copied over a connection of its own that imports the one
//! exported snapshot, masked and sampled like any baseline, and encoded by a worker of its own
//! into its part of the epoch's one snapshot object
//! ([`ArchiveWriter::write_snapshot_split`]). The manifest commit is the single commit point.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use super::subset::{Sampler, Subset};
use super::transform::{Masking, TableTransform};
use super::{
    BATCHES_IN_FLIGHT, BaselineSink, PreviousShape, baseline_verdict, describe_epoch, forward_rows,
};
use larch_archive::manifest::Artifact;
use larch_archive::model::TableId;
use larch_archive::value::Row;
use larch_archive::writer::{ArchiveWriter, SnapshotPart};
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
    // A restore that creates the table recreates its partitions from this.
    writer.set_partitioning(source.partitioning(table).await?);
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

/// Copies and writes every range; the first failure (with its reason) fails the epoch.
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
        let (src_tx, src_rx) = mpsc::channel::<(TableId, Vec<Row>)>(BATCHES_IN_FLIGHT);
        let (mask_tx, mask_rx) = oneshot::channel();
        let sink = BaselineSink {
            rows: src_tx,
            mask: std::sync::Mutex::new(Some(mask_rx)),
        };
        let (transform_tx, transform_rx) = oneshot::channel();
        let _ = transform_tx.send((transform.clone(), sampler.clone()));
        let (row_tx, row_rx) = mpsc::channel::<Vec<Row>>(BATCHES_IN_FLIGHT);
        let (verdict_tx, verdict_rx) = oneshot::channel();
        let (shared, table) = (shared.clone(), table.clone());
        let copy = async move {
            let position = shared.position().to_string();
            let copied = shared.copy_range(&table, predicate.as_deref(), &sink).await;
            copied.map(|_| position)
        };
        let forward = forward_rows(src_rx, transform_rx, mask_tx, row_tx, progress.clone());
        tokio::spawn(baseline_verdict(copy, forward, verdict_tx, reason.clone()));
        parts.push(SnapshotPart {
            rows: row_rx,
            verdict: Some(verdict_rx),
        });
    }
    let position = shared.position().to_string();
    writer
        .write_snapshot_split(&position, parts)
        .await
        .map_err(|e| failure::tag_opt(reason.get().copied(), anyhow::Error::from(e)))
}
