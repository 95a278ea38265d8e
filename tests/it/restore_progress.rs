//! `larch restore` reports its progress (issue 41): in a pipe, log lines with the counts every
//! `LARCH_PROGRESS_INTERVAL` and at the end, and `/status` and `/metrics` on `--listen` while it
//! copies; on a terminal (a pty), one bar per table redrawn in place, fitting the terminal's
//! width, with human rates, and JSON log lines written whole between the bars' frames.

// The pause point holds the restore open long enough to read its progress.
#![cfg(feature = "crashpoints")]

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use larch::locks::MutexExt;
use serde_json::Value;

use crate::engine_support::{eventually, get, get_json, metric};
use crate::support::postgres::{Database, new_database};

const EVENTS: u64 = 30_000;
const ITEMS: u64 = 500;

/// `events` (30 000 rows) and `items` (500), each exported to the local archive at `archive`:
/// the source and the position of the last export (where both tables have a snapshot).
async fn exported_tables(archive: &Path) -> (Database, String) {
    let db = new_database().await;
    db.client
        .batch_execute(&format!(
            "CREATE TABLE events (id int8 PRIMARY KEY, body text);
             INSERT INTO events SELECT g, repeat('x', 40) || g FROM generate_series(1, {EVENTS}) g;
             CREATE TABLE items (id int4 PRIMARY KEY, name text);
             INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, {ITEMS}) g;"
        ))
        .await
        .unwrap();
    let mut position = String::new();
    for table in ["events", "items"] {
        let out = Command::new(env!("CARGO_BIN_EXE_larch"))
            .env("LARCH_PG_DSN", &db.dsn)
            .env("LARCH_LOG", "warn")
            .args(["export", "--table", table, "--store", "local", "--path"])
            .arg(archive)
            .args(["--slot", &format!("larch_rp_{}_{table}", db.name)])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
        position = summary["position"].as_str().unwrap().to_string();
    }
    (db, position)
}

/// `larch restore` of both tables into `target`, paused 3 s after 10 000 rows of `events`.
fn restore_command(target: &Database, archive: &Path, at: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_larch"));
    c.env("LARCH_PG_DSN", &target.dsn)
        .env("LARCH_PAUSE_AT", "restore.rows=3000")
        .env("LARCH_PROGRESS_INTERVAL", "500ms")
        .args([
            "restore",
            "--table",
            "events,items",
            "--at",
            at,
            "--store",
            "local",
        ])
        .arg("--path")
        .arg(archive)
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    c
}

fn progress_lines(log: &str, table: &str, stage: &str) -> Vec<Value> {
    let prefix = format!("restore of {table} {stage}");
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| {
            l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with(&prefix))
        })
        .collect()
}

#[tokio::test]
async fn a_restore_in_a_pipe_logs_and_serves_its_progress_per_table() {
    let dir = tempfile::tempdir().unwrap();
    let (_source, at) = exported_tables(dir.path()).await;
    let target = new_database().await;
    let mut child = restore_command(&target, dir.path(), &at)
        .args(["--listen", "127.0.0.1:0"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let (addr_tx, addr_rx) = std::sync::mpsc::channel::<SocketAddr>();
    let reader = {
        let lines = lines.clone();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(at) = line.find("status on http://") {
                    let rest = &line[at + "status on http://".len()..];
                    let addr = rest.split('"').next().unwrap();
                    let _ = addr_tx.send(addr.parse().unwrap());
                }
                lines.locked().push(line);
            }
        })
    };
    let addr = addr_rx
        .recv_timeout(std::time::Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("no listener line in:\n{}", lines.locked().join("\n")));
    let during = eventually(30, "10 000 rows of events restored", || async {
        let s = get_json(addr, "/status").await;
        (s["tables"][0]["rows"].as_u64().unwrap_or(0) >= 10_000).then_some(s)
    })
    .await;
    assert_eq!(during["state"], "RESTORING", "{during}");
    let events = &during["tables"][0];
    assert_eq!(events["subject"], "public.events");
    assert_eq!(events["operation"], "restore");
    // The snapshot's row_count: exact, as the archive has no diff.
    assert_eq!(events["total_rows"], EVENTS, "{during}");
    assert_eq!(events["done"], false);
    assert!(
        events["rows"].as_u64().unwrap() < EVENTS,
        "paused: {during}"
    );
    assert!(events["bytes"].as_u64().unwrap() > 10_000 * 40, "{during}");
    assert_eq!(during["tables"][1]["rows"], 0, "items waits its turn");
    let whole = &during["progress"];
    assert_eq!(whole["subject"], "2 tables");
    assert_eq!(whole["total_rows"], EVENTS + ITEMS);
    assert_eq!(whole["rows"], events["rows"]);
    let (code, metrics) = get(addr, "/metrics").await;
    assert_eq!(code, 200);
    let copied = metric(
        &metrics,
        r#"larch_restore_rows_total{table="public.events"}"#,
    )
    .expect("the rows counter while restoring");
    assert!(copied >= 10_000.0 && copied < EVENTS as f64, "{copied}");
    assert_eq!(
        metric(
            &metrics,
            r#"larch_restore_expected_rows{table="public.items"}"#
        ),
        Some(ITEMS as f64)
    );

    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    reader.join().unwrap();
    let log = lines.locked().join("\n");
    assert!(status.success(), "{log}");
    // Held 3 s, logging every 500 ms: several lines while it copies, with the counts.
    let running = progress_lines(&log, "public.events", "in progress");
    assert!(running.len() >= 2, "{log}");
    assert!(running.iter().all(|l| l["fields"]["total_rows"] == EVENTS));
    let rows: Vec<u64> = running
        .iter()
        .map(|l| l["fields"]["rows"].as_u64().unwrap())
        .collect();
    assert!(rows.iter().all(|r| *r >= 10_000), "{rows:?}");
    for (table, n) in [("public.events", EVENTS), ("public.items", ITEMS)] {
        let done = progress_lines(&log, table, "done");
        assert_eq!(done.len(), 1, "one final line for {table}:\n{log}");
        assert_eq!(done[0]["fields"]["rows"], n, "{}", done[0]);
        let message = done[0]["fields"]["message"].as_str().unwrap();
        assert!(message.contains(" rows/s"), "{message}");
    }
}

/// A pty of `cols` columns: (the parent's side, the child's side).
fn pty(cols: u16) -> (std::fs::File, OwnedFd) {
    let (mut parent, mut child) = (0, 0);
    let size = libc::winsize {
        ws_row: 40,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: openpty writes two fds it opened into the pointers it is given.
    let rc = unsafe {
        libc::openpty(
            &mut parent,
            &mut child,
            std::ptr::null_mut(),
            std::ptr::null(),
            &size,
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both fds are ours alone from here.
    unsafe {
        (
            std::fs::File::from_raw_fd(parent),
            OwnedFd::from_raw_fd(child),
        )
    }
}

/// What a terminal shows of `raw`: every frame and line, escape sequences removed, each piece
/// between a `\r` or `\n` on its own.
fn frames(raw: &str) -> Vec<String> {
    let escapes = regex::Regex::new(r"\x1b\[[0-9;?]*[A-Za-z]").unwrap();
    escapes
        .replace_all(raw, "\n")
        .split(['\r', '\n'])
        .map(str::to_string)
        .filter(|f| !f.trim().is_empty())
        .collect()
}

#[tokio::test]
async fn a_restore_on_a_terminal_draws_one_fitting_bar_per_table_and_whole_log_lines() {
    let dir = tempfile::tempdir().unwrap();
    let (_source, at) = exported_tables(dir.path()).await;
    let target = new_database().await;
    const COLS: u16 = 100;
    let (mut terminal, child_side) = pty(COLS);
    let mut child = restore_command(&target, dir.path(), &at)
        // JSON lines on a terminal: the format whose torn lines the issue reported.
        .env("LARCH_LOG_FORMAT", "json")
        .stderr(Stdio::from(child_side))
        .spawn()
        .unwrap();
    // Read to the end: EIO once the child (the last holder of its side) exits.
    let screen = std::thread::spawn(move || {
        let mut raw = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = terminal.read(&mut buf) {
            if n == 0 {
                break;
            }
            raw.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&raw).into_owned()
    });
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    let status = child.wait().unwrap();
    let raw = screen.join().unwrap();
    assert!(status.success(), "{raw}");
    let summary: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(summary["tables"][0]["rows"], EVENTS);
    let frames = frames(&raw);
    let bars: Vec<&String> = frames
        .iter()
        .filter(|f| f.starts_with("restore of public.events ["))
        .collect();
    // Paused 3 s at 10 000 rows, redrawn every 200 ms.
    assert!(bars.len() >= 5, "{frames:#?}");
    let paused = bars
        .iter()
        .find(|f| f.contains("/~30.0k rows 33%"))
        .unwrap_or_else(|| panic!("no frame at 10 000 of 30 000 rows: {bars:#?}"));
    assert!(
        regex::Regex::new(
            r"\] 10\.0k/~30\.0k rows 33% [0-9.]+k? rows/s [0-9.]+ (B|KiB|MiB)/s ETA "
        )
        .unwrap()
        .is_match(paused),
        "{paused}"
    );
    assert!(
        frames
            .iter()
            .any(|f| f.starts_with("restore of public.items")),
        "a line of its own for the second table: {frames:#?}"
    );
    // Redrawn in place: many frames, few of them on lines of their own.
    let bar_lines = raw
        .split('\n')
        .filter(|l| l.contains("restore of public.events ["))
        .count();
    assert!(
        bar_lines < bars.len(),
        "{bar_lines} lines, {} frames",
        bars.len()
    );
    // indicatif fills the rest of the line with spaces (that do not wrap).
    for f in frames.iter().filter(|f| f.starts_with("restore of")) {
        assert!(
            f.trim_end().chars().count() < COLS as usize,
            "wider than the terminal: {f:?}"
        );
        assert!(!f.contains("0/0") && !f.contains("ETA 0s ("), "{f:?}");
    }
    // Every log line whole, from its first column: never torn by a frame.
    let logged: Vec<&String> = frames.iter().filter(|f| f.contains("{\"")).collect();
    assert!(!logged.is_empty(), "{frames:#?}");
    for line in &logged {
        assert!(
            serde_json::from_str::<Value>(line).is_ok(),
            "a torn log line: {line:?}\n{raw:?}"
        );
    }
    assert!(
        logged
            .iter()
            .any(|l| l.contains("restore of public.events done")),
        "{logged:#?}"
    );
}
