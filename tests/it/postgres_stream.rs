//! The PostgreSQL source streaming changes against a real PostgreSQL 15: commit positions,
//! TOAST, slot creation under load, resume after an ack, reconnects, invalidated slots, several
//! tables in one source (helpers: tests/it/postgres_source.rs).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use larch::archive::model::{Action, TableId};
use larch::archive::position::Lsn;
use larch::archive::value::Row;
use larch::source::SyncSource;
use larch::source::postgres::{PostgresSource, SlotMode};
use tokio::sync::mpsc;

use crate::postgres_source::*;
use crate::support::postgres::{cluster, lossy_cluster, new_database, new_database_on};

#[tokio::test]
async fn streams_changes_with_commit_positions() {
    let db = new_database().await;
    db.client
        .batch_execute(
            "CREATE TABLE items (id int8 PRIMARY KEY, name text, qty int4);
             CREATE TABLE other (id int8 PRIMARY KEY);",
        )
        .await
        .unwrap();
    let src = Arc::new(PostgresSource::new(config(
        &db,
        "items",
        SlotMode::Temporary,
    )));
    src.init(&[]).await.expect("init");
    let (base, rows) = take_baseline(&src, "items").await;
    assert!(rows.is_empty());
    let mut st = Streamer::start(src.clone(), &base);
    let mut last = Lsn::parse(&base).unwrap().0;

    type Expected<'a> = Vec<(Action, Option<&'a str>, Option<&'a str>)>;
    let steps: Vec<(&str, Expected)> = vec![
        (
            "INSERT INTO items VALUES (1, 'a', 1), (2, 'b', 2)",
            vec![
                (Action::Insert, None, Some(r#"{"id":1,"name":"a","qty":1}"#)),
                (Action::Insert, None, Some(r#"{"id":2,"name":"b","qty":2}"#)),
            ],
        ),
        (
            "UPDATE items SET qty = 5 WHERE id = 1",
            vec![(Action::Update, None, Some(r#"{"id":1,"name":"a","qty":5}"#))],
        ),
        (
            "DELETE FROM items WHERE id = 2",
            vec![(Action::Delete, Some(r#"{"id":2}"#), None)],
        ),
        (
            "UPDATE items SET id = 10 WHERE id = 1",
            vec![
                (Action::Delete, Some(r#"{"id":1}"#), None),
                (
                    Action::Insert,
                    None,
                    Some(r#"{"id":10,"name":"a","qty":5}"#),
                ),
            ],
        ),
        ("TRUNCATE items", vec![(Action::Truncate, None, None)]),
        (
            "BEGIN; INSERT INTO other VALUES (1); INSERT INTO items VALUES (3, NULL, 3); COMMIT",
            vec![(
                Action::Insert,
                None,
                Some(r#"{"id":3,"name":null,"qty":3}"#),
            )],
        ),
    ];
    for (sql, want) in steps {
        let before = insert_lsn(&db).await;
        db.client
            .batch_execute("BEGIN; INSERT INTO items VALUES (99, 'x', 0); ROLLBACK")
            .await
            .unwrap();
        db.client.batch_execute(sql).await.unwrap();
        let after = insert_lsn(&db).await;
        let (changes, checkpoint) = st.next_txn().await;
        let got: Vec<(Action, Option<String>, Option<String>)> = changes
            .iter()
            .map(|c| {
                (
                    c.action,
                    c.old.as_ref().map(|r| r.as_str().to_string()),
                    c.new.as_ref().map(|r| r.as_str().to_string()),
                )
            })
            .collect();
        let want: Vec<(Action, Option<String>, Option<String>)> = want
            .into_iter()
            .map(|(a, o, n)| (a, o.map(String::from), n.map(String::from)))
            .collect();
        assert_eq!(got, want, "after {sql}");
        // Every change carries its transaction's commit LSN, which is the checkpoint.
        assert!(is_laredo_lsn(&checkpoint), "{checkpoint}");
        let commit = Lsn::parse(&checkpoint).unwrap().0;
        assert!(
            before <= commit && commit < after,
            "commit {checkpoint} outside the transaction"
        );
        assert!(commit > last);
        last = commit;
        for c in &changes {
            assert_eq!(c.position, checkpoint);
            assert_eq!(c.table, tid("items"));
            assert!(c.commit_time.is_some());
        }
    }
    // A transaction on a table outside the source still checkpoints (so the slot can advance).
    db.client
        .batch_execute("INSERT INTO other VALUES (2)")
        .await
        .unwrap();
    st.expect_quiet(Duration::from_millis(500)).await;
    st.stop().await.unwrap();
    // The temporary slot went away with the source.
    let slot = src.config().slot_name.clone();
    for _ in 0..100 {
        if confirmed_flush(&db, &slot).await.is_none()
            && db
                .client
                .query_opt(
                    "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1",
                    &[&slot],
                )
                .await
                .unwrap()
                .is_none()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("temporary slot {slot} still exists after close");
}

#[tokio::test]
async fn unchanged_toast_columns_are_filled() {
    let db = new_database().await;
    db.client
        .batch_execute(
            "CREATE TABLE docs (id int8 PRIMARY KEY, big text, n int4);
             ALTER TABLE docs ALTER COLUMN big SET STORAGE EXTERNAL;
             CREATE TABLE docs_full (id int8 PRIMARY KEY, big text, n int4);
             ALTER TABLE docs_full ALTER COLUMN big SET STORAGE EXTERNAL;
             ALTER TABLE docs_full REPLICA IDENTITY FULL;",
        )
        .await
        .unwrap();
    for table in ["docs", "docs_full"] {
        let src = Arc::new(PostgresSource::new(config(&db, table, SlotMode::Temporary)));
        src.init(&[]).await.unwrap();
        let (base, _) = take_baseline(&src, table).await;
        let mut st = Streamer::start(src.clone(), &base);
        db.client
            .batch_execute(&format!(
                "INSERT INTO {table} VALUES (1, repeat('0123456789', 20000), 1)"
            ))
            .await
            .unwrap();
        let (ins, _) = st.next_txn().await;
        let big = field(ins[0].new.as_ref().unwrap(), "big");
        assert_eq!(big.len(), 200_002);
        db.client
            .batch_execute(&format!("UPDATE {table} SET n = 2 WHERE id = 1"))
            .await
            .unwrap();
        let (upd, _) = st.next_txn().await;
        assert_eq!(upd.len(), 1, "{table}");
        assert_eq!(upd[0].action, Action::Update);
        let new = upd[0].new.as_ref().unwrap();
        assert_eq!(field(new, "n"), "2");
        assert_eq!(
            field(new, "big"),
            big,
            "{table}: the unchanged TOASTed column is kept"
        );
        if table == "docs_full" {
            let old = upd[0]
                .old
                .as_ref()
                .expect("REPLICA IDENTITY FULL sends the old row");
            assert_eq!(field(old, "n"), "1");
        }
        // The documented caveat of the read-back (identity DEFAULT): when the row is gone by
        // the time the update is processed, the column is null, and the delete follows. With
        // REPLICA IDENTITY FULL the old row still has the value.
        src.pause();
        tokio::time::sleep(Duration::from_millis(200)).await;
        db.client
            .batch_execute(&format!(
                "UPDATE {table} SET n = 3 WHERE id = 1; DELETE FROM {table} WHERE id = 1"
            ))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        src.resume();
        // One implicit transaction: the update, then the delete.
        let (changes, _) = st.next_txn().await;
        let want = if table == "docs" {
            "null".to_string()
        } else {
            big.clone()
        };
        assert_eq!(changes.len(), 2, "{table}");
        assert_eq!(changes[0].action, Action::Update);
        assert_eq!(
            field(changes[0].new.as_ref().unwrap(), "big"),
            want,
            "{table}"
        );
        assert_eq!(changes[1].action, Action::Delete);
        st.stop().await.unwrap();
    }
}

#[tokio::test]
async fn concurrent_writer_during_slot_creation_loses_and_duplicates_nothing() {
    let db = new_database().await;
    db.client
        .batch_execute("CREATE TABLE seq (id bigserial PRIMARY KEY, v text)")
        .await
        .unwrap();
    let cl = cluster();
    let writer_client = cl.connect(&db.name).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop_w = stop.clone();
    let writer = tokio::spawn(async move {
        let mut ids = Vec::new();
        while !stop_w.load(std::sync::atomic::Ordering::SeqCst) {
            let row = writer_client
                .query_one("INSERT INTO seq (v) VALUES ('w') RETURNING id", &[])
                .await
                .unwrap();
            ids.push(row.get::<_, i64>(0));
        }
        ids
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let src = Arc::new(PostgresSource::new(config(&db, "seq", SlotMode::Temporary)));
    src.init(&[]).await.unwrap();
    let (base, rows) = take_baseline(&src, "seq").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let written: BTreeSet<i64> = writer.await.unwrap().into_iter().collect();
    db.client
        .batch_execute("INSERT INTO seq (id, v) VALUES (-1, 'end')")
        .await
        .unwrap();

    let baseline_ids: Vec<i64> = rows
        .iter()
        .map(|r| field(r, "id").parse().unwrap())
        .collect();
    let mut streamed: Vec<i64> = Vec::new();
    let mut st = Streamer::start(src.clone(), &base);
    'outer: loop {
        let (changes, _) = st.next_txn().await;
        for c in changes {
            let id: i64 = field(c.new.as_ref().unwrap(), "id").parse().unwrap();
            if id == -1 {
                break 'outer;
            }
            streamed.push(id);
        }
    }
    st.stop().await.unwrap();
    assert!(
        !baseline_ids.is_empty() && !streamed.is_empty(),
        "the writer ran across the slot creation"
    );
    let mut all: Vec<i64> = baseline_ids
        .iter()
        .chain(streamed.iter())
        .copied()
        .collect();
    all.sort();
    let unique: BTreeSet<i64> = all.iter().copied().collect();
    assert_eq!(unique.len(), all.len(), "a row was delivered twice");
    assert_eq!(unique, written, "baseline + stream = everything written");
}

#[tokio::test]
async fn persistent_slot_resumes_after_ack_without_loss_or_duplicates() {
    let db = new_database().await;
    db.client
        .batch_execute("CREATE TABLE r (id int8 PRIMARY KEY)")
        .await
        .unwrap();
    let cfg = config(&db, "r", SlotMode::Persistent);
    let slot = cfg.slot_name.clone();
    let src = Arc::new(PostgresSource::new(cfg.clone()));
    src.init(&[]).await.unwrap();
    assert!(src.supports_resume());
    let (base, _) = take_baseline(&src, "r").await;
    assert_eq!(src.last_acked_position().await.unwrap(), None);
    let consistent = Lsn::parse(&base).unwrap().0;
    let mut st = Streamer::start(src.clone(), &base);
    let mut positions = Vec::new();
    for id in 1..=3 {
        db.client
            .execute("INSERT INTO r VALUES ($1)", &[&(id as i64)])
            .await
            .unwrap();
        let (changes, pos) = st.next_txn().await;
        assert_eq!(
            field(changes[0].new.as_ref().unwrap(), "id"),
            id.to_string()
        );
        positions.push(pos);
    }
    // Received is not acknowledged: the slot has not moved.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(confirmed_flush(&db, &slot).await, Some(consistent));
    src.ack(&positions[1]).await.unwrap();
    let acked = Lsn::parse(&positions[1]).unwrap().0;
    let third = Lsn::parse(&positions[2]).unwrap().0;
    let mut moved = None;
    for _ in 0..100 {
        let c = confirmed_flush(&db, &slot).await.unwrap();
        if c > acked {
            moved = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let moved = moved.expect("the ack reached the server");
    assert!(moved <= third, "acked past the acknowledged transaction");
    assert!(src.lag().bytes.is_some() || src.refresh_lag().await.unwrap().is_some());
    st.stop().await.unwrap();
    // The persistent slot stays.
    assert!(confirmed_flush(&db, &slot).await.is_some());

    db.client
        .execute("INSERT INTO r VALUES (4)", &[])
        .await
        .unwrap();
    let src2 = Arc::new(PostgresSource::new(cfg.clone()));
    src2.init(&[]).await.unwrap();
    assert!(src2.supports_resume());
    let from = src2
        .last_acked_position()
        .await
        .unwrap()
        .expect("the slot's confirmed position");
    assert_eq!(Lsn::parse(&from).unwrap().0, moved);
    let mut st = Streamer::start(src2.clone(), &from);
    let mut got = Vec::new();
    for _ in 0..2 {
        let (changes, _) = st.next_txn().await;
        for c in changes {
            got.push(field(c.new.as_ref().unwrap(), "id"));
        }
    }
    assert_eq!(got, vec!["3", "4"]);
    st.expect_quiet(Duration::from_millis(500)).await;
    st.stop().await.unwrap();

    // Resuming from a delivered commit position skips that transaction.
    let src3 = Arc::new(PostgresSource::new(cfg.clone()));
    src3.init(&[]).await.unwrap();
    let mut st = Streamer::start(src3.clone(), &positions[2]);
    let (changes, _) = st.next_txn().await;
    assert_eq!(field(changes[0].new.as_ref().unwrap(), "id"), "4");
    st.stop().await.unwrap();

    // A slot that disappeared cannot resume: the consumer must take a new baseline.
    drop_slot_when_idle(&db, &slot).await;
    let src4 = Arc::new(PostgresSource::new(cfg.clone()));
    src4.init(&[]).await.unwrap();
    let (tx, _rx) = mpsc::channel(4);
    let err = src4.stream(&positions[2], tx).await.unwrap_err();
    assert!(err.is_rebaseline(), "{err}");
    assert!(err.to_string().contains(&slot), "{err}");
    // ... which recreates the slot.
    let (base2, rows) = take_baseline(&src4, "r").await;
    assert_eq!(rows.len(), 4);
    assert!(Lsn::parse(&base2).unwrap().0 > third);
    src4.close().await;
    drop_slot_when_idle(&db, &slot).await;
}

#[tokio::test]
async fn reconnects_after_the_walsender_dies_without_duplicates() {
    let db = new_database().await;
    db.client
        .batch_execute("CREATE TABLE k (id int8 PRIMARY KEY)")
        .await
        .unwrap();
    let cfg = config(&db, "k", SlotMode::Persistent);
    let slot = cfg.slot_name.clone();
    let src = Arc::new(PostgresSource::new(cfg));
    src.init(&[]).await.unwrap();
    let (base, _) = take_baseline(&src, "k").await;
    let mut st = Streamer::start(src.clone(), &base);
    db.client
        .execute("INSERT INTO k VALUES (1)", &[])
        .await
        .unwrap();
    let (c, _) = st.next_txn().await;
    assert_eq!(field(c[0].new.as_ref().unwrap(), "id"), "1");
    // Nothing acked: after the reconnect the server sends transaction 1 again; the source must
    // not deliver it twice.
    let killed: bool = db
        .client
        .query_one("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1", &[&slot])
        .await
        .unwrap()
        .get(0);
    assert!(killed);
    db.client
        .execute("INSERT INTO k VALUES (2)", &[])
        .await
        .unwrap();
    db.client
        .execute("INSERT INTO k VALUES (3)", &[])
        .await
        .unwrap();
    let mut got = Vec::new();
    for _ in 0..2 {
        let (c, _) = st.next_txn().await;
        got.extend(c.iter().map(|c| field(c.new.as_ref().unwrap(), "id")));
    }
    assert_eq!(got, vec!["2", "3"]);
    st.expect_quiet(Duration::from_millis(500)).await;

    // Pause holds events back; resume delivers them.
    src.pause();
    tokio::time::sleep(Duration::from_millis(200)).await;
    db.client
        .execute("INSERT INTO k VALUES (4)", &[])
        .await
        .unwrap();
    st.expect_quiet(Duration::from_millis(1000)).await;
    src.resume();
    let (c, _) = st.next_txn().await;
    assert_eq!(field(c[0].new.as_ref().unwrap(), "id"), "4");
    st.stop().await.unwrap();
    drop_slot_when_idle(&db, &slot).await;
}

#[tokio::test]
async fn an_invalidated_slot_requires_a_new_baseline() {
    let lossy = lossy_cluster();
    let db = new_database_on(lossy).await;
    for sql in [
        "ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'",
        "SELECT pg_reload_conf()",
        "CREATE TABLE big (id int8 PRIMARY KEY, v text)",
    ] {
        db.client.batch_execute(sql).await.unwrap();
    }
    let cfg = config(&db, "big", SlotMode::Persistent);
    let slot = cfg.slot_name.clone();
    let src = PostgresSource::new(cfg.clone());
    src.init(&[]).await.unwrap();
    let (base, _) = take_baseline(&src, "big").await;
    src.close().await;
    // Write and recycle WAL until the idle slot loses what it needs.
    let mut lost = false;
    for round in 0..40 {
        db.client
            .batch_execute(&format!(
                "INSERT INTO big SELECT g + {round} * 100000, repeat('x', 200) FROM generate_series(1, 20000) g"
            ))
            .await
            .unwrap();
        db.client
            .batch_execute("SELECT pg_switch_wal()")
            .await
            .unwrap();
        db.client.batch_execute("CHECKPOINT").await.unwrap();
        let status: Option<String> = db
            .client
            .query_one(
                "SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await
            .unwrap()
            .get(0);
        if status.as_deref() == Some("lost") {
            lost = true;
            break;
        }
    }
    assert!(lost, "the slot was never invalidated");
    let src = PostgresSource::new(cfg);
    src.init(&[]).await.unwrap();
    assert_eq!(src.last_acked_position().await.unwrap(), None);
    let (tx, _rx) = mpsc::channel(4);
    let err = src.stream(&base, tx).await.unwrap_err();
    assert!(err.is_rebaseline(), "{err}");
    assert!(err.to_string().contains("invalidated"), "{err}");
    // A new baseline replaces the lost slot.
    let (_, rows) = take_baseline(&src, "big").await;
    assert!(rows.len() >= 20000);
    src.close().await;
    drop_slot_when_idle(&db, &slot).await;
}

#[tokio::test]
async fn several_tables_in_one_source() {
    let db = new_database().await;
    db.client
        .batch_execute(
            "CREATE TABLE a (id int4 PRIMARY KEY, v text);
             CREATE TABLE b (k text PRIMARY KEY, n numeric);
             INSERT INTO a VALUES (1, 'one');
             INSERT INTO b VALUES ('x', 1.10);",
        )
        .await
        .unwrap();
    let mut cfg = config(&db, "a", SlotMode::Temporary);
    cfg.tables = vec![tid("a"), tid("b")];
    let src = Arc::new(PostgresSource::new(cfg));
    let schemas = src.init(&[]).await.unwrap();
    assert_eq!(schemas.len(), 2);
    let (tx, mut rx) = mpsc::channel::<(TableId, Row)>(4);
    let collect = async move {
        let mut rows = Vec::new();
        while let Some((t, row)) = rx.recv().await {
            rows.push(format!("{t} {}", row.as_str()));
        }
        rows.sort();
        rows
    };
    let tables = [tid("a"), tid("b")];
    let (pos, rows) = tokio::join!(src.baseline(&tables, tx), collect);
    assert_eq!(
        rows,
        vec![
            r#"public.a {"id":1,"v":"one"}"#,
            r#"public.b {"k":"x","n":1.10}"#
        ]
    );
    let mut st = Streamer::start(src.clone(), &pos.unwrap());
    db.client
        .batch_execute(
            "BEGIN; INSERT INTO b VALUES ('y', 2); UPDATE a SET v = 'uno'; COMMIT; TRUNCATE a, b;",
        )
        .await
        .unwrap();
    let (changes, _) = st.next_txn().await;
    let got: Vec<String> = changes
        .iter()
        .map(|c| {
            format!(
                "{} {} {}",
                c.table,
                c.action,
                c.new.as_ref().unwrap().as_str()
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            r#"public.b INSERT {"k":"y","n":2}"#,
            r#"public.a UPDATE {"id":1,"v":"uno"}"#
        ]
    );
    let (changes, _) = st.next_txn().await;
    let got: BTreeSet<String> = changes
        .iter()
        .map(|c| format!("{} {}", c.table, c.action))
        .collect();
    assert_eq!(
        got,
        BTreeSet::from([
            "public.a TRUNCATE".to_string(),
            "public.b TRUNCATE".to_string()
        ])
    );
    st.stop().await.unwrap();

    // validate_tables names what is wrong with each table.
    db.client
        .batch_execute("CREATE TABLE nokey (x int4)")
        .await
        .unwrap();
    let errors = src
        .validate_tables(&[tid("a"), tid("nokey"), tid("missing")])
        .await;
    let got: Vec<(String, String)> = errors
        .iter()
        .map(|e| (e.table.to_string(), e.code.clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("public.nokey".to_string(), "NO_KEY".to_string()),
            ("public.missing".to_string(), "NOT_FOUND".to_string())
        ]
    );
}
