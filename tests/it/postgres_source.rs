//! The PostgreSQL source against a real PostgreSQL 15 (tests/it/support/postgres.rs).

use std::sync::Arc;
use std::time::Duration;

use larch::archive::model::{Action, TableId};
use larch::archive::position::Lsn;
use larch::archive::value::Row;
use larch::source::postgres::{PostgresConfig, PostgresSource, SlotMode};
use larch::source::{ChangeEvent, SourceError, SourceEvent, SyncSource};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::support::postgres::{Database, cluster, new_database, replica_cluster};

pub(crate) const WAIT: Duration = Duration::from_secs(30);

pub(crate) fn config(db: &Database, table: &str, mode: SlotMode) -> PostgresConfig {
    let t = TableId::new("public", table);
    let name = format!("larch_{}_{}", db.name, table);
    let mut c = PostgresConfig::new(db.dsn.clone(), vec![t], name.clone(), name);
    c.slot_mode = mode;
    c.reconnect.initial = Duration::from_millis(100);
    c.reconnect.max = Duration::from_secs(1);
    c
}

pub(crate) fn tid(table: &str) -> TableId {
    TableId::new("public", table)
}

pub(crate) async fn take_baseline(src: &PostgresSource, table: &str) -> (String, Vec<Row>) {
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

pub(crate) fn field(row: &Row, name: &str) -> String {
    row.get(name)
        .unwrap_or_else(|| panic!("row {row:?} has no field {name}"))
        .get()
        .to_string()
}

/// An LSN in laredo's spelling (the one `Lsn` formats: uppercase, low half padded to 8).
pub(crate) fn is_laredo_lsn(p: &str) -> bool {
    Lsn::parse(p).is_some_and(|l| l.to_string() == p)
}

pub(crate) struct Streamer {
    pub(crate) src: Arc<PostgresSource>,
    pub(crate) rx: mpsc::Receiver<SourceEvent>,
    pub(crate) task: JoinHandle<Result<(), SourceError>>,
}

impl Streamer {
    pub(crate) fn start(src: Arc<PostgresSource>, from: &str) -> Streamer {
        let (tx, rx) = mpsc::channel(16);
        let s = src.clone();
        let from = from.to_string();
        let task = tokio::spawn(async move { s.stream(&from, tx).await });
        Streamer { src, rx, task }
    }

    /// The changes of the next transaction and its checkpoint position.
    pub(crate) async fn next_txn(&mut self) -> (Vec<ChangeEvent>, String) {
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
    pub(crate) async fn expect_quiet(&mut self, wait: Duration) {
        if let Ok(Some(ev)) = tokio::time::timeout(wait, self.rx.recv()).await {
            panic!("unexpected event {ev:?}");
        }
    }

    pub(crate) async fn stop(self) -> Result<(), SourceError> {
        self.src.close().await;
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("stream did not stop")
            .unwrap()
    }
}

pub(crate) async fn insert_lsn(db: &Database) -> u64 {
    let row = db
        .client
        .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .await
        .unwrap();
    Lsn::parse(&row.get::<_, String>(0)).unwrap().0
}

pub(crate) async fn confirmed_flush(db: &Database, slot: &str) -> Option<u64> {
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
pub(crate) async fn drop_slot_when_idle(db: &Database, slot: &str) {
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
pub(crate) async fn schema_discovery() {
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

pub(crate) const ALL_COLUMNS: &str = "i2, i4, i8, num, num_s, f4, f8, b, t, vc, bp, nm, en, u, j, jb, by, ts, tstz, d, tm, tmtz, iv, ai, at, a2, an, ajb, dom, inet_c";

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

pub(crate) fn expected_row_1() -> Vec<(&'static str, &'static str)> {
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

pub(crate) fn expected_row_3() -> Vec<(&'static str, &'static str)> {
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
pub(crate) async fn baseline_maps_every_type_and_stream_maps_identically() {
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
pub(crate) async fn bad_inputs_have_clear_errors() {
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
pub(crate) async fn temporary_slot_names_never_collide() {
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
pub(crate) async fn connects_over_a_unix_socket() {
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
