//! `larch archive leak-check` against a real PostgreSQL 15: a clean masked archive passes and
//! the manifest records it (`archive inspect` shows it); raw values planted in a kept column
//! (in another case, JSON-escaped, in a zstd object, in a diff) are found and counted per
//! column without printing them; `require_leak_check` refuses an archive without a passed
//! check and serves one with it.

use std::path::Path;

use larch::archive::format::Format;
use larch::archive::reader::ArchiveReader;
use larch::source::SyncSource;
use larch::source::archive::{ArchiveReplayOptions, ArchiveReplaySource};
use serde_json::Value;

use crate::engine_support::{eventually, get, get_json};
use crate::masking::{Files, export_local, export_once, follow_masked, larch, local, setup};
use crate::postgres_continuous::listening;
use crate::support::postgres::{Database, new_database};
use crate::support::seaweedfs::seaweedfs;

/// `phone` is kept: the free-text column a raw value can be copied into.
const RULES: &str = r#"
tables:
  public.users:
    undeclared: null
    columns:
      id: hash
      email: hash
      name: {redact: "REDACTED"}
      ssn: drop
      token: hash
      bio: hash
      phone: keep
"#;

/// `larch archive leak-check --json` of the users archive in `dir`: (exit code, report, stderr).
fn leak_check(db: &Database, dir: &Path, format: &str) -> (i32, Value, String) {
    let out = larch()
        .args([
            "archive",
            "leak-check",
            "--store",
            "local",
            "--table",
            "users",
        ])
        .args(["--format", format, "-o", "json", "--path"])
        .arg(dir)
        .env("LARCH_PG_DSN", &db.dsn)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let report = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), report, stderr)
}

fn manifest(dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("public.users/manifest.json")).unwrap()).unwrap()
}

fn found(report: &Value, column: &str) -> (u64, Vec<String>) {
    let c = report["columns"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["column"] == column)
        .unwrap_or_else(|| panic!("no column {column} in {report}"));
    let fields = c["found_in"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_string())
        .collect();
    (c["found"].as_u64().unwrap(), fields)
}

async fn init_requiring_leak_check(dir: &Path) -> anyhow::Result<()> {
    let reader = ArchiveReader::new(local(dir), "public.users/", vec![Format::JsonlZstd]).unwrap();
    let table = larch::archive::model::TableId::new("public", "users");
    let mut opts = ArchiveReplayOptions::new("seed", table.clone());
    opts.require_transformed = true;
    opts.require_leak_check = true;
    ArchiveReplaySource::new(reader, opts)
        .init(&[table])
        .await
        .map(|_| ())
}

#[tokio::test]
async fn a_clean_archive_passes_and_raw_values_in_free_text_are_found() {
    let db = new_database().await;
    setup(&db).await;
    let files = Files::new(RULES);
    let clean = tempfile::tempdir().unwrap();
    let path = clean.path().to_str().unwrap();
    let (code, err) = export_local(
        &db,
        Some(&files),
        "users",
        path,
        &["--format", "jsonl+zstd"],
    );
    assert_eq!(code, 0, "{err}");
    let err = init_requiring_leak_check(clean.path()).await.unwrap_err();
    let e = format!("{err:#}");
    assert!(e.contains("require_leak_check: the archive public.users/manifest.json (table public.users) records no leak check"), "{e}");

    let (code, report, err) = leak_check(&db, clean.path(), "jsonl+zstd");
    assert_eq!(code, 0, "a clean archive: {report} {err}");
    assert_eq!(report["found"], 0);
    assert_eq!(report["objects"], 1);
    let (email, _) = found(&report, "email");
    assert_eq!(email, 0);
    let checked: u64 = report["columns"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["column"] == "email")
        .unwrap()["values_checked"]
        .as_u64()
        .unwrap();
    assert_eq!(checked, crate::masking::USERS as u64);
    let m = manifest(clean.path());
    let record = &m["transform"]["leak_check"];
    assert_eq!(record["found"], 0, "{m}");
    assert_eq!(record["position"], m["head_position"]);
    assert_eq!(record["epoch"], m["epoch"]);
    assert_eq!(record["columns"]["email"]["values_checked"], checked);
    assert!(
        !m.to_string().contains("acme-corp"),
        "no value in the manifest"
    );
    let out = larch()
        .args([
            "archive", "inspect", "--store", "local", "--table", "users", "--path", path,
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("leak check:   passed: epoch 1 at"), "{text}");
    init_requiring_leak_check(clean.path()).await.unwrap();

    // Planted in the kept free-text column: an email upper-cased, and one with a quote and a
    // non-ASCII letter inside a JSON document, escaped as an ASCII-only encoder writes it.
    db.client
        .batch_execute(
            r#"UPDATE users SET email = 'zoë"q@acme-corp.com' WHERE id = 7000000002;
               UPDATE users SET phone = 'Contact: USER7@ACME-CORP.COM.' WHERE id = 7000000009;
               UPDATE users SET phone = '{"contact": "zo\u00eb\"q@acme-corp.com"}' WHERE id = 7000000010;"#,
        )
        .await
        .unwrap();
    let leaky = tempfile::tempdir().unwrap();
    let path = leaky.path().to_str().unwrap();
    let (code, err) = export_local(
        &db,
        Some(&files),
        "users",
        path,
        &["--format", "jsonl+zstd"],
    );
    assert_eq!(code, 0, "{err}");
    let (code, report, err) = leak_check(&db, leaky.path(), "jsonl+zstd");
    assert_eq!(code, 1, "raw values found: {report} {err}");
    assert_eq!(found(&report, "email"), (2, vec!["phone".to_string()]));
    assert_eq!(found(&report, "token").0, 0);
    assert!(
        !report.to_string().contains("acme"),
        "no value printed: {report}"
    );
    let m = manifest(leaky.path());
    assert_eq!(m["transform"]["leak_check"]["found"], 2, "{m}");
    let err = init_requiring_leak_check(leaky.path()).await.unwrap_err();
    assert!(
        format!("{err:#}").contains("records a failed leak check: 2 raw values found"),
        "{err:#}"
    );

    // Bad input: exit 2, naming what is wrong.
    let (code, _, err) = leak_check(&db, &leaky.path().join("nowhere"), "jsonl+zstd");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--path"), "{err}");
}

#[tokio::test]
async fn a_raw_value_in_a_diff_is_found() {
    let db = new_database().await;
    setup(&db).await;
    let files = Files::new(RULES);
    let dir = tempfile::tempdir().unwrap();
    let slot = format!("larch_leak_{}", db.name);
    let mut child = follow_masked(
        dir.path(),
        &files,
        &slot,
        "a-dev-seed-key-of-32-bytes-long!",
        &db,
    );
    let (addr, _stderr, _reader) = listening(&mut child);
    eventually(60, "export readiness", || async move {
        (get(addr, "/health/ready").await.0 == 200).then_some(())
    })
    .await;
    // A uuid copied without its dashes into the kept column, by a change after the snapshot.
    db.client
        .batch_execute(
            "UPDATE users SET phone = 'ref ' || replace(token::text, '-', '') WHERE id = 7000000004",
        )
        .await
        .unwrap();
    eventually(30, "a diff", || async move {
        (get_json(addr, "/status").await["diffs"]
            .as_u64()
            .unwrap_or(0)
            >= 1)
            .then_some(())
    })
    .await;
    child.kill().unwrap();
    child.wait().unwrap();
    let (code, report, err) = leak_check(&db, dir.path(), "jsonl");
    assert_eq!(code, 1, "{report} {err}");
    assert_eq!(found(&report, "token"), (1, vec!["phone".to_string()]));
    assert_eq!(found(&report, "email").0, 0);
    assert!(
        report["objects"].as_u64().unwrap() >= 2,
        "snapshot and diff read: {report}"
    );
}

#[tokio::test]
async fn an_s3_archive_is_checked_and_the_result_recorded_there() {
    let db = new_database().await;
    setup(&db).await;
    // The raw email of one user copied into the kept column, lower-cased from a mixed-case
    // original.
    db.client
        .batch_execute(
            "UPDATE users SET email = 'Mixed.Case@Acme-Corp.com' WHERE id = 7000000003;
             UPDATE users SET phone = 'mixed.case@acme-corp.com' WHERE id = 7000000008;",
        )
        .await
        .unwrap();
    let files = Files::new(RULES);
    let weed = seaweedfs();
    let bucket = weed.new_bucket().await;
    let s3 = [
        "--store",
        "s3",
        "--bucket",
        &bucket,
        "--endpoint",
        weed.endpoint(),
        "--region",
        "us-east-1",
    ];
    let (code, _, err) = export_once(&db, &files, "users", &s3);
    assert_eq!(code, 0, "{err}");
    let out = larch()
        .args(["archive", "leak-check", "--table", "users", "-o", "json"])
        .args(s3)
        .env("LARCH_PG_DSN", &db.dsn)
        .env("AWS_ACCESS_KEY_ID", "larch-test-key")
        .env("AWS_SECRET_ACCESS_KEY", "larch-test-secret")
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{report} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(found(&report, "email"), (1, vec!["phone".to_string()]));
    let store = weed.s3_store(&bucket, "").await;
    let bytes = larch::archive::store::Store::get(&store, "public.users/manifest.json")
        .await
        .unwrap()
        .unwrap()
        .bytes;
    let m: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(m["transform"]["leak_check"]["found"], 1, "{m}");
    assert_eq!(
        m["transform"]["leak_check"]["columns"]["email"]["found"], 1,
        "{m}"
    );

    // The columns a rules file masks, printed only (--no-record leaves the manifest as it was).
    let out = larch()
        .args([
            "archive",
            "leak-check",
            "--table",
            "users",
            "-o",
            "json",
            "--no-record",
        ])
        .args(s3)
        .arg("--transform")
        .arg(files.rules())
        .env("LARCH_PG_DSN", &db.dsn)
        .env("AWS_ACCESS_KEY_ID", "larch-test-key")
        .env("AWS_SECRET_ACCESS_KEY", "larch-test-secret")
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(out.status.code(), Some(1), "{report}");
    let columns: Vec<&str> = report["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["column"].as_str().unwrap())
        .collect();
    assert_eq!(columns, ["bio", "email", "id", "name", "ssn", "token"]);
    let again = larch::archive::store::Store::get(&store, "public.users/manifest.json")
        .await
        .unwrap()
        .unwrap()
        .bytes;
    assert_eq!(again, bytes, "--no-record writes nothing");
}

/// `larch export --leak-check`: a clean one-shot export records a passed check in its manifest
/// (and its summary), a set records one per table, a raw value copied into a kept column fails
/// the export with reason LeakFound (counts, no value) and records the failed check; the flag
/// is refused without a transform and with --follow.
#[tokio::test]
async fn an_export_with_leak_check_records_a_passed_check_and_fails_on_a_leak() {
    let db = new_database().await;
    setup(&db).await;
    let rules =
        format!("{RULES}  public.orders:\n    undeclared: keep\n    columns: {{note: hash}}\n");
    let files = Files::new(&rules);
    let export = |dir: &Path, tables: &[&str], extra: &[&str]| {
        let summary = dir.join("summary.json");
        let mut cmd = larch();
        cmd.args(["export", "--store", "local", "--leak-check"])
            .args(tables.iter().flat_map(|t| ["--table", t]))
            .args(["--slot", &crate::masking::unique_slot("larch_leak_export")])
            .arg("--path")
            .arg(dir.join("archive"))
            .arg("--summary-file")
            .arg(&summary)
            .args(extra)
            .env("LARCH_PG_DSN", &db.dsn);
        let out = cmd.output().unwrap();
        let summary: Value = std::fs::read(&summary)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(Value::Null);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.code().unwrap_or(-1), summary, stderr)
    };
    let (rules_file, key_file) = (files.rules(), files.key());
    let with_rules = [
        "--transform",
        rules_file.to_str().unwrap(),
        "--transform-key-file",
        key_file.to_str().unwrap(),
    ];

    let clean = tempfile::tempdir().unwrap();
    let (code, summary, err) = export(clean.path(), &["users"], &with_rules);
    assert_eq!(code, 0, "{err}");
    assert_eq!(summary["leak_check"]["found"], 0, "{summary}");
    let checked = summary["leak_check"]["values_checked"].as_u64().unwrap();
    assert!(checked >= crate::masking::USERS as u64, "{summary}");
    let m = manifest(&clean.path().join("archive"));
    let record = &m["transform"]["leak_check"];
    assert_eq!(record["found"], 0, "{m}");
    assert_eq!(record["position"], m["head_position"]);
    assert_eq!(record["values_checked"], checked);
    init_requiring_leak_check(&clean.path().join("archive"))
        .await
        .unwrap();

    // A set at one position: each table's archive is checked and recorded.
    let set = tempfile::tempdir().unwrap();
    let (code, summary, err) = export(set.path(), &["users", "orders"], &with_rules);
    assert_eq!(code, 0, "{err}");
    for (i, table) in ["public.users", "public.orders"].iter().enumerate() {
        let entry = &summary["tables"][i];
        assert_eq!(entry["table"], *table, "{summary}");
        assert_eq!(entry["leak_check"]["found"], 0, "{summary}");
        let m: Value = serde_json::from_slice(
            &std::fs::read(set.path().join(format!("archive/{table}/manifest.json"))).unwrap(),
        )
        .unwrap();
        assert_eq!(m["transform"]["leak_check"]["found"], 0, "{table}: {m}");
    }

    // A raw email copied into the kept free-text column.
    db.client
        .batch_execute("UPDATE users SET phone = 'mail user5@acme-corp.com' WHERE id = 7000000011")
        .await
        .unwrap();
    let leaky = tempfile::tempdir().unwrap();
    let (code, termination, err) = export(leaky.path(), &["users"], &with_rules);
    assert_eq!(code, 2, "{err}");
    assert_eq!(termination["reason"], "LeakFound", "{termination}");
    assert!(err.contains("public.users: email 1 of"), "{err}");
    assert!(!err.contains("acme-corp"), "no value quoted: {err}");
    let m = manifest(&leaky.path().join("archive"));
    assert_eq!(m["transform"]["leak_check"]["found"], 1, "{m}");
    let refused = init_requiring_leak_check(&leaky.path().join("archive")).await;
    assert!(refused.is_err(), "a failed check is refused");

    // Refused before anything is written.
    let none = tempfile::tempdir().unwrap();
    let (code, _, err) = export(none.path(), &["users"], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--leak-check needs --transform"), "{err}");
    let (code, _, err) = export(
        none.path(),
        &["users"],
        &[&with_rules[..], &["--follow"]].concat(),
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--leak-check applies to a one-shot export"),
        "{err}"
    );
    assert!(!none.path().join("archive").exists(), "nothing written");
}
