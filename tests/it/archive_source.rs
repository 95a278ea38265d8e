//! The archive source (laredo §8, rules C1–C5) against local and in-memory archives.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use larch::archive::error::{ArchiveError, Result as AResult};
use larch::archive::format::Format;
use larch::archive::model::{Action, TableId};
use larch::archive::reader::ArchiveReader;
use larch::archive::store::local::LocalStore;
use larch::archive::store::memory::MemoryStore;
use larch::archive::store::{GetResult, ObjectInfo, ObjectReader, ObjectWriter, Store};
use larch::source::archive::{ArchiveReplayOptions, ArchiveReplaySource};
use larch::source::{SourceError, SourceEvent, SourceState, SyncSource};
use tokio::sync::mpsc;

use crate::archive_build::{TestArchive, refs, rows};

fn table() -> TableId {
    TableId::new("public", "t")
}

fn source(store: Arc<dyn Store>, prefix: &str, follow: bool) -> ArchiveReplaySource {
    let reader = ArchiveReader::new(store, prefix, vec![Format::Jsonl]).unwrap();
    let mut o = ArchiveReplayOptions::new("seed", table());
    o.follow = follow;
    o.poll_interval = Duration::from_millis(50);
    ArchiveReplaySource::new(reader, o)
}

async fn baseline(src: &ArchiveReplaySource) -> (BTreeSet<String>, String) {
    let (tx, mut rx) = mpsc::channel(16);
    let collect = tokio::spawn(async move {
        let mut got = BTreeSet::new();
        while let Some((_, r)) = rx.recv().await {
            let r: larch::archive::value::Row = r;
            assert!(got.insert(r.as_str().to_string()), "row sent twice: {r:?}");
        }
        got
    });
    let pos = src.baseline(&[table()], tx).await.unwrap();
    (collect.await.unwrap(), pos)
}

fn set(v: &[&str]) -> BTreeSet<String> {
    v.iter()
        .map(|r| {
            larch::archive::value::Row::parse(r)
                .unwrap()
                .as_str()
                .to_string()
        })
        .collect()
}

async fn next_event(rx: &mut mpsc::Receiver<SourceEvent>) -> SourceEvent {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("an event within 10 s")
        .expect("stream open")
}

#[tokio::test]
async fn baseline_is_the_folded_head_and_equals_reconstruct() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mut a = TestArchive::new(store.clone(), "public.t/", "public.t");
    let snap = rows(1..=5, "s");
    a.snapshot("0/10", &refs(&snap)).await;
    a.diff(
        "0/10",
        "0/20",
        &[
            (Action::Delete, Some(r#"{"id":1,"v":"s-1"}"#), None),
            (
                Action::Update,
                Some(r#"{"id":2,"v":"s-2"}"#),
                Some(r#"{"id":22,"v":"moved"}"#),
            ),
            (Action::Insert, None, Some(r#"{"id":6,"v":"new"}"#)),
            (Action::Update, None, Some(r#"{"id":3,"v":"changed"}"#)),
        ],
    )
    .await;
    a.diff(
        "0/20",
        "0/30",
        &[
            (Action::Insert, None, Some(r#"{"id":6,"v":"again"}"#)),
            (Action::Delete, Some(r#"{"id":999}"#), None),
        ],
    )
    .await;
    let src = source(store.clone(), "public.t/", false);
    let cols = src.init(&[table()]).await.unwrap();
    assert_eq!(cols[&table()].len(), 2, "inferred from the first row");
    let (got, pos) = baseline(&src).await;
    assert_eq!(pos, "0/30");
    let want = set(&[
        r#"{"id":3,"v":"changed"}"#,
        r#"{"id":4,"v":"s-4"}"#,
        r#"{"id":5,"v":"s-5"}"#,
        r#"{"id":22,"v":"moved"}"#,
        r#"{"id":6,"v":"again"}"#,
    ]);
    assert_eq!(got, want);
    // Same as the reader's reconstruction.
    let reader = ArchiveReader::new(store, "public.t/", vec![Format::Jsonl]).unwrap();
    let (_, folded) = reader.reconstruct_at(None, &[]).await.unwrap();
    let rec: BTreeSet<String> = folded
        .rows
        .values()
        .map(|r| r.as_str().to_string())
        .collect();
    assert_eq!(got, rec);

    // A TRUNCATE in the chain hides every snapshot row.
    a.diff(
        "0/30",
        "0/40",
        &[
            (Action::Insert, None, Some(r#"{"id":7,"v":"after"}"#)),
            (Action::Truncate, None, None),
        ],
    )
    .await;
    let (got, pos) = baseline(&src).await;
    assert_eq!(pos, "0/40");
    assert_eq!(got, set(&[r#"{"id":7,"v":"after"}"#]));
}

#[tokio::test]
async fn laredo_fixtures_baseline_like_the_reader() {
    for (name, dir, case) in crate::fixtures::cases() {
        if case.get("expect_error").is_some() {
            continue;
        }
        let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir.join("archive")).unwrap());
        let formats: Vec<Format> = case["formats"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| Format::parse(f.as_str().unwrap()).unwrap())
            .collect();
        let prefix = case["key_prefix"].as_str().unwrap();
        let key_fields: Vec<String> = case["key_fields"]
            .as_array()
            .map(|a| a.iter().map(|k| k.as_str().unwrap().to_string()).collect())
            .unwrap_or_default();
        let reader = ArchiveReader::new(store, prefix, formats).unwrap();
        let mut o = ArchiveReplayOptions::new("fx", table());
        o.key_fields = key_fields.clone();
        let src = ArchiveReplaySource::new(reader.clone(), o);
        src.init(&[table()]).await.unwrap();
        let (got, pos) = baseline(&src).await;
        let (m, folded) = reader.reconstruct_at(None, &key_fields).await.unwrap();
        let want: BTreeSet<String> = folded
            .rows
            .values()
            .map(|r| r.as_str().to_string())
            .collect();
        assert_eq!(got, want, "{name}");
        assert_eq!(pos, folded.position, "{name}");
        // One-shot replay at the head: the stream ends at once, without events.
        let (tx, mut rx) = mpsc::channel(8);
        src.stream(&pos, tx).await.unwrap();
        assert!(rx.recv().await.is_none(), "{name}: no events at the head");
        assert!(src.info().head.as_deref() == Some(m.head_position.as_str()));
    }
}

#[tokio::test]
async fn stream_replays_diffs_with_checkpoints_then_follows_appends() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()).unwrap());
    let mut a = TestArchive::new(store.clone(), "public.t/", "public.t");
    a.snapshot("0/10", &refs(&rows(1..=3, "s"))).await;
    a.diff(
        "0/10",
        "0/20",
        &[
            (Action::Insert, None, Some(r#"{"id":4,"v":"x"}"#)),
            (Action::Truncate, None, None),
        ],
    )
    .await;
    let src = Arc::new(source(store.clone(), "public.t/", true));
    let (tx, mut rx) = mpsc::channel(8);
    let s2 = src.clone();
    let task = tokio::spawn(async move { s2.stream("0/10", tx).await });
    // R5: the TRUNCATE comes first, then the insert; then the checkpoint.
    let e1 = next_event(&mut rx).await;
    assert!(
        matches!(&e1, SourceEvent::Change(c) if c.action == Action::Truncate && c.position == "0/20")
    );
    let e2 = next_event(&mut rx).await;
    assert!(
        matches!(&e2, SourceEvent::Change(c) if c.action == Action::Insert && c.new.as_ref().unwrap().as_str() == r#"{"id":4,"v":"x"}"#)
    );
    assert_eq!(
        next_event(&mut rx).await,
        SourceEvent::Checkpoint {
            position: "0/20".into()
        }
    );
    assert_eq!(src.state(), SourceState::Streaming);
    // Follow: an appended diff shows up.
    a.diff(
        "0/20",
        "0/30",
        &[(
            Action::Update,
            Some(r#"{"id":4,"v":"x"}"#),
            Some(r#"{"id":4,"v":"y"}"#),
        )],
    )
    .await;
    let e = next_event(&mut rx).await;
    let SourceEvent::Change(c) = e else {
        panic!("{e:?}")
    };
    assert_eq!(c.action, Action::Update);
    assert_eq!(c.old.unwrap().as_str(), r#"{"id":4,"v":"x"}"#);
    assert_eq!(c.position, "0/30");
    assert!(
        matches!(next_event(&mut rx).await, SourceEvent::Checkpoint { position } if position == "0/30")
    );
    assert_eq!(src.info().position.as_deref(), Some("0/30"));
    // Lag = now - updated_at of the last manifest read.
    let lag = src.lag().time.expect("lag after a manifest read");
    assert!(lag < Duration::from_secs(5), "{lag:?}");
    src.close().await;
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("close ends the stream")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn replacement_requires_a_rebaseline_whatever_the_position_order() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mut a = TestArchive::new(store.clone(), "", "public.t");
    a.snapshot("0/100", &refs(&rows(1..=3, "s"))).await;
    let src = Arc::new(source(store.clone(), "", true));
    let (_, pos) = baseline(&src).await;
    assert_eq!(pos, "0/100");
    for (label, new_pos) in [("higher", "0/200"), ("lower", "0/50")] {
        a.replace(new_pos, &refs(&rows(10..=12, label))).await;
        let (tx, _rx) = mpsc::channel(8);
        let r = tokio::time::timeout(Duration::from_secs(10), src.stream(&pos, tx))
            .await
            .expect("noticed within 10 s");
        assert!(
            matches!(r, Err(SourceError::ReBaselineRequired(_))),
            "{label}: {r:?}"
        );
        a.replace("0/100", &refs(&rows(1..=3, "s"))).await;
        // Re-establish our epoch at 0/100.
        baseline(&src).await;
    }
    // A new epoch at exactly our position from another lineage (its chain passes by us).
    a.manifest.artifacts.clear();
    a.snapshot("0/40", &refs(&rows(1..=1, "z"))).await;
    a.diff("0/40", "0/100", &[]).await;
    // 0/100 is the end of the new epoch's chain: same lineage, nothing to do.
    let (tx, mut rx) = mpsc::channel(8);
    let s2 = src.clone();
    let t = tokio::spawn(async move { s2.stream("0/100", tx).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(rx.try_recv().is_err());
    src.close().await;
    t.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_missing_manifest_is_waited_for_while_following() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()).unwrap());
    let src = Arc::new(source(store.clone(), "public.t/", true));
    let s2 = src.clone();
    let b = tokio::spawn(async move {
        let cols = s2.init(&[table()]).await.unwrap();
        assert_eq!(
            cols[&table()].len(),
            2,
            "columns of the archive once it exists"
        );
        baseline(&s2).await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!b.is_finished(), "init and baseline wait for the archive");
    let mut a = TestArchive::new(store.clone(), "public.t/", "public.t");
    a.snapshot("0/1", &refs(&rows(1..=2, "s"))).await;
    let (got, pos) = tokio::time::timeout(Duration::from_secs(10), b)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(pos, "0/1");
    assert_eq!(got.len(), 2);
    // Not following: a missing archive is an error naming the manifest key.
    let src = source(store, "nope/", false);
    let e = src.init(&[table()]).await.unwrap_err();
    assert!(format!("{e:#}").contains("nope/manifest.json"), "{e:#}");
}

#[tokio::test]
async fn pause_holds_appends_until_resume() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mut a = TestArchive::new(store.clone(), "", "public.t");
    a.snapshot("0/1", &refs(&rows(1..=1, "s"))).await;
    let src = Arc::new(source(store.clone(), "", true));
    baseline(&src).await;
    let (tx, mut rx) = mpsc::channel(8);
    let s2 = src.clone();
    let t = tokio::spawn(async move { s2.stream("0/1", tx).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    src.pause();
    assert_eq!(src.state(), SourceState::Paused);
    tokio::time::sleep(Duration::from_millis(100)).await;
    a.diff("0/1", "0/2", &[(Action::Insert, None, Some(r#"{"id":2}"#))])
        .await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(rx.try_recv().is_err(), "nothing while paused");
    src.resume();
    assert_eq!(src.state(), SourceState::Streaming);
    assert!(matches!(next_event(&mut rx).await, SourceEvent::Change(c) if c.position == "0/2"));
    src.close().await;
    assert_eq!(src.state(), SourceState::Closed);
    t.await.unwrap().unwrap();
}

#[tokio::test]
async fn ack_writes_the_state_file_and_resume_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let reader = ArchiveReader::new(store, "", vec![Format::Jsonl]).unwrap();
    let mut o = ArchiveReplayOptions::new("seed", table());
    o.state_path = Some(dir.path().join("state/dir/seed.pos"));
    let src = ArchiveReplaySource::new(reader.clone(), o.clone());
    assert!(src.supports_resume());
    assert_eq!(src.last_acked_position().await.unwrap(), None);
    src.ack("0/16B3748").await.unwrap();
    assert_eq!(
        std::fs::read(dir.path().join("state/dir/seed.pos")).unwrap(),
        b"0/16B3748"
    );
    let again = ArchiveReplaySource::new(reader.clone(), o);
    assert_eq!(
        again.last_acked_position().await.unwrap().as_deref(),
        Some("0/16B3748")
    );
    let plain = ArchiveReplaySource::new(reader, ArchiveReplayOptions::new("x", table()));
    assert!(!plain.supports_resume());
    assert_eq!(plain.last_acked_position().await.unwrap(), None);
}

#[tokio::test]
async fn columns_come_from_the_manifest_or_the_first_row() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mut a = TestArchive::new(store.clone(), "", "public.t");
    a.snapshot("0/1", &[r#"{"z":1,"id":1,"a":"x"}"#]).await;
    let reader = ArchiveReader::new(store.clone(), "", vec![Format::Jsonl]).unwrap();
    let mut o = ArchiveReplayOptions::new("seed", table());
    o.key_fields = vec!["id".into()];
    let src = ArchiveReplaySource::new(reader.clone(), o);
    let cols = src
        .init(&[table()])
        .await
        .unwrap()
        .remove(&table())
        .unwrap();
    let names: Vec<&str> = cols.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["a", "id", "z"]);
    assert!(cols[1].primary_key && !cols[0].primary_key);
    let bad = src
        .validate_tables(&[table(), TableId::new("public", "u")])
        .await;
    assert_eq!(bad.len(), 1);
    assert_eq!(bad[0].code, "TABLE_NOT_SERVED");
    // Recorded columns win.
    a.manifest.columns = vec![larch::archive::model::ColumnDefinition {
        name: "id".into(),
        type_name: "int8".into(),
        primary_key: true,
        ..Default::default()
    }];
    a.commit().await;
    let cols = src
        .init(&[table()])
        .await
        .unwrap()
        .remove(&table())
        .unwrap();
    assert_eq!(cols.len(), 1);
    assert_eq!(cols[0].type_name, "int8");
}

/// A store whose `get` fails with a transient error `failures` times first.
#[derive(Debug)]
struct Flaky {
    inner: MemoryStore,
    failures: AtomicU32,
}

#[async_trait]
impl Store for Flaky {
    fn name(&self) -> String {
        "flaky".into()
    }
    fn uri(&self, key: &str) -> String {
        self.inner.uri(key)
    }
    async fn get(&self, key: &str) -> AResult<Option<GetResult>> {
        if self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(ArchiveError::storage(key, "connection reset (injected)"));
        }
        self.inner.get(key).await
    }
    async fn open(&self, key: &str) -> AResult<Option<ObjectReader>> {
        self.inner.open(key).await
    }
    async fn create(&self, key: &str) -> AResult<Box<dyn ObjectWriter>> {
        self.inner.create(key).await
    }
    async fn put_cas(&self, key: &str, bytes: Bytes, expected: &str) -> AResult<String> {
        self.inner.put_cas(key, bytes, expected).await
    }
    async fn delete(&self, key: &str) -> AResult<()> {
        self.inner.delete(key).await
    }
    async fn list(&self, prefix: &str) -> AResult<Vec<ObjectInfo>> {
        self.inner.list(prefix).await
    }
}

#[tokio::test]
async fn transient_storage_errors_are_retried_while_following() {
    let mem = MemoryStore::new();
    let flaky = Arc::new(Flaky {
        inner: mem.clone(),
        failures: AtomicU32::new(0),
    });
    let mut a = TestArchive::new(Arc::new(mem), "", "public.t");
    a.snapshot("0/1", &refs(&rows(1..=2, "s"))).await;
    let src = Arc::new(source(flaky.clone(), "", true));
    baseline(&src).await;
    let (tx, mut rx) = mpsc::channel(8);
    let s2 = src.clone();
    let t = tokio::spawn(async move { s2.stream("0/1", tx).await });
    flaky.failures.store(4, Ordering::SeqCst);
    a.diff("0/1", "0/2", &[(Action::Insert, None, Some(r#"{"id":3}"#))])
        .await;
    assert!(matches!(next_event(&mut rx).await, SourceEvent::Change(c) if c.position == "0/2"));
    assert_eq!(flaky.failures.load(Ordering::SeqCst), 0, "errors were hit");
    assert!(!t.is_finished());
    src.close().await;
    t.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_compaction_epoch_on_our_chain_is_followed_without_a_rebaseline() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mut a = TestArchive::new(store.clone(), "", "public.t");
    a.snapshot("0/10", &refs(&rows(1..=3, "s"))).await;
    a.diff(
        "0/10",
        "0/20",
        &[(Action::Insert, None, Some(r#"{"id":4}"#))],
    )
    .await;
    let src = Arc::new(source(store.clone(), "", true));
    let (_, pos) = baseline(&src).await;
    assert_eq!(pos, "0/20");
    let lagging = Arc::new(source(store.clone(), "", true));
    // The writer compacts: a new epoch's snapshot at the head, then diffs from it.
    a.snapshot("0/20", &refs(&rows(1..=4, "s"))).await;
    a.diff(
        "0/20",
        "0/30",
        &[(Action::Delete, Some(r#"{"id":1}"#), None)],
    )
    .await;
    for (s, from) in [(src, "0/20"), (lagging, "0/10")] {
        let (tx, mut rx) = mpsc::channel(8);
        let s2 = s.clone();
        let from = from.to_string();
        let t = tokio::spawn(async move { s2.stream(&from, tx).await });
        let mut last = None;
        while last.as_deref() != Some("0/30") {
            if let SourceEvent::Checkpoint { position } = next_event(&mut rx).await {
                last = Some(position);
            }
        }
        s.close().await;
        t.await.unwrap().unwrap();
        assert_eq!(s.info().epoch, Some(2));
    }
}

/// Issue 13: a diff chain that stops before the head. The baseline is the state the chain
/// reaches and is reported as short (never passed off as the head); following waits at its end
/// instead of re-baselining in a loop, until a new epoch replaces the archive (C1).
#[tokio::test]
async fn a_chain_short_of_the_head_is_reported_and_followed_without_a_rebaseline_loop() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mut a = TestArchive::new(store.clone(), "public.t/", "public.t");
    let snap = rows(1..=3, "s");
    a.snapshot("0/10", &refs(&snap)).await;
    a.diff(
        "0/10",
        "0/20",
        &[(Action::Insert, None, Some(r#"{"id":4,"v":"d"}"#))],
    )
    .await;
    // 0/20 -> 0/30 is missing.
    a.diff(
        "0/30",
        "0/40",
        &[(Action::Insert, None, Some(r#"{"id":5,"v":"d"}"#))],
    )
    .await;
    let src = Arc::new(source(store.clone(), "public.t/", true));
    src.init(&[table()]).await.unwrap();
    let (got, position) = baseline(&src).await;
    assert_eq!(position, "0/20");
    assert_eq!(got.len(), 4, "the state the chain reaches: {got:?}");
    let short = src.info().short_chain.expect("reported as short");
    assert_eq!(
        (short.reached.as_str(), short.head.as_str()),
        ("0/20", "0/40")
    );
    assert!(short.reason.contains("no diff starts at 0/20"), "{short:?}");

    let (tx, mut rx) = mpsc::channel(16);
    let following = src.clone();
    let stream = tokio::spawn(async move { following.stream(&position, tx).await });
    // Several polls (50 ms each) pass without an event or a re-baseline.
    assert!(
        tokio::time::timeout(Duration::from_millis(500), rx.recv())
            .await
            .is_err(),
        "nothing to deliver past the end of the chain"
    );
    assert!(
        !stream.is_finished(),
        "no re-baseline while the chain is short"
    );
    assert!(src.info().short_chain.is_some());
    // A new epoch replaces the archive: now the source asks for a re-baseline.
    a.replace("0/50", &refs(&rows(1..=6, "n"))).await;
    let err = tokio::time::timeout(Duration::from_secs(10), stream)
        .await
        .expect("the stream ends")
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, SourceError::ReBaselineRequired(_)), "{err}");
    let (got, position) = baseline(&src).await;
    assert_eq!((got.len(), position.as_str()), (6, "0/50"));
    assert_eq!(src.info().short_chain, None);
}
