//! The coordinator of a split export copied by separate worker processes (`--split N
//! --split-workers M`): it exports the snapshot and holds it (its transaction open) while
//! the workers (`larch export split-worker`, [`super::split_worker`]) copy the ranges its
//! plan names, then joins and commits the epoch ([`ArchiveWriter::write_snapshot_by_workers`]).
//! It copies no range itself.

use std::sync::Arc;
use std::time::Instant;

use sha2::Digest;

use super::subset::Subset;
use super::transform::Masking;
use super::{EpochShape, PreviousShape, compile_epoch};
use larch_archive::format::Format;
use larch_archive::manifest::Artifact;
use larch_archive::model::TableId;
use larch_archive::split_run::PageRange;
use larch_archive::writer::{ArchiveWriter, WorkersRun};
use larch_core::failure;
use larch_core::progress::{Progress, Reporter};
use larch_postgres::PostgresSource;
use larch_postgres::split::Range;

/// What the coordinator needs beyond a split's own inputs.
pub struct Coordination {
    pub parts: usize,
    pub workers: u16,
    /// How long each worker has to start before the run fails.
    pub start_timeout: std::time::Duration,
    pub formats: Vec<Format>,
    pub key_fields: Vec<String>,
    /// Who coordinates (the Lease holder's identity, the pod's or the host's name).
    pub identity: String,
}

/// Exports `table` (its source initialised) as a new epoch whose ranges the workers copy.
pub async fn snapshot_by_workers(
    source: Arc<PostgresSource>,
    table: &TableId,
    writer: &mut ArchiveWriter,
    progress: &Arc<Progress>,
    (masking, subset): (Option<&Masking>, Option<&Subset>),
    coordination: Coordination,
) -> anyhow::Result<Artifact> {
    let shared = source.shared_snapshot(std::slice::from_ref(table)).await?;
    let deadline = Instant::now() + source.config().limits.snapshot_max_age;
    let ranges = shared.split_ranges(table, coordination.parts).await?;
    progress.set_total(source.estimate_rows(table).await);
    let reporter = Reporter::start(progress.clone());
    writer.set_snapshot_time(shared.taken_at());
    let previous = PreviousShape::of(writer);
    let result = async {
        let shape = compile_epoch(&source, table, masking, subset)?;
        shape.describe(writer);
        let counted = progress.clone();
        let run = WorkersRun {
            snapshot: shared.snapshot_name().to_string(),
            ranges: ranges
                .iter()
                .map(|r| match r {
                    Range::Pages { first, end } => Ok(PageRange {
                        first: *first,
                        end: *end,
                    }),
                    // Key bounds are SQL literals: the plan in the store holds page numbers only.
                    Range::Keys { .. } => Err(failure::tag(
                        failure::Reason::InvalidConfig,
                        anyhow::anyhow!(
                            "table {table} has no pages of its own (a partitioned table): its key \
                             ranges are copied inside one process (--split without --split-workers)"
                        ),
                    )),
                })
                .collect::<anyhow::Result<_>>()?,
            workers: coordination.workers,
            settings: settings_digest(
                table,
                &coordination.formats,
                &coordination.key_fields,
                &shape,
            ),
            coordinator: coordination.identity.clone(),
            deadline,
            start_timeout: coordination.start_timeout,
            on_range: Box::new(move |rows| counted.add(rows, 0)),
        };
        let position = shared.position().to_string();
        Ok::<_, anyhow::Error>(writer.write_snapshot_by_workers(&position, run).await?)
    }
    .await;
    if result.is_err() {
        // The archive keeps the epoch it had, and the columns that describe it.
        previous.restore(writer);
    }
    reporter.finish(result.is_ok());
    let ended = shared.finish().await;
    if result.is_ok() {
        ended?;
    }
    result
}

/// The digest of what shapes a split's rows and bytes: the table, its formats and key fields,
/// the columns as written, the transform (with its key's fingerprint) and the subset. The
/// coordinator records it in the plan; a worker computes its own and refuses to copy when
/// they differ (it was given other settings, or another masking key).
pub(crate) fn settings_digest(
    table: &TableId,
    formats: &[Format],
    key_fields: &[String],
    shape: &EpochShape,
) -> String {
    let settings = serde_json::json!({
        "table": table.to_string(),
        "formats": formats,
        "key_fields": key_fields,
        "columns": shape.columns,
        "transform": shape.transform_record,
        "subset": shape.subset_record,
    });
    hex::encode(sha2::Sha256::digest(settings.to_string().as_bytes()))
}
