//! `larch export --follow` against a real PostgreSQL 15: every kind of change reaches the
//! diffs, SIGTERM flushes, a restart resumes from the persistent slot, kill -9 loses nothing,
//! the new-epoch policy compacts a snapshot.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use larch::archive::format::Format;
use larch::archive::reader::ArchiveReader;
use larch::archive::store::local::LocalStore;
use larch::archive::verify::verify;
use larch::locks::MutexExt;
use serde_json::Value;

use crate::engine_support::{eventually, get, get_json};
use crate::support::postgres::{Database, new_database};

pub struct Follow {
    pub child: Child,
    pub addr: SocketAddr,
    /// Everything the exporter wrote to stderr after its listen address.
    pub stderr: Arc<std::sync::Mutex<Vec<String>>>,
    reader: std::thread::JoinHandle<()>,
}

impl Follow {
    pub fn start(db: &Database, dir: &std::path::Path, slot: &str, extra: &[&str]) -> Follow {
        Follow::start_env(db, dir, slot, extra, &[])
    }

    pub fn start_env(
        db: &Database,
        dir: &std::path::Path,
        slot: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Follow {
        let mut child = Command::new(env!("CARGO_BIN_EXE_larch"))
            .args([
                "export",
                "--follow",
                "--table",
                "items",
                "--store",
                "local",
                "--listen",
                "127.0.0.1:0",
                "--slot",
                slot,
            ])
            .arg("--path")
            .arg(dir)
            .args(extra)
            .env("LARCH_PG_DSN", &db.dsn)
            .env("LARCH_LOG", "warn")
            .envs(env.iter().copied())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (addr, stderr, reader) = listening(&mut child);
        Follow {
            child,
            addr,
            stderr,
            reader,
        }
    }

    pub async fn ready(&self) {
        let addr = self.addr;
        eventually(60, "export readiness", || async move {
            (get(addr, "/health/ready").await.0 == 200).then_some(())
        })
        .await;
    }

    pub async fn status(&self) -> Value {
        get_json(self.addr, "/status").await
    }

    pub fn terminate(self) -> i32 {
        self.terminate_with_stderr().0
    }

    /// SIGTERM; the exit code and what the exporter wrote to stderr meanwhile.
    pub fn terminate_with_stderr(mut self) -> (i32, String) {
        unsafe_kill(self.child.id(), "TERM");
        let code = self.child.wait().unwrap().code().unwrap_or(-1);
        // The reader drains the pipe until EOF, which the exit brings.
        let _ = self.reader.join();
        (code, self.stderr.locked().join("\n"))
    }

    pub fn kill9(mut self) {
        unsafe_kill(self.child.id(), "KILL");
        let _ = self.child.wait();
    }
}

/// The address a `larch export` child printed on stderr (`status on http://ADDR`), and its later
/// stderr lines, collected by a thread until it exits.
pub fn listening(
    child: &mut Child,
) -> (
    SocketAddr,
    Arc<std::sync::Mutex<Vec<String>>>,
    std::thread::JoinHandle<()>,
) {
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines
            .next()
            .expect("larch export exited before listening")
            .unwrap();
        if let Some(rest) = line.split("status on http://").nth(1) {
            break rest.split(')').next().unwrap().parse().unwrap();
        }
    };
    let stderr = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = stderr.clone();
    let reader = std::thread::spawn(move || {
        for l in lines.map_while(Result::ok) {
            log.locked().push(l);
        }
    });
    (addr, stderr, reader)
}

pub fn unsafe_kill(pid: u32, sig: &str) {
    Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
}

fn items_reader(dir: &std::path::Path) -> ArchiveReader {
    let store = Arc::new(LocalStore::new(dir).unwrap());
    ArchiveReader::new(store, "public.items/", vec![Format::Jsonl]).unwrap()
}

/// The archive's head, epoch and rows by id, or the read error (retention may delete an epoch
/// under a reader of a live archive).
pub async fn read_archive(
    dir: &std::path::Path,
) -> larch::archive::Result<(String, i64, BTreeMap<i64, Value>)> {
    let (manifest, folded) = items_reader(dir).reconstruct_at(None, &[]).await?;
    Ok((manifest.head_position, manifest.epoch, rows_by_id(&folded)))
}

/// The rows of a folded archive of `items`, by id.
pub fn rows_by_id(folded: &larch::archive::reader::Folded) -> BTreeMap<i64, Value> {
    folded
        .rows
        .values()
        .map(|r| {
            let v: Value = serde_json::from_str(r.as_str()).unwrap();
            (v["id"].as_i64().unwrap(), v)
        })
        .collect()
}

/// [`read_archive`] of an archive no writer is changing, which must verify.
pub async fn archive_rows(dir: &std::path::Path) -> (String, i64, BTreeMap<i64, Value>) {
    let (_, report) = verify(&items_reader(dir)).await.unwrap();
    assert!(
        report.problems.is_empty(),
        "archive does not verify: {:?}",
        report.problems
    );
    read_archive(dir).await.unwrap()
}

pub async fn table_rows(db: &Database) -> BTreeMap<i64, Value> {
    db.client
        .query("SELECT id, name, big FROM items", &[])
        .await
        .unwrap()
        .into_iter()
        .map(|r| {
            let id: i64 = r.get(0);
            let name: Option<String> = r.get(1);
            let big: Option<String> = r.get(2);
            (id, serde_json::json!({"big": big, "id": id, "name": name}))
        })
        .collect()
}

async fn assert_archive_equals_table(db: &Database, dir: &std::path::Path) {
    let want = table_rows(db).await;
    let (_, _, got) = archive_rows(dir).await;
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "row identities differ"
    );
    for (id, w) in &want {
        assert_eq!(&got[id], w, "row {id}");
    }
}

pub async fn setup(db: &Database) {
    db.client
        .batch_execute(
            "CREATE TABLE items (id int8 PRIMARY KEY, name text, big text);
             ALTER TABLE items ALTER COLUMN big SET STORAGE EXTERNAL;
             INSERT INTO items SELECT g, 'n' || g, NULL FROM generate_series(1, 50) g;
             INSERT INTO items VALUES (1000000, 'toasty', repeat('x', 10000));",
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn follow_archives_every_kind_of_change_and_flushes_on_sigterm() {
    let db = new_database().await;
    setup(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let slot = format!("larch_follow_{}", db.name);
    let f = Follow::start(&db, dir.path(), &slot, &["--diff-interval", "200ms"]);
    f.ready().await;
    assert_eq!(f.status().await["epoch"], 1);
    db.client
        .batch_execute(
            "INSERT INTO items VALUES (51, 'fifty-one', NULL);
             UPDATE items SET name = 'two' WHERE id = 2;
             DELETE FROM items WHERE id = 3;
             UPDATE items SET id = 4000 WHERE id = 4;
             UPDATE items SET name = 'toasty v2' WHERE id = 1000000;",
        )
        .await
        .unwrap();
    let addr = f.addr;
    eventually(30, "a diff", || async move {
        (get_json(addr, "/status").await["diffs"]
            .as_u64()
            .unwrap_or(0)
            >= 1)
            .then_some(())
    })
    .await;
    assert_archive_equals_table(&db, dir.path()).await;
    let (_, _, rows) = archive_rows(dir.path()).await;
    assert_eq!(
        rows[&1000000]["big"].as_str().map(str::len),
        Some(10000),
        "unchanged TOAST kept (W8)"
    );
    assert!(
        !rows.contains_key(&4),
        "a key change deletes the old identity (W4)"
    );

    db.client
        .batch_execute("TRUNCATE items; INSERT INTO items VALUES (7, 'after truncate', NULL);")
        .await
        .unwrap();
    eventually(30, "the truncate diff", || async {
        let (_, _, rows) = archive_rows(dir.path()).await;
        (rows.len() == 1).then_some(())
    })
    .await;
    assert_archive_equals_table(&db, dir.path()).await;
    let metrics = get(addr, "/metrics").await.1;
    assert!(
        metrics.contains("snapshotter_epoch{table=\"public.items\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("larch_export_commit_lag_seconds_count"),
        "{metrics}"
    );
    assert_eq!(f.terminate(), 0);

    // SIGTERM flushes a final diff: with a long interval, only the final flush can write it.
    let f = Follow::start(&db, dir.path(), &slot, &["--diff-interval", "1h"]);
    f.ready().await;
    assert_eq!(
        f.status().await["epoch"],
        1,
        "a restart on the persistent slot continues the epoch"
    );
    db.client.batch_execute("INSERT INTO items VALUES (8, 'eight', NULL); UPDATE items SET name = 'seven' WHERE id = 7;").await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(f.terminate(), 0);
    assert_archive_equals_table(&db, dir.path()).await;
}

#[tokio::test]
async fn kill_9_then_restart_resumes_from_the_slot_with_nothing_lost_or_doubled() {
    let db = new_database().await;
    setup(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let slot = format!("larch_kill_{}", db.name);
    for round in 0..4 {
        let f = Follow::start(&db, dir.path(), &slot, &["--diff-interval", "100ms"]);
        f.ready().await;
        // Changes in flight while the process dies.
        for i in 0..20 {
            let id = 100 + round * 100 + i;
            db.client
                .batch_execute(&format!("INSERT INTO items VALUES ({id}, 'r{round}', NULL); UPDATE items SET name = 'u{round}-{i}' WHERE id = {};", 1 + i))
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(60 * (round as u64 + 1))).await;
        f.kill9();
        // The archive is readable after every crash.
        let _ = archive_rows(dir.path()).await;
    }
    let f = Follow::start(&db, dir.path(), &slot, &["--diff-interval", "100ms"]);
    f.ready().await;
    assert_eq!(
        f.status().await["epoch"],
        1,
        "every restart resumed the same epoch from the slot"
    );
    let addr = f.addr;
    eventually(30, "catch-up", || async {
        let _ = get(addr, "/status").await;
        let want = table_rows(&db).await;
        let (_, _, got) = archive_rows(dir.path()).await;
        (got == want).then_some(())
    })
    .await;
    assert_eq!(f.terminate(), 0);
}

#[tokio::test]
async fn the_new_epoch_policy_compacts_a_snapshot() {
    let db = new_database().await;
    setup(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let slot = format!("larch_policy_{}", db.name);
    let f = Follow::start(
        &db,
        dir.path(),
        &slot,
        &[
            "--diff-interval",
            "150ms",
            "--max-churn-records",
            "5",
            "--keep-epochs",
            "1",
        ],
    );
    f.ready().await;
    db.client
        .batch_execute("UPDATE items SET name = 'churn' WHERE id <= 10;")
        .await
        .unwrap();
    let addr = f.addr;
    eventually(30, "a compaction", || async move {
        (get_json(addr, "/status").await["epoch"]
            .as_i64()
            .unwrap_or(0)
            >= 2)
            .then_some(())
    })
    .await;
    assert_archive_equals_table(&db, dir.path()).await;
    let (_, epoch, _) = archive_rows(dir.path()).await;
    assert!(epoch >= 2);
    // keep_epochs 1: the first epoch's objects are gone.
    assert!(
        !dir.path()
            .join("public.items/epoch=1")
            .read_dir()
            .map(|mut d| d.next().is_some())
            .unwrap_or(false)
    );
    assert_eq!(f.terminate(), 0);
}

/// Issue 14 item 8: when the final flush on SIGTERM fails (the store cannot take the diff), the
/// exit status says so and names why; nothing was acknowledged, so the next start on the
/// persistent slot writes the changes and the archive equals the table.
#[tokio::test]
async fn a_failed_final_flush_exits_non_zero_and_loses_nothing() {
    let db = new_database().await;
    setup(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let slot = format!("larch_final_{}", db.name);
    let f = Follow::start(&db, dir.path(), &slot, &["--diff-interval", "1h"]);
    f.ready().await;
    let (head_before, _, rows_before) = archive_rows(dir.path()).await;
    db.client
        .batch_execute(
            "INSERT INTO items VALUES (8000, 'late', NULL); DELETE FROM items WHERE id = 1;",
        )
        .await
        .unwrap();
    eventually(30, "the changes buffered", || async {
        (f.status().await["buffer_depth"].as_u64() == Some(2)).then_some(())
    })
    .await;
    // The epoch's directory becomes a file: every write under it fails (ENOTDIR), as a full
    // disk would make it fail, while the manifest stays readable.
    let epoch = dir.path().join("public.items/epoch=1");
    let away = dir.path().join("epoch=1.away");
    std::fs::rename(&epoch, &away).unwrap();
    std::fs::write(&epoch, "in the way").unwrap();
    let (code, stderr) = f.terminate_with_stderr();
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("the final diff was not written")
            && stderr.contains("public.items/epoch=1/diff-")
            && stderr.contains("were not acknowledged to PostgreSQL"),
        "{stderr}"
    );
    std::fs::remove_file(&epoch).unwrap();
    std::fs::rename(&away, &epoch).unwrap();
    let (head_after, _, rows_after) = archive_rows(dir.path()).await;
    assert_eq!(
        (head_after, rows_after),
        (head_before, rows_before),
        "nothing half-written"
    );
    // The slot delivers the two changes again (nothing was acknowledged); the final flush of
    // this run writes them.
    let f = Follow::start(&db, dir.path(), &slot, &["--diff-interval", "1h"]);
    f.ready().await;
    eventually(30, "the changes delivered again", || async {
        (f.status().await["buffer_depth"].as_u64() == Some(2)).then_some(())
    })
    .await;
    assert_eq!(f.terminate(), 0);
    assert_archive_equals_table(&db, dir.path()).await;
}

/// A partitioned table follows as one table: its partitions' changes (a row moving between
/// partitions included) reach its archive, published under the root's name.
#[tokio::test]
async fn a_partitioned_table_follows_with_every_partitions_changes() {
    let db = new_database().await;
    db.client
        .batch_execute(
            "CREATE TABLE items (id int8 PRIMARY KEY, name text, big text) PARTITION BY RANGE (id);
             CREATE TABLE items_low PARTITION OF items FOR VALUES FROM (MINVALUE) TO (100);
             CREATE TABLE items_high PARTITION OF items FOR VALUES FROM (100) TO (MAXVALUE);
             INSERT INTO items SELECT g, 'n' || g, NULL FROM generate_series(1, 150) g;",
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let slot = format!("larch_partitioned_{}", db.name);
    let f = Follow::start(&db, dir.path(), &slot, &["--diff-interval", "200ms"]);
    f.ready().await;
    db.client
        .batch_execute(
            "INSERT INTO items VALUES (5, 'five again', NULL) ON CONFLICT (id) DO UPDATE SET name = excluded.name;
             INSERT INTO items VALUES (500, 'high', NULL);
             DELETE FROM items WHERE id = 120;
             UPDATE items SET id = 1000 WHERE id = 7;",
        )
        .await
        .unwrap();
    let addr = f.addr;
    eventually(30, "a diff", || async move {
        (get_json(addr, "/status").await["diffs"]
            .as_u64()
            .unwrap_or(0)
            >= 1)
            .then_some(())
    })
    .await;
    assert_eq!(f.terminate(), 0);
    assert_archive_equals_table(&db, dir.path()).await;
    let (_, _, rows) = archive_rows(dir.path()).await;
    assert!(rows.contains_key(&1000) && !rows.contains_key(&7) && !rows.contains_key(&120));
    let via_root: bool = db
        .client
        .query_one(
            "SELECT pubviaroot FROM pg_publication WHERE pubname = $1",
            &[&slot],
        )
        .await
        .unwrap()
        .get(0);
    assert!(via_root);

    // Someone else's publication that publishes under the partitions' names is refused, with
    // the fix named.
    db.client
        .batch_execute("CREATE PUBLICATION theirs FOR TABLE items")
        .await
        .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_larch"))
        .args(["export", "--follow", "--table", "items", "--store", "local"])
        .args(["--slot", "larch_theirs", "--publication", "theirs"])
        .arg("--path")
        .arg(dir.path().join("theirs"))
        .env("LARCH_PG_DSN", &db.dsn)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(
            "publication theirs publishes the changes of partitioned table(s) [\"public.items\"]"
        ) && err.contains("ALTER PUBLICATION \"theirs\" SET (publish_via_partition_root = true)"),
        "{err}"
    );
}
