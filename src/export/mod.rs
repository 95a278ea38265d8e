//! Export: PostgreSQL into an archive. One-shot (a base snapshot, a new epoch) or continuous
//! (a snapshot, then diffs until stopped, a new epoch whenever the new-epoch policy fires).

pub mod continuous;
pub mod lease;
pub mod slot;
pub mod transform;

use std::sync::Arc;

use anyhow::anyhow;
use tokio::sync::{mpsc, oneshot};

use crate::archive::error::ArchiveError;
use crate::archive::manifest::Artifact;
use crate::archive::model::TableId;
use crate::archive::value::Row;
use crate::archive::writer::ArchiveWriter;
use crate::failure;
use crate::progress::{Progress, Reporter};
use crate::source::postgres::PostgresSource;

/// Rows after which the pause point `export.baseline-rows` holds a baseline (tests read its
/// progress there).
const PAUSE_AFTER_ROWS: u64 = 10_000;

/// Takes a consistent baseline of `table` and writes it as a snapshot at a new epoch, rows
/// streaming from COPY straight into the upload (bounded memory). The snapshot is named after the
/// slot's consistent point, known before the first row, and commits only if the whole baseline
/// succeeded: a failed baseline leaves the archive as it was. The manifest's columns become the
/// ones the baseline copied (discovered under its lock, so a DDL just before it is included).
/// `progress` counts the rows copied (against the catalog's estimate) and is reported while the
/// copy runs ([`Reporter`]).
pub async fn snapshot_from_source(
    source: Arc<PostgresSource>,
    table: &TableId,
    writer: &mut ArchiveWriter,
    progress: &Arc<Progress>,
) -> anyhow::Result<Artifact> {
    progress.set_total(source.estimate_rows(table).await);
    let reporter = Reporter::start(progress.clone());
    let result = copy_into_snapshot(source, table, writer, progress.clone()).await;
    reporter.finish(result.is_ok());
    result
}

async fn copy_into_snapshot(
    source: Arc<PostgresSource>,
    table: &TableId,
    writer: &mut ArchiveWriter,
    progress: Arc<Progress>,
) -> anyhow::Result<Artifact> {
    let (src_tx, mut src_rx) = mpsc::channel::<(TableId, Row)>(1024);
    let (row_tx, row_rx) = mpsc::channel::<Row>(1024);
    let (pos_tx, pos_rx) = oneshot::channel::<String>();
    let (verdict_tx, verdict_rx) = oneshot::channel();
    // The verdict is an ArchiveError (the writer's type), a string of the source's error: its
    // reason (a missing privilege, a dropped connection) is kept here for the caller.
    let source_reason = Arc::new(std::sync::OnceLock::new());
    let reason_slot = source_reason.clone();
    let tables = [table.clone()];
    let baseline_source = source.clone();
    tokio::spawn(async move {
        let source = baseline_source;
        let forward = async {
            while let Some((_, row)) = src_rx.recv().await {
                progress.add(1, row.as_str().len() as u64);
                if progress.rows() == PAUSE_AFTER_ROWS {
                    crate::archive::crashpoint::pause_point(
                        crate::archive::crashpoint::EXPORT_BASELINE_ROWS,
                    )
                    .await;
                }
                if row_tx.send(row).await.is_err() {
                    break;
                }
            }
        };
        let (result, ()) = tokio::join!(
            source.baseline_reporting(&tables, src_tx, Some(pos_tx)),
            forward
        );
        let _ = verdict_tx.send(result.map(|_| ()).map_err(|e| {
            if let crate::source::SourceError::Other(cause) = &e
                && let reason = failure::classify(cause)
                && reason != failure::Reason::Failed
            {
                let _ = reason_slot.set(reason);
            }
            ArchiveError::Invalid(format!("baseline failed: {e:#}"))
        }));
    });
    let with_reason = |e: anyhow::Error| failure::tag_opt(source_reason.get().copied(), e);
    let position = match pos_rx.await {
        Ok(p) => p,
        // The baseline failed before it had a position: report why.
        Err(_) => {
            return Err(match verdict_rx.await {
                Ok(Err(e)) => with_reason(e.into()),
                _ => anyhow!("the baseline ended before it had a position"),
            });
        }
    };
    let previous = writer.manifest().columns.clone();
    if let Some(schema) = source.table_schema(table) {
        writer.set_columns(schema.columns);
    }
    match writer
        .write_snapshot_verified(&position, row_rx, Some(verdict_rx))
        .await
    {
        Ok(artifact) => Ok(artifact),
        Err(e) => {
            // The archive keeps the epoch it had, and the columns that describe it.
            writer.set_columns(previous);
            Err(with_reason(e.into()))
        }
    }
}
