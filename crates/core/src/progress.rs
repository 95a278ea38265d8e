//! Progress of a long operation (an export's baseline, an engine's baseline, a compaction): a
//! counter its loop bumps, read by `/status`, metrics, a log line at a steady cadence and, on a
//! terminal, an interactive bar.

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;

use crate::progress_line as line;

/// How often the log line is written while an operation runs.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

const UNKNOWN: u64 = u64::MAX;

/// Counters of one running operation. Cheap to bump from a hot loop (relaxed atomics).
#[derive(Debug)]
pub struct Progress {
    operation: &'static str,
    subject: String,
    rows: AtomicU64,
    bytes: AtomicU64,
    total_rows: AtomicU64,
    started: Instant,
    started_at: DateTime<Utc>,
    /// Elapsed milliseconds once finished (the figures stop moving).
    finished_ms: AtomicU64,
    done: AtomicBool,
}

/// What `/status` shows of an operation, and what the log line and the CR say.
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct ProgressReport {
    /// `baseline` (an export's copy from PostgreSQL, an engine's load of the archive) or
    /// `compaction` (an export folding its archive into a new epoch).
    pub operation: String,
    /// The table (or source) it works on.
    pub subject: String,
    pub rows: u64,
    /// Bytes read so far (the rows' JSON text), where the operation counts them.
    pub bytes: u64,
    /// The rows expected in all: the catalog's estimate (`pg_class.reltuples`) for an export,
    /// the manifest's `row_count` for an engine or a compaction. Absent when unknown.
    pub total_rows: Option<u64>,
    /// `rows / total_rows`, in percent, at most 100 (an estimate may be low).
    pub percent: Option<f64>,
    pub rows_per_second: f64,
    pub bytes_per_second: f64,
    /// Seconds left at the rate so far; absent without a total, before the first row, or once
    /// the rows exceed a (low) estimate.
    pub eta_seconds: Option<f64>,
    pub elapsed_seconds: f64,
    /// RFC 3339 UTC.
    pub started_at: String,
    pub done: bool,
}

impl Progress {
    pub fn new(operation: &'static str, subject: impl Into<String>) -> Arc<Progress> {
        Arc::new(Progress {
            operation,
            subject: subject.into(),
            rows: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            total_rows: AtomicU64::new(UNKNOWN),
            started: Instant::now(),
            started_at: Utc::now(),
            finished_ms: AtomicU64::new(0),
            done: AtomicBool::new(false),
        })
    }

    pub fn operation(&self) -> &'static str {
        self.operation
    }

    pub fn set_total(&self, rows: Option<u64>) {
        self.total_rows
            .store(rows.unwrap_or(UNKNOWN), Ordering::Relaxed);
    }

    pub fn total(&self) -> Option<u64> {
        match self.total_rows.load(Ordering::Relaxed) {
            UNKNOWN => None,
            t => Some(t),
        }
    }

    /// `rows` more rows, of `bytes` bytes in all.
    pub fn add(&self, rows: u64, bytes: u64) {
        self.rows.fetch_add(rows, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn rows(&self) -> u64 {
        self.rows.load(Ordering::Relaxed)
    }

    /// Freezes the figures: the operation ended (successfully or not).
    pub fn finish(&self) {
        if !self.done.swap(true, Ordering::SeqCst) {
            let ms = self.started.elapsed().as_millis().max(1) as u64;
            self.finished_ms.store(ms, Ordering::SeqCst);
        }
    }

    pub fn report(&self) -> ProgressReport {
        let done = self.done.load(Ordering::SeqCst);
        let elapsed = if done {
            Duration::from_millis(self.finished_ms.load(Ordering::SeqCst))
        } else {
            self.started.elapsed()
        };
        let mut r = compute(
            self.rows(),
            self.bytes.load(Ordering::Relaxed),
            self.total(),
            elapsed,
        );
        r.operation = self.operation.to_string();
        r.subject = self.subject.clone();
        r.started_at = self.started_at.to_rfc3339_opts(SecondsFormat::Secs, true);
        r.done = done;
        if done {
            r.eta_seconds = Some(0.0);
        }
        r
    }
}

/// The arithmetic of a report: rates over the elapsed time, percent and ETA against the total.
pub fn compute(rows: u64, bytes: u64, total: Option<u64>, elapsed: Duration) -> ProgressReport {
    let secs = elapsed.as_secs_f64();
    let rate = |n: u64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
    let rows_per_second = rate(rows);
    let percent = total
        .filter(|t| *t > 0)
        .map(|t| (rows as f64 / t as f64 * 100.0).min(100.0));
    let eta_seconds = match total {
        Some(t) if rows < t && rows_per_second > 0.0 => Some((t - rows) as f64 / rows_per_second),
        Some(t) if rows == t && t > 0 => Some(0.0),
        _ => None,
    };
    ProgressReport {
        rows,
        bytes,
        total_rows: total,
        percent,
        rows_per_second,
        bytes_per_second: rate(bytes),
        eta_seconds,
        elapsed_seconds: secs,
        ..Default::default()
    }
}

/// A short human rendering for the log:
/// `120000 of ~200000 rows (60.0%), 3.0 MiB, 40.0k rows/s, 1.0 MiB/s in 3.0s, ETA 2s`.
pub fn describe(r: &ProgressReport) -> String {
    let mut s = format!("{} ", r.rows);
    if let Some(t) = r.total_rows {
        s.push_str(&format!("of ~{t} "));
    }
    s.push_str("rows");
    if let Some(p) = r.percent {
        s.push_str(&format!(" ({p:.1}%)"));
    }
    if r.bytes > 0 {
        s.push_str(&format!(", {}", crate::units::format_bytes(r.bytes)));
    }
    s.push_str(&format!(", {}", line::rows_rate(r.rows_per_second)));
    if r.bytes > 0 {
        s.push_str(&format!(", {}", line::bytes_rate(r.bytes_per_second)));
    }
    s.push_str(&format!(" in {:.1}s", r.elapsed_seconds));
    if !r.done
        && let Some(eta) = r.eta_seconds
    {
        s.push_str(&format!(", ETA {}", line::format_seconds(eta)));
    }
    s
}

/// Every bar of the process, one line each: operations running at once (the tables of a
/// multi-table export or restore) never draw over each other.
static BARS: std::sync::LazyLock<indicatif::MultiProgress> = std::sync::LazyLock::new(|| {
    indicatif::MultiProgress::with_draw_target(indicatif::ProgressDrawTarget::stderr())
});

/// Runs `write` (a log line to stderr) with the bars cleared, then draws them again: a line
/// written while bars are shown does not tear them.
pub fn suspend_bars<R>(write: impl FnOnce() -> R) -> R {
    BARS.suspend(write)
}

/// Reports an operation while it runs: a log line every [`LOG_EVERY`] (and one at the end, with
/// the totals and the rate), and a bar on stderr when it is a terminal. Stops when dropped.
pub struct Reporter {
    progress: Arc<Progress>,
    task: tokio::task::JoinHandle<()>,
    bar: Option<indicatif::ProgressBar>,
}

impl Reporter {
    /// Logs every `LARCH_PROGRESS_INTERVAL` (a duration, `10s` by default).
    pub fn start(progress: Arc<Progress>) -> Reporter {
        Reporter::start_every(progress, log_interval())
    }

    pub fn start_every(progress: Arc<Progress>, every: Duration) -> Reporter {
        let bar = std::io::stderr().is_terminal().then(|| bar_for(&progress));
        let p = progress.clone();
        let b = bar.clone();
        let task = tokio::spawn(async move {
            let tick = if b.is_some() {
                Duration::from_millis(200)
            } else {
                every
            };
            let mut last_log = Instant::now();
            loop {
                tokio::time::sleep(tick).await;
                let r = p.report();
                if let Some(bar) = &b {
                    update_bar(bar, &r);
                }
                if last_log.elapsed() >= every {
                    last_log = Instant::now();
                    log(&r, "in progress");
                }
            }
        });
        Reporter {
            progress,
            task,
            bar,
        }
    }

    /// The operation ended: the final line, with the totals and the rate.
    pub fn finish(self, succeeded: bool) {
        self.progress.finish();
        let r = self.progress.report();
        if let Some(bar) = &self.bar {
            update_bar(bar, &r);
            bar.finish_and_clear();
            remove_bar(bar);
        }
        log(&r, if succeeded { "done" } else { "failed" });
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(bar) = &self.bar
            && !bar.is_finished()
        {
            bar.finish_and_clear();
            remove_bar(bar);
        }
    }
}

/// `LARCH_PROGRESS_INTERVAL`, else [`LOG_EVERY`] (also when it does not parse: progress is
/// not worth failing a run for, the warning says why).
pub fn log_interval() -> Duration {
    match std::env::var("LARCH_PROGRESS_INTERVAL") {
        Ok(text) => crate::duration::parse_positive(&text).unwrap_or_else(|e| {
            tracing::warn!("LARCH_PROGRESS_INTERVAL {text:?}: {e}; logging progress every 10s");
            LOG_EVERY
        }),
        Err(_) => LOG_EVERY,
    }
}

fn log(r: &ProgressReport, stage: &str) {
    tracing::info!(
        operation = %r.operation,
        subject = %r.subject,
        rows = r.rows,
        bytes = r.bytes,
        total_rows = r.total_rows,
        rows_per_second = r.rows_per_second.round(),
        eta_seconds = r.eta_seconds.map(f64::round),
        "{} of {} {stage}: {}",
        r.operation,
        r.subject,
        describe(r)
    );
}

fn bar_for(p: &Progress) -> indicatif::ProgressBar {
    let bar = BARS.add(indicatif::ProgressBar::hidden());
    bar.set_style(indicatif::ProgressStyle::with_template("{msg}").expect("a valid template"));
    bar.set_prefix(format!("{} of {}", p.operation, p.subject));
    update_bar(&bar, &p.report());
    bar
}

/// The bar's line, rendered whole so it fits the terminal (indicatif's `{per_sec}` and
/// `{len}` would print `254457.6876/s` and `0/0` before the first row).
fn update_bar(bar: &indicatif::ProgressBar, r: &ProgressReport) {
    bar.set_message(line::render(&bar.prefix(), r, line::stderr_width()));
}

fn remove_bar(bar: &indicatif::ProgressBar) {
    BARS.remove(bar);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_percent_and_eta_from_the_rows_so_far() {
        let r = compute(50_000, 5_000_000, Some(200_000), Duration::from_secs(10));
        assert_eq!(r.rows_per_second, 5_000.0);
        assert_eq!(r.bytes_per_second, 500_000.0);
        assert_eq!(r.percent, Some(25.0));
        // 150 000 rows left at 5 000 rows/s.
        assert_eq!(r.eta_seconds, Some(30.0));
    }

    #[test]
    fn a_low_estimate_caps_at_100_percent_without_an_eta() {
        // reltuples is an estimate: the copy may find more rows than it said.
        let r = compute(1_200, 0, Some(1_000), Duration::from_secs(2));
        assert_eq!(r.percent, Some(100.0));
        assert_eq!(r.eta_seconds, None);
        assert_eq!(r.rows_per_second, 600.0);
    }

    #[test]
    fn no_total_or_no_rows_yet_gives_no_eta() {
        let unknown = compute(10, 0, None, Duration::from_secs(1));
        assert_eq!((unknown.percent, unknown.eta_seconds), (None, None));
        let not_started = compute(0, 0, Some(100), Duration::from_secs(3));
        assert_eq!(not_started.percent, Some(0.0));
        assert_eq!(not_started.eta_seconds, None);
        // An empty table (reltuples 0): no percent rather than a division by zero.
        let empty = compute(0, 0, Some(0), Duration::from_secs(1));
        assert_eq!((empty.percent, empty.eta_seconds), (None, None));
        let instant = compute(5, 5, Some(10), Duration::ZERO);
        assert_eq!((instant.rows_per_second, instant.eta_seconds), (0.0, None));
    }

    #[test]
    fn finishing_freezes_the_figures() {
        let p = Progress::new("baseline", "public.t");
        p.set_total(Some(4));
        p.add(3, 30);
        p.add(1, 10);
        p.finish();
        let a = p.report();
        std::thread::sleep(Duration::from_millis(20));
        let b = p.report();
        assert_eq!(a, b, "a finished operation's report does not move");
        assert!(a.done);
        assert_eq!((a.rows, a.bytes, a.percent), (4, 40, Some(100.0)));
        assert_eq!(a.eta_seconds, Some(0.0));
        assert!(a.elapsed_seconds > 0.0);
    }

    #[test]
    fn the_line_says_rows_of_the_estimate_and_the_eta() {
        let mut r = compute(120_000, 3 << 20, Some(200_000), Duration::from_secs(3));
        assert_eq!(
            describe(&r),
            "120000 of ~200000 rows (60.0%), 3.0 MiB, 40.0k rows/s, 1.0 MiB/s in 3.0s, ETA 2s"
        );
        r.done = true;
        assert!(!describe(&r).contains("ETA"));
    }
}
