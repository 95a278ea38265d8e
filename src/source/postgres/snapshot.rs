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
use super::schema::{TableSchema, db_error};
use super::types::{Kind, write_json, write_string};
use crate::archive::model::TableId;
use crate::archive::position::Lsn;
use crate::archive::value::Row;
use crate::failure;
use crate::source::SourceError;

/// A freshly created slot whose session is still open.
pub struct CreatedSlot {
    pub session: ReplicationClient,
    pub consistent_point: u64,
    pub snapshot: String,
}

/// Opens a gated replication session and creates the slot with an exported snapshot.
pub async fn create_slot(config: &PostgresConfig) -> anyhow::Result<CreatedSlot> {
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
        replication_error(config, &e)
            .context(format!("creating replication slot {}", config.slot_name))
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
    failure::tag_opt(failure::of_replication(e), err)
}

/// Rows a baseline sends at once, at most, and the bytes of row text after which a batch goes
/// out early. A send per row cost more than building the row (a task wake-up and a permit per
/// row, twice: to the export's forwarding task, then to the writer); memory stays bounded by
/// the channels' capacity in batches of this size.
pub const BATCH_ROWS: usize = 256;
pub const BATCH_BYTES: usize = 256 * 1024;

/// Where a baseline's rows go: one send per row (`(table, row)`, the [`crate::source::SyncSource`]
/// contract) or one per batch (`(table, rows)`, the one-shot export).
pub trait RowSink: Send + Sync {
    /// Sends `rows` of `table` in order; [`SourceError::Stopped`] when the receiver is gone.
    fn send_rows(
        &self,
        table: &TableId,
        rows: Vec<Row>,
    ) -> impl Future<Output = Result<(), SourceError>> + Send;
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

/// Checks a row filter's text before it goes into a query larch builds: one predicate, never a
/// second statement or a way out of the parentheses it is put in. Rejects `;`, comments,
/// dollar quoting and parentheses that do not balance outside string literals and quoted
/// identifiers. Whether it is valid SQL for the table is the server's to say (EXPLAIN).
pub fn check_row_filter(predicate: &str) -> Result<(), String> {
    if predicate.trim().is_empty() {
        return Err("the predicate is empty".into());
    }
    if predicate.contains(';') {
        return Err("`;` is not allowed: a row filter is one predicate, not a statement".into());
    }
    let mut depth = 0i64;
    let mut quote: Option<char> = None;
    let mut chars = predicate.chars().peekable();
    while let Some(c) = chars.next() {
        if let Some(q) = quote {
            if c == q {
                // A doubled quote is an escaped one; either way the literal goes on or ends.
                if chars.peek() == Some(&q) {
                    chars.next();
                } else {
                    quote = None;
                }
            }
            continue;
        }
        match c {
            '\'' | '"' => quote = Some(c),
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err("a `)` closes a parenthesis the predicate did not open".into());
                }
            }
            '-' if chars.peek() == Some(&'-') => {
                return Err("comments (`--`) are not allowed".into());
            }
            '/' if chars.peek() == Some(&'*') => {
                return Err("comments (`/*`) are not allowed".into());
            }
            '$' => return Err("`$` (dollar quoting, parameters) is not allowed".into()),
            _ => {}
        }
    }
    if quote.is_some() {
        return Err("a quoted literal or identifier is not closed".into());
    }
    if depth != 0 {
        return Err("the parentheses do not balance".into());
    }
    Ok(())
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
) -> anyhow::Result<()> {
    let what = || format!("the row filter of table {table} (where: {predicate})");
    let invalid = |e: anyhow::Error| failure::tag(failure::Reason::InvalidConfig, e);
    check_row_filter(predicate).map_err(|why| invalid(anyhow!("{}: {why}", what())))?;
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

/// Copies every row of `schema` as of `snapshot` (those `filter` keeps, when given) into
/// `rows`, in batches of at most [`BATCH_ROWS`]. Returns the number of rows.
pub async fn copy_table<R: RowSink>(
    client: &tokio_postgres::Client,
    schema: &TableSchema,
    kinds: &HashMap<u32, Kind>,
    filter: Option<&String>,
    rows: &R,
) -> Result<u64, SourceError> {
    let cols: Vec<String> = schema.columns.iter().map(|c| ident(&c.name)).collect();
    if let Some(p) = filter {
        check_row_filter(p)
            .map_err(|why| anyhow!("the row filter of table {} (where: {p}): {why}", schema.id))?;
    }
    let sql = format!(
        "COPY (SELECT {} FROM {}{}) TO STDOUT",
        cols.join(", "),
        qualified(&schema.id),
        where_clause(filter)
    );
    let stream = client
        .copy_out(&sql)
        .await
        .map_err(|e| db_error(format!("copying table {}", schema.id), &e))?;
    futures::pin_mut!(stream);
    let encoder = RowEncoder::new(schema, kinds);
    let mut scratch = Scratch::default();
    // The start of a line whose end has not arrived yet (COPY sends one message per row, so
    // this is usually empty and lines are read straight from the message).
    let mut pending: Vec<u8> = Vec::new();
    let mut batch = Batch::default();
    let mut count = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| db_error(format!("copying table {}", schema.id), &e))?;
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
/// [`write_json`] — no map, no intermediate values.
struct RowEncoder<'a> {
    schema: &'a TableSchema,
    /// (column index, `"name":`) in key order.
    order: Vec<(usize, Vec<u8>)>,
    kinds: Vec<&'a Kind>,
}

impl<'a> RowEncoder<'a> {
    fn new(schema: &'a TableSchema, kinds: &'a HashMap<u32, Kind>) -> RowEncoder<'a> {
        let mut order: Vec<(usize, Vec<u8>)> = schema
            .columns
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut key = Vec::new();
                write_string(&c.name, &mut key);
                key.push(b':');
                (i, key)
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
        }
    }

    /// One COPY line. `scratch` is reused across lines, so a row costs one allocation (its
    /// exact-size text).
    fn row(&self, line: &[u8], scratch: &mut Scratch) -> anyhow::Result<Row> {
        let Scratch { fields, out } = scratch;
        fields.clear();
        let mut start = 0;
        for i in memchr::memchr_iter(b'\t', line) {
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
        for (n, (i, key)) in self.order.iter().enumerate() {
            if n > 0 {
                out.push(b',');
            }
            out.extend_from_slice(key);
            let (from, to) = fields[*i];
            let field = &line[from..to];
            if field == b"\\N" {
                out.extend_from_slice(b"null");
            } else {
                let text = unescape_copy(field).with_context(|| {
                    format!("column {}: invalid COPY text", self.schema.columns[*i].name)
                })?;
                write_json(self.kinds[*i], &text, out);
            }
        }
        out.push(b'}');
        let text = std::str::from_utf8(out).expect("JSON written from UTF-8 text");
        Ok(Row::from_validated(text))
    }
}

/// Per-line scratch space of [`RowEncoder::row`]: field byte ranges and the row's text.
#[derive(Default)]
struct Scratch {
    fields: Vec<(usize, usize)>,
    out: Vec<u8>,
}

/// Undoes COPY text-format escaping (borrowing when there is nothing to undo).
pub fn unescape_copy(field: &[u8]) -> anyhow::Result<Cow<'_, str>> {
    if !field.contains(&b'\\') {
        return Ok(Cow::Borrowed(std::str::from_utf8(field)?));
    }
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
    Ok(Cow::Owned(String::from_utf8(out)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The encoder writes exactly the text the map-based path (`to_json` values in a sorted
    /// map) gives, for every fast-path kind and the fallbacks, with escapes and NULLs.
    #[test]
    fn the_row_encoder_writes_the_canonical_row_text() {
        use crate::archive::model::ColumnDefinition;
        use crate::archive::value::{RowMap, raw};
        use crate::source::postgres::types::to_json;
        let cases: Vec<(&str, Kind, Vec<&str>)> = vec![
            ("id", Kind::Int, vec!["1", "-42", "9223372036854775807"]),
            (
                "amount",
                Kind::Numeric,
                vec!["12.500", "NaN", "-0.0001", "1e5"],
            ),
            (
                "ratio",
                Kind::Float,
                vec!["1.5", "Infinity", "-Infinity", "1e-07"],
            ),
            ("flag", Kind::Bool, vec!["t", "f", "x"]),
            (
                "Name",
                Kind::Text,
                vec![
                    "plain",
                    "tab\\there",
                    "quote\"and\\\\back",
                    "\\x01ctl",
                    "ünï",
                ],
            ),
            (
                "payload",
                Kind::Json,
                vec!["{\"a\": [1, 2.50]}", "not json"],
            ),
            ("blob", Kind::Bytea, vec!["\\\\x0102ff"]),
            ("at", Kind::Timestamptz, vec!["2026-01-02 03:04:05.5+01"]),
            (
                "tags",
                Kind::Array {
                    elem: Box::new(Kind::Text),
                    delim: b',',
                },
                vec!["{a,\"b c\"}"],
            ),
        ];
        let schema = TableSchema {
            id: TableId::new("public", "t"),
            columns: cases
                .iter()
                .map(|(n, _, _)| ColumnDefinition {
                    name: n.to_string(),
                    ..Default::default()
                })
                .collect(),
            type_oids: (0..cases.len() as u32).collect(),
            type_mods: vec![],
            sql_types: vec![],
            generated: vec![],
            key_fields: vec![],
            has_primary_key: false,
            replica_identity: 'd',
        };
        let kinds: HashMap<u32, Kind> = cases
            .iter()
            .enumerate()
            .map(|(i, (_, k, _))| (i as u32, k.clone()))
            .collect();
        let encoder = RowEncoder::new(&schema, &kinds);
        let mut scratch = Scratch::default();
        for round in 0..5 {
            let fields: Vec<&str> = cases
                .iter()
                .enumerate()
                .map(|(i, (_, _, v))| {
                    if (round + i) % 4 == 3 {
                        "\\N"
                    } else {
                        v[round % v.len()]
                    }
                })
                .collect();
            let line = fields.join("\t");
            let mut map = RowMap::new();
            for ((name, kind, _), f) in cases.iter().zip(&fields) {
                let v = if *f == "\\N" {
                    raw("null")
                } else {
                    to_json(kind, &unescape_copy(f.as_bytes()).unwrap())
                };
                map.insert(name.to_string(), v);
            }
            let want = Row::from_map(&map);
            let got = encoder.row(line.as_bytes(), &mut scratch).unwrap();
            assert_eq!(got.as_str(), want.as_str(), "line {line:?}");
        }
        let err = encoder.row(b"1\t2", &mut scratch).unwrap_err().to_string();
        assert!(err.contains("2 fields, expected 9"), "{err}");
    }

    #[test]
    fn copy_unescape() {
        assert_eq!(unescape_copy(b"a\\tb\\nc\\\\d").unwrap(), "a\tb\nc\\d");
        assert_eq!(unescape_copy(b"\\\\x0102").unwrap(), "\\x0102");
        assert_eq!(unescape_copy(b"plain").unwrap(), "plain");
    }
}
