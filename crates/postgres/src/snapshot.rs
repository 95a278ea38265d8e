//! The consistent baseline: a new replication slot exports its snapshot; the table is copied
//! with `COPY … TO STDOUT` (text format) inside a REPEATABLE READ transaction that imports that
//! snapshot while the slot's session stays open. Rows are streamed into the channel in small
//! batches (bounded memory, backpressure); the slot's consistent point is the baseline position.

use std::borrow::Cow;
use std::collections::HashMap;

use anyhow::{Context, anyhow, bail};
use futures::StreamExt;
use pgwire_replication::ReplicationClient;
use tokio::sync::mpsc;

use super::config::{PostgresConfig, SlotMode, ident, qualified};
use super::row_filter::{SubqueryTables, check_row_filter_with};
use super::schema::{TableSchema, db_error};
use super::types::{Kind, write_json, write_string};
use larch_archive::model::TableId;
use larch_archive::position::Lsn;
use larch_archive::source::SourceError;
use larch_archive::value::Row;
use larch_core::failure;

/// A freshly created slot whose session is still open.
pub struct CreatedSlot {
    pub session: ReplicationClient,
    pub consistent_point: u64,
    pub snapshot: String,
    /// When the snapshot must be gone: its creation plus
    /// [`crate::config::SessionLimits::snapshot_max_age`]. Every COPY out of it ends by then.
    pub deadline: std::time::Instant,
}

/// The statement that starts a read-only transaction at an exported snapshot (a slot's or
/// another session's `pg_export_snapshot`), as every copy of one snapshot begins.
pub fn begin_at_snapshot(snapshot: &str) -> String {
    format!(
        "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT {}",
        super::config::literal(snapshot)
    )
}

/// Opens a gated replication session and creates the slot with an exported snapshot.
pub async fn create_slot(config: &PostgresConfig) -> anyhow::Result<CreatedSlot> {
    let deadline = std::time::Instant::now() + config.limits.snapshot_max_age;
    let rc = config.replication(0, None)?;
    let mut session = ReplicationClient::connect_gated(rc)
        .await
        .map_err(|e| replication_error(config, &e))?;
    let sql = format!(
        "CREATE_REPLICATION_SLOT {} {}LOGICAL pgoutput (SNAPSHOT 'export')",
        ident(&config.slot_name),
        if config.slot_mode == SlotMode::Temporary {
            "TEMPORARY "
        } else {
            ""
        }
    );
    let rows = session.simple_query(&sql).await.map_err(|e| {
        let err = replication_error(config, &e);
        let waited = matches!(&e, pgwire_replication::PgWireError::Server(text)
            if failure::sqlstate_in(text) == Some("55P03"));
        if waited {
            // The slot's creation waits for every write transaction running on the server to
            // end; that wait counts against the snapshot's age, so name the limit it hit.
            err.context(format!(
                "creating replication slot {}: the write transactions running on the server \
                 did not end within --snapshot-max-age ({}ms)",
                config.slot_name,
                crate::config::millis(config.limits.snapshot_max_age)
            ))
        } else {
            err.context(format!("creating replication slot {}", config.slot_name))
        }
    })?;
    let row = rows
        .first()
        .context("CREATE_REPLICATION_SLOT returned no row")?;
    let text = |i: usize| -> anyhow::Result<String> {
        let b = row
            .get(i)
            .and_then(|c| c.as_ref())
            .context("CREATE_REPLICATION_SLOT: missing column")?;
        Ok(String::from_utf8_lossy(b).into_owned())
    };
    let consistent = text(1)?;
    let consistent_point = Lsn::parse(&consistent)
        .with_context(|| format!("CREATE_REPLICATION_SLOT: bad consistent point {consistent:?}"))?
        .0;
    let snapshot = text(2)?;
    Ok(CreatedSlot {
        session,
        consistent_point,
        snapshot,
        deadline,
    })
}

/// Drops a (persistent) slot that is not in use.
pub async fn drop_slot(client: &tokio_postgres::Client, slot: &str) -> anyhow::Result<()> {
    client
        .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
        .await
        .map_err(|e| db_error(format!("dropping replication slot {slot}"), &e))?;
    Ok(())
}

/// Makes a replication-session error readable, naming the server (never the credentials).
pub fn replication_error(
    config: &PostgresConfig,
    e: &pgwire_replication::PgWireError,
) -> anyhow::Error {
    use pgwire_replication::PgWireError as E;
    let server = config.describe();
    let err = match e {
        E::Auth(m) => anyhow!(
            "cannot connect to PostgreSQL at {server}: {m} (check the user name and password)"
        ),
        E::Io(io) => anyhow!(
            "cannot connect to PostgreSQL at {server}: {io} (is the server running and reachable?)"
        ),
        other => anyhow!("replication connection to {server}: {other}"),
    };
    failure::tag_opt(crate::reasons::of_replication(e), err)
}

/// Rows a baseline sends at once, at most, and the bytes of row text after which a batch goes
/// out early. A send per row cost more than building the row (a task wake-up and a permit per
/// row, twice: to the export's forwarding task, then to the writer); memory stays bounded by
/// the channels' capacity in batches of this size.
pub const BATCH_ROWS: usize = 256;
pub const BATCH_BYTES: usize = 256 * 1024;

/// Where a baseline's rows go: one send per row (`(table, row)`, the [`larch_archive::source::SyncSource`]
/// contract) or one per batch (`(table, rows)`, the one-shot export).
pub trait RowSink: Send + Sync {
    /// Sends `rows` of `table` in order; [`SourceError::Stopped`] when the receiver is gone.
    fn send_rows(
        &self,
        table: &TableId,
        rows: Vec<Row>,
    ) -> impl Future<Output = Result<(), SourceError>> + Send;

    /// The masking the baseline of `schema` applies while it encodes rows, asked once before
    /// the first row; none by default.
    fn column_mask(
        &self,
        _schema: &TableSchema,
    ) -> impl Future<Output = Result<Option<Box<dyn ColumnMask>>, SourceError>> + Send {
        async { Ok(None) }
    }
}

/// A rewrite of column values the baseline applies while it encodes each row from COPY's text
/// (the export's masking): a masked row is written once and never exists raw as a row.
pub trait ColumnMask: Send + Sync {
    /// What becomes of column `column` (its index in the table's columns).
    fn treatment(&self, column: usize) -> Treatment;
    /// Appends the JSON value a [`Treatment::Rewrite`] column becomes for its text (`None`:
    /// NULL). Errors name the table and the column, never the value.
    fn write(&self, column: usize, text: Option<&str>, out: &mut Vec<u8>) -> Result<(), String>;
}

/// See [`ColumnMask::treatment`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Treatment {
    /// Written as it is.
    Keep,
    /// Left out of the row.
    Drop,
    /// Written by [`ColumnMask::write`].
    Rewrite,
}

impl RowSink for mpsc::Sender<(TableId, Row)> {
    async fn send_rows(&self, table: &TableId, rows: Vec<Row>) -> Result<(), SourceError> {
        for row in rows {
            self.send((table.clone(), row))
                .await
                .map_err(|_| SourceError::Stopped)?;
        }
        Ok(())
    }
}

impl RowSink for mpsc::Sender<(TableId, Vec<Row>)> {
    async fn send_rows(&self, table: &TableId, rows: Vec<Row>) -> Result<(), SourceError> {
        self.send((table.clone(), rows))
            .await
            .map_err(|_| SourceError::Stopped)
    }
}

/// The baseline query's row filter clause for `schema` (empty without one).
fn where_clause(filter: Option<&String>) -> String {
    filter.map(|p| format!(" WHERE ({p})")).unwrap_or_default()
}

/// Runs `EXPLAIN` of the filtered baseline query: an invalid predicate (a missing column, a
/// type error, a syntax error) fails here, before anything is written, naming the table and
/// the predicate.
pub async fn explain_row_filter(
    client: &tokio_postgres::Client,
    table: &TableId,
    predicate: &str,
    subqueries: Option<&SubqueryTables>,
) -> anyhow::Result<()> {
    let what = || format!("the row filter of table {table} (where: {predicate})");
    let invalid = |e: anyhow::Error| failure::tag(failure::Reason::InvalidConfig, e);
    check_row_filter_with(table, predicate, subqueries)
        .map_err(|why| invalid(anyhow!("{}: {why}", what())))?;
    let sql = format!(
        "EXPLAIN SELECT 1 FROM {}{}",
        qualified(table),
        where_clause(Some(&predicate.to_string()))
    );
    client
        .simple_query(&sql)
        .await
        .map_err(|e| invalid(db_error(what(), &e)))?;
    Ok(())
}

/// The COPY statement of a table's rows (those of `range` only, when given: a split export's
/// ctid range, [`crate::split`]), its row filter checked first.
fn copy_sql(
    schema: &TableSchema,
    filter: Option<&String>,
    subqueries: Option<&SubqueryTables>,
    range: Option<&str>,
) -> Result<String, SourceError> {
    let cols: Vec<String> = schema.columns.iter().map(|c| ident(&c.name)).collect();
    if let Some(p) = filter {
        check_row_filter_with(&schema.id, p, subqueries).map_err(|why| {
            failure::tag(
                failure::Reason::InvalidConfig,
                anyhow!("the row filter of table {} (where: {p}): {why}", schema.id),
            )
        })?;
    }
    let clause = match (filter, range) {
        (Some(p), Some(r)) => format!(" WHERE ({p}) AND ({r})"),
        (None, Some(r)) => format!(" WHERE {r}"),
        (filter, None) => where_clause(filter),
    };
    Ok(format!(
        "COPY (SELECT {} FROM {}{clause}) TO STDOUT",
        cols.join(", "),
        qualified(&schema.id),
    ))
}

/// Copies every row of `schema` as of `snapshot` (those `filter` keeps, when given) into
/// `rows`, in batches of at most [`BATCH_ROWS`]. Returns the number of rows. The COPY's
/// `statement_timeout` is what is left until `deadline` (the snapshot's age limit): a slow
/// filter or a stalled reader cannot hold the snapshot, and the primary's xmin horizon,
/// longer. `subqueries`: what the filter's subqueries may read ([`SubqueryTables`]).
#[allow(clippy::too_many_arguments)]
pub async fn copy_table<R: RowSink>(
    client: &tokio_postgres::Client,
    schema: &TableSchema,
    kinds: &HashMap<u32, Kind>,
    filter: Option<&String>,
    subqueries: Option<&SubqueryTables>,
    range: Option<&str>,
    deadline: std::time::Instant,
    rows: &R,
) -> Result<u64, SourceError> {
    let sql = copy_sql(schema, filter, subqueries, range)?;
    copy_query(client, schema, kinds, &sql, deadline, rows).await
}

/// [`copy_table`] with the COPY statement given: `sql` must output `schema`'s columns in
/// order (a subset's query, built by the exporter from the catalog and the checked spec).
pub async fn copy_query<R: RowSink>(
    client: &tokio_postgres::Client,
    schema: &TableSchema,
    kinds: &HashMap<u32, Kind>,
    sql: &str,
    deadline: std::time::Instant,
    rows: &R,
) -> Result<u64, SourceError> {
    // The mask is known before the COPY starts, so no COPY waits on it.
    let mask = rows.column_mask(schema).await?;
    let masked = mask.is_some();
    let encoder = RowEncoder::new(schema, kinds, mask);
    let copy_error = |e: &tokio_postgres::Error| copy_error(&schema.id, masked, e);
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    if left.is_zero() {
        return Err(snapshot_too_old(&schema.id).into());
    }
    client
        .batch_execute(&format!(
            "SET statement_timeout = {}",
            crate::config::millis(left)
        ))
        .await
        .map_err(|e| copy_error(&e))?;
    let stream = client.copy_out(sql).await.map_err(|e| copy_error(&e))?;
    futures::pin_mut!(stream);
    let mut scratch = Scratch::default();
    // The start of a line whose end has not arrived yet (COPY sends one message per row, so
    // this is usually empty and lines are read straight from the message).
    let mut pending: Vec<u8> = Vec::new();
    let mut batch = Batch::default();
    let mut count = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| copy_error(&e))?;
        let data: &[u8] = if pending.is_empty() {
            &chunk
        } else {
            pending.extend_from_slice(&chunk);
            &pending
        };
        let mut start = 0;
        while let Some(nl) = memchr::memchr(b'\n', &data[start..]) {
            let line = &data[start..start + nl];
            let row = encoder
                .row(line, &mut scratch)
                .map_err(|e| anyhow!("copying table {}: {e:#}", schema.id))?;
            count += 1;
            start += nl + 1;
            if let Some(full) = batch.push(row) {
                rows.send_rows(&schema.id, full).await?;
            }
        }
        if pending.is_empty() {
            pending.extend_from_slice(&chunk[start..]);
        } else {
            pending.drain(..start);
        }
    }
    if !pending.is_empty() {
        return Err(anyhow!("copying table {}: output ended inside a row", schema.id).into());
    }
    if !batch.rows.is_empty() {
        rows.send_rows(&schema.id, batch.rows).await?;
    }
    Ok(count)
}

/// The error of a baseline's COPY: a statement timeout says it was the snapshot's age limit;
/// the server's own text goes only to a debug log line, and only for a table without a
/// transform (it may quote a value: [`crate::schema::db_error`]).
fn copy_error(table: &TableId, masked: bool, e: &tokio_postgres::Error) -> anyhow::Error {
    if e.code() == Some(&tokio_postgres::error::SqlState::QUERY_CANCELED) {
        return snapshot_too_old(table);
    }
    if !masked && let Some(db) = e.as_db_error() {
        tracing::debug!(table = %table, server_message = db.message(), detail = db.detail(), "the baseline's COPY failed");
    }
    db_error(format!("copying table {table}"), e)
}

fn snapshot_too_old(table: &TableId) -> anyhow::Error {
    anyhow!(
        "copying table {table}: the baseline's snapshot reached its age limit \
         (--snapshot-max-age) and the copy was cancelled (SQLSTATE 57014): raise the limit, or \
         make the row filter cheaper"
    )
}

/// Rows gathered for one send.
#[derive(Default)]
struct Batch {
    rows: Vec<Row>,
    bytes: usize,
}

impl Batch {
    /// Adds a row; returns the batch once it is full.
    fn push(&mut self, row: Row) -> Option<Vec<Row>> {
        if self.rows.is_empty() {
            self.rows.reserve(BATCH_ROWS);
        }
        self.bytes += row.as_str().len();
        self.rows.push(row);
        if self.rows.len() < BATCH_ROWS && self.bytes < BATCH_BYTES {
            return None;
        }
        self.bytes = 0;
        Some(std::mem::take(&mut self.rows))
    }
}

/// COPY text lines into rows, written straight as JSON text: keys in the order a row's
/// canonical text has them (sorted), each escaped once up front, values appended by
/// [`write_json`] (or by the mask) — no map, no intermediate values.
pub(crate) struct RowEncoder<'a> {
    schema: &'a TableSchema,
    /// (column index, `"name":`, written as it is) in key order; dropped columns left out.
    order: Vec<(usize, Vec<u8>, bool)>,
    kinds: Vec<&'a Kind>,
    mask: Option<Box<dyn ColumnMask>>,
}

impl<'a> RowEncoder<'a> {
    pub(crate) fn new(
        schema: &'a TableSchema,
        kinds: &'a HashMap<u32, Kind>,
        mask: Option<Box<dyn ColumnMask>>,
    ) -> RowEncoder<'a> {
        let treatment = |i: usize| match &mask {
            Some(m) => m.treatment(i),
            None => Treatment::Keep,
        };
        let mut order: Vec<(usize, Vec<u8>, bool)> = schema
            .columns
            .iter()
            .enumerate()
            .filter(|(i, _)| treatment(*i) != Treatment::Drop)
            .map(|(i, c)| {
                let mut key = Vec::new();
                write_string(&c.name, &mut key);
                key.push(b':');
                (i, key, treatment(i) == Treatment::Keep)
            })
            .collect();
        order.sort_by(|a, b| schema.columns[a.0].name.cmp(&schema.columns[b.0].name));
        let kinds = schema
            .type_oids
            .iter()
            .map(|oid| kinds.get(oid).unwrap_or(&Kind::Text))
            .collect();
        RowEncoder {
            schema,
            order,
            kinds,
            mask,
        }
    }

    /// One COPY line. `scratch` is reused across lines, so a row costs one allocation (its
    /// exact-size text).
    pub(crate) fn row(&self, line: &[u8], scratch: &mut Scratch) -> anyhow::Result<Row> {
        let Scratch { fields, out } = scratch;
        // One UTF-8 check per line: fields split at tabs (ASCII) are then valid too.
        let line = std::str::from_utf8(line).map_err(|e| {
            let column = memchr::memchr_iter(b'\t', &line[..e.valid_up_to()]).count();
            let name = self
                .schema
                .columns
                .get(column)
                .map_or("?", |c| c.name.as_str());
            anyhow!("column {name}: invalid COPY text: {e}")
        })?;
        fields.clear();
        let mut start = 0;
        for i in memchr::memchr_iter(b'\t', line.as_bytes()) {
            fields.push((start, i));
            start = i + 1;
        }
        fields.push((start, line.len()));
        if fields.len() != self.schema.columns.len() {
            bail!(
                "COPY row has {} fields, expected {}",
                fields.len(),
                self.schema.columns.len()
            );
        }
        out.clear();
        out.push(b'{');
        for (n, (i, key, keep)) in self.order.iter().enumerate() {
            if n > 0 {
                out.push(b',');
            }
            out.extend_from_slice(key);
            let (from, to) = fields[*i];
            let field = &line[from..to];
            let text = if field == "\\N" {
                None
            } else {
                match unescape_copy_str(field) {
                    Ok(text) => Some(text),
                    Err(e) => bail!(
                        "column {}: invalid COPY text: {e}",
                        self.schema.columns[*i].name
                    ),
                }
            };
            match (&self.mask, text) {
                (Some(mask), text) if !keep => mask
                    .write(*i, text.as_deref(), out)
                    .map_err(|e| anyhow!(e))?,
                (_, None) => out.extend_from_slice(b"null"),
                (_, Some(text)) => write_json(self.kinds[*i], &text, out),
            }
        }
        out.push(b'}');
        let text = std::str::from_utf8(out).expect("JSON written from UTF-8 text");
        Ok(Row::from_validated(text))
    }
}

/// Rows of COPY text `lines` of `schema` as a baseline encodes them, masked by `mask` when
/// given. For the layers above that hold their transforms to what the baseline writes.
#[doc(hidden)]
pub fn encode_copy_lines(
    schema: &TableSchema,
    mask: Option<Box<dyn ColumnMask>>,
    lines: &[&str],
) -> Vec<anyhow::Result<Row>> {
    let kinds: HashMap<u32, Kind> = schema
        .columns
        .iter()
        .map(|c| (c.type_oid, Kind::of_base(&c.type_name)))
        .collect();
    let encoder = RowEncoder::new(schema, &kinds, mask);
    let mut scratch = Scratch::default();
    lines
        .iter()
        .map(|line| encoder.row(line.as_bytes(), &mut scratch))
        .collect()
}

/// Per-line scratch space of [`RowEncoder::row`]: field byte ranges and the row's text.
#[derive(Default)]
pub(crate) struct Scratch {
    fields: Vec<(usize, usize)>,
    out: Vec<u8>,
}

/// Undoes COPY text-format escaping of a field already checked as UTF-8, borrowing when there
/// is nothing to undo (an escape can still make bytes that are not UTF-8).
fn unescape_copy_str(field: &str) -> Result<Cow<'_, str>, std::string::FromUtf8Error> {
    if memchr::memchr(b'\\', field.as_bytes()).is_none() {
        return Ok(Cow::Borrowed(field));
    }
    unescape_escaped(field.as_bytes()).map(Cow::Owned)
}

/// Decodes the escapes of a COPY text field.
fn unescape_escaped(field: &[u8]) -> Result<String, std::string::FromUtf8Error> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let c = field[i];
        if c != b'\\' || i + 1 == field.len() {
            out.push(c);
            i += 1;
            continue;
        }
        let n = field[i + 1];
        i += 2;
        match n {
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'v' => out.push(11),
            b'0'..=b'7' => {
                let mut v = (n - b'0') as u32;
                let mut k = 0;
                while k < 2 && i < field.len() && (b'0'..=b'7').contains(&field[i]) {
                    v = v * 8 + (field[i] - b'0') as u32;
                    i += 1;
                    k += 1;
                }
                out.push(v as u8);
            }
            b'x' => {
                let mut v = 0u32;
                let mut k = 0;
                while k < 2 && i < field.len() && field[i].is_ascii_hexdigit() {
                    v = v * 16 + (field[i] as char).to_digit(16).unwrap_or(0);
                    i += 1;
                    k += 1;
                }
                out.push(v as u8);
            }
            other => out.push(other),
        }
    }
    String::from_utf8(out)
}

#[cfg(test)]
mod tests;
