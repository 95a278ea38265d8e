//! Masked exports (`larch export --transform`) against a real PostgreSQL 15, into a local
//! store and SeaweedFS: no raw value of a masked column in any object, log line or status;
//! joins on the hashed key keep the source's count; changes of masked rows land on the right
//! archived rows; a column added under a mask-everything policy never appears raw.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use larch::archive::format::Format;
use larch::archive::reader::ArchiveReader;
use larch::archive::store::Store;
use larch::archive::store::local::LocalStore;
use larch::source::SyncSource;
use larch::source::archive::{ArchiveReplayOptions, ArchiveReplaySource};
use serde_json::Value;

use crate::engine_support::{eventually, get, get_json};
use crate::postgres_continuous::{listening, unsafe_kill};
use crate::support::postgres::{Database, new_database};
use crate::support::seaweedfs::seaweedfs;

pub(crate) const RULES: &str = r#"
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
  public.orders:
    columns:
      id: hash
      user_id: hash
      note: {redact: "x"}
      total: keep
"#;

pub(crate) const USERS: i64 = 120;
pub(crate) const ORDERS: i64 = 360;

pub(crate) async fn setup(db: &Database) {
    db.client
        .batch_execute(&format!(
            "CREATE TABLE users (id int8 PRIMARY KEY, email text NOT NULL, name varchar(40),
                                 ssn text, phone text, token uuid, bio text);
             ALTER TABLE users ALTER COLUMN bio SET STORAGE EXTERNAL;
             CREATE TABLE orders (id int4 PRIMARY KEY, user_id int8 REFERENCES users (id),
                                  note text, total numeric(10,2));
             INSERT INTO users
               SELECT 7000000000 + g, 'user' || g || '@acme-corp.com', 'Realname' || g,
                      'SSN-' || (100000 + g), 'PHONE-' || (555000 + g),
                      md5('token' || g)::uuid, NULL
               FROM generate_series(1, {USERS}) g;
             UPDATE users SET bio = repeat('secretbio', 1500) WHERE id = 7000000001;
             INSERT INTO orders
               SELECT 300000000 + g, 7000000000 + (g % {USERS}) + 1, 'ordernote' || g, g
               FROM generate_series(1, {ORDERS}) g;"
        ))
        .await
        .unwrap();
}

/// Every raw value of every masked column now in the source (and `extra` ones seen before).
pub(crate) async fn raw_values(db: &Database) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for r in db
        .client
        .query(
            "SELECT id::text, email, name, ssn, phone, token::text FROM users",
            &[],
        )
        .await
        .unwrap()
    {
        for i in 0..6 {
            if let Some(v) = r.get::<_, Option<String>>(i) {
                out.insert(v);
            }
        }
    }
    for r in db
        .client
        .query("SELECT id::text, note FROM orders", &[])
        .await
        .unwrap()
    {
        out.insert(r.get(0));
        out.insert(r.get(1));
    }
    // A uuid's text without dashes, and the TOASTed bio's word.
    let dashless: Vec<String> = out
        .iter()
        .filter(|v| v.len() == 36 && v.matches('-').count() == 4)
        .map(|v| v.replace('-', ""))
        .collect();
    out.extend(dashless);
    out.insert("secretbio".into());
    out.insert("acme-corp".into());
    out
}

pub(crate) fn hits<'a>(bytes: &[u8], raw: &'a BTreeSet<String>) -> Vec<&'a str> {
    let text = String::from_utf8_lossy(bytes);
    raw.iter()
        .filter(|r| text.contains(r.as_str()))
        .map(String::as_str)
        .collect()
}

/// Every object under `dir` checked for every raw value; returns how many objects were read.
pub(crate) fn scan_dir(dir: &Path, raw: &BTreeSet<String>) -> usize {
    let mut n = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let found = hits(&std::fs::read(&p).unwrap(), raw);
                assert!(
                    found.is_empty(),
                    "{} holds raw values {found:?}",
                    p.display()
                );
                n += 1;
            }
        }
    }
    n
}

pub(crate) fn larch() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_larch"));
    c.env_remove("LARCH_PG_DSN")
        .env_remove("LARCH_TRANSFORM_KEY");
    c
}

/// `larch export --follow` of `users` into `dir` through the rules of `files`, hashing with
/// `key`, its status on an ephemeral port (read it with `listening`).
pub(crate) fn follow_masked(
    dir: &Path,
    files: &Files,
    slot: &str,
    key: &str,
    db: &Database,
) -> std::process::Child {
    larch()
        .args(["export", "--follow", "--table", "users", "--store", "local"])
        .args([
            "--listen",
            "127.0.0.1:0",
            "--diff-interval",
            "200ms",
            "--slot",
            slot,
        ])
        .arg("--path")
        .arg(dir)
        .arg("--transform")
        .arg(files.rules())
        .env("LARCH_TRANSFORM_KEY", key)
        .env("LARCH_PG_DSN", &db.dsn)
        .env("LARCH_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

pub(crate) struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    pub(crate) fn new(rules: &str) -> Files {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("rules.yaml"), rules).unwrap();
        std::fs::write(dir.path().join("key"), "a-dev-seed-key-of-32-bytes-long!\n").unwrap();
        Files { dir }
    }
    pub(crate) fn rules(&self) -> std::path::PathBuf {
        self.dir.path().join("rules.yaml")
    }
    pub(crate) fn key(&self) -> std::path::PathBuf {
        self.dir.path().join("key")
    }
}

/// A one-shot masked export of `table` into `store_args`; (exit code, stdout, stderr).
/// Replication slots are cluster-wide: each export of a test gets a name of its own, so tests
/// exporting the same table from their own databases run side by side.
pub(crate) fn unique_slot(prefix: &str) -> String {
    static SLOTS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        SLOTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

pub(crate) fn export_once(
    db: &Database,
    files: &Files,
    table: &str,
    store_args: &[&str],
) -> (i32, String, String) {
    let out = larch()
        .args(["export", "--table", table, "--format", "jsonl,protobuf"])
        .args(["--slot", &unique_slot("larch_masking_once")])
        .args(store_args)
        .arg("--transform")
        .arg(files.rules())
        .arg("--transform-key-file")
        .arg(files.key())
        .env("LARCH_PG_DSN", &db.dsn)
        .env("AWS_ACCESS_KEY_ID", "larch-test-key")
        .env("AWS_SECRET_ACCESS_KEY", "larch-test-secret")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub(crate) async fn rows(store: Arc<dyn Store>, prefix: &str) -> (i64, Vec<Value>) {
    let reader = ArchiveReader::new(store, prefix, vec![Format::Jsonl]).unwrap();
    let (manifest, folded) = reader.reconstruct_at(None, &[]).await.unwrap();
    let rows = folded
        .rows
        .values()
        .map(|r| serde_json::from_str(r.as_str()).unwrap())
        .collect();
    (manifest.epoch, rows)
}

pub(crate) fn local(dir: &Path) -> Arc<dyn Store> {
    Arc::new(LocalStore::new(dir).unwrap())
}

pub(crate) fn joined(users: &[Value], orders: &[Value]) -> usize {
    let ids: BTreeSet<i64> = users.iter().map(|u| u["id"].as_i64().unwrap()).collect();
    orders
        .iter()
        .filter(|o| ids.contains(&o["user_id"].as_i64().unwrap()))
        .count()
}

#[tokio::test]
pub(crate) async fn masked_exports_leave_no_raw_value_anywhere_and_keys_still_join() {
    let db = new_database().await;
    setup(&db).await;
    let files = Files::new(RULES);
    let raw = raw_values(&db).await;
    let source_join: i64 = db
        .client
        .query_one(
            "SELECT count(*) FROM orders o JOIN users u ON u.id = o.user_id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(source_join, ORDERS);

    // One-shot, into a local store and into SeaweedFS.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap();
    let weed = seaweedfs();
    let bucket = weed.new_bucket().await;
    for table in ["users", "orders"] {
        let (code, _, err) = export_once(&db, &files, table, &["--store", "local", "--path", path]);
        assert_eq!(code, 0, "{err}");
        assert!(hits(err.as_bytes(), &raw).is_empty(), "stderr: {err}");
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
        let (code, _, err) = export_once(&db, &files, table, &s3);
        assert_eq!(code, 0, "{err}");
    }
    assert!(
        scan_dir(dir.path(), &raw) >= 6,
        "two manifests and 2×2 snapshots"
    );
    let s3: Arc<dyn Store> = Arc::new(weed.s3_store(&bucket, "").await);
    let objects = s3.list("").await.unwrap();
    assert!(objects.len() >= 6, "{objects:?}");
    for o in &objects {
        let bytes = s3.get(&o.key).await.unwrap().unwrap().bytes;
        let found = hits(&bytes, &raw);
        assert!(found.is_empty(), "s3 {} holds raw values {found:?}", o.key);
    }

    // The hashed foreign key joins as on the source; both stores hold the same rows.
    let (_, users) = rows(local(dir.path()), "public.users/").await;
    let (_, orders) = rows(local(dir.path()), "public.orders/").await;
    assert_eq!(users.len() as i64, USERS);
    assert_eq!(orders.len() as i64, ORDERS);
    assert_eq!(joined(&users, &orders) as i64, source_join);
    let mut from_s3 = rows(s3.clone(), "public.users/").await.1;
    let mut here = users.clone();
    for r in [&mut from_s3, &mut here] {
        r.sort_by_key(|u| u["id"].as_i64());
    }
    assert!(
        from_s3 == here,
        "two exports with one key give the same rows"
    );
    let u = &users[0];
    assert!(u.get("ssn").is_none(), "dropped: {u}");
    assert_eq!(u["phone"], Value::Null, "undeclared: null");
    assert_eq!(u["name"], "REDACTED");
    let email = u["email"].as_str().unwrap();
    let (local_part, domain) = email.split_once('@').expect("an email stays an email");
    assert!(
        local_part.starts_with(|c: char| c.is_ascii_lowercase()),
        "{email}"
    );
    assert!(
        domain.ends_with(".com") && !domain.contains("acme"),
        "{email}"
    );
    let domains: BTreeSet<&str> = users
        .iter()
        .map(|u| u["email"].as_str().unwrap().split_once('@').unwrap().1)
        .collect();
    assert_eq!(domains.len(), 1, "one domain stays one domain: {domains:?}");
    let bio = users.iter().find_map(|u| u["bio"].as_str()).unwrap();
    assert_eq!(bio.len(), 9 * 1500, "a hashed text keeps its length");
    for o in &orders {
        assert!(
            o["id"].as_i64().unwrap() <= i64::from(i32::MAX),
            "int4 stays int4: {o}"
        );
    }

    // `archive inspect` says what the archive went through; the key itself is nowhere.
    let out = larch()
        .args(["archive", "inspect", "--table", "users", "--path", path])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("transform:    masked (key hmac-sha256:"),
        "{text}"
    );
    assert!(text.contains("undeclared columns: null"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with("ssn") && l.ends_with("drop")),
        "{text}"
    );
    let manifest = std::fs::read_to_string(dir.path().join("public.users/manifest.json")).unwrap();
    let m: Value = serde_json::from_str(&manifest).unwrap();
    assert_eq!(m["transform"]["columns"]["email"], "hash");
    assert!(
        !m["columns"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["Name"] == "ssn")
    );
    assert!(
        !manifest.contains("a-dev-seed-key"),
        "the key never reaches the manifest"
    );

    // require_transformed: the masked archive loads, a raw one is refused, naming it.
    let raw_dir = tempfile::tempdir().unwrap();
    let out = larch()
        .args(["export", "--table", "users", "--store", "local", "--path"])
        .arg(raw_dir.path())
        .env("LARCH_PG_DSN", &db.dsn)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let init = |dir: &Path| {
        let reader = ArchiveReader::new(local(dir), "public.users/", vec![Format::Jsonl]).unwrap();
        let table = larch::archive::model::TableId::new("public", "users");
        let mut opts = ArchiveReplayOptions::new("seed", table.clone());
        opts.require_transformed = true;
        async move { ArchiveReplaySource::new(reader, opts).init(&[table]).await }
    };
    let columns = init(dir.path()).await.unwrap();
    assert_eq!(columns.values().next().unwrap().len(), 6, "ssn dropped");
    let err = init(raw_dir.path()).await.unwrap_err();
    let e = format!("{err:#}");
    assert!(
        e.contains("require_transformed: the archive public.users/manifest.json (table public.users) records no masking transform"),
        "{e}"
    );
    // The reason the engine's termination message carries, which the operator's condition shows.
    assert_eq!(
        larch::failure::classify(&err),
        larch::failure::Reason::ArchiveNotTransformed
    );
    // The engine gives up on it (retrying would only repeat the refusal): exit 2, the reason
    // in its termination log, nothing served.
    let config = raw_dir.path().join("engine.yaml");
    std::fs::write(
        &config,
        format!(
            "sources:\n  seed:\n    type: archive\n    store: {{type: local, path: \"{}\"}}\n    \
             key_prefix: public.users/\n    require_transformed: true\ntables:\n  - source: seed\n    \
             schema: public\n    table: users\n    targets:\n      - type: memory\n",
            raw_dir.path().display()
        ),
    )
    .unwrap();
    let termination = raw_dir.path().join("termination-log");
    let mut engine = larch()
        .args(["engine", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .arg("--termination-log")
        .arg(&termination)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(status) = engine.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            engine.kill().unwrap();
            panic!("the engine kept retrying an unmasked archive under require_transformed");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(status.code(), Some(2), "exit status of a refusal");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&termination).unwrap()).unwrap();
    assert_eq!(doc["reason"], "ArchiveNotTransformed", "{doc}");
    assert!(
        doc["error"]
            .as_str()
            .is_some_and(|e| e.contains("public.users/manifest.json")),
        "{doc}"
    );
}

#[tokio::test]
pub(crate) async fn a_continuous_masked_export_lands_changes_on_the_right_rows_and_masks_a_new_column()
 {
    let db = new_database().await;
    setup(&db).await;
    let files = Files::new(RULES);
    let mut raw = raw_values(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let slot = format!("larch_mask_{}", db.name);
    let mut child = follow_masked(
        dir.path(),
        &files,
        &slot,
        "a-dev-seed-key-of-32-bytes-long!",
        &db,
    );
    let (addr, stderr, reader) = listening(&mut child);
    eventually(60, "export readiness", || async move {
        (get(addr, "/health/ready").await.0 == 200).then_some(())
    })
    .await;
    // Inserts, updates of masked and kept columns (a TOASTed value unchanged), a key change, a
    // delete; their raw values join the scan.
    db.client
        .batch_execute(
            "INSERT INTO users VALUES (7100000001, 'newcomer@acme-corp.com', 'Newname', 'SSN-999001', 'PHONE-999001', md5('tok-new')::uuid, NULL);
             UPDATE users SET email = 'changed@acme-corp.com', name = 'Renamed' WHERE id = 7000000002;
             UPDATE users SET name = 'Bioowner' WHERE id = 7000000001;
             UPDATE orders SET user_id = 7000000004 WHERE user_id IN (7000000003, 7000000005);
             UPDATE users SET id = 7200000003 WHERE id = 7000000003;
             DELETE FROM users WHERE id = 7000000005;",
        )
        .await
        .unwrap();
    raw.extend(raw_values(&db).await);
    raw.insert("7000000003".into());
    raw.insert("7000000005".into());
    eventually(30, "a diff", || async move {
        (get_json(addr, "/status").await["diffs"]
            .as_u64()
            .unwrap_or(0)
            >= 1)
            .then_some(())
    })
    .await;
    // The archive's rows equal a fresh masked snapshot of the table: every change found its
    // (hashed) row.
    let fresh = tempfile::tempdir().unwrap();
    let (code, _, err) = export_once(
        &db,
        &files,
        "users",
        &["--store", "local", "--path", fresh.path().to_str().unwrap()],
    );
    assert_eq!(code, 0, "{err}");
    let (want_epoch, want) = rows(local(fresh.path()), "public.users/").await;
    assert_eq!(want_epoch, 1);
    let (epoch, got) = rows(local(dir.path()), "public.users/").await;
    assert_eq!(epoch, 1, "the changes came as diffs of the first epoch");
    let by_id = |rows: &[Value]| -> BTreeMap<i64, Value> {
        rows.iter()
            .map(|r| (r["id"].as_i64().unwrap(), r.clone()))
            .collect()
    };
    let (got_by_id, want_by_id) = (by_id(&got), by_id(&want));
    assert_eq!(
        got_by_id.keys().collect::<Vec<_>>(),
        want_by_id.keys().collect::<Vec<_>>(),
        "the same (hashed) identities"
    );
    for (id, w) in &want_by_id {
        assert!(&got_by_id[id] == w, "row {id}: {} != {w}", got_by_id[id]);
    }
    assert_eq!(got.len() as i64, USERS);
    let bio_rows = got.iter().filter(|r| r["bio"].is_string()).count();
    assert_eq!(
        bio_rows, 1,
        "the unchanged TOASTed value was filled and hashed"
    );

    // A column added under `undeclared: null` is masked from its first row.
    db.client
        .batch_execute(
            "ALTER TABLE users ADD COLUMN secret_code text;
             UPDATE users SET secret_code = 'addedsecret' || id;",
        )
        .await
        .unwrap();
    raw.insert("addedsecret".into());
    eventually(
        60,
        "the schema change's epoch and a diff after it",
        || async {
            let s = get_json(addr, "/status").await;
            (s["epoch"].as_i64() >= Some(2)).then_some(())
        },
    )
    .await;
    db.client
        .batch_execute("UPDATE users SET secret_code = 'addedsecret-again' WHERE id = 7000000010;")
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    let status = get(addr, "/status").await.1;
    let metrics = get(addr, "/metrics").await.1;
    unsafe_kill(child.id(), "TERM");
    assert_eq!(child.wait().unwrap().code(), Some(0));
    let _ = reader.join();
    let (_, after) = rows(local(dir.path()), "public.users/").await;
    assert!(
        after.iter().all(|r| r["secret_code"].is_null()),
        "{:?}",
        after[0]
    );
    assert!(scan_dir(dir.path(), &raw) >= 4);
    let log = stderr.lock().unwrap().join("\n");
    for (what, text) in [
        ("stderr", &log),
        ("/status", &status),
        ("/metrics", &metrics),
    ] {
        let found = hits(text.as_bytes(), &raw);
        assert!(
            found.is_empty(),
            "{what} holds raw values {found:?}: {text}"
        );
    }
}

#[tokio::test]
pub(crate) async fn bad_transforms_are_clear_errors_and_export_nothing() {
    let db = new_database().await;
    setup(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap();
    let cases = [
        (
            "tables: {public.users: {columns: {emial: hash}}}",
            true,
            "transform of table public.users: column \"emial\" does not exist",
        ),
        (
            "tables: {public.orders: {columns: {id: keep, total: hash}}}",
            true,
            "column \"total\": hash cannot keep the type numeric(10,2)",
        ),
        (
            "tables: {public.orders: {columns: {total: keep}}}",
            true,
            "column \"id\" (undeclared) is a key field; `null` would give every row the same \
             identity: name it in `columns` with hash, permute or keep",
        ),
        (
            "tables: {public.users: {columns: {email: hash}}}",
            false,
            "the transform rules hash columns but no key was given",
        ),
        (
            "tables: {public.users: {columns: {email: sha1}}}",
            true,
            "unknown transform \"sha1\"",
        ),
    ];
    for (rules, with_key, want) in cases {
        let files = Files::new(rules);
        let table = if rules.contains("orders") {
            "orders"
        } else {
            "users"
        };
        let mut cmd = larch();
        cmd.args([
            "export", "--table", table, "--store", "local", "--path", path,
        ])
        .args(["--slot", &unique_slot("larch_masking_bad")])
        .arg("--transform")
        .arg(files.rules())
        .env("LARCH_PG_DSN", &db.dsn);
        if with_key {
            cmd.arg("--transform-key-file").arg(files.key());
        }
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{rules}: {err}");
        assert!(err.contains(want), "{rules}: {err}");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "{rules}: nothing exported"
        );
    }
}

/// A one-shot export of `table` into the local store at `path` with extra arguments.
pub(crate) fn export_local(
    db: &Database,
    files: Option<&Files>,
    table: &str,
    path: &str,
    extra: &[&str],
) -> (i32, String) {
    let slot = unique_slot("larch_masking_subset");
    let mut cmd = larch();
    cmd.args([
        "export", "--table", table, "--store", "local", "--path", path,
    ])
    .args(["--slot", &slot])
    .args(extra)
    .env("LARCH_PG_DSN", &db.dsn);
    if let Some(files) = files {
        cmd.arg("--transform")
            .arg(files.rules())
            .arg("--transform-key-file")
            .arg(files.key());
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
