//! The PostgreSQL target's baseline by COPY: a table with every mapped type (docs/postgres-types.md)
//! exported by `larch export` and restored by `larch engine` is the same table, compared as
//! `md5(string_agg(t::text, '|' ORDER BY id))` on both sides, whether the engine creates the
//! destination table or restores into one the user created with the source's own types (its
//! index and grant carried over), or into one a view depends on (refilled in place).

use std::process::Command;

use crate::engine_support::{start_engine, wait_ready};
use crate::support::postgres::{Database, new_database};

const DIGEST: &str = "SELECT count(*)::text || ' rows, md5 ' || md5(string_agg(t::text, '|' ORDER BY id)) FROM public.alltypes t";

async fn digest(db: &Database) -> String {
    db.client.query_one(DIGEST, &[]).await.unwrap().get(0)
}

fn engine_yaml(archive: &std::path::Path, dsn_file: &std::path::Path) -> String {
    format!(
        r#"
sources:
  seed:
    type: archive
    store: {{type: local, path: "{}"}}
    key_prefix: public.alltypes/
tables:
  - source: seed
    schema: public
    table: alltypes
    targets:
      - type: postgres
        connection_file: "{}"
"#,
        archive.display(),
        dsn_file.display()
    )
}

async fn restore(archive: &std::path::Path, dir: &std::path::Path, target: &Database) {
    let dsn_file = dir.join(format!("{}.dsn", target.name));
    std::fs::write(&dsn_file, &target.dsn).unwrap();
    let engine = start_engine(&engine_yaml(archive, &dsn_file)).await;
    wait_ready(engine.addr).await;
    engine.stop().await.unwrap();
}

#[tokio::test]
async fn a_restored_table_of_every_type_is_byte_equal_to_the_source() {
    let source = new_database().await;
    crate::postgres_source::create_all_types(&source).await;
    // `json` keeps its text as written; the archive drops whitespace outside strings (the one
    // documented change), so the source's json is written without any.
    source
        .client
        .batch_execute(
            r#"UPDATE alltypes SET j = '{"b":1,"a":[1,2.50]}' WHERE j IS NOT NULL AND j::text <> '[]';
               INSERT INTO alltypes (id, t, at, by, jb, ajb)
                 SELECT g, 'row ' || g || E' \\ \t', ARRAY['x' || g, NULL], int8send(g), jsonb_build_object('g', g),
                        ARRAY[jsonb_build_object('s', 'q"' || g)]
                   FROM generate_series(1, 5000) g;"#,
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let conn_file = dir.path().join("source.dsn");
    std::fs::write(&conn_file, &source.dsn).unwrap();
    let archive = dir.path().join("archive");
    let out = Command::new(env!("CARGO_BIN_EXE_larch"))
        .env_remove("LARCH_PG_DSN")
        .args(["export", "--connection-file"])
        .arg(&conn_file)
        .args(["--table", "alltypes", "--store", "local", "--path"])
        .arg(&archive)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let expected = digest(&source).await;
    assert!(expected.starts_with("5005 rows"), "{expected}");

    // The engine creates the table from the archive's columns (enum and domain become text).
    let created = new_database().await;
    restore(&archive, dir.path(), &created).await;
    assert_eq!(
        digest(&created).await,
        expected,
        "restored into a table larch created"
    );

    // The user created it with the source's types, an index and a grant: all kept.
    let prepared = new_database().await;
    crate::postgres_source::create_all_types(&prepared).await;
    prepared
        .client
        .batch_execute(
            "DELETE FROM alltypes; CREATE INDEX alltypes_t ON alltypes (t);
             DO $$ BEGIN CREATE ROLE larch_reader; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
             GRANT SELECT ON alltypes TO larch_reader",
        )
        .await
        .unwrap();
    restore(&archive, dir.path(), &prepared).await;
    assert_eq!(
        digest(&prepared).await,
        expected,
        "restored into the user's table"
    );
    let kept: (String, String, bool) = {
        let r = prepared
            .client
            .query_one(
                "SELECT (SELECT string_agg(indexname, ',' ORDER BY indexname) FROM pg_indexes WHERE tablename = 'alltypes'),
                        (SELECT format_type(atttypid, atttypmod) FROM pg_attribute
                          WHERE attrelid = 'public.alltypes'::regclass AND attname = 'en'),
                        has_table_privilege('larch_reader', 'public.alltypes', 'SELECT')",
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1), r.get(2))
    };
    assert_eq!(
        kept,
        (
            "alltypes_pkey,alltypes_t".to_string(),
            "mood".to_string(),
            true
        )
    );

    // A view on the table: it cannot be replaced, so it is refilled in place (same OID).
    let viewed = new_database().await;
    viewed
        .client
        .batch_execute(
            "CREATE TABLE alltypes (id int8 PRIMARY KEY, i2 int2, gone int4);
             INSERT INTO alltypes VALUES (1, 5, 1), (99, 6, 2);
             CREATE VIEW alltypes_ids AS SELECT id FROM alltypes",
        )
        .await
        .unwrap();
    let oid = "SELECT 'public.alltypes'::regclass::oid::int8";
    let before: i64 = viewed.client.query_one(oid, &[]).await.unwrap().get(0);
    restore(&archive, dir.path(), &viewed).await;
    assert_eq!(digest(&viewed).await, expected, "restored under a view");
    let after: i64 = viewed.client.query_one(oid, &[]).await.unwrap().get(0);
    let through_view: i64 = viewed
        .client
        .query_one("SELECT count(*) FROM alltypes_ids", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!((after, through_view), (before, 5005));
}

#[tokio::test]
async fn a_bad_value_mid_baseline_names_its_column_and_leaves_the_old_table() {
    use std::sync::Arc;

    use larch::archive::store::Store;
    use larch::archive::store::local::LocalStore;

    use crate::archive_build::{TestArchive, refs};
    use crate::engine_support::{eventually, get_json};

    let target = new_database().await;
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path().join("archive")).unwrap());
    let columns = crate::schema_changes::columns(&[("id", "int8"), ("blob", "bytea")], &["id"]);
    let mut a =
        TestArchive::new(store, "public.alltypes/", "public.alltypes").with_columns(columns);
    let old: Vec<String> = (1..=3)
        .map(|i| format!(r#"{{"blob":"AQL/","id":{i}}}"#))
        .collect();
    a.snapshot("0/100", &refs(&old)).await;
    let dsn_file = dir.path().join("target.dsn");
    std::fs::write(&dsn_file, &target.dsn).unwrap();
    let yaml = engine_yaml(&dir.path().join("archive"), &dsn_file).replace(
        "    key_prefix: public.alltypes/\n",
        "    key_prefix: public.alltypes/\n    follow: true\n    poll_interval: 100ms\n",
    );
    let engine = start_engine(&yaml).await;
    wait_ready(engine.addr).await;

    // A new epoch whose row 4000 (after a few batches were copied) has a bytea that is no base64.
    let new: Vec<String> = (1..=5000)
        .map(|i| {
            let blob = if i == 4000 { "not base64!" } else { "3q2+7w==" };
            format!(r#"{{"blob":"{blob}","id":{i}}}"#)
        })
        .collect();
    a.snapshot("0/200", &refs(&new)).await;
    let addr = engine.addr;
    let message = eventually(30, "the failed re-baseline in /status", || async move {
        get_json(addr, "/status").await["sources"]["seed"]["last_error"]["message"]
            .as_str()
            .map(str::to_string)
    })
    .await;
    assert!(
        message.contains(r#"column "blob""#) && message.contains("base64"),
        "{message}"
    );
    let state: (i64, Option<String>, String) = {
        let r = target
            .client
            .query_one(
                "SELECT (SELECT count(*) FROM public.alltypes WHERE blob = '\\x0102ff'),
                        to_regclass('public.alltypes_larch_baseline')::text,
                        (SELECT position FROM public.larch_checkpoint)",
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1), r.get(2))
    };
    assert_eq!(
        state,
        (3, None, "0/100".to_string()),
        "the old table, untouched"
    );
    engine.stop().await.unwrap();
}
