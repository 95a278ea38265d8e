//! The engine following archives: appends show up, a replacement re-baselines exactly once and
//! atomically, restarts, groups, pause/resume, and S3 (SeaweedFS).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use larch::archive::model::Action;
use larch::archive::store::Store;
use larch::archive::store::local::LocalStore;
use larch::engine::Serving;
use larch::engine::access::{ApiAccess, Token};

use crate::archive_build::{TestArchive, refs, rows};
use crate::engine_support::{
    all_rows, eventually, get, get_json, metric, request_with, start_engine, start_engine_serving,
    wait_ready,
};
use crate::support::seaweedfs;

pub(crate) fn local_yaml(root: &std::path::Path, extra: &str) -> String {
    format!(
        r#"
sources:
  seed:
    type: archive
    store: {{type: local, path: "{}"}}
    key_prefix: public.t/
    follow: true
    poll_interval: 100ms
    {extra}
tables:
  - source: seed
    schema: public
    table: t
    targets:
      - type: memory
"#,
        root.display()
    )
}

fn tags(rows: &[serde_json::Value]) -> BTreeSet<String> {
    rows.iter()
        .map(|r| {
            r["v"]
                .as_str()
                .unwrap()
                .split('-')
                .next()
                .unwrap()
                .to_string()
        })
        .collect()
}

async fn rebaselines(addr: std::net::SocketAddr) -> f64 {
    let (_, m) = get(addr, "/metrics").await;
    metric(&m, r#"laredo_source_rebaseline_total{source="seed"}"#).unwrap()
}

#[tokio::test]
async fn follow_shows_appends_and_a_replacement_swaps_atomically() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()).unwrap());
    let mut a = TestArchive::new(store, "public.t/", "public.t");
    a.snapshot("0/100", &refs(&rows(1..=2000, "old"))).await;
    let engine = start_engine(&local_yaml(dir.path(), "")).await;
    let addr = engine.addr;
    wait_ready(addr).await;
    assert_eq!(all_rows(addr, "public.t", 5000).await.len(), 2000);

    // Follow: an appended diff shows up.
    a.diff(
        "0/100",
        "0/200",
        &[
            (Action::Insert, None, Some(r#"{"id":2001,"v":"old-2001"}"#)),
            (Action::Delete, Some(r#"{"id":1,"v":"old-1"}"#), None),
        ],
    )
    .await;
    eventually(10, "the appended diff", || async move {
        (get(addr, "/tables/public.t/row?id=2001").await.0 == 200).then_some(())
    })
    .await;
    assert_eq!(get(addr, "/tables/public.t/row?id=1").await.0, 404);
    assert_eq!(
        get_json(addr, "/tables/public.t").await["position"],
        "0/200"
    );
    let (_, m) = get(addr, "/metrics").await;
    assert_eq!(
        metric(
            &m,
            r#"laredo_changes_applied_total{action="INSERT",pipeline="seed:public.t:memory"}"#
        ),
        Some(1.0)
    );
    assert_eq!(rebaselines(addr).await, 0.0);

    // Readers hammer the table while a replacement is swapped in: every answer is the whole
    // old table or the whole new one.
    let stop = Arc::new(AtomicBool::new(false));
    let seen_new = Arc::new(AtomicU64::new(0));
    let mut readers = Vec::new();
    for _ in 0..2 {
        let (stop, seen_new) = (stop.clone(), seen_new.clone());
        readers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let body = get_json(addr, "/tables/public.t/rows?limit=10000").await;
                let rows = body["rows"].as_array().unwrap().clone();
                let t = tags(&rows);
                match (
                    rows.len(),
                    t.iter().map(String::as_str).collect::<Vec<_>>().as_slice(),
                ) {
                    (2000, ["old"]) => {}
                    (3000, ["new"]) => {
                        seen_new.fetch_add(1, Ordering::SeqCst);
                    }
                    (len, t) => panic!("a query saw a partial table: {len} rows tagged {t:?}"),
                }
                n += 1;
            }
            n
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A new epoch at a *lower* position: replaced, whatever the order.
    a.replace("0/50", &refs(&rows(5001..=8000, "new"))).await;
    eventually(20, "the new epoch", || {
        let s = seen_new.clone();
        async move { (s.load(Ordering::SeqCst) > 3).then_some(()) }
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    for r in readers {
        assert!(r.await.unwrap() > 3, "readers ran during the swap");
    }
    assert_eq!(rebaselines(addr).await, 1.0);
    let now = all_rows(addr, "public.t", 999).await;
    assert_eq!(now.len(), 3000);
    assert_eq!(
        tags(&now),
        BTreeSet::from(["new".to_string()]),
        "no stale rows"
    );
    let t = get_json(addr, "/tables/public.t").await;
    assert_eq!(t["position"], "0/50");
    assert!(t["last_rebaseline"].is_string());
    let status = get_json(addr, "/status").await;
    assert_eq!(status["sources"]["seed"]["rebaselines"], 1);
    assert_eq!(status["sources"]["seed"]["epoch"], 2);
    // And it keeps following the new epoch, with no further re-baseline.
    a.diff(
        "0/50",
        "0/60",
        &[(Action::Insert, None, Some(r#"{"id":1,"v":"new-1"}"#))],
    )
    .await;
    eventually(10, "a diff of the new epoch", || async move {
        (get(addr, "/tables/public.t/row?id=1").await.0 == 200).then_some(())
    })
    .await;
    assert_eq!(rebaselines(addr).await, 1.0);
    engine.stop().await.unwrap();
}

#[tokio::test]
async fn a_memory_target_restarts_from_a_baseline_not_from_the_state_file() {
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("archive");
    let state = dir.path().join("state/seed.pos");
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(&archive).unwrap());
    let mut a = TestArchive::new(store, "public.t/", "public.t");
    a.snapshot("0/10", &refs(&rows(1..=5, "s"))).await;
    let yaml = local_yaml(&archive, &format!("state_path: \"{}\"", state.display()));
    let engine = start_engine(&yaml).await;
    wait_ready(engine.addr).await;
    a.diff(
        "0/10",
        "0/20",
        &[(Action::Insert, None, Some(r#"{"id":6,"v":"s-6"}"#))],
    )
    .await;
    let addr = engine.addr;
    eventually(10, "the diff", || async move {
        (get(addr, "/tables/public.t/row?id=6").await.0 == 200).then_some(())
    })
    .await;
    engine.stop().await.unwrap();
    // Only the baseline position is confirmed for a non-durable target.
    assert_eq!(std::fs::read_to_string(&state).unwrap(), "0/10");
    // A restart takes a baseline (a memory target holds nothing to resume into).
    let engine = start_engine(&yaml).await;
    wait_ready(engine.addr).await;
    assert_eq!(all_rows(engine.addr, "public.t", 100).await.len(), 6);
    assert_eq!(std::fs::read_to_string(&state).unwrap(), "0/20");
    engine.stop().await.unwrap();
}

#[tokio::test]
async fn group_mode_runs_one_source_per_table() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path().join("root")).unwrap());
    let mut a = TestArchive::new(store.clone(), "public.a/", "public.a");
    a.snapshot("0/1", &refs(&rows(1..=3, "a"))).await;
    let mut b = TestArchive::new(store, "sales.b/", "sales.b");
    b.snapshot("0/2", &refs(&rows(1..=4, "b"))).await;
    let yaml = format!(
        r#"
sources:
  g:
    type: file
    store: {{type: local, path: "{}"}}
    group: true
    follow: true
    poll_interval: 100ms
    state_path: "{}"
tables:
  - {{source: g, schema: public, table: a, targets: [{{type: memory}}]}}
  - {{source: g, schema: sales, table: b, targets: [{{type: memory}}]}}
"#,
        dir.path().join("root").display(),
        dir.path().join("state").display()
    );
    let engine = start_engine(&yaml).await;
    let addr = engine.addr;
    wait_ready(addr).await;
    assert_eq!(all_rows(addr, "public.a", 10).await.len(), 3);
    assert_eq!(all_rows(addr, "sales.b", 10).await.len(), 4);
    // No recorded columns: inferred from the first row (sorted names, no key marked).
    let t = get_json(addr, "/tables/public.a").await;
    let names: Vec<&str> = t["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["id", "v"]);
    // snake_case, like every other key of the HTTP API (not the manifest's PascalCase).
    assert!(t["columns"][0].get("Name").is_none(), "{t}");
    assert!(
        t["columns"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["primary_key"] == false)
    );
    assert_eq!(t["primary_key"], serde_json::json!(["id"]));
    let status = get_json(addr, "/status").await;
    assert_eq!(status["sources"]["g/public.a"]["position"], "0/1");
    assert_eq!(status["sources"]["g/sales.b"]["position"], "0/2");
    assert!(status["pipelines"]["g/sales.b:sales.b:memory"].is_object());
    assert_eq!(
        std::fs::read_to_string(dir.path().join("state/public.a.pos")).unwrap(),
        "0/1"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("state/sales.b.pos")).unwrap(),
        "0/2"
    );
    b.diff("0/2", "0/3", &[(Action::Delete, Some(r#"{"id":1}"#), None)])
        .await;
    eventually(10, "the diff of sales.b", || async move {
        (get(addr, "/tables/sales.b/row?id=1").await.0 == 404).then_some(())
    })
    .await;
    engine.stop().await.unwrap();
}

#[tokio::test]
async fn pause_holds_changes_until_resume() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()).unwrap());
    let mut a = TestArchive::new(store, "public.t/", "public.t");
    a.snapshot("0/1", &refs(&rows(1..=1, "s"))).await;
    let token = "pause-token-0123456789abcdef";
    let serving = Serving {
        listen: "127.0.0.1:0".into(),
        access: ApiAccess {
            control: true,
            protect_reads: false,
            protect_status: false,
            token: Some(Token::new(token, "test").unwrap()),
        },
        tls: None,
        grpc: None,
    };
    let engine = start_engine_serving(&local_yaml(dir.path(), ""), &serving).await;
    let addr = engine.addr;
    wait_ready(addr).await;
    let bearer = format!("Authorization: Bearer {token}");
    assert_eq!(
        request_with(addr, "POST", "/sources/seed/pause", &[&bearer])
            .await
            .0,
        200
    );
    let status = get_json(addr, "/status").await;
    assert_eq!(status["sources"]["seed"]["state"], "PAUSED");
    assert_eq!(
        status["pipelines"]["seed:public.t:memory"]["state"],
        "PAUSED"
    );
    a.diff(
        "0/1",
        "0/2",
        &[(Action::Insert, None, Some(r#"{"id":2,"v":"x"}"#))],
    )
    .await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        get(addr, "/tables/public.t/row?id=2").await.0,
        404,
        "paused"
    );
    assert_eq!(
        request_with(addr, "POST", "/sources/seed/resume", &[&bearer])
            .await
            .0,
        200
    );
    eventually(10, "the held diff", || async move {
        (get(addr, "/tables/public.t/row?id=2").await.0 == 200).then_some(())
    })
    .await;
    assert_eq!(
        request_with(addr, "POST", "/sources/nope/pause", &[&bearer])
            .await
            .0,
        404
    );
    engine.stop().await.unwrap();
}

#[tokio::test]
async fn follows_an_archive_on_s3() {
    let weed = seaweedfs();
    let bucket = weed.new_bucket().await;
    let store: Arc<dyn Store> = Arc::new(weed.s3_store(&bucket, "archives/").await);
    let mut a = TestArchive::new(store, "public.t/", "public.t");
    a.snapshot("0/10", &refs(&rows(1..=50, "s"))).await;
    let cfg = weed.config(&bucket, "archives/");
    let larch::archive::store::s3::S3Credentials::Files {
        access_key_id_file,
        secret_access_key_file,
        ..
    } = cfg.credentials
    else {
        panic!("the harness uses key files")
    };
    let yaml = format!(
        r#"
sources:
  seed:
    type: archive
    store: {{type: s3, bucket: {bucket}, prefix: "archives/", region: us-east-1, endpoint: "{}", path_style: true, access_key_id_file: "{}", secret_access_key_file: "{}"}}
    key_prefix: public.t/
    follow: true
    poll_interval: 200ms
tables:
  - {{source: seed, schema: public, table: t, targets: [{{type: memory}}]}}
"#,
        weed.endpoint(),
        access_key_id_file.display(),
        secret_access_key_file.display()
    );
    let engine = start_engine(&yaml).await;
    let addr = engine.addr;
    wait_ready(addr).await;
    assert_eq!(all_rows(addr, "public.t", 100).await.len(), 50);
    a.diff(
        "0/10",
        "0/20",
        &[(Action::Update, None, Some(r#"{"id":7,"v":"changed"}"#))],
    )
    .await;
    eventually(15, "the diff on S3", || async move {
        let (s, b) = get(addr, "/tables/public.t/row?id=7").await;
        (s == 200 && b.contains("changed")).then_some(())
    })
    .await;
    a.replace("0/30", &refs(&rows(100..=110, "n"))).await;
    eventually(15, "the replacement on S3", || async move {
        (all_rows(addr, "public.t", 100).await.len() == 11).then_some(())
    })
    .await;
    assert_eq!(rebaselines(addr).await, 1.0);
    engine.stop().await.unwrap();
}

/// Issue 14 item 10: while an S3 store cannot be reached, `/status` says why (the state alone
/// says CONNECTING), in a line: the operation, key and cause, not the SDK's debug structure.
#[tokio::test]
async fn status_names_the_storage_error_being_retried() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    let secret = dir.path().join("secret");
    std::fs::write(&key, "x").unwrap();
    std::fs::write(&secret, "y").unwrap();
    // Port 9 (discard) on loopback: nothing listens, every connection is refused.
    let yaml = format!(
        r#"
sources:
  seed:
    type: archive
    store: {{type: s3, bucket: b, region: us-east-1, endpoint: "http://127.0.0.1:9", path_style: true, access_key_id_file: "{}", secret_access_key_file: "{}"}}
    key_prefix: public.t/
    follow: true
    poll_interval: 100ms
tables:
  - {{source: seed, schema: public, table: t, targets: [{{type: memory}}]}}
"#,
        key.display(),
        secret.display()
    );
    let engine = start_engine(&yaml).await;
    let addr = engine.addr;
    let error = eventually(30, "the error in /status", || async move {
        let status = get_json(addr, "/status").await;
        status["sources"]["seed"]["last_error"]["message"]
            .as_str()
            .map(|m| (status["sources"]["seed"]["state"].clone(), m.to_string()))
    })
    .await;
    assert_eq!(error.0, "CONNECTING", "{error:?}");
    let message = error.1;
    assert!(
        message.contains("s3://b/public.t/manifest.json") && message.contains("Connection refused"),
        "{message}"
    );
    assert!(
        message.len() < 400 && !message.contains("Error {"),
        "one short line, not the SDK's structure: {} bytes: {message}",
        message.len()
    );
    assert_eq!(get(addr, "/health/ready").await.0, 503);
    engine.stop().await.unwrap();
}
