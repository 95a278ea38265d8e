//! `larch export` against a real PostgreSQL 15, as a user runs it.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;

use larch::archive::format::Format;
use larch::archive::reader::ArchiveReader;
use larch::archive::store::local::LocalStore;
use serde_json::Value;

use crate::support::postgres::{Database, new_database};

fn larch() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_larch"));
    c.env_remove("LARCH_PG_DSN");
    c
}

fn run(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.output().expect("running larch");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn rows_at_head(dir: &std::path::Path, key_prefix: &str) -> (String, BTreeMap<i64, String>) {
    let store = Arc::new(LocalStore::new(dir).unwrap());
    let reader =
        ArchiveReader::new(store, key_prefix, vec![Format::Jsonl, Format::Protobuf]).unwrap();
    let (manifest, folded) = reader.reconstruct_at(None, &[]).await.unwrap();
    let rows = folded
        .rows
        .values()
        .map(|r| {
            (
                r.get("id").unwrap().get().parse::<i64>().unwrap(),
                r.as_str().to_string(),
            )
        })
        .collect();
    (manifest.head_position, rows)
}

async fn leftovers(db: &Database) -> (i64, i64) {
    let slots: i64 = db
        .client
        .query_one(
            "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let pubs: i64 = db
        .client
        .query_one("SELECT count(*) FROM pg_publication", &[])
        .await
        .unwrap()
        .get(0);
    (slots, pubs)
}

#[tokio::test]
async fn export_writes_a_snapshot_and_leaves_nothing_behind() {
    let db = new_database().await;
    db.client
        .batch_execute(
            "CREATE TABLE events (id int8 PRIMARY KEY, body jsonb, amount numeric(12,2), at timestamptz, raw bytea);
             INSERT INTO events
               SELECT g, jsonb_build_object('n', g), g / 100.0, '2024-01-01 00:00:00+00'::timestamptz + g * interval '1 second', '\\x00ff'
               FROM generate_series(1000000, 1004999) g;",
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let conn_file = dir.path().join("dsn");
    std::fs::write(&conn_file, format!("{}\n", db.dsn)).unwrap();
    let summary_file = dir.path().join("summary.json");
    let archive = dir.path().join("archive");
    let (code, stdout, stderr) = run(larch()
        .args(["export", "--connection-file"])
        .arg(&conn_file)
        .args(["--table", "events", "--store", "local", "--path"])
        .arg(&archive)
        .arg("--summary-file")
        .arg(&summary_file));
    assert_eq!(code, 0, "{stderr}");
    let summary: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(summary["table"], "public.events");
    assert_eq!(summary["key_prefix"], "public.events/");
    assert_eq!(summary["row_count"], 5000);
    assert_eq!(summary["epoch"], 1);
    let position = summary["position"].as_str().unwrap().to_string();
    assert_eq!(
        std::fs::read_to_string(&summary_file).unwrap().trim(),
        stdout.trim()
    );

    let (head, rows) = rows_at_head(&archive, "public.events/").await;
    assert_eq!(head, position);
    assert_eq!(rows.len(), 5000);
    assert_eq!(
        rows[&1000123],
        r#"{"amount":10001.23,"at":"2024-01-12T13:48:43Z","body":{"n":1000123},"id":1000123,"raw":"AP8="}"#
    );
    let manifest: Value = serde_json::from_slice(
        &std::fs::read(archive.join("public.events/manifest.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(manifest["columns"][0]["Name"], "id");
    assert_eq!(manifest["columns"][0]["PrimaryKey"], true);
    assert_eq!(manifest["columns"][1]["Type"], "jsonb");
    // The temporary slot and the publication the export created are gone.
    let mut left = (1, 1);
    for _ in 0..50 {
        left = leftovers(&db).await;
        if left == (0, 0) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(left, (0, 0), "slots and publications left behind");

    // A second export (connection from the environment, protobuf) is a new epoch on top.
    db.client
        .batch_execute("DELETE FROM events WHERE id >= 1004000")
        .await
        .unwrap();
    let (code, stdout, stderr) = run(larch()
        .env("LARCH_PG_DSN", &db.dsn)
        .args([
            "export", "--table", "events", "--format", "protobuf", "--store", "local", "--path",
        ])
        .arg(&archive));
    assert_eq!(code, 0, "{stderr}");
    let summary: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(summary["epoch"], 2);
    assert_eq!(summary["row_count"], 4000);
    let (head, rows) = rows_at_head(&archive, "public.events/").await;
    assert_eq!(head, summary["position"].as_str().unwrap());
    assert_eq!(rows.len(), 4000);
}

#[tokio::test]
async fn export_errors_are_clear() {
    let db = new_database().await;
    db.client
        .batch_execute("CREATE TABLE nopk (a int4, b text); INSERT INTO nopk VALUES (1, 'x')")
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();

    let (code, _, stderr) = run(larch()
        .args(["export", "--table", "t", "--store", "local", "--path"])
        .arg(dir.path()));
    assert_eq!(code, 2, "needs someone to act: exit 2");
    assert!(
        stderr.contains(
            "no PostgreSQL connection: pass --connection, --connection-file or set LARCH_PG_DSN"
        ),
        "{stderr}"
    );

    let dsn = format!("{} password=not-shown-anywhere", db.dsn);
    let (code, stdout, stderr) = run(larch()
        .args([
            "export",
            "--connection",
            &dsn,
            "--table",
            "missing",
            "--store",
            "local",
            "--path",
        ])
        .arg(dir.path()));
    assert_eq!(code, 2);
    assert!(
        stderr.contains("table public.missing does not exist"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("not-shown-anywhere") && !stdout.contains("not-shown-anywhere"),
        "{stderr}"
    );

    let (code, _, stderr) = run(larch()
        .args([
            "export",
            "--connection",
            &db.dsn,
            "--table",
            "nopk",
            "--store",
            "local",
            "--path",
        ])
        .arg(dir.path()));
    assert_eq!(code, 2);
    assert!(
        stderr.contains("table public.nopk has no primary key"),
        "{stderr}"
    );
    db.client
        .batch_execute("ALTER TABLE nopk REPLICA IDENTITY FULL")
        .await
        .unwrap();
    let (code, stdout, stderr) = run(larch()
        .args([
            "export",
            "--connection",
            &db.dsn,
            "--table",
            "nopk",
            "--key-fields",
            "a",
            "--store",
            "local",
            "--path",
        ])
        .arg(dir.path()));
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("\"row_count\": 1"), "{stdout}");
    assert_eq!(leftovers(&db).await.1, 0);
}

/// Every failure of `larch export` ends with its reason in the termination message
/// (`--summary-file`: `{"reason", "error"}`) and an exit status by it: 2 for what needs someone
/// to act, 1 for what may clear by itself. The reasons the operator turns into conditions.
#[tokio::test]
async fn export_failures_write_their_reason_to_the_summary_file() {
    let db = new_database().await;
    db.client
        .batch_execute(
            "CREATE TABLE events (id int8 PRIMARY KEY, v text); INSERT INTO events VALUES (1, 'a');
             CREATE TABLE nopk (a int4);
             DROP ROLE IF EXISTS larch_no_replication; CREATE ROLE larch_no_replication LOGIN",
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let summary = dir.path().join("termination-log");
    let closed_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let base = db.dsn.clone();
    let other_db = base.replace(&format!("dbname={}", db.name), "dbname=larch_no_such_db");
    let unknown_role = base.replace("user=postgres", "user=larch_nobody");
    let no_replication = base.replace("user=postgres", "user=larch_no_replication");
    let refused =
        format!("host=127.0.0.1 port={closed_port} user=postgres dbname=x connect_timeout=5");
    // (connection, table, extra args, exit status, reason, words of the error)
    type Case<'a> = (&'a str, &'a str, Vec<&'a str>, i32, &'a str, &'a str);
    let cases: Vec<Case> = vec![
        (
            &base,
            "missing",
            vec![],
            2,
            "TableNotFound",
            "table public.missing does not exist",
        ),
        (
            &base,
            "events; DROP TABLE events",
            vec![],
            2,
            "TableNotFound",
            "events; DROP TABLE events",
        ),
        (
            &other_db,
            "events",
            vec![],
            2,
            "DatabaseNotFound",
            "larch_no_such_db",
        ),
        (
            &unknown_role,
            "events",
            vec![],
            2,
            "AuthenticationFailed",
            "larch_nobody",
        ),
        (
            &no_replication,
            "events",
            vec![],
            2,
            "PermissionDenied",
            "replication",
        ),
        (
            &refused,
            "events",
            vec![],
            1,
            "ConnectionFailed",
            "is the server running and reachable?",
        ),
        (
            &base,
            "nopk",
            vec![],
            2,
            "InvalidConfig",
            "has no primary key",
        ),
        (
            &base,
            "events",
            vec!["--key-fields", "nope"],
            2,
            "ColumnNotFound",
            "key field \"nope\" is not a column",
        ),
        (
            &base,
            "events",
            vec!["--key-prefix", "../../etc/"],
            2,
            "InvalidConfig",
            "--key-prefix",
        ),
        (
            &base,
            "events",
            vec!["--slot-mode", "persistent"],
            2,
            "InvalidConfig",
            "--slot-mode persistent needs --follow",
        ),
    ];
    for (connection, table, extra, want_code, want_reason, words) in cases {
        let _ = std::fs::remove_file(&summary);
        let (code, _, stderr) = run(larch()
            .args(["export", "--connection", connection, "--table", table])
            .args(&extra)
            .args(["--store", "local", "--path"])
            .arg(dir.path().join("archive"))
            .arg("--summary-file")
            .arg(&summary));
        let doc: Value = serde_json::from_str(
            std::fs::read_to_string(&summary)
                .unwrap_or_else(|e| {
                    panic!("{table} {extra:?}: no termination message ({e}); {stderr}")
                })
                .trim(),
        )
        .unwrap();
        assert_eq!(
            (code, doc["reason"].as_str()),
            (want_code, Some(want_reason)),
            "{table} {extra:?}: {doc} {stderr}"
        );
        let error = doc["error"].as_str().unwrap();
        assert!(
            error.contains(words),
            "{table} {extra:?}: {error:?} lacks {words:?}"
        );
        assert!(stderr.contains(error.lines().next().unwrap()), "{stderr}");
    }
    // The operator's pods pass one request: its summaryFile gets the failure as well.
    let _ = std::fs::remove_file(&summary);
    let request = serde_json::json!({
        "tables": ["missing"],
        "store": {"type": "local", "path": dir.path().join("archive")},
        "summaryFile": summary,
    });
    let (code, _, stderr) =
        run(larch()
            .env("LARCH_PG_DSN", &base)
            .args(["export", "--request", &request.to_string()]));
    let doc: Value = serde_json::from_str(
        std::fs::read_to_string(&summary)
            .unwrap_or_else(|e| panic!("--request: no termination message ({e}); {stderr}"))
            .trim(),
    )
    .unwrap();
    assert_eq!(
        (code, doc["reason"].as_str()),
        (2, Some("TableNotFound")),
        "{doc}"
    );
    // A request's owner obeys `--owner`'s rule: refused before anything connects.
    let _ = std::fs::remove_file(&summary);
    let mut bad_owner = request.clone();
    bad_owner["tables"] = serde_json::json!(["events"]);
    bad_owner["owner"] = serde_json::json!("team\nb");
    let (code, _, stderr) = run(larch()
        .env("LARCH_PG_DSN", "host=127.0.0.1 port=1 connect_timeout=1")
        .args(["export", "--request", &bad_owner.to_string()]));
    let doc: Value = serde_json::from_str(std::fs::read_to_string(&summary).unwrap().trim())
        .unwrap_or_else(|e| panic!("{e}: {stderr}"));
    assert_eq!((code, doc["reason"].as_str()), (2, Some("InvalidConfig")));
    assert!(
        doc["error"]
            .as_str()
            .unwrap()
            .contains("owner \"team\\nb\": an owner is 1 to 256 bytes of printable text"),
        "{doc}"
    );
    // Nothing was dropped by the quoted name.
    let n: i64 = db
        .client
        .query_one("SELECT count(*) FROM events", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    // A successful export still writes its summary there. Its own slot: slots are per
    // cluster, and the other tests export an `events` table with the default name.
    let (code, _, stderr) = run(larch()
        .args(["export", "--connection", &base, "--table", "events"])
        .args(["--slot", &format!("larch_summary_{}", db.name)])
        .args(["--store", "local", "--path"])
        .arg(dir.path().join("archive"))
        .arg("--summary-file")
        .arg(&summary));
    assert_eq!(code, 0, "{stderr}");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    assert_eq!(doc["row_count"], 1);
}

#[tokio::test]
async fn kill_9_in_the_middle_of_a_one_shot_export_leaves_the_archive_as_it_was() {
    let db = new_database().await;
    db.client
        .batch_execute(
            "CREATE TABLE events (id int8 PRIMARY KEY, pad text);
             INSERT INTO events SELECT g, repeat(md5(g::text), 8) FROM generate_series(1, 300000) g;",
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("archive");
    let export = |slot: &str| {
        let mut c = larch();
        c.args([
            "export",
            "--connection",
            &db.dsn,
            "--table",
            "events",
            "--store",
            "local",
            "--slot",
            slot,
            "--path",
        ])
        .arg(&archive);
        c
    };
    let (code, _, stderr) = run(&mut export("larch_kill_first"));
    assert_eq!(code, 0, "{stderr}");
    let manifest_before = std::fs::read(archive.join("public.events/manifest.json")).unwrap();
    for (i, delay_ms) in [150u64, 400, 900].into_iter().enumerate() {
        let mut child = export(&format!("larch_kill_{i}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(delay_ms)).await;
        Command::new("kill")
            .args(["-KILL", &child.id().to_string()])
            .status()
            .unwrap();
        let _ = child.wait();
        // Either the kill beat the commit (manifest untouched) or the export finished first.
        let manifest_now = std::fs::read(archive.join("public.events/manifest.json")).unwrap();
        let store = Arc::new(LocalStore::new(&archive).unwrap());
        let reader = ArchiveReader::new(store, "public.events/", vec![Format::Jsonl]).unwrap();
        let (_, report) = larch::archive::verify::verify(&reader).await.unwrap();
        assert!(
            report.problems.is_empty(),
            "after kill at {delay_ms} ms: {:?}",
            report.problems
        );
        let (_, folded) = reader.reconstruct_at(None, &[]).await.unwrap();
        assert_eq!(folded.rows.len(), 300000, "after kill at {delay_ms} ms");
        if manifest_now == manifest_before {
            // Nothing of the killed run is listed; its temp file is not an artifact.
            let m: Value = serde_json::from_slice(&manifest_now).unwrap();
            assert_eq!(m["artifacts"].as_array().unwrap().len(), 1);
        }
    }
}

/// `larch archive export` is laredo's command: its `--table` is the table's name as it is, so
/// `Mixed.Case` is `public."Mixed.Case"`, while `larch export` reads `S.T` as schema and table.
#[tokio::test]
async fn archive_export_takes_the_table_name_literally_as_laredo() {
    let db = new_database().await;
    db.client
        .batch_execute(
            r#"CREATE SCHEMA "Mixed";
               CREATE TABLE public."Mixed.Case" (id int8 PRIMARY KEY);
               INSERT INTO public."Mixed.Case" SELECT generate_series(1, 3);
               CREATE TABLE "Mixed"."Case" (id int8 PRIMARY KEY);
               INSERT INTO "Mixed"."Case" SELECT generate_series(1, 5);"#,
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("archive");
    let export = |command: &[&str]| {
        run(larch()
            .env("LARCH_PG_DSN", &db.dsn)
            .args(command)
            .args(["--table", "Mixed.Case", "--store", "local", "--path"])
            .arg(&archive))
    };
    let (code, stdout, stderr) = export(&["archive", "export"]);
    assert_eq!(code, 0, "{stderr}");
    let summary: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(summary["key_prefix"], "public.Mixed.Case/");
    assert_eq!(summary["row_count"], 3);

    let (code, stdout, stderr) = export(&["export"]);
    assert_eq!(code, 0, "{stderr}");
    let summary: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(summary["key_prefix"], "Mixed.Case/");
    assert_eq!(summary["row_count"], 5);
}
