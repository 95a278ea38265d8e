//! `larch export --split N`: one table read in N ctid ranges at once from one exported
//! snapshot, joined into the epoch's ONE snapshot object, against a real PostgreSQL 15 and
//! SeaweedFS (S3 multipart parts).

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use larch::archive::format::Format;
use larch::archive::reader::ArchiveReader;
use larch::archive::store::Store;
use larch::archive::store::local::LocalStore;
use serde_json::Value;

use crate::support::postgres::{Database, new_database};
use crate::support::seaweedfs::seaweedfs;

/// Rows of the big table: about 45 MB of JSONL, so every range of a split into 1, 2 or 4
/// holds at least one full 8 MiB S3 part and the joined object has parts from each range.
pub(crate) const BIG_ROWS: i64 = 160_000;

pub(crate) fn larch(dsn: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_larch"));
    c.env("LARCH_PG_DSN", dsn)
        .env("AWS_ACCESS_KEY_ID", "larch-test-key")
        .env("AWS_SECRET_ACCESS_KEY", "larch-test-secret");
    c
}

pub(crate) fn run(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.output().expect("running larch");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `events (id, n, body)` with `rows` rows of about 280 bytes each.
pub(crate) async fn events(db: &Database, rows: i64) {
    db.client
        .batch_execute(&format!(
            "CREATE TABLE events (id int8 PRIMARY KEY, n int8 NOT NULL, body text NOT NULL);
             INSERT INTO events SELECT g, g % 97, repeat(md5(g::text), 7) || g
               FROM generate_series(1, {rows}) g;
             ANALYZE events;"
        ))
        .await
        .unwrap();
}

pub(crate) type Rows = Vec<(i64, i64, String)>;

pub(crate) async fn table_rows(db: &Database) -> Rows {
    db.client
        .query("SELECT id, n, body FROM events ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

/// The rows of the archive's head, read back with larch's reader in `format`, sorted by id.
pub(crate) async fn archive_rows(store: Arc<dyn Store>, key_prefix: &str, format: Format) -> Rows {
    let reader = ArchiveReader::new(store, key_prefix, vec![format]).unwrap();
    let (_, folded) = reader.reconstruct_at(None, &[]).await.unwrap();
    let mut rows: Rows = folded
        .rows
        .values()
        .map(|r| {
            let v: Value = serde_json::from_str(r.as_str()).unwrap();
            let int = |k: &str| {
                v[k].as_str()
                    .map_or_else(|| v[k].as_i64().unwrap(), |s| s.parse().unwrap())
            };
            (int("id"), int("n"), v["body"].as_str().unwrap().to_string())
        })
        .collect();
    rows.sort();
    rows
}

/// The store flags of a local archive at `dir` or an S3 one in `bucket`.
pub(crate) fn store_args(local: Option<&Path>, bucket: &str) -> Vec<String> {
    match local {
        Some(dir) => vec!["--path".into(), dir.display().to_string()],
        None => [
            "--store",
            "s3",
            "--bucket",
            bucket,
            "--endpoint",
            seaweedfs().endpoint(),
            "--region",
            "us-east-1",
        ]
        .map(String::from)
        .to_vec(),
    }
}

fn export(db: &Database, store: &[String], prefix: &str, extra: &[&str]) -> (i32, String, String) {
    // Slot names are per cluster: one per test database.
    let slot = format!("split_{}", db.name);
    run(larch(&db.dsn)
        .args([
            "export",
            "--table",
            "events",
            "--key-prefix",
            prefix,
            "--slot",
            &slot,
        ])
        .args(store)
        .args(extra))
}

/// The objects (and part files, for a local store) under `prefix`, and the multipart uploads
/// in progress (S3).
pub(crate) async fn leftovers(
    local: Option<&Path>,
    bucket: &str,
    prefix: &str,
) -> (Vec<String>, usize) {
    match local {
        Some(dir) => {
            let mut found = Vec::new();
            let mut stack = vec![dir.join(prefix)];
            while let Some(d) = stack.pop() {
                for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                    if e.path().is_dir() {
                        stack.push(e.path());
                    } else if !e.file_name().to_string_lossy().ends_with(".json.lock") {
                        // (the manifest's compare-and-swap lock is no object)
                        found.push(e.path().strip_prefix(dir).unwrap().display().to_string());
                    }
                }
            }
            found.sort();
            (found, 0)
        }
        None => {
            let store = seaweedfs().s3_store(bucket, "").await;
            let objects = store.list(prefix).await.unwrap();
            let uploads = store
                .client()
                .list_multipart_uploads()
                .bucket(bucket)
                .send()
                .await
                .unwrap()
                .uploads()
                .len();
            (objects.into_iter().map(|o| o.key).collect(), uploads)
        }
    }
}

/// The number of parts of an S3 object written by a multipart upload (its ETag's `-N`).
pub(crate) async fn multipart_parts(bucket: &str, key: &str) -> u32 {
    let store = seaweedfs().s3_store(bucket, "").await;
    let head = store
        .client()
        .head_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .unwrap();
    let etag = head
        .e_tag()
        .unwrap_or_default()
        .trim_matches('"')
        .to_string();
    etag.rsplit_once('-').map_or(1, |(_, n)| n.parse().unwrap())
}

pub(crate) async fn store_of(local: Option<&Path>, bucket: &str) -> Arc<dyn Store> {
    match local {
        Some(dir) => Arc::new(LocalStore::new(dir).unwrap()),
        None => Arc::new(seaweedfs().s3_store(bucket, "").await),
    }
}

/// At N = 1, 2 and 4, on a local store and on S3: the archive holds exactly the table, in one
/// snapshot object per format (JSONL and zstd-compressed JSONL, whose parts are concatenated
/// frames), and `larch archive verify` (records, size and SHA-256 of the whole object) passes.
#[tokio::test]
async fn split_exports_equal_the_table_in_one_object_on_local_and_s3() {
    let db = new_database().await;
    events(&db, BIG_ROWS).await;
    let want = table_rows(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let bucket = seaweedfs().new_bucket().await;
    for local in [Some(dir.path()), None] {
        let store_flags = store_args(local, &bucket);
        for n in [1, 2, 4] {
            let prefix = format!("split{n}/");
            let split = n.to_string();
            let (code, out, err) = export(
                &db,
                &store_flags,
                &prefix,
                &["--split", &split, "--format", "jsonl,jsonl+zstd"],
            );
            assert_eq!(code, 0, "N={n} local={}: {err}", local.is_some());
            let summary: Value = serde_json::from_str(&out).unwrap();
            assert_eq!(summary["row_count"], BIG_ROWS, "{summary}");
            assert_eq!(summary["epoch"], 1, "{summary}");
            let store = store_of(local, &bucket).await;
            for format in [Format::Jsonl, Format::JsonlZstd] {
                let got = archive_rows(store.clone(), &prefix, format).await;
                assert!(
                    got == want,
                    "N={n} {format}: the archive differs from the table"
                );
            }
            let (objects, uploads) = leftovers(local, &bucket, &prefix).await;
            let snapshots: Vec<&String> = objects
                .iter()
                .filter(|k| k.contains("/snapshot-"))
                .collect();
            assert_eq!(snapshots.len(), 2, "one object per format: {objects:?}");
            assert_eq!(
                objects.len(),
                3,
                "the snapshot objects and the manifest: {objects:?}"
            );
            assert_eq!(uploads, 0, "no multipart upload left open");
            if local.is_none() {
                let key = snapshots.iter().find(|k| k.ends_with(".jsonl")).unwrap();
                assert!(
                    multipart_parts(&bucket, key).await >= 2,
                    "{key} is joined from parts"
                );
            }
            let (code, out, err) = run(larch(&db.dsn)
                .args(["archive", "verify", "--key-prefix", &prefix])
                .args(&store_flags));
            assert_eq!(code, 0, "verify N={n}: {out}{err}");
            assert!(out.starts_with("ok: "), "{out}");
        }
    }
}

/// Writes committed while a split export runs are not in its snapshot: every transaction
/// inserts the next id (its rows go to the table's last pages, the last range) and sets
/// `n` of row 1 (the first page, the first range) to that id, so one snapshot holds ids
/// 1..=K with row 1's `n` = K; ranges read at different moments would disagree.
#[tokio::test]
async fn a_split_export_reads_every_range_from_one_snapshot() {
    let db = new_database().await;
    events(&db, 40_000).await;
    let stop = Arc::new(AtomicBool::new(false));
    let last = Arc::new(AtomicI64::new(40_000));
    let writer = {
        let (dsn, stop, last) = (db.dsn.clone(), stop.clone(), last.clone());
        tokio::spawn(async move {
            let (client, conn) = tokio_postgres::connect(&dsn, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            while !stop.load(Ordering::Relaxed) {
                let id = last.load(Ordering::Relaxed) + 1;
                client
                    .batch_execute(&format!(
                        "BEGIN; INSERT INTO events VALUES ({id}, 0, 'new');
                         UPDATE events SET n = {id} WHERE id = 1; COMMIT;"
                    ))
                    .await
                    .unwrap();
                last.store(id, Ordering::Relaxed);
            }
        })
    };
    // Let the writer run before and during the export.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let dir = tempfile::tempdir().unwrap();
    let flags = store_args(Some(dir.path()), "");
    let (code, out, err) = export(&db, &flags, "events/", &["--split", "4"]);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    assert_eq!(code, 0, "{err}");
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()).unwrap());
    let rows = archive_rows(store, "events/", Format::Jsonl).await;
    let max = rows.last().unwrap().0;
    assert!(max > 40_000, "the writer committed before the snapshot");
    assert!(
        max < last.load(Ordering::Relaxed),
        "rows committed after the snapshot are not in it"
    );
    let summary: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(summary["row_count"], rows.len(), "no row read twice");
    let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
    assert_eq!(ids, (1..=max).collect::<Vec<_>>(), "ids 1..=K, no gap");
    assert_eq!(
        rows[0].1, max,
        "row 1 (first range) agrees with the last range"
    );
}

/// A range failing half-way (a row filter that divides by zero at one id, in the last range,
/// after the other ranges have streamed parts) fails the export: the archive keeps the epoch
/// it had, no part file stays next to it and no multipart upload stays open.
#[tokio::test]
async fn a_failed_range_leaves_no_epoch_and_no_parts() {
    let db = new_database().await;
    events(&db, BIG_ROWS).await;
    let dir = tempfile::tempdir().unwrap();
    let bucket = seaweedfs().new_bucket().await;
    for local in [Some(dir.path()), None] {
        let flags = store_args(local, &bucket);
        let (code, _, err) = export(&db, &flags, "events/", &[]);
        assert_eq!(code, 0, "{err}");
        let before = leftovers(local, &bucket, "events/").await;
        let bad = format!("1 / (id - {}) <> 0", BIG_ROWS - 10);
        let (code, _, err) = export(&db, &flags, "events/", &["--split", "4", "--where", &bad]);
        assert_ne!(code, 0, "the division by zero fails the export");
        assert!(err.contains("22012") || err.contains("division"), "{err}");
        let after = leftovers(local, &bucket, "events/").await;
        assert_eq!(after, before, "nothing of the failed epoch stays");
        let store = store_of(local, &bucket).await;
        let manifest = store.get("events/manifest.json").await.unwrap().unwrap();
        let m: Value = serde_json::from_slice(&manifest.bytes).unwrap();
        assert_eq!(m["epoch"], 1, "the archive keeps its epoch");
    }
}

/// `--split` cuts one table's one-shot export: several tables or `--follow` are refused
/// before anything connects.
#[test]
fn split_is_refused_where_it_does_not_apply() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().display().to_string();
    let nowhere = "postgres://nobody@127.0.0.1:1/none";
    let (code, _, err) = run(larch(nowhere).args([
        "export", "--table", "a", "--table", "b", "--split", "2", "--path", &path,
    ]));
    assert_ne!(code, 0);
    assert!(err.contains("--split 2 applies to one table"), "{err}");
    let (code, _, err) = run(larch(nowhere).args([
        "export", "--table", "a", "--split", "2", "--follow", "--path", &path,
    ]));
    assert_ne!(code, 0);
    assert!(err.contains("not --follow"), "{err}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// A range whose backend is terminated mid-copy (`pg_terminate_backend`, as a failover or an
/// administrator would) is copied again from its start while the snapshot is held: the export
/// succeeds, and the archive holds exactly the table (the rows the killed attempt had sent are
/// not kept), on a local store and on S3.
#[cfg(feature = "crashpoints")]
#[tokio::test]
async fn a_range_whose_backend_is_terminated_is_copied_again() {
    let db = new_database().await;
    events(&db, BIG_ROWS).await;
    let want = table_rows(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let bucket = seaweedfs().new_bucket().await;
    for local in [Some(dir.path()), None] {
        let flags = store_args(local, &bucket);
        let prefix = format!("retry-{}/", local.is_some());
        let slot = format!("split_{}", db.name);
        // A range's rows stop flowing for 5 s once 10 000 rows are copied: its COPY is in
        // flight meanwhile.
        let child = larch(&db.dsn)
            .args([
                "export",
                "--table",
                "events",
                "--key-prefix",
                &prefix,
                "--slot",
                &slot,
            ])
            .args(["--split", "4", "--format", "jsonl,jsonl+zstd"])
            .args(&flags)
            .env("LARCH_PAUSE_AT", "export.baseline-rows=5000")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let killed = db
                .client
                .query(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE datname = current_database() AND pid <> pg_backend_pid() \
                       AND state = 'active' AND query ILIKE 'COPY%ctid%' LIMIT 1",
                    &[],
                )
                .await
                .unwrap();
            if killed.first().is_some_and(|r| r.get::<_, bool>(0)) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no range's COPY to terminate"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "the export survives the terminated range: {err}"
        );
        assert!(err.contains("copying the range again"), "{err}");
        let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(summary["row_count"], BIG_ROWS, "{summary}");
        let store = store_of(local, &bucket).await;
        for format in [Format::Jsonl, Format::JsonlZstd] {
            let got = archive_rows(store.clone(), &prefix, format).await;
            assert!(got == want, "{format}: the archive differs from the table");
        }
        let (_, uploads) = leftovers(local, &bucket, &prefix).await;
        assert_eq!(uploads, 0, "no multipart upload left open");
    }
}
