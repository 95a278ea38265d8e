//! Point in time on real PostgreSQL 15: a continuous export under a scripted workload whose
//! commit times, positions and table states are recorded; the archive read at 5 of those
//! times and 5 of those positions (the library, the CLI, an engine pinned with `at`) equals the
//! table as it was then.

use std::collections::BTreeMap;
use std::sync::Arc;

use larch::archive::format::Format;
use larch::archive::point_in_time::{PointInTime, Precision, resolve, window};
use larch::archive::reader::ArchiveReader;
use larch::archive::store::local::LocalStore;
use serde_json::Value;

use crate::engine_support::{all_rows, eventually, get_json, start_engine, wait_ready};
use crate::postgres_continuous::{Follow, rows_by_id, setup, table_rows};
use crate::support::postgres::{Database, new_database};

/// What the table held after one transaction, and when (PostgreSQL's clock, right after its
/// COMMIT returned: after that commit, before the next).
struct Recorded {
    time: String,
    lsn: String,
    rows: BTreeMap<i64, Value>,
}

async fn record(db: &Database) -> Recorded {
    let r = db
        .client
        .query_one(
            "SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', \
             'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), pg_current_wal_insert_lsn()::text",
            &[],
        )
        .await
        .unwrap();
    Recorded {
        time: r.get(0),
        lsn: r.get(1),
        rows: table_rows(db).await,
    }
}

#[tokio::test]
async fn restores_at_five_times_and_five_positions_equal_the_table_then() {
    let db = new_database().await;
    setup(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let slot = format!("larch_pitr_{}", db.name);
    let f = Follow::start(&db, dir.path(), &slot, &["--diff-interval", "200ms"]);
    f.ready().await;
    let mut states = vec![record(&db).await];
    let workload = [
        "INSERT INTO items VALUES (51, 'fifty-one', NULL)",
        "UPDATE items SET name = 'two' WHERE id = 2",
        "DELETE FROM items WHERE id = 3",
        "UPDATE items SET id = 4000 WHERE id = 4",
        "INSERT INTO items SELECT g, 'batch', NULL FROM generate_series(100, 120) g",
        "UPDATE items SET name = 'two again' WHERE id = 2; DELETE FROM items WHERE id = 51",
        "TRUNCATE items; INSERT INTO items VALUES (7, 'after truncate', NULL)",
        "INSERT INTO items VALUES (8, 'eight', NULL)",
        "UPDATE items SET name = 'seven' WHERE id = 7",
        "DELETE FROM items WHERE id = 8",
    ];
    for (i, sql) in workload.iter().enumerate() {
        db.client.batch_execute(sql).await.unwrap();
        states.push(record(&db).await);
        // Each transaction in a diff of its own: times between them resolve exactly.
        let addr = f.addr;
        eventually(30, "the transaction's diff", || async move {
            (get_json(addr, "/status").await["diffs"]
                .as_u64()
                .unwrap_or(0)
                > i as u64)
                .then_some(())
        })
        .await;
    }
    assert_eq!(f.terminate(), 0);

    let store = Arc::new(LocalStore::new(dir.path()).unwrap());
    let reader = ArchiveReader::new(store, "public.items/", vec![Format::Jsonl]).unwrap();
    let manifest = reader.load_manifest().await.unwrap();
    let diffs: Vec<_> = manifest.diffs().collect();
    assert_eq!(diffs.len(), workload.len(), "one diff per transaction");
    for d in &diffs {
        let (first, last) = (d.first_commit_time.unwrap(), d.last_commit_time.unwrap());
        assert_eq!(first, last, "one transaction per diff");
    }
    let snapshot = manifest.snapshots().next().unwrap();
    assert!(
        snapshot.snapshot_time.is_some(),
        "the baseline records its time"
    );
    let w = window(&manifest).unwrap();
    assert_eq!(w.earliest_position, snapshot.to_position);
    assert_eq!(w.latest_position, manifest.head_position);
    assert_eq!(w.latest_time, diffs.last().unwrap().last_commit_time);

    let key = vec!["id".to_string()];
    for i in [0, 2, 5, 7, 10] {
        let want = &states[i].rows;
        let at: PointInTime = states[i].time.parse().unwrap();
        let r = resolve(&manifest, &at).unwrap();
        assert_eq!(r.precision, Precision::Transaction, "at {}", states[i].time);
        let got = rows_by_id(&reader.reconstruct(&r.plan, &key).await.unwrap());
        assert_eq!(
            &got, want,
            "state at time {} (after transaction {i})",
            states[i].time
        );
        let at: PointInTime = states[i].lsn.parse().unwrap();
        let r = resolve(&manifest, &at).unwrap();
        let got = rows_by_id(&reader.reconstruct(&r.plan, &key).await.unwrap());
        assert_eq!(
            &got, want,
            "state at position {} (after transaction {i})",
            states[i].lsn
        );
    }

    // The CLI: the same parser, the point reached on stdout, a notice past the head.
    let cli = |at: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_larch"))
            .args([
                "archive",
                "reconstruct",
                "--store",
                "local",
                "--table",
                "items",
            ])
            .arg("--path")
            .arg(dir.path())
            .args(["--at", at])
            .output()
            .unwrap()
    };
    let out = cli(&states[5].time);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["precision"], "transaction");
    assert_eq!(
        doc["time"],
        Value::String(larch::archive::manifest::format_time(
            &diffs[4].last_commit_time.unwrap()
        ))
    );
    assert_eq!(doc["row_count"], states[5].rows.len());
    let out = cli("2999-01-01T00:00:00Z");
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("notice: time 2999-01-01T00:00:00Z is at or after the archive's head"),
        "{stderr}"
    );
    let out = cli("2000-01-01T00:00:00Z");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("predates the archive: its earliest point is position")
            && stderr.contains(&snapshot.to_position),
        "{stderr}"
    );
    let out = cli("yesterday");
    assert_eq!(out.status.code(), Some(2), "a usage error");
    assert!(String::from_utf8_lossy(&out.stderr).contains("neither a position"));

    // An engine pinned at a time serves the table as it was then, and says so in /status.
    let yaml = format!(
        "sources:\n  s:\n    type: archive\n    store: {{type: local, path: \"{}\"}}\n    key_prefix: public.items/\n    at: \"{}\"\ntables:\n  - source: s\n    schema: public\n    table: items\n    targets:\n      - type: memory\n",
        dir.path().display(),
        states[2].time
    );
    let engine = start_engine(&yaml).await;
    wait_ready(engine.addr).await;
    let served: BTreeMap<i64, Value> = all_rows(engine.addr, "public.items", 100)
        .await
        .into_iter()
        .map(|v| (v["id"].as_i64().unwrap(), v))
        .collect();
    assert_eq!(served, states[2].rows);
    let status = get_json(engine.addr, "/status").await;
    let at = &status["sources"]["s"]["at"];
    let requested: PointInTime = at["requested"].as_str().unwrap().parse().unwrap();
    assert_eq!(requested, states[2].time.parse().unwrap(), "{status}");
    assert_eq!(
        at["position"],
        Value::String(diffs[1].to_position.clone()),
        "{status}"
    );
    assert_eq!(at["precision"], "transaction");
    engine.stop().await.unwrap();
}
