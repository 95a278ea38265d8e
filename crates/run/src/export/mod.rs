//! Export: PostgreSQL into an archive. One-shot (a base snapshot, a new epoch) or continuous
//! (a snapshot, then diffs until stopped, a new epoch whenever the new-epoch policy fires).

pub mod closure;
pub mod continuous;
pub mod fake;
pub mod lease;
pub mod preflight;
pub mod run;
pub mod set;
pub mod slot;
pub mod split;
pub mod split_coordinator;
pub mod split_worker;
pub mod status;
pub mod subset;
pub mod transform;

use std::future::Future;
use std::sync::Arc;

use anyhow::anyhow;
use tokio::sync::{mpsc, oneshot};

use larch_archive::error::ArchiveError;
use larch_archive::manifest::Artifact;
use larch_archive::model::TableId;
use larch_archive::source::SourceError;
use larch_archive::value::Row;
use larch_archive::writer::ArchiveWriter;
use larch_core::failure;
use larch_core::locks::MutexExt;
use larch_core::progress::{Progress, Reporter};
use larch_postgres::{ColumnMask, PostgresSource, RowSink, SharedSnapshot, TableSchema};
use subset::{Sampler, Subset};
use transform::{Masking, TableTransform, TransformError};

/// Rows after which the pause point `export.baseline-rows` holds a baseline (tests read its
/// progress there).
const PAUSE_AFTER_ROWS: u64 = 10_000;

/// Batches of rows each channel of a snapshot holds: with batches of at most
/// 256 KiB of row text (the baseline's batches), about a MiB in flight per channel.
const BATCHES_IN_FLIGHT: usize = 4;

/// Takes a consistent baseline of `table` and writes it as a snapshot at a new epoch, rows
/// streaming from COPY straight into the upload (bounded memory). The snapshot is named after the
/// slot's consistent point, known before the first row, and commits only if the whole baseline
/// succeeded: a failed baseline leaves the archive as it was. The manifest's columns become the
/// ones the baseline copied (discovered under its lock, so a DDL just before it is included).
/// `progress` counts the rows copied (against the catalog's estimate) and is reported while the
/// copy runs ([`Reporter`]). With `masking`, its rules are compiled for the columns found under
/// the lock (an error there exports nothing) and every row goes through them before it is
/// encoded; the manifest records the transform. With `subset` (a one-shot export), the rows
/// outside its sample are left out (its row filter is the source's, in the COPY) and the
/// manifest records it.
pub async fn snapshot_from_source(
    source: Arc<PostgresSource>,
    table: &TableId,
    writer: &mut ArchiveWriter,
    progress: &Arc<Progress>,
    masking: Option<&Masking>,
    subset: Option<&Subset>,
) -> anyhow::Result<Artifact> {
    let rows_from = RowSource::OwnSlot(source.clone());
    reported_snapshot(source, rows_from, table, writer, progress, masking, subset).await
}

/// [`snapshot_from_source`] for one table of a [`SharedSnapshot`]: its rows as of the
/// snapshot several tables share, named after (and timed at) the shared position.
pub async fn snapshot_from_shared(
    source: Arc<PostgresSource>,
    shared: Arc<SharedSnapshot>,
    table: &TableId,
    writer: &mut ArchiveWriter,
    progress: &Arc<Progress>,
    masking: Option<&Masking>,
    subset: Option<&Subset>,
) -> anyhow::Result<Artifact> {
    let rows_from = RowSource::Shared(shared);
    reported_snapshot(source, rows_from, table, writer, progress, masking, subset).await
}

/// [`copy_into_snapshot`] with its progress counted against the catalog's estimate and
/// reported while it runs.
async fn reported_snapshot(
    source: Arc<PostgresSource>,
    rows_from: RowSource,
    table: &TableId,
    writer: &mut ArchiveWriter,
    progress: &Arc<Progress>,
    masking: Option<&Masking>,
    subset: Option<&Subset>,
) -> anyhow::Result<Artifact> {
    progress.set_total(source.estimate_rows(table).await);
    let reporter = Reporter::start(progress.clone());
    let result = copy_into_snapshot(
        source,
        rows_from,
        table,
        writer,
        progress.clone(),
        masking,
        subset,
    )
    .await;
    reporter.finish(result.is_ok());
    result
}

/// Where a snapshot's rows come from.
enum RowSource {
    /// A baseline of its own: a new slot and its exported snapshot.
    OwnSlot(Arc<PostgresSource>),
    /// One table of a snapshot several tables share.
    Shared(Arc<SharedSnapshot>),
}

/// The single point a row of a change passes before it is buffered or encoded: through the
/// epoch's transform when the export masks. A baseline's rows are masked as the baseline
/// encodes them ([`BaselineSink`]), or here when they are sampled first.
pub fn mask_row(transform: Option<&TableTransform>, row: Row) -> Result<Row, TransformError> {
    match transform {
        Some(t) => t.apply(row),
        None => Ok(row),
    }
}

/// [`mask_row`] on the `old` or `new` side of a change.
pub fn mask_row_opt(
    transform: Option<&TableTransform>,
    row: Option<Row>,
) -> Result<Option<Row>, TransformError> {
    row.map(|r| mask_row(transform, r)).transpose()
}

/// The baseline's way to the snapshot: its batches of rows, and the mask its encoder applies
/// to every COPY field (the epoch's transform, once compiled), so a masked baseline row is
/// written once and never exists raw as a row.
struct BaselineSink {
    rows: mpsc::Sender<(TableId, Vec<Row>)>,
    mask: std::sync::Mutex<Option<oneshot::Receiver<Option<Arc<TableTransform>>>>>,
}

impl RowSink for BaselineSink {
    async fn send_rows(&self, table: &TableId, rows: Vec<Row>) -> Result<(), SourceError> {
        self.rows.send_rows(table, rows).await
    }

    async fn column_mask(
        &self,
        schema: &TableSchema,
    ) -> Result<Option<Box<dyn ColumnMask>>, SourceError> {
        let pending = self.mask.locked().take();
        let Some(pending) = pending else {
            return Ok(None);
        };
        match pending.await {
            Ok(transform) => Ok(transform
                .and_then(|t| t.baseline_mask(&schema.columns))
                .map(|m| Box::new(m) as Box<dyn ColumnMask>)),
            // The export stopped before it had compiled the transform.
            Err(_) => Err(SourceError::Stopped),
        }
    }
}

async fn copy_into_snapshot(
    source: Arc<PostgresSource>,
    rows_from: RowSource,
    table: &TableId,
    writer: &mut ArchiveWriter,
    progress: Arc<Progress>,
    masking: Option<&Masking>,
    subset: Option<&Subset>,
) -> anyhow::Result<Artifact> {
    // A restore that creates the table recreates its partitions from this.
    writer.set_partitioning(source.partitioning(table).await?);
    // Batches of at most BATCH_ROWS rows (BATCH_BYTES of text) cross each channel.
    let (src_tx, src_rx) = mpsc::channel::<(TableId, Vec<Row>)>(BATCHES_IN_FLIGHT);
    let (mask_tx, mask_rx) = oneshot::channel();
    let sink = BaselineSink {
        rows: src_tx,
        mask: std::sync::Mutex::new(Some(mask_rx)),
    };
    // The rows' transform and sample, known once the baseline has the columns (before its
    // first row).
    let (transform_tx, transform_rx) =
        oneshot::channel::<(Option<Arc<TableTransform>>, Option<Sampler>)>();
    let (row_tx, row_rx) = mpsc::channel::<Vec<Row>>(BATCHES_IN_FLIGHT);
    let (pos_tx, pos_rx) = oneshot::channel::<String>();
    let (verdict_tx, verdict_rx) = oneshot::channel();
    // The verdict is an ArchiveError (the writer's type), a string of the source's error: its
    // reason (a missing privilege, a dropped connection) is kept here for the caller.
    let source_reason = Arc::new(std::sync::OnceLock::new());
    let snapshot_time = match &rows_from {
        RowSource::OwnSlot(_) => None,
        RowSource::Shared(shared) => Some(shared.taken_at()),
    };
    let copy = copy_rows(rows_from, table.clone(), sink, pos_tx);
    let forward = forward_rows(src_rx, transform_rx, mask_tx, row_tx, progress);
    tokio::spawn(baseline_verdict(
        copy,
        forward,
        verdict_tx,
        source_reason.clone(),
    ));
    let with_reason = |e: anyhow::Error| failure::tag_opt(source_reason.get().copied(), e);
    let position = match pos_rx.await {
        // Read right after the slot's consistent point: every commit the snapshot holds is
        // earlier.
        Ok(p) => {
            writer.set_snapshot_time(
                snapshot_time.unwrap_or_else(|| chrono::Utc::now().fixed_offset()),
            );
            p
        }
        // The baseline failed before it had a position: report why. The forwarding task
        // waits for the transform; dropping its sender lets it (and the verdict) finish.
        Err(_) => {
            drop(transform_tx);
            return Err(match verdict_rx.await {
                Ok(Err(e)) => with_reason(e.into()),
                _ => anyhow!("the baseline ended before it had a position"),
            });
        }
    };
    let previous = PreviousShape::of(writer);
    let (transform, sampler) = describe_epoch(&source, table, writer, masking, subset)?;
    if transform_tx.send((transform, sampler)).is_err() {
        previous.restore(writer);
        return Err(match verdict_rx.await {
            Ok(Err(e)) => with_reason(e.into()),
            _ => anyhow!("the baseline ended before its first row"),
        });
    }
    match writer
        .write_snapshot_verified(&position, row_rx, Some(verdict_rx))
        .await
    {
        Ok(artifact) => Ok(artifact),
        Err(e) => {
            // The archive keeps the epoch it had, and the columns that describe it.
            previous.restore(writer);
            Err(with_reason(e.into()))
        }
    }
}

/// The baseline's COPY of `table` into `sink`, its position sent on `pos_tx` before the
/// first row.
async fn copy_rows(
    rows_from: RowSource,
    table: TableId,
    sink: BaselineSink,
    pos_tx: oneshot::Sender<String>,
) -> Result<String, SourceError> {
    match rows_from {
        RowSource::OwnSlot(source) => {
            source
                .baseline_reporting(&[table], sink, Some(pos_tx))
                .await
        }
        RowSource::Shared(shared) => {
            let _ = pos_tx.send(shared.position().to_string());
            let copied = shared.copy_table(&table, &sink).await;
            copied.map(|_| shared.position().to_string())
        }
    }
}

/// Runs the copy and the forwarding together and sends their verdict: a failed transform
/// first, else the copy's error, whose reason is kept in `reason_slot`.
async fn baseline_verdict(
    copy: impl Future<Output = Result<String, SourceError>>,
    forward: impl Future<Output = Result<(), TransformError>>,
    verdict_tx: oneshot::Sender<Result<(), ArchiveError>>,
    reason_slot: Arc<std::sync::OnceLock<failure::Reason>>,
) {
    let (result, forwarded) = tokio::join!(copy, forward);
    if let Err(e) = forwarded {
        let _ = verdict_tx.send(Err(ArchiveError::Invalid(e.to_string())));
        return;
    }
    let _ = verdict_tx.send(result.map(|_| ()).map_err(|e| {
        if let SourceError::Other(cause) = &e {
            let reason = crate::reasons::classify(cause);
            // A lock wait that ran out waited for someone else's transaction: retrying can
            // succeed, so it stays `Failed` instead of becoming an invalid baseline.
            let waited = failure::sqlstate_in(&format!("{cause:#}")) == Some("55P03");
            if reason != failure::Reason::Failed || waited {
                let _ = reason_slot.set(reason);
            }
        }
        ArchiveError::Invalid(format!("baseline failed: {e:#}"))
    }));
}

/// Forwards the baseline's batches to the writer once the transform and sample are known:
/// sampled on the raw values, then masked here when sampled (the encoder masks otherwise),
/// counted in `progress`. Owns `src_rx`: when it stops (a failed transform), the baseline's
/// sends fail.
async fn forward_rows(
    mut src_rx: mpsc::Receiver<(TableId, Vec<Row>)>,
    transform_rx: oneshot::Receiver<(Option<Arc<TableTransform>>, Option<Sampler>)>,
    mask_tx: oneshot::Sender<Option<Arc<TableTransform>>>,
    row_tx: mpsc::Sender<Vec<Row>>,
    progress: Arc<Progress>,
) -> Result<(), TransformError> {
    let Ok((transform, sampler)) = transform_rx.await else {
        return Ok(());
    };
    // Sampling reads raw rows: a sampled baseline is masked here, after the sample;
    // any other in its encoder.
    let transform = match sampler {
        None => {
            let _ = mask_tx.send(transform);
            None
        }
        Some(_) => {
            let _ = mask_tx.send(None);
            transform
        }
    };
    while let Some((_, mut rows)) = src_rx.recv().await {
        // Sampled on the raw values (the same as in every table), before masking.
        if let Some(s) = &sampler {
            rows.retain(|row| s.keeps(row));
        }
        if rows.is_empty() {
            continue;
        }
        let rows: Vec<Row> = rows
            .into_iter()
            .map(|row| mask_row(transform.as_deref(), row))
            .collect::<Result<_, _>>()?;
        let before = progress.rows();
        let bytes = rows.iter().map(|r| r.as_str().len() as u64).sum();
        progress.add(rows.len() as u64, bytes);
        if before < PAUSE_AFTER_ROWS && progress.rows() >= PAUSE_AFTER_ROWS {
            larch_archive::crashpoint::pause_point(larch_archive::crashpoint::EXPORT_BASELINE_ROWS)
                .await;
        }
        if row_tx.send(rows).await.is_err() {
            break;
        }
    }
    Ok(())
}

/// Compiles the epoch's transform and sample for the columns the baseline found, and makes
/// the manifest describe them (columns as masked, transform and subset records). An error
/// here leaves the writer as it was.
fn describe_epoch(
    source: &PostgresSource,
    table: &TableId,
    writer: &mut ArchiveWriter,
    masking: Option<&Masking>,
    subset: Option<&Subset>,
) -> anyhow::Result<(Option<Arc<TableTransform>>, Option<Sampler>)> {
    let shape = compile_epoch(source, table, masking, subset)?;
    shape.describe(writer);
    Ok((shape.transform, shape.sampler))
}

/// An epoch's transform and sample, compiled for the table's columns, and what the manifest
/// records of them.
pub(crate) struct EpochShape {
    pub transform: Option<Arc<TableTransform>>,
    pub sampler: Option<Sampler>,
    /// The columns as written (masked); `None` when the table's columns are unknown.
    pub columns: Option<Vec<larch_archive::model::ColumnDefinition>>,
    pub transform_record: Option<larch_archive::masking::TransformRecord>,
    pub subset_record: Option<larch_archive::masking::SubsetRecord>,
}

impl EpochShape {
    /// Makes the manifest describe the epoch.
    fn describe(&self, writer: &mut ArchiveWriter) {
        writer.set_subset(self.subset_record.clone());
        if let Some(columns) = &self.columns {
            writer.set_columns(columns.clone());
        }
        writer.set_transform(self.transform_record.clone());
    }
}

/// The transform and sample of `table` compiled for the columns the source found.
pub(crate) fn compile_epoch(
    source: &PostgresSource,
    table: &TableId,
    masking: Option<&Masking>,
    subset: Option<&Subset>,
) -> anyhow::Result<EpochShape> {
    let schema = source.table_schema(table);
    let transform = match (masking, &schema) {
        (None, _) => None,
        (Some(m), Some(schema)) => Some(
            m.compile(schema)
                .map_err(|e| failure::tag(failure::Reason::InvalidConfig, e))?,
        ),
        (Some(_), None) => {
            return Err(anyhow!(
                "the columns of {table} are unknown: its transform cannot be checked"
            ));
        }
    };
    let sampler = match (subset, &schema) {
        (Some(s), Some(schema)) => s
            .sampler(schema, masking.and_then(Masking::key))
            .map_err(|e| failure::tag(failure::Reason::InvalidConfig, anyhow!(e)))?,
        _ => None,
    };
    Ok(EpochShape {
        subset_record: subset.and_then(|s| s.record(schema.as_ref())),
        columns: schema.map(|schema| match &transform {
            Some(t) => t.columns(&schema.columns),
            None => schema.columns,
        }),
        transform_record: transform.as_ref().map(|t| t.record().clone()),
        transform,
        sampler,
    })
}

/// What the manifest said of the current epoch before a baseline: put back when the baseline
/// fails, so the archive keeps the epoch it had and the columns that describe it.
struct PreviousShape {
    columns: Vec<larch_archive::model::ColumnDefinition>,
    transform: Option<larch_archive::masking::TransformRecord>,
    subset: Option<larch_archive::masking::SubsetRecord>,
}

impl PreviousShape {
    fn of(writer: &ArchiveWriter) -> PreviousShape {
        let m = writer.manifest();
        PreviousShape {
            columns: m.columns.clone(),
            transform: m.transform.clone(),
            subset: m.subset.clone(),
        }
    }

    fn restore(self, writer: &mut ArchiveWriter) {
        writer.set_columns(self.columns);
        writer.set_transform(self.transform);
        writer.set_subset(self.subset);
    }
}
