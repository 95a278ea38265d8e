//! The PostgreSQL target against a real PostgreSQL 15: the table equals the archive after a
//! restore, after a follow, after a restart that resumes from its checkpoint with zero
//! re-baselines, and after a replacement.

use std::sync::Arc;
use std::time::Duration;

use larch::archive::model::{Action, ColumnDefinition};
use larch::archive::store::Store;
use larch::archive::store::local::LocalStore;

use crate::archive_build::TestArchive;
use crate::engine_support::{eventually, get, get_json, metric, start_engine, wait_ready};
use crate::support::postgres::new_database;

fn columns() -> Vec<ColumnDefinition> {
    [
        ("id", "int8"),
        ("tenant", "text"),
        ("amount", "numeric"),
        ("payload", "jsonb"),
        ("tags", "_text"),
        ("flag", "bool"),
        ("ref", "uuid"),
        ("blob", "bytea"),
        ("created_at", "timestamptz"),
    ]
    .iter()
    .enumerate()
    .map(|(i, (n, t))| ColumnDefinition {
        name: n.to_string(),
        type_name: t.to_string(),
        nullable: *n != "id",
        primary_key: *n == "id",
        primary_key_ordinal: if *n == "id" { 1 } else { 0 },
        ordinal_position: i as i64 + 1,
        ..Default::default()
    })
    .collect()
}

fn row(id: i64, tenant: &str) -> String {
    format!(
        r#"{{"amount":12345678901234567890.{id:03},"blob":"3q2+7w==","created_at":"2026-01-01T00:00:{:02}Z","flag":{},"id":{id},"payload":{{"n":{id},"nested":{{"ok":true}}}},"ref":"00000000-0000-0000-0000-{id:012}","tags":["a{id}","b"],"tenant":"{tenant}"}}"#,
        id % 60,
        id % 2 == 0
    )
}

/// The table as comparable text rows, ordered by id.
async fn table_rows(db: &tokio_postgres::Client) -> Vec<String> {
    db.query(
        "SELECT id::text || '|' || tenant || '|' || amount::text || '|' || payload::text || '|' \
         || array_to_string(tags, ',') || '|' || flag::text || '|' || ref::text || '|' \
         || encode(blob, 'base64') || '|' || extract(epoch from created_at)::bigint::text \
         FROM public.events ORDER BY id",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get::<_, String>(0))
    .collect()
}

fn expected(ids: impl IntoIterator<Item = (i64, &'static str)>) -> Vec<String> {
    let mut v: Vec<(i64, String)> = ids
        .into_iter()
        .map(|(id, tenant)| {
            (
                id,
                format!(
                    r#"{id}|{tenant}|12345678901234567890.{id:03}|{{"n": {id}, "nested": {{"ok": true}}}}|a{id},b|{}|00000000-0000-0000-0000-{id:012}|3q2+7w==|{}"#,
                    id % 2 == 0,
                    1767225600 + id % 60
                ),
            )
        })
        .collect();
    v.sort();
    v.into_iter().map(|(_, s)| s).collect()
}

fn yaml(archive: &std::path::Path, dsn_file: &std::path::Path, state: &std::path::Path) -> String {
    format!(
        r#"
sources:
  seed:
    type: archive
    store: {{type: local, path: "{}"}}
    key_prefix: public.events/
    follow: true
    poll_interval: 100ms
    state_path: "{}"
tables:
  - source: seed
    schema: public
    table: events
    targets:
      - type: postgres
        connection_file: "{}"
"#,
        archive.display(),
        state.display(),
        dsn_file.display()
    )
}

async fn baselines(addr: std::net::SocketAddr) -> f64 {
    let (_, m) = get(addr, "/metrics").await;
    metric(
        &m,
        r#"laredo_baseline_duration_seconds_count{pipeline="seed:public.events:postgres"}"#,
    )
    .unwrap_or(0.0)
}

/// A database and a local archive of `public.events`: a snapshot at 0/100 of ids 1..=n.
async fn events_archive(
    n: i64,
) -> (
    crate::support::postgres::Database,
    tempfile::TempDir,
    TestArchive,
) {
    let db = new_database().await;
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path().join("archive")).unwrap());
    let mut a = TestArchive::new(store, "public.events/", "public.events").with_columns(columns());
    let snap: Vec<String> = (1..=n).map(|i| row(i, "t")).collect();
    a.snapshot("0/100", &crate::archive_build::refs(&snap))
        .await;
    (db, dir, a)
}

/// The archive's root, a DSN file for the database and the engine's state file, under `dir`.
fn paths(
    db: &crate::support::postgres::Database,
    dir: &std::path::Path,
) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let dsn_file = dir.join("dsn");
    std::fs::write(&dsn_file, format!("{}\n", db.dsn)).unwrap();
    (dir.join("archive"), dsn_file, dir.join("state/seed.pos"))
}

#[tokio::test]
async fn restore_follow_restart_and_replace_into_postgres() {
    let (db, dir, mut a) = events_archive(300).await;
    let (archive, dsn_file, state) = paths(&db, dir.path());
    let r5 = row(5, "t");
    let r6 = row(6, "u");
    let r301 = row(301, "n");
    a.diff(
        "0/100",
        "0/200",
        &[
            (Action::Delete, Some(&r5), None),
            (Action::Update, None, Some(&r6)),
            (Action::Insert, None, Some(&r301)),
        ],
    )
    .await;
    let config = yaml(&archive, &dsn_file, &state);

    // Restore: the table is created from the archive's columns and equals the folded archive.
    let engine = start_engine(&config).await;
    let addr = engine.addr;
    wait_ready(addr).await;
    let mut want: Vec<(i64, &str)> = (1..=301)
        .filter(|i| *i != 5)
        .map(|i| {
            (
                i,
                if i == 6 {
                    "u"
                } else if i == 301 {
                    "n"
                } else {
                    "t"
                },
            )
        })
        .collect();
    assert_eq!(table_rows(&db.client).await, expected(want.clone()));
    let ty: String = db
        .client
        .query_one(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute \
             WHERE attrelid = 'public.events'::regclass AND attname = 'tags'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(ty, "text[]");

    // Follow: a diff (with a TRUNCATE-free mix) shows up in one transaction with its position.
    let r7 = row(7, "f");
    a.diff(
        "0/200",
        "0/300",
        &[
            (Action::Update, None, Some(&r7)),
            (Action::Delete, Some(&r301), None),
        ],
    )
    .await;
    want.retain(|(i, _)| *i != 301);
    want.iter_mut().find(|(i, _)| *i == 7).unwrap().1 = "f";
    let client = &db.client;
    let w = expected(want.clone());
    eventually(15, "the followed diff", || {
        let w = w.clone();
        async move { (table_rows(client).await == w).then_some(()) }
    })
    .await;
    let pos: String = db
        .client
        .query_one(
            "SELECT position FROM public.larch_checkpoint WHERE target_table = 'public.events'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(pos, "0/300");
    eventually(5, "the ack", || async {
        (std::fs::read_to_string(&state).ok().as_deref() == Some("0/300")).then_some(())
    })
    .await;
    assert_eq!(baselines(addr).await, 1.0);
    engine.stop().await.unwrap();

    // Restart after a diff written while stopped: resumes from the checkpoint, no baseline.
    let r8 = row(8, "r");
    a.diff("0/300", "0/400", &[(Action::Update, None, Some(&r8))])
        .await;
    want.iter_mut().find(|(i, _)| *i == 8).unwrap().1 = "r";
    let engine = start_engine(&config).await;
    let addr = engine.addr;
    wait_ready(addr).await;
    let w = expected(want.clone());
    eventually(15, "the diff written while stopped", || {
        let w = w.clone();
        async move { (table_rows(client).await == w).then_some(()) }
    })
    .await;
    assert_eq!(baselines(addr).await, 0.0, "resumed without a baseline");
    let status = get_json(addr, "/status").await;
    assert_eq!(status["sources"]["seed"]["rebaselines"], 0);

    // Replacement: the table ends up exactly equal to the new archive.
    let fresh: Vec<String> = (1000..=1010).map(|i| row(i, "z")).collect();
    a.replace("0/900", &crate::archive_build::refs(&fresh))
        .await;
    let w = expected((1000..=1010).map(|i| (i, "z")));
    eventually(15, "the replacement", || {
        let w = w.clone();
        async move { (table_rows(client).await == w).then_some(()) }
    })
    .await;
    let (_, m) = get(addr, "/metrics").await;
    assert_eq!(
        metric(&m, r#"laredo_source_rebaseline_total{source="seed"}"#),
        Some(1.0)
    );
    engine.stop().await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
}

/// Issue 14: the destination table dropped (its checkpoint row left in place) or truncated
/// while the engine is down. On restart the checkpoint no longer matches the table it was
/// written with: the engine takes a baseline — ready only with every row back — instead of
/// resuming into an empty table at the head.
#[tokio::test]
async fn a_checkpoint_is_not_trusted_for_a_dropped_or_truncated_table() {
    let (db, dir, mut a) = events_archive(50).await;
    let (archive, dsn_file, state) = paths(&db, dir.path());
    let r51 = row(51, "n");
    a.diff("0/100", "0/200", &[(Action::Insert, None, Some(&r51))])
        .await;
    let config = yaml(&archive, &dsn_file, &state);
    let want = expected(
        (1..=51)
            .map(|i| (i, "t"))
            .map(|(i, t)| (i, if i == 51 { "n" } else { t })),
    );
    let client = &db.client;

    let engine = start_engine(&config).await;
    wait_ready(engine.addr).await;
    let w = want.clone();
    eventually(15, "the archive restored", || {
        let w = w.clone();
        async move { (table_rows(client).await == w).then_some(()) }
    })
    .await;
    engine.stop().await.unwrap();

    for (what, sql) in [
        ("dropped", "DROP TABLE public.events"),
        ("truncated", "TRUNCATE public.events"),
    ] {
        db.client.batch_execute(sql).await.unwrap();
        let kept: i64 = db
            .client
            .query_one("SELECT count(*) FROM public.larch_checkpoint", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(kept, 1, "{what}: the checkpoint row is still there");
        let engine = start_engine(&config).await;
        let addr = engine.addr;
        wait_ready(addr).await;
        // Ready means the baseline committed: the rows are there the moment /health/ready says so.
        assert_eq!(
            table_rows(client).await,
            want,
            "{what}: ready with the table rebuilt"
        );
        assert_eq!(
            baselines(addr).await,
            1.0,
            "{what}: one baseline, no resume"
        );
        let status = get_json(addr, "/status").await;
        let pipeline = &status["pipelines"]["seed:public.events:postgres"];
        assert_eq!(pipeline["state"], "STREAMING", "{what}: {status}");
        assert_eq!(pipeline["position"], "0/200", "{what}: {status}");
        engine.stop().await.unwrap();
    }

    // And with the table intact, a restart still resumes (no baseline).
    let engine = start_engine(&config).await;
    wait_ready(engine.addr).await;
    assert_eq!(baselines(engine.addr).await, 0.0, "an intact table resumes");
    assert_eq!(table_rows(client).await, want);
    engine.stop().await.unwrap();
}

/// `split: 3`: a baseline loads over three COPY streams into a committed staging table
/// (a leftover of a killed split baseline is dropped first), swapped in at the commit: the
/// same table as one stream gives, followed by the next diff, and no staging table left.
#[tokio::test]
async fn a_split_baseline_loads_over_several_streams_into_the_same_table() {
    let (db, dir, mut a) = events_archive(20_000).await;
    let (archive, dsn_file, state) = paths(&db, dir.path());
    db.client
        .batch_execute("CREATE TABLE public.events_larch_baseline (junk int)")
        .await
        .unwrap();
    let config = yaml(&archive, &dsn_file, &state).replace(
        "        connection_file:",
        "        split: 3\n        connection_file:",
    );
    assert!(config.contains("split: 3"), "{config}");
    let engine = start_engine(&config).await;
    wait_ready(engine.addr).await;
    let client = &db.client;
    let want = expected((1..=20_000).map(|i| (i, "t")));
    assert_eq!(table_rows(client).await, want, "ready with every row");
    let r20001 = row(20_001, "n");
    a.diff("0/100", "0/200", &[(Action::Insert, None, Some(&r20001))])
        .await;
    let want = expected((1..=20_001).map(|i| (i, if i == 20_001 { "n" } else { "t" })));
    eventually(15, "the diff applied", || {
        let w = want.clone();
        async move { (table_rows(client).await == w).then_some(()) }
    })
    .await;
    let staging: bool = db
        .client
        .query_one(
            "SELECT to_regclass('public.events_larch_baseline') IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!staging, "the staging table became the table");
    let key: String = db
        .client
        .query_one(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint
              WHERE conrelid = 'public.events'::regclass AND contype = 'p'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(key, "PRIMARY KEY (id)");
    engine.stop().await.unwrap();
}
