//! The PostgreSQL source against a real PostgreSQL 15 (tests/it/support/postgres.rs).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use larch::archive::model::{Action, TableId};
use larch::archive::position::Lsn;
use larch::archive::value::Row;
use larch::source::postgres::{PostgresConfig, PostgresSource, SlotMode};
use larch::source::{ChangeEvent, SourceError, SourceEvent, SyncSource};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::support::postgres::{
    Database, cluster, lossy_cluster, new_database, new_database_on, replica_cluster,
};

const WAIT: Duration = Duration::from_secs(30);

fn config(db: &Database, table: &str, mode: SlotMode) -> PostgresConfig {
    let t = TableId::new("public", table);
    let name = format!("larch_{}_{}", db.name, table);
    let mut c = PostgresConfig::new(db.dsn.clone(), vec![t], name.clone(), name);
    c.slot_mode = mode;
    c.reconnect.initial = Duration::from_millis(100);
    c.reconnect.max = Duration::from_secs(1);
    c
}

fn tid(table: &str) -> TableId {
    TableId::new("public", table)
}

async fn take_baseline(src: &PostgresSource, table: &str) -> (String, Vec<Row>) {
    let (tx, mut rx) = mpsc::channel(4);
    let collect = async move {
        let mut rows = Vec::new();
        while let Some((t, row)) = rx.recv().await {
            assert_eq!(t, tid(table));
            rows.push(row);
        }
        rows
    };
    let tables = [tid(table)];
    let (pos, rows) = tokio::join!(src.baseline(&tables, tx), collect);
    (pos.expect("baseline"), rows)
}

fn field(row: &Row, name: &str) -> String {
    row.get(name)
        .unwrap_or_else(|| panic!("row {row:?} has no field {name}"))
        .get()
        .to_string()
}

/// An LSN in laredo's spelling (the one `Lsn` formats: uppercase, low half padded to 8).
fn is_laredo_lsn(p: &str) -> bool {
    Lsn::parse(p).is_some_and(|l| l.to_string() == p)
}

struct Streamer {
    src: Arc<PostgresSource>,
    rx: mpsc::Receiver<SourceEvent>,
    task: JoinHandle<Result<(), SourceError>>,
}

impl Streamer {
    fn start(src: Arc<PostgresSource>, from: &str) -> Streamer {
        let (tx, rx) = mpsc::channel(16);
        let s = src.clone();
        let from = from.to_string();
        let task = tokio::spawn(async move { s.stream(&from, tx).await });
        Streamer { src, rx, task }
    }

    /// The changes of the next transaction and its checkpoint position.
    async fn next_txn(&mut self) -> (Vec<ChangeEvent>, String) {
        let mut changes = Vec::new();
        loop {
            let ev = tokio::time::timeout(WAIT, self.rx.recv())
                .await
                .expect("timed out waiting for a replication event")
                .expect("the stream ended");
            match ev {
                SourceEvent::Change(c) => changes.push(c),
                SourceEvent::Checkpoint { position } => return (changes, position),
            }
        }
    }

    /// Asserts nothing arrives for a while.
    async fn expect_quiet(&mut self, wait: Duration) {
        if let Ok(Some(ev)) = tokio::time::timeout(wait, self.rx.recv()).await {
            panic!("unexpected event {ev:?}");
        }
    }

    async fn stop(self) -> Result<(), SourceError> {
        self.src.close().await;
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("stream did not stop")
            .unwrap()
    }
}

async fn insert_lsn(db: &Database) -> u64 {
    let row = db
        .client
        .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .await
        .unwrap();
    Lsn::parse(&row.get::<_, String>(0)).unwrap().0
}

async fn confirmed_flush(db: &Database, slot: &str) -> Option<u64> {
    let row = db
        .client
        .query_opt(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .unwrap()?;
    row.get::<_, Option<String>>(0)
        .and_then(|s| Lsn::parse(&s))
        .map(|l| l.0)
}

/// Drops a slot once its walsender has gone (a closed session ends asynchronously).
async fn drop_slot_when_idle(db: &Database, slot: &str) {
    for _ in 0..100 {
        let r = db
            .client
            .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
            .await;
        match r {
            Ok(_) => return,
            Err(e)
                if e.to_string().contains("is active")
                    || format!("{e:?}").contains("is active") =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("dropping slot {slot}: {e:?}"),
        }
    }
    panic!("slot {slot} stayed active");
}

#[tokio::test]
async fn schema_discovery() {
    let db = new_database().await;
    db.client
        .batch_execute(
            "CREATE DOMAIN posint AS int4 CHECK (VALUE > 0);
             CREATE TABLE orders (
                 region text NOT NULL,
                 id int8 NOT NULL,
                 name varchar(20) NOT NULL DEFAULT 'x',
                 tags int4[],
                 qty posint,
                 created timestamptz DEFAULT now(),
                 PRIMARY KEY (id, region));",
        )
        .await
        .unwrap();
    let src = PostgresSource::new(config(&db, "orders", SlotMode::Temporary));
    let schemas = src.init(&[tid("orders")]).await.expect("init");
    let cols = &schemas[&tid("orders")];
    let summary: Vec<String> = cols
        .iter()
        .map(|c| {
            format!(
                "{} {} null={} pk={} ord={} pkord={} def={:?} max={}",
                c.name,
                c.type_name,
                c.nullable,
                c.primary_key,
                c.ordinal_position,
                c.primary_key_ordinal,
                c.default_value,
                c.max_length
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            "region text null=false pk=true ord=1 pkord=2 def=None max=0",
            "id int8 null=false pk=true ord=2 pkord=1 def=None max=0",
            "name varchar null=false pk=false ord=3 pkord=0 def=Some(\"'x'::character varying\") max=20",
            "tags _int4 null=true pk=false ord=4 pkord=0 def=None max=0",
            "qty int4 null=true pk=false ord=5 pkord=0 def=None max=0",
            "created timestamptz null=true pk=false ord=6 pkord=0 def=Some(\"now()\") max=0",
        ]
    );
    assert_eq!(
        src.table_schema(&tid("orders")).unwrap().key_fields,
        vec!["id", "region"]
    );
    // The publication was created for exactly this table.
    let pub_tables: Vec<String> = db
        .client
        .query(
            "SELECT tablename::text FROM pg_publication_tables WHERE pubname = $1",
            &[&src.config().publication_name],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(pub_tables, vec!["orders"]);
    // A second init on the same source is fine (the publication is ours).
    src.init(&[tid("orders")]).await.expect("second init");
    src.close().await;
}

const ALL_COLUMNS: &str = "i2, i4, i8, num, num_s, f4, f8, b, t, vc, bp, nm, en, u, j, jb, by, ts, tstz, d, tm, tmtz, iv, ai, at, a2, an, ajb, dom, inet_c";

pub(crate) async fn create_all_types(db: &Database) {
    db.client
        .batch_execute(&format!(
            r#"CREATE TYPE mood AS ENUM ('sad', 'happy');
             CREATE DOMAIN posint AS int4 CHECK (VALUE > 0);
             CREATE TABLE alltypes (
               id int8 PRIMARY KEY,
               i2 int2, i4 int4, i8 int8, num numeric, num_s numeric(10,3), f4 float4, f8 float8, b bool,
               t text, vc varchar(20), bp char(5), nm name, en mood, u uuid, j json, jb jsonb, by bytea,
               ts timestamp, tstz timestamptz, d date, tm time, tmtz timetz, iv interval,
               ai int4[], at text[], a2 int4[][], an numeric[], ajb jsonb[], dom posint, inet_c inet);
             INSERT INTO alltypes (id, {ALL_COLUMNS}) VALUES
              (1000000, -32768, 2147483647, 9007199254740993, 12345678901234567890.123, 123.45, 1.5, 0.1, true,
               E'tab\there "q" back\\slash\nnew', 'varchar', 'ab', 'nm', 'happy',
               'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{{"b": 1,  "a": [1, 2.50]}}', '{{"b": 1, "a": [1, 2.50]}}',
               '\x0102ff', '2024-01-02 03:04:05.123456', '2024-01-02 03:04:05.5+02', '2024-02-29',
               '23:59:59.25', '03:04:05+05:30', '1 year 2 months 3 days 04:05:06',
               '{{1,NULL,3}}', '{{"a b","NULL",NULL,"x\"y"}}', '{{{{1,2}},{{3,4}}}}', '{{1.50,NaN}}',
               ARRAY['{{"k": [1]}}'::jsonb], 7, '10.0.0.1'),
              (1000001, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
               NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
              (1000002, 0, 0, -1, 'NaN', -0.0001, '-Infinity', 'Infinity', false, '', '', '', '', 'sad',
               '00000000-0000-0000-0000-000000000000', '[]', 'null', '\x', 'infinity', '-infinity', '0044-03-15 BC',
               '00:00:00', '00:00:00-03:30', '0 seconds', '{{}}', '{{""}}', '{{{{NULL}}}}', '{{-1e-3}}', '{{}}', 1, '::1');
             INSERT INTO alltypes (id, f8) VALUES (1000003, 1e21), (1000004, 1.234e-7);"#
        ))
        .await
        .unwrap();
}

fn expected_row_1() -> Vec<(&'static str, &'static str)> {
    vec![
        ("id", "1000000"),
        ("i2", "-32768"),
        ("i4", "2147483647"),
        ("i8", "9007199254740993"),
        ("num", "12345678901234567890.123"),
        ("num_s", "123.450"),
        ("f4", "1.5"),
        ("f8", "0.1"),
        ("b", "true"),
        ("t", r#""tab\there \"q\" back\\slash\nnew""#),
        ("vc", r#""varchar""#),
        ("bp", r#""ab   ""#),
        ("nm", r#""nm""#),
        ("en", r#""happy""#),
        ("u", r#""a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11""#),
        ("j", r#"{"b":1,"a":[1,2.50]}"#),
        ("jb", r#"{"a":[1,2.50],"b":1}"#),
        ("by", r#""AQL/""#),
        ("ts", r#""2024-01-02T03:04:05.123456Z""#),
        ("tstz", r#""2024-01-02T01:04:05.5Z""#),
        ("d", r#""2024-02-29""#),
        ("tm", r#""23:59:59.25""#),
        ("tmtz", r#""03:04:05+05:30""#),
        ("iv", r#""P1Y2M3DT4H5M6S""#),
        ("ai", "[1,null,3]"),
        ("at", r#"["a b","NULL",null,"x\"y"]"#),
        ("a2", "[[1,2],[3,4]]"),
        ("an", r#"[1.50,"NaN"]"#),
        ("ajb", r#"[{"k":[1]}]"#),
        ("dom", "7"),
        ("inet_c", r#""10.0.0.1""#),
    ]
}

fn expected_row_3() -> Vec<(&'static str, &'static str)> {
    vec![
        ("num", r#""NaN""#),
        ("num_s", "0.000"),
        ("f4", r#""-Infinity""#),
        ("f8", r#""Infinity""#),
        ("b", "false"),
        ("t", r#""""#),
        ("bp", r#""     ""#),
        ("j", "[]"),
        ("jb", "null"),
        ("by", r#""""#),
        ("ts", r#""infinity""#),
        ("tstz", r#""-infinity""#),
        ("d", r#""0044-03-15 BC""#),
        ("tm", r#""00:00:00""#),
        ("tmtz", r#""00:00:00-03:30""#),
        ("iv", r#""PT0S""#),
        ("ai", "[]"),
        ("at", r#"[""]"#),
        ("a2", "[[null]]"),
        ("an", "[-0.001]"),
        ("inet_c", r#""::1""#),
    ]
}

#[tokio::test]
async fn baseline_maps_every_type_and_stream_maps_identically() {
    let db = new_database().await;
    create_all_types(&db).await;
    let src = Arc::new(PostgresSource::new(config(
        &db,
        "alltypes",
        SlotMode::Temporary,
    )));
    src.init(&[tid("alltypes")]).await.expect("init");
    let (pos, mut rows) = take_baseline(&src, "alltypes").await;
    assert!(is_laredo_lsn(&pos), "{pos}");
    rows.sort_by_key(|r| field(r, "id").parse::<i64>().unwrap());
    assert_eq!(rows.len(), 5);
    for (name, want) in expected_row_1() {
        assert_eq!(field(&rows[0], name), want, "column {name}");
    }
    assert_eq!(rows[0].field_names().len(), 31);
    for name in ALL_COLUMNS.split(", ") {
        assert_eq!(field(&rows[1], name), "null", "column {name}");
    }
    for (name, want) in expected_row_3() {
        assert_eq!(field(&rows[2], name), want, "column {name}");
    }
    assert_eq!(field(&rows[3], "f8"), "1e+21");
    assert_eq!(field(&rows[4], "f8"), "1.234e-07");

    // The same values through the replication stream map to the same JSON.
    let mut st = Streamer::start(src.clone(), &pos);
    db.client
        .batch_execute(&format!(
            "INSERT INTO alltypes (id, {ALL_COLUMNS}) SELECT id + 10, {ALL_COLUMNS} FROM alltypes"
        ))
        .await
        .unwrap();
    let (changes, _) = st.next_txn().await;
    assert_eq!(changes.len(), 5);
    for c in &changes {
        assert_eq!(c.action, Action::Insert);
        let new = c.new.as_ref().unwrap();
        let id: i64 = field(new, "id").parse().unwrap();
        let base = rows
            .iter()
            .find(|r| field(r, "id") == (id - 10).to_string())
            .unwrap();
        for name in ALL_COLUMNS.split(", ") {
            assert_eq!(
                field(new, name),
                field(base, name),
                "column {name} of row {id}"
            );
        }
    }
    st.stop().await.expect("stream ends cleanly on close");
}

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
async fn bad_inputs_have_clear_errors() {
    let db = new_database().await;
    db.client
        .batch_execute(
            "CREATE TABLE nopk (a int4, b text);
             CREATE TABLE other (id int4 PRIMARY KEY);
             CREATE TABLE mine (id int4 PRIMARY KEY);
             CREATE PUBLICATION shared_pub FOR TABLE other;",
        )
        .await
        .unwrap();

    let err = PostgresSource::new(config(&db, "nope", SlotMode::Temporary))
        .init(&[])
        .await
        .unwrap_err();
    assert!(
        format!("{err:#}").contains("table public.nope does not exist"),
        "{err:#}"
    );

    let err = PostgresSource::new(config(&db, "nopk", SlotMode::Temporary))
        .init(&[])
        .await
        .unwrap_err();
    assert!(
        format!("{err:#}").contains("table public.nopk has no primary key"),
        "{err:#}"
    );
    let mut with_keys = config(&db, "nopk", SlotMode::Temporary);
    with_keys.key_fields = vec!["a".into()];
    // Without a replica identity, publishing the table would break its UPDATEs and DELETEs.
    let err = PostgresSource::new(with_keys.clone())
        .init(&[])
        .await
        .unwrap_err();
    let text = format!("{err:#}");
    assert!(
        text.contains(
            "table public.nopk has no replica identity (no primary key, REPLICA IDENTITY DEFAULT)"
        ) && text.contains("ALTER TABLE \"public\".\"nopk\" REPLICA IDENTITY FULL"),
        "{text}"
    );
    db.client
        .batch_execute("ALTER TABLE nopk REPLICA IDENTITY FULL")
        .await
        .unwrap();
    PostgresSource::new(with_keys.clone())
        .init(&[])
        .await
        .expect("key fields + a replica identity make it usable");
    with_keys.key_fields = vec!["zz".into()];
    let err = PostgresSource::new(with_keys).init(&[]).await.unwrap_err();
    assert!(
        format!("{err:#}").contains("key field \"zz\" is not a column of table public.nopk"),
        "{err:#}"
    );

    let mut shared = config(&db, "mine", SlotMode::Temporary);
    shared.publication_name = "shared_pub".into();
    let err = PostgresSource::new(shared).init(&[]).await.unwrap_err();
    assert!(
        format!("{err:#}").contains("publication shared_pub already exists"),
        "{err:#}"
    );
    let n: i64 = db
        .client
        .query_one("SELECT count(*) FROM pg_publication_tables WHERE pubname = 'shared_pub' AND tablename = 'other'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1, "the shared publication was not rewritten");

    // wal_level = replica on another cluster.
    let replica = replica_cluster();
    let mut cfg = config(&db, "mine", SlotMode::Temporary);
    cfg.dsn = replica.dsn("postgres");
    let err = PostgresSource::new(cfg).init(&[]).await.unwrap_err();
    let text = format!("{err:#}");
    assert!(
        text.contains("wal_level = replica")
            && text.contains("ALTER SYSTEM SET wal_level = logical"),
        "{text}"
    );

    // Wrong password (the role must authenticate; trust would hide it).
    let cl = cluster();
    let admin = cl.connect("postgres").await;
    admin
        .batch_execute("DO $$ BEGIN CREATE ROLE larch_pw LOGIN SUPERUSER PASSWORD 'right-secret'; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
        .await
        .unwrap();
    cl.require_password_for("larch_pw").await;
    let mut cfg = config(&db, "mine", SlotMode::Temporary);
    cfg.dsn = format!(
        "postgres://larch_pw:wrong-secret@127.0.0.1:{}/{}",
        cl.port, db.name
    );
    let err = PostgresSource::new(cfg.clone())
        .init(&[])
        .await
        .unwrap_err();
    let text = format!("{err:#} {err:?}");
    assert!(
        text.contains("password authentication failed for user \"larch_pw\""),
        "{text}"
    );
    assert!(
        !text.contains("wrong-secret"),
        "the password leaked: {text}"
    );
    // With the right password both connections (SQL and replication) authenticate.
    cfg.dsn = format!(
        "postgres://larch_pw:right-secret@127.0.0.1:{}/{}",
        cl.port, db.name
    );
    let src = PostgresSource::new(cfg);
    src.init(&[]).await.expect("init with the right password");
    take_baseline(&src, "mine").await;
    src.close().await;

    // Nothing listens on the port.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut cfg = config(&db, "mine", SlotMode::Temporary);
    cfg.dsn = format!("host=127.0.0.1 port={port} user=postgres password=hunter2 dbname=x");
    let err = PostgresSource::new(cfg).init(&[]).await.unwrap_err();
    let text = format!("{err:#}");
    assert!(
        text.contains(&format!(
            "cannot connect to PostgreSQL at 127.0.0.1:{port}/x as user postgres"
        )),
        "{text}"
    );
    assert!(text.to_lowercase().contains("refused"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
}

#[tokio::test]
async fn temporary_slot_names_never_collide() {
    let db = new_database().await;
    db.client
        .batch_execute("CREATE TABLE c (id int4 PRIMARY KEY)")
        .await
        .unwrap();
    let cfg = config(&db, "c", SlotMode::Temporary);
    let a = PostgresSource::new(cfg.clone());
    a.init(&[]).await.unwrap();
    take_baseline(&a, "c").await;
    // Another export with the same slot name is refused while the first one holds it.
    let b = PostgresSource::new(cfg);
    let err = b.init(&[]).await.unwrap_err();
    assert!(format!("{err:#}").contains("already exists"), "{err:#}");
    a.close().await;
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

#[tokio::test]
async fn connects_over_a_unix_socket() {
    let db = new_database().await;
    db.client
        .batch_execute("CREATE TABLE u (id int4 PRIMARY KEY); INSERT INTO u VALUES (1)")
        .await
        .unwrap();
    let mut cfg = config(&db, "u", SlotMode::Temporary);
    cfg.dsn = format!(
        "host={} port={} user=postgres dbname={}",
        cluster().dir.display(),
        cluster().port,
        db.name
    );
    let src = Arc::new(PostgresSource::new(cfg));
    src.init(&[]).await.expect("init over the socket");
    let (pos, rows) = take_baseline(&src, "u").await;
    assert_eq!(rows.len(), 1);
    let mut st = Streamer::start(src.clone(), &pos);
    db.client
        .execute("INSERT INTO u VALUES (2)", &[])
        .await
        .unwrap();
    let (c, _) = st.next_txn().await;
    assert_eq!(field(c[0].new.as_ref().unwrap(), "id"), "2");
    st.stop().await.unwrap();
}
