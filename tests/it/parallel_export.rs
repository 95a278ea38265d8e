//! `larch export` of several tables at one position (one shared snapshot, `--parallel N`
//! connections), against a real PostgreSQL 15 with writes running during the export.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use larch::archive::format::Format;
use larch::archive::reader::ArchiveReader;
use larch::archive::store::local::LocalStore;
use serde_json::Value;

use crate::support::postgres::{Database, new_database};

const TABLES: [&str; 3] = ["counter_a", "counter_b", "counter_c"];
const ROWS: i64 = 20_000;

fn larch(dsn: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_larch"));
    c.env("LARCH_PG_DSN", dsn);
    c
}

fn run(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.output().expect("running larch");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Three tables of `ROWS` counters each (padded, so a copy takes a while).
async fn counters(db: &Database) {
    for t in TABLES {
        db.client
            .batch_execute(&format!(
                "CREATE TABLE {t} (id int8 PRIMARY KEY, n int8 NOT NULL, pad text NOT NULL);
                 INSERT INTO {t} SELECT g, 0, repeat('x', 200) FROM generate_series(1, {ROWS}) g;"
            ))
            .await
            .unwrap();
    }
}

/// Increments one id's counter in all three tables in one transaction, in a rotating table
/// order, until `stop`: every committed state has `a.n = b.n = c.n` for every id. Counts the
/// committed transactions.
fn start_writer(
    dsn: String,
    stop: Arc<AtomicBool>,
    committed: Arc<AtomicU64>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let (client, connection) = tokio_postgres::connect(&dsn, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        let mut i: i64 = 0;
        while !stop.load(Ordering::Relaxed) {
            let id = (i * 7919) % ROWS + 1;
            let mut sql = String::from("BEGIN;");
            for k in 0..TABLES.len() {
                let t = TABLES[(i as usize + k) % TABLES.len()];
                sql.push_str(&format!("UPDATE {t} SET n = n + 1 WHERE id = {id};"));
            }
            sql.push_str("COMMIT;");
            client.batch_execute(&sql).await.unwrap();
            committed.fetch_add(1, Ordering::Relaxed);
            i += 1;
        }
    })
}

/// id → n of the archive at `key_prefix`, with the manifest's head position.
async fn counters_at_head(dir: &Path, key_prefix: &str) -> (String, BTreeMap<i64, i64>) {
    let store = Arc::new(LocalStore::new(dir).unwrap());
    let reader = ArchiveReader::new(store, key_prefix, vec![Format::Jsonl]).unwrap();
    let (manifest, folded) = reader.reconstruct_at(None, &[]).await.unwrap();
    let rows = folded
        .rows
        .values()
        .map(|r| {
            let n = |k: &str| r.get(k).unwrap().get().parse::<i64>().unwrap();
            (n("id"), n("n"))
        })
        .collect();
    (manifest.head_position, rows)
}

fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(files_under(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

async fn slots_left(db: &Database) -> i64 {
    let mut n = 0;
    for _ in 0..50 {
        n = db
            .client
            .query_one(
                "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if n == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    n
}

/// Runs a several-table export with `--parallel N` while the writer runs, and checks that
/// every table's archive is at the summary's one position and that the counters agree across
/// the three reconstructed tables for every id (independent snapshots taken one after another
/// under these writes would not).
async fn export_under_writes(db: &Database, dir: &Path, parallel: &str, key_prefix: &str) {
    let stop = Arc::new(AtomicBool::new(false));
    let committed = Arc::new(AtomicU64::new(0));
    let writer = start_writer(db.dsn.clone(), stop.clone(), committed.clone());
    while committed.load(Ordering::Relaxed) < 50 {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let before = committed.load(Ordering::Relaxed);
    let archive = dir.join("archive");
    let summary_file = dir.join("summary.json");
    let mut cmd = larch(&db.dsn);
    cmd.args(["export", "--parallel", parallel]);
    for t in TABLES {
        cmd.args(["--table", t]);
    }
    if !key_prefix.is_empty() {
        cmd.args(["--key-prefix", key_prefix]);
    }
    cmd.args(["--store", "local", "--path"])
        .arg(&archive)
        .arg("--summary-file")
        .arg(&summary_file);
    let (code, stdout, stderr) = tokio::task::spawn_blocking(move || run(&mut cmd))
        .await
        .unwrap();
    let during = committed.load(Ordering::Relaxed) - before;
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    assert_eq!(code, 0, "{stderr}");
    assert!(during > 0, "the writer committed nothing during the export");

    let summary: Value = serde_json::from_str(&stdout).unwrap();
    // The file holds the same summary on one line (a termination message keeps 4 KiB).
    let in_file = std::fs::read_to_string(&summary_file).unwrap();
    assert_eq!(in_file.trim().lines().count(), 1, "{in_file}");
    assert_eq!(serde_json::from_str::<Value>(&in_file).unwrap(), summary);
    let position = summary["position"].as_str().unwrap().to_string();
    let listed = summary["tables"].as_array().unwrap();
    assert_eq!(listed.len(), TABLES.len(), "{summary}");
    let mut states = Vec::new();
    for (entry, t) in listed.iter().zip(TABLES) {
        let prefix = format!("{key_prefix}public.{t}/");
        assert_eq!(entry["table"], format!("public.{t}"));
        assert_eq!(entry["key_prefix"], prefix.as_str());
        assert_eq!(entry["position"], position.as_str());
        assert_eq!(entry["row_count"], ROWS);
        assert_eq!(entry["epoch"], 1);
        let (head, rows) = counters_at_head(&archive, &prefix).await;
        assert_eq!(head, position, "{t}: its own position");
        assert_eq!(rows.len() as i64, ROWS, "{t}");
        states.push(rows);
    }
    let total: i64 = states[0].values().sum();
    assert!(
        total >= 50,
        "the snapshot holds the writes before it ({total})"
    );
    for id in 1..=ROWS {
        let ns: Vec<i64> = states.iter().map(|s| s[&id]).collect();
        assert!(
            ns.iter().all(|n| *n == ns[0]),
            "id {id}: the counters differ across the tables: {ns:?} (not one position)"
        );
    }
    assert_eq!(slots_left(db).await, 0, "the temporary slot is gone");
}

#[tokio::test]
async fn several_tables_export_at_one_position_under_concurrent_writes() {
    let db = new_database().await;
    counters(&db).await;
    let dir = tempfile::tempdir().unwrap();
    export_under_writes(&db, &dir.path().join("p3"), "3", "").await;
    // One connection at a time: the tables are copied one after another, still from the one
    // snapshot; archives under a parent prefix.
    export_under_writes(&db, &dir.path().join("p1"), "1", "sets/").await;
}

#[tokio::test]
async fn a_bad_table_in_a_set_fails_naming_it_and_writes_nothing() {
    let db = new_database().await;
    counters(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("archive");
    std::fs::create_dir_all(&archive).unwrap();
    let summary_file = dir.path().join("summary.json");
    let (code, stdout, stderr) = run(larch(&db.dsn)
        .args([
            "export",
            "--table",
            "counter_a",
            "--table",
            "no_such_table",
            "--table",
            "counter_c",
            "--parallel",
            "3",
            "--store",
            "local",
            "--path",
        ])
        .arg(&archive)
        .arg("--summary-file")
        .arg(&summary_file));
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert!(stderr.contains("public.no_such_table"), "{stderr}");
    let failure: Value =
        serde_json::from_str(&std::fs::read_to_string(&summary_file).unwrap()).unwrap();
    assert_eq!(failure["reason"], "TableNotFound", "{failure}");
    assert!(
        failure["error"]
            .as_str()
            .unwrap()
            .contains("public.no_such_table"),
        "{failure}"
    );
    assert_eq!(files_under(&archive), Vec::<std::path::PathBuf>::new());
    assert_eq!(slots_left(&db).await, 0);

    // Several tables are one-shot only; a table named twice is a mistake.
    for (tables, extra, message) in [
        (
            ["counter_a", "counter_b"],
            Some("--follow"),
            "--follow exports one table per process",
        ),
        (
            ["counter_a", "public.counter_a"],
            None,
            "public.counter_a is given twice",
        ),
    ] {
        let mut cmd = larch(&db.dsn);
        cmd.args(["export", "--table", tables[0], "--table", tables[1]]);
        cmd.args(extra)
            .args(["--store", "local", "--path"])
            .arg(&archive);
        let (code, _, stderr) = run(&mut cmd);
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.contains(message), "{stderr}");
    }
    assert_eq!(files_under(&archive), Vec::<std::path::PathBuf>::new());
}
