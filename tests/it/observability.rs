//! Progress and metrics as a user sees them: a one-shot export's `/status` while it copies, an
//! engine's baseline against the manifest's row count, and docs/metrics.md checked against real
//! scrapes of an exporter, an engine and the operator's endpoint.

// The one-shot progress test needs the crashpoints feature; its helpers are unused without it.
#![cfg_attr(not(feature = "crashpoints"), allow(dead_code, unused_imports))]

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;

use larch::locks::MutexExt;
use serde_json::Value;

use crate::engine_support::{eventually, get, get_json, metric, start_engine, wait_ready};
use crate::postgres_continuous::{Follow, listening};
use crate::support::postgres::new_database;

const ROWS: u64 = 200_000;

/// `larch export --listen 127.0.0.1:0` (one-shot) as a child: its address and its stderr lines.
struct OneShot {
    child: std::process::Child,
    addr: SocketAddr,
    stderr: Arc<std::sync::Mutex<Vec<String>>>,
    reader: std::thread::JoinHandle<()>,
}

fn spawn_one_shot(dsn: &str, slot: &str, dir: &std::path::Path, env: &[(&str, &str)]) -> OneShot {
    let mut child = Command::new(env!("CARGO_BIN_EXE_larch"))
        .args([
            "export",
            "--table",
            "events",
            "--store",
            "local",
            "--listen",
            "127.0.0.1:0",
            "--slot",
            slot,
        ])
        .arg("--path")
        .arg(dir)
        .env("LARCH_PG_DSN", dsn)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (addr, stderr, reader) = listening(&mut child);
    OneShot {
        child,
        addr,
        stderr,
        reader,
    }
}

async fn table_of(rows: u64) -> crate::support::postgres::Database {
    let db = new_database().await;
    db.client
        .batch_execute(&format!(
            "CREATE TABLE events (id int8 PRIMARY KEY, body text);
             INSERT INTO events SELECT g, repeat('x', 40) || g FROM generate_series(1, {rows}) g;
             ANALYZE events;"
        ))
        .await
        .unwrap();
    db
}

/// An engine replaying `public.<table>` from the local archive at `root` into memory.
fn memory_engine(root: &std::path::Path, table: &str) -> String {
    format!(
        r#"
sources:
  seed:
    type: archive
    store: {{type: local, path: "{}"}}
    key_prefix: public.{table}/
tables:
  - source: seed
    schema: public
    table: {table}
    targets:
      - type: memory
"#,
        root.display()
    )
}

// The pause point holds the copy open long enough to read its progress.
#[cfg(feature = "crashpoints")]
#[tokio::test]
async fn a_one_shot_export_shows_its_progress_while_it_copies() {
    let db = table_of(ROWS).await;
    let dir = tempfile::tempdir().unwrap();
    // Held for 3 s once 10 000 rows are copied, so the reads below see it mid-copy.
    // Slots are per cluster: the tests' exports of `events` each need their own.
    let export = spawn_one_shot(
        &db.dsn,
        &format!("larch_progress_{}", db.name),
        dir.path(),
        &[("LARCH_PAUSE_AT", "export.baseline-rows=3000")],
    );
    let addr = export.addr;
    let log = export.stderr.clone();
    let during = eventually(30, "progress past 10 000 rows", || async {
        if tokio::net::TcpStream::connect(addr).await.is_err() {
            let lines = log.locked().clone();
            panic!("the export stopped serving:\n{}", lines.join("\n"));
        }
        let s = get_json(addr, "/status").await;
        (s["progress"]["rows"].as_u64().unwrap_or(0) >= 10_000).then_some(s)
    })
    .await;
    let p = &during["progress"];
    assert_eq!(during["state"], "BASELINE");
    assert_eq!(p["operation"], "baseline");
    assert_eq!(p["subject"], "public.events");
    assert_eq!(p["done"], false, "{during}");
    let rows = p["rows"].as_u64().unwrap();
    assert!(rows < ROWS, "still copying: {during}");
    // ANALYZE's estimate of 200 000 rows.
    let total = p["total_rows"].as_u64().expect("an estimate from pg_class");
    assert!(total.abs_diff(ROWS) <= ROWS / 10, "estimate {total}");
    let percent = p["percent"].as_f64().unwrap();
    assert!(percent > 0.0 && percent < 100.0, "{percent}");
    assert!(p["bytes"].as_u64().unwrap() > rows * 40, "{during}");
    let (code, metrics) = get(addr, "/metrics").await;
    assert_eq!(code, 200);
    let copied = metric(
        &metrics,
        r#"larch_export_progress_rows{operation="baseline",table="public.events"}"#,
    )
    .expect("the progress gauge while copying");
    assert!(copied >= 10_000.0 && copied < ROWS as f64, "{copied}");

    let OneShot {
        mut child,
        stderr,
        reader,
        ..
    } = export;
    let out = tokio::task::spawn_blocking(move || {
        let mut stdout = String::new();
        std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut stdout).unwrap();
        (child.wait().unwrap(), stdout)
    })
    .await
    .unwrap();
    reader.join().unwrap();
    let log = stderr.locked().join("\n");
    assert!(out.0.success(), "{log}");
    let summary: Value = serde_json::from_str(&out.1).unwrap();
    assert_eq!(summary["row_count"], ROWS);
    // The final line: the totals and the rate.
    let last: Value = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| {
            l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("baseline of public.events done"))
        })
        .unwrap_or_else(|| panic!("no final progress line in:\n{log}"));
    assert_eq!(last["fields"]["rows"], ROWS, "{last}");
    assert!(last["fields"]["rows_per_second"].as_f64().unwrap() > 0.0);
}

#[tokio::test]
async fn an_engine_reports_its_baseline_against_the_manifest_row_count() {
    let db = table_of(5_000).await;
    let dir = tempfile::tempdir().unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_larch"))
        .args(["export", "--table", "events", "--store", "local", "--path"])
        .arg(dir.path())
        .args(["--slot", &format!("larch_engine_progress_{}", db.name)])
        .env("LARCH_PG_DSN", &db.dsn)
        .output()
        .unwrap();
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let engine = start_engine(&memory_engine(dir.path(), "events")).await;
    wait_ready(engine.addr).await;
    let s = get_json(engine.addr, "/status").await;
    let (_, pipeline) = s["pipelines"].as_object().unwrap().iter().next().unwrap();
    let p = &pipeline["baseline_progress"];
    assert_eq!(p["operation"], "baseline", "{s}");
    assert_eq!(
        (p["rows"].as_u64(), p["total_rows"].as_u64()),
        (Some(5_000), Some(5_000))
    );
    assert_eq!(
        (p["done"].as_bool(), p["percent"].as_f64()),
        (Some(true), Some(100.0))
    );
    let behind = &s["sources"]["seed"]["behind"];
    assert_eq!(
        (behind["diffs"].as_u64(), behind["bytes"].as_u64()),
        (Some(0), Some(0))
    );
    assert!(s["sources"]["seed"]["data_age_seconds"].as_f64().unwrap() >= 0.0);
    let (_, m) = get(engine.addr, "/metrics").await;
    let id = s["pipelines"].as_object().unwrap().keys().next().unwrap();
    assert_eq!(
        metric(
            &m,
            &format!(r#"laredo_baseline_rows_loaded_total{{pipeline="{id}"}}"#)
        ),
        Some(5_000.0)
    );
    assert_eq!(
        metric(
            &m,
            &format!(r#"larch_engine_baseline_expected_rows{{pipeline="{id}"}}"#)
        ),
        Some(5_000.0)
    );
    assert_eq!(
        metric(&m, r#"larch_source_behind_bytes{source="seed"}"#),
        Some(0.0)
    );
    assert!(m.contains("larch_build_info{component=\"engine\""), "{m}");
    engine.stop().await.unwrap();
}

/// `# TYPE` and the label names of every sample, per metric, of one scrape.
fn families(scrape: &str) -> BTreeMap<String, (String, BTreeSet<String>)> {
    let mut out: BTreeMap<String, (String, BTreeSet<String>)> = BTreeMap::new();
    for line in scrape.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            out.entry(name.to_string()).or_default().0 = kind.to_string();
        } else if !line.starts_with('#') && !line.is_empty() {
            let name_end = line.find(['{', ' ']).unwrap();
            let sample = &line[..name_end];
            let family = out
                .keys()
                .filter(|f| sample.starts_with(f.as_str()))
                .max_by_key(|f| f.len())
                .cloned()
                .unwrap_or_else(|| panic!("sample {sample} before its # TYPE"));
            if let Some(labels) = line[name_end..].strip_prefix('{') {
                let labels = &labels[..labels.find('}').unwrap()];
                for pair in labels.split("\",") {
                    let key = pair.split('=').next().unwrap().trim_matches(',');
                    if !key.is_empty() && key != "le" && key != "quantile" {
                        out.get_mut(&family).unwrap().1.insert(key.to_string());
                    }
                }
            }
        }
    }
    out
}

/// docs/metrics.md: (component, name) → (type, labels).
fn documented() -> BTreeMap<(String, String), (String, BTreeSet<String>)> {
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md")).unwrap();
    let mut out = BTreeMap::new();
    for line in page.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let name = cells[1].trim_matches('`').to_string();
        let labels = cells[3]
            .split(',')
            .map(|l| l.trim().trim_matches('`').to_string())
            .filter(|l| !l.is_empty())
            .collect();
        let key = (cells[4].to_string(), name);
        assert!(
            out.insert(key.clone(), (cells[2].to_string(), labels))
                .is_none(),
            "docs/metrics.md lists {key:?} twice"
        );
    }
    out
}

#[tokio::test]
async fn metrics_page_lists_every_scraped_metric() {
    // A following exporter (slot, buffer and artifact metrics), an engine, the operator's
    // endpoint: real listeners, scraped over HTTP.
    let db = new_database().await;
    db.client
        .batch_execute(
            "CREATE TABLE items (id int8 PRIMARY KEY, v text);
             INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 100) g;",
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let slot = format!("larch_metrics_{}", db.name);
    let follow = Follow::start(&db, dir.path(), &slot, &["--diff-interval", "1s"]);
    follow.ready().await;
    db.client
        .batch_execute("UPDATE items SET v = 'changed' WHERE id <= 10")
        .await
        .unwrap();
    let addr = follow.addr;
    eventually(30, "a diff", || async move {
        let s = get_json(addr, "/status").await;
        (s["diffs"].as_u64().unwrap_or(0) >= 1).then_some(())
    })
    .await;
    let export_scrape = get(addr, "/metrics").await.1;

    let engine = start_engine(&memory_engine(dir.path(), "items")).await;
    wait_ready(engine.addr).await;
    let engine_scrape = get(engine.addr, "/metrics").await.1;
    engine.stop().await.unwrap();
    assert_eq!(follow.terminate(), 0);

    let operator_metrics = Arc::new(larch::operator::metrics::Metrics::default());
    operator_metrics
        .reconciles
        .with_label_values(&["archive-export"])
        .inc();
    let app = larch::operator::server::router(larch::operator::server::ServerState {
        metrics: operator_metrics,
        ready: Arc::new(std::sync::atomic::AtomicBool::new(true)),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let operator_addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let operator_scrape = get(operator_addr, "/metrics").await.1;

    let page = documented();
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for (component, scrape) in [
        ("export", &export_scrape),
        ("engine", &engine_scrape),
        ("operator", &operator_scrape),
    ] {
        assert!(
            scrape.contains(&format!(r#"component="{component}""#)),
            "{component}: no larch_build_info"
        );
        for (name, (kind, labels)) in families(scrape) {
            let doc = page
                .get(&(component.to_string(), name.clone()))
                .or_else(|| page.get(&("all".to_string(), name.clone())));
            match doc {
                None => problems.push(format!(
                    "{component} exposes {name}, not in docs/metrics.md"
                )),
                Some((k, l)) if *k != kind || *l != labels => problems.push(format!(
                    "{component} {name}: scraped {kind} {labels:?}, documented {k} {l:?}"
                )),
                Some(_) => {}
            }
            seen.insert(name);
        }
    }
    // Listed but not scraped (a labelled metric without a value yet): it must still exist.
    let sources: String = [
        "crates/run/src/export",
        "crates/run/src/engine",
        "crates/run/src/restore",
        "crates/operator/src",
        "crates/core/src/telemetry.rs",
    ]
    .iter()
    .map(|p| {
        let out = Command::new("grep")
            .args(["-rh", "_"])
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/").to_string() + p)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    })
    .collect();
    for (_, name) in page.keys() {
        if !seen.contains(name)
            && !name.starts_with("process_")
            && !sources.contains(&format!("\"{name}\""))
        {
            problems.push(format!(
                "docs/metrics.md lists {name}: no scrape has it and no code registers it"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// `--log-level` overrides `LARCH_LOG`, and `--log-format` picks JSON lines or text; both go
/// before or after the command's name. Without `--log-format`, a pipe gets JSON.
#[tokio::test]
async fn log_flags_choose_the_level_and_the_format() {
    use crate::archive_build::{TestArchive, refs, rows};
    let dir = tempfile::tempdir().unwrap();
    let store: std::sync::Arc<dyn larch::archive::store::Store> =
        std::sync::Arc::new(larch::archive::store::local::LocalStore::new(dir.path()).unwrap());
    let mut a = TestArchive::new(store, "public.t/", "public.t");
    a.snapshot("0/1", &refs(&rows(1..=1, "s"))).await;
    let config = dir.path().join("engine.yaml");
    std::fs::write(&config, crate::engine_follow::local_yaml(dir.path(), "")).unwrap();
    let run = |flags: &[&str], env_level: &str| {
        let log = dir.path().join("stderr.log");
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_larch"));
        cmd.args(flags)
            .args(["engine", "--listen", "127.0.0.1:0", "--config"])
            .arg(&config)
            .env("LARCH_LOG", env_level)
            .env_remove("LARCH_LOG_FORMAT")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        (cmd.spawn().unwrap(), log)
    };
    let lines_of = |flags: &[&str], env_level: &str| {
        let (mut child, log) = run(flags, env_level);
        // The engine logs its address at info once it serves (nothing at `error`: then the
        // wait runs out and the lines are what a quiet engine logged meanwhile).
        let wait = if env_level == "error" { 2 } else { 30 };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(wait);
        while std::time::Instant::now() < deadline
            && !std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains(larch::engine::LISTENING)
        {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        child.wait().unwrap();
        std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    // Default in a pipe: JSON lines at LARCH_LOG's level.
    let json = lines_of(&[], "info");
    assert!(!json.is_empty());
    for l in &json {
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}"));
        assert!(v["level"].is_string(), "{l}");
    }
    // The listener's address is an event like the others, its `addr` a socket address.
    assert!(
        json.iter()
            .any(|l| crate::engine_support::listening_addr(l).is_some_and(|a| a.port() != 0)),
        "{json:?}"
    );
    // --log-format text (before the command) and --log-level info over LARCH_LOG=error.
    let text = lines_of(&["--log-format", "text", "--log-level", "info"], "error");
    assert!(
        text.iter()
            .any(|l| l.contains(" INFO ") && l.contains("engine started")),
        "{text:?}"
    );
    assert!(text.iter().all(|l| !l.starts_with('{')), "{text:?}");
    assert!(
        text.iter()
            .any(|l| l.contains("larch engine listening") && l.contains("addr=127.0.0.1:")),
        "{text:?}"
    );
    // LARCH_LOG=error alone keeps the info lines out.
    let quiet = lines_of(&[], "error");
    assert!(
        quiet.iter().all(|l| !l.contains("engine started")),
        "{quiet:?}"
    );
    // A level tracing cannot read is refused before anything runs, naming the flag.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_larch"))
        .args(["crd", "--log-level", "a=b=c"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("invalid value 'a=b=c' for '--log-level"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
