//! Issue 13 on a real PostgreSQL 15: what `larch export` leaves on the source database, what
//! `larch export cleanup` drops (only what larch recorded as its own), the retained WAL in
//! `/status` and metrics, a lost slot reported before the re-baseline, and retention of
//! one-shot exports.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use larch::archive::format::Format;
use larch::archive::reader::ArchiveReader;
use larch::archive::store::local::LocalStore;
use serde_json::Value;

use crate::engine_support::{eventually, get};
use crate::postgres_continuous::{Follow, unsafe_kill};
use crate::support::postgres::{Database, lossy_cluster, new_database, new_database_on};

fn larch(db: &Database) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_larch"));
    c.env("LARCH_PG_DSN", &db.dsn).env("LARCH_LOG", "warn");
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

async fn count(db: &Database, sql: &str) -> i64 {
    db.client.query_one(sql, &[]).await.unwrap().get(0)
}

async fn slot_exists(db: &Database, slot: &str) -> bool {
    count(
        db,
        &format!("SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}'"),
    )
    .await
        == 1
}

async fn publication_exists(db: &Database, name: &str) -> bool {
    count(
        db,
        &format!("SELECT count(*) FROM pg_publication WHERE pubname = '{name}'"),
    )
    .await
        == 1
}

async fn items_table(db: &Database, rows: i64) {
    db.client
        .batch_execute(&format!(
            "CREATE TABLE items (id int8 PRIMARY KEY, v text);
             INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, {rows}) g;"
        ))
        .await
        .unwrap();
}

/// Objects someone else made, which cleanup must never touch: a publication and a slot of
/// another tool, and a larch publication recorded for another slot.
async fn foreign_objects(db: &Database) {
    // One statement at a time: a slot cannot be created in a transaction that wrote.
    for sql in [
        "CREATE PUBLICATION theirs FOR TABLE items",
        "SELECT pg_create_logical_replication_slot('theirs_slot', 'pgoutput')",
        "CREATE PUBLICATION other_pub FOR TABLE items",
        "COMMENT ON PUBLICATION other_pub IS 'larch: created for replication slot someone_else'",
    ] {
        db.client.batch_execute(sql).await.unwrap();
    }
}

#[tokio::test]
async fn follow_says_what_it_leaves_and_cleanup_drops_only_what_larch_created() {
    let db = new_database().await;
    items_table(&db, 50).await;
    foreign_objects(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let slot = "larch_lc_items";
    let f = Follow::start(&db, dir.path(), slot, &["--diff-interval", "300ms"]);
    f.ready().await;
    db.client
        .batch_execute("INSERT INTO items SELECT g, 'w' FROM generate_series(51, 80) g")
        .await
        .unwrap();
    // /status and /metrics show the slot and the WAL it holds.
    let status = eventually(30, "the slot's WAL in /status", || async {
        let s = f.status().await;
        (s["slot"]["exists"] == true && s["slot"]["retained_wal_bytes"].as_u64().is_some())
            .then_some(s)
    })
    .await;
    assert_eq!(status["slot"]["name"], slot);
    assert_eq!(status["slot"]["active"], true, "{status}");
    assert!(
        status["slot"]["retained_wal_bytes"].as_u64().unwrap() > 0,
        "{status}"
    );
    assert_eq!(status["slot_losses"], 0);
    let (code, metrics) = get(f.addr, "/metrics").await;
    assert_eq!(code, 200);
    assert!(
        metrics.contains(&format!("laredo_source_lag_bytes{{source=\"{slot}\"}}"))
            && metrics.contains(&format!(
                "larch_export_slot_retained_bytes{{slot=\"{slot}\"}}"
            )),
        "{metrics}"
    );

    let (code, stderr) = f.terminate_with_stderr();
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "replication slot {slot} (persistent: a restart resumes from it"
        )) && stderr.contains("of WAL on the server")
            && stderr.contains(&format!(
                "\n  larch export cleanup --slot {slot} --publication {slot} (in a shell where \
                 LARCH_PG_DSN holds the same connection string)"
            )),
        "{stderr}"
    );
    assert!(slot_exists(&db, slot).await && publication_exists(&db, slot).await);

    // The printed command (the publication defaults to the slot's name).
    let (code, stdout, stderr) = run(larch(&db).args(["export", "cleanup", "--slot", slot]));
    assert_eq!(code, 0, "{stderr}");
    let report: Value = serde_json::from_str(&stdout).unwrap();
    let outcomes: Vec<(String, String)> = report["objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            (
                o["kind"].as_str().unwrap().into(),
                o["outcome"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        [
            ("slot".into(), "dropped".into()),
            ("publication".into(), "dropped".into())
        ]
    );
    assert!(!slot_exists(&db, slot).await && !publication_exists(&db, slot).await);
    // Again: nothing left, nothing to do.
    let (code, stdout, _) = run(larch(&db).args(["export", "cleanup", "--slot", slot]));
    assert_eq!(code, 0);
    assert!(stdout.contains(r#""outcome":"absent""#), "{stdout}");

    // Not larch's: kept, with the reason.
    let (code, stdout, stderr) = run(larch(&db).args([
        "export",
        "cleanup",
        "--slot",
        "theirs_slot",
        "--publication",
        "theirs",
    ]));
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains(
            "kept replication slot theirs_slot: no larch owner record: publication theirs has no larch comment"
        ) && stderr.contains("kept publication theirs: no larch owner record"),
        "{stderr}"
    );
    assert_eq!(stdout.matches(r#""outcome":"kept""#).count(), 2, "{stdout}");
    let (code, _, stderr) = run(larch(&db).args([
        "export",
        "cleanup",
        "--slot",
        "theirs_slot",
        "--publication",
        "other_pub",
    ]));
    assert_eq!(code, 0);
    assert!(
        stderr.contains(
            "kept publication other_pub: publication other_pub is recorded for replication slot someone_else"
        ),
        "{stderr}"
    );
    assert!(slot_exists(&db, "theirs_slot").await);
    assert!(publication_exists(&db, "theirs").await && publication_exists(&db, "other_pub").await);
    db.client
        .batch_execute("SELECT pg_drop_replication_slot('theirs_slot')")
        .await
        .unwrap();
}

#[tokio::test]
async fn cleanup_with_a_wrong_password_or_a_dropped_database_fails_clearly_and_drops_nothing() {
    let cluster = crate::support::postgres::cluster();
    let db = new_database().await;
    items_table(&db, 3).await;
    // What larch leaves after --follow: a recorded publication and its slot.
    for sql in [
        "CREATE PUBLICATION larch_bad FOR TABLE items",
        "COMMENT ON PUBLICATION larch_bad IS 'larch: created for replication slot larch_bad by cli'",
        "SELECT pg_create_logical_replication_slot('larch_bad', 'pgoutput')",
    ] {
        db.client.batch_execute(sql).await.unwrap();
    }
    let role = format!("lc_{}", db.name);
    db.client
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN REPLICATION PASSWORD 'right'"
        ))
        .await
        .unwrap();
    cluster.require_password_for(&role).await;
    let wrong = format!(
        "host=127.0.0.1 port={} user={role} password=wrong dbname={}",
        cluster.port, db.name
    );
    let (code, stdout, stderr) = run(larch(&db).env("LARCH_PG_DSN", &wrong).args([
        "export",
        "cleanup",
        "--slot",
        "larch_bad",
    ]));
    assert_eq!(code, 2, "a wrong password needs someone to act: {stderr}");
    assert!(stdout.is_empty());
    assert!(
        stderr.contains("cannot connect to PostgreSQL at 127.0.0.1:")
            && stderr.contains("(check the user name and password)")
            && !stderr.contains("wrong"),
        "{stderr}"
    );
    let gone = format!(
        "host=127.0.0.1 port={} user=postgres dbname=dropped_{}",
        cluster.port, db.name
    );
    let summary = tempfile::NamedTempFile::new().unwrap();
    let (code, _, stderr) = run(larch(&db).env("LARCH_PG_DSN", &gone).args([
        "export",
        "cleanup",
        "--slot",
        "larch_bad",
        "--summary-file",
        summary.path().to_str().unwrap(),
    ]));
    assert_eq!(code, 2, "a missing database needs someone to act: {stderr}");
    assert!(stderr.contains("(the database does not exist)"), "{stderr}");
    // The operator reads the error and its reason from the termination message.
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(summary.path()).unwrap()).unwrap();
    assert!(
        doc["error"].as_str().unwrap().contains("does not exist"),
        "{doc}"
    );
    assert_eq!(doc["reason"], "DatabaseNotFound", "{doc}");
    let (code, _, stderr) = run(larch(&db).args([
        "export",
        "cleanup",
        "--slot",
        "a",
        "--slot",
        "b",
        "--publication",
        "p",
    ]));
    assert_eq!(code, 2);
    assert!(
        stderr.contains("--publication applies to a single --slot"),
        "{stderr}"
    );
    // Nothing was dropped by any of these.
    assert!(slot_exists(&db, "larch_bad").await && publication_exists(&db, "larch_bad").await);
    let (code, _, stderr) = run(larch(&db).args(["export", "cleanup", "--slot", "larch_bad"]));
    assert_eq!(code, 0, "{stderr}");
    assert!(!slot_exists(&db, "larch_bad").await && !publication_exists(&db, "larch_bad").await);
}

#[tokio::test]
async fn a_one_shot_export_leaves_nothing_and_removes_a_publication_a_killed_one_left() {
    let db = new_database().await;
    items_table(&db, 10).await;
    // An older export, killed mid-run, left its publication (its temporary slot went with it).
    db.client
        .batch_execute(
            "CREATE PUBLICATION larch_public_items FOR TABLE items;
             COMMENT ON PUBLICATION larch_public_items IS 'larch: created for replication slot larch_public_items by cli';",
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (code, _, stderr) = run(larch(&db)
        .args(["export", "--table", "items", "--store", "local", "--path"])
        .arg(dir.path()));
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains(
            "dropped publication larch_public_items, left behind for slot larch_public_items"
        ),
        "{stderr}"
    );
    assert_eq!(count(&db, "SELECT count(*) FROM pg_publication").await, 0);
    // A foreign publication of that name is not larch's: kept.
    db.client
        .batch_execute("CREATE PUBLICATION larch_public_items FOR TABLE items")
        .await
        .unwrap();
    let (code, _, stderr) = run(larch(&db)
        .args(["export", "--table", "items", "--store", "local", "--path"])
        .arg(dir.path()));
    assert_eq!(code, 0, "{stderr}");
    assert!(publication_exists(&db, "larch_public_items").await);
    // A one-shot export cannot hold a persistent slot.
    let (code, _, stderr) = run(larch(&db)
        .args([
            "export",
            "--table",
            "items",
            "--slot-mode",
            "persistent",
            "--store",
            "local",
            "--path",
        ])
        .arg(dir.path()));
    assert_eq!(code, 2);
    assert!(
        stderr.contains("--slot-mode persistent needs --follow"),
        "{stderr}"
    );
    eventually(10, "no slot left", || async {
        (count(
            &db,
            "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()",
        )
        .await
            == 0)
            .then_some(())
    })
    .await;
}

/// Epochs that still have objects in the local store.
fn epochs_on_disk(dir: &std::path::Path) -> Vec<i64> {
    let mut e: Vec<i64> = std::fs::read_dir(dir.join("public.items"))
        .unwrap()
        .map(|d| d.unwrap().path())
        .filter(|p| std::fs::read_dir(p).is_ok_and(|mut files| files.next().is_some()))
        .filter_map(|p| {
            p.file_name()?
                .to_str()?
                .strip_prefix("epoch=")?
                .parse()
                .ok()
        })
        .collect();
    e.sort();
    e
}

#[tokio::test]
async fn one_shot_runs_prune_old_epochs_after_their_own_commit() {
    let db = new_database().await;
    items_table(&db, 20).await;
    let dir = tempfile::tempdir().unwrap();
    let export = |extra: &[&str]| {
        let (code, stdout, stderr) = run(larch(&db)
            .args(["export", "--table", "items", "--store", "local", "--path"])
            .arg(dir.path())
            .args(extra));
        assert_eq!(code, 0, "{stderr}");
        serde_json::from_str::<Value>(&stdout).unwrap()["epoch"]
            .as_i64()
            .unwrap()
    };
    for round in 1..=4 {
        db.client
            .batch_execute(&format!(
                "UPDATE items SET v = 'round {round}' WHERE id = 1"
            ))
            .await
            .unwrap();
        assert_eq!(export(&["--keep-epochs", "2"]), round);
    }
    assert_eq!(
        epochs_on_disk(dir.path()),
        [3, 4],
        "only two epochs' objects stay"
    );
    let store = Arc::new(LocalStore::new(dir.path()).unwrap());
    let reader = ArchiveReader::new(store, "public.items/", vec![Format::Jsonl]).unwrap();
    let manifest = reader.load_manifest().await.unwrap();
    let mut listed: Vec<i64> = manifest.artifacts.iter().map(|a| a.epoch).collect();
    listed.dedup();
    assert_eq!(listed, [3, 4]);
    let (_, folded) = reader.reconstruct_at(None, &[]).await.unwrap();
    assert_eq!(folded.rows.len(), 20);
    assert!(
        folded.rows.values().any(|r| r.as_str().contains("round 4")),
        "the newest epoch holds the last state"
    );
    // --max-age: an epoch that ended longer ago than that goes; the one that just ended stays.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(export(&["--max-age", "1s"]), 5);
    assert_eq!(epochs_on_disk(dir.path()), [4, 5]);
    let (code, _, stderr) = run(larch(&db)
        .args([
            "export",
            "--table",
            "items",
            "--max-age",
            "0s",
            "--store",
            "local",
            "--path",
        ])
        .arg(dir.path()));
    assert_eq!(code, 2, "a clap usage error");
    assert!(stderr.contains("--max-age"), "{stderr}");
}

/// A slot invalidated by max_slot_wal_keep_size while the exporter stood still: `/status`
/// reports the loss before the re-baseline writes a new epoch.
#[tokio::test]
async fn a_lost_slot_is_reported_before_the_rebaseline() {
    let db = new_database_on(lossy_cluster()).await;
    for sql in [
        "ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'",
        "SELECT pg_reload_conf()",
        "CREATE TABLE items (id int8 PRIMARY KEY, v text)",
        "INSERT INTO items SELECT g, 'x' FROM generate_series(1, 100) g",
    ] {
        db.client.batch_execute(sql).await.unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let slot = "larch_lossy_items";
    let f = Follow::start(
        &db,
        dir.path(),
        slot,
        &["--diff-interval", "300ms", "--slot-loss-report-wait", "60s"],
    );
    f.ready().await;
    assert_eq!(f.status().await["epoch"], 1);
    // The exporter stands still; WAL is written and recycled until the slot is lost.
    unsafe_kill(f.child.id(), "STOP");
    let mut lost = false;
    for round in 0..40 {
        db.client
            .batch_execute(&format!(
                "INSERT INTO items SELECT g + {round} * 100000 + 1000, repeat('x', 200) FROM generate_series(1, 20000) g;
                 SELECT pg_switch_wal(); CHECKPOINT;"
            ))
            .await
            .unwrap();
        let status: Option<String> = db
            .client
            .query_opt(
                "SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await
            .unwrap()
            .and_then(|r| r.get(0));
        if status.as_deref() == Some("lost") {
            lost = true;
            break;
        }
    }
    unsafe_kill(f.child.id(), "CONT");
    assert!(lost, "the slot was never invalidated");
    // The first /status that shows the loss still shows the old epoch: the re-baseline waits.
    let first = eventually(60, "the loss in /status", || async {
        let s = f.status().await;
        (s["slot_losses"] == 1).then_some(s)
    })
    .await;
    assert_eq!(first["epoch"], 1, "{first}");
    assert_eq!(first["state"], "SLOT_LOST", "{first}");
    assert!(
        first["last_slot_loss"]["reason"]
            .as_str()
            .unwrap()
            .contains("invalidated"),
        "{first}"
    );
    // Then the new baseline: a new epoch with every row.
    let after = eventually(120, "the re-baseline", || async {
        let s = f.status().await;
        (s["epoch"] == 2 && s["state"] == "STREAMING").then_some(s)
    })
    .await;
    assert_eq!(after["slot_losses"], 1);
    assert_eq!(f.terminate(), 0);
    let table: i64 = count(&db, "SELECT count(*) FROM items").await;
    let store = Arc::new(LocalStore::new(dir.path()).unwrap());
    let reader = ArchiveReader::new(store, "public.items/", vec![Format::Jsonl]).unwrap();
    let (_, folded) = reader.reconstruct_at(None, &[]).await.unwrap();
    assert_eq!(folded.rows.len() as i64, table);
}
