//! Bounded memory with a real PostgreSQL 15 (issue 22): a PostgreSQL target applies a diff
//! larger than its pending limit atomically; a following export archives a transaction larger
//! than its buffer memory whole, also across a kill -9 (helpers: tests/it/bounded_memory.rs).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use larch::archive::format::Format;
use larch::archive::manifest::ArtifactKind;
use larch::archive::model::{Action, TableId};
use larch::archive::reader::ArchiveReader;
use larch::archive::spill::run_files;
use larch::archive::store::Store;
use larch::archive::value::Row;

use crate::bounded_memory::*;
use crate::engine_support::eventually;
use crate::writer::row;

fn change(action: Action, old: Option<Row>, new: Option<Row>) -> larch::source::ChangeEvent {
    larch::source::ChangeEvent {
        table: TableId::new("public", "items"),
        action,
        position: "0/20".into(),
        old,
        new,
        commit_time: None,
    }
}

async fn items_in(db: &tokio_postgres::Client) -> BTreeSet<String> {
    db.query("SELECT row_to_json(i)::text FROM public.items i", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| row(&r.get::<_, String>(0)).as_str().to_string())
        .collect()
}

/// A diff of several times the target's pending limit: written into the diff's transaction in
/// batches while it arrives (memory bounded), visible only at its checkpoint, whole; a stream
/// that fails before the checkpoint leaves the table as it was.
#[tokio::test]
async fn the_postgres_target_applies_a_diff_larger_than_its_pending_limit_atomically() {
    use larch::engine::targets::Target;
    use larch::engine::targets::postgres::{PENDING_LIMIT, PostgresTarget};
    let db = crate::support::postgres::new_database().await;
    db.client
        .batch_execute("CREATE TABLE public.items (id int8 PRIMARY KEY, v text)")
        .await
        .unwrap();
    let target = PostgresTarget::new(
        larch::engine::config::Connection::Env("LARCH_TEST_ITEMS_DSN".into()),
        TableId::new("public", "items"),
        "seed".into(),
    );
    // SAFETY: set before any thread of this test reads it; the name is this test's own.
    unsafe { std::env::set_var("LARCH_TEST_ITEMS_DSN", &db.dsn) };
    target.init(&[], &["id".into()]).await.unwrap();
    target.begin_baseline().await.unwrap();
    target
        .baseline_rows((0..100).map(|i| item(i, "base")).collect())
        .await
        .unwrap();
    target.commit_baseline("0/10").await.unwrap();
    let before = items_in(&db.client).await;
    assert_eq!(before.len(), 100);

    let n = 3 * PENDING_LIMIT as i64;
    let diff = |tag: &'static str, truncate: bool| {
        let mut changes = vec![change(Action::Delete, Some(item(1, "base")), None)];
        if truncate {
            changes.push(change(Action::Truncate, None, None));
        }
        changes.extend((0..n).map(move |i| change(Action::Insert, None, Some(item(i, tag)))));
        changes.extend(
            (0..n)
                .step_by(3)
                .map(move |i| change(Action::Delete, Some(item(i, tag)), None)),
        );
        changes.push(change(
            Action::Update,
            Some(item(4, tag)),
            Some(item(n + 4, "moved")),
        ));
        changes
    };
    // A stream that fails half-way: batches were written, nothing is visible, then rolled back.
    // (Without a TRUNCATE: PostgreSQL's TRUNCATE locks readers out until the diff commits.)
    for c in diff("lost", false).iter().take(2 * PENDING_LIMIT) {
        target.apply(c).await.unwrap();
    }
    assert_eq!(
        items_in(&db.client).await,
        before,
        "nothing visible before the checkpoint"
    );
    target.discard_pending().await;
    assert_eq!(items_in(&db.client).await, before);

    let mut want: BTreeMap<i64, Row> = BTreeMap::new();
    for c in diff("kept", true) {
        match c.action {
            Action::Truncate => want.clear(),
            Action::Delete => {
                let id: serde_json::Value =
                    serde_json::from_str(c.old.as_ref().unwrap().as_str()).unwrap();
                want.remove(&id["id"].as_i64().unwrap());
            }
            _ => {
                let new = c.new.clone().unwrap();
                let id: serde_json::Value = serde_json::from_str(new.as_str()).unwrap();
                if let Some(old) = &c.old {
                    let old_id: serde_json::Value = serde_json::from_str(old.as_str()).unwrap();
                    want.remove(&old_id["id"].as_i64().unwrap());
                }
                want.insert(id["id"].as_i64().unwrap(), new);
            }
        }
        target.apply(&c).await.unwrap();
    }
    target.checkpoint("0/20").await.unwrap();
    assert_eq!(items_in(&db.client).await, model_rows(&want));
    assert!(matches!(
        target.resume_position().await.unwrap(),
        larch::engine::targets::Resume::At(p) if p == "0/20"
    ));
}

// ---- A continuous export of one large transaction, against a real PostgreSQL 15. ----

const ROWS: i64 = 20_000;
/// Small enough that the transaction spills a dozen runs (and a merge of a level).
const BUFFER: &str = "256Ki";

async fn items_table(db: &crate::support::postgres::Database) {
    crate::postgres_continuous::setup(db).await;
    db.client
        .batch_execute(&format!(
            "INSERT INTO items SELECT g, 'row ' || g || repeat('.', 40), NULL FROM generate_series(100, {}) g",
            ROWS + 100
        ))
        .await
        .unwrap();
}

/// One transaction over every row: updates (the TOASTed row's big value unchanged, W8), deletes,
/// a key change (W4) and inserts.
const BIG_TRANSACTION: &str = "BEGIN;
    UPDATE items SET name = name || ' backfilled';
    DELETE FROM items WHERE id % 97 = 0;
    UPDATE items SET id = id + 10000000 WHERE id = 101;
    INSERT INTO items SELECT g, 'inserted', NULL FROM generate_series(9000000, 9000499) g;
    COMMIT;";

fn backfilled_rows(rows: &BTreeMap<i64, serde_json::Value>) -> usize {
    rows.values()
        .filter(|r| {
            r["name"]
                .as_str()
                .is_some_and(|n| n.ends_with(" backfilled"))
        })
        .count()
}

/// A `/proc/<pid>/status` memory figure in MiB.
fn proc_status_mib(pid: u32, field: &str) -> f64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib / 1024.0
}

fn follow_args(spill: &Path) -> Vec<String> {
    vec![
        "--diff-interval".into(),
        "200ms".into(),
        "--buffer-memory".into(),
        BUFFER.into(),
        "--spill-dir".into(),
        spill.display().to_string(),
    ]
}

/// Every diff of the archive holds the transaction whole or not at all (W5).
async fn no_diff_holds_part_of_it(dir: &Path) {
    let store: Arc<dyn Store> =
        Arc::new(larch::archive::store::local::LocalStore::new(dir).unwrap());
    let reader = ArchiveReader::new(store, PREFIX, vec![Format::Jsonl]).unwrap();
    let m = reader.load_manifest().await.unwrap();
    for d in m.artifacts.iter().filter(|a| a.kind == ArtifactKind::Diff) {
        let (_, folded) = reader
            .reconstruct_at(Some(&d.to_position), &[])
            .await
            .unwrap();
        let rows: BTreeMap<i64, serde_json::Value> = folded
            .rows
            .values()
            .map(|r| {
                let v: serde_json::Value = serde_json::from_str(r.as_str()).unwrap();
                (v["id"].as_i64().unwrap(), v)
            })
            .collect();
        let done = backfilled_rows(&rows);
        assert!(
            done == 0
                || rows.values().all(|r| r["name"]
                    .as_str()
                    .is_some_and(|n| n.ends_with(" backfilled") || n == "inserted")),
            "the archive at {} holds {done} of the transaction's updates, not all",
            d.to_position
        );
    }
}

#[tokio::test]
async fn a_transaction_larger_than_the_buffer_memory_is_archived_whole_while_following() {
    use crate::postgres_continuous::{Follow, archive_rows, table_rows};
    let db = crate::support::postgres::new_database().await;
    items_table(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let spill = tempfile::tempdir().unwrap();
    let slot = format!("larch_bigtx_{}", db.name);
    let args = follow_args(spill.path());
    let f = Follow::start(
        &db,
        dir.path(),
        &slot,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    f.ready().await;
    let rss_before = proc_status_mib(f.child.id(), "VmRSS");
    db.client.batch_execute(BIG_TRANSACTION).await.unwrap();
    let want = table_rows(&db).await;
    eventually(120, "the transaction archived", || async {
        let (_, _, got) = crate::postgres_continuous::read_archive(dir.path())
            .await
            .ok()?;
        (got == want).then_some(())
    })
    .await;
    let (_, epoch, got) = archive_rows(dir.path()).await;
    assert_eq!(epoch, 1, "archived as a diff, not a re-baseline");
    assert_eq!(got, want, "the archive head equals the table");
    assert_eq!(
        got[&1000000]["big"].as_str().map(str::len),
        Some(10000),
        "the unchanged TOASTed value is filled in (W8)"
    );
    assert!(
        !got.contains_key(&101) && got.contains_key(&10000101),
        "the key change (W4)"
    );
    no_diff_holds_part_of_it(dir.path()).await;
    let status = f.status().await;
    assert!(
        status["spilled_runs_total"].as_u64().unwrap() >= 10,
        "the transaction spilled: {status}"
    );
    assert_eq!(status["spill_runs"], 0, "{status}");
    assert_eq!(status["spill_bytes"], 0, "{status}");
    assert!(
        status["buffer_memory_bytes"].as_u64().unwrap() <= 256 * 1024,
        "{status}"
    );
    assert!(
        run_files(spill.path()).is_empty(),
        "runs deleted once the diff committed"
    );
    // For information (memory is measured by scripts/bench-export.sh, not asserted here).
    println!(
        "exporter (debug build): RSS {rss_before:.1} MiB before the {ROWS}-row transaction, \
         peak {:.1} MiB over its life, {} runs spilled with --buffer-memory {BUFFER}",
        proc_status_mib(f.child.id(), "VmHWM"),
        status["spilled_runs_total"]
    );
    assert_eq!(f.terminate(), 0);
    assert_eq!(
        std::fs::read_dir(spill.path()).unwrap().count(),
        0,
        "the spill directory is removed on exit"
    );
}

#[cfg(feature = "crashpoints")]
#[tokio::test]
async fn kill_9_while_a_large_transaction_spills_then_restart_archives_it_whole() {
    use crate::postgres_continuous::{Follow, archive_rows, table_rows};
    let db = crate::support::postgres::new_database().await;
    items_table(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let spill = tempfile::tempdir().unwrap();
    let slot = format!("larch_bigtx_kill_{}", db.name);
    let args = follow_args(spill.path());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut f = Follow::start_env(
        &db,
        dir.path(),
        &slot,
        &args,
        &[("LARCH_CRASH_AT", "spill.after-run@5")],
    );
    f.ready().await;
    let (head_before, _, rows_before) = archive_rows(dir.path()).await;
    db.client.batch_execute(BIG_TRANSACTION).await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(s) = f.child.try_wait().unwrap() {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "no crash within 60 s");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        Some(9),
        "killed by its crash point: {status:?}"
    );
    // Nothing of the transaction is listed; the archive verifies; the runs are left behind.
    let (head, _, rows) = archive_rows(dir.path()).await;
    assert_eq!(head, head_before, "no diff of part of the transaction");
    assert_eq!(rows, rows_before);
    assert!(
        run_files(spill.path()).len() >= 4,
        "the dead process left its runs"
    );
    let left: Vec<_> = std::fs::read_dir(spill.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(left.len(), 1, "{left:?}");

    let f = Follow::start(&db, dir.path(), &slot, &args);
    f.ready().await;
    assert!(
        !left[0].exists(),
        "the restart swept the dead process's directory"
    );
    let want = table_rows(&db).await;
    eventually(
        120,
        "the transaction archived after the restart",
        || async {
            let (_, _, got) = crate::postgres_continuous::read_archive(dir.path())
                .await
                .ok()?;
            (got == want).then_some(())
        },
    )
    .await;
    let (_, epoch, got) = archive_rows(dir.path()).await;
    assert_eq!(epoch, 1, "resumed from the slot, no re-baseline");
    assert_eq!(got, want);
    no_diff_holds_part_of_it(dir.path()).await;
    assert!(run_files(spill.path()).is_empty());
    assert_eq!(f.terminate(), 0);
    assert_eq!(std::fs::read_dir(spill.path()).unwrap().count(), 0);
}
