//! The PostgreSQL target: restores the archive into a database table and keeps it following.
//!
//! * The table is created from the archive's columns when missing (laredo udt names mapped
//!   back to SQL types; unknown names → `text`, empty (inferred) → `jsonb`), primary key = the
//!   effective key fields.
//! * A baseline is one transaction: a staging table like the live one (no indexes) given the
//!   archive's columns, loaded by `COPY … FROM STDIN` ([`super::postgres_copy`]), its primary
//!   key built after the load, then swapped in (`DROP`, rename, the old table's other indexes and
//!   grants re-created) with the checkpoint row, so readers see the old table or the new one
//!   (C2). A table that others depend on (a view) is refilled in place from the staging table
//!   instead. The changes up to a checkpoint (one diff) are applied in
//!   one transaction together with the checkpoint row (C3): the data and its position never part,
//!   and readers see a diff whole or not at all. Memory stays bounded whatever the diff's size:
//!   changes collapse per identity into at most [`PENDING_LIMIT`] operations; past it they are
//!   written into the diff's transaction (opened then; upserts `INSERT … ON CONFLICT (pk) DO
//!   UPDATE`, deletes, a TRUNCATE when one comes) and collapsing starts over.
//! * A checkpoint is trusted only for the table it was written with ([`trusted_checkpoint`]):
//!   the row records the table's identity (OID and relfilenode) in the same transaction as
//!   the rows, so a destination table dropped and recreated, or truncated, behind the engine's
//!   back is re-baselined instead of served empty as if in sync.
//! * JSON values are converted by `jsonb_populate_record(NULL::tbl, row)`; bytea values arrive
//!   as base64 text and go through `decode(x, 'base64')`.

use std::collections::HashMap;

use anyhow::{Context, bail};
use async_trait::async_trait;
use futures::SinkExt;
use tokio::sync::Mutex;
use tokio_postgres::{Client, CopyInSink};

use super::postgres_copy::{CopyColumn, CopyEncoder, copy_columns};
pub use super::postgres_sql::{quote_ident, sql_type};
use super::{Resume, Target, postgres_alter};
use crate::engine::config::Connection;
use larch_archive::identity::{Identity, change_identity, row_identity};
use larch_archive::model::{Action, Change, ColumnDefinition, TableId};
use larch_archive::source::ChangeEvent;
use larch_archive::value::Row;
use larch_core::locks::MutexExt;

mod split_load;
mod statements;
mod swap;

use statements::Statements;

/// Name of the checkpoint table created in the destination schema.
pub const CHECKPOINT_TABLE: &str = "larch_checkpoint";
const BATCH_ROWS: usize = 1000;
/// Collapsed operations held before they are written into the open transaction.
pub const PENDING_LIMIT: usize = 10 * BATCH_ROWS;

fn qualified(t: &TableId) -> String {
    format!("{}.{}", quote_ident(&t.schema), quote_ident(&t.table))
}

/// SQL for the identity of the table named by parameter `$n` (its qualified name): its OID and
/// relfilenode. DROP + CREATE changes the OID; TRUNCATE (and rewrites such as VACUUM FULL)
/// the relfilenode.
fn table_identity_sql(n: u8) -> String {
    format!(
        "format('oid %s relfilenode %s', ${n}::text::regclass::oid, \
         coalesce(pg_relation_filenode(${n}::text::regclass)::text, 'none'))"
    )
}

/// Whether the checkpoint stored for `table` may be resumed from (C3): only when it was written
/// together with the rows of the table that exists now (`current` identity). Anything else —
/// no checkpoint, one written before identities were recorded, or one of a table since
/// dropped, recreated or truncated — means a baseline, whatever the state file says.
pub fn trusted_checkpoint(
    table: &TableId,
    stored: Option<(String, Option<String>)>,
    current: &str,
) -> Resume {
    match stored {
        None => Resume::Baseline(format!("no checkpoint for {table} in {CHECKPOINT_TABLE}")),
        Some((_, None)) => Resume::Baseline(format!(
            "the checkpoint of {table} records no table identity (written by an older larch)"
        )),
        Some((position, Some(identity))) if identity == current => Resume::At(position),
        Some((position, Some(identity))) => Resume::Baseline(format!(
            "the checkpoint of {table} at {position} was written with another table ({identity}; \
             now {current}): the table was dropped and recreated, or truncated, since"
        )),
    }
}

/// `CREATE TABLE IF NOT EXISTS` for the archive's columns.
pub fn create_table_sql(
    table: &TableId,
    columns: &[ColumnDefinition],
    key_fields: &[String],
) -> String {
    let mut defs = column_definitions(columns, key_fields);
    defs.push(format!("PRIMARY KEY ({})", quoted_list(key_fields)));
    format!(
        "CREATE TABLE IF NOT EXISTS {} ({})",
        qualified(table),
        defs.join(", ")
    )
}

/// `CREATE TABLE` for the archive's columns without its key: a bulk load builds the key's
/// index once, after the data ([`add_primary_key_sql`]), instead of row by row.
pub fn create_unkeyed_table_sql(
    table: &TableId,
    columns: &[ColumnDefinition],
    key_fields: &[String],
) -> String {
    format!(
        "CREATE TABLE {} ({})",
        qualified(table),
        column_definitions(columns, key_fields).join(", ")
    )
}

/// The key [`create_table_sql`] declares, added to a loaded table.
pub fn add_primary_key_sql(table: &TableId, key_fields: &[String]) -> String {
    format!(
        "ALTER TABLE {} ADD PRIMARY KEY ({})",
        qualified(table),
        quoted_list(key_fields)
    )
}

fn column_definitions(columns: &[ColumnDefinition], key_fields: &[String]) -> Vec<String> {
    let mut cols: Vec<&ColumnDefinition> = columns.iter().collect();
    cols.sort_by_key(|c| c.ordinal_position);
    cols.iter()
        .map(|c| {
            let not_null = if !c.nullable || key_fields.contains(&c.name) {
                " NOT NULL"
            } else {
                ""
            };
            format!(
                "{} {}{not_null}",
                quote_ident(&c.name),
                sql_type(&c.type_name)
            )
        })
        .collect()
}

fn quoted_list(names: &[String]) -> String {
    names
        .iter()
        .map(|k| quote_ident(k))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The net effect of the changes since the last checkpoint that are not written yet.
#[derive(Default)]
struct Pending {
    truncated: bool,
    /// identity → (true: upsert the row | false: delete, the row carries the key values).
    ops: HashMap<Identity, (bool, Row)>,
}

impl Pending {
    fn take(&mut self) -> Pending {
        std::mem::take(self)
    }
}

struct Conn {
    client: Client,
    /// A transaction is open: the baseline's, or the current diff's (after an early write).
    in_tx: bool,
    /// The baseline's COPY into its staging table, between `begin_baseline` and its commit.
    copy: Option<BaselineCopy>,
}

struct BaselineCopy {
    staging: TableId,
    columns: Vec<CopyColumn>,
    /// The columns' encoder, kept for every batch of the baseline.
    encoder: CopyEncoder,
    sink: BaselineSink,
}

/// Where a baseline's rows go: one COPY in the baseline's transaction, or `split` streams.
enum BaselineSink {
    One(std::pin::Pin<Box<CopyInSink<bytes::Bytes>>>),
    Split(split_load::SplitCopy),
}

impl BaselineSink {
    async fn send(&mut self, encoded: Vec<u8>) -> anyhow::Result<()> {
        match self {
            BaselineSink::One(sink) => Ok(sink.send(bytes::Bytes::from(encoded)).await?),
            BaselineSink::Split(split) => split.send(&encoded).await,
        }
    }

    /// Ends the COPY (every stream's): the rows loaded.
    async fn finish(self) -> anyhow::Result<u64> {
        match self {
            BaselineSink::One(mut sink) => Ok(sink.as_mut().finish().await?),
            BaselineSink::Split(split) => split.finish().await,
        }
    }
}

pub struct PostgresTarget {
    connection: Connection,
    table: TableId,
    source_id: String,
    conn: Mutex<Option<Conn>>,
    key_fields: std::sync::Mutex<Vec<String>>,
    /// The archive's columns (from `init`), which the next baseline gives the table.
    columns: std::sync::Mutex<Vec<ColumnDefinition>>,
    /// The table does not match the archive's columns: only a baseline may change it (C2).
    needs_alter: std::sync::atomic::AtomicBool,
    statements: std::sync::Mutex<Option<Statements>>,
    pending: std::sync::Mutex<Pending>,
    /// COPY streams a baseline loads over ([`split_load`]; 1: one, in its transaction).
    split: usize,
}

impl PostgresTarget {
    pub fn new(connection: Connection, table: TableId, source_id: String) -> PostgresTarget {
        PostgresTarget {
            connection,
            table,
            source_id,
            conn: Mutex::new(None),
            key_fields: std::sync::Mutex::new(vec!["id".into()]),
            columns: std::sync::Mutex::new(Vec::new()),
            needs_alter: std::sync::atomic::AtomicBool::new(false),
            statements: std::sync::Mutex::new(None),
            pending: std::sync::Mutex::new(Pending::default()),
            split: 1,
        }
    }

    /// Baselines load over `split` COPY streams (each its own connection).
    pub fn with_split(mut self, split: u16) -> PostgresTarget {
        self.split = usize::from(split.max(1));
        self
    }

    async fn connect(&self) -> anyhow::Result<Client> {
        let dsn = larch_postgres::connection::PgDsn::parse(&self.connection.resolve()?)
            .with_context(|| format!("postgres target {}", self.table))?;
        let (client, connection) = dsn
            .config
            .connect(dsn.tls()?)
            .await
            .with_context(|| format!("postgres target {}: connecting", self.table))?;
        let table = self.table.clone();
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::warn!(target_table = %table, error = %e, "postgres connection ended");
            }
        });
        Ok(client)
    }

    /// The connection, (re)connected when needed.
    async fn conn(&self) -> anyhow::Result<tokio::sync::MutexGuard<'_, Option<Conn>>> {
        let mut guard = self.conn.lock().await;
        if guard.as_ref().is_none_or(|c| c.client.is_closed()) {
            *guard = Some(Conn {
                client: self.connect().await?,
                in_tx: false,
                copy: None,
            });
        }
        Ok(guard)
    }

    fn statements(&self) -> anyhow::Result<Statements> {
        self.statements
            .locked()
            .clone()
            .ok_or_else(|| anyhow::anyhow!("postgres target {}: not initialised", self.table))
    }

    fn checkpoint_table(&self) -> TableId {
        TableId::new(&self.table.schema, CHECKPOINT_TABLE)
    }

    /// Builds the statements from the table's actual columns.
    async fn prepare(&self, client: &Client, key_fields: &[String]) -> anyhow::Result<Statements> {
        let rows = client
            .query(
                "SELECT a.attname::text, t.typname::text FROM pg_attribute a \
                 JOIN pg_type t ON t.oid = a.atttypid \
                 WHERE a.attrelid = $1::text::regclass AND a.attnum > 0 AND NOT a.attisdropped \
                 ORDER BY a.attnum",
                &[&qualified(&self.table)],
            )
            .await
            .with_context(|| format!("postgres target: reading the columns of {}", self.table))?;
        let cols: Vec<(String, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        for k in key_fields {
            if !cols.iter().any(|(n, _)| n == k) {
                bail!(
                    "postgres target: table {} has no column {k:?} (a key field)",
                    self.table
                );
            }
        }
        Ok(Statements::build(
            &self.table,
            &self.checkpoint_table(),
            &cols,
            key_fields,
        ))
    }

    /// Runs `stmt` (the upsert or the delete) over `rows` in batches, each deduplicated by
    /// identity (one statement cannot touch a row twice).
    async fn upsert_rows(&self, client: &Client, rows: &[&Row], stmt: &str) -> anyhow::Result<()> {
        let key_fields = self.key_fields.locked().clone();
        for chunk in rows.chunks(BATCH_ROWS) {
            let mut seen: HashMap<Identity, usize> = HashMap::new();
            let mut keep: Vec<&Row> = Vec::with_capacity(chunk.len());
            for r in chunk {
                let id = row_identity(r, &key_fields).unwrap_or_else(|| r.as_str().into());
                match seen.get(&id) {
                    Some(&i) => keep[i] = r,
                    None => {
                        seen.insert(id, keep.len());
                        keep.push(r);
                    }
                }
            }
            let mut body =
                String::with_capacity(keep.iter().map(|r| r.as_str().len() + 1).sum::<usize>() + 2);
            body.push('[');
            for (i, r) in keep.iter().enumerate() {
                if i > 0 {
                    body.push(',');
                }
                body.push_str(r.as_str());
            }
            body.push(']');
            client
                .execute(stmt, &[&body])
                .await
                .with_context(|| format!("postgres target: writing {}", self.table))?;
        }
        Ok(())
    }

    async fn write_checkpoint(
        &self,
        client: &Client,
        st: &Statements,
        position: &str,
    ) -> anyhow::Result<()> {
        client
            .execute(
                &st.checkpoint,
                &[
                    &self.table.to_string(),
                    &self.source_id,
                    &position,
                    &qualified(&self.table),
                ],
            )
            .await
            .with_context(|| {
                format!("postgres target: recording the position of {}", self.table)
            })?;
        Ok(())
    }
}

#[async_trait]
impl Target for PostgresTarget {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    fn is_durable(&self) -> bool {
        true
    }

    async fn init(
        &self,
        columns: &[ColumnDefinition],
        key_fields: &[String],
    ) -> anyhow::Result<()> {
        let guard = self.conn().await?;
        let client = &guard.as_ref().expect("connected").client;
        client
            .batch_execute(&format!(
                "CREATE SCHEMA IF NOT EXISTS {0}; \
                 CREATE TABLE IF NOT EXISTS {1} (target_table text PRIMARY KEY, source text NOT NULL, \
                 position text NOT NULL, updated_at timestamptz NOT NULL DEFAULT now()); \
                 ALTER TABLE {1} ADD COLUMN IF NOT EXISTS table_identity text",
                quote_ident(&self.table.schema),
                qualified(&self.checkpoint_table())
            ))
            .await
            .with_context(|| format!("postgres target {}: creating the checkpoint table", self.table))?;
        let exists: bool = client
            .query_one(
                "SELECT to_regclass($1::text) IS NOT NULL",
                &[&qualified(&self.table)],
            )
            .await?
            .get(0);
        if !exists {
            if columns.is_empty() {
                bail!(
                    "postgres target: table {} does not exist and the archive records no columns to create it from",
                    self.table
                );
            }
            let sql = create_table_sql(&self.table, columns, key_fields);
            client
                .batch_execute(&sql)
                .await
                .with_context(|| format!("postgres target: {sql}"))?;
            tracing::info!(table = %self.table, "created the destination table");
        }
        *self.key_fields.locked() = key_fields.to_vec();
        *self.columns.locked() = columns.to_vec();
        let shape = postgres_alter::read_shape(client, &qualified(&self.table)).await?;
        let alters = postgres_alter::alter_statements(&self.table, &shape, columns, key_fields);
        self.needs_alter
            .store(!alters.is_empty(), std::sync::atomic::Ordering::SeqCst);
        if !alters.is_empty() {
            tracing::info!(table = %self.table, changes = ?alters, "the destination table differs from the archive's columns: the next baseline alters it");
        }
        // The table as it is, while it still has the key fields (the baseline re-prepares).
        let st = match self.prepare(client, key_fields).await {
            Ok(st) => Some(st),
            Err(_) if !alters.is_empty() => None,
            Err(e) => return Err(e),
        };
        *self.statements.locked() = st;
        Ok(())
    }

    fn needs_baseline(&self) -> bool {
        self.needs_alter.load(std::sync::atomic::Ordering::SeqCst)
    }

    async fn resume_position(&self) -> anyhow::Result<Resume> {
        let guard = self.conn().await?;
        let client = &guard.as_ref().expect("connected").client;
        let current: String = client
            .query_one(
                &format!("SELECT {}", table_identity_sql(1)),
                &[&qualified(&self.table)],
            )
            .await
            .with_context(|| {
                format!(
                    "postgres target {}: reading the table's identity",
                    self.table
                )
            })?
            .get(0);
        let stored = client
            .query_opt(
                &format!(
                    "SELECT position, table_identity FROM {} WHERE target_table = $1",
                    qualified(&self.checkpoint_table())
                ),
                &[&self.table.to_string()],
            )
            .await
            .with_context(|| format!("postgres target {}: reading the checkpoint", self.table))?
            .map(|r| (r.get(0), r.get(1)));
        Ok(trusted_checkpoint(&self.table, stored, &current))
    }

    async fn begin_baseline(&self) -> anyhow::Result<()> {
        let mut guard = self.conn().await?;
        let conn = guard.as_mut().expect("connected");
        rollback(conn).await;
        let staging = staging_table(&self.table);
        // Split streams fill a staging table committed first (other connections write it);
        // one stream creates it in the baseline's transaction. Either drops one a failed or
        // killed split baseline left.
        let split = self.split > 1;
        conn.client
            .batch_execute(&format!(
                "{}DROP TABLE IF EXISTS {1}; CREATE TABLE {1} (LIKE {2} INCLUDING DEFAULTS \
                 INCLUDING CONSTRAINTS INCLUDING IDENTITY INCLUDING STORAGE INCLUDING COMPRESSION \
                 INCLUDING COMMENTS)",
                if split { "" } else { "BEGIN; " },
                qualified(&staging),
                qualified(&self.table)
            ))
            .await
            .with_context(|| format!("postgres target {}: starting the baseline", self.table))?;
        conn.in_tx = !split;
        let started = async {
            let columns = self.columns.locked().clone();
            let key_fields = self.key_fields.locked().clone();
            let shape = postgres_alter::read_shape(&conn.client, &qualified(&staging)).await?;
            let alters =
                postgres_alter::column_statements(&staging, &shape, &columns, &key_fields);
            for sql in &alters {
                conn.client.batch_execute(sql).await.with_context(|| {
                    format!("postgres target {}: giving the new table the archive's columns: {sql}", self.table)
                })?;
            }
            if !alters.is_empty() {
                tracing::info!(table = %self.table, changes = ?alters, "the baseline's table gets the archive's columns (swapped in with the rows)");
            }
            let columns = copy_columns(&conn.client, &qualified(&staging)).await?;
            let sink = if split {
                BaselineSink::Split(
                    split_load::SplitCopy::start(self, &staging, &columns, self.split).await?,
                )
            } else {
                let names: Vec<String> = columns.iter().map(|c| quote_ident(&c.name)).collect();
                let sql = format!("COPY {} ({}) FROM STDIN", qualified(&staging), names.join(", "));
                BaselineSink::One(Box::pin(conn.client.copy_in(&sql).await?))
            };
            anyhow::Ok(BaselineCopy {
                staging: staging.clone(),
                encoder: CopyEncoder::new(&columns),
                columns,
                sink,
            })
        }
        .await;
        match started {
            Ok(copy) => {
                conn.copy = Some(copy);
                Ok(())
            }
            Err(e) => {
                self.discard(conn).await;
                Err(e.context(format!(
                    "postgres target {}: starting the baseline",
                    self.table
                )))
            }
        }
    }

    async fn baseline_rows(&self, rows: Vec<Row>) -> anyhow::Result<()> {
        let mut guard = self.conn.lock().await;
        let split = self.split > 1;
        let copy = guard
            .as_mut()
            .filter(|c| c.in_tx || split)
            .and_then(|c| c.copy.as_mut())
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "postgres target {}: the baseline transaction was lost",
                    self.table
                )
            })?;
        let mut buf =
            Vec::with_capacity(rows.iter().map(|r| r.as_str().len()).sum::<usize>() + rows.len());
        for row in &rows {
            // The row's position, never its text: the error reaches /status.
            copy.encoder
                .encode(row.as_str(), &mut buf)
                .with_context(|| format!("postgres target {}: a baseline row", self.table))?;
        }
        copy.sink
            .send(buf)
            .await
            .with_context(|| format!("postgres target {}: copying the baseline", self.table))
    }

    async fn commit_baseline(&self, position: &str) -> anyhow::Result<()> {
        let mut guard = self.conn.lock().await;
        let split = self.split > 1;
        let conn = guard.as_mut().filter(|c| c.in_tx || split).ok_or_else(|| {
            anyhow::anyhow!(
                "postgres target {}: the baseline transaction was lost",
                self.table
            )
        })?;
        let Some(copy) = conn.copy.take() else {
            bail!(
                "postgres target {}: the baseline's COPY was lost",
                self.table
            );
        };
        let key_fields = self.key_fields.locked().clone();
        let st = match self.swap_in(conn, copy, &key_fields, position).await {
            Ok(st) => st,
            Err(e) => {
                self.discard(conn).await;
                return Err(e);
            }
        };
        conn.in_tx = false;
        *self.pending.locked() = Pending::default();
        *self.statements.locked() = Some(st);
        self.needs_alter
            .store(false, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    async fn abort_baseline(&self) {
        let mut guard = self.conn.lock().await;
        if let Some(conn) = guard.as_mut() {
            // Dropping the sink mid-COPY fails the COPY; the rollback drops the staging table.
            conn.copy = None;
            self.discard(conn).await;
        }
    }

    async fn apply(&self, c: &ChangeEvent) -> anyhow::Result<()> {
        if self.collapse(c) >= PENDING_LIMIT {
            // A large diff: write what is collapsed into its transaction now.
            let mut guard = self.conn().await?;
            let conn = guard.as_mut().expect("connected");
            let result = self.write_pending(conn).await;
            if let Err(e) = result {
                rollback(conn).await;
                return Err(e);
            }
        }
        Ok(())
    }

    async fn discard_pending(&self) {
        *self.pending.locked() = Pending::default();
        let mut guard = self.conn.lock().await;
        if let Some(conn) = guard.as_mut() {
            rollback(conn).await;
        }
    }

    async fn checkpoint(&self, position: &str) -> anyhow::Result<()> {
        let st = self.statements()?;
        let mut guard = self.conn().await?;
        let conn = guard.as_mut().expect("connected");
        let result = async {
            self.write_pending(conn).await?;
            self.write_checkpoint(&conn.client, &st, position).await?;
            conn.client.batch_execute("COMMIT").await?;
            conn.in_tx = false;
            anyhow::Ok(())
        }
        .await;
        if let Err(e) = result {
            rollback(conn).await;
            return Err(e.context(format!(
                "postgres target {}: applying changes up to {position}",
                self.table
            )));
        }
        Ok(())
    }
}

/// Where a baseline is copied before it replaces the table (same schema, so the rename keeps it).
fn staging_table(table: &TableId) -> TableId {
    TableId::new(&table.schema, format!("{}_larch_baseline", table.table))
}

impl PostgresTarget {
    /// Ends a failed baseline: its transaction rolled back, and a split baseline's staging
    /// table (committed before the streams) dropped.
    async fn discard(&self, conn: &mut Conn) {
        rollback(conn).await;
        if self.split > 1 {
            let staging = qualified(&staging_table(&self.table));
            let dropped = conn
                .client
                .batch_execute(&format!("DROP TABLE IF EXISTS {staging}"))
                .await;
            if let Err(e) = dropped {
                tracing::warn!(table = %self.table, error = %e, "the split baseline's staging table stays until the next baseline drops it");
            }
        }
    }
}

async fn rollback(conn: &mut Conn) {
    if conn.in_tx {
        let _ = conn.client.batch_execute("ROLLBACK").await;
        conn.in_tx = false;
    }
}

impl PostgresTarget {
    /// Collapses one change into the pending operations; returns how many there are.
    fn collapse(&self, c: &ChangeEvent) -> usize {
        let key_fields = self.key_fields.locked().clone();
        let change = Change {
            action: c.action,
            key: String::new(),
            old: c.old.clone(),
            new: c.new.clone(),
        };
        let mut p = self.pending.locked();
        match c.action {
            Action::Truncate => {
                p.ops.clear();
                p.truncated = true;
            }
            Action::Delete => {
                if let Some(old) = c.old.as_ref().or(c.new.as_ref()) {
                    p.ops
                        .insert(change_identity(&change, &key_fields), (false, old.clone()));
                }
            }
            Action::Insert | Action::Update => {
                let Some(new) = &c.new else {
                    return p.ops.len();
                };
                let id = change_identity(&change, &key_fields);
                if c.action == Action::Update
                    && let Some(old) = &c.old
                    && let Some(old_id) = row_identity(old, &key_fields)
                    && old_id != id
                {
                    p.ops.insert(old_id, (false, old.clone()));
                }
                p.ops.insert(id, (true, new.clone()));
            }
        }
        p.ops.len()
    }

    /// Writes the pending operations into the open transaction (opening it first): the
    /// TRUNCATE, then deletes and upserts of distinct identities (their order does not matter).
    async fn write_pending(&self, conn: &mut Conn) -> anyhow::Result<()> {
        let st = self.statements()?;
        let pending = self.pending.locked().take();
        if !conn.in_tx {
            conn.client.batch_execute("BEGIN").await?;
            conn.in_tx = true;
        }
        let client = &conn.client;
        if pending.truncated {
            client.batch_execute(&st.truncate).await?;
        }
        let deletes: Vec<&Row> = pending
            .ops
            .values()
            .filter(|(u, _)| !*u)
            .map(|(_, r)| r)
            .collect();
        self.upsert_rows(client, &deletes, &st.delete).await?;
        let upserts: Vec<&Row> = pending
            .ops
            .values()
            .filter(|(u, _)| *u)
            .map(|(_, r)| r)
            .collect();
        self.upsert_rows(client, &upserts, &st.upsert).await
    }
}

#[cfg(test)]
mod tests;
