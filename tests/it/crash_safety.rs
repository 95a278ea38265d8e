//! Crash safety against real PostgreSQL 15 (W10, C3): a continuous export killed with SIGKILL at
//! random points and at the exact windows between an upload and its manifest swap and between a
//! swap and the deletion of pruned objects, over many scripted trials; an engine killed between
//! its database commit and its state-file write.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use larch::archive::manifest::{ArtifactKind, Manifest, artifact_key, manifest_key};
use larch::archive::model::Action;
use larch::archive::orphans::{Unreferenced, find_unreferenced};
use larch::archive::store::Store;
use larch::archive::store::local::LocalStore;
use rand::Rng;
use serde_json::Value;

use crate::archive_build::TestArchive;
use crate::engine_support::eventually;
use crate::postgres_continuous::{Follow, archive_rows, read_archive, setup, table_rows};
use crate::support::postgres::{Database, new_database};

const PREFIX: &str = "public.items/";

fn manifest(dir: &Path) -> Manifest {
    let key = manifest_key(PREFIX);
    Manifest::from_slice(&key, &std::fs::read(dir.join(&key)).unwrap()).unwrap()
}

fn jsonl(dir: &Path, key: &str) -> Vec<Value> {
    std::fs::read_to_string(dir.join(key))
        .unwrap_or_else(|e| panic!("{key}: {e}"))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Checks the current epoch from the object files (an oracle independent of the reader) for
/// changes a crash made appear twice. The workload inserts each id once and updates each row
/// at most once, and a diff keeps the last write per row (an INSERT then UPDATE becomes one
/// UPDATE). So an INSERT of a row already present, or a second UPDATE of a row (or an UPDATE
/// of a row the snapshot already has updated), can only be a replayed change.
fn check_exactly_once(dir: &Path) -> usize {
    let m = manifest(dir);
    let epoch: Vec<_> = m.artifacts.iter().filter(|a| a.epoch == m.epoch).collect();
    let snapshot = epoch
        .iter()
        .find(|a| a.kind == ArtifactKind::Snapshot)
        .expect("the current epoch has a snapshot");
    let rows = jsonl(dir, &artifact_key(PREFIX, snapshot, ".jsonl"));
    let mut present: BTreeSet<i64> = rows.iter().map(|r| r["id"].as_i64().unwrap()).collect();
    let mut updated: BTreeSet<i64> = rows
        .iter()
        .filter(|r| r["name"].as_str().is_some_and(|n| n.starts_with('u')))
        .map(|r| r["id"].as_i64().unwrap())
        .collect();
    let mut changes = 0;
    for d in epoch.iter().filter(|a| a.kind == ArtifactKind::Diff) {
        let key = artifact_key(PREFIX, d, ".jsonl");
        for c in jsonl(dir, &key) {
            let row = if c["new"].is_object() {
                &c["new"]
            } else {
                &c["old"]
            };
            let id = row["id"]
                .as_i64()
                .unwrap_or_else(|| panic!("{key}: no id in {c}"));
            changes += 1;
            let once = match c["action"].as_str().unwrap() {
                "INSERT" => present.insert(id),
                "UPDATE" => {
                    present.insert(id);
                    !row["name"].as_str().is_some_and(|n| n.starts_with('u')) || updated.insert(id)
                }
                "DELETE" => {
                    present.remove(&id);
                    true
                }
                other => panic!("{key}: unexpected {other}"),
            };
            if !once {
                panic!(
                    "{key}: {} of {id} applied twice\nmanifest: {}\nobjects with it:\n{}",
                    c["action"],
                    String::from_utf8_lossy(&m.to_json()),
                    grep_objects(dir, id)
                );
            }
        }
    }
    changes
}

/// Every line of every object under the prefix that mentions `"id":<id>` (failure context).
fn grep_objects(dir: &Path, id: i64) -> String {
    let needle = format!("\"id\":{id}");
    let mut out = String::new();
    let mut stack = vec![dir.join(PREFIX)];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(text) = std::fs::read_to_string(&p) {
                for l in text.lines().filter(|l| l.contains(&needle)) {
                    out += &format!("{}: {l}\n", p.display());
                }
            }
        }
    }
    out
}

async fn unreferenced(dir: &Path) -> Vec<larch::archive::orphans::UnreferencedObject> {
    let store = LocalStore::new(dir).unwrap();
    find_unreferenced(&store, PREFIX, &manifest(dir), Duration::ZERO)
        .await
        .unwrap()
}

/// Transactions until `stop`: insert a fresh id, update an older one, now and then delete one.
async fn workload(dsn: String, stop: Arc<AtomicBool>, next: Arc<AtomicI64>) {
    let (client, conn) = tokio_postgres::connect(&dsn, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    while !stop.load(Ordering::Relaxed) {
        let id = next.fetch_add(1, Ordering::Relaxed);
        let mut sql = format!(
            "BEGIN; INSERT INTO items VALUES ({id}, 'w{id}', NULL); \
             UPDATE items SET name = 'u{id}' WHERE id = {};",
            id - 37
        );
        if id % 5 == 0 {
            sql += &format!("DELETE FROM items WHERE id = {};", id - 71);
        }
        sql += "COMMIT;";
        client.batch_execute(&sql).await.unwrap();
        tokio::time::sleep(Duration::from_millis(8)).await;
    }
}

/// Waits until the export is ready or has died (a crash point may fire first).
async fn ready_or_exited(f: &mut Follow) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if f.child.try_wait().unwrap().is_some() {
            return false;
        }
        if crate::engine_support::get(f.addr, "/health/ready").await.0 == 200 {
            return true;
        }
        assert!(Instant::now() < deadline, "export neither ready nor exited");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits for the process to die by itself (its crash point); kills it when the point never
/// came. Returns whether the crash point fired.
async fn wait_for_crash(mut f: Follow, secs: u64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(status) = f.child.try_wait().unwrap() {
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(status.signal(), Some(9), "died otherwise: {status:?}");
            return true;
        }
        if Instant::now() >= deadline {
            f.kill9();
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn continuous_export_survives_kill_9_at_random_points_and_crash_windows() {
    const TRIALS: usize = 24;
    let db = new_database().await;
    setup(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let slot = format!("larch_crash_{}", db.name);
    let args = [
        "--diff-interval",
        "100ms",
        "--max-churn-records",
        "60",
        "--keep-epochs",
        "1",
    ];
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicI64::new(2_000_000));
    let load = tokio::spawn(workload(db.dsn.clone(), stop.clone(), next.clone()));
    let seed: u64 = rand::rng().random();
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(seed);
    println!("crash trials: seed {seed}");
    let mut report = vec![];
    let mut left_by_crashes: Vec<String> = vec![];
    let mut total_left = 0;
    let mut swept_checks = 0;
    for trial in 0..TRIALS {
        // Even trials: a kill at a random moment. Odd trials: the exact crash windows.
        let point = match trial % 4 {
            1 => Some(format!("writer.after-upload@{}", rng.random_range(1..=6))),
            3 => Some(format!("writer.after-commit@{}", rng.random_range(1..=12))),
            _ => None,
        };
        let env: Vec<(&str, &str)> = point
            .as_deref()
            .map(|p| vec![("LARCH_CRASH_AT", p)])
            .unwrap_or_default();
        let mut f = Follow::start_env(&db, dir.path(), &slot, &args, &env);
        let ready = ready_or_exited(&mut f).await;
        if point.is_none() && ready && !left_by_crashes.is_empty() {
            // What earlier crashes left unreferenced does not survive this start: once it
            // committed, each object is swept, unless its epoch is still listed (then the
            // sweep must keep it; it goes with its epoch, or with gc).
            let pending = left_by_crashes.clone();
            eventually(30, "the orphan sweep after a restart", || {
                let pending = pending.clone();
                let dir = dir.path();
                async move {
                    let now = unreferenced(dir).await;
                    pending
                        .iter()
                        .all(|k| {
                            now.iter()
                                .find(|o| &o.key == k)
                                .is_none_or(|o| o.class == Unreferenced::ListedEpoch)
                        })
                        .then_some(())
                }
            })
            .await;
            swept_checks += 1;
            left_by_crashes.clear();
        }
        let how = match &point {
            Some(p) => {
                if wait_for_crash(f, 30).await {
                    format!("crash point {p}")
                } else {
                    format!("crash point {p} not reached in 30 s; SIGKILL")
                }
            }
            None => {
                let ms = rng.random_range(150..2500);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                f.kill9();
                format!("SIGKILL after {ms} ms")
            }
        };
        // After every crash: the archive verifies (archive_rows asserts it) and every change
        // of the current epoch is there exactly once.
        let (head, epoch, _) = archive_rows(dir.path()).await;
        let changes = check_exactly_once(dir.path());
        let found = unreferenced(dir.path()).await;
        let count = |c| found.iter().filter(|o| o.class == c).count();
        total_left += found.len();
        left_by_crashes.extend(found.iter().map(|o| o.key.clone()));
        report.push(format!(
            "trial {trial:2}: {how:<44} epoch {epoch:3} head {head:<11} epoch changes {changes:4}  \
             left unreferenced: {} newer than the manifest, {} of unlisted epochs, {} of listed epochs",
            count(Unreferenced::TooNew),
            count(Unreferenced::Orphan),
            count(Unreferenced::ListedEpoch)
        ));
    }
    // A last start: nothing lost, nothing doubled, no orphan left.
    let f = Follow::start(&db, dir.path(), &slot, &args);
    f.ready().await;
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    // Caught up: the archive equals the table. Read errors are retried: retention may delete an
    // epoch under a reader while the exporter runs.
    eventually(60, "the exporter to catch up", || async {
        let (_, _, got) = read_archive(dir.path()).await.ok()?;
        (got == table_rows(&db).await).then_some(())
    })
    .await;
    eventually(30, "no orphan after the last start", || async {
        let o = unreferenced(dir.path()).await;
        (!o.iter().any(|o| o.class == Unreferenced::Orphan)).then_some(())
    })
    .await;
    assert_eq!(f.terminate(), 0);
    assert_eq!(
        archive_rows(dir.path()).await.2,
        table_rows(&db).await,
        "nothing lost: the archive equals the table"
    );
    check_exactly_once(dir.path());
    let end = unreferenced(dir.path()).await;
    assert!(
        !end.iter().any(|o| o.class == Unreferenced::Orphan),
        "no orphan after a clean stop: {end:?}"
    );
    let strays = format!(
        "{} in listed epochs, {} within the clock allowance of the last commit",
        end.iter()
            .filter(|o| o.class == Unreferenced::ListedEpoch)
            .count(),
        end.iter()
            .filter(|o| o.class == Unreferenced::TooNew)
            .count()
    );

    // `larch archive gc --include-listed-epochs --delete` removes what the sweep must keep.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_larch"))
        .args(["archive", "gc", "--store", "local", "--key-prefix", PREFIX])
        // The writer is stopped and shares this machine's clock: no allowance needed.
        .args([
            "--include-listed-epochs",
            "--delete",
            "--clock-allowance",
            "0s",
        ])
        .arg("--path")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(unreferenced(dir.path()).await.is_empty());
    assert_eq!(
        archive_rows(dir.path()).await.2,
        table_rows(&db).await,
        "gc removed nothing the archive needs"
    );
    for line in &report {
        println!("{line}");
    }
    println!(
        "{TRIALS} trials, {} transactions: every crash left a verifying archive with each change \
         exactly once and none lost; {total_left} object(s) left unreferenced by crashes, none \
         survived the next start ({swept_checks} checks) except in a listed epoch; {strays} \
         left unreferenced at the end, removed by gc",
        next.load(Ordering::Relaxed) - 2_000_000
    );
}

fn engine_row(id: i64, name: &str) -> String {
    format!(r#"{{"id":{id},"name":"{name}"}}"#)
}

struct EngineProcess {
    child: std::process::Child,
}

impl EngineProcess {
    fn start(config: &Path, crash_at: Option<&str>) -> EngineProcess {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_larch"));
        cmd.args(["engine", "--listen", "127.0.0.1:0", "--config"])
            .arg(config)
            .env("LARCH_LOG", "warn")
            .stdout(std::process::Stdio::null());
        if let Some(p) = crash_at {
            cmd.env("LARCH_CRASH_AT", p);
        }
        EngineProcess {
            child: cmd.spawn().unwrap(),
        }
    }
}

impl Drop for EngineProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn audit(db: &Database) -> BTreeMap<(String, i64), i64> {
    db.client
        .query("SELECT op, id, count(*) FROM audit GROUP BY op, id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| ((r.get(0), r.get(1)), r.get(2)))
        .collect()
}

/// The target's checkpoint row; `None` until the engine created its table.
async fn checkpoint(db: &Database) -> Option<String> {
    db.client
        .query_opt(
            "SELECT position FROM public.larch_checkpoint WHERE target_table = 'public.items'",
            &[],
        )
        .await
        .ok()
        .flatten()
        .map(|r| r.get(0))
}

#[tokio::test]
async fn engine_killed_between_its_database_commit_and_its_state_file_applies_each_change_once() {
    const ROUNDS: i64 = 5;
    let db = new_database().await;
    let tmp = tempfile::tempdir().unwrap();
    let archive = tmp.path().join("archive");
    let state = tmp.path().join("state/seed.pos");
    let dsn_file = tmp.path().join("dsn");
    std::fs::write(&dsn_file, &db.dsn).unwrap();
    let config = tmp.path().join("engine.yaml");
    std::fs::write(
        &config,
        format!(
            "sources:\n  seed:\n    type: archive\n    store: {{type: local, path: \"{}\"}}\n    \
             key_prefix: {PREFIX}\n    follow: true\n    poll_interval: 50ms\n    state_path: \"{}\"\n\
             tables:\n  - source: seed\n    schema: public\n    table: items\n    targets:\n      \
             - type: postgres\n        connection_file: \"{}\"\n",
            archive.display(),
            state.display(),
            dsn_file.display()
        ),
    )
    .unwrap();
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(&archive).unwrap());
    let mut a = TestArchive::new(store, PREFIX, "public.items")
        .with_columns(crate::archive_build::id_name_columns());
    let base: Vec<String> = (1..=50).map(|i| engine_row(i, "base")).collect();
    a.snapshot("0/100", &crate::archive_build::refs(&base))
        .await;

    // The baseline, then an audit of every row change the target makes from here on.
    let engine = EngineProcess::start(&config, None);
    eventually(30, "the baseline", || async {
        (checkpoint(&db).await.as_deref() == Some("0/100")).then_some(())
    })
    .await;
    eventually(10, "the baseline's state file", || async {
        (std::fs::read_to_string(&state).ok().as_deref() == Some("0/100")).then_some(())
    })
    .await;
    drop(engine);
    db.client
        .batch_execute(
            "CREATE TABLE audit (op text, id int8);
             CREATE FUNCTION audit_row() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               INSERT INTO audit VALUES (TG_OP, CASE WHEN TG_OP = 'DELETE' THEN OLD.id ELSE NEW.id END);
               RETURN NULL;
             END $$;
             CREATE FUNCTION audit_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN INSERT INTO audit VALUES ('TRUNCATE', 0); RETURN NULL; END $$;
             CREATE TRIGGER audit_rows AFTER INSERT OR UPDATE OR DELETE ON public.items
               FOR EACH ROW EXECUTE FUNCTION audit_row();
             CREATE TRIGGER audit_truncate AFTER TRUNCATE ON public.items
               FOR EACH STATEMENT EXECUTE FUNCTION audit_truncate();",
        )
        .await
        .unwrap();

    // Each round: a diff (5 inserts, an update, a delete) reaches an engine armed to die right
    // after its database commit, before its state file.
    let mut want = BTreeMap::new();
    let mut prev = "0/100".to_string();
    for round in 1..=ROUNDS + 1 {
        let pos = format!("0/{}", 100 + round * 100);
        let armed = round <= ROUNDS;
        let mut engine =
            EngineProcess::start(&config, armed.then_some("engine.after-checkpoint@1"));
        // Started before the diff exists: it resumes first, then follows.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let inserts: Vec<String> = (0..5)
            .map(|i| engine_row(1000 + round * 10 + i, "new"))
            .collect();
        let updated = engine_row(round, &format!("updated-{round}"));
        let deleted = engine_row(50 - round, "base");
        let mut changes: Vec<(Action, Option<&str>, Option<&str>)> = inserts
            .iter()
            .map(|r| (Action::Insert, None, Some(r.as_str())))
            .collect();
        changes.push((Action::Update, None, Some(&updated)));
        changes.push((Action::Delete, Some(&deleted), None));
        a.diff(&prev, &pos, &changes).await;
        for i in 0..5 {
            want.insert(("INSERT".to_string(), 1000 + round * 10 + i), 1);
        }
        want.insert(("UPDATE".to_string(), round), 1);
        want.insert(("DELETE".to_string(), 50 - round), 1);
        if armed {
            let status = eventually(30, "the engine's crash point", || {
                let s = engine.child.try_wait().unwrap();
                async move { s }
            })
            .await;
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(status.signal(), Some(9), "{status:?}");
            // Killed inside the window: the database has the diff, the state file does not
            // (it still holds the baseline's position: no ack since).
            assert_eq!(checkpoint(&db).await.as_deref(), Some(pos.as_str()));
            assert_eq!(std::fs::read_to_string(&state).unwrap(), "0/100");
        } else {
            let w = want.clone();
            let db = &db;
            eventually(30, "the last diff", || {
                let w = w.clone();
                async move { (audit(db).await == w).then_some(()) }
            })
            .await;
            eventually(10, "the state file", || async {
                (std::fs::read_to_string(&state).ok().as_deref() == Some(pos.as_str()))
                    .then_some(())
            })
            .await;
        }
        prev = pos;
    }
    // Every change applied exactly once (an UPDATE audit row for a re-applied insert, or a
    // TRUNCATE of a re-baseline, would show here), none skipped, and the table is the archive.
    assert_eq!(audit(&db).await, want);
    let rows: Vec<(i64, String)> = db
        .client
        .query("SELECT id, name FROM public.items ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let mut expect: BTreeMap<i64, String> = (1..=50).map(|i| (i, "base".to_string())).collect();
    for round in 1..=ROUNDS + 1 {
        expect.insert(round, format!("updated-{round}"));
        expect.remove(&(50 - round));
        for i in 0..5 {
            expect.insert(1000 + round * 10 + i, "new".into());
        }
    }
    assert_eq!(rows, expect.into_iter().collect::<Vec<_>>());
    println!(
        "engine crash trials: {ROUNDS} kills between the database commit and the state file; \
         {} audited row changes, each exactly once",
        want.len()
    );
}
