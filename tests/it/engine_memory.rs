//! The engine's HTTP API over a memory target, through a real listener: health, tables, rows
//! (pagination, filters), row by key, status and metrics.

use std::sync::Arc;

use serde_json::Value;

use larch::archive::model::{Action, ColumnDefinition};
use larch::archive::store::Store;
use larch::archive::store::local::LocalStore;

use crate::archive_build::TestArchive;
use crate::engine_support::{CliEngine, all_rows, get, get_json, metric, start_engine, wait_ready};

fn yaml(root: &std::path::Path, extra: &str) -> String {
    format!(
        r#"
sources:
  seed:
    type: archive
    store: {{type: local, path: "{}"}}
    key_prefix: public.events/
    {extra}
tables:
  - source: seed
    schema: public
    table: events
    targets:
      - type: memory
        index_fields: [tenant, kind]
"#,
        root.display()
    )
}

#[tokio::test]
async fn replay_serves_the_folded_archive_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()).unwrap());
    let cols = ["amount", "id", "kind", "tenant"]
        .iter()
        .enumerate()
        .map(|(i, n)| ColumnDefinition {
            name: n.to_string(),
            type_name: if *n == "id" { "int8" } else { "text" }.into(),
            primary_key: *n == "id",
            primary_key_ordinal: if *n == "id" { 1 } else { 0 },
            ordinal_position: i as i64 + 1,
            nullable: *n != "id",
            ..Default::default()
        })
        .collect();
    let mut a = TestArchive::new(store, "public.events/", "public.events").with_columns(cols);
    let rows: Vec<String> = (1..=250)
        .map(|i| {
            format!(
                r#"{{"id":{i},"tenant":"t{}","kind":"{}","amount":12345678901234567890.12{}}}"#,
                i % 5,
                if i % 2 == 0 { "click" } else { "view" },
                i % 10
            )
        })
        .collect();
    a.snapshot("0/10", &crate::archive_build::refs(&rows)).await;
    a.diff(
        "0/10",
        "0/20",
        &[
            (Action::Delete, Some(r#"{"id":1}"#), None),
            (
                Action::Insert,
                None,
                Some(r#"{"id":9007199254740993,"tenant":"t0","kind":"view","amount":1.50}"#),
            ),
        ],
    )
    .await;

    let engine = start_engine(&yaml(dir.path(), "")).await;
    let addr = engine.addr;
    assert_eq!(
        get(addr, "/health/live").await,
        (200, r#"{"status":"ok"}"#.into())
    );
    wait_ready(addr).await;

    let tables = get_json(addr, "/tables").await;
    assert_eq!(
        tables,
        serde_json::json!({"tables": [{"table": "public.events", "row_count": 250}]})
    );
    let t = get_json(addr, "/tables/public.events").await;
    assert_eq!(t["row_count"], 250);
    assert_eq!(t["position"], "0/20");
    assert_eq!(t["primary_key"], serde_json::json!(["id"]));
    assert_eq!(t["columns"].as_array().unwrap().len(), 4);
    assert_eq!(t["columns"][1]["type"], "int8");
    assert!(t["last_rebaseline"].is_null());

    // Stable pagination in key order, every row once.
    let all = all_rows(addr, "public.events", 7).await;
    let ids: Vec<i64> = all.iter().map(|r| r["id"].as_i64().unwrap()).collect();
    let mut want: Vec<i64> = (2..=250).collect();
    want.push(9007199254740993);
    assert_eq!(ids, want);

    // Exact text: every digit survives.
    let (status, body) = get(addr, "/tables/public.events/row?id=9007199254740993").await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        r#"{"amount":1.50,"id":9007199254740993,"kind":"view","tenant":"t0"}"#
    );
    let (_, body) = get(addr, "/tables/public.events/rows?limit=1").await;
    assert!(
        body.contains(r#""amount":12345678901234567890.122"#),
        "{body}"
    );
    assert_eq!(get(addr, "/tables/public.events/row?id=1").await.0, 404);
    let (status, body) = get(addr, "/tables/public.events/row?tenant=t1").await;
    assert_eq!(status, 400);
    assert!(body.contains("not a primary-key field"), "{body}");
    assert_eq!(get(addr, "/tables/public.events/row").await.0, 400);

    // Equality filters on indexed fields, combined, paginated.
    let body = get_json(
        addr,
        "/tables/public.events/rows?tenant=t3&kind=click&limit=1000",
    )
    .await;
    let got: Vec<i64> = body["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect();
    let want: Vec<i64> = (2..=250).filter(|i| i % 5 == 3 && i % 2 == 0).collect();
    assert_eq!(got, want);
    assert!(body["next"].is_null());
    let page = get_json(addr, "/tables/public.events/rows?tenant=t3&limit=10").await;
    assert_eq!(page["rows"].as_array().unwrap().len(), 10);
    let next = page["next"].as_str().unwrap();
    let page2 = get_json(
        addr,
        &format!("/tables/public.events/rows?tenant=t3&limit=10&after={next}"),
    )
    .await;
    assert_eq!(page2["rows"][0]["id"], 53);
    let (status, body) = get(addr, "/tables/public.events/rows?amount=1").await;
    assert_eq!(status, 400);
    assert!(body.contains(r#"\"amount\" is not indexed"#), "{body}");
    assert_eq!(get(addr, "/tables/public.events/rows?limit=0").await.0, 400);
    assert_eq!(
        get(addr, "/tables/public.events/rows?after=%25%25").await.0,
        400
    );
    assert_eq!(get(addr, "/tables/public.nope/rows").await.0, 404);

    // Status and metrics.
    let status = get_json(addr, "/status").await;
    let s = &status["sources"]["seed"];
    assert_eq!(s["position"], "0/20");
    assert_eq!(s["head"], "0/20");
    assert_eq!(s["epoch"], 1);
    assert_eq!(s["rebaselines"], 0);
    assert!(s["lag_seconds"].as_f64().unwrap() >= 0.0);
    // The head's time (the manifest's updated_at, UTC): its age is the lag.
    let head_time: jiff::Timestamp = s["head_time"].as_str().unwrap().parse().unwrap();
    assert!(s["head_time"].as_str().unwrap().ends_with('Z'), "{s}");
    let age = jiff::Timestamp::now().as_second() - head_time.as_second();
    assert!(
        (age as f64 - s["lag_seconds"].as_f64().unwrap()).abs() <= 2.0,
        "head_time {head_time} vs lag {}",
        s["lag_seconds"]
    );
    let p = &status["pipelines"]["seed:public.events:memory"];
    assert_eq!(p["state"], "STREAMING");
    assert_eq!(p["row_count"], 250);
    assert_eq!(p["baseline_rows"], 250);
    let (status, m) = get(addr, "/metrics").await;
    assert_eq!(status, 200);
    assert_eq!(
        metric(&m, r#"laredo_source_rebaseline_total{source="seed"}"#),
        Some(0.0)
    );
    assert_eq!(
        metric(
            &m,
            r#"laredo_pipeline_state{pipeline="seed:public.events:memory"}"#
        ),
        Some(2.0)
    );
    assert_eq!(
        metric(
            &m,
            r#"laredo_baseline_rows_total{pipeline="seed:public.events:memory"}"#
        ),
        Some(250.0)
    );
    assert_eq!(
        metric(
            &m,
            r#"laredo_baseline_duration_seconds_count{pipeline="seed:public.events:memory"}"#
        ),
        Some(1.0)
    );
    assert!(metric(&m, r#"laredo_source_lag_seconds{source="seed"}"#).unwrap() >= 0.0);
    engine.stop().await.unwrap();
}

#[tokio::test]
async fn not_ready_until_the_archive_exists() {
    let dir = tempfile::tempdir().unwrap();
    let engine = start_engine(&yaml(dir.path(), "follow: true\n    poll_interval: 100ms")).await;
    let addr = engine.addr;
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    assert_eq!(
        get(addr, "/health/ready").await,
        (503, r#"{"ready":false}"#.into())
    );
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()).unwrap());
    let mut a = TestArchive::new(store, "public.events/", "public.events");
    a.snapshot("0/1", &[r#"{"id":1,"tenant":"a"}"#]).await;
    wait_ready(addr).await;
    assert_eq!(all_rows(addr, "public.events", 10).await.len(), 1);
    engine.stop().await.unwrap();
}

#[tokio::test]
async fn the_cli_serves_until_sigterm_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path().join("a")).unwrap());
    let mut a = TestArchive::new(store, "public.events/", "public.events");
    a.snapshot("0/1", &[r#"{"id":1,"tenant":"a"}"#]).await;
    let config = dir.path().join("engine.yaml");
    std::fs::write(&config, yaml(&dir.path().join("a"), "")).unwrap();
    let engine = CliEngine::spawn(&config).await;
    wait_ready(engine.addr).await;
    assert_eq!(all_rows(engine.addr, "public.events", 10).await.len(), 1);
    let status = engine.stop().await;
    assert_eq!(status.code(), Some(0), "clean exit on SIGTERM");
}

/// Runs `larch engine` on `config` until it exits by itself (at most 30 s); its exit status
/// and termination message.
async fn engine_exits(config: &std::path::Path, termination: &std::path::Path) -> (i32, Value) {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_larch"))
        .args(["engine", "--listen", "127.0.0.1:0", "--config"])
        .arg(config)
        .arg("--termination-log")
        .arg(termination)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the engine kept running with a configuration its archive cannot serve");
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let doc = serde_json::from_str(&std::fs::read_to_string(termination).unwrap()).unwrap();
    (status.code().unwrap_or(-1), doc)
}

/// Index or key fields that are not columns of the archive's manifest cannot work: the engine
/// stops at start with exit status 2 and reason ColumnNotFound in its termination message,
/// naming the field and the columns. A manifest without columns (laredo's may have none) is
/// not judged (the other tests serve such archives with index fields).
#[tokio::test]
async fn the_engine_refuses_fields_that_are_not_columns_of_the_archive() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("a");
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(&root).unwrap());
    let mut a = TestArchive::new(store, "public.events/", "public.events")
        .with_columns(crate::archive_build::id_name_columns());
    a.snapshot("0/1", &[r#"{"id":1,"name":"a"}"#]).await;
    let config = dir.path().join("engine.yaml");
    let termination = dir.path().join("termination-log");
    // yaml() indexes tenant and kind: neither is a column here.
    std::fs::write(&config, yaml(&root, "")).unwrap();
    let (code, doc) = engine_exits(&config, &termination).await;
    assert_eq!(
        (code, doc["reason"].as_str()),
        (2, Some("ColumnNotFound")),
        "{doc}"
    );
    let error = doc["error"].as_str().unwrap();
    assert!(
        error.contains("index field \"tenant\" is not a column of table public.events")
            && error.contains("its columns: id, name"),
        "{error}"
    );
    let keyed = yaml(&root, "key_fields: [nope]")
        .replace("index_fields: [tenant, kind]", "index_fields: [name]");
    std::fs::write(&config, keyed).unwrap();
    let (code, doc) = engine_exits(&config, &termination).await;
    assert_eq!(
        (code, doc["reason"].as_str()),
        (2, Some("ColumnNotFound")),
        "{doc}"
    );
    assert!(
        doc["error"]
            .as_str()
            .unwrap()
            .contains("key field \"nope\""),
        "{doc}"
    );
    // Fields that are columns: served.
    let fine = yaml(&root, "").replace("index_fields: [tenant, kind]", "index_fields: [name]");
    let engine = start_engine(&fine).await;
    wait_ready(engine.addr).await;
    assert_eq!(all_rows(engine.addr, "public.events", 10).await.len(), 1);
    engine.stop().await.unwrap();
}
