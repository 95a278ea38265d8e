//! The session of a subset that follows foreign keys: its kept rows live in temporary tables
//! (private to it), so the subset's tables are copied over it ([`SharedSnapshot`]).

use std::collections::BTreeMap;

use anyhow::{Context, anyhow};
use larch_archive::model::TableId;
use larch_archive::source::SourceError;
use tokio_postgres::Client;

use crate::{SharedSnapshot, config, schema};

/// The session holding a subset's kept keys (temporary tables, private to it) and the COPY
/// query of each table: those tables are copied over it, one at a time.
pub(crate) struct SubsetCopies {
    pub(crate) client: tokio::sync::Mutex<Client>,
    pub(crate) queries: BTreeMap<TableId, String>,
}

impl SubsetCopies {
    /// Ends the session's transaction (its temporary tables go with the session).
    pub(crate) async fn finish(self) -> anyhow::Result<()> {
        self.client
            .into_inner()
            .batch_execute("COMMIT")
            .await
            .map_err(|e| schema::db_error("finishing the subset's transaction", &e))
    }
}

impl SharedSnapshot {
    /// Copies `schema`'s kept rows by `sql` over the subset's session, one table at a time.
    pub(crate) async fn copy_subset_table<R: crate::snapshot::RowSink>(
        &self,
        schema: &crate::TableSchema,
        sql: &str,
        rows: &R,
    ) -> Result<u64, SourceError> {
        let subset = self.subset.as_ref().expect("a subset's table");
        let client = subset.client.lock().await;
        let n = crate::snapshot::copy_query(
            &client,
            schema,
            &self.kinds,
            sql,
            self.slot.deadline,
            rows,
        )
        .await?;
        tracing::info!(table = %schema.id, rows = n, position = %self.position, "subset copied");
        Ok(n)
    }

    /// A new session whose transaction imports the snapshot, `prepare` run first outside it
    /// (a READ ONLY transaction cannot create even a temporary table). What the caller runs
    /// in it may write temporary tables only: the transaction is READ ONLY.
    pub async fn subset_session(&self, prepare: &str) -> Result<Client, SourceError> {
        let client = schema::connect_as(&self.config, config::Session::Snapshot)
            .await
            .context("connecting the subset's session")?;
        client
            .batch_execute(prepare)
            .await
            .map_err(|e| schema::db_error("preparing the subset's temporary tables", &e))?;
        client
            .batch_execute(&crate::snapshot::begin_at_snapshot(&self.slot.snapshot))
            .await
            .map_err(|e| {
                anyhow!(
                    "importing the shared snapshot into the subset's session: {}",
                    schema::db_message(&e)
                )
            })?;
        Ok(client)
    }

    /// From now on, each table of `queries` is copied by its query over `client` (a
    /// [`SharedSnapshot::subset_session`]), whose temporary tables the queries read.
    pub fn copy_subset_through(&mut self, client: Client, queries: BTreeMap<TableId, String>) {
        self.subset = Some(SubsetCopies {
            client: tokio::sync::Mutex::new(client),
            queries,
        });
    }

    /// When every COPY out of the snapshot must have ended (its age limit).
    pub fn deadline(&self) -> std::time::Instant {
        self.slot.deadline
    }
}
