//! Partitioned tables on real PostgreSQL: a partitioned parent (RANGE with a LIST
//! sub-partition and a DEFAULT, HASH) exports as one table; `larch restore` recreates the same
//! partitions (key, bounds, levels) and every row lands in the partition it came from; into an
//! existing partitioned schema with foreign keys to and from it, the rows route and the keys
//! hold. A tampered bound in the manifest is refused before the target is touched.

use std::path::Path;
use std::process::{Command, Output};

use crate::support::postgres::{Database, new_database};

const SCHEMA: &str = "
    CREATE TABLE regions (code text PRIMARY KEY);
    INSERT INTO regions VALUES ('eu'), ('us'), ('ap');
    CREATE TABLE events (id int8, at date, region text REFERENCES regions, v text,
                         PRIMARY KEY (id, at, region)) PARTITION BY RANGE (at);
    CREATE TABLE events_2025 PARTITION OF events
        FOR VALUES FROM ('2025-01-01') TO ('2026-01-01') PARTITION BY LIST (region);
    CREATE TABLE events_2025_eu PARTITION OF events_2025 FOR VALUES IN ('eu');
    CREATE TABLE events_2025_rest PARTITION OF events_2025 DEFAULT;
    CREATE TABLE events_2026 PARTITION OF events FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
    CREATE TABLE events_other PARTITION OF events DEFAULT;
    CREATE TABLE sessions (id int8 PRIMARY KEY, who text) PARTITION BY HASH (id);
    CREATE TABLE sessions_0 PARTITION OF sessions FOR VALUES WITH (MODULUS 2, REMAINDER 0);
    CREATE TABLE sessions_1 PARTITION OF sessions FOR VALUES WITH (MODULUS 2, REMAINDER 1);
    CREATE TABLE notes (id int8 PRIMARY KEY, session int8 REFERENCES sessions, body text);";

async fn fill(db: &Database) {
    db.client
        .batch_execute(&format!(
            "{SCHEMA}
             INSERT INTO events SELECT g, date '2024-10-01' + (g % 900),
                    (ARRAY['eu','us','ap'])[1 + g % 3], md5(g::text)
               FROM generate_series(1, 3000) g;
             INSERT INTO sessions SELECT g, 'who ' || g FROM generate_series(1, 200) g;
             INSERT INTO notes SELECT g, 1 + g % 200, 'note ' || g FROM generate_series(1, 300) g;"
        ))
        .await
        .unwrap();
}

/// Every partition under `table`, at every level: name, parent, bound and key, and its rows'
/// count and digest.
async fn shape(db: &Database, table: &str) -> Vec<String> {
    db.client
        .query(
            "SELECT t.relid::regclass::text, coalesce(t.parentrelid::regclass::text, '-'),
                    coalesce(pg_get_expr(c.relpartbound, c.oid), '-'),
                    coalesce(pg_get_partkeydef(c.oid), '-'), c.relkind::text
               FROM pg_partition_tree($1::text::regclass) t JOIN pg_class c ON c.oid = t.relid
              ORDER BY 1",
            &[&table],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| {
            (0..5)
                .map(|i| r.get::<_, String>(i))
                .collect::<Vec<_>>()
                .join(" | ")
        })
        .collect()
}

async fn rows_by_partition(db: &Database, table: &str) -> Vec<String> {
    db.client
        .query(
            &format!(
                "SELECT tableoid::regclass::text || ': ' || count(*) || ' md5 ' ||
                        md5(string_agg(t::text, '|' ORDER BY t::text))
                   FROM {table} t GROUP BY tableoid ORDER BY 1"
            ),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

fn larch(dsn: &str, args: &[&str], archive: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_larch"))
        .env("LARCH_PG_DSN", dsn)
        .env("LARCH_LOG", "warn")
        .args(args)
        .args(["--store", "local", "--path"])
        .arg(archive)
        .output()
        .unwrap()
}

fn ok(out: &Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn partitioned_tables_export_as_one_and_restore_into_the_same_partitions() {
    let source = new_database().await;
    fill(&source).await;
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("archive");
    let slot = format!("larch_parts_{}", source.name);
    ok(&larch(
        &source.dsn,
        &[
            "export", "--slot", &slot, "--table", "events", "--table", "sessions", "--table",
            "notes",
        ],
        &archive,
    ));
    let manifest: serde_json::Value = serde_json::from_slice(
        &std::fs::read(archive.join("public.events/manifest.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(manifest["partitioning"]["key"], "RANGE (at)", "{manifest}");
    assert_eq!(
        manifest["partitioning"]["partitions"][0]["partitioning"]["key"],
        "LIST (region)"
    );

    // Into a fresh database: the same tree, the same rows in the same partitions.
    let fresh = new_database().await;
    for split in ["1", "2"] {
        fresh
            .client
            .batch_execute("DROP TABLE IF EXISTS events, sessions CASCADE")
            .await
            .unwrap();
        ok(&larch(
            &fresh.dsn,
            &["restore", "--table", "events,sessions", "--split", split],
            &archive,
        ));
        for table in ["events", "sessions"] {
            assert_eq!(
                shape(&fresh, table).await,
                shape(&source, table).await,
                "{table}"
            );
            assert_eq!(
                rows_by_partition(&fresh, table).await,
                rows_by_partition(&source, table).await,
                "{table} with --split {split}"
            );
        }
    }

    // Into a database holding the schema with its foreign keys: the rows route to the
    // partitions and both keys (to regions, from notes) hold.
    let existing = new_database().await;
    existing.client.batch_execute(SCHEMA).await.unwrap();
    ok(&larch(
        &existing.dsn,
        &[
            "restore",
            "--table",
            "events,sessions,notes",
            "--if-exists",
            "replace",
        ],
        &archive,
    ));
    for table in ["events", "sessions", "notes"] {
        assert_eq!(
            rows_by_partition(&existing, table).await,
            rows_by_partition(&source, table).await,
            "{table}"
        );
    }
    existing
        .client
        .batch_execute("INSERT INTO notes VALUES (5000, 5, 'ok')")
        .await
        .unwrap();
    let orphan = existing
        .client
        .batch_execute("INSERT INTO notes VALUES (5001, 9999, 'no such session')")
        .await
        .unwrap_err();
    assert_eq!(orphan.code().unwrap().code(), "23503", "{orphan}");
}

/// A partitioned parent has no pages of its own: `--split` cuts it by ranges of its primary
/// key's first column, and the ranges together hold every row once.
#[tokio::test]
async fn a_partitioned_table_splits_by_ranges_of_its_primary_key() {
    let source = new_database().await;
    fill(&source).await;
    source
        .client
        .batch_execute(
            "INSERT INTO events SELECT g, date '2024-10-01' + (g % 900),
                    (ARRAY['eu','us','ap'])[1 + g % 3], md5(g::text)
               FROM generate_series(3001, 40000) g; ANALYZE events",
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("archive");
    let slot = format!("larch_psplit_{}", source.name);
    let out = Command::new(env!("CARGO_BIN_EXE_larch"))
        .env("LARCH_PG_DSN", &source.dsn)
        .env("LARCH_LOG", "info")
        .args([
            "export", "--slot", &slot, "--table", "events", "--split", "4",
        ])
        .args(["--store", "local", "--path"])
        .arg(&archive)
        .output()
        .unwrap();
    ok(&out);
    let log = String::from_utf8_lossy(&out.stderr);
    let line = log
        .lines()
        .find(|l| l.contains("split into ranges of its primary key"))
        .unwrap_or_else(|| panic!("no key split logged:\n{log}"));
    assert!(
        line.contains("ranges=4") || line.contains("\"ranges\":4"),
        "{line}"
    );

    let fresh = new_database().await;
    ok(&larch(
        &fresh.dsn,
        &["restore", "--table", "events"],
        &archive,
    ));
    assert_eq!(
        rows_by_partition(&fresh, "events").await,
        rows_by_partition(&source, "events").await
    );
}

#[tokio::test]
async fn a_tampered_partition_bound_is_refused_before_the_target_is_touched() {
    let source = new_database().await;
    fill(&source).await;
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("archive");
    let slot = format!("larch_tamper_{}", source.name);
    ok(&larch(
        &source.dsn,
        &["export", "--slot", &slot, "--table", "sessions"],
        &archive,
    ));
    let path = archive.join("public.sessions/manifest.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let tampered = text.replacen(
        "FOR VALUES WITH (modulus 2, remainder 0)",
        "FOR VALUES WITH (modulus 2, remainder 0); DROP TABLE victim",
        1,
    );
    assert_ne!(text, tampered, "{text}");
    std::fs::write(&path, tampered).unwrap();
    let target = new_database().await;
    target
        .client
        .batch_execute("CREATE TABLE victim (id int)")
        .await
        .unwrap();
    let out = larch(&target.dsn, &["restore", "--table", "sessions"], &archive);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(
            "table public.sessions: the manifest's partitioning: partition public.sessions_0: bound"
        ),
        "{err}"
    );
    let tables: i64 = target
        .client
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(tables, 1, "only the victim table, untouched");
}
