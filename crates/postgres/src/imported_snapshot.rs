//! A split export's worker process reads its ranges from the snapshot its coordinator
//! exported (`SET TRANSACTION SNAPSHOT`), over a connection of its own: the same rows, the
//! same position, without a slot of its own.

use std::collections::HashMap;

use anyhow::anyhow;
use tokio_postgres::Client;

use crate::config::Session;
use crate::types::Kind;
use crate::{PostgresSource, TableSchema, schema, snapshot};
use larch_archive::model::TableId;
use larch_archive::source::SourceError;
use larch_core::locks::MutexExt;

/// SQLSTATE of `SET TRANSACTION SNAPSHOT` naming a snapshot that no longer exists.
const INVALID_PARAMETER_VALUE: &str = "22023";

/// A transaction that imported a coordinator's snapshot, and the table as it sees it.
pub struct ImportedSnapshot {
    client: Client,
    table: TableId,
    schema: TableSchema,
    kinds: HashMap<u32, Kind>,
    deadline: std::time::Instant,
}

impl PostgresSource {
    /// Imports the exported snapshot `snapshot` to copy ranges of `table`, and discovers the
    /// table in it (its schema becomes [`PostgresSource::table_schema`]). `None`: the snapshot
    /// is gone (its coordinator's transaction ended).
    pub async fn import_snapshot(
        &self,
        table: &TableId,
        snapshot: &str,
    ) -> Result<Option<ImportedSnapshot>, SourceError> {
        let config = &self.inner.config;
        let client = schema::connect_as(config, Session::Snapshot).await?;
        let begin = crate::snapshot::begin_at_snapshot(snapshot);
        if let Err(e) = client.batch_execute(&begin).await {
            if e.code().map(|c| c.code()) == Some(INVALID_PARAMETER_VALUE) {
                return Ok(None);
            }
            return Err(anyhow!(
                "importing the coordinator's snapshot: {}",
                schema::db_message(&e)
            )
            .into());
        }
        let discovered = schema::discover(&client, table, &config.key_fields).await?;
        schema::check_key_fields(&discovered)?;
        let kinds = {
            let mut kinds = self.inner.kinds.lock().await;
            schema::resolve_kinds(&client, &discovered.type_oids, &mut kinds).await?;
            kinds.clone()
        };
        self.inner
            .schemas
            .locked()
            .insert(table.clone(), discovered.clone());
        Ok(Some(ImportedSnapshot {
            client,
            table: table.clone(),
            schema: discovered,
            kinds,
            deadline: std::time::Instant::now() + config.limits.snapshot_max_age,
        }))
    }
}

impl ImportedSnapshot {
    /// Copies the rows of `range` ([`crate::split::Range::predicate`]) that the source's row
    /// filter keeps into `rows`; returns their number.
    pub async fn copy_range<R: snapshot::RowSink>(
        &self,
        source: &PostgresSource,
        range: Option<&str>,
        rows: &R,
    ) -> Result<u64, SourceError> {
        let config = &source.inner.config;
        let n = snapshot::copy_table(
            &self.client,
            &self.schema,
            &self.kinds,
            config.row_filters.get(&self.table),
            config.row_filter_subqueries.as_ref(),
            range,
            self.deadline,
            rows,
        )
        .await?;
        tracing::info!(table = %self.table, rows = n, range = range.unwrap_or("all"), "range copied");
        Ok(n)
    }

    /// Ends the transaction.
    pub async fn finish(self) -> anyhow::Result<()> {
        self.client
            .batch_execute("COMMIT")
            .await
            .map_err(|e| schema::db_error("finishing the imported snapshot's transaction", &e))
    }
}
