//! Shared by the benchmark examples: rows shaped like `scripts/sample/events.sql` (as larch's
//! PostgreSQL mapping renders them), the process's peak RSS, the reconstruct phase every
//! benchmark measures against, and running a phase in a child process (its own peak RSS).

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use larch::archive::format::Format;
use larch::archive::reader::ArchiveReader;
use larch::archive::store::local::LocalStore;

/// `ArchiveReader::reconstruct` of the benchmark archive at the head, as a JSON line: rows,
/// seconds, the folded state's JSON size and the peak RSS.
pub async fn phase_reconstruct(dir: &Path) -> String {
    let store = Arc::new(LocalStore::new(dir).unwrap());
    let reader = ArchiveReader::new(store, "public.events/", vec![Format::Jsonl]).unwrap();
    let started = Instant::now();
    let (_, folded) = reader.reconstruct_at(None, &[]).await.unwrap();
    let secs = started.elapsed().as_secs_f64();
    let state_json: u64 = folded
        .rows
        .values()
        .map(|r| r.as_str().len() as u64 + 1)
        .sum::<u64>()
        + 2;
    format!(
        "{{\"phase\":\"reconstruct\",\"rows\":{},\"seconds\":{secs},\"state_json_bytes\":{state_json},\"peak_rss_kib\":{}}}",
        folded.rows.len(),
        peak_rss_kib()
    )
}

/// Runs this executable with `args` and `dir`; returns the JSON line it prints.
pub fn run_child(args: &[&str], dir: &Path) -> serde_json::Value {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(args)
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

pub fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// One row of `public.events` as larch's PostgreSQL mapping renders it.
pub fn event_row(g: u64) -> String {
    let kind = match g % 3 {
        0 => "\"click\"",
        1 => "\"view\"",
        _ => "null",
    };
    let md5 = format!(
        "{:032x}",
        (g as u128).wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835)
    );
    let uuid = format!(
        "{}-{}-{}-{}-{}",
        &md5[0..8],
        &md5[8..12],
        &md5[12..16],
        &md5[16..20],
        &md5[20..32]
    );
    let secs = g;
    let ts = format!(
        "2026-01-{:02}T{:02}:{:02}:{:02}Z",
        1 + (secs / 86400) % 28,
        (secs / 3600) % 24,
        (secs / 60) % 60,
        secs % 60
    );
    format!(
        r#"{{"amount":{}.{:02},"blob":"{}","created_at":"{}","flag":{},"id":{},"kind":{},"payload":{{"n":{},"nested":{{"ok":{}}},"s":"{}"}},"ref":"{}","tags":["a{}","b{}"],"tenant":"tenant-{}"}}"#,
        (g % 10000) / 100,
        (g % 10000) % 100,
        &md5[0..12],
        ts,
        g.is_multiple_of(2),
        g,
        kind,
        g,
        g.is_multiple_of(2),
        md5,
        uuid,
        g % 7,
        g % 11,
        g % 100
    )
}
