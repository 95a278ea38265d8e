//! Schema changes during `larch export --follow` against a real PostgreSQL 15, under a write
//! load: after each DDL the archive starts a new epoch whose manifest `columns` describe the new
//! schema, `reconstruct` at the head equals the table (every row, every column, as exact JSON
//! text), and an engine following the archive ends equal to the table with a memory target and
//! with a PostgreSQL target whose table it altered.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use larch::archive::format::Format;
use larch::archive::model::{Action, ColumnDefinition};
use larch::archive::reader::ArchiveReader;
use larch::archive::store::Store;
use larch::archive::store::local::LocalStore;
use serde_json::value::RawValue;

use crate::archive_build::TestArchive;
use crate::engine_support::{eventually, get, get_json, metric, start_engine, wait_ready};
use crate::postgres_continuous::Follow;
use crate::support::postgres::{Database, new_database};

/// A row as column → exact JSON text of the value.
type Fields = BTreeMap<String, String>;

fn fields(json: &str) -> Fields {
    let map: BTreeMap<String, Box<RawValue>> =
        serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}"));
    map.into_iter()
        .map(|(k, v)| (k, v.get().to_string()))
        .collect()
}

/// Rows by id (unique in every schema of these tests).
fn by_id(rows: impl IntoIterator<Item = String>) -> BTreeMap<i64, Fields> {
    rows.into_iter()
        .map(|r| {
            let f = fields(&r);
            (f["id"].parse().unwrap(), f)
        })
        .collect()
}

/// Every row of `table` as PostgreSQL's own `row_to_json`.
async fn pg_rows(client: &tokio_postgres::Client, table: &str) -> BTreeMap<i64, Fields> {
    let rows = client
        .query(&format!("SELECT row_to_json(t)::text FROM {table} t"), &[])
        .await
        .unwrap();
    by_id(rows.iter().map(|r| r.get::<_, String>(0)))
}

async fn archive_rows(dir: &Path) -> BTreeMap<i64, Fields> {
    let store = Arc::new(LocalStore::new(dir).unwrap());
    let reader = ArchiveReader::new(store, "public.items/", vec![Format::Jsonl]).unwrap();
    match reader.reconstruct_at(None, &[]).await {
        Ok((_, folded)) => by_id(folded.rows.values().map(|r| r.as_str().to_string())),
        // Read while the exporter writes; the caller polls.
        Err(_) => BTreeMap::new(),
    }
}

fn raw_manifest(dir: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join("public.items/manifest.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The table's columns as the manifest must describe them, read with laredo's field names
/// from the manifest's raw JSON: `Name Type Nullable PrimaryKey PrimaryKeyOrdinal
/// OrdinalPosition SqlType`.
async fn pg_columns(db: &Database) -> Vec<String> {
    db.client
        .query(
            "SELECT format('%s %s %s %s %s %s %s', a.attname, t.typname, (NOT a.attnotnull)::text,
                           (COALESCE(k.ord, 0) > 0)::text, COALESCE(k.ord, 0), a.attnum,
                           format_type(a.atttypid, a.atttypmod))
               FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
               LEFT JOIN (SELECT u.attnum, u.ord FROM pg_index i,
                                 unnest(i.indkey) WITH ORDINALITY u(attnum, ord)
                           WHERE i.indrelid = 'items'::regclass AND i.indisprimary) k
                      ON k.attnum = a.attnum
              WHERE a.attrelid = 'items'::regclass AND a.attnum > 0 AND NOT a.attisdropped
              ORDER BY a.attnum",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

fn manifest_columns(m: &serde_json::Value) -> Vec<String> {
    m["columns"]
        .as_array()
        .map(|cols| {
            cols.iter()
                .map(|c| {
                    format!(
                        "{} {} {} {} {} {} {}",
                        c["Name"].as_str().unwrap(),
                        c["Type"].as_str().unwrap(),
                        c["Nullable"],
                        c["PrimaryKey"],
                        c["PrimaryKeyOrdinal"],
                        c["OrdinalPosition"],
                        c["SqlType"].as_str().unwrap()
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Inserts, updates and deletes rows of `items` (touching `id` and `name` only, which every
/// schema of the test keeps) until stopped; each statement is its own transaction.
struct Load {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<u64>,
}

impl Load {
    async fn start(db: &Database, next_id: Arc<AtomicI64>) -> Load {
        let client = crate::support::postgres::cluster().connect(&db.name).await;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut n = 0u64;
            while !flag.load(Ordering::SeqCst) {
                n += 1;
                let top = next_id.load(Ordering::SeqCst);
                let any = 1 + (n * 7919) as i64 % top;
                let sql = match n % 4 {
                    0 | 1 => format!("UPDATE items SET name = 'u{n}' WHERE id = {any}"),
                    2 => {
                        let id = next_id.fetch_add(1, Ordering::SeqCst);
                        format!("INSERT INTO items (id, name) VALUES ({id}, 'i{n}')")
                    }
                    _ => format!("DELETE FROM items WHERE id = {any}"),
                };
                client
                    .batch_execute(&sql)
                    .await
                    .unwrap_or_else(|e| panic!("load: {sql}: {e}"));
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            n
        });
        Load { stop, task }
    }

    /// Stops and returns how many statements ran (each committed).
    async fn finish(self) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.unwrap()
    }
}

fn engine_yaml(archive: &Path, target_dsn_file: &Path) -> String {
    format!(
        r#"
sources:
  seed:
    type: archive
    store: {{type: local, path: "{}"}}
    key_prefix: public.items/
    follow: true
    poll_interval: 100ms
tables:
  - source: seed
    schema: public
    table: items
    targets:
      - type: memory
      - type: postgres
        connection_file: "{}"
"#,
        archive.display(),
        target_dsn_file.display()
    )
}

async fn export_epoch(f: &Follow) -> i64 {
    f.status().await["epoch"].as_i64().unwrap_or(0)
}

/// After a DDL: the export has started the next epoch and its manifest describes the table.
async fn await_schema_epoch(db: &Database, f: &Follow, dir: &Path, epoch: i64, what: &str) {
    let want = pg_columns(db).await;
    eventually(60, &format!("the epoch of {what}"), || {
        let want = want.clone();
        async move {
            (export_epoch(f).await > epoch && manifest_columns(&raw_manifest(dir)) == want)
                .then_some(())
        }
    })
    .await;
}

/// The primary key's columns of table `$1`, in key order.
const PRIMARY_KEY: &str = "SELECT string_agg(a.attname, ', ' ORDER BY k.ord)
      FROM pg_index i, unnest(i.indkey) WITH ORDINALITY k(attnum, ord), pg_attribute a
     WHERE i.indrelid = $1::text::regclass AND i.indisprimary
       AND a.attrelid = i.indrelid AND a.attnum = k.attnum";

/// Everything equals the table: the archive's head, the memory target, the PostgreSQL target
/// (rows, column types, primary key, and the checkpoint at the archive's head).
async fn assert_all_equal(
    db: &Database,
    target: &Database,
    dir: &Path,
    engine_addr: std::net::SocketAddr,
    memory: &larch::engine::targets::memory::MemoryTarget,
    what: &str,
) {
    let want = pg_rows(&db.client, "items").await;
    assert!(want.len() > 100, "{what}: the table lost its rows");
    eventually(60, &format!("{what}: reconstruct = table"), || async {
        (archive_rows(dir).await == want).then_some(())
    })
    .await;
    let head = raw_manifest(dir)["head_position"]
        .as_str()
        .unwrap()
        .to_string();
    eventually(60, &format!("{what}: memory target = table"), || async {
        let _ = get(engine_addr, "/status").await;
        (by_id(memory.rows()) == want).then_some(())
    })
    .await;
    eventually(60, &format!("{what}: postgres target = table"), || async {
        let rows = pg_rows(&target.client, "public.items").await;
        let at = target
            .client
            .query_opt("SELECT position FROM public.larch_checkpoint", &[])
            .await
            .unwrap()
            .map(|r| r.get::<_, String>(0));
        (rows == want && at.as_deref() == Some(head.as_str())).then_some(())
    })
    .await;
    let shape = "SELECT string_agg(a.attname || ' ' || t.typname, ', ' ORDER BY a.attname)
                   FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
                  WHERE a.attrelid = $1::text::regclass AND a.attnum > 0 AND NOT a.attisdropped";
    let key = PRIMARY_KEY;
    for sql in [shape, key] {
        let source: String = db.client.query_one(sql, &[&"items"]).await.unwrap().get(0);
        let dest: String = target
            .client
            .query_one(sql, &[&"public.items"])
            .await
            .unwrap()
            .get(0);
        assert_eq!(dest, source, "{what}: the postgres target's table");
    }
    let described = memory.describe();
    let key_now: String = db.client.query_one(key, &[&"items"]).await.unwrap().get(0);
    assert_eq!(
        described["primary_key"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_str().unwrap())
            .collect::<Vec<_>>()
            .join(", "),
        key_now,
        "{what}: the memory target's key"
    );
}

/// A fresh database with `items` made by `setup`, and `larch export --follow` on it (slot
/// `larch_<name>_<database>`, the given diff interval), ready.
async fn follow_new_table(
    setup: &str,
    name: &str,
    interval: &str,
) -> (Database, tempfile::TempDir, String, Follow) {
    let db = new_database().await;
    db.client.batch_execute(setup).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let slot = format!("larch_{name}_{}", db.name);
    let f = Follow::start(&db, dir.path(), &slot, &["--diff-interval", interval]);
    f.ready().await;
    (db, dir, slot, f)
}

#[tokio::test]
async fn every_ddl_under_load_reaches_the_archive_and_both_engine_targets() {
    let db = new_database().await;
    let target = new_database().await;
    db.client
        .batch_execute(
            "CREATE SEQUENCE items_seq START 1000;
             CREATE TABLE items (id int8 PRIMARY KEY, name text NOT NULL, qty int4);
             INSERT INTO items SELECT g, 'n' || g, g % 13 FROM generate_series(1, 300) g;",
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let slot = format!("larch_ddl_{}", db.name);
    let f = Follow::start(&db, dir.path(), &slot, &["--diff-interval", "200ms"]);
    f.ready().await;
    let dsn_file = dir.path().join("target.dsn");
    std::fs::write(&dsn_file, &target.dsn).unwrap();
    let archive_dir = dir.path().to_path_buf();
    let engine = start_engine(&engine_yaml(&archive_dir, &dsn_file)).await;
    wait_ready(engine.addr).await;
    let memory = engine.shared.tables["public.items"].clone();
    let next_id = Arc::new(AtomicI64::new(301));

    let steps: &[(&str, &str)] = &[
        (
            "ADD COLUMN without a default",
            "ALTER TABLE items ADD COLUMN note text",
        ),
        (
            "ADD COLUMN with a constant default",
            "ALTER TABLE items ADD COLUMN extra int4 DEFAULT 7",
        ),
        (
            "ADD COLUMN with a volatile default",
            "ALTER TABLE items ADD COLUMN seq int8 DEFAULT nextval('items_seq')",
        ),
        ("DROP COLUMN", "ALTER TABLE items DROP COLUMN note"),
        (
            "RENAME COLUMN",
            "ALTER TABLE items RENAME COLUMN qty TO quantity",
        ),
        (
            "ALTER COLUMN TYPE (same name)",
            "ALTER TABLE items ALTER COLUMN quantity TYPE numeric(12,2)",
        ),
        (
            "a new primary key",
            "ALTER TABLE items DROP CONSTRAINT items_pkey, ADD PRIMARY KEY (id, name)",
        ),
        (
            "a DDL inside a transaction with row changes",
            "BEGIN;
             UPDATE items SET name = name || '+' WHERE id % 10 = 0;
             ALTER TABLE items ADD COLUMN late bool DEFAULT true;
             UPDATE items SET late = false WHERE id % 7 = 0;
             INSERT INTO items (id, name, late) VALUES (100000, 'in the DDL transaction', NULL);
             COMMIT;",
        ),
    ];
    assert_all_equal(
        &db,
        &target,
        &archive_dir,
        engine.addr,
        &memory,
        "the first epoch",
    )
    .await;
    let mut statements = 0;
    for (i, (what, ddl)) in steps.iter().enumerate() {
        let load = Load::start(&db, next_id.clone()).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let epoch = export_epoch(&f).await;
        db.client
            .batch_execute(ddl)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        await_schema_epoch(&db, &f, &archive_dir, epoch, what).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        statements += load.finish().await;
        assert_all_equal(&db, &target, &archive_dir, engine.addr, &memory, what).await;
        assert_eq!(
            export_epoch(&f).await,
            i as i64 + 2,
            "{what}: one new epoch per DDL"
        );
    }
    assert!(statements > 200, "the load ran ({statements} statements)");
    let (_, m) = get(f.addr, "/metrics").await;
    assert_eq!(
        metric(
            &m,
            r#"larch_export_artifacts_total{kind="snapshot",reason="schema_change",table="public.items"}"#
        ),
        Some(steps.len() as f64),
        "{m}"
    );
    let (_, m) = get(engine.addr, "/metrics").await;
    assert_eq!(
        metric(&m, r#"laredo_source_rebaseline_total{source="seed"}"#),
        Some(steps.len() as f64),
        "each new epoch re-baselines the engine once"
    );
    let status = get_json(engine.addr, "/status").await;
    assert_eq!(
        status["pipelines"]["seed:public.items:postgres"]["state"], "STREAMING",
        "{status}"
    );
    engine.stop().await.unwrap();
    assert_eq!(f.terminate(), 0);
}

#[tokio::test]
async fn a_constant_default_without_writes_reaches_the_archive_within_a_diff_interval() {
    // The issue's case: PostgreSQL writes nothing to WAL for the existing rows, and no row
    // changes after the DDL, so no Relation message ever comes.
    let (db, dir, _, f) = follow_new_table(
        "CREATE TABLE items (id int8 PRIMARY KEY, name text);
             INSERT INTO items SELECT g, 'n' || g FROM generate_series(1, 200) g;",
        "default",
        "300ms",
    )
    .await;
    db.client
        .batch_execute("ALTER TABLE items ADD COLUMN extra int4 DEFAULT 7")
        .await
        .unwrap();
    await_schema_epoch(&db, &f, dir.path(), 1, "ADD COLUMN extra int4 DEFAULT 7").await;
    let rows = archive_rows(dir.path()).await;
    assert_eq!(rows, pg_rows(&db.client, "items").await);
    assert_eq!(rows.len(), 200);
    assert!(rows.values().all(|r| r["extra"] == "7"), "{rows:?}");
    assert_eq!(export_epoch(&f).await, 2);
    assert_eq!(f.terminate(), 0);
}

#[tokio::test]
async fn a_ddl_while_the_export_is_stopped_starts_a_new_epoch_on_restart() {
    let (db, dir, slot, f) = follow_new_table(
        "CREATE TABLE items (id int8 PRIMARY KEY, name text, amount numeric(10,2), qty int4);
             INSERT INTO items SELECT g, 'n' || g, g / 8.0, g FROM generate_series(1, 200) g;",
        "stopped",
        "200ms",
    )
    .await;
    assert_eq!(f.terminate(), 0);
    // Neither changes a column's name or udt: only the type modifier (every amount gets two
    // more digits) and the column's identity (qty is a new column) tell.
    db.client
        .batch_execute(
            "ALTER TABLE items ALTER COLUMN amount TYPE numeric(12,4);
             ALTER TABLE items DROP COLUMN qty, ADD COLUMN qty int4 DEFAULT 5;",
        )
        .await
        .unwrap();
    let f = Follow::start(&db, dir.path(), &slot, &["--diff-interval", "200ms"]);
    f.ready().await;
    assert_eq!(export_epoch(&f).await, 2, "a new epoch instead of resuming");
    let rows = archive_rows(dir.path()).await;
    assert_eq!(rows, pg_rows(&db.client, "items").await);
    assert_eq!(rows[&4]["amount"], "0.5000");
    assert_eq!(rows[&4]["qty"], "5");
    assert_eq!(
        manifest_columns(&raw_manifest(dir.path())),
        pg_columns(&db).await
    );
    // And a restart without a DDL resumes the epoch.
    assert_eq!(f.terminate(), 0);
    let f = Follow::start(&db, dir.path(), &slot, &["--diff-interval", "200ms"]);
    f.ready().await;
    assert_eq!(export_epoch(&f).await, 2, "resumed");
    assert_eq!(f.terminate(), 0);
}

/// Typed columns in `spec` order; `key` are the primary key's, in key order.
pub(crate) fn columns(spec: &[(&str, &str)], key: &[&str]) -> Vec<ColumnDefinition> {
    spec.iter()
        .enumerate()
        .map(|(i, (n, t))| {
            let k = key.iter().position(|k| k == n);
            ColumnDefinition {
                name: n.to_string(),
                type_name: t.to_string(),
                nullable: k.is_none(),
                primary_key: k.is_some(),
                primary_key_ordinal: k.map(|k| k as i64 + 1).unwrap_or(0),
                ordinal_position: i as i64 + 1,
                ..Default::default()
            }
        })
        .collect()
}

#[tokio::test]
async fn the_postgres_target_alters_its_table_atomically_with_the_new_rows() {
    // Epoch 1 (id, v text); epoch 2 (id, k, w int4) keyed by (id, k). Readers of the target
    // table see the old shape with the old rows or the new shape with the new rows.
    let target = new_database().await;
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()).unwrap());
    let mut a = TestArchive::new(store, "public.items/", "public.items")
        .with_columns(columns(&[("id", "int8"), ("v", "text")], &["id"]));
    let old: Vec<String> = (1..=2000)
        .map(|i| format!(r#"{{"id":{i},"v":"old-{i}"}}"#))
        .collect();
    a.snapshot("0/100", &old.iter().map(String::as_str).collect::<Vec<_>>())
        .await;
    let dsn_file = dir.path().join("target.dsn");
    std::fs::write(&dsn_file, &target.dsn).unwrap();
    let yaml = engine_yaml(dir.path(), &dsn_file).replace("      - type: memory\n", "");
    let engine = start_engine(&yaml).await;
    wait_ready(engine.addr).await;
    eventually(30, "the first baseline", || async {
        (pg_rows(&target.client, "public.items").await.len() == 2000).then_some(())
    })
    .await;

    let mut reader = crate::support::postgres::cluster()
        .connect(&target.name)
        .await;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let watcher = tokio::spawn(async move {
        let mut seen = std::collections::BTreeSet::new();
        while !flag.load(Ordering::SeqCst) {
            // The lock first: the baseline swaps in a new table, which a name resolved before
            // the lock would miss.
            let tx = reader
                .build_transaction()
                .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
                .start()
                .await
                .unwrap();
            tx.batch_execute("LOCK TABLE public.items IN ACCESS SHARE MODE")
                .await
                .unwrap();
            let r = tx
                .query_one(
                    "SELECT (SELECT string_agg(attname, ',' ORDER BY attname) FROM pg_attribute
                              WHERE attrelid = 'public.items'::regclass AND attnum > 0
                                AND NOT attisdropped),
                            (SELECT count(*) FROM public.items)",
                    &[],
                )
                .await
                .unwrap();
            tx.commit().await.unwrap();
            seen.insert((r.get::<_, String>(0), r.get::<_, i64>(1)));
        }
        seen
    });
    a.manifest.columns = columns(
        &[("id", "int8"), ("k", "int4"), ("w", "int4")],
        &["id", "k"],
    );
    a.key_fields = vec!["id".into(), "k".into()];
    let new: Vec<String> = (1..=3000)
        .map(|i| format!(r#"{{"id":{i},"k":{},"w":{}}}"#, i % 3, i * 2))
        .collect();
    a.snapshot("0/200", &new.iter().map(String::as_str).collect::<Vec<_>>())
        .await;
    a.diff(
        "0/200",
        "0/300",
        &[(Action::Update, None, Some(r#"{"id":5,"k":2,"w":-1}"#))],
    )
    .await;
    eventually(60, "the re-baseline", || async {
        let rows = pg_rows(&target.client, "public.items").await;
        (rows.len() == 3000 && rows[&5]["w"] == "-1").then_some(())
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    let seen = watcher.await.unwrap();
    assert!(seen.len() >= 2, "the watcher saw both tables: {seen:?}");
    for (cols, count) in &seen {
        assert!(
            (cols == "id,v" && *count == 2000) || (cols == "id,k,w" && *count == 3000),
            "a reader saw a half-changed table: columns {cols}, {count} rows"
        );
    }
    let key: String = target
        .client
        .query_one(PRIMARY_KEY, &[&"public.items"])
        .await
        .unwrap()
        .get(0);
    assert_eq!(key, "id, k");
    let at: String = target
        .client
        .query_one("SELECT position FROM public.larch_checkpoint", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(at, "0/300");
    engine.stop().await.unwrap();
}

#[tokio::test]
async fn a_relation_message_ends_the_epoch_at_once_after_a_last_diff_of_whole_transactions() {
    // No diff interval passes during the test: only the stream can notice the DDL.
    let (db, dir, slot, f) = follow_new_table(
        "CREATE TABLE items (id int8 PRIMARY KEY, name text);
             INSERT INTO items SELECT g, 'n' || g FROM generate_series(1, 200) g;",
        "relation",
        "1h",
    )
    .await;
    let before: String = db
        .client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .unwrap()
        .get(0);
    db.client
        .batch_execute("INSERT INTO items VALUES (201, 'before the DDL')")
        .await
        .unwrap();
    // The INSERT is received before the DDL commits (a Relation message after the DDL's commit
    // would see the new catalog and end the epoch before the INSERT: also consistent).
    let inserted: String = db
        .client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .unwrap()
        .get(0);
    eventually(30, "the INSERT sent to the export", || async {
        let sent: bool = db
            .client
            .query_one(
                "SELECT coalesce(bool_or(r.sent_lsn >= $1::text::pg_lsn), false)
                   FROM pg_stat_replication r JOIN pg_replication_slots s ON s.active_pid = r.pid
                  WHERE s.slot_name = $2",
                &[&inserted, &slot],
            )
            .await
            .unwrap()
            .get(0);
        sent.then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    for sql in [
        "ALTER TABLE items ADD COLUMN c int4 DEFAULT 3",
        "UPDATE items SET c = 4 WHERE id = 1",
    ] {
        db.client.batch_execute(sql).await.unwrap();
    }
    await_schema_epoch(&db, &f, dir.path(), 1, "ADD COLUMN c, then an UPDATE").await;
    assert_eq!(
        archive_rows(dir.path()).await,
        pg_rows(&db.client, "items").await
    );

    // Epoch 1 ends with a diff holding the INSERT, committed before the DDL; epoch 2's
    // snapshot follows it. On a loaded machine the DDL may be seen before the export has taken
    // the INSERT in (the other consistent order, above): then epoch 2's snapshot holds it.
    let m = raw_manifest(dir.path());
    let arts = m["artifacts"].as_array().unwrap();
    let kinds: Vec<(i64, &str)> = arts
        .iter()
        .map(|a| (a["epoch"].as_i64().unwrap(), a["kind"].as_str().unwrap()))
        .collect();
    if kinds == [(1, "snapshot"), (2, "snapshot")] {
        assert_eq!(f.terminate(), 0);
        return;
    }
    assert_eq!(kinds, [(1, "snapshot"), (1, "diff"), (2, "snapshot")]);
    let last_diff = arts[1]["to_position"].as_str().unwrap();
    assert_eq!(arts[1]["change_count"], 1);
    assert!(larch::archive::position::compare(last_diff, &before) == std::cmp::Ordering::Greater);
    // reconstruct --at the old epoch's end: that epoch's rows, with its columns.
    let store = Arc::new(LocalStore::new(dir.path()).unwrap());
    let reader = ArchiveReader::new(store, "public.items/", vec![Format::Jsonl]).unwrap();
    let (_, old) = reader.reconstruct_at(Some(last_diff), &[]).await.unwrap();
    let old = by_id(old.rows.values().map(|r| r.as_str().to_string()));
    assert_eq!(old.len(), 201);
    assert_eq!(old[&201]["name"], r#""before the DDL""#);
    assert!(old.values().all(|r| !r.contains_key("c")));
    assert_eq!(f.terminate(), 0);
}

#[cfg(feature = "crashpoints")]
#[tokio::test]
async fn a_table_rewritten_between_the_slot_and_the_copy_is_copied_again_not_empty() {
    // A rewrite (ALTER COLUMN TYPE) committed after the slot's snapshot makes the table look
    // empty to that snapshot. The window (between the slot's creation and the copy's lock) is
    // held open by a pause point; the DDL commits inside it.
    let db = new_database().await;
    db.client
        .batch_execute(
            "CREATE TABLE items (id int8 PRIMARY KEY, qty int4);
             INSERT INTO items SELECT g, g FROM generate_series(1, 300) g;",
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let slot = format!("larch_rewrite_{}", db.name);
    let export = std::process::Command::new(env!("CARGO_BIN_EXE_larch"))
        .args(["export", "--table", "items", "--store", "local", "--path"])
        .arg(dir.path())
        .args(["--slot", &slot])
        .env("LARCH_PG_DSN", &db.dsn)
        .env("LARCH_LOG", "warn")
        .env("LARCH_PAUSE_AT", "baseline.before-lock=3000")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    eventually(60, "the copy holding the slot's snapshot", || async {
        let n: i64 = db
            .client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
                    AND state = 'idle in transaction' AND query LIKE '%SET TRANSACTION SNAPSHOT%'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        (n == 1).then_some(())
    })
    .await;
    db.client
        .batch_execute("ALTER TABLE items ALTER COLUMN qty TYPE int8")
        .await
        .unwrap();
    let altered: String = db
        .client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .unwrap()
        .get(0);
    let out = tokio::task::spawn_blocking(move || export.wait_with_output().unwrap())
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("pausing 3000 ms"), "{stderr}");
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["row_count"], 300, "{summary}");
    // The snapshot the export used was taken after the rewrite, on a second slot.
    let position = summary["position"].as_str().unwrap();
    assert_eq!(
        larch::archive::position::compare(position, &altered),
        std::cmp::Ordering::Greater,
        "{summary} vs the ALTER at {altered}"
    );
    assert_eq!(
        archive_rows(dir.path()).await,
        pg_rows(&db.client, "items").await
    );
    let m = raw_manifest(dir.path());
    assert_eq!(m["columns"][1]["SqlType"], "bigint");
}
