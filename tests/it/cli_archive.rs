//! `larch archive …` as a user runs it: output shape, exit codes, error words.

use std::process::Command;

use serde_json::Value;

use crate::fixtures::{assert_rows_match, cases};

pub fn larch() -> Command {
    Command::new(env!("CARGO_BIN_EXE_larch"))
}

#[test]
fn reconstruct_every_fixture_through_the_cli() {
    for (name, dir, case) in cases() {
        let formats: Vec<&str> = case["formats"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap())
            .collect();
        let mut base = vec![
            "archive".to_string(),
            "reconstruct".into(),
            "--store".into(),
            "local".into(),
            "--path".into(),
            dir.join("archive").display().to_string(),
            "--key-prefix".into(),
            case["key_prefix"].as_str().unwrap().into(),
            "--format".into(),
            formats.join(","),
        ];
        if let Some(k) = case["key_fields"].as_array() {
            base.push("--key-fields".into());
            base.push(
                k.iter()
                    .map(|v| v.as_str().unwrap())
                    .collect::<Vec<_>>()
                    .join(","),
            );
        }
        let queries = case
            .get("queries")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_else(|| vec![Value::Null]);
        for q in queries {
            let mut args = base.clone();
            if let Some(at) = q.get("at").and_then(Value::as_str) {
                args.push("--at".into());
                args.push(at.into());
            }
            let out = larch().args(&args).output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            let want_err = case
                .get("expect_error")
                .or_else(|| q.get("expect_error"))
                .and_then(Value::as_str);
            if let Some(err) = want_err {
                assert!(!out.status.success(), "{name}: expected failure");
                assert!(
                    stderr.to_lowercase().contains(&err.to_lowercase()),
                    "{name}: stderr {stderr:?} lacks {err:?}"
                );
                assert!(
                    out.stdout.is_empty(),
                    "{name}: nothing may be printed on failure"
                );
                continue;
            }
            assert!(out.status.success(), "{name}: {stderr}");
            let doc: Value = serde_json::from_slice(&out.stdout)
                .unwrap_or_else(|e| panic!("{name}: output is not JSON: {e}"));
            assert_eq!(doc["position"], q["position"], "{name}");
            assert_eq!(
                doc["row_count"].as_u64().unwrap() as usize,
                q["rows"].as_array().unwrap().len(),
                "{name}"
            );
            // Re-read the rows as exact texts from the raw output.
            let rows: Vec<String> = String::from_utf8(out.stdout.clone())
                .unwrap()
                .lines()
                .map(str::trim)
                .filter(|l| l.starts_with('{') && l.len() > 1)
                .map(|l| l.trim_end_matches(',').to_string())
                .collect();
            assert_rows_match(&name, &rows, q["rows"].as_array().unwrap());
        }
    }
}

#[test]
fn verify_and_inspect_fixtures() {
    for (name, dir, case) in cases() {
        let formats: Vec<&str> = case["formats"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap())
            .collect();
        let args = |cmd: &str| {
            vec![
                "archive".to_string(),
                cmd.to_string(),
                "--path".into(),
                dir.join("archive").display().to_string(),
                "--key-prefix".into(),
                case["key_prefix"].as_str().unwrap().into(),
                "--format".into(),
                formats.join(","),
            ]
        };
        let verify = larch().args(args("verify")).output().unwrap();
        let broken = case.get("expect_error").is_some();
        assert_eq!(
            !verify.status.success(),
            broken,
            "{name}: verify status; stderr {}",
            String::from_utf8_lossy(&verify.stderr)
        );
        if !broken {
            let inspect = larch()
                .args(args("inspect"))
                .arg("--json")
                .output()
                .unwrap();
            assert!(inspect.status.success(), "{name}");
            let doc: Value = serde_json::from_slice(&inspect.stdout).unwrap();
            assert_eq!(doc["head_position"], case["head"], "{name}");
            assert_eq!(doc["chain"]["reaches_head"], Value::Bool(true), "{name}");
        }
    }
}

#[test]
fn invalid_position_is_an_error_not_a_hang() {
    let (_, dir, _) = cases().into_iter().find(|c| c.0 == "writer-jsonl").unwrap();
    let out = larch()
        .args(["archive", "reconstruct", "--path"])
        .arg(dir.join("archive"))
        .args(["--key-prefix", "public.events/", "--at", "not-a-position"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "a command-line error");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("\"not-a-position\" is neither a position")
    );
}

#[tokio::test]
async fn verify_lists_orphans_and_gc_removes_them_only_when_asked() {
    use larch::archive::format::Format;
    use larch::archive::model::Action;
    use larch::archive::store::Store;
    use larch::archive::store::local::LocalStore;
    use larch::archive::value::Row;
    use larch::archive::writer::{ArchiveWriter, WriterConfig};
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()).unwrap());
    let mut c = WriterConfig::new("public.items", "public.items/");
    c.snapshot_formats = vec![Format::Jsonl];
    c.diff_formats = vec![Format::Jsonl];
    c.keep_epochs = 1;
    let mut w = ArchiveWriter::open(vec![store.clone()], c).await.unwrap();
    for epoch in 1..=2 {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(Row::parse(&format!(r#"{{"id":{epoch}}}"#)).unwrap())
            .await
            .unwrap();
        drop(tx);
        w.write_snapshot(&format!("0/{epoch}0"), rx).await.unwrap();
    }
    let orphan = "public.items/epoch=1/diff-0_10-0_15.jsonl";
    let listed = "public.items/epoch=2/diff-0_20-0_25.jsonl";
    for k in [orphan, listed] {
        store.put(k, b"{}\n").await.unwrap();
    }
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    w.record(
        Action::Insert,
        None,
        Some(Row::parse(r#"{"id":3}"#).unwrap()),
    )
    .unwrap();
    w.flush("0/30").await.unwrap();
    let exists = |k: &str| dir.path().join(k).exists();
    let run = |extra: &[&str]| {
        let out = larch()
            .args(["archive"])
            .args(extra)
            .args(["--store", "local", "--key-prefix", "public.items/"])
            .arg("--path")
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{extra:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };

    let verify = run(&["verify"]);
    assert!(
        verify.contains(&format!("unreferenced: {orphan}"))
            && verify.contains("orphan: its epoch is below the manifest's and no longer listed"),
        "{verify}"
    );
    assert!(
        verify.contains(&format!("unreferenced: {listed}"))
            && verify.contains("in a listed or later epoch"),
        "{verify}"
    );
    assert!(
        verify.contains("ok: public.items/manifest.json"),
        "{verify}"
    );

    let dry = run(&["gc"]);
    assert!(dry.contains(&format!("would delete: {orphan}")), "{dry}");
    assert!(dry.contains(&format!("keep:   {listed}")), "{dry}");
    assert!(dry.contains("dry run: 1 object(s)"), "{dry}");
    assert!(
        exists(orphan) && exists(listed),
        "a dry run deletes nothing"
    );

    let gc = run(&["gc", "--delete"]);
    assert!(gc.contains(&format!("deleted: {orphan}")), "{gc}");
    assert!(!exists(orphan) && exists(listed));

    let all = run(&["gc", "--delete", "--include-listed-epochs"]);
    assert!(all.contains(&format!("deleted: {listed}")), "{all}");
    assert!(!exists(listed));
    assert!(
        run(&["verify"]).starts_with("ok: "),
        "nothing unreferenced left"
    );
}

/// Issue 13: a diff chain that stops before the manifest head is an error for a head read
/// (naming the last position reached and the head), a warning with --allow-partial, and does not
/// change --at reads.
#[tokio::test]
async fn reconstruct_refuses_a_chain_short_of_the_head() {
    use larch::archive::model::Action;
    use larch::archive::store::Store;
    use larch::archive::store::local::LocalStore;
    use larch::archive::value::Row;
    use larch::archive::writer::{ArchiveWriter, WriterConfig};
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()).unwrap());
    let mut w = ArchiveWriter::open(
        vec![store.clone()],
        WriterConfig::new("public.items", "public.items/"),
    )
    .await
    .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(Row::parse(r#"{"id":1}"#).unwrap()).await.unwrap();
    drop(tx);
    w.write_snapshot("0/10", rx).await.unwrap();
    for (id, to) in [(2, "0/20"), (3, "0/30"), (4, "0/40")] {
        let row = Row::parse(&format!(r#"{{"id":{id}}}"#)).unwrap();
        w.record(Action::Insert, None, Some(row)).unwrap();
        w.flush(to).await.unwrap();
    }
    // Lose the middle diff from the manifest: the chain now ends at 0/20.
    let key = dir.path().join("public.items/manifest.json");
    let mut m: Value = serde_json::from_slice(&std::fs::read(&key).unwrap()).unwrap();
    m["artifacts"]
        .as_array_mut()
        .unwrap()
        .retain(|a| a["from_position"] != "0/20");
    std::fs::write(&key, serde_json::to_vec(&m).unwrap()).unwrap();

    let run = |extra: &[&str]| {
        larch()
            .args(["archive", "reconstruct", "--key-prefix", "public.items/"])
            .args(extra)
            .arg("--path")
            .arg(dir.path())
            .output()
            .unwrap()
    };
    let out = run(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing printed on failure");
    assert!(
        stderr.contains("stops at 0/20 before the manifest head 0/40")
            && stderr.contains("no diff starts at 0/20")
            && stderr.contains("--allow-partial"),
        "{stderr}"
    );

    let out = run(&["--allow-partial"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning:") && stderr.contains("stops at 0/20"),
        "{stderr}"
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (doc["position"].as_str(), doc["row_count"].as_u64()),
        (Some("0/20"), Some(2))
    );

    // --at reads are as before: no error, no warning, clamped to what the chain reaches.
    let out = run(&["--at", "0/20"]);
    assert!(out.status.success() && out.stderr.is_empty(), "{out:?}");
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["row_count"], 2);
}

/// The long flags `larch ARGS --help` lists.
/// The long flags a command's `--help` lists (`--long`, or `-s, --long`), sorted.
pub(crate) fn flags_of(args: &[&str]) -> Vec<String> {
    let out = larch().args(args).arg("--help").output().unwrap();
    assert!(out.status.success(), "{args:?} --help: {out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let mut flags: Vec<String> = text
        .lines()
        .map(str::trim_start)
        // `--long`, or `-s, --long`
        .map(|l| match l.as_bytes() {
            [b'-', s, b',', b' ', b'-', b'-', ..] if s.is_ascii_alphabetic() => &l[4..],
            _ => l,
        })
        .filter(|l| l.starts_with("--"))
        .filter_map(|l| l.split([' ', ',', '=']).next().map(str::to_string))
        .collect();
    flags.sort();
    flags
}

#[test]
fn each_archive_subcommand_shows_only_its_own_flags() {
    // The store's flags, and the log flags every command takes.
    let location = [
        "--bucket",
        "--endpoint",
        "--format",
        "--help",
        "--key-prefix",
        "--log-format",
        "--log-level",
        "--path",
        "--path-style",
        "--prefix",
        "--region",
        "--store",
        "--table",
    ];
    let with = |extra: &[&str]| {
        let mut v: Vec<String> = location
            .iter()
            .chain(extra)
            .map(|s| s.to_string())
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        flags_of(&["archive", "reconstruct"]),
        with(&["--allow-partial", "--at", "--key-fields"])
    );
    assert_eq!(flags_of(&["archive", "inspect"]), with(&["--output"]));
    assert_eq!(
        flags_of(&["archive", "verify"]),
        with(&["--clock-allowance", "--output"])
    );
    assert_eq!(
        flags_of(&["archive", "gc"]),
        with(&[
            "--clock-allowance",
            "--delete",
            "--include-listed-epochs",
            "--output"
        ])
    );
}

/// `larch archive export` is `larch export`, and takes every flag of `laredo archive export`
/// (laredo's cmd/laredo/archive.go) under the same name.
#[test]
fn archive_export_is_export_with_laredos_flag_names() {
    let export = flags_of(&["export"]);
    assert_eq!(flags_of(&["archive", "export"]), export);
    for laredo in [
        "--connection",
        "--schema",
        "--table",
        "--store",
        "--path",
        "--bucket",
        "--prefix",
        "--region",
        "--key-prefix",
        "--format",
        "--follow",
        "--diff-interval",
    ] {
        assert!(
            export.contains(&laredo.to_string()),
            "{laredo} missing: {export:?}"
        );
    }
}

/// `--table [schema.]name` reads the `<schema>.<table>/` prefix `larch export` writes.
#[test]
fn archive_commands_default_the_key_prefix_from_table() {
    let (_, dir, case) = cases().into_iter().find(|c| c.0 == "writer-jsonl").unwrap();
    assert_eq!(case["key_prefix"], "public.events/");
    for table in ["events", "public.events"] {
        let out = larch()
            .args(["archive", "inspect", "--json", "--table", table, "--path"])
            .arg(dir.join("archive"))
            .output()
            .unwrap();
        assert!(out.status.success(), "--table {table}: {out:?}");
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(doc["head_position"], case["head"], "--table {table}");
    }
    let out = larch()
        .args(["archive", "inspect", "--table", ".x", "--path"])
        .arg(dir.join("archive"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("expected [schema.]name"),
        "{out:?}"
    );
}

/// Copies a fixture's archive prefix into `root/<prefix>`.
fn copy_archive(fixture: &str, prefix: &str, root: &std::path::Path) {
    let (_, dir, case) = cases().into_iter().find(|c| c.0 == fixture).unwrap();
    let from = dir
        .join("archive")
        .join(case["key_prefix"].as_str().unwrap());
    let to = root.join(prefix);
    for entry in walk(&from) {
        let rel = entry.strip_prefix(&from).unwrap();
        std::fs::create_dir_all(to.join(rel).parent().unwrap()).unwrap();
        std::fs::copy(&entry, to.join(rel)).unwrap();
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.path().is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}

#[test]
fn manifest_not_found_names_what_was_tried_and_the_nearest_prefixes() {
    let store = tempfile::tempdir().unwrap();
    copy_archive("writer-jsonl", "public.events/", store.path());
    copy_archive("export-oneshot", "public.users/", store.path());
    let run = |extra: &[&str]| {
        let out = larch()
            .args(["archive", "inspect", "--path"])
            .arg(store.path())
            .args(extra)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {out:?}");
        assert!(out.stdout.is_empty(), "{extra:?}: nothing on stdout");
        String::from_utf8(out.stderr).unwrap()
    };
    let root = run(&[]);
    assert!(
        root.contains("has no manifest.json (key prefix \"\", the store root: neither --key-prefix nor --table was given, and `larch export` writes <schema>.<table>/)"),
        "{root}"
    );
    assert!(
        root.contains(&format!(
            "local:{}",
            store.path().canonicalize().unwrap().display()
        )),
        "names the store: {root}"
    );
    assert!(
        root.contains(
            "nearest archives in this store: key prefix \"public.users/\", \"public.events/\""
        ) || root.contains(
            "nearest archives in this store: key prefix \"public.events/\", \"public.users/\""
        ),
        "{root}"
    );
    let typo = run(&["--table", "evnts"]);
    assert!(
        typo.contains("has no public.evnts/manifest.json (key prefix \"public.evnts/\", from --table public.evnts)"),
        "{typo}"
    );
    assert!(
        typo.contains("key prefix \"public.events/\", \"public.users/\""),
        "the nearest first: {typo}"
    );
    let prefix = run(&["--key-prefix", "events/"]);
    assert!(
        prefix.contains("(key prefix \"events/\", from --key-prefix)"),
        "{prefix}"
    );

    let empty = tempfile::tempdir().unwrap();
    let out = larch()
        .args(["archive", "verify", "--table", "events", "--path"])
        .arg(empty.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("the store holds no archive (no manifest.json under any prefix)"),
        "{out:?}"
    );
}

#[test]
fn read_only_commands_create_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("no/such/dir");
    let commands: [&[&str]; 5] = [
        &["inspect"],
        &["verify"],
        &["reconstruct"],
        &["gc"],
        &["gc", "--delete"],
    ];
    for cmd in commands {
        let out = larch()
            .arg("archive")
            .args(cmd)
            .args(["--table", "public.events", "--path"])
            .arg(&missing)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{cmd:?}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr)
                .contains(&format!("--path {}: no such directory", missing.display())),
            "{cmd:?}: {out:?}"
        );
        assert!(
            !tmp.path().join("no").exists(),
            "{cmd:?} created a directory"
        );
        // An existing root stays as it was, whatever the key prefix.
        let out = larch()
            .arg("archive")
            .args(cmd)
            .args(["--key-prefix", "a/b/c/", "--path"])
            .arg(tmp.path())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{cmd:?}: {out:?}");
        assert_eq!(
            std::fs::read_dir(tmp.path()).unwrap().count(),
            0,
            "{cmd:?} wrote into the store"
        );
    }
}

#[test]
fn verify_reports_on_stdout_ok_or_problems() {
    let args = |fixture: &str| {
        let (_, dir, case) = cases().into_iter().find(|c| c.0 == fixture).unwrap();
        let mut a = vec!["archive".to_string(), "verify".into(), "--path".into()];
        a.push(dir.join("archive").display().to_string());
        a.push("--key-prefix".into());
        a.push(case["key_prefix"].as_str().unwrap().into());
        a
    };
    let good = larch().args(args("writer-jsonl")).output().unwrap();
    assert!(good.status.success());
    assert!(String::from_utf8_lossy(&good.stdout).starts_with("ok: "));
    assert!(good.stderr.is_empty(), "{good:?}");

    let bad = larch().args(args("bad-missing-object")).output().unwrap();
    assert_eq!(bad.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&bad.stdout);
    assert!(stdout.contains("problem: "), "{stdout}");
    assert!(stdout.contains("problem(s) in t/manifest.json"), "{stdout}");
    assert!(bad.stderr.is_empty(), "the report is the result: {bad:?}");
}

/// Every environment variable larch reads is shown in `larch --help` and in the `--help` of a
/// command that reads it.
#[test]
fn every_environment_variable_is_in_help() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut names = std::collections::BTreeSet::new();
    let files = walk(&root.join("src"))
        .into_iter()
        .chain(walk(&root.join("crates")));
    for file in files {
        // build scripts read cargo's variables when larch is built, not larch's environment
        let test_only = file
            .file_name()
            .is_some_and(|n| n == "tests.rs" || n == "build.rs")
            || file.components().any(|c| c.as_os_str() == "tests");
        if file.extension().and_then(|e| e.to_str()) != Some("rs") || test_only {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        // unit tests at the end of a file (`#[cfg(test)] mod tests`) read test-only variables
        let text = text.split("#[cfg(test)]\nmod tests").next().unwrap();
        for pattern in [
            "env::var(\"",
            "env::var_os(\"",
            "env = \"",
            "try_from_env(\"",
        ] {
            for (i, _) in text.match_indices(pattern) {
                let rest = &text[i + pattern.len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                if !name.is_empty() && rest[name.len()..].starts_with('"') {
                    names.insert(name);
                }
            }
        }
    }
    for expected in [
        "LARCH_PG_DSN",
        "LARCH_LOG",
        "PGPASSWORD",
        "POD_NAME",
        "LARCH_CRASH_AT",
    ] {
        assert!(names.contains(expected), "the scan found {names:?}");
    }
    let help = |args: &[&str]| {
        let out = larch().args(args).arg("--help").output().unwrap();
        assert!(out.status.success(), "{args:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let top = help(&[]);
    let commands: Vec<String> = [
        &["export"][..],
        &["engine"],
        &["operator"],
        &["archive", "inspect"],
        &["archive", "verify"],
        &["archive", "reconstruct"],
        &["archive", "gc"],
    ]
    .iter()
    .map(|c| help(c))
    .collect();
    for name in &names {
        // the crash points exist only in builds with the test-only feature; help says so there
        let crash_point = matches!(name.as_str(), "LARCH_CRASH_AT" | "LARCH_PAUSE_AT");
        if crash_point && !cfg!(feature = "crashpoints") {
            assert!(
                !top.contains(name.as_str()) && commands.iter().all(|h| !h.contains(name.as_str())),
                "{name} is in --help of a build without crash points"
            );
            continue;
        }
        assert!(
            top.contains(name.as_str()),
            "{name} missing from larch --help"
        );
        assert!(
            commands.iter().any(|h| h.contains(name.as_str())),
            "{name} missing from every command's --help"
        );
    }
}

#[test]
fn http_listeners_default_to_loopback() {
    for cmd in [&["export"][..], &["engine"], &["operator"]] {
        let out = larch().args(cmd).arg("--help").output().unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        // A one-shot export listens only when asked; --follow defaults like the others.
        let default = if cmd == ["export"] {
            "(default 127.0.0.1:8080)"
        } else {
            "[default: 127.0.0.1:8080]"
        };
        assert!(
            text.contains(default)
                && !text.contains("0.0.0.0:8080]")
                && !text.contains("default 0.0.0.0:8080"),
            "{cmd:?}: {text}"
        );
    }
}

/// Every command's `--help` ends with its exit codes, and names in its text only flags that
/// command has (an environment block shared between commands once named other commands' flags).
#[test]
fn help_has_exit_status_and_names_only_real_flags() {
    let commands: &[&[&str]] = &[
        &["export"],
        &["archive", "export"],
        &["archive", "inspect"],
        &["archive", "verify"],
        &["archive", "reconstruct"],
        &["archive", "gc"],
        &["engine"],
        &["restore"],
        &["operator"],
        &["status"],
    ];
    for command in commands {
        let out = larch().args(*command).arg("--help").output().unwrap();
        assert!(out.status.success(), "{command:?}: {out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(
            text.contains("Exit status:\n  0  success"),
            "{command:?}: {text}"
        );
        // its own flags, and its subcommands' (which its list of commands may mention)
        let mut own = flags_of(command);
        if let Some(list) = text.split("Commands:\n").nth(1) {
            for line in list.lines().take_while(|l| l.starts_with("  ")) {
                let sub = line.split_whitespace().next().unwrap();
                if sub != "help" {
                    own.extend(flags_of(&[command, &[sub][..]].concat()));
                }
            }
        }
        let named: std::collections::BTreeSet<String> = text
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .filter(|w| w.starts_with("--") && w.len() > 2)
            .map(|w| w.trim_end_matches('-').to_string())
            .collect();
        for flag in named {
            assert!(
                own.contains(&flag),
                "{command:?} --help names {flag}, which it does not have: {text}"
            );
        }
    }
}
