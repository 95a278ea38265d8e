//! One conformance suite for every engine `Target` (the memory target, and the PostgreSQL
//! target on a real PostgreSQL 15), written against the public trait only: what
//! `larch::engine::targets::Target` promises, checked the same way for each.
//!
//! * A baseline is built aside and replaces the live state at `commit_baseline`: a reader
//!   during the baseline sees the old rows or the new ones, never a partial or empty table
//!   (C2); `abort_baseline` leaves the live state as it was.
//! * `checkpoint` makes every change applied before it visible, in order (R5: an identity
//!   change removes the old row, a TRUNCATE clears what came before it).
//! * `discard_pending` drops what was applied since the last checkpoint and is not visible
//!   yet: it never becomes visible afterwards.
//! * `resume_position`: a target that is not durable records nothing (the state file
//!   decides); a durable one vouches for nothing before its first baseline, and after a
//!   restart for exactly its last checkpoint, with the rows of that checkpoint (C3).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use larch::archive::model::{Action, TableId};
use larch::archive::position;
use larch::archive::value::Row;
use larch::engine::config::Connection;
use larch::engine::targets::memory::MemoryTarget;
use larch::engine::targets::postgres::PostgresTarget;
use larch::engine::targets::{Resume, Target};
use larch::source::ChangeEvent;

use crate::archive_build::id_name_columns;
use crate::support::postgres::{Database, new_database};

fn table() -> TableId {
    TableId::new("public", "items")
}

/// One implementation under test.
#[async_trait]
trait Subject: Send + Sync {
    fn name(&self) -> &'static str;
    /// A target as a process start creates it (on the same destination, for a durable one).
    async fn start(&mut self) -> Arc<dyn Target>;
    /// What a reader of the destination sees now, as `id:name` by id.
    async fn served(&self) -> Vec<String>;
}

struct Memory {
    current: Option<Arc<MemoryTarget>>,
}

#[async_trait]
impl Subject for Memory {
    fn name(&self) -> &'static str {
        "memory"
    }

    async fn start(&mut self) -> Arc<dyn Target> {
        let t = Arc::new(MemoryTarget::new(table(), vec!["name".into()]));
        self.current = Some(t.clone());
        t
    }

    async fn served(&self) -> Vec<String> {
        let rows = self.current.as_ref().expect("started").rows();
        let mut out: Vec<(i64, String)> = rows
            .iter()
            .map(|r| {
                let v: serde_json::Value = serde_json::from_str(r).unwrap();
                let id = v["id"].as_i64().unwrap();
                (id, format!("{id}:{}", v["name"].as_str().unwrap()))
            })
            .collect();
        out.sort();
        out.into_iter().map(|(_, s)| s).collect()
    }
}

struct Postgres {
    db: Database,
    dsn_file: PathBuf,
    _dir: tempfile::TempDir,
}

#[async_trait]
impl Subject for Postgres {
    fn name(&self) -> &'static str {
        "postgres"
    }

    async fn start(&mut self) -> Arc<dyn Target> {
        Arc::new(PostgresTarget::new(
            Connection::File(self.dsn_file.clone()),
            table(),
            "suite".into(),
        ))
    }

    /// Read on a connection of its own, as any reader of the database.
    async fn served(&self) -> Vec<String> {
        self.db
            .client
            .query(
                "SELECT id::text || ':' || name FROM public.items ORDER BY id",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect()
    }
}

fn row(id: i64, name: &str) -> Row {
    Row::parse(&format!(r#"{{"id":{id},"name":"{name}"}}"#)).unwrap()
}

fn rows(ids: std::ops::RangeInclusive<i64>, name: &str) -> Vec<Row> {
    ids.map(|id| row(id, &format!("{name}{id}"))).collect()
}

fn texts(ids: std::ops::RangeInclusive<i64>, name: &str) -> Vec<String> {
    ids.map(|id| format!("{id}:{name}{id}")).collect()
}

fn change(action: Action, old: Option<Row>, new: Option<Row>, at: &str) -> ChangeEvent {
    ChangeEvent {
        table: table(),
        action,
        position: at.into(),
        old,
        new,
        commit_time: None,
    }
}

async fn init(t: &dyn Target) {
    t.init(&id_name_columns(), &["id".to_string()])
        .await
        .expect("init");
}

async fn baseline(t: &dyn Target, rows: Vec<Row>, at: &str) {
    t.begin_baseline().await.expect("begin_baseline");
    for chunk in rows.chunks(2) {
        t.baseline_rows(chunk.to_vec())
            .await
            .expect("baseline_rows");
    }
    t.commit_baseline(at).await.expect("commit_baseline");
}

/// The resume position, with LSN positions compared by value (R2).
fn assert_resumes_at(got: &Resume, want: &str, who: &str) {
    match got {
        Resume::At(p) => assert!(position::same(p, want), "{who}: resumes at {p}, not {want}"),
        other => panic!("{who}: expected to resume at {want}, got {other:?}"),
    }
}

/// The whole suite, in order, on one destination.
async fn conformance(s: &mut dyn Subject) {
    let who = s.name();
    let t = s.start().await;
    init(&*t).await;

    // Before any baseline: nothing to vouch for.
    let resume = t.resume_position().await.expect("resume_position");
    if t.is_durable() {
        assert!(matches!(resume, Resume::Baseline(_)), "{who}: {resume:?}");
    } else {
        assert_eq!(resume, Resume::Unrecorded, "{who}");
    }

    // A baseline becomes the live state at its commit.
    baseline(&*t, rows(1..=3, "a"), "0/10").await;
    assert_eq!(s.served().await, texts(1..=3, "a"), "{who}: first baseline");
    if let Some(n) = t.row_count() {
        assert_eq!(n, 3, "{who}: row_count");
    }

    // C2: a reader during the next baseline sees the old rows or the new ones, nothing else.
    t.begin_baseline().await.unwrap();
    t.baseline_rows(rows(10..=11, "b")).await.unwrap();
    let reader = {
        let served = s.served();
        let commit = async {
            // Give the reader time to run against the half-built baseline first.
            tokio::time::sleep(Duration::from_millis(300)).await;
            t.baseline_rows(rows(12..=12, "b")).await.unwrap();
            t.commit_baseline("0/20").await.unwrap();
        };
        tokio::join!(served, commit).0
    };
    assert!(
        reader == texts(1..=3, "a") || reader == texts(10..=12, "b"),
        "{who}: a reader during a baseline saw {reader:?}"
    );
    assert_eq!(
        s.served().await,
        texts(10..=12, "b"),
        "{who}: second baseline"
    );

    // An aborted baseline leaves the live state untouched, and the next one still works.
    t.begin_baseline().await.unwrap();
    t.baseline_rows(rows(20..=21, "c")).await.unwrap();
    t.abort_baseline().await;
    assert_eq!(
        s.served().await,
        texts(10..=12, "b"),
        "{who}: after an abort"
    );
    baseline(&*t, rows(1..=3, "a"), "0/30").await;
    assert_eq!(
        s.served().await,
        texts(1..=3, "a"),
        "{who}: baseline after an abort"
    );

    // Changes up to a checkpoint are visible after it, in order (R5).
    let changes = [
        change(Action::Insert, None, Some(row(4, "d4")), "0/40"),
        change(
            Action::Update,
            Some(row(2, "a2")),
            Some(row(2, "updated")),
            "0/40",
        ),
        change(Action::Delete, Some(row(3, "a3")), None, "0/40"),
        // An identity change: the old row goes.
        change(
            Action::Update,
            Some(row(4, "d4")),
            Some(row(40, "moved")),
            "0/40",
        ),
    ];
    for c in &changes {
        t.apply(c).await.expect("apply");
    }
    t.checkpoint("0/40").await.expect("checkpoint");
    assert_eq!(
        s.served().await,
        vec!["1:a1", "2:updated", "40:moved"],
        "{who}: after a checkpoint"
    );

    // A TRUNCATE clears what came before it; what follows it stays.
    t.apply(&change(Action::Insert, None, Some(row(5, "e5")), "0/50"))
        .await
        .unwrap();
    t.apply(&change(Action::Truncate, None, None, "0/50"))
        .await
        .unwrap();
    t.apply(&change(Action::Insert, None, Some(row(6, "f6")), "0/50"))
        .await
        .unwrap();
    t.checkpoint("0/50").await.unwrap();
    assert_eq!(s.served().await, vec!["6:f6"], "{who}: after a TRUNCATE");
    if let Some(n) = t.row_count() {
        assert_eq!(n, 1, "{who}: row_count after a TRUNCATE");
    }

    // What is not visible when discarded never becomes visible.
    t.apply(&change(Action::Insert, None, Some(row(7, "g7")), "0/60"))
        .await
        .unwrap();
    let before = s.served().await;
    t.discard_pending().await;
    t.checkpoint("0/50").await.unwrap();
    assert_eq!(s.served().await, before, "{who}: after discard_pending");
    if !before.contains(&"7:g7".to_string()) {
        // The stream restarts from the checkpoint and delivers the change again.
        t.apply(&change(Action::Insert, None, Some(row(7, "g7")), "0/60"))
            .await
            .unwrap();
        t.checkpoint("0/60").await.unwrap();
    } else {
        t.checkpoint("0/60").await.unwrap();
    }
    assert_eq!(s.served().await, vec!["6:f6", "7:g7"], "{who}: replayed");

    // Applied but never checkpointed when the process stops.
    t.apply(&change(Action::Insert, None, Some(row(8, "h8")), "0/70"))
        .await
        .unwrap();
    drop(t);

    // A restart: a durable target vouches for its last checkpoint and its rows.
    let t = s.start().await;
    init(&*t).await;
    let resume = t.resume_position().await.expect("resume_position");
    if t.is_durable() {
        assert_resumes_at(&resume, "0/60", who);
        assert_eq!(
            s.served().await,
            vec!["6:f6", "7:g7"],
            "{who}: rows after a restart (the change after the checkpoint is not there)"
        );
        assert!(
            !t.needs_baseline(),
            "{who}: same columns, no baseline needed"
        );
        // Resuming continues the table.
        t.apply(&change(Action::Insert, None, Some(row(8, "h8")), "0/70"))
            .await
            .unwrap();
        t.checkpoint("0/70").await.unwrap();
        assert_eq!(s.served().await, vec!["6:f6", "7:g7", "8:h8"], "{who}");
        drop(t);
        let t = s.start().await;
        init(&*t).await;
        assert_resumes_at(&t.resume_position().await.unwrap(), "0/70", who);
    } else {
        assert_eq!(resume, Resume::Unrecorded, "{who}: after a restart");
        assert!(s.served().await.is_empty(), "{who}: nothing survives");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_target_conforms() {
    conformance(&mut Memory { current: None }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_target_conforms() {
    let db = new_database().await;
    let dir = tempfile::tempdir().unwrap();
    let dsn_file = dir.path().join("dsn");
    std::fs::write(&dsn_file, &db.dsn).unwrap();
    conformance(&mut Postgres {
        db,
        dsn_file,
        _dir: dir,
    })
    .await;
}
