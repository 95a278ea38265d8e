//! Benchmark: the engine's baseline of a 1M-row archive shaped like `scripts/sample/events.sql`
//! into a memory target (time, peak RSS), next to `ArchiveReader::reconstruct` on the same
//! archive in the same run; then the follow latency from a diff's commit to the row being
//! visible through the HTTP API (p50/p99) at `poll_interval: 1s`.
//!
//! `cargo run --release --example bench_engine -- [ROWS] [SAMPLES]` (defaults 1,000,000 and 40).
//! Each phase runs in its own child process so its peak RSS (VmHWM) is its own.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use larch::archive::format::Format;
use larch::archive::model::{Action, ColumnDefinition};
use larch::archive::store::Store;
use larch::archive::store::local::LocalStore;
use larch::archive::value::Row;
use larch::archive::writer::{ArchiveWriter, FlushOutcome, WriterConfig};
use larch::engine::config::EngineConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

// The allocator of the shipped `larch` binary (src/main.rs), so the figures are the engine's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "common/bench.rs"]
mod bench;
use bench::{event_row, peak_rss_kib, phase_reconstruct, run_child};

fn writer_config() -> WriterConfig {
    let mut c = WriterConfig::new("public.events", "public.events/");
    c.snapshot_formats = vec![Format::Jsonl];
    c.diff_formats = vec![Format::Jsonl];
    c
}

async fn generate(dir: &Path, rows: u64) {
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir).unwrap());
    let mut w = ArchiveWriter::open(vec![store], writer_config())
        .await
        .unwrap();
    // Every column of events.sql: the engine refuses index fields that are not columns.
    let columns = [
        ("id", "int8"),
        ("tenant", "text"),
        ("kind", "text"),
        ("amount", "numeric"),
        ("payload", "jsonb"),
        ("created_at", "timestamptz"),
        ("tags", "_text"),
        ("flag", "bool"),
        ("ref", "uuid"),
        ("blob", "bytea"),
    ];
    w.set_columns(
        columns
            .iter()
            .enumerate()
            .map(|(i, (name, type_name))| ColumnDefinition {
                name: name.to_string(),
                type_name: type_name.to_string(),
                primary_key: i == 0,
                primary_key_ordinal: if i == 0 { 1 } else { 0 },
                ordinal_position: i as i64 + 1,
                ..Default::default()
            })
            .collect(),
    );
    let (tx, rx) = tokio::sync::mpsc::channel(4096);
    let producer = tokio::spawn(async move {
        for g in 1..=rows {
            tx.send(Row::parse(&event_row(g)).unwrap()).await.unwrap();
        }
    });
    w.write_snapshot("0/10000000", rx).await.unwrap();
    producer.await.unwrap();
    // Three diffs touching 1% of the rows each.
    for d in 0..3u64 {
        for g in (1..=rows).step_by(100) {
            w.record(
                Action::Update,
                None,
                Some(Row::parse(&event_row(g + d).replace("tenant-", "tenant-u")).unwrap()),
            )
            .unwrap();
        }
        w.flush(&format!("0/{:08X}", 0x1000_0000 + d + 1))
            .await
            .unwrap();
    }
}

async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8(buf).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    (
        head.split(' ').nth(1).unwrap().parse().unwrap(),
        body.to_string(),
    )
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn phase_engine(dir: &Path, samples: usize) -> String {
    let yaml = format!(
        r#"
sources:
  seed:
    type: archive
    store: {{type: local, path: "{}"}}
    key_prefix: public.events/
    follow: true
    poll_interval: 1s
tables:
  - source: seed
    schema: public
    table: events
    targets:
      - type: memory
        index_fields: [tenant]
"#,
        dir.display()
    );
    let config = EngineConfig::parse("bench.yaml", &yaml).unwrap();
    let started = Instant::now();
    let engine = larch::engine::start(&config, "127.0.0.1:0").await.unwrap();
    while !engine.shared.ready() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let baseline_secs = started.elapsed().as_secs_f64();
    let baseline_rss = peak_rss_kib();
    let addr = engine.addr;
    let (_, tables) = http_get(addr, "/tables").await;
    let v: serde_json::Value = serde_json::from_str(&tables).unwrap();
    let rows = v["tables"][0]["row_count"].as_u64().unwrap();

    // Follow latency: commit a one-row diff at a random phase of the poll cycle, then poll the
    // row through the HTTP API until the new value is visible.
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir).unwrap());
    let mut w = ArchiveWriter::open(vec![store], writer_config())
        .await
        .unwrap();
    let mut lat = Vec::with_capacity(samples);
    for i in 0..samples {
        tokio::time::sleep(Duration::from_millis(rand::random_range(0..1000))).await;
        let id = (i as u64 * 7919) % rows.max(1) + 1;
        let marker = format!("bench-{i}");
        let row = event_row(id).replace("\"tenant-", &format!("\"{marker}-"));
        w.record(Action::Update, None, Some(Row::parse(&row).unwrap()))
            .unwrap();
        let out = w
            .flush(&format!("0/{:08X}", 0x2000_0000 + i as u64))
            .await
            .unwrap();
        assert!(matches!(out, FlushOutcome::Diff { .. }), "{out:?}");
        let committed = Instant::now();
        let path = format!("/tables/public.events/row?id={id}");
        loop {
            let (status, body) = http_get(addr, &path).await;
            if status == 200 && body.contains(&marker) {
                break;
            }
            assert!(
                committed.elapsed() < Duration::from_secs(30),
                "row {id} never showed {marker}"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        lat.push(committed.elapsed().as_secs_f64() * 1000.0);
    }
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
    engine.stop().await.unwrap();
    format!(
        "{{\"phase\":\"engine\",\"rows\":{rows},\"baseline_seconds\":{baseline_secs},\"peak_rss_kib\":{baseline_rss},\"follow_p50_ms\":{},\"follow_p99_ms\":{},\"follow_max_ms\":{},\"samples\":{}}}",
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        lat.last().copied().unwrap_or(0.0),
        lat.len()
    )
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--phase") {
        let line = match args[2].as_str() {
            "reconstruct" => phase_reconstruct(&PathBuf::from(&args[3])).await,
            _ => phase_engine(&PathBuf::from(&args[4]), args[3].parse().unwrap()).await,
        };
        println!("{line}");
        return;
    }
    let rows: u64 = args
        .get(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let samples: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(40);
    // LARCH_BENCH_DIR keeps the generated archive (for profiling a phase:
    // `bench_engine --phase engine 0 DIR`); by default it lives in a temporary directory.
    let tmp = tempfile::tempdir().unwrap();
    let dir = std::env::var_os("LARCH_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| tmp.path().to_path_buf());
    eprint!("generating {rows} rows ... ");
    let started = Instant::now();
    let _ = std::fs::remove_dir_all(dir.join("public.events"));
    generate(&dir, rows).await;
    eprintln!("{:.1}s", started.elapsed().as_secs_f64());
    let rec = run_child(&["--phase", "reconstruct"], &dir);
    let s = samples.to_string();
    let eng = run_child(&["--phase", "engine", &s], &dir);
    let mib = |kib: &serde_json::Value| kib.as_f64().unwrap() / 1024.0;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "archive: {rows} rows (events.sql shape), snapshot + 3 diffs"
    )
    .unwrap();
    writeln!(
        out,
        "ArchiveReader::reconstruct  : {:>7.3} s  peak RSS {:>7.1} MiB  ({} rows)",
        rec["seconds"].as_f64().unwrap(),
        mib(&rec["peak_rss_kib"]),
        rec["rows"]
    )
    .unwrap();
    writeln!(
        out,
        "engine baseline → memory    : {:>7.3} s  peak RSS {:>7.1} MiB  ({} rows, index on tenant, start to ready)",
        eng["baseline_seconds"].as_f64().unwrap(),
        mib(&eng["peak_rss_kib"]),
        eng["rows"]
    )
    .unwrap();
    let state_mib = rec["state_json_bytes"].as_f64().unwrap() / 1048576.0;
    writeln!(
        out,
        "engine peak RSS / folded state as JSON ({state_mib:.1} MiB): {:.2} (target <= 1.2); \
         engine baseline / reconstruct time: {:.2}",
        mib(&eng["peak_rss_kib"]) / state_mib,
        eng["baseline_seconds"].as_f64().unwrap() / rec["seconds"].as_f64().unwrap()
    )
    .unwrap();
    writeln!(
        out,
        "follow latency, commit → visible over HTTP (poll_interval 1s, {} samples): p50 {:.0} ms  p99 {:.0} ms  max {:.0} ms",
        eng["samples"],
        eng["follow_p50_ms"].as_f64().unwrap(),
        eng["follow_p99_ms"].as_f64().unwrap(),
        eng["follow_max_ms"].as_f64().unwrap()
    )
    .unwrap();
}
