//! The bad-input census of issue 14: every command given bad input or a fault, as a careful
//! operator would. Each case names the command, the input, the exit code and the words the
//! message must carry; every case also checks what no case may do: panic (exit 101), print the
//! same OS error twice, or end an S3 error in the SDK's debug structure. The state after is
//! checked per group: the archive's files byte-for-byte as before (read-only commands write
//! nothing), the archive still verifying, nothing half-written, no slot left behind.
//!
//! `docs/bad-input.md` lists every case and its outcome; a test keeps that list complete.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;

use larch::archive::model::{Action, ColumnDefinition};
use larch::archive::store::Store;
use larch::archive::store::local::LocalStore;

use crate::archive_build::TestArchive;
use crate::support::postgres::new_database;

/// One command and what it must answer.
pub struct Case {
    pub name: &'static str,
    pub args: Vec<String>,
    pub env: Vec<(&'static str, String)>,
    /// Expected exit code (1: a larch error, 2: a command-line error).
    pub code: i32,
    /// Fragments the output (stderr, then stdout) must all contain.
    pub says: Vec<String>,
}

pub fn case(name: &'static str, code: i32, says: &[&str], args: &[&str]) -> Case {
    Case {
        name,
        args: args.iter().map(|s| s.to_string()).collect(),
        env: vec![],
        code,
        says: says.iter().map(|s| s.to_string()).collect(),
    }
}

impl Case {
    pub fn arg(mut self, a: impl AsRef<std::ffi::OsStr>) -> Case {
        self.args.push(a.as_ref().to_string_lossy().into_owned());
        self
    }

    pub fn env(mut self, k: &'static str, v: impl Into<String>) -> Case {
        self.env.push((k, v.into()));
        self
    }
}

/// Runs `larch` with the case's arguments (stdin closed) and checks the answer.
pub fn run(c: &Case) -> Output {
    // LARCH_CENSUS_BIN runs the census against another build (an older larch: which cases
    // fail before their fix).
    let bin = std::env::var("LARCH_CENSUS_BIN").unwrap_or(env!("CARGO_BIN_EXE_larch").into());
    let out = Command::new(bin)
        .args(&c.args)
        .envs(c.env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("LARCH_LOG", "warn")
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let both = format!("{stderr}{stdout}");
    let ctx = format!(
        "{}: larch {:?}\nstderr:\n{stderr}\nstdout:\n{stdout}",
        c.name, c.args
    );
    assert_eq!(out.status.code(), Some(c.code), "exit code of {ctx}");
    for s in &c.says {
        assert!(both.contains(s.as_str()), "{s:?} missing from {ctx}");
    }
    assert!(!both.contains("panicked"), "a panic: {ctx}");
    for (i, _) in both.match_indices("(os error ") {
        let os = &both[i..both[i..].find(')').map_or(both.len(), |e| i + e + 1)];
        assert_eq!(both.matches(os).count(), 1, "{os} printed twice: {ctx}");
    }
    assert!(!both.contains("Error {"), "an SDK debug structure: {ctx}");
    out
}

/// Every file under `dir` with its size and modification time: what "nothing written" compares.
pub fn tree(dir: &Path) -> BTreeMap<PathBuf, (u64, std::time::SystemTime)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let m = e.path().symlink_metadata().unwrap();
            if m.is_dir() {
                stack.push(e.path());
            } else {
                out.insert(e.path(), (m.len(), m.modified().unwrap()));
            }
        }
    }
    out
}

/// Every case name appears in docs/bad-input.md (the census as documentation).
pub fn documented(cases: &[&str]) {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/bad-input.md"))
        .expect("docs/bad-input.md");
    let missing: Vec<&&str> = cases
        .iter()
        .filter(|c| !doc.contains(&format!("`{c}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "not listed in docs/bad-input.md: {missing:?}"
    );
}

fn columns() -> Vec<ColumnDefinition> {
    crate::archive_build::id_and_text_columns(&["id", "tenant", "name"])
}

/// A valid archive of `public.t` at `dir` (prefix `public.t/`): 4 rows, two tenants, a diff.
pub async fn good_archive(dir: &Path) {
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir).unwrap());
    let mut a = TestArchive::new(store, "public.t/", "public.t").with_columns(columns());
    a.snapshot(
        "0/10",
        &[
            r#"{"id":1,"tenant":"a","name":"one"}"#,
            r#"{"id":2,"tenant":"a","name":"two"}"#,
            r#"{"id":3,"tenant":"b","name":"three"}"#,
        ],
    )
    .await;
    a.diff(
        "0/10",
        "0/20",
        &[(
            Action::Insert,
            None,
            Some(r#"{"id":4,"tenant":"b","name":"four"}"#),
        )],
    )
    .await;
}

fn archive_args(cmd: &str, dir: &Path) -> Vec<String> {
    vec![
        "archive".into(),
        cmd.into(),
        "--store".into(),
        "local".into(),
        "--path".into(),
        dir.display().to_string(),
        "--key-prefix".into(),
        "public.t/".into(),
    ]
}

fn on(cmd: &str, dir: &Path, name: &'static str, code: i32, says: &[&str], extra: &[&str]) -> Case {
    let mut c = case(name, code, says, &[]);
    c.args = archive_args(cmd, dir);
    c.args.extend(extra.iter().map(|s| s.to_string()));
    c
}

fn verifies(dir: &Path) {
    run(&on(
        "verify",
        dir,
        "verify",
        0,
        &["ok: public.t/manifest.json"],
        &[],
    ));
}

/// `larch archive inspect|verify|reconstruct|gc` with bad flags on a good archive: a clear error,
/// and the archive's files exactly as before.
#[tokio::test]
async fn archive_commands_refuse_bad_flags_and_write_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("archive");
    good_archive(&dir).await;
    let before = tree(&dir);
    let file = tmp.path().join("a-file");
    std::fs::write(&file, "not a directory").unwrap();
    let d = dir.as_path();
    // One case a line: a table to read, not to reflow.
    #[rustfmt::skip]
    let cases = vec![
        on("reconstruct", d, "reconstruct-unknown-key-field", 1,
           &["--key-fields: key field \"nope\" is not a column of the archive (columns: id, tenant, name)"],
           &["--key-fields", "nope"]),
        on("reconstruct", d, "reconstruct-key-field-not-unique", 1,
           &["warning: --key-fields: key fields [tenant] differ from the archive's primary key [id]",
             "two rows share a value of the key (tenant): the key fields do not identify rows"],
           &["--key-fields", "tenant"]),
        on("reconstruct", d, "reconstruct-key-fields-unique-but-not-the-pk", 0,
           &["warning: --key-fields: key fields [id, tenant] differ", "\"row_count\": 4"],
           &["--key-fields", "id,tenant"]),
        on("reconstruct", d, "reconstruct-bad-position", 2,
           &["--at", "\"yesterday\" is neither a position", "RFC 3339 time"], &["--at", "yesterday"]),
        on("reconstruct", d, "reconstruct-position-before-the-archive", 1,
           &["position 0/00000005 predates the archive: its earliest point is position"], &["--at", "0/5"]),
        on("reconstruct", d, "reconstruct-time-before-the-archive", 1,
           &["time 2000-01-01T00:00:00Z predates the archive: its earliest point is position"],
           &["--at", "2000-01-01T00:00:00Z"]),
        on("reconstruct", d, "reconstruct-unknown-format", 1, &["--format:", "xml"],
           &["--format", "xml"]),
        case("inspect-key-prefix-escapes", 1, &["escapes the store root"],
             &["archive", "inspect", "--store", "local", "--key-prefix", "../other/", "--path"])
            .arg(d),
        on("gc", d, "gc-clock-allowance-out-of-range", 2,
           &["--clock-allowance", "duration \"99999999999999999999h\" is out of range"],
           &["--clock-allowance", "99999999999999999999h"]),
        on("gc", d, "gc-clock-allowance-negative", 2,
           &["duration \"-5s\" must not be negative"], &["--clock-allowance=-5s"]),
        on("verify", d, "verify-clock-allowance-days", 2,
           &["unknown unit \"d\""], &["--clock-allowance", "1d"]),
        case("inspect-store-path-is-a-file", 1, &["a-file: not a directory (the local store root)"],
             &["archive", "inspect", "--store", "local", "--key-prefix", "public.t/", "--path"])
            .arg(&file),
        case("inspect-unknown-store-type", 2, &["invalid value 'nfs' for '--store <STORE>'", "[possible values: local, s3]"],
             &["archive", "inspect", "--store", "nfs", "--path"]).arg(d),
        case("inspect-s3-without-bucket", 1, &["store: type s3 requires `bucket`"],
             &["archive", "inspect", "--store", "s3"]),
        case("reconstruct-s3-endpoint-refuses-connections", 1,
             &["s3://b/public.t/manifest.json", "Connection refused"],
             &["archive", "reconstruct", "--store", "s3", "--bucket", "b", "--region", "us-east-1",
               "--endpoint", "http://127.0.0.1:9", "--key-prefix", "public.t/"])
            .env("AWS_ACCESS_KEY_ID", "x").env("AWS_SECRET_ACCESS_KEY", "y")
            .env("AWS_MAX_ATTEMPTS", "1"),
        case("gc-unknown-flag", 2, &["unexpected argument '--force'"],
             &["archive", "gc", "--force"]),
    ];
    for c in &cases {
        run(c);
        assert_eq!(
            tree(&dir),
            before,
            "{}: the archive's files changed",
            c.name
        );
    }
    let s3 = run(cases
        .iter()
        .find(|c| c.name == "reconstruct-s3-endpoint-refuses-connections")
        .unwrap());
    let msg = String::from_utf8_lossy(&s3.stderr);
    assert!(
        msg.len() < 600,
        "a short S3 message: {} bytes: {msg}",
        msg.len()
    );
    verifies(&dir);
    documented(&cases.iter().map(|c| c.name).collect::<Vec<_>>());
}

/// A damaged archive (one copy per case): reading it fails naming the object and what is wrong;
/// the read-only commands leave the damage as it is (nothing repaired or removed in passing).
#[tokio::test]
async fn damaged_archives_are_named_and_left_alone() {
    type Damage = fn(&Path);
    // One case a line: a table to read, not to reflow.
    #[rustfmt::skip]
    let damages: Vec<(&'static str, Damage, &str, Vec<&str>)> = vec![
        ("snapshot-cut-mid-row", |d| {
            let p = d.join("public.t/epoch=1/snapshot-0_10.jsonl");
            let text = std::fs::read_to_string(&p).unwrap();
            std::fs::write(&p, &text[..text.len() / 2]).unwrap();
        }, "verify", vec!["problem: public.t/epoch=1/snapshot-0_10.jsonl: line 2: not a JSON object"]),
        ("snapshot-last-row-missing", |d| {
            let p = d.join("public.t/epoch=1/snapshot-0_10.jsonl");
            let text = std::fs::read_to_string(&p).unwrap();
            let cut = text.trim_end().rfind('\n').unwrap() + 1;
            std::fs::write(&p, &text[..cut]).unwrap();
        }, "verify", vec!["public.t/epoch=1/snapshot-0_10.jsonl", "the manifest says"]),
        ("snapshot-not-json", |d| {
            let p = d.join("public.t/epoch=1/snapshot-0_10.jsonl");
            let text = std::fs::read_to_string(&p).unwrap();
            let bad = text.replacen("{\"id\":2", "{id:2", 1);
            std::fs::write(&p, bad).unwrap();
            // Keep the size and checksum honest so the decoder, not the integrity check, speaks.
            fix_manifest_entry(d, "public.t/epoch=1/snapshot-0_10.jsonl");
        }, "reconstruct", vec!["public.t/epoch=1/snapshot-0_10.jsonl: line 2"]),
        ("snapshot-is-a-directory", |d| {
            let p = d.join("public.t/epoch=1/snapshot-0_10.jsonl");
            std::fs::remove_file(&p).unwrap();
            std::fs::create_dir(&p).unwrap();
        }, "reconstruct", vec!["public.t/epoch=1/snapshot-0_10.jsonl", "Is a directory (os error 21)"]),
        ("snapshot-missing", |d| {
            std::fs::remove_file(d.join("public.t/epoch=1/snapshot-0_10.jsonl")).unwrap();
        }, "reconstruct", vec!["object not found: public.t/epoch=1/snapshot-0_10.jsonl"]),
        ("manifest-not-json", |d| {
            std::fs::write(d.join("public.t/manifest.json"), "{\"table\": \"public.t\",").unwrap();
        }, "inspect", vec!["public.t/manifest.json", "line 1"]),
        ("manifest-version-2", |d| {
            let p = d.join("public.t/manifest.json");
            let text = std::fs::read_to_string(&p).unwrap();
            std::fs::write(&p, text.replace("\"manifest_version\": 1", "\"manifest_version\": 2")).unwrap();
        }, "reconstruct", vec!["unsupported manifest version 2"]),
        ("manifest-missing", |d| {
            std::fs::remove_file(d.join("public.t/manifest.json")).unwrap();
        }, "gc", vec!["manifest not found", "public.t/manifest.json"]),
        ("diff-checksum-wrong", |d| {
            let p = d.join("public.t/epoch=1/diff-0_10-0_20.jsonl");
            let text = std::fs::read_to_string(&p).unwrap();
            std::fs::write(&p, text.replace("four", "FOUR")).unwrap();
        }, "reconstruct", vec!["public.t/epoch=1/diff-0_10-0_20.jsonl: integrity check failed", "sha256"]),
    ];
    let mut names = Vec::new();
    for (name, damage, cmd, says) in damages {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("archive");
        good_archive(&dir).await;
        damage(&dir);
        let before = tree(&dir);
        let mut c = on(cmd, &dir, name, 1, &says, &[]);
        if cmd == "gc" {
            c.args.push("--delete".into());
        }
        run(&c);
        assert_eq!(tree(&dir), before, "{name}: the damaged archive changed");
        names.push(name);
    }
    documented(&names);
}

/// Re-writes the size and checksum of one artifact in the manifest to match the file.
fn fix_manifest_entry(dir: &Path, key: &str) {
    let bytes = std::fs::read(dir.join(key)).unwrap();
    let p = dir.join("public.t/manifest.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    for a in m["artifacts"].as_array_mut().unwrap() {
        let f = &mut a["formats"]["jsonl"];
        if f["uri"].as_str().unwrap().ends_with(key) {
            f["size_bytes"] = bytes.len().into();
            f["sha256"] = larch::archive::store::sha256_hex(&bytes).into();
        }
    }
    std::fs::write(&p, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
}

fn engine_yaml(archive: &Path, extra_source: &str, targets: &str) -> String {
    format!(
        "sources:\n  s:\n    type: archive\n    store: {{type: local, path: \"{}\"}}\n    key_prefix: public.t/\n{extra_source}tables:\n  - source: s\n    schema: public\n    table: t\n    targets: {targets}\n",
        archive.display()
    )
}

/// `larch engine --config` with bad configurations: refused before anything starts, naming the
/// file and the field.
#[tokio::test]
async fn engine_configs_are_refused_by_field() {
    let tmp = tempfile::tempdir().unwrap();
    let archive = tmp.path().join("archive");
    good_archive(&archive).await;
    let mem = "[{type: memory}]";
    // One case a line: a table to read, not to reflow.
    #[rustfmt::skip]
    let configs: Vec<(&'static str, String, Vec<&str>)> = vec![
        ("engine-no-sources", "sources: {}\n".into(),
         vec!["sources: at least one source is required"]),
        ("engine-empty-file", "".into(), vec!["sources: at least one source is required"]),
        ("engine-yaml-syntax", "sources:\n\ts: {}\n".into(), vec!["line 2"]),
        ("engine-sources-a-list", "sources: [\n".into(),
         vec!["sources: expected mapping start at line 1, column 10"]),
        ("engine-unknown-key", "sourcez: {}\n".into(), vec!["unknown field `sourcez`"]),
        ("engine-poll-interval-out-of-range",
         engine_yaml(&archive, "    poll_interval: 99999999999999999999h\n", mem),
         vec!["sources.s.poll_interval: duration \"99999999999999999999h\" is out of range"]),
        ("engine-poll-interval-zero", engine_yaml(&archive, "    poll_interval: 0s\n", mem),
         vec!["sources.s.poll_interval: duration \"0s\" must be greater than zero"]),
        ("engine-poll-interval-number", engine_yaml(&archive, "    poll_interval: 5\n", mem),
         vec!["sources.s.poll_interval: expected a duration such as \"5s\", found 5"]),
        ("engine-key-prefix-without-slash",
         engine_yaml(&archive, "", mem).replace("key_prefix: public.t/", "key_prefix: public.t"),
         vec!["sources.s.key_prefix: \"public.t\" must end with '/'"]),
        ("engine-unknown-target", engine_yaml(&archive, "", "[{type: redis}]"),
         vec!["tables[0].targets[0].type: unknown target type \"redis\""]),
        ("engine-postgres-target-without-connection", engine_yaml(&archive, "", "[{type: postgres}]"),
         vec!["tables[0].targets[0]: a postgres target needs connection_file or connection_env"]),
        ("engine-two-memory-targets", engine_yaml(&archive, "", "[{type: memory}, {type: memory}]"),
         vec!["tables[0].targets[1]: table public.t already has a memory target"]),
        ("engine-unknown-source-type",
         engine_yaml(&archive, "", mem).replace("type: archive", "type: kafka"),
         vec!["sources.s.type: unknown source type \"kafka\""]),
        ("engine-inline-credentials",
         engine_yaml(&archive, "", mem).replace("{type: local,", "{type: s3, bucket: b, secret_access_key: x,"),
         vec!["unknown field `secret_access_key`"]),
    ];
    let mut names = Vec::new();
    for (name, yaml, says) in &configs {
        let file = tmp.path().join(format!("{name}.yaml"));
        std::fs::write(&file, yaml).unwrap();
        let mut says: Vec<&str> = says.clone();
        let shown = file.display().to_string();
        says.push(&shown);
        run(&case(name, 2, &says, &["engine", "--check", "--config"]).arg(&file));
        names.push(*name);
    }
    // One case a line: a table to read, not to reflow.
    #[rustfmt::skip]
    let cases = vec![
        case("engine-config-missing", 2, &["/no/such/engine.yaml: cannot read", "(os error 2)"],
             &["engine", "--config", "/no/such/engine.yaml"]),
        case("engine-config-is-a-directory", 2, &["cannot read", "Is a directory (os error 21)"],
             &["engine", "--config"]).arg(tmp.path()),
        case("engine-bad-listen-address", 1, &["listening on not-an-address"],
             &["engine", "--listen", "not-an-address", "--config"])
            .arg(write(tmp.path(), "ok.yaml", &engine_yaml(&archive, "", mem))),
    ];
    for c in &cases {
        run(c);
        names.push(c.name);
    }
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let c = case(
        "engine-listen-address-in-use",
        1,
        &["Address already in use (os error 98)"],
        &[
            "engine",
            "--listen",
            &busy.local_addr().unwrap().to_string(),
            "--config",
        ],
    )
    .arg(tmp.path().join("ok.yaml"));
    run(&c);
    names.push(c.name);
    documented(&names);
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// `larch crd`, `larch operator` and `larch status` outside a cluster: clear errors, no panic.
#[test]
fn crd_and_operator_refuse_what_they_cannot_do() {
    // One case a line: a table to read, not to reflow.
    #[rustfmt::skip]
    let cases = vec![
        case("crd-extra-argument", 2, &["unexpected argument 'archiveexports'"],
             &["crd", "archiveexports"]),
        case("operator-without-image", 2, &["--image <IMAGE>"], &["operator"]),
        case("operator-without-a-cluster", 1,
             &["no Kubernetes client configuration (in-cluster or KUBECONFIG)",
               "/nonexistent/.kube/config"],
             &["operator", "--image", "larch:x", "--listen", "127.0.0.1:0"])
            .env("HOME", "/nonexistent"),
        case("status-without-a-cluster", 1,
             &["no Kubernetes client configuration", "/nonexistent/.kube/config"],
             &["status"])
            .env("HOME", "/nonexistent"),
        case("status-bad-output", 2, &["invalid value 'xml' for '--output <OUTPUT>'"],
             &["status", "-o", "xml"]),
        case("status-unknown-kind", 2,
             &["`deployment/web`: unknown kind `deployment` (archiveexport, archivesource"],
             &["status", "deployment/web"]),
        case("status-missing-kubeconfig", 2,
             &["reading kubeconfig /nonexistent/config"],
             &["status", "--kubeconfig", "/nonexistent/config"]),
        case("status-unknown-context", 2,
             &["(context nowhere)"],
             &["status", "--kubeconfig", "/dev/null", "--context", "nowhere"]),
        case("unknown-command", 2, &["unrecognized subcommand 'replicate'"], &["replicate"]),
    ];
    for c in &cases {
        run(c);
    }
    documented(&cases.iter().map(|c| c.name).collect::<Vec<_>>());
}

/// `larch export` (one-shot and --follow flags) against a real PostgreSQL 15: bad flags, a bad
/// server, a bad table, a store that cannot be written. Nothing is left behind: no manifest, no
/// replication slot, no publication.
#[tokio::test]
async fn export_refuses_bad_input_and_leaves_nothing() {
    let db = new_database().await;
    db.client
        .batch_execute(
            "CREATE TABLE items (id int8 PRIMARY KEY, name text);
             INSERT INTO items VALUES (1, 'a'), (2, 'b');
             CREATE TABLE nokey (id int8, name text);
             INSERT INTO nokey VALUES (1, 'a'), (1, 'b');",
        )
        .await
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::create_dir_all(&store).unwrap();
    std::os::unix::fs::symlink(&outside, store.join("public.items")).unwrap();
    let export = |name: &'static str, code: i32, says: &[&str], extra: &[&str]| {
        let mut c = case(name, code, says, &["export", "--store", "local", "--path"])
            .arg(&store)
            .env("LARCH_PG_DSN", db.dsn.clone());
        c.args.extend(extra.iter().map(|s| s.to_string()));
        c
    };
    let closed = db
        .dsn
        .replace(&format!("port={}", port_of(&db.dsn)), "port=9");
    // One case a line: a table to read, not to reflow.
    #[rustfmt::skip]
    let cases = vec![
        export("export-missing-table", 2, &["public.nothing"], &["--table", "nothing"]),
        export("export-no-primary-key", 2, &["public.nokey", "primary key", "--key-fields"],
               &["--table", "nokey"]),
        export("export-unknown-key-field", 2, &["nope"], &["--table", "nokey", "--key-fields", "nope"]),
        export("export-prefix-is-a-link-outside", 1,
               &["leads outside the store root through the symbolic link"], &["--table", "items"]),
        export("export-unknown-format", 2,
               &["--format: unknown format \"xml\" (known: jsonl, protobuf, jsonl+zstd)"],
               &["--table", "items", "--format", "xml"]),
        export("export-diff-interval-out-of-range", 2,
               &["--diff-interval", "duration \"99999999999999999999h\" is out of range"],
               &["--table", "items", "--follow", "--diff-interval", "99999999999999999999h"]),
        export("export-max-interval-out-of-range", 2,
               &["duration \"2562048h\" is out of range"],
               &["--table", "items", "--follow", "--max-interval", "2562048h"]),
        export("export-max-age-days-out-of-range", 2,
               &["age \"999999999999999999999d\" is out of range"],
               &["--table", "items", "--max-age", "999999999999999999999d"]),
        export("export-keep-epochs-negative", 2, &["--keep-epochs"],
               &["--table", "items", "--keep-epochs=-1"]),
        export("export-max-diff-fraction-not-a-number", 2,
               &["max diff fraction must be a non-negative number, got NaN"],
               &["--table", "items", "--follow", "--max-diff-fraction", "NaN"]),
        export("export-lease-without-a-cluster", 2, &["--lease: no Kubernetes client configuration"],
               &["--table", "items", "--follow", "--lease", "l", "--listen", "127.0.0.1:0"])
            .env("HOME", "/nonexistent"),
        export("export-server-refuses-connections", 1, &["Connection refused"],
               &["--table", "items"])
            .env("LARCH_PG_DSN", closed.clone()),
    ];
    for c in &cases {
        run(c);
    }
    // The DSN's password never shows (the test cluster trusts; give one to look for).
    let secret = format!("{closed} password=hunter2-secret");
    let out = run(&export(
        "export-password-never-printed",
        1,
        &["Connection refused"],
        &["--table", "items"],
    )
    .env("LARCH_PG_DSN", secret));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("hunter2"));
    // Nothing left: no archive written anywhere, no slot, no publication.
    assert_eq!(
        tree(&outside),
        BTreeMap::new(),
        "nothing written through the link"
    );
    let entries: Vec<_> = std::fs::read_dir(&store)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(entries, ["public.items"], "only the link: {entries:?}");
    let left: i64 = db
        .client
        .query_one(
            "SELECT (SELECT count(*) FROM pg_replication_slots WHERE database = current_database()) \
             + (SELECT count(*) FROM pg_publication)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "no slot or publication left behind");
    let mut names: Vec<&str> = cases.iter().map(|c| c.name).collect();
    names.push("export-password-never-printed");
    documented(&names);
}

fn port_of(dsn: &str) -> String {
    dsn.split_whitespace()
        .find_map(|kv| kv.strip_prefix("port="))
        .expect("a key=value DSN with a port")
        .to_string()
}

/// Issue 14 item 5 in the engine: `key_fields` that are no column of the archive, or that do not
/// identify rows, never serve a table (before: served with exit 0, fewer or other rows). The
/// engine is not ready and `/status` says why.
#[tokio::test]
async fn engine_key_fields_that_do_not_identify_rows_are_never_served() {
    use crate::engine_support::{eventually, get, get_json, start_engine};
    let tmp = tempfile::tempdir().unwrap();
    let archive = tmp.path().join("archive");
    good_archive(&archive).await;
    let mut names = Vec::new();
    // A key field that is no column stops the engine (exit 2, reason ColumnNotFound in the
    // termination message the operator reads) before anything is served.
    let not_a_column = write(
        tmp.path(),
        "not-a-column.yaml",
        &engine_yaml(&archive, "    key_fields: [nope]\n", "[{type: memory}]"),
    );
    #[rustfmt::skip]
    let c = case("engine-key-field-not-a-column", 2,
                 &["key field \"nope\" is not a column of table public.t in the archive (its columns: id, tenant, name)"],
                 &["engine", "--listen", "127.0.0.1:0", "--config"])
        .arg(&not_a_column);
    run(&c);
    names.push(c.name);
    for (name, fields, says) in [(
        "engine-key-field-not-unique",
        "[tenant]",
        "share a value of the key (tenant): the key fields do not identify rows",
    )] {
        let yaml = engine_yaml(
            &archive,
            &format!("    key_fields: {fields}\n"),
            "[{type: memory}]",
        );
        let engine = start_engine(&yaml).await;
        let addr = engine.addr;
        let message = eventually(30, "the error in /status", || async move {
            get_json(addr, "/status").await["sources"]["s"]["last_error"]["message"]
                .as_str()
                .map(str::to_string)
        })
        .await;
        assert!(message.contains(says), "{name}: {message}");
        assert_eq!(get(addr, "/health/ready").await.0, 503, "{name}");
        let status = get_json(addr, "/status").await;
        assert_eq!(
            status["pipelines"]["s:public.t:memory"]["state"], "ERROR",
            "{name}: {status}"
        );
        assert_eq!(
            status["pipelines"]["s:public.t:memory"]["row_count"], 0,
            "{name}: {status}"
        );
        engine.stop().await.unwrap();
        names.push(name);
    }
    documented(&names);
}

/// An S3 server that answers with an error (SeaweedFS, a bucket that does not exist): the
/// message is the operation, the HTTP status and the server's code and message, in one short
/// line (before: the SDK's whole error structure).
#[tokio::test]
async fn s3_errors_are_one_short_line() {
    let weed = crate::support::seaweedfs();
    #[rustfmt::skip]
    let c = case("inspect-s3-bucket-missing", 1,
                 &["s3://no-such-bucket-here/public.t/manifest.json: S3 GetObject: HTTP 404 NoSuchBucket: The specified bucket does not exist"],
                 &["archive", "inspect", "--store", "s3", "--bucket", "no-such-bucket-here",
                   "--region", "us-east-1", "--path-style", "--key-prefix", "public.t/",
                   "--endpoint", weed.endpoint()])
        .env("AWS_ACCESS_KEY_ID", "larch-key")
        .env("AWS_SECRET_ACCESS_KEY", "larch-secret");
    let out = run(&c);
    let msg = String::from_utf8_lossy(&out.stderr);
    eprintln!("{msg}");
    assert!(
        msg.len() < 400,
        "a short S3 message: {} bytes: {msg}",
        msg.len()
    );
    // The same keys with a trailing newline (as a variable filled from a file or a Secret
    // often has): the SDK panicked signing the request; now refused, naming the variable.
    #[rustfmt::skip]
    let newline = Case {
        args: c.args.clone(),
        ..case("s3-credential-with-a-newline", 1,
               &["AWS_ACCESS_KEY_ID holds a line break or another control character"], &[])
            .env("AWS_ACCESS_KEY_ID", "larch-key\n")
            .env("AWS_SECRET_ACCESS_KEY", "larch-secret\n")
    };
    let out = run(&newline);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("larch-secret"));
    documented(&[c.name, newline.name]);
}
