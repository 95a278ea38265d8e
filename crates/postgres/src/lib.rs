//! The PostgreSQL source: schema discovery, a consistent baseline from a replication slot's
//! exported snapshot, and logical replication (pgoutput v1) from the slot.
//!
//! Positions are WAL LSNs in laredo's spelling (`X/XXXXXXXX`): a baseline's position is the
//! slot's consistent point; every change carries its transaction's commit LSN (W1) and each
//! transaction ends with a [`SourceEvent::Checkpoint`] at that commit LSN. `ack(p)` confirms
//! the transaction whose commit LSN is `p` (the slot advances to that transaction's end LSN);
//! nothing is confirmed to PostgreSQL that the consumer did not ack.
//!
//! Connections: tokio-postgres for SQL (schema, COPY, slot inspection, TOAST look-ups) and
//! pgwire-replication for the replication session; decoding is [`pgoutput`]. Both take the
//! connection string's TLS settings ([`crate::connection`]).

mod config;
pub mod connection;
pub mod errors;
mod imported_snapshot;
pub use imported_snapshot::ImportedSnapshot;
mod estimate;
mod lifecycle;
pub mod ownership;
mod partitions;
mod pgoutput;
pub mod preview;
pub mod reasons;
pub mod row_filter;
mod schema;
mod shared_snapshot;
pub use shared_snapshot::SharedSnapshot;
pub mod schema_change;
mod snapshot;
pub mod split;
pub use snapshot::{ColumnMask, RowSink, Treatment};
mod stream;
mod subset_session;
mod types;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{Context, anyhow, bail};
use async_trait::async_trait;
use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio_postgres::Client;

pub use config::{
    PostgresConfig, Reconnect, Session, SessionLimits, SlotMode, ident, literal, qualified,
};
pub use estimate::estimate_from_catalog;
pub use lifecycle::{CleanedObject, CleanupReport, SlotUsage, SlotWatcher, cleanup, slot_usage};
pub use ownership::owner_comment;
pub use row_filter::{SubqueryTables, check_row_filter, check_row_filter_with};
pub use schema::{TableSchema, discover};
pub use schema_change::SchemaChange;
pub use snapshot::encode_copy_lines;
pub use types::{Kind, to_json, write_string};

use larch_archive::model::{ColumnDefinition, TableId};
use larch_archive::position::Lsn;
use larch_archive::source::{
    Lag, SourceError, SourceEvent, SourceState, SyncSource, ValidationError,
};
use larch_archive::value::Row;
use larch_core::locks::MutexExt;
use ownership::PublicationRecord;
use snapshot::CreatedSlot;

/// Opens a session on the source database as larch does: its settings and the timeouts of a
/// `session` of that kind ([`SessionLimits`]).
pub async fn connect(config: &PostgresConfig, session: Session) -> anyhow::Result<Client> {
    schema::connect_as(config, session).await
}

/// Checks that a table has a usable key: a primary key, or the given key fields (which must be
/// columns). The error names the table and says what to pass.
pub fn check_key_fields(schema: &TableSchema) -> anyhow::Result<()> {
    schema::check_key_fields(schema)
}

pub struct PostgresSource {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    config: PostgresConfig,
    tables: Mutex<Vec<TableId>>,
    query: tokio::sync::Mutex<Option<Arc<Client>>>,
    schemas: Mutex<BTreeMap<TableId, TableSchema>>,
    kinds: tokio::sync::Mutex<HashMap<u32, Kind>>,
    /// The session that created the slot in the last baseline, not yet streaming.
    pending: tokio::sync::Mutex<Option<CreatedSlot>>,
    /// The end LSN of the newest transaction the consumer acked (0: none).
    acked_end: AtomicU64,
    ack_notify: Notify,
    /// Commit LSN → end LSN of delivered, not yet acked transactions (bounded).
    ends: Mutex<BTreeMap<u64, u64>>,
    last_acked: Mutex<Option<String>>,
    resume: AtomicBool,
    /// The slot as last read from `pg_replication_slots` (refreshed with the lag).
    usage: Mutex<Option<SlotUsage>>,
    /// `init` found the persistent slot invalidated (`wal_status = lost`): why, once.
    lost_at_init: Mutex<Option<String>>,
    state: Mutex<SourceState>,
    paused: watch::Sender<bool>,
    closed: watch::Sender<bool>,
    /// Lag in bytes; `u64::MAX` = unknown.
    lag_bytes: AtomicU64,
}

const MAX_PENDING_ENDS: usize = 100_000;

impl PostgresSource {
    pub fn new(config: PostgresConfig) -> PostgresSource {
        let (paused, _) = watch::channel(false);
        let (closed, _) = watch::channel(false);
        PostgresSource {
            inner: Arc::new(Inner {
                tables: Mutex::new(config.tables.clone()),
                config,
                query: tokio::sync::Mutex::new(None),
                schemas: Mutex::new(BTreeMap::new()),
                kinds: tokio::sync::Mutex::new(HashMap::new()),
                pending: tokio::sync::Mutex::new(None),
                acked_end: AtomicU64::new(0),
                ack_notify: Notify::new(),
                ends: Mutex::new(BTreeMap::new()),
                last_acked: Mutex::new(None),
                resume: AtomicBool::new(false),
                usage: Mutex::new(None),
                lost_at_init: Mutex::new(None),
                state: Mutex::new(SourceState::Connecting),
                paused,
                closed,
                lag_bytes: AtomicU64::new(u64::MAX),
            }),
        }
    }

    pub fn config(&self) -> &PostgresConfig {
        &self.inner.config
    }

    /// The discovered schema of a table (after `init`).
    pub fn table_schema(&self, table: &TableId) -> Option<TableSchema> {
        self.inner.schemas.locked().get(table).cloned()
    }

    /// [`SyncSource::baseline`] that also reports the baseline's position as soon as the slot
    /// exists and the tables' schemas are known (rediscovered under the baseline's lock, see
    /// [`PostgresSource::table_schema`]), before the first row: a consumer that names its
    /// output after the position (an archive snapshot) can start writing while rows stream.
    /// `rows` takes them one at a time or in batches ([`RowSink`]).
    pub async fn baseline_reporting<R: RowSink>(
        &self,
        tables: &[TableId],
        rows: R,
        position: Option<oneshot::Sender<String>>,
    ) -> Result<String, SourceError> {
        let inner = &self.inner;
        inner.set_state(SourceState::Baselining);
        let result = baseline(inner, tables, rows, position).await;
        inner.set_state(match &result {
            Ok(_) => SourceState::Connected,
            Err(SourceError::Stopped) => SourceState::Closed,
            Err(_) => SourceState::Error,
        });
        result
    }

    /// The configured publication and its larch owner record (`None`: it does not exist).
    pub async fn publication_record(&self) -> anyhow::Result<Option<PublicationRecord>> {
        let c = self.inner.client().await?;
        ownership::publication(&c, &self.inner.config.publication_name).await
    }

    /// Drops the configured publication when larch created it for this slot and owner and the slot is
    /// gone (or temporary, ending with its session): what a temporary slot's export, or an
    /// earlier one killed mid-run, left behind. A persistent slot keeps its publication.
    /// Returns whether it dropped one.
    pub async fn drop_publication_if_unused(&self) -> anyhow::Result<bool> {
        let (client, c) = (self.inner.client().await?, &self.inner.config);
        lifecycle::drop_publication_of_gone_slot(
            &client,
            &c.publication_name,
            &c.slot_name,
            &c.owner,
        )
        .await
    }

    /// The slot's WAL figures as last refreshed (every 5 s while streaming).
    pub fn slot_usage(&self) -> Option<SlotUsage> {
        self.inner.usage.locked().clone()
    }

    /// Why the persistent slot could not be resumed at `init` (it was invalidated), once.
    pub fn take_slot_lost_at_init(&self) -> Option<String> {
        self.inner.lost_at_init.locked().take()
    }

    /// How `table`'s schema now differs from the columns an archive was written with (and the
    /// key fields it uses), with the schema now.
    pub async fn schema_change(
        &self,
        table: &TableId,
        recorded: &[ColumnDefinition],
        recorded_keys: &[String],
    ) -> anyhow::Result<(SchemaChange, TableSchema)> {
        let client = self.inner.client().await?;
        let now = schema::discover(&client, table, &self.inner.config.key_fields).await?;
        let change =
            schema_change::classify(recorded, recorded_keys, &now.columns, &now.key_fields);
        Ok((change, now))
    }

    /// The catalog's estimate of `table`'s rows, as the planner makes it: `reltuples` scaled
    /// from the pages it was measured on (`relpages`) to the table's pages now. None when the
    /// table was never analyzed or vacuumed (`reltuples` is -1) or the look-up failed.
    pub async fn estimate_rows(&self, table: &TableId) -> Option<u64> {
        let client = self.inner.client().await.ok()?;
        let row = client
            .query_opt(
                "SELECT c.reltuples::float8, c.relpages::float8,
                        (pg_relation_size(c.oid) / current_setting('block_size')::int)::float8
                   FROM pg_class c
                  WHERE c.oid = to_regclass(format('%I.%I', $1::text, $2::text))",
                &[&table.schema, &table.table],
            )
            .await
            .ok()??;
        estimate_from_catalog(row.get(0), row.get(1), row.get(2))
    }

    /// Refreshes the lag from the server now.
    pub async fn refresh_lag(&self) -> anyhow::Result<Option<u64>> {
        self.inner.refresh_lag().await
    }
}

impl Inner {
    /// The slot as `init` finds it: a foreign or mismatched one is refused, an invalidated one
    /// remembered (a new baseline is needed), a healthy persistent one resumed from.
    async fn check_slot_at_init(&self, client: &Client) -> anyhow::Result<()> {
        let slot = &self.config.slot_name;
        match schema::slot_info(client, slot).await? {
            Some(info) => {
                let ours = info.plugin.as_deref() == Some("pgoutput") && !info.temporary;
                if self.config.slot_mode == SlotMode::Temporary || !ours {
                    bail!(
                        "replication slot {slot} already exists ({}): another export uses this \
                         name; choose another slot name",
                        if info.temporary {
                            "a temporary slot of another session"
                        } else {
                            "a persistent slot"
                        }
                    );
                }
                let db = client
                    .query_one("SELECT current_database()::text", &[])
                    .await?;
                let db: String = db.get(0);
                if info.database.as_deref() != Some(db.as_str()) {
                    bail!(
                        "replication slot {slot} belongs to database {:?}, not {db:?}: choose another slot name",
                        info.database.as_deref().unwrap_or("")
                    );
                }
                if info.wal_status.as_deref() == Some("lost") {
                    tracing::warn!(slot = %slot, "replication slot was invalidated (wal_status = lost); a new baseline is needed");
                    *self.lost_at_init.locked() = Some(format!(
                        "replication slot {slot} was invalidated while no exporter streamed from it (wal_status = lost: max_slot_wal_keep_size exceeded, WAL removed)"
                    ));
                } else if let Some(c) = info.confirmed_flush {
                    *self.last_acked.locked() = Some(Lsn(c).to_string());
                    self.resume.store(true, Ordering::Relaxed);
                }
            }
            None => {
                self.resume.store(
                    self.config.slot_mode == SlotMode::Persistent,
                    Ordering::Relaxed,
                );
            }
        }
        Ok(())
    }

    fn set_state(&self, s: SourceState) {
        *self.state.locked() = s;
    }

    fn is_closed(&self) -> bool {
        *self.closed.borrow()
    }

    /// The shared query connection, reconnecting when it was lost.
    async fn client(&self) -> anyhow::Result<Arc<Client>> {
        let mut guard = self.query.lock().await;
        if let Some(c) = guard.as_ref()
            && !c.is_closed()
        {
            return Ok(c.clone());
        }
        let c = Arc::new(schema::connect(&self.config).await?);
        *guard = Some(c.clone());
        Ok(c)
    }

    fn config_for(&self, tables: &[TableId]) -> PostgresConfig {
        let mut c = self.config.clone();
        c.tables = tables.to_vec();
        c
    }

    async fn refresh_lag(&self) -> anyhow::Result<Option<u64>> {
        let client = self.client().await?;
        let usage = lifecycle::slot_usage(&client, &self.config.slot_name).await?;
        let lag = usage.as_ref().and_then(|u| u.lag_bytes);
        self.lag_bytes
            .store(lag.unwrap_or(u64::MAX), Ordering::Relaxed);
        *self.usage.locked() = usage;
        Ok(lag)
    }

    async fn discover_all(
        &self,
        tables: &[TableId],
    ) -> anyhow::Result<BTreeMap<TableId, TableSchema>> {
        let client = self.client().await?;
        let mut out = BTreeMap::new();
        for t in tables {
            let s = schema::discover(&client, t, &self.config.key_fields).await?;
            schema::check_key_fields(&s)?;
            let mut kinds = self.kinds.lock().await;
            schema::resolve_kinds(&client, &s.type_oids, &mut kinds).await?;
            out.insert(t.clone(), s);
        }
        Ok(out)
    }

    fn tables(&self) -> Vec<TableId> {
        self.tables.locked().clone()
    }
}

#[async_trait]
impl SyncSource for PostgresSource {
    async fn init(
        &self,
        tables: &[TableId],
    ) -> anyhow::Result<BTreeMap<TableId, Vec<ColumnDefinition>>> {
        let inner = &self.inner;
        inner.set_state(SourceState::Connecting);
        let tables: Vec<TableId> = if tables.is_empty() {
            inner.config.tables.clone()
        } else {
            tables.to_vec()
        };
        if tables.is_empty() {
            bail!("no table configured for the PostgreSQL source");
        }
        *inner.tables.locked() = tables.clone();
        let result = async {
            let client = inner.client().await?;
            schema::check_wal_level(&client, &inner.config).await?;
            let schemas = inner.discover_all(&tables).await?;
            if !inner.config.row_filters.is_empty() && !inner.config.snapshot_only {
                bail!("a row filter applies to a one-shot export only: the diffs of a continuous one would not respect it");
            }
            for (t, predicate) in &inner.config.row_filters {
                let subqueries = inner.config.row_filter_subqueries.as_ref();
                snapshot::explain_row_filter(&client, t, predicate, subqueries).await?;
            }
            if !inner.config.snapshot_only {
                schema::ensure_publication(&client, &inner.config_for(&tables)).await?;
                for s in schemas.values() {
                    schema::check_published_columns(&client, &inner.config.publication_name, s)
                        .await?;
                }
            }
            inner.check_slot_at_init(&client).await?;
            let _ = inner.refresh_lag().await;
            Ok::<_, anyhow::Error>(schemas)
        }
        .await;
        match result {
            Ok(schemas) => {
                let columns = schemas
                    .iter()
                    .map(|(t, s)| (t.clone(), s.columns.clone()))
                    .collect();
                *inner.schemas.locked() = schemas;
                inner.set_state(SourceState::Connected);
                Ok(columns)
            }
            Err(e) => {
                inner.set_state(SourceState::Error);
                Err(e)
            }
        }
    }

    async fn validate_tables(&self, tables: &[TableId]) -> Vec<ValidationError> {
        let mut errors = Vec::new();
        let client = match self.inner.client().await {
            Ok(c) => c,
            Err(e) => {
                return tables
                    .iter()
                    .map(|t| ValidationError {
                        table: t.clone(),
                        code: "CONNECTION".into(),
                        message: e.to_string(),
                    })
                    .collect();
            }
        };
        for t in tables {
            match schema::discover(&client, t, &self.inner.config.key_fields).await {
                Ok(s) => {
                    if let Err(e) = schema::check_key_fields(&s) {
                        errors.push(ValidationError {
                            table: t.clone(),
                            code: "NO_KEY".into(),
                            message: e.to_string(),
                        });
                    }
                }
                Err(e) => errors.push(ValidationError {
                    table: t.clone(),
                    code: "NOT_FOUND".into(),
                    message: e.to_string(),
                }),
            }
        }
        errors
    }

    async fn baseline(
        &self,
        tables: &[TableId],
        rows: mpsc::Sender<(TableId, Row)>,
    ) -> Result<String, SourceError> {
        self.baseline_reporting(tables, rows, None).await
    }

    async fn stream(
        &self,
        from: &str,
        events: mpsc::Sender<SourceEvent>,
    ) -> Result<(), SourceError> {
        let result = stream::run(&self.inner, from, events).await;
        let closed = self.inner.is_closed();
        self.inner.set_state(match &result {
            _ if closed => SourceState::Closed,
            Ok(()) | Err(SourceError::Stopped) => SourceState::Connected,
            Err(_) => SourceState::Error,
        });
        result
    }

    async fn ack(&self, position: &str) -> anyhow::Result<()> {
        let lsn = Lsn::parse(position)
            .with_context(|| format!("cannot ack {position:?}: not a PostgreSQL LSN"))?;
        let end = {
            let mut ends = self.inner.ends.locked();
            let end = ends.get(&lsn.0).copied();
            // Everything up to this commit is acknowledged: forget it.
            *ends = ends.split_off(&(lsn.0 + 1));
            // An unknown position (another process delivered it) confirms just past the commit
            // record's start, which the server treats the same: that transaction is done.
            end.unwrap_or(lsn.0 + 1)
        };
        self.inner.acked_end.fetch_max(end, Ordering::SeqCst);
        *self.inner.last_acked.locked() = Some(position.to_string());
        // notify_one keeps a permit when the stream is busy, so an idle stream still wakes up.
        self.inner.ack_notify.notify_one();
        Ok(())
    }

    async fn last_acked_position(&self) -> anyhow::Result<Option<String>> {
        Ok(self.inner.last_acked.locked().clone())
    }

    fn supports_resume(&self) -> bool {
        self.inner.config.slot_mode == SlotMode::Persistent
            && self.inner.resume.load(Ordering::Relaxed)
    }

    fn pause(&self) {
        self.inner.paused.send_replace(true);
        self.inner.set_state(SourceState::Paused);
    }

    fn resume(&self) {
        self.inner.paused.send_replace(false);
    }

    fn lag(&self) -> Lag {
        let b = self.inner.lag_bytes.load(Ordering::Relaxed);
        Lag {
            bytes: (b != u64::MAX).then_some(b),
            time: None,
        }
    }

    fn state(&self) -> SourceState {
        *self.inner.state.locked()
    }

    async fn close(&self) {
        let inner = &self.inner;
        inner.closed.send_replace(true);
        // Dropping the slot's session ends it; PostgreSQL drops a temporary slot with it.
        inner.pending.lock().await.take();
        inner.query.lock().await.take();
        inner.set_state(SourceState::Closed);
    }
}

/// Rounds of a baseline whose table was rewritten between the slot's snapshot and the copy.
const BASELINE_ATTEMPTS: u32 = 5;

async fn baseline<R: RowSink>(
    inner: &Inner,
    tables: &[TableId],
    rows: R,
    mut report: Option<oneshot::Sender<String>>,
) -> Result<String, SourceError> {
    let tables: Vec<TableId> = if tables.is_empty() {
        inner.tables()
    } else {
        tables.to_vec()
    };
    let (created, copy_client, schemas) = locked_snapshot(inner, &tables).await?;
    let position = Lsn(created.consistent_point).to_string();
    if let Some(report) = report.take() {
        let _ = report.send(position.clone());
    }
    let kinds = inner.kinds.lock().await.clone();
    for t in &tables {
        let s = &schemas[t];
        let filter = inner.config.row_filters.get(t);
        let subqueries = inner.config.row_filter_subqueries.as_ref();
        let n = snapshot::copy_table(
            &copy_client,
            s,
            &kinds,
            filter,
            subqueries,
            None,
            created.deadline,
            &rows,
        )
        .await?;
        tracing::info!(table = %t, rows = n, position = %position, "baseline copied");
    }
    copy_client
        .batch_execute("COMMIT")
        .await
        .map_err(|e| schema::db_error("finishing the baseline transaction", &e))?;
    inner.ends.locked().clear();
    inner.acked_end.store(0, Ordering::SeqCst);
    *inner.last_acked.locked() = None;
    inner.resume.store(
        inner.config.slot_mode == SlotMode::Persistent,
        Ordering::Relaxed,
    );
    *inner.pending.lock().await = Some(created);
    Ok(position)
}

/// A new slot and a connection in a REPEATABLE READ transaction that imports its snapshot and
/// holds ACCESS SHARE locks on `tables`, with their schemas as the snapshot copies them; a new
/// snapshot when a table was rewritten after the slot's.
async fn locked_snapshot(
    inner: &Inner,
    tables: &[TableId],
) -> Result<(CreatedSlot, Client, BTreeMap<TableId, TableSchema>), SourceError> {
    let mut attempt = 1;
    loop {
        let (created, copy_client) = new_slot_and_snapshot(inner).await?;
        match lock_and_discover(inner, &copy_client, tables).await? {
            Ok(schemas) => return Ok((created, copy_client, schemas)),
            Err(rewritten) if attempt < BASELINE_ATTEMPTS => {
                tracing::warn!(table = %rewritten, attempt, "the table was rewritten (ALTER TABLE, TRUNCATE, VACUUM FULL) after the slot's snapshot was taken, so that snapshot sees it empty: taking another");
                drop(copy_client);
                drop(created);
                attempt += 1;
            }
            Err(rewritten) => {
                return Err(anyhow!(
                    "table {rewritten} was rewritten (ALTER TABLE, TRUNCATE, VACUUM FULL) during each of {BASELINE_ATTEMPTS} baselines in a row; retry when the DDL is done"
                )
                .into());
            }
        }
    }
}

/// A new slot (replacing the old one: a new baseline needs a new snapshot) and a connection in
/// a REPEATABLE READ transaction that imports the slot's snapshot.
async fn new_slot_and_snapshot(inner: &Inner) -> Result<(CreatedSlot, Client), SourceError> {
    // A previous baseline's session (and its temporary slot) is replaced.
    inner.pending.lock().await.take();
    let client = inner.client().await?;
    let slot = &inner.config.slot_name;
    if let Some(info) = wait_slot_idle(&client, slot).await? {
        if inner.config.slot_mode == SlotMode::Temporary || info.temporary {
            return Err(anyhow!(
                "replication slot {slot} already exists and belongs to another session"
            )
            .into());
        }
        if let Some(pid) = info.active_pid {
            return Err(anyhow!(
                "replication slot {slot} is in use by another process (pid {pid})"
            )
            .into());
        }
        ownership::check_replaceable(&client, &inner.config).await?;
        snapshot::drop_slot(&client, slot).await?;
    }
    let created = snapshot::create_slot(&inner.config).await?;
    let copy_client = schema::connect_as(&inner.config, config::Session::Snapshot).await?;
    copy_client
        .batch_execute(&snapshot::begin_at_snapshot(&created.snapshot))
        .await
        .map_err(|e| anyhow!("importing the slot's snapshot: {}", schema::db_message(&e)))?;
    Ok((created, copy_client))
}

/// Locks the tables in the snapshot's transaction (no DDL can change them until the copy is
/// done), then discovers their schemas as they are now: the copy reads the rows of the snapshot
/// through the current columns, so those are the columns of the baseline. `Err(table)`: the
/// table was rewritten after the snapshot, which then sees it empty (PostgreSQL's rewrites are
/// not MVCC-safe): the caller takes another snapshot.
async fn lock_and_discover(
    inner: &Inner,
    copy_client: &Client,
    tables: &[TableId],
) -> Result<Result<BTreeMap<TableId, TableSchema>, TableId>, SourceError> {
    larch_archive::crashpoint::pause_point(larch_archive::crashpoint::BASELINE_BEFORE_LOCK).await;
    for t in tables {
        let table = config::qualified(t);
        copy_client
            .batch_execute(&format!("LOCK TABLE {table} IN ACCESS SHARE MODE"))
            .await
            .map_err(|e| anyhow!("locking table {t}: {}", schema::db_message(&e)))?;
        // The snapshot's pg_class row against the current one.
        let same_file: bool = copy_client
            .query_one(
                "SELECT coalesce(relfilenode = pg_relation_filenode(oid), true) FROM pg_class WHERE oid = $1::text::regclass",
                &[&table],
            )
            .await
            .map_err(|e| anyhow!("inspecting table {t}: {}", schema::db_message(&e)))?
            .get(0);
        if !same_file {
            return Ok(Err(t.clone()));
        }
    }
    let schemas = inner.discover_all(tables).await?;
    if !inner.config.snapshot_only {
        let client = inner.client().await?;
        for s in schemas.values() {
            schema::check_published_columns(&client, &inner.config.publication_name, s).await?;
        }
    }
    inner.schemas.locked().extend(schemas.clone());
    Ok(Ok(schemas))
}

/// The slot's state once no session holds it, waiting up to 10 s: a session that just ended
/// (ours, after a failure or a close) releases its slot, or drops its temporary slot, a moment
/// later. `None`: the slot does not exist (any more).
async fn wait_slot_idle(client: &Client, slot: &str) -> anyhow::Result<Option<schema::SlotInfo>> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let info = schema::slot_info(client, slot).await?;
        let busy = info
            .as_ref()
            .is_some_and(|i| i.active_pid.is_some() || i.temporary);
        if !busy || std::time::Instant::now() >= deadline {
            return Ok(info);
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

fn remember_end(inner: &Inner, commit: u64, end: u64) {
    let mut ends = inner.ends.locked();
    ends.insert(commit, end);
    while ends.len() > MAX_PENDING_ENDS {
        ends.pop_first();
    }
}
