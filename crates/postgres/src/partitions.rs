//! How a partitioned table is partitioned, read from the catalog for the manifest
//! ([`PartitioningRecord`]): its key and every partition's bound, at every level.

use std::collections::HashMap;

use anyhow::Context;
use tokio_postgres::Client;

use larch_archive::model::TableId;
use larch_archive::partitioning::{PartitionRecord, PartitioningRecord};

use crate::PostgresSource;

impl PostgresSource {
    /// How `table` is partitioned; None for a plain table.
    pub async fn partitioning(
        &self,
        table: &TableId,
    ) -> anyhow::Result<Option<PartitioningRecord>> {
        let client = self.inner.client().await?;
        partitioning(&client, table).await
    }
}

/// One catalog row: a partitioned table (the root or a partition that is partitioned too) or
/// a partition, with its parent.
struct Node {
    parent: Option<u32>,
    schema: String,
    name: String,
    bound: String,
    key: Option<String>,
}

/// How `table` is partitioned (one recursive query over `pg_inherits`); None for a plain table.
pub async fn partitioning(
    client: &Client,
    table: &TableId,
) -> anyhow::Result<Option<PartitioningRecord>> {
    let rows = client
        .query(
            "WITH RECURSIVE tree(oid, parent) AS (
                 SELECT c.oid, NULL::oid FROM pg_class c
                  WHERE c.oid = to_regclass(format('%I.%I', $1::text, $2::text))
                    AND c.relkind = 'p'
                 UNION ALL
                 SELECT i.inhrelid, i.inhparent FROM pg_inherits i JOIN tree t ON i.inhparent = t.oid
             )
             SELECT t.oid::int8, t.parent::int8, n.nspname::text, c.relname::text,
                    coalesce(pg_get_expr(c.relpartbound, c.oid), ''),
                    CASE WHEN c.relkind = 'p' THEN pg_get_partkeydef(c.oid) END
               FROM tree t JOIN pg_class c ON c.oid = t.oid
               JOIN pg_namespace n ON n.oid = c.relnamespace
              ORDER BY 3, 4",
            &[&table.schema, &table.table],
        )
        .await
        .with_context(|| format!("reading the partitions of table {table}"))?;
    let mut nodes: HashMap<u32, Node> = HashMap::new();
    let mut root = None;
    let mut order = Vec::new();
    for r in &rows {
        let oid = r.get::<_, i64>(0) as u32;
        let parent = r.get::<_, Option<i64>>(1).map(|p| p as u32);
        if parent.is_none() {
            root = Some(oid);
        }
        order.push(oid);
        nodes.insert(
            oid,
            Node {
                parent,
                schema: r.get(2),
                name: r.get(3),
                bound: r.get(4),
                key: r.get(5),
            },
        );
    }
    Ok(root.map(|root| build(root, &order, &nodes)))
}

/// The record of the partitioned table `oid`: its children in name order, each built the same.
fn build(oid: u32, order: &[u32], nodes: &HashMap<u32, Node>) -> PartitioningRecord {
    let partitions = order
        .iter()
        .filter(|child| nodes[*child].parent == Some(oid))
        .map(|child| {
            let node = &nodes[child];
            PartitionRecord {
                schema: node.schema.clone(),
                name: node.name.clone(),
                bound: node.bound.clone(),
                partitioning: node
                    .key
                    .as_ref()
                    .map(|_| Box::new(build(*child, order, nodes))),
            }
        })
        .collect();
    PartitioningRecord {
        key: nodes[&oid].key.clone().unwrap_or_default(),
        partitions,
    }
}
