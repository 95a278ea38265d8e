//! A split export's ranges: one table cut into ranges of its pages by `ctid`, each read over a
//! connection of its own that imports the one exported snapshot. PostgreSQL 14 and later read
//! such a range with a TID range scan (only its pages). The last range is open-ended, so rows
//! on pages the table gained since its size was read are still read.

use anyhow::{Context, anyhow};
use tokio_postgres::Client;

use crate::config::qualified;
use larch_archive::model::TableId;

/// One range of a split: its pages `[first, end)` (`end: None`: to the end of the table).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Range {
    pub first: u64,
    pub end: Option<u64>,
}

impl Range {
    /// The range's condition on `ctid` (`None`: the whole table).
    pub fn predicate(&self) -> Option<String> {
        match (self.first, self.end) {
            (0, None) => None,
            (0, Some(e)) => Some(format!("ctid < '({e},0)'::tid")),
            (f, None) => Some(format!("ctid >= '({f},0)'::tid")),
            (f, Some(e)) => Some(format!("ctid >= '({f},0)'::tid AND ctid < '({e},0)'::tid")),
        }
    }
}

/// `parts` ranges of about equal numbers of `pages` (fewer when the table has fewer pages;
/// one for an empty table), in page order, the last open-ended.
pub fn ranges(pages: u64, parts: usize) -> Vec<Range> {
    let parts = (parts.max(1) as u64).min(pages.max(1));
    (0..parts)
        .map(|i| Range {
            first: i * pages / parts,
            end: (i + 1 < parts).then(|| (i + 1) * pages / parts),
        })
        .collect()
}

/// Plans the ranges of `table` from its size in pages, read on `client` (the snapshot's
/// coordinating connection). A table without pages of its own (a partitioned table's parent,
/// a view) cannot be cut by `ctid`: it is read as one range, and a log line says so.
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
        tracing::warn!(table = %table, relkind = %kind, parts, "the table has no pages of its own (a partitioned table?): it cannot be split by ctid and is read as one range");
        return Ok(ranges(0, 1));
    }
    let pages = u64::try_from(pages).map_err(|_| anyhow!("table {table} has {pages} pages"))?;
    let planned = ranges(pages, parts);
    tracing::info!(table = %table, pages, ranges = planned.len(), "split into ctid ranges");
    Ok(planned)
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
                Range {
                    first: 0,
                    end: Some(3)
                },
                Range {
                    first: 3,
                    end: Some(6)
                },
                Range {
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
            vec![Range {
                first: 0,
                end: None
            }]
        );
        assert_eq!(ranges(0, 4)[0].predicate(), None);
        assert_eq!(ranges(2, 4).len(), 2);
        assert_eq!(
            ranges(1000, 1),
            vec![Range {
                first: 0,
                end: None
            }]
        );
    }
}
