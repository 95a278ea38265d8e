//! Bounded memory whatever the transaction or diff size (issue 22), at the archive level: a
//! writer whose buffers spill writes byte-identical diffs to one that keeps everything in
//! memory; compaction and the archive source's baseline through spilled runs equal the fold;
//! a diff streamed with a late TRUNCATE folds like the reader; spill files go away.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use larch::archive::format::Format;
use larch::archive::manifest::{ArtifactKind, artifact_key};
use larch::archive::model::{Action, TableId};
use larch::archive::reader::{ArchiveReader, TRUNCATE_LOOKAHEAD};
use larch::archive::spill::{SpillConfig, run_files};
use larch::archive::store::Store;
use larch::archive::store::memory::MemoryStore;
use larch::archive::value::Row;
use larch::archive::writer::{ArchiveWriter, FlushOutcome, WriterConfig};
use larch::source::archive::{ArchiveReplayOptions, ArchiveReplaySource};
use larch::source::{SourceEvent, SyncSource};
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc;

use crate::archive_build::{Ch, TestArchive};
use crate::writer::{row, rows_channel};

pub(crate) const PREFIX: &str = "public.items/";

pub(crate) fn config(spill_dir: &Path, memory_limit: u64) -> WriterConfig {
    let mut c = WriterConfig::new("public.items", PREFIX);
    c.key_fields = vec!["id".into()];
    c.spill = SpillConfig {
        dir: spill_dir.to_path_buf(),
        memory_limit,
        disk_limit: 0,
    };
    c
}

pub(crate) fn item(id: i64, v: &str) -> Row {
    row(&format!(r#"{{"id":{id},"v":"{v}"}}"#))
}

/// One transaction of a random workload: inserts, updates, deletes, key changes, a TRUNCATE now
/// and then (in small transactions). `model` is the table after it.
pub(crate) fn transaction(
    rng: &mut rand::rngs::StdRng,
    n: usize,
    t: usize,
    model: &mut BTreeMap<i64, Row>,
) -> Vec<(Action, Option<Row>, Option<Row>)> {
    let mut out = Vec::new();
    for i in 0..n {
        let id = rng.random_range(0..400i64);
        let roll = rng.random_range(0..100);
        let v = format!("t{t}-{i}");
        if roll < 1 && n < 100 {
            // Small transactions only: a large one stays large (and on disk) to its end.
            out.push((Action::Truncate, None, None));
            model.clear();
        } else if roll < 15 {
            if let Some(old) = model.remove(&id) {
                out.push((Action::Delete, Some(old), None));
            }
        } else if roll < 22 {
            // A key change: the old identity goes, the new one comes (W4).
            let to = rng.random_range(400..800i64);
            if !model.contains_key(&to)
                && let Some(old) = model.remove(&id)
            {
                let new = item(to, &v);
                model.insert(to, new.clone());
                out.push((Action::Update, Some(old), Some(new)));
            }
        } else {
            let new = item(id, &v);
            let action = if model.insert(id, new.clone()).is_some() {
                Action::Update
            } else {
                Action::Insert
            };
            out.push((action, None, Some(new)));
        }
    }
    out
}

pub(crate) async fn object(store: &Arc<dyn Store>, key: &str) -> Vec<u8> {
    store.get(key).await.unwrap().unwrap().bytes.to_vec()
}

pub(crate) async fn head_rows(store: Arc<dyn Store>) -> BTreeSet<String> {
    let reader = ArchiveReader::new(store, PREFIX, vec![Format::Jsonl]).unwrap();
    let (_, folded) = reader.reconstruct_at(None, &[]).await.unwrap();
    folded
        .rows
        .values()
        .map(|r| r.as_str().to_string())
        .collect()
}

pub(crate) fn model_rows(model: &BTreeMap<i64, Row>) -> BTreeSet<String> {
    model.values().map(|r| r.as_str().to_string()).collect()
}

#[tokio::test]
pub(crate) async fn a_spilling_writer_writes_the_same_diffs_as_one_that_keeps_everything_in_memory()
{
    let spill_dir = tempfile::tempdir().unwrap();
    let in_memory: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let spilling: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mut a = ArchiveWriter::open(vec![in_memory.clone()], config(spill_dir.path(), 64 << 20))
        .await
        .unwrap();
    // 2 KiB: a run every dozen changes, levels merged ahead many times.
    let mut b = ArchiveWriter::open(vec![spilling.clone()], config(spill_dir.path(), 2048))
        .await
        .unwrap();
    let base: Vec<Row> = (0..300).map(|i| item(i, "base")).collect();
    let mut model: BTreeMap<i64, Row> = (0..300).map(|i| (i, item(i, "base"))).collect();
    a.write_snapshot("0/1", rows_channel(base.clone()))
        .await
        .unwrap();
    b.write_snapshot("0/1", rows_channel(base)).await.unwrap();
    let seed: u64 = rand::rng().random();
    println!("seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut position = 0x10u64;
    for t in 0..40 {
        let size = if t % 10 == 3 {
            3000
        } else {
            rng.random_range(1..60)
        };
        for (action, old, new) in transaction(&mut rng, size, t, &mut model) {
            a.record_pending(action, old.clone(), new.clone()).unwrap();
            b.record_pending(action, old, new).unwrap();
        }
        if t % 10 == 3 {
            // A large open transaction is on disk, not in memory.
            assert!(
                !run_files(spill_dir.path()).is_empty(),
                "transaction {t} spilled"
            );
            assert!(b.spill().stats().memory_bytes.load(Ordering::Relaxed) <= 2048 + 512);
        }
        a.commit_pending().unwrap();
        b.commit_pending().unwrap();
        position += 0x10;
        if t % 4 == 3 {
            let to = format!("0/{position:X}");
            let (FlushOutcome::Diff { artifact: da, .. }, FlushOutcome::Diff { artifact: db, .. }) =
                (a.flush(&to).await.unwrap(), b.flush(&to).await.unwrap())
            else {
                panic!("two diffs at {to}")
            };
            let key = artifact_key(PREFIX, &da, ".jsonl");
            assert_eq!(
                object(&in_memory, &key).await,
                object(&spilling, &key).await,
                "diff {key} (seed {seed})"
            );
            assert_eq!(da.change_count, db.change_count);
            assert_eq!(da.formats["jsonl"].sha256, db.formats["jsonl"].sha256);
            assert!(
                run_files(spill_dir.path()).is_empty(),
                "a committed diff leaves no run behind"
            );
        }
    }
    assert!(b.spill().stats().runs_written.load(Ordering::Relaxed) > 100);

    // A TRUNCATE in the middle of a spilled transaction drops what it spilled before it.
    let runs_before = b.spill().stats().runs_written.load(Ordering::Relaxed);
    for i in 0..1500 {
        let (action, old, new) = (
            Action::Insert,
            None,
            Some(item(20_000 + i, "before truncate")),
        );
        a.record_pending(action, old.clone(), new.clone()).unwrap();
        b.record_pending(action, old, new).unwrap();
    }
    assert!(b.spill().stats().runs_written.load(Ordering::Relaxed) > runs_before + 5);
    a.record_pending(Action::Truncate, None, None).unwrap();
    b.record_pending(Action::Truncate, None, None).unwrap();
    assert!(
        run_files(spill_dir.path()).is_empty(),
        "the TRUNCATE deleted the runs"
    );
    model.clear();
    for i in 0..1500 {
        let new = item(30_000 + i, "after truncate");
        model.insert(30_000 + i, new.clone());
        a.record_pending(Action::Insert, None, Some(new.clone()))
            .unwrap();
        b.record_pending(Action::Insert, None, Some(new)).unwrap();
    }
    a.commit_pending().unwrap();
    b.commit_pending().unwrap();
    let (FlushOutcome::Diff { artifact: da, .. }, FlushOutcome::Diff { .. }) = (
        a.flush("0/FFF0").await.unwrap(),
        b.flush("0/FFF0").await.unwrap(),
    ) else {
        panic!("two diffs")
    };
    let key = artifact_key(PREFIX, &da, ".jsonl");
    let text = object(&spilling, &key).await;
    assert_eq!(text, object(&in_memory, &key).await);
    assert!(
        String::from_utf8_lossy(&text).starts_with(r#"{"action":"TRUNCATE""#),
        "the TRUNCATE is written first (W3)"
    );
    assert_eq!(head_rows(spilling.clone()).await, model_rows(&model));
    assert_eq!(head_rows(in_memory).await, head_rows(spilling).await);

    // A transaction that never commits (the stream restarts): discarded, its runs deleted.
    for i in 0..2000 {
        b.record_pending(
            Action::Insert,
            None,
            Some(item(10_000 + i, "never committed")),
        )
        .unwrap();
    }
    assert!(!run_files(spill_dir.path()).is_empty());
    b.discard_pending();
    assert!(run_files(spill_dir.path()).is_empty());
    assert_eq!(b.flush("0/FFFF").await.unwrap(), FlushOutcome::Idle);
    let live = b.spill().live_dir().expect("the spill directory exists");
    drop(b);
    assert!(
        !live.exists(),
        "a closed writer removes its spill directory"
    );
}

#[tokio::test]
pub(crate) async fn the_spill_limit_stops_the_transaction_with_a_clear_error_and_keeps_committed_changes()
 {
    let spill_dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mut c = config(spill_dir.path(), 1024);
    c.spill.disk_limit = 64 * 1024;
    let mut w = ArchiveWriter::open(vec![store.clone()], c).await.unwrap();
    w.write_snapshot("0/1", rows_channel(vec![])).await.unwrap();
    w.record(Action::Insert, None, Some(item(1, "kept")))
        .unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let err = (0..100_000i64)
        .find_map(|i| {
            let noise: String = (0..64)
                .map(|_| rng.random_range(b'a'..=b'z') as char)
                .collect();
            w.record_pending(Action::Insert, None, Some(item(i + 10, &noise)))
                .err()
        })
        .expect("the limit is reached");
    let text = err.to_string();
    assert!(text.contains("spill limit of 65536 bytes"), "{text}");
    assert!(text.contains("--spill-limit"), "{text}");
    w.discard_pending();
    assert!(run_files(spill_dir.path()).is_empty());
    assert!(matches!(
        w.flush("0/2").await.unwrap(),
        FlushOutcome::Diff { .. }
    ));
    assert_eq!(
        head_rows(store).await,
        model_rows(&BTreeMap::from([(1, item(1, "kept"))]))
    );
}

/// An archive of `n` rows and a diff touching every row (the shape of a backfill), plus a diff
/// with deletes and a key change.
pub(crate) async fn backfilled(
    store: Arc<dyn Store>,
    spill_dir: &Path,
    n: i64,
    budget: u64,
) -> ArchiveWriter {
    let mut w = ArchiveWriter::open(vec![store], config(spill_dir, budget))
        .await
        .unwrap();
    w.write_snapshot(
        "0/1",
        rows_channel((0..n).map(|i| item(i, "base")).collect()),
    )
    .await
    .unwrap();
    for i in 0..n {
        w.record_pending(Action::Update, None, Some(item(i, "backfill")))
            .unwrap();
    }
    w.commit_pending().unwrap();
    w.flush("0/2").await.unwrap();
    w.record(Action::Delete, Some(item(5, "backfill")), None)
        .unwrap();
    w.record(
        Action::Update,
        Some(item(7, "backfill")),
        Some(item(n + 7, "moved")),
    )
    .unwrap();
    w.record(Action::Insert, None, Some(item(n + 100, "new")))
        .unwrap();
    w.flush("0/3").await.unwrap();
    w
}

#[tokio::test]
pub(crate) async fn compaction_of_a_table_sized_diff_spills_and_equals_the_fold() {
    let spill_dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mut w = backfilled(store.clone(), spill_dir.path(), 5000, 16 * 1024).await;
    let before = head_rows(store.clone()).await;
    let runs_before = w.spill().stats().runs_written.load(Ordering::Relaxed);
    let snap = w.compact().await.unwrap();
    assert_eq!((snap.epoch, snap.row_count), (2, 5000));
    assert!(
        w.spill().stats().runs_written.load(Ordering::Relaxed) > runs_before + 10,
        "the overlay and the snapshot's rows went through runs"
    );
    assert!(run_files(spill_dir.path()).is_empty());
    assert_eq!(head_rows(store.clone()).await, before);
    // The new epoch alone holds the table.
    let reader = ArchiveReader::new(store.clone(), PREFIX, vec![Format::Jsonl]).unwrap();
    let m = reader.load_manifest().await.unwrap();
    let newest = m
        .artifacts
        .iter()
        .rfind(|a| a.kind == ArtifactKind::Snapshot)
        .unwrap();
    let mut rx = reader.stream_rows(newest, vec!["id".into()]);
    let mut rows = BTreeSet::new();
    while let Some(r) = rx.recv().await {
        rows.insert(r.unwrap().row.as_str().to_string());
    }
    assert_eq!(rows, before);

    // A TRUNCATE in the chain drops the snapshot, spilled or not.
    w.record(Action::Truncate, None, None).unwrap();
    w.record(Action::Insert, None, Some(item(1, "after")))
        .unwrap();
    w.flush("0/4").await.unwrap();
    let snap = w.compact().await.unwrap();
    assert_eq!(snap.row_count, 1);
    assert_eq!(
        head_rows(store).await,
        model_rows(&BTreeMap::from([(1, item(1, "after"))]))
    );
}

pub(crate) fn archive_source(
    store: Arc<dyn Store>,
    spill_dir: &Path,
    memory_limit: u64,
) -> ArchiveReplaySource {
    let reader = ArchiveReader::new(store, PREFIX, vec![Format::Jsonl]).unwrap();
    let mut o = ArchiveReplayOptions::new("seed", TableId::new("public", "items"));
    o.poll_interval = Duration::from_millis(50);
    o.spill = SpillConfig {
        dir: spill_dir.to_path_buf(),
        memory_limit,
        disk_limit: 0,
    };
    ArchiveReplaySource::new(reader, o)
}

pub(crate) async fn source_baseline(src: &ArchiveReplaySource) -> BTreeSet<String> {
    let (tx, mut rx) = mpsc::channel(16);
    let collect = tokio::spawn(async move {
        let mut got = BTreeSet::new();
        while let Some((_, r)) = rx.recv().await {
            let r: Row = r;
            assert!(got.insert(r.as_str().to_string()), "row sent twice: {r:?}");
        }
        got
    });
    src.baseline(&[TableId::new("public", "items")], tx)
        .await
        .unwrap();
    collect.await.unwrap()
}

#[tokio::test]
pub(crate) async fn an_engine_baseline_over_a_backfill_spills_and_equals_the_fold() {
    let spill_dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let _w = backfilled(store.clone(), spill_dir.path(), 4000, 64 << 20).await;
    let want = head_rows(store.clone()).await;
    let src = archive_source(store.clone(), spill_dir.path(), 8 * 1024);
    src.init(&[TableId::new("public", "items")]).await.unwrap();
    assert_eq!(source_baseline(&src).await, want);
    assert!(
        run_files(spill_dir.path()).is_empty(),
        "runs deleted after the baseline"
    );
    // The same with the overlay in memory.
    let src = archive_source(store, spill_dir.path(), 64 << 20);
    assert_eq!(source_baseline(&src).await, want);
}

/// laredo may write a diff's TRUNCATE anywhere: after more changes than the source holds back,
/// the stream and the baseline still fold like the reader.
#[tokio::test]
pub(crate) async fn a_late_truncate_past_the_lookahead_folds_like_the_reader() {
    let spill_dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mut a = TestArchive::new(store.clone(), PREFIX, "public.items");
    let base: Vec<String> = (0..10).map(|i| item(i, "s").as_str().to_string()).collect();
    a.snapshot("0/10", &base.iter().map(String::as_str).collect::<Vec<_>>())
        .await;
    let rows: Vec<String> = (0..TRUNCATE_LOOKAHEAD as i64 + 50)
        .map(|i| item(1000 + i, "d").as_str().to_string())
        .collect();
    let mut changes: Vec<Ch> = rows
        .iter()
        .map(|r| (Action::Insert, None, Some(r.as_str())))
        .collect();
    changes.insert(TRUNCATE_LOOKAHEAD + 20, (Action::Truncate, None, None));
    a.diff("0/10", "0/20", &changes).await;
    let want = head_rows(store.clone()).await;
    assert_eq!(
        want.len(),
        TRUNCATE_LOOKAHEAD + 50,
        "the reader: truncate first, then every insert"
    );

    let src = Arc::new(archive_source(store.clone(), spill_dir.path(), 64 << 20));
    assert_eq!(source_baseline(&src).await, want);
    // Streamed from the snapshot's position: applying the events in order gives the fold.
    let (tx, mut rx) = mpsc::channel(64);
    let s2 = src.clone();
    let task = tokio::spawn(async move { s2.stream("0/10", tx).await });
    let mut state: BTreeSet<String> = base.into_iter().collect();
    loop {
        match rx.recv().await.expect("stream open") {
            SourceEvent::Change(c) => match c.action {
                Action::Truncate => state.clear(),
                _ => {
                    state.insert(c.new.unwrap().as_str().to_string());
                }
            },
            SourceEvent::Checkpoint { position } => {
                assert_eq!(position, "0/20");
                break;
            }
        }
    }
    assert_eq!(state, want);
    src.close().await;
    let _ = task.await;
}

/// A compaction counts the rows it writes against the newest snapshot's `row_count` (what
/// `/status` `progress` and `larch_export_progress_*` show), and the operator reads it as
/// `Compacting`, then `Complete` once it ended.
#[tokio::test]
pub(crate) async fn compaction_reports_its_progress_against_the_snapshots_rows() {
    use larch::operator::progress::export_progress;
    let spill_dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mut w = backfilled(store, spill_dir.path(), 3000, 1 << 20).await;
    let progress = larch::progress::Progress::new("compaction", "public.items");
    let snap = w.compact_reporting(Some(progress.clone())).await.unwrap();
    let r = progress.report();
    assert_eq!(r.total_rows, Some(3000), "the newest snapshot's row_count");
    assert_eq!(r.rows, snap.row_count as u64, "every row written counted");
    assert!(r.bytes > 0, "{r:?}");
    assert_eq!(r.percent, Some(100.0));
    let running = export_progress(std::slice::from_ref(&r)).unwrap();
    assert_eq!(running.phase, "Compacting");
    progress.finish();
    let ended = export_progress(&[progress.report()]).unwrap();
    assert_eq!((ended.phase.as_str(), ended.rows), ("Complete", 3000));
    assert_eq!(ended.percent.as_deref(), Some("100%"));
}
