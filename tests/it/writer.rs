//! The archive writer: round trips, policy triggers, collapse rules, CAS, restart, retention.

use std::sync::Arc;
use std::time::Duration;

use larch::archive::error::ArchiveError;
use larch::archive::format::Format;
use larch::archive::manifest::ArtifactKind;
use larch::archive::model::{Action, ColumnDefinition};
use larch::archive::policy::EpochTrigger;
use larch::archive::reader::ArchiveReader;
use larch::archive::store::Store;
use larch::archive::store::local::LocalStore;
use larch::archive::store::memory::MemoryStore;
use larch::archive::value::Row;
use larch::archive::verify::verify;
use larch::archive::writer::{ArchiveWriter, FlushOutcome, WriterConfig};
use tokio::sync::mpsc;

pub fn row(text: &str) -> Row {
    Row::parse(text).unwrap()
}

pub fn rows_channel(rows: Vec<Row>) -> mpsc::Receiver<Row> {
    let (tx, rx) = mpsc::channel(rows.len().max(1));
    for r in rows {
        tx.try_send(r).unwrap();
    }
    rx
}

fn config(formats: Vec<Format>) -> WriterConfig {
    let mut c = WriterConfig::new("public.items", "public.items/");
    c.snapshot_formats = formats.clone();
    c.diff_formats = formats;
    c.policy.diff_interval = Duration::from_millis(10);
    c
}

fn pk_columns() -> Vec<ColumnDefinition> {
    vec![
        ColumnDefinition {
            name: "id".into(),
            type_name: "int8".into(),
            primary_key: true,
            primary_key_ordinal: 1,
            ordinal_position: 1,
            ..Default::default()
        },
        ColumnDefinition {
            name: "name".into(),
            type_name: "text".into(),
            nullable: true,
            ordinal_position: 2,
            ..Default::default()
        },
    ]
}

/// Every object key of the test archive's prefix.
async fn keys(store: &dyn Store) -> Vec<String> {
    store
        .list("public.items/")
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect()
}

async fn folded(store: Arc<dyn Store>, formats: Vec<Format>) -> (String, Vec<String>) {
    let reader = ArchiveReader::new(store, "public.items/", formats).unwrap();
    let (_, f) = reader.reconstruct_at(None, &[]).await.unwrap();
    let mut rows: Vec<String> = f.rows.values().map(|r| r.as_str().to_string()).collect();
    rows.sort();
    (f.position, rows)
}

#[tokio::test]
async fn round_trip_in_every_format() {
    for formats in [
        vec![Format::Jsonl],
        vec![Format::Protobuf],
        vec![Format::JsonlZstd],
        vec![Format::Jsonl, Format::Protobuf],
    ] {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let mut w = ArchiveWriter::open(vec![store.clone()], config(formats.clone()))
            .await
            .unwrap();
        w.set_columns(pk_columns());
        let snap = w
            .write_snapshot(
                "0/10",
                rows_channel(vec![
                    row(r#"{"id":1,"name":"a"}"#),
                    row(r#"{"id":2,"name":"b"}"#),
                    row(r#"{"id":1234567,"name":"big"}"#),
                ]),
            )
            .await
            .unwrap();
        assert_eq!(snap.epoch, 1);
        assert_eq!(snap.row_count, 3);
        w.record(
            Action::Update,
            Some(row(r#"{"id":2,"name":"b"}"#)),
            Some(row(r#"{"id":2,"name":"b2"}"#)),
        )
        .unwrap();
        w.record(Action::Delete, Some(row(r#"{"id":1,"name":"a"}"#)), None)
            .unwrap();
        w.record(Action::Insert, None, Some(row(r#"{"id":3,"name":"c"}"#)))
            .unwrap();
        w.record(
            Action::Update,
            None,
            Some(row(r#"{"id":1234567,"name":"bigger"}"#)),
        )
        .unwrap();
        let FlushOutcome::Diff {
            artifact: d,
            new_epoch: None,
        } = w.flush("0/20").await.unwrap()
        else {
            panic!("expected a diff")
        };
        assert_eq!(d.change_count, 4);
        assert_eq!(d.from_position.as_deref(), Some("0/10"));
        assert_eq!(w.flush("0/30").await.unwrap(), FlushOutcome::Idle);
        let (pos, rows) = folded(store.clone(), formats.clone()).await;
        assert_eq!(pos, "0/20");
        assert_eq!(
            rows,
            vec![
                r#"{"id":1234567,"name":"bigger"}"#,
                r#"{"id":2,"name":"b2"}"#,
                r#"{"id":3,"name":"c"}"#
            ],
            "formats {formats:?}"
        );
        let reader = ArchiveReader::new(store.clone(), "public.items/", formats.clone()).unwrap();
        let (_, report) = verify(&reader).await.unwrap();
        assert!(report.problems.is_empty(), "{:?}", report.problems);
    }
}

#[tokio::test]
async fn jsonl_keeps_every_digit_and_stores_laredo_keys() {
    let store = MemoryStore::new();
    let mut w = ArchiveWriter::open(vec![Arc::new(store.clone())], config(vec![Format::Jsonl]))
        .await
        .unwrap();
    w.write_snapshot("0/1", rows_channel(vec![])).await.unwrap();
    w.record(
        Action::Insert,
        None,
        Some(row(r#"{"id":1234567,"amount":12345678901234567890.123}"#)),
    )
    .unwrap();
    w.flush("0/2").await.unwrap();
    let diff_key = store
        .keys()
        .into_iter()
        .find(|k| k.contains("diff-"))
        .unwrap();
    let text =
        String::from_utf8(store.get(&diff_key).await.unwrap().unwrap().bytes.to_vec()).unwrap();
    assert_eq!(
        text,
        "{\"action\":\"INSERT\",\"key\":\"1.234567e+06\",\"new\":{\"amount\":12345678901234567890.123,\"id\":1234567}}\n"
    );
}

#[tokio::test]
async fn truncate_is_written_first_and_key_changes_become_delete_insert() {
    let store = MemoryStore::new();
    let mut w = ArchiveWriter::open(vec![Arc::new(store.clone())], config(vec![Format::Jsonl]))
        .await
        .unwrap();
    w.write_snapshot(
        "0/1",
        rows_channel(vec![row(r#"{"id":1}"#), row(r#"{"id":5}"#)]),
    )
    .await
    .unwrap();
    w.record(
        Action::Update,
        Some(row(r#"{"id":5}"#)),
        Some(row(r#"{"id":6}"#)),
    )
    .unwrap();
    w.flush("0/2").await.unwrap();
    w.record(Action::Insert, None, Some(row(r#"{"id":0}"#)))
        .unwrap();
    w.record(Action::Truncate, None, None).unwrap();
    w.record(Action::Insert, None, Some(row(r#"{"id":9}"#)))
        .unwrap();
    w.flush("0/3").await.unwrap();
    let keys = store.keys();
    let d1 = keys.iter().find(|k| k.contains("diff-0_1-")).unwrap();
    let t1 = String::from_utf8(store.get(d1).await.unwrap().unwrap().bytes.to_vec()).unwrap();
    let actions: Vec<&str> = t1
        .lines()
        .map(|l| {
            if l.contains("DELETE") {
                "DELETE"
            } else {
                "INSERT"
            }
        })
        .collect();
    assert_eq!(actions, vec!["DELETE", "INSERT"], "{t1}");
    let d2 = keys.iter().find(|k| k.contains("diff-0_2-")).unwrap();
    let t2 = String::from_utf8(store.get(d2).await.unwrap().unwrap().bytes.to_vec()).unwrap();
    assert!(t2.lines().next().unwrap().contains("\"TRUNCATE\""), "{t2}");
    assert_eq!(
        t2.lines().count(),
        2,
        "the insert before the truncate is gone: {t2}"
    );
    let (_, rows) = folded(Arc::new(store), vec![Format::Jsonl]).await;
    assert_eq!(rows, vec![r#"{"id":9}"#]);
}

#[tokio::test]
async fn policy_triggers_commit_the_diff_then_compact_without_breaking_followers() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mut c = config(vec![Format::Jsonl]);
    c.policy.max_churn_records = 3;
    let mut w = ArchiveWriter::open(vec![store.clone()], c).await.unwrap();
    w.set_columns(pk_columns());
    w.write_snapshot(
        "0/1",
        rows_channel(vec![
            row(r#"{"id":1,"name":"a"}"#),
            row(r#"{"id":2,"name":"b"}"#),
        ]),
    )
    .await
    .unwrap();
    w.record(Action::Insert, None, Some(row(r#"{"id":3,"name":"c"}"#)))
        .unwrap();
    w.record(Action::Delete, Some(row(r#"{"id":1,"name":"a"}"#)), None)
        .unwrap();
    w.record(
        Action::Update,
        Some(row(r#"{"id":2,"name":"b"}"#)),
        Some(row(r#"{"id":22,"name":"b moved"}"#)),
    )
    .unwrap();
    let FlushOutcome::Diff {
        artifact,
        new_epoch,
    } = w.flush("0/2").await.unwrap()
    else {
        panic!("a diff")
    };
    assert_eq!(new_epoch, Some(EpochTrigger::MaxChurnRecords));
    assert_eq!(artifact.epoch, 1);
    let snap = w.compact().await.unwrap();
    assert_eq!(
        (snap.epoch, snap.to_position.as_str(), snap.row_count),
        (2, "0/2", 2)
    );
    let (pos, rows) = folded(store.clone(), vec![Format::Jsonl]).await;
    assert_eq!(pos, "0/2");
    assert_eq!(
        rows,
        vec![r#"{"id":22,"name":"b moved"}"#, r#"{"id":3,"name":"c"}"#]
    );
    // A follower at the old head walks the diff into the new epoch: no re-baseline.
    let plan = larch::archive::plan::plan(w.manifest(), "0/1").unwrap();
    assert!(plan.snapshot.is_none() && plan.diffs.len() == 1);
    w.record(Action::Insert, None, Some(row(r#"{"id":4,"name":"d"}"#)))
        .unwrap();
    let FlushOutcome::Diff {
        artifact,
        new_epoch: None,
    } = w.flush("0/3").await.unwrap()
    else {
        panic!()
    };
    assert_eq!(
        (artifact.epoch, artifact.from_position.as_deref()),
        (2, Some("0/2"))
    );
    let plan = larch::archive::plan::plan(w.manifest(), "0/1").unwrap();
    assert_eq!(
        plan.diffs.len(),
        2,
        "the old chain continues into the new epoch"
    );

    let mut c = config(vec![Format::Jsonl]);
    c.policy.max_diff_bytes = 10;
    let mut w = ArchiveWriter::open(vec![Arc::new(MemoryStore::new())], c)
        .await
        .unwrap();
    w.write_snapshot("0/1", rows_channel(vec![])).await.unwrap();
    w.record(Action::Insert, None, Some(row(r#"{"id":1}"#)))
        .unwrap();
    assert!(matches!(
        w.flush("0/2").await.unwrap(),
        FlushOutcome::Diff {
            new_epoch: Some(EpochTrigger::MaxDiffBytes),
            ..
        }
    ));

    let mut c = config(vec![Format::Jsonl]);
    c.policy.max_interval = Duration::from_millis(1);
    let mut w = ArchiveWriter::open(vec![Arc::new(MemoryStore::new())], c)
        .await
        .unwrap();
    w.write_snapshot("0/1", rows_channel(vec![row(r#"{"id":1}"#)]))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(
        w.flush("0/1").await.unwrap(),
        FlushOutcome::SnapshotNeeded(EpochTrigger::MaxInterval),
        "fires on an idle table too"
    );
    let s = w.compact().await.unwrap();
    assert_eq!((s.epoch, s.row_count), (2, 1));
}

#[tokio::test]
async fn compaction_after_a_truncate_keeps_only_later_rows() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mut w = ArchiveWriter::open(vec![store.clone()], config(vec![Format::Protobuf]))
        .await
        .unwrap();
    w.write_snapshot(
        "0/1",
        rows_channel(vec![row(r#"{"id":1}"#), row(r#"{"id":2}"#)]),
    )
    .await
    .unwrap();
    w.record(Action::Truncate, None, None).unwrap();
    w.record(Action::Insert, None, Some(row(r#"{"id":5}"#)))
        .unwrap();
    w.flush("0/2").await.unwrap();
    let s = w.compact().await.unwrap();
    assert_eq!(s.row_count, 1);
    let (_, rows) = folded(store, vec![Format::Protobuf]).await;
    assert_eq!(rows, vec![r#"{"id":5}"#]);
}

#[tokio::test]
async fn diffs_need_an_advancing_valid_position() {
    let mut w = ArchiveWriter::open(
        vec![Arc::new(MemoryStore::new())],
        config(vec![Format::Jsonl]),
    )
    .await
    .unwrap();
    w.write_snapshot("0/5", rows_channel(vec![])).await.unwrap();
    w.record(Action::Insert, None, Some(row(r#"{"id":1}"#)))
        .unwrap();
    assert!(w.flush("0/5").await.is_err());
    assert!(w.flush("<nil>").await.is_err());
    assert!(matches!(
        w.flush("0/6").await.unwrap(),
        FlushOutcome::Diff { .. }
    ));
}

async fn two_writers_one_wins(store: Arc<dyn Store>) {
    let mut a = ArchiveWriter::open(vec![store.clone()], config(vec![Format::Jsonl]))
        .await
        .unwrap();
    let mut b = ArchiveWriter::open(vec![store.clone()], config(vec![Format::Jsonl]))
        .await
        .unwrap();
    let ra = a
        .write_snapshot("0/1", rows_channel(vec![row(r#"{"id":1}"#)]))
        .await;
    let rb = b
        .write_snapshot("0/2", rows_channel(vec![row(r#"{"id":2}"#)]))
        .await;
    assert!(ra.is_ok());
    assert!(
        matches!(rb, Err(ArchiveError::CasConflict { .. })),
        "{rb:?}"
    );
    assert!(b.manifest_changed_elsewhere().await.unwrap());
    // The loser left nothing behind.
    let objects = store.list("public.items/").await.unwrap();
    assert!(
        objects.iter().all(|o| !o.key.contains("snapshot-0_2")),
        "{objects:?}"
    );
    let (_, rows) = folded(store, vec![Format::Jsonl]).await;
    assert_eq!(rows, vec![r#"{"id":1}"#]);
}

#[tokio::test]
async fn two_writers_on_one_prefix_exactly_one_wins() {
    two_writers_one_wins(Arc::new(MemoryStore::new())).await;
    let dir = tempfile::tempdir().unwrap();
    two_writers_one_wins(Arc::new(LocalStore::new(dir.path()).unwrap())).await;
}

#[tokio::test]
async fn restart_continues_the_chain_from_the_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()).unwrap());
    {
        let mut w = ArchiveWriter::open(vec![store.clone()], config(vec![Format::Jsonl]))
            .await
            .unwrap();
        w.set_columns(pk_columns());
        w.write_snapshot("0/10", rows_channel(vec![row(r#"{"id":1,"name":"a"}"#)]))
            .await
            .unwrap();
        w.record(Action::Insert, None, Some(row(r#"{"id":2,"name":"b"}"#)))
            .unwrap();
        w.flush("0/20").await.unwrap();
    }
    let mut w = ArchiveWriter::open(vec![store.clone()], config(vec![Format::Jsonl]))
        .await
        .unwrap();
    assert_eq!(w.head(), "0/20");
    assert_eq!(w.epoch(), 1);
    assert_eq!(
        w.key_fields(),
        ["id"],
        "key fields come back from the manifest's columns"
    );
    w.record(Action::Update, None, Some(row(r#"{"id":1,"name":"a2"}"#)))
        .unwrap();
    let FlushOutcome::Diff { artifact: d, .. } = w.flush("0/30").await.unwrap() else {
        panic!()
    };
    assert_eq!(d.epoch, 1);
    assert_eq!(d.from_position.as_deref(), Some("0/20"));
    let (pos, rows) = folded(store, vec![Format::Jsonl]).await;
    assert_eq!(pos, "0/30");
    assert_eq!(
        rows,
        vec![r#"{"id":1,"name":"a2"}"#, r#"{"id":2,"name":"b"}"#]
    );
}

#[tokio::test]
async fn retention_deletes_pruned_objects() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()).unwrap());
    let mut c = config(vec![Format::Jsonl]);
    c.keep_epochs = 1;
    let mut w = ArchiveWriter::open(vec![store.clone()], c).await.unwrap();
    for epoch in 1..=3 {
        w.write_snapshot(
            &format!("0/{epoch}0"),
            rows_channel(vec![row(&format!(r#"{{"id":{epoch}}}"#))]),
        )
        .await
        .unwrap();
        w.record(Action::Insert, None, Some(row(r#"{"id":100}"#)))
            .unwrap();
        w.flush(&format!("0/{epoch}5")).await.unwrap();
    }
    assert!(w.manifest().artifacts.iter().all(|a| a.epoch == 3));
    let keys = keys(store.as_ref()).await;
    assert_eq!(
        keys,
        vec![
            "public.items/epoch=3/diff-0_30-0_35.jsonl",
            "public.items/epoch=3/snapshot-0_30.jsonl",
            "public.items/manifest.json"
        ],
    );
    assert!(
        w.manifest()
            .artifacts
            .iter()
            .any(|a| a.kind == ArtifactKind::Diff)
    );
}

#[tokio::test]
async fn a_failed_snapshot_leaves_nothing_and_the_manifest_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()).unwrap());
    let mut c = config(vec![Format::Protobuf]);
    c.key_fields = vec!["id".into()];
    let mut w = ArchiveWriter::open(vec![store.clone()], c).await.unwrap();
    w.write_snapshot("0/1", rows_channel(vec![row(r#"{"id":1}"#)]))
        .await
        .unwrap();
    let before = store
        .get("public.items/manifest.json")
        .await
        .unwrap()
        .unwrap()
        .bytes;
    // A record over laredo's 4 MiB protobuf limit makes the snapshot fail mid-stream.
    let huge = format!(r#"{{"id":2,"blob":"{}"}}"#, "x".repeat(5 << 20));
    let err = w
        .write_snapshot("0/2", rows_channel(vec![row(r#"{"id":1}"#), row(&huge)]))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("4 MiB"), "{err}");
    assert_eq!(
        store
            .get("public.items/manifest.json")
            .await
            .unwrap()
            .unwrap()
            .bytes,
        before
    );
    let keys: Vec<String> = store
        .list("")
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    assert_eq!(
        keys,
        vec![
            "public.items/epoch=1/snapshot-0_1.pb",
            "public.items/manifest.json"
        ]
    );
    let leftovers: Vec<_> = walk(dir.path())
        .into_iter()
        .filter(|p| p.contains(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

fn walk(p: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(p).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.path().display().to_string());
        }
    }
    out
}

#[tokio::test]
async fn a_writer_refuses_a_newer_manifest_and_another_tables_archive() {
    let store = MemoryStore::new();
    store.insert_raw(
        "public.items/manifest.json",
        r#"{"manifest_version":2,"table":"public.items"}"#,
    );
    let e = ArchiveWriter::open(vec![Arc::new(store.clone())], config(vec![Format::Jsonl]))
        .await
        .err()
        .unwrap();
    assert!(
        e.to_string().contains("unsupported manifest version"),
        "{e}"
    );
    store.insert_raw(
        "public.items/manifest.json",
        r#"{"manifest_version":1,"table":"public.other"}"#,
    );
    let e = ArchiveWriter::open(vec![Arc::new(store.clone())], config(vec![Format::Jsonl]))
        .await
        .err()
        .unwrap();
    assert!(e.to_string().contains("public.other"), "{e}");
    store.insert_raw("public.items/manifest.json", "{oops");
    let e = ArchiveWriter::open(vec![Arc::new(store)], config(vec![Format::Jsonl]))
        .await
        .err()
        .unwrap();
    assert!(e.to_string().contains("public.items/manifest.json"), "{e}");
}

#[tokio::test]
async fn on_seaweedfs_two_writers_one_wins_and_large_snapshots_stream_multipart() {
    let s3 = crate::support::seaweedfs::seaweedfs();
    let bucket = s3.new_bucket().await;
    let store: Arc<dyn Store> = Arc::new(s3.s3_store(&bucket, "archives/").await);
    two_writers_one_wins(store.clone()).await;

    // A snapshot larger than one 8 MiB part goes up as a multipart upload and reads back exactly.
    let bucket = s3.new_bucket().await;
    let store: Arc<dyn Store> = Arc::new(s3.s3_store(&bucket, "").await);
    let mut w = ArchiveWriter::open(vec![store.clone()], config(vec![Format::Jsonl]))
        .await
        .unwrap();
    let padding = "p".repeat(1000);
    let (tx, rx) = mpsc::channel(256);
    let producer = tokio::spawn(async move {
        for i in 0..20_000 {
            tx.send(row(&format!(r#"{{"id":{i},"pad":"{padding}"}}"#)))
                .await
                .unwrap();
        }
    });
    let snap = w.write_snapshot("0/100", rx).await.unwrap();
    producer.await.unwrap();
    assert!(
        snap.formats["jsonl"].size_bytes > 16 << 20,
        "{}",
        snap.formats["jsonl"].size_bytes
    );
    w.record(Action::Delete, Some(row(r#"{"id":7}"#)), None)
        .unwrap();
    w.flush("0/200").await.unwrap();
    let reader = ArchiveReader::new(store.clone(), "public.items/", vec![Format::Jsonl]).unwrap();
    let (_, f) = reader.reconstruct_at(None, &[]).await.unwrap();
    assert_eq!(f.rows.len(), 19_999);
    let (_, report) = verify(&reader).await.unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

/// W10 on one store: a writer opening an existing prefix sweeps objects of epochs the manifest
/// no longer lists once they are older than the manifest (by the store's clock), and nothing
/// else: not an unreferenced upload of a listed epoch, not a fresh object a writer may be about
/// to commit, not a file that is no artifact.
async fn sweep_on_open_deletes_only_orphans(store: Arc<dyn Store>) {
    use larch::archive::orphans::{STORE_TIME_RESOLUTION, Unreferenced, find_unreferenced};
    let mut c = config(vec![Format::Jsonl]);
    c.keep_epochs = 1;
    let mut w = ArchiveWriter::open(vec![store.clone()], c.clone())
        .await
        .unwrap();
    for epoch in 1..=2 {
        w.write_snapshot(
            &format!("0/{epoch}0"),
            rows_channel(vec![row(&format!(r#"{{"id":{epoch}}}"#))]),
        )
        .await
        .unwrap();
    }
    // What a writer killed at the wrong moment leaves behind.
    let orphan = "public.items/epoch=1/diff-0_10-0_15.jsonl";
    let listed = "public.items/epoch=2/diff-0_20-0_25.jsonl";
    let not_an_artifact = "public.items/epoch=1/README.txt";
    for k in [orphan, listed, not_an_artifact] {
        store.put(k, b"{}\n").await.unwrap();
    }
    // A commit in a later second (S3 times are whole seconds): the manifest is newer than those.
    tokio::time::sleep(STORE_TIME_RESOLUTION + Duration::from_secs(1)).await;
    w.record(Action::Insert, None, Some(row(r#"{"id":3}"#)))
        .unwrap();
    w.flush("0/30").await.unwrap();
    // Uploaded after the manifest: another writer may be committing it.
    let fresh = "public.items/epoch=3/snapshot-0_30.jsonl";
    store.put(fresh, b"{}\n").await.unwrap();
    drop(w);

    let manifest = ArchiveWriter::open(vec![store.clone()], c.clone())
        .await
        .unwrap()
        .manifest()
        .clone();
    let keys = keys(store.as_ref()).await;
    assert!(!keys.contains(&orphan.to_string()), "{keys:?}");
    for k in [listed, not_an_artifact, fresh] {
        assert!(keys.contains(&k.to_string()), "{k} kept: {keys:?}");
    }
    let left = find_unreferenced(store.as_ref(), "public.items/", &manifest, Duration::ZERO)
        .await
        .unwrap();
    let classes: Vec<(&str, Unreferenced)> =
        left.iter().map(|o| (o.key.as_str(), o.class)).collect();
    assert_eq!(
        classes,
        vec![
            (listed, Unreferenced::ListedEpoch),
            (fresh, Unreferenced::TooNew)
        ]
    );
    // The archive itself is untouched.
    assert_eq!(
        folded(store, vec![Format::Jsonl]).await.1,
        vec![r#"{"id":2}"#, r#"{"id":3}"#]
    );
}

#[tokio::test]
async fn a_writer_starting_on_a_prefix_sweeps_orphans_on_every_store() {
    let dir = tempfile::tempdir().unwrap();
    let s3 = crate::support::seaweedfs::seaweedfs();
    let bucket = s3.new_bucket().await;
    let stores: Vec<Arc<dyn Store>> = vec![
        Arc::new(MemoryStore::new()),
        Arc::new(LocalStore::new(dir.path()).unwrap()),
        Arc::new(s3.s3_store(&bucket, "sweep/").await),
    ];
    futures::future::join_all(stores.into_iter().map(sweep_on_open_deletes_only_orphans)).await;
}
