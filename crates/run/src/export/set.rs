//! A one-shot export of several tables at one position: one exported snapshot
//! ([`SharedSnapshot`]), the tables copied concurrently over up to `parallel` connections that
//! import it, each into its own archive (its own writer, committed atomically as a new epoch).
//! Every table's snapshot has the same position and holds the same commits, so a transaction
//! that wrote several of the tables is in all of their snapshots or in none.

use std::sync::Arc;

use anyhow::Context;
use futures::{StreamExt, TryStreamExt};

use crate::export::closure::at_snapshot::{ClosureExport, compute_on};
use crate::export::subset::Subset;
use crate::export::transform::Masking;
use larch_archive::manifest::Artifact;
use larch_archive::model::TableId;
use larch_archive::source::SyncSource;
use larch_archive::store::Store;
use larch_archive::writer::{ArchiveWriter, WriterConfig};
use larch_core::failure::{self, Reason};
use larch_core::progress::Progress;
use larch_postgres::PostgresSource;

/// Tables copied at once when `--parallel` is not given (bounded by the number of tables).
pub const DEFAULT_PARALLEL: usize = 4;

/// One table of the set and the archive it goes to.
pub struct TableExport {
    pub table: TableId,
    pub writer: WriterConfig,
    /// Its row filter (also in the source's config) and sample, if any.
    pub subset: Option<Subset>,
}

/// A table's committed snapshot.
pub struct Exported {
    pub table: TableId,
    pub key_prefix: String,
    pub artifact: Artifact,
}

/// Exports every table of `set` at one position, at most `parallel` tables copying at once
/// (each streams: memory is bounded by `parallel`, not by the tables' sizes). Everything that
/// can be checked before the snapshot is, for every table first (the tables exist and have a
/// key, `masking` fits them, each archive opens), so such an error writes nothing anywhere. A
/// table that fails later fails the whole export with the table named: tables in flight are
/// abandoned (their archives keep the epoch they had), tables whose snapshot already committed
/// keep it (a complete snapshot at the shared position). With `closure`, every table's rows
/// are the subset's closure, computed at the snapshot first. `progress` gives each table's
/// progress counter.
pub async fn export_at_one_position(
    source: Arc<PostgresSource>,
    set: Vec<TableExport>,
    store: Arc<dyn Store>,
    parallel: usize,
    masking: Option<&Masking>,
    closure: Option<&ClosureExport>,
    progress: &(dyn Fn(&TableId) -> Arc<Progress> + Sync),
) -> anyhow::Result<Vec<Exported>> {
    let tables: Vec<TableId> = set.iter().map(|t| t.table.clone()).collect();
    let schemas = source.init(&tables).await?;
    if let Some(m) = masking {
        for t in &tables {
            if let Some(schema) = source.table_schema(t) {
                m.compile(&schema)
                    .with_context(|| format!("table {t}"))
                    .map_err(|e| failure::tag(Reason::InvalidConfig, e))?;
            }
        }
    }
    for t in &set {
        if let (Some(s), Some(schema)) = (&t.subset, source.table_schema(&t.table)) {
            s.sampler(&schema, masking.and_then(Masking::key))
                .map_err(|e| failure::tag(Reason::InvalidConfig, anyhow::anyhow!(e)))?;
        }
    }
    let mut writers = Vec::with_capacity(set.len());
    for t in set {
        let key_prefix = t.writer.key_prefix.clone();
        let mut writer = ArchiveWriter::open(vec![store.clone()], t.writer)
            .await
            .with_context(|| format!("opening the archive of table {}", t.table))?;
        writer.set_columns(schemas.get(&t.table).cloned().unwrap_or_default());
        writers.push((t.table, key_prefix, writer, t.subset));
    }
    let mut shared = source.shared_snapshot(&tables).await?;
    if let Some(closure) = closure {
        // Every table's rows are the closure's, and its manifest records it.
        let record = compute_on(&mut shared, &source, closure, masking).await?;
        for (_, _, _, subset) in &mut writers {
            *subset = Some(Subset {
                closure: Some(record.clone()),
                ..Subset::default()
            });
        }
    }
    let shared = Arc::new(shared);
    tracing::info!(
        tables = tables.len(),
        parallel,
        position = %shared.position(),
        "exporting the tables at one position"
    );
    let exported = futures::stream::iter(writers)
        .map(|(table, key_prefix, mut writer, subset)| {
            let (source, shared) = (source.clone(), shared.clone());
            async move {
                let artifact = crate::export::snapshot_from_shared(
                    source,
                    shared,
                    &table,
                    &mut writer,
                    &progress(&table),
                    masking,
                    subset.as_ref(),
                )
                .await
                // The reason (classified along the chain) stays the cause's.
                .with_context(|| format!("exporting table {table}"))?;
                anyhow::Ok(Exported {
                    table,
                    key_prefix,
                    artifact,
                })
            }
        })
        .buffer_unordered(parallel.max(1))
        .try_collect::<Vec<_>>()
        .await?;
    // The copies are done: only the coordinator and the slot's session hold the snapshot.
    match Arc::try_unwrap(shared) {
        Ok(shared) => shared.finish().await?,
        Err(_) => unreachable!("every copy has ended"),
    }
    let mut exported = exported;
    exported.sort_by_key(|e| tables.iter().position(|t| *t == e.table));
    Ok(exported)
}
