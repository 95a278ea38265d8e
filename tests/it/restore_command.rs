//! `larch restore` on real PostgreSQL: tables of an archive into a second database, at the
//! head and as of a position, several at one point, `--if-exists fail|replace`, and bad input
//! that names what is wrong and leaves the target as it was (docs/restore.md).

use std::path::Path;
use std::process::{Command, Output};

use crate::support::postgres::{Database, new_database};

/// The rows of a table, ordered by key, as one digest.
async fn digest(db: &Database, table: &str) -> String {
    db.client
        .query_one(
            &format!(
                "SELECT count(*)::text || ' rows, md5 ' || coalesce(md5(string_agg(t::text, '|' ORDER BY id)), '-') FROM {table} t"
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

async fn create_source(db: &Database) {
    db.client
        .batch_execute(
            "CREATE TABLE orders (id int8 PRIMARY KEY, note text, amount numeric(12,2), placed timestamptz);
             INSERT INTO orders SELECT g, 'order ' || g || E'\\t\\\\', g * 1.25, '2026-11-30 14:00:00+00'::timestamptz + g * interval '1 minute'
               FROM generate_series(1, 3000) g;
             CREATE TABLE items (id int4 PRIMARY KEY, payload jsonb, tags text[]);
             INSERT INTO items SELECT g, jsonb_build_object('g', g, 's', 'q\"' || g), ARRAY['a' || g, NULL]
               FROM generate_series(1, 500) g;",
        )
        .await
        .unwrap();
}

async fn mutate_source(db: &Database) {
    db.client
        .batch_execute(
            "UPDATE orders SET note = 'changed' WHERE id % 7 = 0;
             DELETE FROM orders WHERE id % 11 = 0;
             INSERT INTO orders SELECT g, 'late', 1, now() FROM generate_series(3001, 3100) g;
             UPDATE items SET tags = ARRAY['x'] WHERE id < 50;
             DELETE FROM items WHERE id > 490;",
        )
        .await
        .unwrap();
}

fn dsn_file(dir: &Path, db: &Database) -> std::path::PathBuf {
    let f = dir.join(format!("{}.dsn", db.name));
    std::fs::write(&f, &db.dsn).unwrap();
    f
}

/// One-shot `larch export` of `table`: its summary's position. The slot is named after the
/// database: slots are per cluster, and tests export tables of the same name at once.
fn export(source: &Database, dir: &Path, archive: &Path, table: &str) -> String {
    let slot = format!("larch_{}_{table}", source.name);
    let out = Command::new(env!("CARGO_BIN_EXE_larch"))
        .env_remove("LARCH_PG_DSN")
        .args(["export", "--connection-file"])
        .arg(dsn_file(dir, source))
        .args(["--slot", &slot])
        .args(["--table", table, "--store", "local", "--path"])
        .arg(archive)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    summary["position"].as_str().unwrap().to_string()
}

/// `larch restore` into `target` (its DSN in the environment, as a Secret would give it).
fn restore(target: &Database, archive: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_larch"))
        .env("LARCH_PG_DSN", &target.dsn)
        .env("LARCH_LOG", "warn")
        .args(["restore", "--store", "local", "--path"])
        .arg(archive)
        .args(args)
        .output()
        .unwrap()
}

fn summary(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "larch restore failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn failed(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "larch restore succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

async fn table_exists(db: &Database, table: &str) -> bool {
    db.client
        .query_one("SELECT to_regclass($1::text) IS NOT NULL", &[&table])
        .await
        .unwrap()
        .get(0)
}

/// Two exports of two tables, the source changed in between: a restore at the first position
/// gives the first states, one at the head the latest, and several tables without --at land
/// at the greatest position both reach.
#[tokio::test]
async fn restores_tables_at_a_position_and_at_the_head_equal_to_the_source_then() {
    let source = new_database().await;
    create_source(&source).await;
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("archive");
    let orders_1 = export(&source, dir.path(), &archive, "orders");
    let items_1 = export(&source, dir.path(), &archive, "items");
    let (orders_then, items_then) = (
        digest(&source, "orders").await,
        digest(&source, "items").await,
    );
    assert!(orders_then.starts_with("3000 rows"), "{orders_then}");
    mutate_source(&source).await;
    let orders_2 = export(&source, dir.path(), &archive, "orders");
    let items_2 = export(&source, dir.path(), &archive, "items");
    let (orders_now, items_now) = (
        digest(&source, "orders").await,
        digest(&source, "items").await,
    );
    assert_ne!(orders_now, orders_then);

    // As of the first exports' point: both tables as they were then.
    let then = new_database().await;
    let s = summary(&restore(
        &then,
        &archive,
        &["--table", "orders,items", "--at", &items_1],
    ));
    assert_eq!(s["position"], items_1.as_str());
    assert_eq!(s["at"], items_1.as_str());
    assert_eq!(s["tables"][0]["table"], "public.orders");
    assert_eq!(s["tables"][0]["position"], orders_1.as_str());
    assert_eq!(s["tables"][0]["rows"], 3000);
    assert_eq!(s["tables"][0]["action"], "created");
    assert_eq!(s["tables"][1]["position"], items_1.as_str());
    assert_eq!(s["tables"][1]["rows"], 500);
    assert!(s["duration_seconds"].as_f64().unwrap() >= 0.0);
    assert_eq!(digest(&then, "orders").await, orders_then);
    assert_eq!(digest(&then, "items").await, items_then);

    // One table at its head.
    let now = new_database().await;
    let s = summary(&restore(&now, &archive, &["--table", "public.orders"]));
    assert_eq!(s["position"], orders_2.as_str());
    assert_eq!(digest(&now, "orders").await, orders_now);

    // Both without --at: the smallest head (orders', exported first), where items is still
    // at its first snapshot, the last it has at or before that point.
    let both = new_database().await;
    let s = summary(&restore(
        &both,
        &archive,
        &["--table", "orders", "--table", "items"],
    ));
    assert_eq!(s["position"], orders_2.as_str());
    assert_eq!(s["tables"][1]["position"], items_1.as_str());
    assert_eq!(digest(&both, "orders").await, orders_now);
    assert_eq!(digest(&both, "items").await, items_then);
    // ... and at items' head, both are at their latest.
    let latest = new_database().await;
    summary(&restore(
        &latest,
        &archive,
        &["--table", "orders,items", "--at", &items_2],
    ));
    assert_eq!(digest(&latest, "orders").await, orders_now);
    assert_eq!(digest(&latest, "items").await, items_now);
}

/// `--if-exists fail` (the default) refuses an existing table and leaves it as it was;
/// `replace` replaces its rows and keeps its definition (an index of the user's).
#[tokio::test]
async fn an_existing_table_is_left_untouched_unless_replaced() {
    let source = new_database().await;
    create_source(&source).await;
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("archive");
    export(&source, dir.path(), &archive, "orders");
    let expected = digest(&source, "orders").await;

    let target = new_database().await;
    target
        .client
        .batch_execute(
            "CREATE TABLE orders (id int8 PRIMARY KEY, note text, amount numeric(12,2), placed timestamptz, extra int DEFAULT 7);
             CREATE INDEX orders_note ON orders (note);
             INSERT INTO orders (id, note) VALUES (1, 'mine'), (99999, 'only here');",
        )
        .await
        .unwrap();
    let before = digest(&target, "orders").await;
    let err = failed(&restore(&target, &archive, &["--table", "orders"]));
    assert!(
        err.contains("table public.orders already exists") && err.contains("--if-exists"),
        "{err}"
    );
    assert_eq!(digest(&target, "orders").await, before, "left untouched");

    let s = summary(&restore(
        &target,
        &archive,
        &["--table", "orders", "--if-exists", "replace"],
    ));
    assert_eq!(s["tables"][0]["action"], "replaced");
    assert_eq!(s["tables"][0]["rows"], 3000);
    // The user's column not in the archive takes its default; the archived ones equal the source.
    let restored: String = target
        .client
        .query_one(
            "SELECT count(*)::text || ' rows, md5 ' || md5(string_agg((id, note, amount, placed)::text, '|' ORDER BY id))
               FROM orders WHERE extra = 7",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let source_rows: String = source
        .client
        .query_one(
            "SELECT count(*)::text || ' rows, md5 ' || md5(string_agg((id, note, amount, placed)::text, '|' ORDER BY id)) FROM orders",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(restored, source_rows);
    assert_eq!(expected.split(',').next(), restored.split(',').next());
    let index: bool = target
        .client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_indexes WHERE indexname = 'orders_note')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(index, "the user's index is kept");
}

/// A missing table, a bad point, a table lacking an archived column and a value the existing
/// column cannot take: each names what is wrong, exits non-zero, and leaves the target as it
/// was (no table of the restore created, the existing rows kept).
#[tokio::test]
async fn bad_input_names_what_is_wrong_and_writes_nothing() {
    let source = new_database().await;
    create_source(&source).await;
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("archive");
    let items_at = export(&source, dir.path(), &archive, "items");
    let orders_at = export(&source, dir.path(), &archive, "orders");
    let target = new_database().await;

    // Two one-shot exports have no common point: the default point (items' head) predates
    // orders' archive, and the error says which --at works.
    let err = failed(&restore(&target, &archive, &["--table", "items,orders"]));
    assert!(
        err.contains("table public.orders: its archive starts at")
            && err.contains(&items_at)
            && err.contains(&format!("pass --at {orders_at} or later")),
        "{err}"
    );

    let out = restore(&target, &archive, &["--table", "items,missing"]);
    let err = failed(&out);
    assert!(err.contains("table public.missing"), "{err}");
    assert!(
        err.contains("public.missing/"),
        "names the key prefix: {err}"
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(!table_exists(&target, "public.items").await);

    let err = failed(&restore(
        &target,
        &archive,
        &["--table", "items", "--at", "yesterday"],
    ));
    assert!(err.contains("\"yesterday\""), "{err}");
    let err = failed(&restore(
        &target,
        &archive,
        &["--table", "items", "--at", "0/1"],
    ));
    // The position as archives write it (`0/1` is `0/00000001`), and the table.
    assert!(
        err.contains("0/00000001") && err.contains("table public.items"),
        "{err}"
    );
    assert!(!table_exists(&target, "public.items").await);

    // orders exists without an archived column: refused before anything is written.
    target
        .client
        .batch_execute(
            "CREATE TABLE orders (id int8 PRIMARY KEY, note text, amount int4);
             INSERT INTO orders VALUES (1, 'mine', 5)",
        )
        .await
        .unwrap();
    let before = digest(&target, "orders").await;
    let err = failed(&restore(
        &target,
        &archive,
        &[
            "--table",
            "items,orders",
            "--if-exists",
            "replace",
            "--at",
            &orders_at,
        ],
    ));
    assert!(
        err.contains("table public.orders") && err.contains("\"placed\""),
        "{err}"
    );
    assert!(!table_exists(&target, "public.items").await);
    assert_eq!(digest(&target, "orders").await, before);

    // Every column there, but amount cannot take 1.25: items (restored first) is rolled back
    // with it.
    target
        .client
        .batch_execute("ALTER TABLE orders ADD COLUMN placed timestamptz")
        .await
        .unwrap();
    let before = digest(&target, "orders").await;
    let summary_file = dir.path().join("termination-log");
    let out = restore(
        &target,
        &archive,
        &[
            "--table",
            "items,orders",
            "--if-exists",
            "replace",
            "--at",
            &orders_at,
            "--summary-file",
            summary_file.to_str().unwrap(),
        ],
    );
    let err = failed(&out);
    // The server's text quotes the value: only its SQLSTATE, line and column are shown.
    assert!(
        err.contains("COPY into public.orders: the server refused a value (SQLSTATE 22P02")
            && err.contains("column amount")
            && !err.contains("1.25"),
        "{err}"
    );
    assert!(!table_exists(&target, "public.items").await, "rolled back");
    assert_eq!(digest(&target, "orders").await, before, "rolled back");
    let reported: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary_file).unwrap()).unwrap();
    assert!(reported["reason"].is_string(), "{reported}");
    assert!(
        reported["error"].as_str().unwrap().contains("orders"),
        "{reported}"
    );
}

/// The key constraint of `table` in `db`: its columns, `None` without one.
async fn primary_key(db: &Database, table: &str) -> Option<String> {
    db.client
        .query_opt(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint
             WHERE conrelid = to_regclass($1::text) AND contype = 'p'",
            &[&table],
        )
        .await
        .unwrap()
        .map(|r| r.get(0))
}

/// `--split N`: a table the restore creates loads over N COPY streams into a staging table
/// renamed in the restore's transaction, keyed after its rows; it equals a single-stream
/// restore (and the source), a staging table a killed restore left is replaced, and a failure
/// of another table rolls everything back, the staging table dropped.
#[tokio::test]
async fn a_split_restore_equals_a_single_stream_one_and_leaves_nothing_behind() {
    let source = new_database().await;
    create_source(&source).await;
    mutate_source(&source).await;
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("archive");
    export(&source, dir.path(), &archive, "orders");
    export(&source, dir.path(), &archive, "items");
    let expected = digest(&source, "orders").await;
    let staging =
        larch::restore::staging_table(&larch::archive::model::TableId::new("public", "orders"));
    let staging = format!("public.{}", staging.table);

    let single = new_database().await;
    let s = summary(&restore(&single, &archive, &["--table", "orders"]));
    assert_eq!(s["tables"][0]["streams"], 1);
    assert_eq!(digest(&single, "orders").await, expected);
    assert_eq!(
        primary_key(&single, "orders").await.as_deref(),
        Some("PRIMARY KEY (id)")
    );

    let split = new_database().await;
    // What a restore killed mid-load leaves: its staging table, with rows of its own.
    split
        .client
        .batch_execute(&format!(
            "CREATE TABLE {staging} (id int8, junk text); INSERT INTO {staging} VALUES (1, 'x')"
        ))
        .await
        .unwrap();
    let s = summary(&restore(
        &split,
        &archive,
        &["--table", "orders", "--split", "3"],
    ));
    assert_eq!(s["tables"][0]["streams"], 3, "{s}");
    assert_eq!(s["tables"][0]["action"], "created");
    assert_eq!(s["tables"][0]["rows"], single_rows(&expected));
    assert_eq!(digest(&split, "orders").await, expected);
    assert_eq!(
        primary_key(&split, "orders").await.as_deref(),
        Some("PRIMARY KEY (id)")
    );
    assert!(
        !table_exists(&split, &staging).await,
        "the staging table is renamed"
    );

    // A table that exists loads over one stream in the transaction.
    let s = summary(&restore(
        &split,
        &archive,
        &[
            "--table",
            "orders",
            "--split",
            "3",
            "--if-exists",
            "replace",
        ],
    ));
    assert_eq!(s["tables"][0]["streams"], 1, "{s}");
    assert_eq!(s["tables"][0]["action"], "replaced");
    assert_eq!(digest(&split, "orders").await, expected);

    // orders loads into its staging table, then items (replaced, with a column its rows do
    // not fit) fails: nothing of orders stays, staging table included.
    let failing = new_database().await;
    failing
        .client
        .batch_execute("CREATE TABLE items (id int4 PRIMARY KEY, payload int4, tags text[])")
        .await
        .unwrap();
    let err = failed(&restore(
        &failing,
        &archive,
        &[
            "--table",
            "orders",
            "--table",
            "items",
            "--split",
            "2",
            "--if-exists",
            "replace",
        ],
    ));
    assert!(err.contains("items"), "{err}");
    assert!(!table_exists(&failing, "public.orders").await, "{err}");
    assert!(
        !table_exists(&failing, &staging).await,
        "staging dropped: {err}"
    );

    // Out of range: refused by its flag.
    let err = failed(&restore(
        &failing,
        &archive,
        &["--table", "orders", "--split", "0"],
    ));
    assert!(err.contains("--split"), "{err}");
}

/// A table with diffs after its snapshot loads the same over one or several streams whether
/// the diffs' net effect fits in memory (the snapshot read in blocks on the streams' threads,
/// skipping the rows the diffs replace) or spills (`--buffer-memory 1Ki`: rows merged one by
/// one), and after a TRUNCATE (the snapshot not read); a malformed snapshot line fails the
/// restore naming the table and the line, and leaves nothing.
#[tokio::test]
async fn a_split_restore_of_a_snapshot_and_diffs_has_the_folded_rows() {
    use crate::archive_build::{TestArchive, id_and_text_columns, refs};
    use larch::archive::model::Action;

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("archive");
    let store: std::sync::Arc<dyn larch::archive::store::Store> =
        std::sync::Arc::new(larch::archive::store::local::LocalStore::new(&root).unwrap());
    // 20 000 rows (several 128 KiB blocks), then updates, deletes and inserts.
    let mut a = TestArchive::new(store.clone(), "public.t/", "public.t")
        .with_columns(id_and_text_columns(&["id", "name"]));
    let rows: Vec<String> = (1..=20_000)
        .map(|i| format!(r#"{{"id":{i},"name":"row {i}\t\\"}}"#))
        .collect();
    a.snapshot("0/100", &refs(&rows)).await;
    let changes: Vec<(Action, Option<String>, Option<String>)> = (1..=300)
        .map(|i| match i % 3 {
            0 => (
                Action::Update,
                None,
                Some(format!(r#"{{"id":{i},"name":"new {i}"}}"#)),
            ),
            1 => (Action::Delete, Some(format!(r#"{{"id":{i}}}"#)), None),
            _ => {
                let id = 20_000 + i;
                (
                    Action::Insert,
                    None,
                    Some(format!(r#"{{"id":{id},"name":"late"}}"#)),
                )
            }
        })
        .collect();
    let ch: Vec<_> = changes
        .iter()
        .map(|(a, o, n)| (*a, o.as_deref(), n.as_deref()))
        .collect();
    a.diff("0/100", "0/200", &ch).await;
    let mut expected: std::collections::BTreeMap<i64, String> =
        (1..=20_000).map(|i| (i, format!("row {i}\t\\"))).collect();
    for i in 1..=300i64 {
        match i % 3 {
            0 => {
                expected.insert(i, format!("new {i}"));
            }
            1 => {
                expected.remove(&i);
            }
            _ => {
                expected.insert(20_000 + i, "late".into());
            }
        }
    }
    let expected: Vec<(i64, String)> = expected.into_iter().collect();
    for args in [
        &["--split", "1"][..],
        &["--split", "2"],
        &["--split", "3", "--buffer-memory", "1Ki"],
    ] {
        let target = new_database().await;
        let mut all = vec!["--table", "t"];
        all.extend_from_slice(args);
        let s = summary(&restore(&target, &root, &all));
        assert_eq!(s["tables"][0]["rows"], expected.len(), "{args:?}");
        assert!(id_names(&target).await == expected, "{args:?}");
    }

    // A TRUNCATE in the diffs: only the rows after it.
    a.diff(
        "0/200",
        "0/300",
        &[
            (Action::Truncate, None, None),
            (Action::Insert, None, Some(r#"{"id":7,"name":"after"}"#)),
        ],
    )
    .await;
    let target = new_database().await;
    summary(&restore(&target, &root, &["--table", "t", "--split", "2"]));
    assert_eq!(id_names(&target).await, [(7, "after".to_string())]);

    // Line 5 of the snapshot cut short.
    let snapshot = std::fs::read_dir(root.join("public.t"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|epoch| epoch.is_dir())
        .flat_map(|epoch| std::fs::read_dir(epoch).unwrap().map(|e| e.unwrap().path()))
        .find(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.starts_with("snapshot-") && name.ends_with(".jsonl")
        })
        .expect("a JSONL snapshot");
    let text = std::fs::read_to_string(&snapshot).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines[4] = "{\"id\":5,\"name\":";
    std::fs::write(&snapshot, lines.join("\n") + "\n").unwrap();
    let target = new_database().await;
    let err = failed(&restore(
        &target,
        &root,
        &["--table", "t", "--split", "2", "--at", "0/200"],
    ));
    assert!(
        err.contains("table public.t: the row at line 5 of") && err.contains("not a JSON object"),
        "{err}"
    );
    assert!(!table_exists(&target, "public.t").await, "{err}");
}

/// The rows of `public.t` (`id`, `name`) in key order.
async fn id_names(db: &Database) -> Vec<(i64, String)> {
    db.client
        .query("SELECT id, name FROM public.t ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// The row count at the start of a [`digest`].
fn single_rows(digest: &str) -> u64 {
    digest.split(' ').next().unwrap().parse().unwrap()
}

/// Tables load parents first whatever `--table`'s order, and each table's progress stays its
/// own (its rows against its own expected count).
#[tokio::test]
async fn tables_load_parents_first_and_each_reports_its_own_progress() {
    let source = new_database().await;
    let schema = "CREATE TABLE parent (id int8 PRIMARY KEY);
                  CREATE TABLE child (id int8 PRIMARY KEY, parent int8 NOT NULL REFERENCES parent);";
    source
        .client
        .batch_execute(&format!(
            "{schema}
             INSERT INTO parent SELECT g FROM generate_series(1, 10) g;
             INSERT INTO child SELECT g, 1 + g % 10 FROM generate_series(1, 200) g;"
        ))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("archive");
    export(&source, dir.path(), &archive, "parent");
    let at = export(&source, dir.path(), &archive, "child");
    let target = new_database().await;
    target.client.batch_execute(schema).await.unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_larch"))
        .env("LARCH_PG_DSN", &target.dsn)
        .env("LARCH_LOG", "info")
        .args(["restore", "--store", "local", "--if-exists", "replace"])
        .args(["--table", "child,parent", "--at", &at, "--path"])
        .arg(&archive)
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    for (table, rows) in [("public.parent", 10), ("public.child", 200)] {
        let done = format!("restore of {table} done: {rows} of ~{rows} rows");
        assert!(log.contains(&done), "{done} in {log}");
    }
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let order: Vec<&str> = summary["tables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["table"].as_str().unwrap())
        .collect();
    assert_eq!(order, ["public.parent", "public.child"]);
}

/// The definitions a bulk load sets aside: every secondary index of `tables` and every foreign
/// key, with whether it is validated.
async fn definitions(db: &Database) -> Vec<String> {
    db.client
        .query(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = 'public'
             UNION ALL
             SELECT conrelid::regclass::text || ' ' || conname || ' ' || pg_get_constraintdef(oid)
                    || CASE WHEN convalidated THEN ' (validated)' ELSE '' END
               FROM pg_constraint WHERE contype = 'f'
             ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Replaced tables get their rows before their secondary indexes and foreign keys: both are
/// made again after the load (keys added NOT VALID, then validated), the same definitions as
/// before; rows that break a key fail the restore naming the key, and the target is as it was.
#[tokio::test]
async fn replaced_tables_build_indexes_and_validate_foreign_keys_after_the_rows() {
    let source = new_database().await;
    let schema = "CREATE TABLE parent (id int8 PRIMARY KEY, code text);
                  CREATE UNIQUE INDEX parent_code ON parent (code);
                  CREATE TABLE child (id int8 PRIMARY KEY, parent int8 NOT NULL
                      REFERENCES parent ON DELETE CASCADE DEFERRABLE, note text);
                  CREATE INDEX child_note ON child (note);
                  CREATE INDEX child_late ON child (parent, id) WHERE id > 100;";
    source
        .client
        .batch_execute(&format!(
            "{schema}
             INSERT INTO parent SELECT g, 'c' || g FROM generate_series(1, 10) g;
             INSERT INTO child SELECT g, 1 + g % 10, 'n' || g FROM generate_series(1, 2000) g;"
        ))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("archive");
    export(&source, dir.path(), &archive, "parent");
    let at = export(&source, dir.path(), &archive, "child");

    let target = new_database().await;
    target
        .client
        .batch_execute(&format!(
            "{schema} INSERT INTO parent VALUES (1, 'old'); INSERT INTO child VALUES (1, 1, 'old');"
        ))
        .await
        .unwrap();
    let before = definitions(&target).await;
    assert_eq!(before.len(), 6, "{before:?}");
    let out = Command::new(env!("CARGO_BIN_EXE_larch"))
        .env("LARCH_PG_DSN", &target.dsn)
        .env("LARCH_LOG", "info")
        .args(["restore", "--store", "local", "--if-exists", "replace"])
        .args(["--table", "parent,child", "--at", &at, "--path"])
        .arg(&archive)
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    let line = log
        .lines()
        .find(|l| l.contains("made again after the rows are in"))
        .unwrap_or_else(|| panic!("no set-aside logged: {log}"));
    // child_note, child_late and parent_code (a unique index no constraint uses); the key.
    assert!(
        line.contains("\"indexes\":3") && line.contains("\"foreign_keys\":1"),
        "{line}"
    );
    assert_eq!(
        definitions(&target).await,
        before,
        "the same definitions, validated"
    );
    for table in ["parent", "child"] {
        assert_eq!(digest(&target, table).await, digest(&source, table).await);
    }

    // Only child, against a parent that lacks most of its rows: the key does not hold.
    target
        .client
        .batch_execute("DELETE FROM parent WHERE id > 3")
        .await
        .unwrap();
    let kept = digest(&target, "child").await;
    let err = failed(&restore(
        &target,
        &archive,
        &["--table", "child", "--if-exists", "replace"],
    ));
    assert!(
        err.contains("the restored rows of public.child break its foreign key child_parent_fkey"),
        "{err}"
    );
    assert_eq!(digest(&target, "child").await, kept, "rolled back");
    assert_eq!(definitions(&target).await, before, "nothing lost");
}
