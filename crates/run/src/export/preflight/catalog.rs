//! The constraints of a table as the catalog has them, and a CHECK evaluated on transformed
//! rows by a SELECT (nothing written).

use anyhow::Context;
use larch_archive::model::TableId;
use tokio_postgres::Client;

/// What a constraint requires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    PrimaryKey,
    Unique,
    Check,
    ForeignKey,
}

impl Kind {
    pub fn label(self) -> &'static str {
        match self {
            Kind::PrimaryKey => "PRIMARY KEY",
            Kind::Unique => "UNIQUE",
            Kind::Check => "CHECK",
            Kind::ForeignKey => "FOREIGN KEY",
        }
    }
}

/// One constraint (or unique index) of a table.
#[derive(Clone, Debug)]
pub struct Constraint {
    pub name: String,
    pub kind: Kind,
    pub columns: Vec<String>,
    /// A foreign key's referenced table and columns (in `columns`' order).
    pub references: Option<(TableId, Vec<String>)>,
    /// A CHECK's expression (`pg_get_expr`).
    pub expression: Option<String>,
    /// A unique constraint or index `NULLS NOT DISTINCT` (PostgreSQL 15): NULLs collide.
    pub nulls_not_distinct: bool,
}

/// PK, UNIQUE, CHECK and FK constraints, then unique indexes on plain columns that no
/// constraint owns. `to_jsonb(i)` reads `indnullsnotdistinct` where the server has it.
const CONSTRAINTS_SQL: &str = "
WITH t AS (SELECT to_regclass(format('%I.%I', $1::text, $2::text)) AS oid)
SELECT con.conname::text, con.contype::text,
       ARRAY(SELECT a.attname::text FROM unnest(con.conkey) WITH ORDINALITY k(n, i)
             JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.n ORDER BY k.i),
       rn.nspname::text, rc.relname::text,
       ARRAY(SELECT a.attname::text FROM unnest(con.confkey) WITH ORDINALITY k(n, i)
             JOIN pg_attribute a ON a.attrelid = con.confrelid AND a.attnum = k.n ORDER BY k.i),
       CASE WHEN con.contype = 'c' THEN pg_get_expr(con.conbin, con.conrelid) END,
       coalesce((to_jsonb(ix) ->> 'indnullsnotdistinct')::bool, false)
  FROM pg_constraint con
  JOIN t ON con.conrelid = t.oid
  LEFT JOIN pg_index ix ON ix.indexrelid = con.conindid AND con.contype IN ('p', 'u')
  LEFT JOIN pg_class rc ON rc.oid = con.confrelid AND con.contype = 'f'
  LEFT JOIN pg_namespace rn ON rn.oid = rc.relnamespace
 WHERE con.contype IN ('p', 'u', 'c', 'f')
UNION ALL
SELECT ic.relname::text, 'i',
       ARRAY(SELECT a.attname::text FROM unnest(ix.indkey::int2[]) WITH ORDINALITY k(n, i)
             JOIN pg_attribute a ON a.attrelid = ix.indrelid AND a.attnum = k.n ORDER BY k.i),
       NULL, NULL, NULL, NULL,
       coalesce((to_jsonb(ix) ->> 'indnullsnotdistinct')::bool, false)
  FROM pg_index ix
  JOIN t ON ix.indrelid = t.oid
  JOIN pg_class ic ON ic.oid = ix.indexrelid
 WHERE ix.indisunique AND ix.indexprs IS NULL AND ix.indpred IS NULL
   AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = ix.indexrelid)
 ORDER BY 1";

/// The constraints of `table`, by name.
pub async fn constraints(client: &Client, table: &TableId) -> anyhow::Result<Vec<Constraint>> {
    let rows = client
        .query(CONSTRAINTS_SQL, &[&table.schema, &table.table])
        .await
        .with_context(|| format!("reading the constraints of {table}"))?;
    Ok(rows
        .iter()
        .map(|r| {
            let kind = match r.get::<_, String>(1).as_str() {
                "p" => Kind::PrimaryKey,
                "c" => Kind::Check,
                "f" => Kind::ForeignKey,
                _ => Kind::Unique,
            };
            let references = match (r.get::<_, Option<String>>(3), r.get::<_, Option<String>>(4)) {
                (Some(schema), Some(name)) => Some((
                    TableId::new(schema, name),
                    r.get::<_, Option<Vec<String>>>(5).unwrap_or_default(),
                )),
                _ => None,
            };
            Constraint {
                name: r.get(0),
                kind,
                columns: r.get(2),
                references,
                expression: r.get(6),
                nulls_not_distinct: r.get(7),
            }
        })
        .collect())
}

/// Up to `limit` rows of `table`'s `columns` as JSON objects (the exporter's spelling of
/// each value: `to_json`), in no particular order.
pub async fn sample_rows(
    client: &Client,
    table: &TableId,
    columns: &[String],
    limit: i64,
) -> anyhow::Result<Vec<String>> {
    let names: Vec<String> = columns.iter().map(|c| ident(c)).collect();
    // A subselect, not json_build_object: that takes at most 100 arguments.
    let sql = format!(
        "SELECT to_json(s)::text FROM (SELECT {} FROM {} LIMIT $1) s",
        names.join(", "),
        qualified(table)
    );
    let rows = client.query(&sql, &[&limit]).await.map_err(|e| {
        anyhow::anyhow!(
            "sampling the rows of {table}: {}",
            larch_postgres::errors::message(&e)
        )
    })?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// How many of `rows` (JSON objects of transformed values) fail the CHECK `expression` of
/// `table`: each becomes a row of the table's type (`jsonb_populate_recordset`) and the
/// expression is evaluated on it in a SELECT. A CHECK passes when its expression is true or
/// NULL, as PostgreSQL's.
pub async fn failing_check(
    client: &Client,
    table: &TableId,
    expression: &str,
    rows: &[String],
) -> Result<i64, String> {
    let sql = format!(
        "SELECT count(*) FROM jsonb_populate_recordset(NULL::{}, $1::text::jsonb) AS t \
         WHERE ({expression}) IS FALSE",
        qualified(table)
    );
    let array = format!("[{}]", rows.join(","));
    client
        .query_one(&sql, &[&array])
        .await
        .map(|r| r.get(0))
        // A data error is reduced to its SQLSTATE: its text may quote a value.
        .map_err(|e| larch_postgres::errors::message(&e))
}

fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn qualified(table: &TableId) -> String {
    format!("{}.{}", ident(&table.schema), ident(&table.table))
}
