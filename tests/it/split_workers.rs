//! `larch export --split N --split-workers M` and `larch export split-worker`: a split export
//! whose ranges separate worker processes copy, coordinated through the archive's store, on a
//! real PostgreSQL 15 and SeaweedFS (S3) and on a local store; killed workers and coordinators
//! resume (the kill tests need `--features crashpoints`).

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use larch::archive::format::Format;
use larch::archive::split_run;
use larch::archive::store::Store;
use serde_json::Value;

use crate::split_export::{
    BIG_ROWS, archive_rows, events, larch, leftovers, multipart_parts, run, store_args, store_of,
    table_rows,
};
use crate::support::postgres::{Database, new_database};
use crate::support::seaweedfs::seaweedfs;

const FORMATS: &str = "jsonl,jsonl+zstd";

/// The coordinator: `larch export --split N --split-workers M` in the background.
fn coordinator(db: &Database, store: &[String], prefix: &str, n: u16, m: u16) -> Child {
    coordinator_with(db, store, prefix, (n, m), &[])
}

/// The coordinator with `extra` flags.
fn coordinator_with(
    db: &Database,
    store: &[String],
    prefix: &str,
    (n, m): (u16, u16),
    extra: &[&str],
) -> Child {
    let slot = format!("splitw_{}", db.name);
    larch(&db.dsn)
        .args([
            "export",
            "--table",
            "events",
            "--key-prefix",
            prefix,
            "--slot",
            &slot,
        ])
        .args(["--format", FORMATS, "--split", &n.to_string()])
        .args(["--split-workers", &m.to_string()])
        .args(extra)
        .args(store)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the coordinator")
}

/// Worker `index` with the coordinator's flags, `env` added (a crash point).
fn worker(
    db: &Database,
    store: &[String],
    prefix: &str,
    index: u16,
    env: &[(&str, &str)],
) -> Child {
    larch(&db.dsn)
        .args([
            "export",
            "split-worker",
            "--table",
            "events",
            "--key-prefix",
            prefix,
        ])
        .args(["--format", FORMATS, "--plan-wait", "2m"])
        .args(store)
        .env("JOB_COMPLETION_INDEX", index.to_string())
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting a worker")
}

/// Waits for a process: its exit code (None: killed by a signal), stdout, stderr.
fn finish(child: Child) -> (Option<i32>, String, String) {
    finish_all(vec![child]).remove(0)
}

/// Waits for every process (at most five minutes: then all are killed and the test fails
/// with what they printed), so one that fails early cannot leave the test waiting on another
/// that waits for it.
fn finish_all(mut children: Vec<Child>) -> Vec<(Option<i32>, String, String)> {
    let deadline = Instant::now() + Duration::from_secs(300);
    while children.iter_mut().any(|c| c.try_wait().unwrap().is_none()) {
        if Instant::now() > deadline {
            for c in &mut children {
                let _ = c.kill();
            }
            let outs: Vec<String> = children.into_iter().map(|c| output(c).2).collect();
            panic!("larch processes still running after 5 minutes: {outs:#?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    children.into_iter().map(output).collect()
}

fn output(child: Child) -> (Option<i32>, String, String) {
    let out = child.wait_with_output().expect("waiting for larch");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The archive's head holds exactly the table (no row lost or twice) in both formats, one
/// snapshot object per format and nothing of the split run is left; `larch archive verify`
/// passes.
async fn check_archive(db: &Database, local: Option<&Path>, bucket: &str, prefix: &str) {
    let want = table_rows(db).await;
    let store = store_of(local, bucket).await;
    for format in [Format::Jsonl, Format::JsonlZstd] {
        let got = archive_rows(store.clone(), prefix, format).await;
        assert_eq!(got.len(), want.len(), "{format}: the row count");
        assert!(got == want, "{format}: the archive differs from the table");
    }
    let (objects, uploads) = leftovers(local, bucket, prefix).await;
    assert!(
        objects.iter().all(|k| !k.contains("/split/")),
        "nothing of the split run stays: {objects:?}"
    );
    let head: Value = serde_json::from_slice(
        &store
            .get(&format!("{prefix}manifest.json"))
            .await
            .unwrap()
            .unwrap()
            .bytes,
    )
    .unwrap();
    let epoch = head["epoch"].as_i64().unwrap();
    let snapshots: Vec<&String> = objects
        .iter()
        .filter(|k| k.contains(&format!("epoch={epoch}/snapshot-")))
        .collect();
    assert_eq!(snapshots.len(), 2, "one object per format: {objects:?}");
    assert_eq!(uploads, 0, "no multipart upload left open");
    let (code, out, err) = run(larch(&db.dsn)
        .args(["archive", "verify", "--key-prefix", prefix])
        .args(store_args(local, bucket)));
    assert_eq!(code, 0, "verify: {out}{err}");
    assert!(out.starts_with("ok: "), "{out}");
}

/// A coordinator and its workers on a local store (4 ranges, 3 workers: worker 0 copies
/// ranges 0 and 3) and on S3 (2 ranges of about 22 MB each: every worker uploads full parts
/// of its own into the one multipart upload; and 4 ranges, 3 workers): the archive equals the
/// table in one object per format. One worker reads the coordinator's request file
/// (`--request FILE`) instead of flags.
#[tokio::test]
async fn workers_copy_the_ranges_and_the_coordinator_commits_one_object() {
    let db = new_database().await;
    events(&db, BIG_ROWS).await;
    let dir = tempfile::tempdir().unwrap();
    let bucket = seaweedfs().new_bucket().await;
    for (local, n, m) in [(Some(dir.path()), 4, 3), (None, 2, 2), (None, 4, 3)] {
        let store = store_args(local, &bucket);
        let prefix = format!("w{n}x{m}/");
        let mut all = vec![coordinator(&db, &store, &prefix, n, m)];
        all.extend((0..m - 1).map(|i| worker(&db, &store, &prefix, i, &[])));
        all.push(request_worker(&db, &store, &prefix, n, m, dir.path()));
        let mut ended = finish_all(all);
        let (code, out, err) = ended.remove(0);
        assert_eq!(code, Some(0), "coordinator: {err}");
        let summary: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(summary["row_count"], BIG_ROWS, "{summary}");
        let mut copied = Vec::new();
        for (i, (code, out, err)) in ended.into_iter().enumerate() {
            assert_eq!(code, Some(0), "worker {i}: {err}");
            let summary: Value = serde_json::from_str(&out).unwrap();
            assert_eq!(summary["worker"], i, "{summary}");
            copied.extend(
                summary["ranges_copied"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| r.as_u64().unwrap()),
            );
        }
        copied.sort_unstable();
        assert_eq!(
            copied,
            (0..u64::from(n)).collect::<Vec<_>>(),
            "each range copied once"
        );
        check_archive(&db, local, &bucket, &prefix).await;
        if local.is_none() && n == 2 {
            let key = format!("{prefix}epoch=1/");
            let s3 = store_of(None, &bucket).await;
            let object = s3
                .list(&key)
                .await
                .unwrap()
                .into_iter()
                .find(|o| o.key.ends_with(".jsonl"))
                .unwrap();
            assert!(
                multipart_parts(&bucket, &object.key).await >= 4,
                "parts of both workers"
            );
        }
    }
}

/// The last worker, given the coordinator's request as a file (`--request FILE`).
fn request_worker(
    db: &Database,
    store: &[String],
    prefix: &str,
    n: u16,
    m: u16,
    dir: &Path,
) -> Child {
    let mut spec = serde_json::json!({"type": "local", "path": dir});
    if store.contains(&"s3".to_string()) {
        spec = serde_json::json!({"type": "s3", "bucket": store[3], "endpoint": seaweedfs().endpoint(), "region": "us-east-1", "path_style": true});
    }
    let request = serde_json::json!({
        "tables": ["events"], "store": spec, "keyPrefix": prefix, "split": n, "splitWorkers": m,
        "formats": ["jsonl", "jsonl+zstd"], "slot": format!("splitw_{}", db.name),
    });
    let file = dir.join(format!("request-{}.json", prefix.trim_end_matches('/')));
    std::fs::write(&file, request.to_string()).unwrap();
    larch(&db.dsn)
        .args([
            "export",
            "split-worker",
            "--index",
            &(m - 1).to_string(),
            "--plan-wait",
            "2m",
            "--request",
        ])
        .arg(&file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting a worker")
}

/// Polls `what` until it holds (at most a minute).
async fn until<F: std::future::Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A worker SIGKILLed half-way through a range (after it uploaded a part, S3; after a chunk
/// of its range object, local) and one killed right after a checkpoint are started again:
/// the first copies its range again (the parts it uploaded before are replaced or never
/// completed), the second skips its checkpointed range. Nothing is lost or duplicated.
#[cfg(feature = "crashpoints")]
#[tokio::test]
async fn killed_workers_resume_from_their_checkpoints() {
    let db = new_database().await;
    events(&db, BIG_ROWS).await;
    let dir = tempfile::tempdir().unwrap();
    let bucket = seaweedfs().new_bucket().await;
    for (local, n) in [(Some(dir.path()), 4u16), (None, 2)] {
        let store = store_args(local, &bucket);
        let prefix = format!("kill{n}/");
        let c = coordinator(&db, &store, &prefix, n, 2);
        let mid_range = [("LARCH_CRASH_AT", "split.after-part@1")];
        let after_checkpoint = [("LARCH_CRASH_AT", "split.after-checkpoint@1")];
        let killed = finish_all(vec![
            worker(&db, &store, &prefix, 0, &mid_range),
            worker(&db, &store, &prefix, 1, &after_checkpoint),
        ]);
        let (code0, _, err0) = &killed[0];
        assert_eq!(*code0, None, "worker 0 killed mid-range: {err0}");
        assert!(err0.contains("LARCH_CRASH_AT: killing"), "{err0}");
        let (code1, _, err1) = &killed[1];
        assert_eq!(*code1, None, "worker 1 killed after its checkpoint: {err1}");
        let mut ended = finish_all(vec![
            c,
            worker(&db, &store, &prefix, 0, &[]),
            worker(&db, &store, &prefix, 1, &[]),
        ]);
        let (code, out, err) = ended.remove(0);
        let (code0, out0, err0) = ended.remove(0);
        assert_eq!(code0, Some(0), "{err0}");
        let (code1, out1, err1) = ended.remove(0);
        assert_eq!(code1, Some(0), "{err1}");
        let s0: Value = serde_json::from_str(&out0).unwrap();
        let s1: Value = serde_json::from_str(&out1).unwrap();
        assert_eq!(s0["ranges_copied"][0], 0, "range 0 copied again: {s0}");
        let skipped: Vec<Value> = s1["ranges_copied"].as_array().unwrap().clone();
        assert!(
            !skipped.contains(&Value::from(1)),
            "range 1 was checkpointed: {s1}"
        );
        assert_eq!(code, Some(0), "coordinator: {err}");
        let summary: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(summary["row_count"], BIG_ROWS, "{summary}");
        check_archive(&db, local, &bucket, &prefix).await;
    }
}

/// The uploads in progress under `prefix` (S3).
async fn uploads_under(bucket: &str, prefix: &str) -> Vec<String> {
    let store = seaweedfs().s3_store(bucket, "").await;
    let shared = store.shared_uploads().unwrap();
    let found = shared.in_progress(prefix).await.unwrap();
    found.into_iter().map(|u| u.upload_id).collect()
}

/// The coordinator SIGKILLed while its workers copy, then started again: the workers find its
/// snapshot gone and copy the new run's ranges; the old run's upload is aborted and its
/// checkpoints deleted; the epoch after is clean. Then a coordinator killed for good: `larch
/// archive gc` keeps its plan while a writer may run, and with --include-listed-epochs
/// removes the plan, its objects and its upload.
#[tokio::test]
async fn a_restarted_coordinator_starts_a_clean_run_and_gc_removes_a_dead_one() {
    let db = new_database().await;
    events(&db, BIG_ROWS).await;
    let bucket = seaweedfs().new_bucket().await;
    let store = store_args(None, &bucket);
    let prefix = "restart/";
    let (code, _, err) = run(larch(&db.dsn)
        .args([
            "export",
            "--table",
            "events",
            "--key-prefix",
            prefix,
            "--format",
            FORMATS,
        ])
        .args(["--slot", &format!("splitw_{}", db.name)])
        .args(&store));
    assert_eq!(code, 0, "epoch 1: {err}");
    let s3 = store_of(None, &bucket).await;
    let mut first = coordinator(&db, &store, prefix, 4, 2);
    until("the plan is written", || async {
        s3.get(&split_run::plan_key(prefix))
            .await
            .unwrap()
            .is_some()
    })
    .await;
    let (old, _) = split_run::read_plan(s3.as_ref(), prefix)
        .await
        .unwrap()
        .unwrap();
    let workers: Vec<Child> = (0..2)
        .map(|i| worker(&db, &store, prefix, i, &[]))
        .collect();
    until("a range is checkpointed", || async {
        !split_run::checkpointed(s3.as_ref(), prefix, &old)
            .await
            .unwrap()
            .is_empty()
    })
    .await;
    first.kill().unwrap();
    let _ = first.wait();
    let mut all = vec![coordinator(&db, &store, prefix, 4, 2)];
    all.extend(workers);
    let mut ended = finish_all(all);
    let (code, out, err) = ended.remove(0);
    for (code, out, err) in ended {
        assert_eq!(code, Some(0), "worker: {err}");
        let s: Value = serde_json::from_str(&out).unwrap();
        assert_ne!(
            s["run"],
            old.run_id.as_str(),
            "the worker served the new run: {s}"
        );
    }
    assert_eq!(code, Some(0), "the second coordinator: {err}");
    let summary: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(summary["epoch"], 2, "{summary}");
    check_archive(&db, None, &bucket, prefix).await;
    assert!(
        uploads_under(&bucket, prefix).await.is_empty(),
        "the old upload is aborted"
    );
    assert!(
        s3.list(&format!("{prefix}split/"))
            .await
            .unwrap()
            .is_empty()
    );

    // A coordinator killed for good, no worker: its plan and upload stay until gc.
    let mut dead = coordinator(&db, &store, prefix, 4, 2);
    until("the plan is written", || async {
        s3.get(&split_run::plan_key(prefix))
            .await
            .unwrap()
            .is_some()
    })
    .await;
    dead.kill().unwrap();
    let _ = dead.wait();
    assert_eq!(
        uploads_under(&bucket, prefix).await.len(),
        2,
        "one upload per format"
    );
    let gc = |extra: &[&str]| {
        run(larch(&db.dsn)
            .args([
                "archive",
                "gc",
                "--key-prefix",
                prefix,
                "--delete",
                "-o",
                "json",
            ])
            .args(extra)
            .args(&store))
    };
    let (code, out, err) = gc(&[]);
    assert_eq!(code, 0, "{err}");
    let result: Value = serde_json::from_str(&out).unwrap();
    assert!(
        result["split"]["live_run"].is_string(),
        "the plan may be live: {result}"
    );
    assert_eq!(
        uploads_under(&bucket, prefix).await.len(),
        2,
        "a live plan's uploads are kept"
    );
    let (code, out, err) = gc(&["--include-listed-epochs"]);
    assert_eq!(code, 0, "{err}");
    let result: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        result["split"]["uploads"].as_array().unwrap().len(),
        2,
        "{result}"
    );
    assert!(
        uploads_under(&bucket, prefix).await.is_empty(),
        "gc aborted the dead run's uploads"
    );
    assert!(
        s3.list(&format!("{prefix}split/"))
            .await
            .unwrap()
            .is_empty(),
        "gc removed the plan"
    );
    let (code, out, err) = run(larch(&db.dsn)
        .args(["archive", "verify", "--key-prefix", prefix])
        .args(&store));
    assert_eq!(code, 0, "verify: {out}{err}");
}

/// `--split-workers` without `--split` and a worker index past the coordinator's workers are
/// refused (exit 2) naming what is wrong.
/// A worker that never comes (its pod unschedulable, say) does not keep the exported snapshot,
/// and with it the primary's vacuum horizon, until --snapshot-max-age: the coordinator fails
/// the run once --split-workers-start-timeout has passed without it, naming it: no epoch, the
/// plan deleted, the run's uploads aborted.
#[tokio::test]
async fn a_worker_that_never_starts_fails_the_run_at_its_start_timeout() {
    let db = new_database().await;
    events(&db, BIG_ROWS).await;
    let bucket = seaweedfs().new_bucket().await;
    let store = store_args(None, &bucket);
    let prefix = "absent/";
    // Worker 0 waits for the plan first, so it has started well within the timeout.
    let mut present = worker(&db, &store, prefix, 0, &[]);
    let started = Instant::now();
    let coordinator = coordinator_with(
        &db,
        &store,
        prefix,
        (4, 2),
        &["--split-workers-start-timeout", "8s"],
    );
    let (code, _, err) = finish(coordinator);
    let took = started.elapsed();
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("split worker 1 (of 2) did not start within 8s"),
        "names the absent worker and the timeout: {err}"
    );
    assert!(
        took < Duration::from_secs(120),
        "failed at the timeout: {took:?}"
    );
    let s3 = store_of(None, &bucket).await;
    assert!(
        s3.get(&split_run::plan_key(prefix))
            .await
            .unwrap()
            .is_none(),
        "the plan is deleted"
    );
    assert!(
        s3.get(&format!("{prefix}manifest.json"))
            .await
            .unwrap()
            .is_none(),
        "no epoch committed"
    );
    until("the run's uploads are aborted", || async {
        uploads_under(&bucket, prefix).await.is_empty()
    })
    .await;
    // (What worker 0 may still store for the discarded run, `larch archive gc` removes.)
    let _ = present.kill();
    let _ = present.wait();
}

#[tokio::test]
async fn bad_split_worker_input_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().display().to_string();
    let nowhere = "postgres://nobody@127.0.0.1:1/none";
    let (code, _, err) = run(larch(nowhere).args([
        "export",
        "--table",
        "a",
        "--split-workers",
        "2",
        "--path",
        &path,
    ]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--split"), "{err}");
    let (code, _, err) = run(larch(nowhere).args([
        "export",
        "--table",
        "a",
        "--split",
        "2",
        "--split-workers",
        "2",
        "--split-workers-start-timeout",
        "soon",
        "--path",
        &path,
    ]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--split-workers-start-timeout"), "{err}");
    let db = new_database().await;
    events(&db, 1_000).await;
    let store = store_args(Some(dir.path()), "");
    let c = coordinator(&db, &store, "bad/", 2, 1);
    let (code, _, err) = finish(worker(&db, &store, "bad/", 1, &[]));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("worker index 1 is out of range"), "{err}");
    for (code, _, err) in finish_all(vec![c, worker(&db, &store, "bad/", 0, &[])]) {
        assert_eq!(code, Some(0), "{err}");
    }
}
