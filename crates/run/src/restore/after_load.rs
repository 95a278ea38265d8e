//! Tables a restore replaces (`--if-exists replace`) get their rows before their secondary
//! indexes and foreign keys, as a bulk load should: inside the restore's transaction, after the
//! `TRUNCATE`, each such index is dropped and each foreign key of the table dropped; once every
//! table is loaded the indexes are built again (one sort each instead of an index insert per
//! row) and each foreign key is added `NOT VALID`, then `VALIDATE`d (one join instead of a
//! trigger event queued per row, which the server holds in memory until the check). All of it
//! commits with the rows or rolls back with them: the definitions are never lost.
//!
//! Left in place (so nothing that depends on them breaks): the primary key, unique and
//! exclusion constraints and the indexes any constraint uses, the replica identity and
//! clustered index, indexes and keys with a comment or outside the default tablespace, and
//! everything of a partitioned table or a partition.

use anyhow::Context;
use tokio_postgres::Transaction;

use larch_archive::model::TableId;

use super::qualified;

/// What was set aside, to be made again after the load.
#[derive(Default)]
pub(super) struct SetAside {
    /// `CREATE INDEX` statements, as `pg_get_indexdef` prints them.
    indexes: Vec<String>,
    /// Each foreign key: its table, its name and its definition (`pg_get_constraintdef`).
    keys: Vec<(TableId, String, String)>,
}

impl SetAside {
    pub(super) fn is_empty(&self) -> bool {
        self.indexes.is_empty() && self.keys.is_empty()
    }
}

const INDEXES: &str = "SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid)
  FROM pg_index i
  JOIN pg_class t ON t.oid = i.indrelid
  JOIN pg_class x ON x.oid = i.indexrelid
 WHERE i.indrelid = $1::text::regclass
   AND t.relkind = 'r' AND NOT t.relispartition
   AND i.indisvalid AND NOT i.indisprimary AND NOT i.indisreplident AND NOT i.indisclustered
   AND x.reltablespace = 0
   AND obj_description(i.indexrelid, 'pg_class') IS NULL
   AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid)
 ORDER BY 1";

const KEYS: &str = "SELECT k.conname::text, pg_get_constraintdef(k.oid)
  FROM pg_constraint k
  JOIN pg_class t ON t.oid = k.conrelid
 WHERE k.conrelid = $1::text::regclass AND k.contype = 'f' AND k.convalidated
   AND t.relkind = 'r' AND NOT t.relispartition AND k.conparentid = 0
   AND obj_description(k.oid, 'pg_constraint') IS NULL
 ORDER BY 1";

/// Drops the secondary indexes and foreign keys of `tables` (existing tables being replaced)
/// inside `tx`, returning how to make them again.
pub(super) async fn set_aside(
    tx: &Transaction<'_>,
    tables: &[TableId],
) -> anyhow::Result<SetAside> {
    let mut aside = SetAside::default();
    for table in tables {
        let name = qualified(table);
        for row in tx
            .query(KEYS, &[&name])
            .await
            .with_context(|| format!("restore: reading the foreign keys of {table}"))?
        {
            let (key, definition): (String, String) = (row.get(0), row.get(1));
            let sql = format!(
                "ALTER TABLE {name} DROP CONSTRAINT {}",
                super::quote_ident(&key)
            );
            tx.batch_execute(&sql)
                .await
                .with_context(|| format!("restore: {sql}"))?;
            aside.keys.push((table.clone(), key, definition));
        }
        for row in tx
            .query(INDEXES, &[&name])
            .await
            .with_context(|| format!("restore: reading the indexes of {table}"))?
        {
            let (index, definition): (String, String) = (row.get(0), row.get(1));
            let sql = format!("DROP INDEX {index}");
            tx.batch_execute(&sql)
                .await
                .with_context(|| format!("restore: {sql}"))?;
            aside.indexes.push(definition);
        }
    }
    if !aside.is_empty() {
        tracing::info!(
            indexes = aside.indexes.len(),
            foreign_keys = aside.keys.len(),
            "restore: secondary indexes and foreign keys of the replaced tables are made again after the rows are in"
        );
    }
    Ok(aside)
}

/// Builds the indexes again, then adds each foreign key `NOT VALID` and validates it: a row
/// that breaks one fails the restore (rolled back), naming the key and its table.
pub(super) async fn make_again(tx: &Transaction<'_>, aside: SetAside) -> anyhow::Result<()> {
    for sql in aside.indexes {
        tx.batch_execute(&sql)
            .await
            .with_context(|| format!("restore: building an index again after the load ({sql})"))?;
    }
    for (table, key, definition) in &aside.keys {
        let (name, key_sql) = (qualified(table), super::quote_ident(key));
        let add = format!("ALTER TABLE {name} ADD CONSTRAINT {key_sql} {definition} NOT VALID");
        tx.batch_execute(&add)
            .await
            .with_context(|| format!("restore: {add}"))?;
        let validate = format!("ALTER TABLE {name} VALIDATE CONSTRAINT {key_sql}");
        tx.batch_execute(&validate).await.with_context(|| {
            format!(
                "restore: the restored rows of {table} break its foreign key {key} ({definition})"
            )
        })?;
    }
    Ok(())
}
