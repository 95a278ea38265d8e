//! The engine as an operator of it expects: it reads `<schema>.<table>/` when no key_prefix is
//! configured (where `larch export` writes), `--check` refuses an archive that is not there, a
//! non-following engine exits instead of retrying forever, its HTTP API is counted by route
//! template, and its lag reads 0 when caught up.

use std::sync::Arc;
use std::time::Duration;

use larch::archive::store::Store;
use larch::archive::store::local::LocalStore;
use larch::engine::config::EngineConfig;

use crate::archive_build::{TestArchive, refs, rows};
use crate::engine_support::{get, metric, start_engine, wait_ready};

/// An engine of `public.events` from the local store at `root`, no key_prefix.
fn config(root: &std::path::Path, follow: bool) -> String {
    format!(
        r#"
sources:
  seed:
    type: archive
    store: {{type: local, path: "{}"}}
    follow: {follow}
tables:
  - source: seed
    schema: public
    table: events
    targets:
      - type: memory
"#,
        root.display()
    )
}

async fn archive_of_events(root: &std::path::Path, n: i64) {
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(root).unwrap());
    let mut a = TestArchive::new(store, "public.events/", "public.events");
    a.snapshot("0/10", &refs(&rows(1..=n, "a"))).await;
}

#[test]
fn key_prefix_defaults_to_the_table_in_yaml_and_stays_the_root_in_laredo_hocon() {
    let yaml = EngineConfig::parse("e.yaml", &config(std::path::Path::new("/d"), false)).unwrap();
    assert_eq!(yaml.sources[0].key_prefix, "public.events/");
    let hocon = r#"
sources { seed { type = archive, store = local, store_config { path = "/d" } } }
tables = [ { source = seed, schema = public, table = events, targets = [{ type = indexed-memory }] } ]
"#;
    let laredo = EngineConfig::parse_hocon("e.conf", hocon, None).unwrap();
    assert_eq!(laredo.sources[0].key_prefix, "", "laredo-server's default");
}

#[tokio::test]
async fn without_a_key_prefix_the_engine_serves_what_larch_export_wrote() {
    let dir = tempfile::tempdir().unwrap();
    archive_of_events(dir.path(), 7).await;
    let engine = start_engine(&config(dir.path(), false)).await;
    wait_ready(engine.addr).await;
    let (status, body) = get(engine.addr, "/tables/public.events").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"row_count\":7"), "{body}");
    engine.stop().await.unwrap();
}

fn larch_engine(args: &[&str], config: &std::path::Path) -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_larch"));
    cmd.arg("engine").args(args).arg("--config").arg(config);
    cmd
}

#[tokio::test]
async fn check_refuses_a_missing_archive_naming_the_table_and_the_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("engine.yaml");
    let root = dir.path().join("archive");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(&file, config(&root, false)).unwrap();
    let out = larch_engine(&["--check"], &file).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    for needle in [
        "table public.events",
        "key_prefix \"public.events/\"",
        "public.events/manifest.json",
    ] {
        assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
    }

    archive_of_events(&root, 3).await;
    let out = larch_engine(&["--check"], &file).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

/// `follow: false` and no archive: nothing will ever come, so the engine exits non-zero with
/// the table and the prefix in its termination message (it used to retry forever, unready).
#[tokio::test]
async fn without_follow_a_missing_archive_ends_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("engine.yaml");
    let termination = dir.path().join("termination");
    std::fs::write(&file, config(dir.path(), false)).unwrap();
    let mut child = larch_engine(&["--listen", "127.0.0.1:0"], &file)
        .arg("--termination-log")
        .arg(&termination)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the engine kept retrying an archive that does not exist");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(status.code(), Some(1), "{status:?}");
    let message = std::fs::read_to_string(&termination).unwrap();
    assert!(
        message.contains("table public.events") && message.contains("public.events/"),
        "{message}"
    );
}

/// Requests are counted by route template and code, never by raw path (one series per route,
/// however many tables or bad paths are asked for), and timed.
#[tokio::test]
async fn the_api_is_counted_by_route_template() {
    let dir = tempfile::tempdir().unwrap();
    archive_of_events(dir.path(), 2).await;
    let engine = start_engine(&config(dir.path(), false)).await;
    wait_ready(engine.addr).await;
    for path in [
        "/tables/public.events",
        "/tables/public.events",
        "/tables/public.nope",
        "/no/such/path",
    ] {
        get(engine.addr, path).await;
    }
    let (_, m) = get(engine.addr, "/metrics").await;
    let count = |labels: &str| metric(&m, &format!("larch_engine_http_requests_total{{{labels}}}"));
    assert_eq!(
        count(r#"code="200",method="GET",route="/tables/{table}""#),
        Some(2.0),
        "{m}"
    );
    assert_eq!(
        count(r#"code="404",method="GET",route="/tables/{table}""#),
        Some(1.0)
    );
    assert_eq!(
        count(r#"code="404",method="GET",route="unmatched""#),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &m,
            r#"larch_engine_http_request_duration_seconds_count{method="GET",route="/tables/{table}"}"#
        ),
        Some(3.0)
    );
    let series: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("larch_engine_http_"))
        .collect();
    assert!(
        !series
            .iter()
            .any(|l| l.contains("public.") || l.contains("/no/such")),
        "a raw path became a label: {series:?}"
    );
    engine.stop().await.unwrap();
}

/// Caught up with an archive written a while ago: the lag is 0 while the data's age grows; the
/// engine's archive bytes behind have their own name (laredo_source_lag_bytes is the exporter's
/// WAL), and the last baseline's rows a gauge without `_total`.
#[tokio::test]
async fn a_caught_up_engine_lags_0_however_old_the_data() {
    let dir = tempfile::tempdir().unwrap();
    archive_of_events(dir.path(), 5).await;
    let engine = start_engine(&config(dir.path(), true)).await;
    wait_ready(engine.addr).await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let (_, m) = get(engine.addr, "/metrics").await;
    let seed = |name: &str| metric(&m, &format!("{name}{{source=\"seed\"}}"));
    assert!(seed("larch_source_data_age_seconds").unwrap() >= 2.0, "{m}");
    assert_eq!(seed("laredo_source_lag_seconds"), Some(0.0), "{m}");
    assert_eq!(seed("larch_source_behind_bytes"), Some(0.0));
    assert_eq!(seed("larch_source_behind_diffs"), Some(0.0));
    assert!(!m.contains("laredo_source_lag_bytes"), "{m}");
    assert_eq!(
        metric(
            &m,
            r#"larch_engine_baseline_rows{pipeline="seed:public.events:memory"}"#
        ),
        Some(5.0)
    );
    engine.stop().await.unwrap();
}
