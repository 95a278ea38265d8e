//! Issue 35: what a tenant controls (an export's row filter and masking rules, from a spec it may
//! edit) against a real PostgreSQL 15 shared with others. A row filter cannot act on the server
//! or read other tables; a slow one cannot hold the snapshot past its age limit; every session
//! larch opens carries its timeouts; a data error's server text (which quotes row values) never
//! reaches the termination message or stderr; debug logs carry no statement parameters.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use larch::source::postgres::{PostgresConfig, Session, SessionLimits, connect};
use serde_json::Value;

use crate::engine_support::{eventually, get, get_json};
use crate::masking::{Files, RULES, USERS, hits, larch, local, raw_values, rows, setup};
use crate::postgres_continuous::{Follow, listening, unsafe_kill};
use crate::support::postgres::{Database, new_database};

/// A one-shot export of `table` into `dir` with `extra` arguments and a summary file; (exit
/// code, stderr, the summary's termination message).
fn export(
    dsn: &str,
    table: &str,
    dir: &Path,
    extra: &[&str],
    files: Option<&Files>,
    log: &str,
) -> (i32, String, Value) {
    static SLOTS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let slot = format!(
        "larch_hostile_{}_{}",
        std::process::id(),
        SLOTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let summary = dir.join("summary.json");
    let store = dir.join("store");
    let mut cmd = larch();
    cmd.args([
        "export", "--table", table, "--store", "local", "--slot", &slot,
    ])
    .arg("--path")
    .arg(&store)
    .arg("--summary-file")
    .arg(&summary)
    .args(extra)
    .env("LARCH_PG_DSN", dsn)
    .env("LARCH_LOG", log);
    if let Some(files) = files {
        cmd.arg("--transform")
            .arg(files.rules())
            .arg("--transform-key-file")
            .arg(files.key());
    }
    let out = cmd.output().unwrap();
    let message = std::fs::read_to_string(&summary)
        .ok()
        .and_then(|t| t.lines().rev().find_map(|l| serde_json::from_str(l).ok()))
        .unwrap_or(Value::Null);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        message,
    )
}

/// No manifest in the store under `dir`: nothing was committed.
fn nothing_written(dir: &Path) -> bool {
    let mut stack = vec![dir.join("store")];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().is_some_and(|n| n == "manifest.json") {
                return false;
            }
        }
    }
    true
}

async fn slot_exists(db: &Database, slot: &str) -> bool {
    db.client
        .query_one(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .unwrap()
        .get::<_, i64>(0)
        == 1
}

/// Findings 2 and 3: functions with effects, subqueries and a filter that escapes its
/// parenthesis after an `E'\''` string are refused by the parser, before anything connects.
#[tokio::test]
async fn row_filters_that_act_on_the_server_are_refused_before_any_query() {
    let db = new_database().await;
    setup(&db).await;
    let victim = format!("other_team_{}", db.name);
    db.client
        .query(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&victim],
        )
        .await
        .unwrap();
    let drop_it = format!("pg_drop_replication_slot('{victim}') IS NULL");
    for (predicate, refused) in [
        (
            drop_it.as_str(),
            "function pg_drop_replication_slot is not allowed in a row filter (allowed: abs, ",
        ),
        (
            "pg_terminate_backend(pg_backend_pid())",
            "function pg_terminate_backend is not allowed",
        ),
        ("pg_sleep(1000) IS NULL", "function pg_sleep is not allowed"),
        (
            "set_config('statement_timeout', '0', false) <> ''",
            "function set_config is not allowed",
        ),
        (
            "pg_advisory_lock(35) IS NULL",
            "function pg_advisory_lock is not allowed",
        ),
        (
            "pg_logical_emit_message(true, 'x', 'y') IS NULL",
            "function pg_logical_emit_message is not allowed",
        ),
        (
            "id IN (SELECT id FROM users WHERE email LIKE 'user1%')",
            "a subquery (SELECT …) is not allowed in a row filter",
        ),
        (r"email <> E'\'' OR true) LIMIT (1", "LIMIT is not allowed"),
        (
            r"email = E'\'' ) OR (true) -- '",
            "comments (`--`, `/* */`) are not allowed in a row filter",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (code, err, message) = export(
            &db.dsn,
            "users",
            dir.path(),
            &["--where", predicate],
            None,
            "info",
        );
        assert_eq!(code, 2, "{predicate}: {err}");
        assert!(
            err.contains(&format!(
                "the row filter of table public.users (where: {predicate}): "
            )) && err.contains(refused),
            "{predicate}: {err}"
        );
        assert_eq!(message["reason"], "InvalidConfig", "{predicate}");
        assert!(nothing_written(dir.path()), "{predicate}");
    }
    assert!(
        slot_exists(&db, &victim).await,
        "the other team's slot is still there"
    );
    // Refused before anything connects: the same answer with a server that does not exist.
    let dir = tempfile::tempdir().unwrap();
    let (code, err, _) = export(
        "host=127.0.0.1 port=1 user=nobody dbname=nothing connect_timeout=2",
        "users",
        dir.path(),
        &["--where", &drop_it],
        None,
        "info",
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("function pg_drop_replication_slot is not allowed"),
        "{err}"
    );
    // An allowed predicate still exports.
    let dir = tempfile::tempdir().unwrap();
    let (code, err, _) = export(
        &db.dsn,
        "users",
        dir.path(),
        &[
            "--where",
            "lower(email) LIKE 'user1%' AND id BETWEEN 7000000001 AND 7000000200",
        ],
        None,
        "info",
    );
    assert_eq!(code, 0, "{err}");
}

/// Finding 2: a filter that is allowed but slow cannot hold the snapshot (and the primary's
/// xmin horizon) past `--snapshot-max-age`; every kind of session carries its timeouts.
#[tokio::test]
async fn a_slow_row_filter_is_cut_by_the_snapshot_age_and_sessions_carry_their_timeouts() {
    let db = new_database().await;
    db.client
        .batch_execute(
            "CREATE TABLE big (id int8 PRIMARY KEY, v text);
             INSERT INTO big SELECT g, md5(g::text) FROM generate_series(1, 2000000) g;
             ANALYZE big;",
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The other tests' write transactions share this server: the slot's creation waits for
    // them, and that wait counts against the same 300ms. Such a run is retried (its error
    // names the wait); the subject here is the copy's cut.
    // Other tests' restores and loads hold write transactions for seconds: retry for long
    // enough that one attempt finds a moment without them.
    let retry_until = std::time::Instant::now() + Duration::from_secs(120);
    let (code, err, message, started) = loop {
        let started = std::time::Instant::now();
        let (code, err, message) = export(
            &db.dsn,
            "big",
            dir.path(),
            &[
                "--where",
                "lower(v || v || v || v) LIKE '%zz%' OR upper(v || v) LIKE '%ZZ%'",
                "--snapshot-max-age",
                "300ms",
            ],
            None,
            "info",
        );
        let slot_waited = err.contains(
            "the write transactions running on the server did not end within --snapshot-max-age (300ms)",
        );
        if slot_waited && std::time::Instant::now() < retry_until {
            assert!(nothing_written(dir.path()));
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        break (code, err, message, started);
    };
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains(
            "copying table public.big: the baseline's snapshot reached its age limit \
             (--snapshot-max-age) and the copy was cancelled (SQLSTATE 57014)"
        ),
        "{err}"
    );
    assert!(
        message["error"]
            .as_str()
            .unwrap()
            .contains("reached its age limit"),
        "{message}"
    );
    assert!(nothing_written(dir.path()));
    assert!(started.elapsed() < Duration::from_secs(60));
    // Nothing of larch's is left running on the server.
    let c = &db.client;
    eventually(10, "larch's sessions to end", || async move {
        let n: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = current_database() AND application_name LIKE 'larch%'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        (n == 0).then_some(())
    })
    .await;

    let mut config = PostgresConfig::new(db.dsn.clone(), vec![], "s", "p");
    config.limits = SessionLimits {
        statement_timeout: Duration::from_secs(5),
        lock_timeout: Duration::from_millis(1500),
        idle_in_transaction_timeout: Duration::from_secs(30),
        snapshot_max_age: Duration::from_secs(3600),
    };
    for (session, want) in [
        (Session::Catalog, ["5s", "1500ms", "30s"]),
        (Session::Snapshot, ["1h", "1500ms", "1h"]),
    ] {
        let client = connect(&config, session).await.unwrap();
        let mut got = Vec::new();
        for setting in [
            "statement_timeout",
            "lock_timeout",
            "idle_in_transaction_session_timeout",
        ] {
            let rows = client
                .simple_query(&format!("SHOW {setting}"))
                .await
                .unwrap();
            let value = rows.iter().find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
                _ => None,
            });
            got.push(value.unwrap());
        }
        assert_eq!(got, want, "{session:?}");
    }
    // The defaults.
    let client = connect(
        &PostgresConfig::new(db.dsn.clone(), vec![], "s", "p"),
        Session::Catalog,
    )
    .await
    .unwrap();
    let row = client
        .query_one(
            "SELECT current_setting('statement_timeout'), current_setting('lock_timeout'),
                    current_setting('idle_in_transaction_session_timeout'),
                    current_setting('standard_conforming_strings')",
            &[],
        )
        .await
        .unwrap();
    let defaults: Vec<String> = (0..4).map(|i| row.get(i)).collect();
    assert_eq!(defaults, ["1min", "10s", "1min", "on"]);
}

/// Creating a slot waits for the write transactions running on the primary to end (the slot is
/// consistent only after them). That wait queues no writer, so a transaction longer than
/// `--lock-timeout` delays the export instead of failing it (it failed with "lock timeout").
#[tokio::test]
async fn a_write_transaction_longer_than_the_lock_timeout_delays_the_slot_without_failing_it() {
    let db = new_database().await;
    db.client
        .batch_execute(
            "CREATE TABLE t (id int8 PRIMARY KEY, v text); INSERT INTO t VALUES (1, 'a');",
        )
        .await
        .unwrap();
    let (holder, conn) = tokio_postgres::connect(&db.dsn, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    holder
        .batch_execute("BEGIN; INSERT INTO t VALUES (2, 'b');")
        .await
        .unwrap();
    let commit_later = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(4)).await;
        holder.batch_execute("COMMIT").await.unwrap();
    });
    let dir = tempfile::tempdir().unwrap();
    let (dsn, path) = (db.dsn.clone(), dir.path().to_path_buf());
    let (code, err, _) = tokio::task::spawn_blocking(move || {
        export(&dsn, "t", &path, &["--lock-timeout", "1s"], None, "info")
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "{err}");
    commit_later.await.unwrap();
    // The snapshot came after the commit it waited for: the row is in the archive.
    let (_, rows) = rows(local(&dir.path().join("store")), "public.t/").await;
    let ids: BTreeSet<i64> = rows.iter().filter_map(|r| r["id"].as_i64()).collect();
    assert_eq!(ids, BTreeSet::from([1, 2]), "{rows:?}");

    // A write transaction longer than the snapshot's age limit fails the export, and the error
    // says what it waited for and which limit ended the wait.
    let (holder, conn) = tokio_postgres::connect(&db.dsn, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    holder
        .batch_execute("BEGIN; INSERT INTO t VALUES (3, 'c');")
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (dsn, path) = (db.dsn.clone(), dir.path().to_path_buf());
    let (code, err, message) = tokio::task::spawn_blocking(move || {
        export(
            &dsn,
            "t",
            &path,
            &["--snapshot-max-age", "1s"],
            None,
            "info",
        )
    })
    .await
    .unwrap();
    holder.batch_execute("ROLLBACK").await.unwrap();
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains(
            "the write transactions running on the server did not end within \
             --snapshot-max-age (1000ms)"
        ),
        "{err}"
    );
    // Transient: the job retries it.
    assert_eq!(message["reason"], "Failed", "{message}");
    assert!(
        message["error"]
            .as_str()
            .unwrap()
            .contains("did not end within --snapshot-max-age"),
        "{message}"
    );
    assert!(nothing_written(dir.path()));
}

/// Finding 1: `CAST(email AS int)` on a masked table made the server quote the raw email in its
/// error, which became the termination message (then the ArchiveExport's condition).
#[tokio::test]
async fn a_data_error_of_a_masked_table_leaves_no_value_in_any_message() {
    let db = new_database().await;
    setup(&db).await;
    let raw = raw_values(&db).await;
    let files = Files::new(RULES);
    for log in ["info", "debug"] {
        let dir = tempfile::tempdir().unwrap();
        let (code, err, message) = export(
            &db.dsn,
            "users",
            dir.path(),
            &["--where", "CAST(email AS int) > 0"],
            Some(&files),
            log,
        );
        assert_ne!(code, 0, "{err}");
        let text = message["error"]
            .as_str()
            .unwrap_or_else(|| panic!("no termination message ({code}): {err}"));
        assert!(
            text.contains(
                "copying table public.users: the server refused a value (SQLSTATE 22P02 \
                 invalid_text_representation"
            ) && text.contains("its message is withheld: it may quote row values"),
            "{text}"
        );
        for (what, bytes) in [("summary", message.to_string()), ("stderr", err.clone())] {
            let found = hits(bytes.as_bytes(), &raw);
            assert!(
                found.is_empty(),
                "LARCH_LOG={log}: {what} holds {found:?}: {bytes}"
            );
        }
        assert!(nothing_written(dir.path()));
    }

    // A server error anywhere in a chain (the engine's and restore's targets pass them on with
    // context) is reduced as it is rendered: a unique violation names the constraint, not the key.
    let e = db
        .client
        .execute(
            "INSERT INTO users (id, email) VALUES (7000000001, 'dup@acme-corp.com')",
            &[],
        )
        .await
        .unwrap_err();
    let chain = anyhow::Error::from(e).context("postgres target public.users: writing");
    let text = larch::failure::render(&chain);
    assert!(
        text.starts_with(
            "postgres target public.users: writing: the server refused a value (SQLSTATE 23505 \
             unique_violation; table public.users, constraint users_pkey;"
        ),
        "{text}"
    );
    assert!(
        !text.contains("7000000001") && !text.contains("dup@"),
        "{text}"
    );
    let summary = tempfile::NamedTempFile::new().unwrap();
    larch::failure::report(Some(summary.path()), &chain);
    let written = std::fs::read_to_string(summary.path()).unwrap();
    assert!(
        written.contains("23505") && !written.contains("7000000001"),
        "{written}"
    );
}

/// Finding 7: at `LARCH_LOG=debug` the PostgreSQL driver logged the parameters of the TOAST
/// look-up of a masked continuous export: raw keys.
#[tokio::test]
async fn debug_logs_of_a_masked_continuous_export_carry_no_raw_key() {
    let db = new_database().await;
    setup(&db).await;
    let files = Files::new(RULES);
    let raw = raw_values(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let slot = format!("larch_debuglog_{}", db.name);
    let mut child = larch()
        .args(["export", "--follow", "--table", "users", "--store", "local"])
        .args(["--listen", "127.0.0.1:0", "--diff-interval", "200ms"])
        .args(["--slot", &slot, "--slot-mode", "temporary"])
        .arg("--path")
        .arg(dir.path())
        .arg("--transform")
        .arg(files.rules())
        .arg("--transform-key-file")
        .arg(files.key())
        .env("LARCH_PG_DSN", &db.dsn)
        .env("LARCH_LOG", "debug")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (addr, stderr, reader) = listening(&mut child);
    eventually(60, "export readiness", || async move {
        (get(addr, "/health/ready").await.0 == 200).then_some(())
    })
    .await;
    // The TOASTed bio is unchanged: the export looks it up by the raw key.
    db.client
        .batch_execute("UPDATE users SET name = 'Bioowner' WHERE id = 7000000001;")
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
    unsafe_kill(child.id(), "TERM");
    assert_eq!(child.wait().unwrap().code(), Some(0));
    let _ = reader.join();
    let log = stderr.lock().unwrap().join("\n");
    let found = hits(log.as_bytes(), &raw);
    assert!(found.is_empty(), "the log holds raw values {found:?}");
    assert!(!log.contains("with parameters"), "no driver parameter line");
}

async fn publication_comment(db: &Database, name: &str) -> Option<Option<String>> {
    db.client
        .query_opt(
            "SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = $1",
            &[&name],
        )
        .await
        .unwrap()
        .map(|r| r.get(0))
}

/// `larch export cleanup` of `slot` (its publication named like it) as `owner`: (exit code,
/// stderr).
fn cleanup_as(db: &Database, slot: &str, owner: &str, extra: &[&str]) -> (i32, String) {
    let out = larch()
        .args(["export", "cleanup", "--slot", slot, "--owner", owner])
        .args(extra)
        .env("LARCH_PG_DSN", &db.dsn)
        .env("LARCH_LOG", "warn")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Finding 4: two ArchiveExports whose names used to map to one slot (`team-a`/`b-users` and
/// `team-a-b`/`users` were both `larch_team_a_b_users`) now get distinct slots and publications,
/// each recorded with its owner; a cleanup (or a new baseline) of one never drops the other's,
/// nor anything without a larch owner record or with a legacy one not explicitly adopted.
#[tokio::test]
async fn colliding_exports_get_distinct_slots_and_never_drop_each_others() {
    use larch::operator::export::build::export_slot_name;
    let db = new_database().await;
    db.client
        .batch_execute(
            "CREATE TABLE items (id int8 PRIMARY KEY, v text);
             INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 20) g;",
        )
        .await
        .unwrap();
    let (owner_a, owner_b) = (
        "archiveexport/team-a/b-users",
        "archiveexport/team-a-b/users",
    );
    let slot_a = export_slot_name("team-a", "b-users", None);
    let slot_b = export_slot_name("team-a-b", "users", None);
    assert_ne!(slot_a, slot_b);
    let dir = tempfile::tempdir().unwrap();
    for (slot, owner) in [(&slot_a, owner_a), (&slot_b, owner_b)] {
        let f = Follow::start(&db, &dir.path().join(slot), slot, &["--owner", owner]);
        f.ready().await;
        assert_eq!(f.terminate(), 0);
        assert!(slot_exists(&db, slot).await, "{slot}");
        assert_eq!(
            publication_comment(&db, slot).await,
            Some(Some(format!(
                "larch: created for replication slot {slot} by {owner}"
            )))
        );
    }

    // A's cleanup drops A's and only A's.
    let (code, stderr) = cleanup_as(&db, &slot_a, owner_a, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(!slot_exists(&db, &slot_a).await && publication_comment(&db, &slot_a).await.is_none());
    assert!(slot_exists(&db, &slot_b).await && publication_comment(&db, &slot_b).await.is_some());
    // A naming B's slot (a spec's slotName can) is refused, naming the recorded owner.
    let (code, stderr) = cleanup_as(&db, &slot_b, owner_a, &[]);
    assert_eq!(code, 0, "{stderr}");
    let refusal = format!("are recorded as owned by {owner_b}, not {owner_a}");
    assert!(
        stderr.contains(&format!("kept replication slot {slot_b}: publication {slot_b} and replication slot {slot_b} {refusal}"))
            && stderr.contains(&format!("kept publication {slot_b}: publication {slot_b} and replication slot {slot_b} {refusal}")),
        "{stderr}"
    );
    // So is streaming through it or replacing it for a new baseline.
    let f = Follow::start(
        &db,
        &dir.path().join("a-on-b"),
        &slot_b,
        &["--owner", owner_a],
    );
    let mut child = f.child;
    let status = child.wait().unwrap();
    assert!(!status.success());
    let stderr = f.stderr.lock().unwrap().join("\n");
    assert!(
        stderr.contains(&format!(
            "publication {slot_b} is recorded as owned by {owner_b}"
        )),
        "{stderr}"
    );
    assert!(slot_exists(&db, &slot_b).await && publication_comment(&db, &slot_b).await.is_some());

    // Objects without a larch record: neither cleanup nor a new baseline drops them.
    for sql in [
        "CREATE PUBLICATION theirs FOR TABLE items",
        "SELECT pg_create_logical_replication_slot('theirs', 'pgoutput')",
    ] {
        db.client.batch_execute(sql).await.unwrap();
    }
    let (code, stderr) = cleanup_as(&db, "theirs", owner_a, &["--adopt-legacy"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("kept replication slot theirs: no larch owner record: publication theirs has no larch comment")
            && stderr.contains("kept publication theirs: no larch owner record"),
        "{stderr}"
    );
    let f = Follow::start(
        &db,
        &dir.path().join("theirs"),
        "theirs",
        &["--owner", owner_a],
    );
    let mut child = f.child;
    assert!(!child.wait().unwrap().success());
    let stderr = f.stderr.lock().unwrap().join("\n");
    assert!(
        stderr.contains("replication slot theirs already exists and larch will not drop it for a new baseline: no larch owner record"),
        "{stderr}"
    );
    assert!(slot_exists(&db, "theirs").await && publication_comment(&db, "theirs").await.is_some());

    // A record an older larch wrote (no owner) is dropped only when adopted explicitly.
    for sql in [
        "CREATE PUBLICATION larch_team_a_b_users FOR TABLE items",
        "COMMENT ON PUBLICATION larch_team_a_b_users IS 'larch: created for replication slot larch_team_a_b_users'",
        "SELECT pg_create_logical_replication_slot('larch_team_a_b_users', 'pgoutput')",
    ] {
        db.client.batch_execute(sql).await.unwrap();
    }
    let (code, stderr) = cleanup_as(&db, "larch_team_a_b_users", owner_a, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("did not record an owner") && stderr.contains("--adopt-legacy"),
        "{stderr}"
    );
    assert!(slot_exists(&db, "larch_team_a_b_users").await);
    let (code, stderr) = cleanup_as(&db, "larch_team_a_b_users", owner_a, &["--adopt-legacy"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(!slot_exists(&db, "larch_team_a_b_users").await);
    assert!(
        publication_comment(&db, "larch_team_a_b_users")
            .await
            .is_none()
    );
    // B's survived all of it.
    assert!(slot_exists(&db, &slot_b).await && publication_comment(&db, &slot_b).await.is_some());
    let (code, stderr) = cleanup_as(&db, &slot_b, owner_b, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(!slot_exists(&db, &slot_b).await);
    db.client
        .batch_execute("SELECT pg_drop_replication_slot('theirs')")
        .await
        .unwrap();
}

/// Subqueries into the tables the same export exports, once enabled (`subqueries: true`): the
/// kept rows are those the same predicate keeps on the server. A subquery into a table the
/// export does not export, one reading a column the export masks, and any subquery without
/// the switch are refused naming why, before anything is written.
#[tokio::test]
async fn row_filter_subqueries_read_only_what_the_export_exports_and_only_when_enabled() {
    let db = new_database().await;
    setup(&db).await;
    db.client
        .batch_execute(
            "CREATE TABLE secrets (user_id int8, secret text);
             INSERT INTO secrets SELECT 7000000000 + g, 'secret' FROM generate_series(1, 5) g;",
        )
        .await
        .unwrap();
    let rules = |switch: &str, users_where: &str| {
        format!(
            "{switch}
tables:
  public.users:
    undeclared: keep
    columns:
      email: hash
    where: \"{users_where}\"
  public.orders:
    undeclared: keep
    columns:
      note: {{redact: x}}
"
        )
    };
    let big_orders = "id IN (SELECT o.user_id FROM public.orders o WHERE o.total > 300)";
    let run = |rules: String| {
        let files = Files::new(&rules);
        let dir = tempfile::tempdir().unwrap();
        let args = ["--table", "public.orders", "--key-prefix", "seed/"];
        let (code, err, _) = export(
            &db.dsn,
            "public.users",
            dir.path(),
            &args,
            Some(&files),
            "info",
        );
        (code, err, dir)
    };

    let (code, err, dir) = run(rules("subqueries: true", big_orders));
    assert_eq!(code, 0, "{err}");
    let (_, users) = rows(local(&dir.path().join("store")), "seed/public.users/").await;
    let exported: BTreeSet<i64> = users.iter().map(|u| u["id"].as_i64().unwrap()).collect();
    let expected: BTreeSet<i64> = db
        .client
        .query("SELECT DISTINCT user_id FROM orders WHERE total > 300", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(exported, expected);
    assert!(expected.len() > 10 && (expected.len() as i64) < USERS);

    for (switch, predicate, refused) in [
        (
            "",
            big_orders,
            "a subquery (SELECT …) is not allowed in a row filter (subqueries into tables the \
             same export exports need `subqueries: true`",
        ),
        (
            "subqueries: true",
            "id IN (SELECT s.user_id FROM public.secrets s)",
            "a subquery into public.secrets is not allowed in a row filter (subqueries read only \
             tables this export also exports: public.orders, public.users)",
        ),
        (
            "subqueries: true",
            "EXISTS (SELECT 1 FROM public.orders o WHERE o.user_id = users.id AND o.note LIKE 'x%')",
            "column o.note is not allowed in a row filter (a subquery reads only columns that \
             this export exports unmasked, and public.orders masks note)",
        ),
    ] {
        let (code, err, dir) = run(rules(switch, predicate));
        assert_eq!(code, 2, "{predicate}: {err}");
        assert!(err.contains(refused), "{predicate}: {err}");
        assert!(nothing_written(dir.path()), "{predicate}");
    }
}
