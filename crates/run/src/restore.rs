//! A one-shot restore: tables of an archive, at its head or as of a point, loaded into a
//! PostgreSQL database in one transaction, then done (`larch restore`, the `ArchiveRestore`
//! kind's Job). docs/restore.md.
//!
//! * Everything that can be checked is checked before the database is touched: each table's
//!   manifest, the point (a position or an RFC 3339 time, [`PointInTime`], as every `--at`),
//!   the key fields, whether each destination table exists
//!   (`--if-exists fail`), and that a table to replace has every archived column.
//! * One transaction for every table: a new table is created from the archive's columns
//!   (as the engine's PostgreSQL target creates it), an existing one (`replace`) is emptied
//!   with `TRUNCATE` and keeps its definition, indexes, grants and dependent views; rows go
//!   in by `COPY … FROM STDIN` ([`crate::engine::targets::postgres_copy`]). Any error rolls
//!   it all back: nothing half-written. Readers of a replaced table wait for the commit and
//!   then see the restored rows, never a partial table.
//! * Rows stream from the archive in bounded memory ([`larch_archive::fold::head_rows`]:
//!   the diffs' net effect past its budget spills to disk), never a whole table.
//! * Several tables restore at one point: the given one, else the greatest position every
//!   table's chain reaches (the smallest of their heads). Each table is folded up to its last
//!   diff ending at or before that point (a diff straddling it is left out, as for
//!   `reconstruct --at`); the summary gives the position each reached.

use std::cmp::Ordering;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use bytes::Bytes;

use crate::engine::targets::postgres::{
    add_primary_key_sql, create_unkeyed_table_sql, quote_ident,
};
use crate::engine::targets::postgres_copy::{CopyColumn, copy_columns};
use larch_archive::error::ArchiveError;
use larch_archive::format::Format;
use larch_archive::manifest::{Manifest, format_time};
use larch_archive::model::{TableId, check_key_fields, effective_key_fields};
use larch_archive::plan::{Plan, plan_as_of, plan_head, short_chain};
use larch_archive::point_in_time::{PointInTime, resolve};
use larch_archive::position::compare;
use larch_archive::reader::ArchiveReader;
use larch_archive::spill::SpillConfig;
use larch_archive::store::Store;
use larch_core::failure::{self, Reason};
use larch_core::progress::{Progress, Reporter};

mod after_load;
mod partitions;
mod snapshot_blocks;
pub mod status;
pub(crate) mod streams;
pub use status::RestoreProgress;
pub use streams::{MAX_SPLIT, staging_table};

pub use larch_contract::restore_request::{
    IfExists, RestoreRequest, RestoreSummary, TableRestored,
};

/// One restore, its archives opened: which archives, at which point, into which database.
pub struct RestoreInputs {
    pub store: Arc<dyn Store>,
    /// Each table and the key prefix of its archive ([`table_key_prefix`] for an export's).
    pub tables: Vec<(TableId, String)>,
    pub formats: Vec<Format>,
    /// The point, as `larch archive reconstruct --at` takes it; `None`: the head.
    pub at: Option<String>,
    pub if_exists: IfExists,
    /// The destination's connection string (never logged).
    pub dsn: String,
    pub spill: SpillConfig,
    /// COPY streams per table the restore creates (`--split`, 1: one stream in the restore's
    /// transaction).
    pub split: usize,
}

/// Where an export of several tables (or one, by default) writes `table`: `<root><schema>.<table>/`.
pub fn table_key_prefix(root: &str, table: &TableId) -> String {
    format!("{root}{table}/")
}

/// One table's archive, read and planned.
struct Planned {
    table: TableId,
    reader: ArchiveReader,
    manifest: Manifest,
    key_fields: Vec<String>,
    plan: Plan,
}

fn invalid(e: anyhow::Error) -> anyhow::Error {
    failure::tag(Reason::InvalidConfig, e)
}

/// Reads each table's manifest and plans it at one point; touches no database.
async fn plan_tables(request: &RestoreInputs) -> anyhow::Result<(String, Vec<Planned>)> {
    let loaded = load_manifests(request).await?;
    let (point, smallest_head) = match &request.at {
        Some(at) => (at.clone(), None),
        None => common_head(&loaded)?,
    };
    // A time resolves per table to its last transaction committed at or before it (one
    // database, one commit clock: the tables are consistent at that time); a position is
    // the same position in every table.
    let at = request
        .at
        .as_deref()
        .map(|at| {
            at.parse::<PointInTime>()
                .map_err(|e| invalid(anyhow::anyhow!("--at: {e}")))
        })
        .transpose()?;
    let mut planned = Vec::new();
    for (table, reader, manifest) in &loaded {
        let resolved = match &at {
            Some(at) => resolve(manifest, at).map(|r| r.plan),
            None => plan_as_of(manifest, &point),
        };
        let plan = match (resolved, smallest_head) {
            (Ok(plan), _) => plan,
            // Without --at: this table's archive starts after another's head.
            (Err(ArchiveError::Predates { oldest, .. }), Some(other)) => {
                return Err(invalid(anyhow::anyhow!(
                    "table {table}: its archive starts at {oldest}, after {point}, the greatest \
                     position every table reaches (the head of {other}): the tables have no \
                     common point; pass --at {oldest} or later to restore each at its last state \
                     at or before it"
                )));
            }
            (Err(e), _) => {
                return Err(invalid(
                    anyhow::Error::new(e).context(format!("table {table}: --at")),
                ));
            }
        };
        check_key_fields(&[], &manifest.columns)
            .map_err(|e| invalid(anyhow::anyhow!("table {table}: {e}")))?;
        if let Some(record) = &manifest.partitioning {
            larch_archive::partitioning::check(record).map_err(|e| {
                invalid(anyhow::anyhow!(
                    "table {table}: the manifest's partitioning: {e}"
                ))
            })?;
        }
        let key_fields = effective_key_fields(&[], &manifest.columns);
        planned.push(Planned {
            table: table.clone(),
            reader: reader.clone(),
            manifest: manifest.clone(),
            key_fields,
            plan,
        });
    }
    Ok((point, planned))
}

/// Each requested table's archive and manifest; a table named twice, or without an archive
/// or a snapshot, is refused.
async fn load_manifests(
    request: &RestoreInputs,
) -> anyhow::Result<Vec<(TableId, ArchiveReader, Manifest)>> {
    if request.tables.is_empty() {
        return Err(invalid(anyhow::anyhow!("no table to restore (--table)")));
    }
    let mut loaded = Vec::new();
    for (table, prefix) in &request.tables {
        if loaded.iter().any(|(t, _, _)| t == table) {
            return Err(invalid(anyhow::anyhow!("table {table} is named twice")));
        }
        let reader = ArchiveReader::new(request.store.clone(), prefix, request.formats.clone())?;
        let Some((manifest, _)) = reader.try_load_manifest().await? else {
            return Err(invalid(anyhow::anyhow!(
                "table {table}: {} has no archive at key prefix {prefix:?} ({} not found)",
                reader.store().name(),
                reader.manifest_key()
            )));
        };
        if manifest.snapshots().next().is_none() {
            return Err(invalid(anyhow::anyhow!(
                "table {table}: the archive at {prefix:?} holds no snapshot yet: nothing to restore"
            )));
        }
        loaded.push((table.clone(), reader, manifest));
    }
    Ok(loaded)
}

/// Without `--at`: the smallest head of the tables (the greatest position every one
/// reaches), and the table it is the head of. A table whose chain stops short is refused.
fn common_head(
    loaded: &[(TableId, ArchiveReader, Manifest)],
) -> anyhow::Result<(String, Option<&TableId>)> {
    let mut smallest_head: Option<&TableId> = None;
    let mut reached: Option<String> = None;
    for (table, reader, manifest) in loaded {
        let head = plan_head(manifest);
        if let Some(short) = short_chain(manifest, &head) {
            return Err(anyhow::anyhow!(
                "table {table}: {}: {short}; the archive cannot reproduce its head (see \
                 `larch archive verify`); pass --at {} to restore the state it reaches",
                reader.manifest_key(),
                short.reached
            ));
        }
        if reached
            .as_deref()
            .is_none_or(|r| compare(&head.head_position, r) == Ordering::Less)
        {
            reached = Some(head.head_position);
            smallest_head = Some(table);
        }
    }
    Ok((reached.expect("at least one table"), smallest_head))
}

fn qualified(t: &TableId) -> String {
    format!("{}.{}", quote_ident(&t.schema), quote_ident(&t.table))
}

/// Whether `table` exists in the destination.
async fn exists(client: &tokio_postgres::Client, table: &TableId) -> anyhow::Result<bool> {
    Ok(client
        .query_one(
            "SELECT to_regclass($1::text) IS NOT NULL",
            &[&qualified(table)],
        )
        .await
        .with_context(|| format!("restore: looking up table {table}"))?
        .get(0))
}

/// The COPY columns of an archived table in `destination` (its kinds), refusing a destination
/// that lacks an archived column.
async fn archived_columns(
    client: &tokio_postgres::Client,
    planned: &Planned,
) -> anyhow::Result<Vec<CopyColumn>> {
    archived_columns_of(client, &planned.table, planned).await
}

/// [`archived_columns`] of the table `destination` (a split load's staging table).
async fn archived_columns_of(
    client: &tokio_postgres::Client,
    destination: &TableId,
    planned: &Planned,
) -> anyhow::Result<Vec<CopyColumn>> {
    let destination = copy_columns(client, &qualified(destination)).await?;
    let mut columns = Vec::new();
    for c in &planned.manifest.columns {
        match destination.iter().find(|d| d.name == c.name) {
            Some(d) => columns.push(d.clone()),
            None => {
                return Err(failure::tag(
                    Reason::ColumnNotFound,
                    anyhow::anyhow!(
                        "table {}: the archive has column {:?}, which the existing table lacks; \
                         nothing was restored (drop the table, or add the column)",
                        planned.table,
                        c.name
                    ),
                ));
            }
        }
    }
    Ok(columns)
}

/// Rows of a table after which the pause point `restore.rows` holds its restore (tests read
/// its progress there).
const PAUSE_AFTER_ROWS: u64 = 10_000;

/// Bytes of COPY text sent at once.
const COPY_CHUNK: usize = 256 << 10;

/// Runs `request` into the database at `dsn` (from the request's connection file, or as the
/// caller got it): opens its archives, checks its tables and key prefixes, then [`restore`].
pub async fn run(request: &RestoreRequest, dsn: String) -> anyhow::Result<RestoreSummary> {
    let tables = tables_of(request)?;
    let formats = if request.formats.is_empty() {
        Format::ALL.to_vec()
    } else {
        request.formats.clone()
    };
    let store = request.store.open_for_reading().await?;
    let mut spill = SpillConfig::default();
    if let Some(bytes) = request.buffer_memory {
        spill.memory_limit = bytes;
    }
    if let Some(dir) = &request.spill_dir {
        spill.dir = dir.clone();
    }
    let progress = RestoreProgress::new();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    if let Some(listen) = &request.listen {
        let addr = status::serve(listen, progress.clone(), stop_rx).await?;
        tracing::info!("restore: status on http://{addr}");
    }
    let inputs = RestoreInputs {
        store,
        tables,
        formats,
        at: request.at.clone(),
        if_exists: request.if_exists,
        dsn,
        spill,
        split: request.split.unwrap_or(1).clamp(1, MAX_SPLIT).into(),
    };
    let result = restore_reporting(inputs, &progress).await;
    progress.finish(result.is_ok());
    stop_tx.send_replace(true);
    result
}

/// Each table of `request` and the key prefix of its archive, checked.
pub fn tables_of(request: &RestoreRequest) -> anyhow::Result<Vec<(TableId, String)>> {
    let mut tables: Vec<TableId> = Vec::with_capacity(request.tables.len());
    for t in &request.tables {
        tables.push(parse_table(t).map_err(|e| invalid(anyhow::anyhow!("--table {t}: {e}")))?);
    }
    let tables: Vec<(TableId, String)> = match &request.key_prefix {
        Some(prefix) if tables.len() == 1 => vec![(tables[0].clone(), prefix.clone())],
        Some(_) => {
            return Err(invalid(anyhow::anyhow!(
                "--key-prefix names one table's archive: pass one --table (or --key-prefix-root for several)"
            )));
        }
        None => tables
            .iter()
            .map(|t| (t.clone(), table_key_prefix(&request.key_prefix_root, t)))
            .collect(),
    };
    Ok(tables)
}

/// `[schema.]name`: `public` when the schema is omitted (as every `--table`).
pub fn parse_table(s: &str) -> Result<TableId, String> {
    match s.split_once('.') {
        None if !s.is_empty() => Ok(TableId::new("public", s)),
        Some((schema, table)) if !schema.is_empty() && !table.is_empty() => {
            Ok(TableId::new(schema, table))
        }
        _ => Err(format!("{s:?} is not a table name: expected [schema.]name")),
    }
}

/// Runs a restore to its commit, or rolls everything back and returns why.
pub async fn restore(request: RestoreInputs) -> anyhow::Result<RestoreSummary> {
    restore_reporting(request, &RestoreProgress::new()).await
}

/// Whether each planned table exists in the destination, refusing one that exists with
/// `--if-exists fail`, an existing one lacking an archived column, or a new one without columns.
async fn check_destinations(
    client: &tokio_postgres::Client,
    planned: &[Planned],
    if_exists: IfExists,
) -> anyhow::Result<Vec<bool>> {
    let mut existing = Vec::new();
    for p in planned {
        let found = exists(client, &p.table).await?;
        if found && if_exists == IfExists::Fail {
            return Err(invalid(anyhow::anyhow!(
                "table {} already exists in the target database (--if-exists fail): nothing was \
                 restored; pass --if-exists replace to replace its rows",
                p.table
            )));
        }
        if found {
            archived_columns(client, p).await?;
        } else if p.manifest.columns.is_empty() {
            return Err(invalid(anyhow::anyhow!(
                "table {}: the archive records no columns to create the table from",
                p.table
            )));
        }
        existing.push(found);
    }
    Ok(existing)
}

/// The rows a table's restore expects: its snapshot's `row_count` (exact without diffs, an
/// estimate with them); unknown without a snapshot.
fn expected_rows(p: &Planned) -> Option<u64> {
    p.plan.snapshot.as_ref().map(|s| s.row_count.max(0) as u64)
}

/// [`restore`], its progress counted in `progress` (for `/status` and `/metrics`) and
/// reported per table: a log line every `LARCH_PROGRESS_INTERVAL` and at the end, a bar on a
/// terminal.
pub async fn restore_reporting(
    request: RestoreInputs,
    progress: &RestoreProgress,
) -> anyhow::Result<RestoreSummary> {
    let started = Instant::now();
    let (point, planned) = plan_tables(&request).await?;
    let expected: Vec<(String, Option<u64>)> = planned
        .iter()
        .map(|p| (p.table.to_string(), expected_rows(p)))
        .collect();
    let counters = progress.plan(&expected);
    let overall = progress.overall().expect("planned");
    let dsn = larch_postgres::connection::PgDsn::parse(&request.dsn)
        .context("restore: the target connection string")?;
    let (mut client, connection) = streams::connect(&dsn).await?;
    let existing = check_destinations(&client, &planned, request.if_exists).await?;
    let (planned, existing) = parents_first(&client, planned, existing).await?;
    // Each table's counter, found by name: the tables now load parents first, not in the
    // order their counters were made.
    let counter_of: Vec<usize> = planned
        .iter()
        .map(|p| {
            let name = p.table.to_string();
            expected.iter().position(|(t, _)| *t == name).unwrap_or(0)
        })
        .collect();
    let split = request.split.max(1);
    // The split tables' staging tables, made (and left from a killed restore dropped) before
    // the transaction: the streams' connections must see them.
    let mut staged = Vec::new();
    if split > 1 {
        for (p, _) in planned.iter().zip(&existing).filter(|(_, found)| !**found) {
            staged.push(stage(&client, p).await?);
        }
    }
    let loaded = load_all(
        &mut client,
        &dsn,
        &planned,
        &existing,
        &request,
        split,
        |i| [counters[counter_of[i]].clone(), overall.clone()],
    )
    .await;
    if loaded.is_err() {
        for t in &staged {
            let dropped = client
                .batch_execute(&format!("DROP TABLE IF EXISTS {}", qualified(t)))
                .await;
            if let Err(e) = dropped {
                tracing::warn!(table = %t, error = %e, "restore: could not drop a staging table");
            }
        }
    }
    let restored = loaded?;
    drop(client);
    let _ = connection.await;
    Ok(RestoreSummary {
        position: point,
        at: request.at,
        tables: restored,
        duration_seconds: (started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0,
    })
}

/// Drops a staging table an earlier, killed restore of `p` left and makes a new one.
async fn stage(client: &tokio_postgres::Client, p: &Planned) -> anyhow::Result<TableId> {
    let staging = streams::staging_table(&p.table);
    let sql = format!(
        "DROP TABLE IF EXISTS {}; {}",
        qualified(&staging),
        create_unkeyed_table_sql(&staging, &p.manifest.columns, &p.key_fields)
    );
    client
        .batch_execute(&sql)
        .await
        .with_context(|| format!("restore: creating the staging table of {} ({sql})", p.table))?;
    Ok(staging)
}

/// Every table in one transaction: created (split, its staging table renamed) or emptied,
/// loaded, keyed; committed at the end.
async fn load_all(
    client: &mut tokio_postgres::Client,
    dsn: &larch_postgres::connection::PgDsn,
    planned: &[Planned],
    existing: &[bool],
    request: &RestoreInputs,
    split: usize,
    counted: impl Fn(usize) -> [std::sync::Arc<Progress>; 2],
) -> anyhow::Result<Vec<TableRestored>> {
    let tx = client
        .transaction()
        .await
        .context("restore: BEGIN on the target database")?;
    // Deferrable foreign keys are checked at COMMIT, when every table is loaded: a cycle of
    // them (NOT NULL included) loads in any order.
    tx.batch_execute("SET CONSTRAINTS ALL DEFERRED")
        .await
        .context("restore: SET CONSTRAINTS ALL DEFERRED")?;
    // One TRUNCATE of every replaced table: PostgreSQL truncates a table a foreign key
    // references only with the referencing tables in the same statement.
    let replaced: Vec<TableId> = planned
        .iter()
        .zip(existing)
        .filter(|(_, found)| **found)
        .map(|(p, _)| p.table.clone())
        .collect();
    if !replaced.is_empty() {
        let names: Vec<String> = replaced.iter().map(qualified).collect();
        tx.batch_execute(&format!("TRUNCATE {}", names.join(", ")))
            .await
            .with_context(|| format!("restore: TRUNCATE {}", names.join(", ")))?;
    }
    // Their secondary indexes and foreign keys are made again once every table is loaded.
    let aside = after_load::set_aside(&tx, &replaced).await?;
    let mut restored = Vec::new();
    for (i, (p, found)) in planned.iter().zip(existing).enumerate() {
        let [counter, overall] = counted(i);
        let reporter = Reporter::start(counter.clone());
        let loaded = load_table(
            &tx,
            dsn,
            p,
            *found,
            &request.spill,
            &[counter.clone(), overall.clone()],
            split,
        )
        .await;
        reporter.finish(loaded.is_ok());
        let (rows, streams) = loaded?;
        let action = if *found { "replaced" } else { "created" };
        let last = p.plan.diffs.last().or(p.plan.snapshot.as_ref());
        tracing::info!(table = %p.table, rows, streams, position = %p.plan.head_position, action, "table restored (not committed yet)");
        restored.push(TableRestored {
            table: p.table.to_string(),
            rows,
            position: p.plan.head_position.clone(),
            archived_at: last.map(|a| format_time(&a.created_at)).unwrap_or_default(),
            action: action.to_string(),
            streams: streams as u32,
        });
    }
    after_load::make_again(&tx, aside).await?;
    tx.commit()
        .await
        .context("restore: COMMIT on the target database")?;
    Ok(restored)
}

/// One table into `tx`: an existing one emptied and loaded over one stream; a new one
/// created without its key, loaded (over `split` streams into its staging table, renamed
/// here), then keyed. Returns the rows and the streams used.
async fn load_table(
    tx: &tokio_postgres::Transaction<'_>,
    dsn: &larch_postgres::connection::PgDsn,
    p: &Planned,
    found: bool,
    spill: &SpillConfig,
    counted: &[Arc<Progress>; 2],
    split: usize,
) -> anyhow::Result<(u64, usize)> {
    let table = &p.table;
    let partitioned = p.manifest.partitioning.as_ref();
    if !found && split > 1 && partitioned.is_some() {
        tracing::info!(table = %table, "restore: a partitioned table loads over one stream (its partitions are created in the restore's transaction)");
    }
    if !found && split > 1 && partitioned.is_none() {
        let staging = streams::staging_table(table);
        let columns = archived_columns_of(tx.client(), &staging, p).await?;
        let rows = streams::load_split(dsn, p, &columns, spill, counted, split).await?;
        let sql = format!(
            "ALTER TABLE {} RENAME TO {}; {}",
            qualified(&staging),
            quote_ident(&table.table),
            add_primary_key_sql(table, &p.key_fields)
        );
        tx.batch_execute(&sql)
            .await
            .with_context(|| format!("restore: keying table {table} ({sql})"))?;
        return Ok((rows, split));
    }
    if found && split > 1 {
        tracing::info!(table = %table, "restore: the table exists, so it loads over one stream in the restore's transaction (--split applies to tables the restore creates)");
    }
    // An existing table was emptied with the others at the transaction's start.
    if !found {
        let statements = match partitioned {
            Some(record) => {
                partitions::create_statements(table, &p.manifest.columns, &p.key_fields, record)
            }
            None => vec![create_unkeyed_table_sql(
                table,
                &p.manifest.columns,
                &p.key_fields,
            )],
        };
        // One statement each (never a batch): a partition's bound comes from the manifest.
        for sql in statements {
            tx.execute(&sql, &[])
                .await
                .with_context(|| format!("restore: {sql}"))?;
        }
    }
    let columns = archived_columns(tx.client(), p).await?;
    // Created or emptied in this transaction: FREEZE writes the rows already frozen (no
    // later vacuum rewrites them); PostgreSQL allows it on plain tables only.
    let freeze = plain_table(tx.client(), table).await?;
    let sink = tx
        .copy_in::<_, Bytes>(&streams::copy_sql(table, &columns, freeze))
        .await
        .with_context(|| format!("restore: COPY into {table}"))?;
    let (sender, receiver) = streams::channel();
    let (produced, copied) = tokio::join!(
        streams::produce(p, &columns, spill, counted, vec![sender]),
        streams::consume(sink, receiver, table)
    );
    let rows = streams::outcome(table, produced, vec![copied])?;
    if !found {
        tx.batch_execute(&add_primary_key_sql(table, &p.key_fields))
            .await
            .with_context(|| format!("restore: keying table {table}"))?;
    }
    Ok((rows, 1))
}

/// The tables in the order their destination's foreign keys need: a referenced table before
/// the tables referencing it (checked at the end of each COPY unless deferrable).
async fn parents_first(
    client: &tokio_postgres::Client,
    planned: Vec<Planned>,
    existing: Vec<bool>,
) -> anyhow::Result<(Vec<Planned>, Vec<bool>)> {
    use crate::export::closure::{foreign_keys, rounds};
    if planned.len() < 2 {
        return Ok((planned, existing));
    }
    // A deferrable key is checked at COMMIT: only the others order the loads.
    let mut relationships = foreign_keys(client)
        .await
        .context("restore: reading the target's foreign keys")?;
    relationships.retain(|r| !r.deferrable);
    let tables: std::collections::BTreeSet<TableId> =
        planned.iter().map(|p| p.table.clone()).collect();
    let all: Vec<usize> = (0..relationships.len()).collect();
    // A cycle's tables form one group; a table waits for the groups it references only.
    let groups = rounds::parents_first(&tables, &relationships, &all);
    let group_of = |t: &TableId| groups.iter().position(|g| g.contains(t));
    let mut paired: Vec<(Planned, bool)> = planned.into_iter().zip(existing).collect();
    let mut ordered = Vec::with_capacity(paired.len());
    while !paired.is_empty() {
        let waits = |t: &TableId, left: &[(Planned, bool)]| {
            relationships.iter().any(|r| {
                &r.child == t
                    && group_of(&r.parent) != group_of(t)
                    && left.iter().any(|(p, _)| p.table == r.parent)
            })
        };
        // The first table (in the given order) whose parents are loaded; a group ready.
        let next = (0..paired.len())
            .find(|i| !waits(&paired[*i].0.table, &paired))
            .unwrap_or(0);
        ordered.push(paired.remove(next));
    }
    Ok(ordered.into_iter().unzip())
}

/// Whether `table` is a plain table (not partitioned, not foreign): COPY FREEZE's condition.
async fn plain_table(client: &tokio_postgres::Client, table: &TableId) -> anyhow::Result<bool> {
    let row = client
        .query_one(
            "SELECT relkind = 'r' FROM pg_class WHERE oid = to_regclass($1::text)",
            &[&qualified(table)],
        )
        .await
        .with_context(|| format!("restore: looking up table {table}"))?;
    Ok(row.get(0))
}
