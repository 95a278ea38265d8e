//! Issue 41: one output convention (`-o table|json|yaml`, `--json` kept), errors that name what
//! failed (the S3 endpoint and bucket, the table and key of a record over the size limit, whose
//! a publication is), size spellings, `--version`, and help texts that name only real flags.

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::Value;

use crate::cli_archive::{flags_of, larch};
use crate::support::postgres::{Database, new_database};

/// The `writer-jsonl` fixture as `archive CMD` arguments.
fn fixture_args(cmd: &str, fixture: &str) -> Vec<String> {
    let (_, dir, case) = crate::fixtures::cases()
        .into_iter()
        .find(|c| c.0 == fixture)
        .unwrap();
    vec![
        "archive".into(),
        cmd.into(),
        "--path".into(),
        dir.join("archive").display().to_string(),
        "--key-prefix".into(),
        case["key_prefix"].as_str().unwrap().into(),
    ]
}

fn stdout_of(args: &[String], extra: &[&str]) -> (Option<i32>, String, String) {
    let out = larch().args(args).args(extra).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn inspect_and_verify_print_table_json_or_yaml() {
    let inspect = fixture_args("inspect", "writer-jsonl");
    let (code, table, _) = stdout_of(&inspect, &[]);
    assert_eq!(code, Some(0));
    assert!(table.starts_with("table:        "), "{table}");
    let (_, json, _) = stdout_of(&inspect, &["-o", "json"]);
    let json: Value = serde_json::from_str(&json).unwrap();
    let (_, yaml, _) = stdout_of(&inspect, &["--output", "yaml"]);
    let yaml: Value = serde_saphyr::from_str(&yaml).unwrap();
    assert_eq!(json, yaml);
    assert!(json["head_position"].is_string(), "{json}");
    // The deprecated spelling still works, and says the same.
    let (_, old, _) = stdout_of(&inspect, &["--json"]);
    assert_eq!(serde_json::from_str::<Value>(&old).unwrap(), json);
    let (code, _, err) = stdout_of(&inspect, &["-o", "xml"]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("[possible values: table, json, yaml]"),
        "{err}"
    );

    let (code, json, _) = stdout_of(&fixture_args("verify", "writer-jsonl"), &["-o", "json"]);
    assert_eq!(code, Some(0));
    let report: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["problems"], serde_json::json!([]));
    let (code, yaml, _) = stdout_of(
        &fixture_args("verify", "bad-missing-object"),
        &["-o", "yaml"],
    );
    assert_eq!(code, Some(1), "problems found still exit 1");
    let report: Value = serde_saphyr::from_str(&yaml).unwrap();
    assert_eq!(report["ok"], false, "{report}");
    assert!(
        !report["problems"].as_array().unwrap().is_empty(),
        "{report}"
    );
}

/// A refused connection names the endpoint it tried and the bucket.
#[test]
fn an_unreachable_s3_endpoint_is_named() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let out = larch()
        .args(["archive", "inspect", "--store", "s3", "--bucket", "larch-b"])
        .args(["--endpoint", &endpoint, "--table", "t"])
        .env("AWS_ACCESS_KEY_ID", "a")
        .env("AWS_SECRET_ACCESS_KEY", "b")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("(endpoint {endpoint})")), "{err}");
    assert!(err.contains("s3://larch-b/"), "{err}");
}

#[test]
fn sizes_take_decimal_and_binary_units_and_errors_name_the_flag() {
    for size in ["64MB", "64M", "64MiB", "64Mi", "1GB", "1GiB", "67108864"] {
        let out = larch()
            .args(["export", "--table", "t", "--buffer-memory", size])
            .args(["--max-diff-bytes", size, "--spill-limit", size])
            .env_remove("LARCH_PG_DSN")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        // Past argument parsing: the next thing missing is the connection.
        assert!(err.contains("no PostgreSQL connection"), "{size}: {err}");
    }
    let out = larch()
        .args(["export", "--table", "t", "--max-diff-bytes", "64XB"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("'--max-diff-bytes <MAX_DIFF_BYTES>'") && err.contains("decimal kB/MB/GB/TB"),
        "{err}"
    );
    assert!(err.contains("binary KiB/MiB/GiB/TiB"), "{err}");
}

#[test]
fn version_names_the_commit_and_the_build() {
    let out = larch().arg("--version").output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let text = text.trim();
    let rest = text
        .strip_prefix(&format!("larch {} (commit ", env!("CARGO_PKG_VERSION")))
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{text}"));
    let (commit, build) = rest.rsplit_once(", ").unwrap();
    let commit = commit.strip_suffix(", modified").unwrap_or(commit);
    assert!(
        commit == "unknown" || commit.chars().all(|c| c.is_ascii_hexdigit()),
        "{text}"
    );
    let date = build.strip_prefix("built ");
    assert!(
        build == "debug build" || date.is_some_and(|d| d.len() == 10 && d.as_bytes()[4] == b'-'),
        "{text}"
    );
}

/// Every command path (`archive inspect`, `export cleanup`, ...), from the help's `Commands:`.
fn command_paths(prefix: &[String]) -> Vec<Vec<String>> {
    let out = larch().args(prefix).arg("--help").output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let mut paths = vec![prefix.to_vec()];
    let Some(commands) = text.split("Commands:\n").nth(1) else {
        return paths;
    };
    for line in commands.lines().take_while(|l| l.starts_with("  ")) {
        let name = line.split_whitespace().next().unwrap();
        if name != "help" {
            let mut p = prefix.to_vec();
            p.push(name.to_string());
            paths.extend(command_paths(&p));
        }
    }
    paths
}

/// Each `--flag` a help text mentions (short and long help) is a flag of some command.
#[test]
fn help_texts_mention_only_real_flags() {
    let paths = command_paths(&[]);
    assert!(paths.len() > 10, "{paths:?}");
    let mut real: BTreeSet<String> = ["--help", "--version"].map(String::from).into();
    for p in &paths {
        let args: Vec<&str> = p.iter().map(String::as_str).collect();
        real.extend(flags_of(&args));
    }
    let mut unknown = BTreeSet::new();
    for p in &paths {
        for help in ["-h", "--help"] {
            let out = larch().args(p).arg(help).output().unwrap();
            let text = String::from_utf8(out.stdout).unwrap();
            for (i, _) in text.match_indices("--") {
                let word: String = text[i + 2..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                    .collect();
                let starts_a_word = i == 0 || !text.as_bytes()[i - 1].is_ascii_alphanumeric();
                if starts_a_word && word.len() > 1 && !real.contains(&format!("--{word}")) {
                    unknown.insert(format!("{}: --{word}", p.join(" ")));
                }
            }
        }
    }
    assert!(unknown.is_empty(), "flags no command has: {unknown:?}");
}

fn larch_on(db: &Database) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_larch"));
    c.env("LARCH_PG_DSN", &db.dsn)
        .env("LARCH_LOG", "warn")
        .env("LARCH_LOG_FORMAT", "json");
    c
}

/// A row over laredo's 4 MiB protobuf record limit: the error names the table and the row's
/// key (cut short), and nothing is committed. The summaries of an export and a restore that
/// work are YAML with `-o yaml`.
#[tokio::test]
async fn a_record_over_the_limit_names_its_table_and_key() {
    let db = new_database().await;
    let long_key = "k".repeat(100);
    db.client
        .batch_execute(&format!(
            "CREATE TABLE big (id text PRIMARY KEY, blob text);
             INSERT INTO big VALUES ('small', 'x'), ('{long_key}', repeat('x', 5 * 1024 * 1024));
             CREATE TABLE fine (id int8 PRIMARY KEY, v text);
             INSERT INTO fine SELECT g, 'v' || g FROM generate_series(1, 3) g;"
        ))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().display().to_string();
    let out = larch_on(&db)
        .args(["export", "--table", "big", "--format", "protobuf"])
        .args(["--store", "local", "--path", &path])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    let shown = format!(
        "table public.big, row with key \"{}\"… (100 bytes)",
        "k".repeat(64)
    );
    assert!(err.contains(&shown) && err.contains("4 MiB"), "{err}");
    assert!(
        !dir.path().join("public.big/manifest.json").exists(),
        "nothing committed"
    );

    let out = larch_on(&db)
        .args(["export", "--table", "fine", "-o", "yaml"])
        .args(["--store", "local", "--path", &path])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let summary: Value = serde_saphyr::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["row_count"], 3, "{summary}");
    // The restore's summary too, back into the same table.
    let out = larch_on(&db)
        .args([
            "restore",
            "--table",
            "fine",
            "--if-exists",
            "replace",
            "-o",
            "yaml",
        ])
        .args(["--store", "local", "--path", &path])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let restored: Value = serde_saphyr::from_slice(&out.stdout).unwrap();
    assert_eq!(restored["position"], summary["position"], "{restored}");
    assert_eq!(restored["tables"].as_array().map(Vec::len), Some(1));
}

/// `--follow` through a publication larch did not create (it publishes another table): the
/// error and the exit notes say whose it is and suggest another name, never to drop it.
#[tokio::test]
async fn a_foreign_publication_is_named_as_such_not_offered_for_dropping() {
    let db = new_database().await;
    db.client
        .batch_execute(
            "CREATE TABLE items (id int8 PRIMARY KEY, v text);
             CREATE TABLE other (id int8 PRIMARY KEY);
             CREATE PUBLICATION theirs FOR TABLE other;",
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = larch_on(&db)
        .args([
            "export",
            "--follow",
            "--table",
            "items",
            "--publication",
            "theirs",
        ])
        .args([
            "--slot",
            "mine",
            "--listen",
            "127.0.0.1:0",
            "--store",
            "local",
        ])
        .arg("--path")
        .arg(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("not created by larch (it has no larch owner record)")
            && err.contains("another publication name (--publication) or slot name (--slot)"),
        "{err}"
    );
    assert!(
        err.contains("publication theirs") && err.contains("is not this export's"),
        "{err}"
    );
    assert!(!err.contains("drop both"), "{err}");
    let still: i64 = db
        .client
        .query_one(
            "SELECT count(*) FROM pg_publication WHERE pubname = 'theirs'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(still, 1);
}
