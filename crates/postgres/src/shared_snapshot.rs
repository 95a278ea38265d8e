//! [`SharedSnapshot`]: one exported snapshot several tables (or one table's ranges) are copied
//! from, each over a connection of its own that imports it.

use std::collections::{BTreeMap, HashMap};

use anyhow::{Context, anyhow};
use tokio_postgres::Client;

use crate::snapshot::{self, CreatedSlot};
use crate::subset_session::SubsetCopies;
use crate::types::Kind;
use crate::{PostgresConfig, PostgresSource, TableSchema, config, locked_snapshot, schema, split};
use larch_archive::model::TableId;
use larch_archive::position::Lsn;
use larch_archive::source::SourceError;

/// One exported snapshot that several tables are copied from, each over a connection of its
/// own that imports it (`SET TRANSACTION SNAPSHOT`), so every table's baseline holds the same
/// commits and has the same position: the slot's consistent point. The slot's session and the
/// coordinating transaction (its ACCESS SHARE locks keep DDL off the tables) stay open until
/// [`SharedSnapshot::finish`] or drop; a one-shot export's temporary slot ends with them.
pub struct SharedSnapshot {
    pub(crate) config: PostgresConfig,
    /// Kept open and idle: the exported snapshot is importable only while its session lives.
    pub(crate) slot: CreatedSlot,
    pub(crate) coordinator: Client,
    pub(crate) position: String,
    /// Read right after the slot's consistent point, as a single table's baseline does.
    pub(crate) taken_at: chrono::DateTime<chrono::FixedOffset>,
    pub(crate) schemas: BTreeMap<TableId, TableSchema>,
    pub(crate) kinds: HashMap<u32, Kind>,
    /// A subset's session and its COPY queries ([`SharedSnapshot::copy_subset_through`]).
    pub(crate) subset: Option<SubsetCopies>,
}

impl PostgresSource {
    /// Takes the snapshot `tables` are copied from (see [`SharedSnapshot`]): a new slot, its
    /// snapshot imported and the tables locked and discovered on the coordinating connection.
    pub async fn shared_snapshot(&self, tables: &[TableId]) -> Result<SharedSnapshot, SourceError> {
        let inner = &self.inner;
        let (slot, coordinator, schemas) = locked_snapshot(inner, tables).await?;
        for (t, predicate) in &inner.config.row_filters {
            let subqueries = inner.config.row_filter_subqueries.as_ref();
            snapshot::explain_row_filter(&coordinator, t, predicate, subqueries).await?;
        }
        let position = Lsn(slot.consistent_point).to_string();
        let taken_at = chrono::Utc::now().fixed_offset();
        let kinds = inner.kinds.lock().await.clone();
        Ok(SharedSnapshot {
            config: inner.config.clone(),
            slot,
            coordinator,
            position,
            taken_at,
            schemas,
            kinds,
            subset: None,
        })
    }
}

impl SharedSnapshot {
    /// The position every table's baseline has.
    pub fn position(&self) -> &str {
        &self.position
    }

    /// The exported snapshot's name, which other processes import (`SET TRANSACTION
    /// SNAPSHOT`) while this one lives.
    pub fn snapshot_name(&self) -> &str {
        &self.slot.snapshot
    }

    /// When the snapshot was taken: the time every table's baseline is named after.
    pub fn taken_at(&self) -> chrono::DateTime<chrono::FixedOffset> {
        self.taken_at
    }

    /// Copies `table` (one of the snapshot's) as of the snapshot into `rows`, over a new
    /// connection in a REPEATABLE READ transaction that imports it. Returns the number of rows.
    pub async fn copy_table<R: snapshot::RowSink>(
        &self,
        table: &TableId,
        rows: &R,
    ) -> Result<u64, SourceError> {
        self.copy_range(table, None, rows).await
    }

    /// [`Self::copy_table`] for the rows of one range of a split export only
    /// ([`split::Range::predicate`]; `None`: all of them).
    pub async fn copy_range<R: snapshot::RowSink>(
        &self,
        table: &TableId,
        range: Option<&str>,
        rows: &R,
    ) -> Result<u64, SourceError> {
        let schema = self
            .schemas
            .get(table)
            .ok_or_else(|| anyhow!("table {table} is not part of the shared snapshot"))?;
        if let Some(sql) = self.subset.as_ref().and_then(|s| s.queries.get(table)) {
            return self.copy_subset_table(schema, sql, rows).await;
        }
        let client = schema::connect_as(&self.config, config::Session::Snapshot)
            .await
            .with_context(|| format!("connecting to copy table {table}"))?;
        client
            .batch_execute(&snapshot::begin_at_snapshot(&self.slot.snapshot))
            .await
            .map_err(|e| {
                anyhow!(
                    "importing the shared snapshot to copy table {table}: {}",
                    schema::db_message(&e)
                )
            })?;
        let filter = self.config.row_filters.get(table);
        let n = snapshot::copy_table(
            &client,
            schema,
            &self.kinds,
            filter,
            self.config.row_filter_subqueries.as_ref(),
            range,
            self.slot.deadline,
            rows,
        )
        .await?;
        client
            .batch_execute("COMMIT")
            .await
            .map_err(|e| schema::db_error(format!("finishing the copy of table {table}"), &e))?;
        tracing::info!(table = %table, rows = n, position = %self.position, range = range.unwrap_or("all"), "baseline copied");
        Ok(n)
    }

    /// Cuts `table` into at most `parts` ranges of its pages, read in the snapshot's
    /// transaction ([`split::plan`]).
    pub async fn split_ranges(
        &self,
        table: &TableId,
        parts: usize,
    ) -> anyhow::Result<Vec<split::Range>> {
        split::plan(&self.coordinator, table, parts).await
    }

    /// Ends the coordinating transaction and the slot's session (a temporary slot goes with it).
    pub async fn finish(self) -> anyhow::Result<()> {
        if let Some(subset) = self.subset {
            subset.finish().await?;
        }
        self.coordinator
            .batch_execute("COMMIT")
            .await
            .map_err(|e| schema::db_error("finishing the shared snapshot's transaction", &e))?;
        drop(self.slot);
        Ok(())
    }
}
