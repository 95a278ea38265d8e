//! The end of a baseline: the staging table, loaded by COPY, replaces the live table in the
//! baseline's transaction (C2), or refills it in place when other objects depend on it.

use anyhow::Context;
use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

use super::{
    BaselineCopy, Conn, CopyColumn, PostgresTarget, Statements, postgres_alter, qualified,
    quote_ident,
};
use larch_archive::model::TableId;
use larch_core::locks::MutexExt;

impl PostgresTarget {
    /// Ends the baseline's COPY, builds the key on the loaded rows, and replaces the table by
    /// the staging table in the baseline's transaction together with the checkpoint row (C2,
    /// C3). The old table's other indexes and its grants are re-created on the new one.
    pub(super) async fn swap_in(
        &self,
        conn: &mut Conn,
        copy: BaselineCopy,
        key_fields: &[String],
        position: &str,
    ) -> anyhow::Result<Statements> {
        let rows = copy
            .sink
            .finish()
            .await
            .with_context(|| format!("postgres target {}: copying the baseline", self.table))?;
        if !conn.in_tx {
            // Split streams committed their rows: the swap opens the baseline's transaction.
            conn.client.batch_execute("BEGIN").await?;
            conn.in_tx = true;
        }
        let client = &conn.client;
        let staging_pk = quote_ident(&format!("{}_pkey", copy.staging.table));
        self.key_staging(client, &copy.staging, &staging_pk, key_fields, rows)
            .await?;
        let tbl = qualified(&self.table);
        let old = postgres_alter::read_shape(client, &tbl).await?;
        let pk_name = match &old.primary_key {
            Some((name, _)) => name.clone(),
            None => format!("{}_pkey", self.table.table),
        };
        let recreate = self.indexes_and_grants(client, &tbl).await?;
        client.batch_execute("SAVEPOINT swap").await?;
        match client.batch_execute(&format!("DROP TABLE {tbl}")).await {
            Ok(()) => {
                self.rename_staging(client, &copy.staging, &staging_pk, &pk_name, &recreate)
                    .await?;
            }
            Err(e) if e.code() == Some(&SqlState::DEPENDENT_OBJECTS_STILL_EXIST) => {
                // A view or foreign key needs this very table: refill it in place instead (one
                // more copy of the rows, same transaction, so still C2).
                client.batch_execute("ROLLBACK TO swap").await?;
                tracing::warn!(table = %self.table, error = %e, "the table cannot be replaced (other objects depend on it): refilling it in place from the baseline");
                self.refill_in_place(client, &copy.staging, &copy.columns, key_fields)
                    .await?;
            }
            Err(e) => {
                return Err(anyhow::Error::from(e).context(format!(
                    "postgres target {}: replacing the table by the baseline",
                    self.table
                )));
            }
        }
        let st = self.prepare(client, key_fields).await?;
        self.write_checkpoint(client, &st, position).await?;
        client
            .batch_execute("COMMIT")
            .await
            .with_context(|| format!("postgres target {}: committing the baseline", self.table))?;
        tracing::info!(table = %self.table, rows, "baseline copied and swapped in");
        Ok(st)
    }

    /// The primary key, built on the staging table once its `rows` are loaded.
    async fn key_staging(
        &self,
        client: &Client,
        staging: &TableId,
        staging_pk: &str,
        key_fields: &[String],
        rows: u64,
    ) -> anyhow::Result<()> {
        let keys: Vec<String> = key_fields.iter().map(|k| quote_ident(k)).collect();
        client
            .batch_execute(&format!(
                "ALTER TABLE {} ADD CONSTRAINT {staging_pk} PRIMARY KEY ({})",
                qualified(staging),
                keys.join(", ")
            ))
            .await
            .with_context(|| {
                format!(
                    "postgres target {}: the baseline's key ({}) on its {rows} rows",
                    self.table,
                    key_fields.join(", ")
                )
            })?;
        Ok(())
    }

    /// The statements re-creating the table's other indexes (their definitions name the
    /// table, which the new one takes over) and its grants to other roles.
    async fn indexes_and_grants(&self, client: &Client, tbl: &str) -> anyhow::Result<Vec<String>> {
        Ok(client
            .query(
                "SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i \
                  WHERE i.indrelid = $1::text::regclass AND NOT i.indisprimary \
                 UNION ALL \
                 SELECT format('GRANT %s ON %s TO %s', a.privilege_type, $1, \
                               CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END) \
                   FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a \
                   LEFT JOIN pg_roles r ON r.oid = a.grantee \
                  WHERE c.oid = $1::text::regclass AND a.grantee <> c.relowner",
                &[&tbl],
            )
            .await
            .with_context(|| format!("postgres target {}: reading its indexes and grants", self.table))?
            .iter()
            .map(|r| r.get(0))
            .collect())
    }

    /// The staging table takes the dropped table's name and key name, and `recreate` is run
    /// on it; a statement that no longer applies is skipped with a warning.
    async fn rename_staging(
        &self,
        client: &Client,
        staging: &TableId,
        staging_pk: &str,
        pk_name: &str,
        recreate: &[String],
    ) -> anyhow::Result<()> {
        let tbl = qualified(&self.table);
        client
            .batch_execute(&format!(
                "ALTER TABLE {} RENAME TO {}; \
                 ALTER TABLE {tbl} RENAME CONSTRAINT {staging_pk} TO {}",
                qualified(staging),
                quote_ident(&self.table.table),
                quote_ident(pk_name)
            ))
            .await
            .with_context(|| format!("postgres target {}: swapping in the baseline", self.table))?;
        for sql in recreate {
            let kept = client
                .batch_execute(&format!("SAVEPOINT recreate; {sql}; RELEASE recreate"))
                .await;
            if let Err(e) = kept {
                client.batch_execute("ROLLBACK TO recreate").await?;
                tracing::warn!(table = %self.table, statement = %sql, error = %e, "not carried over to the new table (the archive's columns changed?)");
            }
        }
        Ok(())
    }

    /// The table itself emptied, altered to the archive's columns and filled from the staging
    /// table, which is dropped (inside the baseline's transaction).
    async fn refill_in_place(
        &self,
        client: &Client,
        staging: &TableId,
        columns: &[CopyColumn],
        key_fields: &[String],
    ) -> anyhow::Result<()> {
        let tbl = qualified(&self.table);
        client.batch_execute(&format!("TRUNCATE {tbl}")).await?;
        let archive_columns = self.columns.locked().clone();
        let shape = postgres_alter::read_shape(client, &tbl).await?;
        for sql in
            postgres_alter::alter_statements(&self.table, &shape, &archive_columns, key_fields)
        {
            client.batch_execute(&sql).await.with_context(|| {
                format!(
                    "postgres target {}: altering the table to the archive's columns: {sql}",
                    self.table
                )
            })?;
        }
        let names: Vec<String> = columns.iter().map(|c| quote_ident(&c.name)).collect();
        let names = names.join(", ");
        client
            .batch_execute(&format!(
                "INSERT INTO {tbl} ({names}) SELECT {names} FROM {0}; DROP TABLE {0}",
                qualified(staging)
            ))
            .await
            .with_context(|| format!("postgres target {}: refilling the table", self.table))?;
        Ok(())
    }
}
