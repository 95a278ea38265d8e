//! Reading a few rows for people writing masking rules (`larch transform preview` and
//! `suggest`): the table's schema as the exporter discovers it, and rows encoded by the
//! baseline's own encoder, raw and through the exporter's mask, from one COPY in a READ ONLY
//! transaction (nothing is written to the database).

use std::collections::HashMap;

use anyhow::{Context, anyhow};
use futures::StreamExt;
use tokio_postgres::Client;

use crate::config::{ident, qualified};
use crate::schema::{self, TableSchema, db_error};
use crate::snapshot::{ColumnMask, RowEncoder, Scratch};
use crate::types::Kind;
use larch_archive::model::TableId;
use larch_archive::value::Row;

/// Rows a preview or a sample reads at most.
pub const MAX_ROWS: u64 = 10_000;

/// Above this many rows (the catalog's estimate) a sample reads `TABLESAMPLE SYSTEM` blocks
/// instead of the first rows by key.
pub const TABLESAMPLE_ABOVE: f64 = 1_000_000.0;

/// A table's schema (key fields: its primary key) and its columns' value kinds.
pub async fn describe(
    client: &Client,
    table: &TableId,
) -> anyhow::Result<(TableSchema, HashMap<u32, Kind>)> {
    let schema = schema::discover(client, table, &[]).await?;
    let mut kinds = HashMap::new();
    schema::resolve_kinds(client, &schema.type_oids, &mut kinds).await?;
    Ok((schema, kinds))
}

/// The ordinary tables (and partitioned ones) of the database, or of `schemas`, by name.
pub async fn list_tables(client: &Client) -> anyhow::Result<Vec<TableId>> {
    let rows = client
        .query(
            "SELECT n.nspname::text, c.relname::text FROM pg_class c
               JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
                AND n.nspname NOT IN ('pg_catalog', 'information_schema')
                AND n.nspname NOT LIKE 'pg\\_toast%' AND n.nspname NOT LIKE 'pg\\_temp%'
              ORDER BY 1, 2",
            &[],
        )
        .await
        .map_err(|e| db_error("listing the database's tables", &e))?;
    Ok(rows
        .iter()
        .map(|r| TableId::new(r.get::<_, String>(0), r.get::<_, String>(1)))
        .collect())
}

/// A row read twice: as the exporter reads it, and as its mask writes it.
pub struct SampledRow {
    pub raw: Row,
    pub masked: Option<Row>,
}

/// How the rows were chosen.
#[derive(Clone, Debug, PartialEq)]
pub enum Sampling {
    /// The first rows by key (or in the table's order without one).
    First,
    /// `TABLESAMPLE SYSTEM (percent)`: the table is big.
    Blocks(f64),
}

/// Up to `limit` rows of `schema`, each encoded raw and (with a mask) masked, from one COPY in
/// a READ ONLY transaction. A big table (more than [`TABLESAMPLE_ABOVE`] rows estimated) is
/// sampled by blocks.
pub async fn sample_rows(
    client: &Client,
    schema: &TableSchema,
    kinds: &HashMap<u32, Kind>,
    limit: u64,
    mask: Option<Box<dyn ColumnMask>>,
) -> anyhow::Result<(Vec<SampledRow>, Sampling)> {
    let limit = limit.clamp(1, MAX_ROWS);
    let table = &schema.id;
    client
        .batch_execute(
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET LOCAL statement_timeout = '60s'",
        )
        .await
        .map_err(|e| db_error(format!("reading rows of {table}"), &e))?;
    let result = read(client, schema, kinds, limit, mask).await;
    // Read only: nothing to keep.
    let _ = client.batch_execute("ROLLBACK").await;
    result
}

async fn read(
    client: &Client,
    schema: &TableSchema,
    kinds: &HashMap<u32, Kind>,
    limit: u64,
    mask: Option<Box<dyn ColumnMask>>,
) -> anyhow::Result<(Vec<SampledRow>, Sampling)> {
    let table = &schema.id;
    let estimate: f64 = client
        .query_one(
            "SELECT GREATEST(c.reltuples, 0)::float8 FROM pg_class c
              WHERE c.oid = to_regclass(format('%I.%I', $1::text, $2::text))",
            &[&table.schema, &table.table],
        )
        .await
        .map_err(|e| db_error(format!("estimating the rows of {table}"), &e))?
        .get(0);
    let sampling = if estimate > TABLESAMPLE_ABOVE {
        // Ten times the blocks the rows need, so a LIMIT still has rows to pick from.
        Sampling::Blocks((limit as f64 * 10.0 / estimate * 100.0).clamp(0.0001, 100.0))
    } else {
        Sampling::First
    };
    let cols: Vec<String> = schema.columns.iter().map(|c| ident(&c.name)).collect();
    let order: Vec<String> = schema.key_fields.iter().map(|k| ident(k)).collect();
    let sql = format!(
        "COPY (SELECT {} FROM {}{}{} LIMIT {limit}) TO STDOUT",
        cols.join(", "),
        qualified(table),
        match &sampling {
            Sampling::Blocks(p) => format!(" TABLESAMPLE SYSTEM ({p}) REPEATABLE (0)"),
            Sampling::First => String::new(),
        },
        if order.is_empty() {
            String::new()
        } else {
            format!(" ORDER BY {}", order.join(", "))
        },
    );
    let stream = client
        .copy_out(&sql)
        .await
        .map_err(|e| db_error(format!("reading rows of {table}"), &e))?;
    futures::pin_mut!(stream);
    let mut data = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| db_error(format!("reading rows of {table}"), &e))?;
        data.extend_from_slice(&chunk);
    }
    let raw = RowEncoder::new(schema, kinds, None);
    let masked = mask.map(|m| RowEncoder::new(schema, kinds, Some(m)));
    let mut scratch = Scratch::default();
    let mut out = Vec::new();
    for line in data.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let row = raw
            .row(line, &mut scratch)
            .with_context(|| format!("reading rows of {table}"))?;
        let masked_row = match &masked {
            Some(enc) => Some(enc.row(line, &mut scratch).map_err(|e| anyhow!("{e:#}"))?),
            None => None,
        };
        out.push(SampledRow {
            raw: row,
            masked: masked_row,
        });
    }
    Ok((out, sampling))
}
