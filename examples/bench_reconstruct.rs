//! Benchmark: reconstruct a 1M-row JSONL archive shaped like `scripts/sample/events.sql`, next to
//! the time serde_json takes only to parse the same bytes, in the same run.
//!
//! `cargo run --release --example bench_reconstruct -- [ROWS]` (default 1,000,000). Each phase
//! runs in its own child process so its peak RSS (VmHWM) is its own.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use larch::archive::format::Format;
use larch::archive::model::{Action, ColumnDefinition};
use larch::archive::store::local::LocalStore;
use larch::archive::value::Row;
use larch::archive::writer::{ArchiveWriter, WriterConfig};

#[path = "common/bench.rs"]
mod bench;
use bench::{event_row, peak_rss_kib, phase_reconstruct, run_child};

fn columns() -> Vec<ColumnDefinition> {
    vec![ColumnDefinition {
        name: "id".into(),
        type_name: "int8".into(),
        primary_key: true,
        primary_key_ordinal: 1,
        ordinal_position: 1,
        ..Default::default()
    }]
}

async fn generate(dir: &Path, rows: u64) {
    let store = Arc::new(LocalStore::new(dir).unwrap());
    let mut c = WriterConfig::new("public.events", "public.events/");
    c.snapshot_formats = vec![Format::Jsonl];
    c.diff_formats = vec![Format::Jsonl];
    let mut w = ArchiveWriter::open(vec![store], c).await.unwrap();
    w.set_columns(columns());
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
            let id = g + d;
            w.record(
                Action::Update,
                None,
                Some(Row::parse(&event_row(id).replace("tenant-", "tenant-u")).unwrap()),
            )
            .unwrap();
        }
        w.flush(&format!("0/{:08X}", 0x1000_0000 + d + 1))
            .await
            .unwrap();
    }
}

fn snapshot_file(dir: &Path) -> PathBuf {
    dir.join("public.events/epoch=1/snapshot-0_10000000.jsonl")
}

fn phase_parse(dir: &Path) -> String {
    let started = Instant::now();
    let mut n = 0u64;
    let mut bytes = 0u64;
    let mut files = vec![snapshot_file(dir)];
    for e in std::fs::read_dir(dir.join("public.events/epoch=1")).unwrap() {
        let p = e.unwrap().path();
        if p.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("diff-")
        {
            files.push(p);
        }
    }
    for f in files {
        let r = std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(f).unwrap());
        for line in r.lines() {
            let line = line.unwrap();
            bytes += line.len() as u64 + 1;
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            n += u64::from(v.is_object());
        }
    }
    let secs = started.elapsed().as_secs_f64();
    format!(
        "{{\"phase\":\"parse\",\"records\":{n},\"bytes\":{bytes},\"seconds\":{secs},\"peak_rss_kib\":{}}}",
        peak_rss_kib()
    )
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--phase") {
        let dir = PathBuf::from(&args[3]);
        let line = match args[2].as_str() {
            "parse" => phase_parse(&dir),
            _ => phase_reconstruct(&dir).await,
        };
        println!("{line}");
        return;
    }
    let rows: u64 = args
        .get(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let tmp = tempfile::tempdir().unwrap();
    eprint!("generating {rows} rows ... ");
    let started = Instant::now();
    generate(tmp.path(), rows).await;
    eprintln!("{:.1}s", started.elapsed().as_secs_f64());
    let parse = run_child(&["--phase", "parse"], tmp.path());
    let rec = run_child(&["--phase", "reconstruct"], tmp.path());
    let ps = parse["seconds"].as_f64().unwrap();
    let rs = rec["seconds"].as_f64().unwrap();
    let state = rec["state_json_bytes"].as_f64().unwrap();
    let rss = rec["peak_rss_kib"].as_f64().unwrap() * 1024.0;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "archive: {} rows, snapshot + 3 diffs, {:.1} MiB of JSONL",
        rows,
        parse["bytes"].as_f64().unwrap() / 1048576.0
    )
    .unwrap();
    writeln!(
        out,
        "serde_json parse only : {ps:>7.3} s  {:>10.0} records/s  peak RSS {:>7.1} MiB",
        parse["records"].as_f64().unwrap() / ps,
        parse["peak_rss_kib"].as_f64().unwrap() / 1024.0
    )
    .unwrap();
    writeln!(
        out,
        "larch reconstruct     : {rs:>7.3} s  {:>10.0} rows/s     peak RSS {:>7.1} MiB",
        rec["rows"].as_f64().unwrap() / rs,
        rss / 1048576.0
    )
    .unwrap();
    writeln!(
        out,
        "ratio reconstruct/parse: {:.2} (target <= 1.5)",
        rs / ps
    )
    .unwrap();
    writeln!(
        out,
        "peak RSS / folded state JSON ({:.1} MiB): {:.2} (target <= 2.0)",
        state / 1048576.0,
        rss / state
    )
    .unwrap();
}
