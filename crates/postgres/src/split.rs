//! A split export's ranges: one table cut into ranges of its pages by `ctid`, each read over a
//! connection of its own that imports the one exported snapshot. PostgreSQL 14 and later read
//! such a range with a TID range scan (only its pages). The last range is open-ended, so rows
//! on pages the table gained since its size was read are still read.

use anyhow::{Context, anyhow};
use tokio_postgres::Client;

use crate::config::{ident, qualified};
use larch_archive::model::TableId;

/// One range of a split.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Range {
    /// Pages `[first, end)` of the table (`end: None`: to the end of the table).
    Pages { first: u64, end: Option<u64> },
    /// Rows whose key column is in `[lower, upper)` (`None`: unbounded on that side), for a
    /// table without pages of its own (a partitioned table). Bounds are SQL literals of the
    /// column's type, made by PostgreSQL's `quote_literal`.
    Keys {
        column: String,
        lower: Option<String>,
        upper: Option<String>,
    },
}

impl Range {
    /// The range's condition (`None`: the whole table).
    pub fn predicate(&self) -> Option<String> {
        match self {
            Range::Pages { first, end } => match (*first, *end) {
                (0, None) => None,
                (0, Some(e)) => Some(format!("ctid < '({e},0)'::tid")),
                (f, None) => Some(format!("ctid >= '({f},0)'::tid")),
                (f, Some(e)) => Some(format!("ctid >= '({f},0)'::tid AND ctid < '({e},0)'::tid")),
            },
            Range::Keys {
                column,
                lower,
                upper,
            } => {
                let c = ident(column);
                match (lower, upper) {
                    (None, None) => None,
                    (None, Some(u)) => Some(format!("{c} < {u}")),
                    (Some(l), None) => Some(format!("{c} >= {l}")),
                    (Some(l), Some(u)) => Some(format!("{c} >= {l} AND {c} < {u}")),
                }
            }
        }
    }
}

/// `parts` ranges of about equal numbers of `pages` (fewer when the table has fewer pages;
/// one for an empty table), in page order, the last open-ended.
pub fn ranges(pages: u64, parts: usize) -> Vec<Range> {
    let parts = (parts.max(1) as u64).min(pages.max(1));
    (0..parts)
        .map(|i| Range::Pages {
            first: i * pages / parts,
            end: (i + 1 < parts).then(|| (i + 1) * pages / parts),
        })
        .collect()
}

/// Ranges of `column` cut at `bounds` (ascending, distinct SQL literals): the first and the
/// last open-ended, so every row (also one past the sampled bounds) is in exactly one.
pub fn key_ranges(column: &str, bounds: &[String]) -> Vec<Range> {
    let mut lower = None;
    let mut out = Vec::with_capacity(bounds.len() + 1);
    for b in bounds {
        out.push(Range::Keys {
            column: column.to_string(),
            lower: lower.replace(b.clone()),
            upper: Some(b.clone()),
        });
    }
    out.push(Range::Keys {
        column: column.to_string(),
        lower,
        upper: None,
    });
    out
}

/// Rows sampled per range to place the key bounds.
const SAMPLE_ROWS_PER_RANGE: f64 = 10_000.0;

/// Plans the ranges of `table` from its size in pages, read on `client` (the snapshot's
/// coordinating connection). A table without pages of its own (a partitioned table's parent)
/// cannot be cut by `ctid`: it is cut by ranges of its primary key's first column, at bounds
/// sampled from the table; without a primary key it is read as one range (a log line says so).
pub async fn plan(client: &Client, table: &TableId, parts: usize) -> anyhow::Result<Vec<Range>> {
    let row = client
        .query_one(
            "SELECT c.relkind::text, pg_relation_size(c.oid) / current_setting('block_size')::bigint \
             FROM pg_class c WHERE c.oid = $1::text::regclass",
            &[&qualified(table)],
        )
        .await
        .with_context(|| format!("reading the size of table {table} to split it"))?;
    let kind: String = row.get(0);
    let pages: i64 = row.get(1);
    if !matches!(kind.as_str(), "r" | "m") {
        return plan_by_key(client, table, &kind, parts).await;
    }
    let pages = u64::try_from(pages).map_err(|_| anyhow!("table {table} has {pages} pages"))?;
    let planned = ranges(pages, parts);
    tracing::info!(table = %table, pages, ranges = planned.len(), "split into ctid ranges");
    Ok(planned)
}

/// The PK-range fallback of [`plan`].
async fn plan_by_key(
    client: &Client,
    table: &TableId,
    kind: &str,
    parts: usize,
) -> anyhow::Result<Vec<Range>> {
    let whole = || ranges(0, 1);
    if parts < 2 {
        return Ok(whole());
    }
    let Some(column) = first_key_column(client, table).await? else {
        tracing::warn!(table = %table, relkind = %kind, parts, "the table has no pages of its own and no primary key: it cannot be split and is read as one range");
        return Ok(whole());
    };
    let bounds = sampled_bounds(client, table, &column, parts).await?;
    let planned = key_ranges(&column, &bounds);
    tracing::info!(table = %table, relkind = %kind, column = %column, ranges = planned.len(), "no pages of its own (a partitioned table): split into ranges of its primary key");
    Ok(planned)
}

/// The first column of `table`'s primary key, if it has one.
async fn first_key_column(client: &Client, table: &TableId) -> anyhow::Result<Option<String>> {
    let row = client
        .query_opt(
            "SELECT a.attname::text FROM pg_index i \
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] \
             WHERE i.indrelid = $1::text::regclass AND i.indisprimary",
            &[&qualified(table)],
        )
        .await
        .with_context(|| format!("reading the primary key of table {table} to split it"))?;
    Ok(row.map(|r| r.get(0)))
}

/// `parts - 1` ascending, distinct bounds of `column` (fewer when the sample has fewer
/// distinct values), as SQL literals cast to the column's type, from about
/// [`SAMPLE_ROWS_PER_RANGE`] sampled rows per range.
async fn sampled_bounds(
    client: &Client,
    table: &TableId,
    column: &str,
    parts: usize,
) -> anyhow::Result<Vec<String>> {
    let q = qualified(table);
    let c = ident(column);
    // reltuples of a partitioned parent is -1 until it is analyzed: sum its leaves'.
    let rows: f64 = client
        .query_one(
            "SELECT coalesce(sum(greatest(c.reltuples, 0)), 0)::float8 \
             FROM pg_partition_tree($1::text::regclass) t JOIN pg_class c ON c.oid = t.relid \
             WHERE t.isleaf",
            &[&q],
        )
        .await
        .with_context(|| format!("estimating the rows of table {table} to split it"))?
        .get(0);
    let wanted = SAMPLE_ROWS_PER_RANGE * parts as f64;
    let percent = if rows <= wanted {
        100.0
    } else {
        (100.0 * wanted / rows).max(0.0001)
    };
    let sql = format!(
        "SELECT quote_literal(max(k)::text) || '::' || $1 FROM \
           (SELECT k, ntile({parts}) OVER (ORDER BY k) AS g FROM \
              (SELECT {c} AS k FROM {q} TABLESAMPLE SYSTEM ({percent})) s) b \
         GROUP BY g ORDER BY g"
    );
    let type_name: String = client
        .query_one(
            "SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a \
             WHERE a.attrelid = $1::text::regclass AND a.attname = $2",
            &[&q, &column],
        )
        .await
        .with_context(|| format!("reading the type of {table}.{column}"))?
        .get(0);
    let sampled = client
        .query(&sql, &[&type_name])
        .await
        .with_context(|| format!("sampling the key {column} of table {table} to split it"))?;
    let mut bounds: Vec<String> = sampled.iter().map(|r| r.get(0)).collect();
    // The last group's maximum bounds nothing: the last range is open-ended.
    bounds.pop();
    bounds.dedup();
    Ok(bounds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_every_page_once_and_the_last_is_open() {
        let r = ranges(10, 3);
        assert_eq!(
            r,
            vec![
                Range::Pages {
                    first: 0,
                    end: Some(3)
                },
                Range::Pages {
                    first: 3,
                    end: Some(6)
                },
                Range::Pages {
                    first: 6,
                    end: None
                },
            ]
        );
        assert_eq!(r[0].predicate().unwrap(), "ctid < '(3,0)'::tid");
        assert_eq!(
            r[1].predicate().unwrap(),
            "ctid >= '(3,0)'::tid AND ctid < '(6,0)'::tid"
        );
        assert_eq!(r[2].predicate().unwrap(), "ctid >= '(6,0)'::tid");
    }

    #[test]
    fn small_tables_get_fewer_ranges() {
        assert_eq!(
            ranges(0, 4),
            vec![Range::Pages {
                first: 0,
                end: None
            }]
        );
        assert_eq!(ranges(0, 4)[0].predicate(), None);
        assert_eq!(ranges(2, 4).len(), 2);
        assert_eq!(
            ranges(1000, 1),
            vec![Range::Pages {
                first: 0,
                end: None
            }]
        );
    }

    #[test]
    fn key_ranges_are_open_at_both_ends_and_meet_at_each_bound() {
        let bounds = vec!["'10'::bigint".to_string(), "'20'::bigint".to_string()];
        let r = key_ranges("order id", &bounds);
        let p: Vec<_> = r.iter().map(|r| r.predicate().unwrap()).collect();
        assert_eq!(
            p,
            vec![
                "\"order id\" < '10'::bigint",
                "\"order id\" >= '10'::bigint AND \"order id\" < '20'::bigint",
                "\"order id\" >= '20'::bigint",
            ]
        );
        assert_eq!(key_ranges("id", &[])[0].predicate(), None);
    }
}
