//! One conformance suite for every `SyncSource`: the PostgreSQL source (logical replication
//! on a real PostgreSQL 15, persistent slot) and the archive source (following an archive on
//! S3, a real SeaweedFS, with a state file). Written against the public trait only: what
//! `larch::source::SyncSource` promises, checked the same way for each.
//!
//! * `init` discovers the table's columns; `validate_tables` refuses a table it cannot serve,
//!   naming it.
//! * `baseline` sends every row once and returns a valid position.
//! * `stream(from)` delivers each transaction's (or diff's) changes in order, after `from`,
//!   then a checkpoint at their position; positions only grow.
//! * `pause` holds changes until `resume`; `close` ends the stream.
//! * `ack` is what `last_acked_position` answers, also in a new instance (a restart); a new
//!   stream from a delivered checkpoint re-delivers nothing up to it.
//! * When the history behind a position is gone, `stream` says a new baseline is required.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use larch::archive::format::Format;
use larch::archive::model::{Action, TableId};
use larch::archive::position;
use larch::archive::reader::ArchiveReader;
use larch::archive::store::Store;
use larch::source::archive::{ArchiveReplayOptions, ArchiveReplaySource};
use larch::source::postgres::{PostgresConfig, PostgresSource, SlotMode};
use larch::source::{ChangeEvent, SourceError, SourceEvent, SourceState, SyncSource};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::archive_build::{Ch, TestArchive};
use crate::support::postgres::{Database, new_database};
use crate::support::seaweedfs;

const WAIT: Duration = Duration::from_secs(30);

fn table() -> TableId {
    TableId::new("public", "items")
}

/// A transaction (PostgreSQL) or a diff (archive): `(action, id, name)`; the old row of an
/// update or delete is the row as it was.
type Txn = [(Action, i64, &'static str)];

/// One implementation under test.
#[async_trait]
trait Subject: Send + Sync {
    fn name(&self) -> &'static str;
    /// A source as a process start creates it (same slot or state file as before).
    fn source(&self) -> Arc<dyn SyncSource>;
    /// Commits one transaction (one diff) of changes to what the source reads.
    async fn commit(&mut self, txn: &Txn);
    /// Makes the history behind every delivered position disappear (the slot dropped, the
    /// archive replaced by a new epoch). Called with no source running.
    async fn lose_history(&mut self);
}

struct Postgres {
    db: Database,
    config: PostgresConfig,
}

impl Postgres {
    async fn new() -> Postgres {
        let db = new_database().await;
        db.client
            .batch_execute(
                "CREATE TABLE items (id int8 PRIMARY KEY, name text NOT NULL);
                 INSERT INTO items VALUES (1, 'a1'), (2, 'a2'), (3, 'a3');",
            )
            .await
            .unwrap();
        let slot = format!("larch_{}_items", db.name);
        let mut config = PostgresConfig::new(db.dsn.clone(), vec![table()], slot.clone(), slot);
        config.slot_mode = SlotMode::Persistent;
        config.reconnect.initial = Duration::from_millis(100);
        config.reconnect.max = Duration::from_secs(1);
        Postgres { db, config }
    }
}

#[async_trait]
impl Subject for Postgres {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn source(&self) -> Arc<dyn SyncSource> {
        Arc::new(PostgresSource::new(self.config.clone()))
    }

    async fn commit(&mut self, txn: &Txn) {
        let mut sql = String::from("BEGIN;");
        for (action, id, name) in txn {
            sql += &match action {
                Action::Insert => format!("INSERT INTO items VALUES ({id}, '{name}');"),
                Action::Update => format!("UPDATE items SET name = '{name}' WHERE id = {id};"),
                Action::Delete => format!("DELETE FROM items WHERE id = {id};"),
                Action::Truncate => "TRUNCATE items;".into(),
            };
        }
        sql += "COMMIT;";
        self.db.client.batch_execute(&sql).await.unwrap();
    }

    async fn lose_history(&mut self) {
        let slot = self.config.slot_name.clone();
        // A closed walsender ends asynchronously: retry while the slot is still active.
        for _ in 0..100 {
            match self
                .db
                .client
                .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
                .await
            {
                Ok(_) => return,
                Err(e) if format!("{e:?}").contains("is active") => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                Err(e) => panic!("dropping slot {slot}: {e:?}"),
            }
        }
        panic!("slot {slot} stayed active");
    }
}

struct Archive {
    archive: TestArchive,
    store: Arc<dyn Store>,
    state_dir: tempfile::TempDir,
    /// The current row of each id, for the old rows of updates and deletes.
    rows: std::collections::BTreeMap<i64, String>,
    next_position: u64,
}

impl Archive {
    async fn new() -> Archive {
        let bucket = seaweedfs().new_bucket().await;
        let store: Arc<dyn Store> = Arc::new(seaweedfs().s3_store(&bucket, "suite").await);
        let mut archive = TestArchive::new(store.clone(), "public.items/", "public.items")
            .with_columns(crate::archive_build::id_name_columns());
        let rows: std::collections::BTreeMap<i64, String> = (1..=3)
            .map(|id| (id, format!(r#"{{"id":{id},"name":"a{id}"}}"#)))
            .collect();
        let texts: Vec<&str> = rows.values().map(String::as_str).collect();
        archive.snapshot("0/100", &texts).await;
        Archive {
            archive,
            store,
            state_dir: tempfile::tempdir().unwrap(),
            rows,
            next_position: 0x200,
        }
    }
}

#[async_trait]
impl Subject for Archive {
    fn name(&self) -> &'static str {
        "archive"
    }

    fn source(&self) -> Arc<dyn SyncSource> {
        let reader =
            ArchiveReader::new(self.store.clone(), "public.items/", vec![Format::Jsonl]).unwrap();
        let mut o = ArchiveReplayOptions::new("suite", table());
        o.follow = true;
        o.poll_interval = Duration::from_millis(50);
        o.state_path = Some(self.state_dir.path().join("suite.pos"));
        Arc::new(ArchiveReplaySource::new(reader, o))
    }

    async fn commit(&mut self, txn: &Txn) {
        let mut changes: Vec<(Action, Option<String>, Option<String>)> = Vec::new();
        for (action, id, name) in txn {
            let new = format!(r#"{{"id":{id},"name":"{name}"}}"#);
            match action {
                Action::Insert => {
                    changes.push((*action, None, Some(new.clone())));
                    self.rows.insert(*id, new);
                }
                Action::Update => {
                    let old = self.rows.insert(*id, new.clone());
                    changes.push((*action, old, Some(new)));
                }
                Action::Delete => changes.push((*action, self.rows.remove(id), None)),
                Action::Truncate => {
                    self.rows.clear();
                    changes.push((*action, None, None));
                }
            }
        }
        let ch: Vec<Ch<'_>> = changes
            .iter()
            .map(|(a, o, n)| (*a, o.as_deref(), n.as_deref()))
            .collect();
        let from = self.archive.manifest.head_position.clone();
        let to = format!("0/{:X}", self.next_position);
        self.next_position += 0x100;
        self.archive.diff(&from, &to, &ch).await;
    }

    async fn lose_history(&mut self) {
        let to = format!("0/{:X}", self.next_position);
        self.next_position += 0x100;
        self.archive
            .replace(&to, &[r#"{"id":100,"name":"other lineage"}"#])
            .await;
    }
}

/// `id:name` of a row.
fn text(row: &larch::archive::value::Row) -> String {
    let v: serde_json::Value = serde_json::from_str(row.as_str()).unwrap();
    format!("{}:{}", v["id"], v["name"].as_str().unwrap())
}

/// `action id:name` of a change (the new row; the old one for a delete).
fn describe(c: &ChangeEvent) -> String {
    let row = c.new.as_ref().or(c.old.as_ref()).expect("a row");
    let shown = if c.action == Action::Delete {
        format!(
            "{}",
            serde_json::from_str::<serde_json::Value>(row.as_str()).unwrap()["id"]
        )
    } else {
        text(row)
    };
    format!("{:?} {shown}", c.action)
}

struct Stream {
    rx: mpsc::Receiver<SourceEvent>,
    task: JoinHandle<Result<(), SourceError>>,
}

impl Stream {
    fn start(src: &Arc<dyn SyncSource>, from: &str) -> Stream {
        let (tx, rx) = mpsc::channel(16);
        let (src, from) = (src.clone(), from.to_string());
        let task = tokio::spawn(async move { src.stream(&from, tx).await });
        Stream { rx, task }
    }

    /// The next transaction's changes and its checkpoint.
    async fn next_txn(&mut self, who: &str) -> (Vec<ChangeEvent>, String) {
        let mut changes = Vec::new();
        loop {
            let ev = tokio::time::timeout(WAIT, self.rx.recv())
                .await
                .unwrap_or_else(|_| panic!("{who}: no event within {WAIT:?}"))
                .unwrap_or_else(|| panic!("{who}: the stream ended"));
            match ev {
                SourceEvent::Change(c) => changes.push(c),
                // Keepalives: a checkpoint with nothing before it.
                SourceEvent::Checkpoint { .. } if changes.is_empty() => {}
                SourceEvent::Checkpoint { position } => return (changes, position),
            }
        }
    }

    /// Nothing but keepalive checkpoints arrive for `wait`.
    async fn expect_no_change(&mut self, wait: Duration, who: &str) {
        let until = tokio::time::Instant::now() + wait;
        while let Ok(Some(ev)) = tokio::time::timeout_at(until, self.rx.recv()).await {
            assert!(
                matches!(ev, SourceEvent::Checkpoint { .. }),
                "{who}: unexpected {ev:?}"
            );
        }
    }

    async fn stop(self, src: &Arc<dyn SyncSource>, who: &str) {
        src.close().await;
        let ended = tokio::time::timeout(WAIT, self.task)
            .await
            .unwrap_or_else(|_| panic!("{who}: close did not end the stream"))
            .unwrap();
        assert!(
            matches!(ended, Ok(()) | Err(SourceError::Stopped)),
            "{who}: the stream ended with {ended:?}"
        );
        assert_eq!(src.state(), SourceState::Closed, "{who}");
    }
}

/// Checks one transaction: its changes as `action id:name`, all at one position after
/// `after`, and the checkpoint at that position.
fn check_txn(
    (changes, checkpoint): &(Vec<ChangeEvent>, String),
    want: &[&str],
    after: &str,
    who: &str,
) {
    let got: Vec<String> = changes.iter().map(describe).collect();
    assert_eq!(got, want, "{who}: changes");
    for c in changes {
        assert_eq!(c.table, table(), "{who}");
        assert!(position::is_valid(&c.position), "{who}: {}", c.position);
        assert!(
            position::compare(&c.position, after).is_gt(),
            "{who}: change at {} is not after {after}",
            c.position
        );
        assert!(
            position::same(&c.position, checkpoint),
            "{who}: change at {} but checkpoint at {checkpoint}",
            c.position
        );
    }
}

async fn baseline(src: &dyn SyncSource, who: &str) -> (BTreeSet<String>, String) {
    let (tx, mut rx) = mpsc::channel(4);
    let collect = async move {
        let mut got = BTreeSet::new();
        while let Some((t, row)) = rx.recv().await {
            assert_eq!(t, table(), "{who}");
            assert!(got.insert(text(&row)), "{who}: row {row:?} sent twice");
        }
        got
    };
    let tables = [table()];
    let (pos, rows) = tokio::join!(src.baseline(&tables, tx), collect);
    (rows, pos.unwrap_or_else(|e| panic!("{who}: baseline: {e}")))
}

/// The whole suite, in order.
async fn conformance(s: &mut dyn Subject) {
    let who = s.name();
    let src = s.source();
    let columns = src.init(&[table()]).await.expect("init");
    let names: Vec<&str> = columns[&table()].iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["id", "name"], "{who}: columns");
    assert!(
        src.validate_tables(&[table()]).await.is_empty(),
        "{who}: the served table is valid"
    );
    let missing = TableId::new("public", "missing");
    let errors = src.validate_tables(&[table(), missing.clone()]).await;
    assert_eq!(errors.len(), 1, "{who}: {errors:?}");
    assert_eq!(errors[0].table, missing, "{who}: {errors:?}");
    assert!(src.supports_resume(), "{who}");
    assert_eq!(src.last_acked_position().await.unwrap(), None, "{who}");

    let (rows, base) = baseline(&*src, who).await;
    assert!(position::is_valid(&base), "{who}: baseline at {base}");
    assert_eq!(
        rows,
        BTreeSet::from(["1:a1".into(), "2:a2".into(), "3:a3".into()]),
        "{who}: baseline rows"
    );

    // Changes in order, after the baseline, one checkpoint per transaction.
    let mut stream = Stream::start(&src, &base);
    s.commit(&[
        (Action::Insert, 4, "a4"),
        (Action::Update, 2, "b2"),
        (Action::Delete, 3, ""),
    ])
    .await;
    let first = stream.next_txn(who).await;
    check_txn(
        &first,
        &["Insert 4:a4", "Update 2:b2", "Delete 3"],
        &base,
        who,
    );
    assert_eq!(src.state(), SourceState::Streaming, "{who}");
    s.commit(&[(Action::Insert, 5, "a5")]).await;
    let second = stream.next_txn(who).await;
    check_txn(&second, &["Insert 5:a5"], &first.1, who);

    // Acknowledged is what a restart resumes from.
    src.ack(&first.1).await.expect("ack");
    let acked = src.last_acked_position().await.unwrap().expect("acked");
    assert!(position::same(&acked, &first.1), "{who}: acked {acked}");

    // Paused: changes wait for resume.
    src.pause();
    assert_eq!(src.state(), SourceState::Paused, "{who}");
    s.commit(&[(Action::Insert, 6, "a6")]).await;
    stream
        .expect_no_change(Duration::from_millis(800), who)
        .await;
    src.resume();
    let third = stream.next_txn(who).await;
    check_txn(&third, &["Insert 6:a6"], &second.1, who);
    stream.stop(&src, who).await;

    // A restart: the acknowledged position survives; streaming from a delivered checkpoint
    // delivers only what came after it.
    let src = s.source();
    src.init(&[table()]).await.expect("init after a restart");
    let resumed = src.last_acked_position().await.unwrap().expect("resumable");
    assert!(
        position::compare(&resumed, &first.1).is_ge()
            && position::compare(&resumed, &second.1).is_lt(),
        "{who}: resumes at {resumed}, acked {}",
        first.1
    );
    let mut stream = Stream::start(&src, &second.1);
    let again = stream.next_txn(who).await;
    check_txn(&again, &["Insert 6:a6"], &second.1, who);
    stream
        .expect_no_change(Duration::from_millis(300), who)
        .await;
    stream.stop(&src, who).await;

    // The history behind our position is gone: a new baseline is required.
    s.lose_history().await;
    let src = s.source();
    src.init(&[table()]).await.expect("init");
    let (tx, _rx) = mpsc::channel(16);
    let ended = tokio::time::timeout(WAIT, src.stream(&third.1, tx))
        .await
        .unwrap_or_else(|_| panic!("{who}: the lost history went unnoticed"));
    assert!(
        matches!(ended, Err(SourceError::ReBaselineRequired(_))),
        "{who}: {ended:?}"
    );
    src.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_source_conforms() {
    let mut s = Postgres::new().await;
    conformance(&mut s).await;
    // Only a baseline creates the slot: the refused stream left none behind.
    assert!(
        s.db.client
            .query_opt(
                "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1",
                &[&s.config.slot_name],
            )
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archive_source_on_s3_conforms() {
    conformance(&mut Archive::new().await).await;
}
