//! What the CRs say of their pods' long operations (`status.progress`) and of an
//! ArchiveSource's distance behind the head (`status.lag`): pure mappings from the pods'
//! `/status`, and how often a reconcile comes back while an operation runs.

use std::time::Duration;

use crate::crd::progress::{OperationProgress, SourceLag};
use larch_core::progress::ProgressReport;

/// How soon a reconcile comes back while a pod reports an operation in progress (else the
/// controller's usual interval: 30 s for sources and writers, 60 s for a run, 300 s idle).
pub const REQUEUE_WHILE_RUNNING: Duration = Duration::from_secs(10);

/// At most this many exporter pods of one ArchiveExport are probed a reconcile (one `/status`
/// GET each, 3 s timeout): with [`REQUEUE_WHILE_RUNNING`], at most 3.2 GETs a second per export
/// while it copies. Engines are probed every round already (one GET per replica).
pub const MAX_PROBED_PODS: usize = 32;

pub const COPYING: &str = "Copying";
pub const COMPACTING: &str = "Compacting";
pub const LOADING: &str = "Loading";
pub const RESTORING: &str = "Restoring";
pub const COMPLETE: &str = "Complete";
pub const FAILED: &str = "Failed";

/// Whose operation a report is: it names the phase while it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runner {
    /// An exporter: `Copying` a baseline, or `Compacting`.
    Export,
    /// An engine: `Loading` a baseline.
    Engine,
    /// A restore pod: `Restoring` tables into PostgreSQL.
    Restore,
}

/// Whether `progress` is an operation still running (not `Complete` nor `Failed`).
pub fn is_running(progress: Option<&OperationProgress>) -> bool {
    progress.is_some_and(|p| p.phase != COMPLETE && p.phase != FAILED)
}

/// Several operations as one (the tables of a run, the members of a group source): rows,
/// bytes and rates add up; the total only when every part knows its own; done when all are.
pub fn combine(parts: &[ProgressReport]) -> Option<ProgressReport> {
    let first = parts.first()?;
    let total = parts.iter().map(|p| p.total_rows).sum::<Option<u64>>();
    let rows = parts.iter().map(|p| p.rows).sum::<u64>();
    let rows_per_second = parts.iter().map(|p| p.rows_per_second).sum::<f64>();
    let done = parts.iter().all(|p| p.done);
    let eta_seconds = match total {
        _ if done => Some(0.0),
        Some(t) if rows < t && rows_per_second > 0.0 => Some((t - rows) as f64 / rows_per_second),
        _ => None,
    };
    Some(ProgressReport {
        // Compacting wins over copying: the run is past its copies.
        operation: parts
            .iter()
            .find(|p| !p.done)
            .unwrap_or(first)
            .operation
            .clone(),
        subject: first.subject.clone(),
        rows,
        bytes: parts.iter().map(|p| p.bytes).sum(),
        total_rows: total,
        percent: total
            .filter(|t| *t > 0)
            .map(|t| (rows as f64 / t as f64 * 100.0).min(100.0)),
        rows_per_second,
        bytes_per_second: parts.iter().map(|p| p.bytes_per_second).sum(),
        eta_seconds,
        elapsed_seconds: parts.iter().map(|p| p.elapsed_seconds).fold(0.0, f64::max),
        started_at: parts
            .iter()
            .map(|p| p.started_at.clone())
            .min()
            .unwrap_or_default(),
        done,
    })
}

/// The status of one (combined) report of `pods` pods; `updated_time` is left for [`stamp`].
pub fn to_status(r: &ProgressReport, runner: Runner, pods: usize) -> OperationProgress {
    let phase = match (r.done, runner, r.operation.as_str()) {
        (true, _, _) => COMPLETE,
        (false, Runner::Engine, _) => LOADING,
        (false, Runner::Restore, _) => RESTORING,
        (false, Runner::Export, "compaction") => COMPACTING,
        (false, Runner::Export, _) => COPYING,
    };
    let percent = if r.done {
        Some(100.0)
    } else {
        // Floored: 99.7% is not done yet.
        r.percent.map(|p| p.floor())
    };
    OperationProgress {
        phase: phase.into(),
        rows: r.rows as i64,
        expected_rows: r.total_rows.map(|t| t as i64),
        bytes: (r.bytes > 0).then_some(r.bytes as i64),
        rows_per_second: Some(r.rows_per_second.round() as i64),
        eta_seconds: r.eta_seconds.map(|s| s.round() as i64),
        percent: percent.map(|p| format!("{p:.0}%")),
        pods: pods as i32,
        updated_time: None,
    }
}

/// An export's progress: the pods' reports summed (one pod per table being written).
pub fn export_progress(reports: &[ProgressReport]) -> Option<OperationProgress> {
    combine(reports).map(|r| to_status(&r, Runner::Export, reports.len()))
}

/// An ArchiveSource's progress: the engine furthest behind (replicas load the same snapshot,
/// so their rows do not add up). Running loads come before finished ones; among them the
/// lowest percent, else the fewest rows.
pub fn source_progress(engines: &[ProgressReport]) -> Option<OperationProgress> {
    let behind = engines.iter().min_by(|a, b| {
        let key = |r: &ProgressReport| (r.done, r.percent.unwrap_or(f64::MAX), r.rows as f64);
        key(a)
            .partial_cmp(&key(b))
            .unwrap_or(std::cmp::Ordering::Equal)
    })?;
    Some(to_status(behind, Runner::Engine, engines.len()))
}

/// The operation ended and no pod reports it any more: `Complete` (with the rows the pods'
/// summaries count, when known) or `Failed` (the figures where it stopped). `None` when there
/// was nothing running to end.
pub fn ended(
    old: Option<&OperationProgress>,
    succeeded: bool,
    rows: Option<i64>,
) -> Option<OperationProgress> {
    let old = old?;
    if !is_running(Some(old)) {
        return Some(old.clone());
    }
    let mut p = old.clone();
    p.eta_seconds = None;
    p.rows_per_second = None;
    if succeeded {
        p.phase = COMPLETE.into();
        p.rows = rows.unwrap_or(p.rows);
        p.eta_seconds = Some(0);
        p.percent = Some("100%".into());
    } else {
        p.phase = FAILED.into();
    }
    p.updated_time = None;
    Some(p)
}

/// Sets `updated_time`: kept from `old` when nothing else changed (so an unchanged operation
/// writes no status), `now` otherwise. While the same operation keeps running, the figures move
/// at most every [`REQUEUE_WHILE_RUNNING`]: a status write wakes the controller's own watch, so
/// without this bound every write would bring the next one at once.
pub fn stamp(
    old: Option<&OperationProgress>,
    new: Option<OperationProgress>,
    now: jiff::Timestamp,
) -> Option<OperationProgress> {
    let mut new = new?;
    let unchanged = old.is_some_and(|o| {
        let mut o = o.clone();
        o.updated_time = None;
        new.updated_time = None;
        o == new
    });
    if unchanged {
        new.updated_time = old.and_then(|o| o.updated_time.clone());
        return Some(new);
    }
    if let Some(o) = old
        && is_running(Some(o))
        && is_running(Some(&new))
        && o.phase == new.phase
        && let Some(at) = o
            .updated_time
            .as_deref()
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        && now.duration_since(at).unsigned_abs() < REQUEUE_WHILE_RUNNING
    {
        return Some(o.clone());
    }
    new.updated_time = Some(crate::time::time_string(now));
    Some(new)
}

/// One engine's distance behind the head, as its `/status` `behind` says.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Deserialize)]
pub struct Behind {
    #[serde(default)]
    pub diffs: u64,
    #[serde(default)]
    pub bytes: u64,
    #[serde(default)]
    pub seconds: f64,
}

/// `status.lag`: the furthest any engine is behind (diffs, bytes and seconds each the highest);
/// `None` when no engine reported.
pub fn source_lag(engines: &[Behind]) -> Option<SourceLag> {
    if engines.is_empty() {
        return None;
    }
    let diffs = engines.iter().map(|b| b.diffs).max().unwrap_or(0);
    let bytes = engines.iter().map(|b| b.bytes).max().unwrap_or(0);
    let seconds = engines
        .iter()
        .map(|b| b.seconds)
        .fold(0.0, f64::max)
        .round() as u64;
    let summary = if diffs == 0 {
        "0".to_string()
    } else {
        let unit = if diffs == 1 { "diff" } else { "diffs" };
        format!(
            "{diffs} {unit}, {}, {seconds}s",
            larch_core::units::format_bytes(bytes)
        )
    };
    Some(SourceLag {
        diffs: diffs as i64,
        bytes: bytes as i64,
        seconds: seconds as i64,
        summary,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use larch_core::progress::compute;

    fn report(op: &str, rows: u64, total: Option<u64>, secs: u64) -> ProgressReport {
        ProgressReport {
            operation: op.into(),
            ..compute(rows, rows * 10, total, Duration::from_secs(secs))
        }
    }

    #[test]
    fn an_export_sums_its_tables() {
        let p = export_progress(&[
            report("baseline", 50_000, Some(200_000), 10),
            report("baseline", 30_000, Some(100_000), 10),
        ])
        .unwrap();
        assert_eq!(p.phase, COPYING);
        assert_eq!((p.rows, p.expected_rows), (80_000, Some(300_000)));
        assert_eq!(p.bytes, Some(800_000));
        // 5 000 + 3 000 rows/s; 220 000 left.
        assert_eq!(p.rows_per_second, Some(8_000));
        assert_eq!(p.eta_seconds, Some(28));
        assert_eq!(p.percent.as_deref(), Some("26%"));
        assert_eq!(p.pods, 2);
        // A table without an estimate: no total, no percent, no ETA.
        let p = export_progress(&[
            report("baseline", 5, Some(10), 1),
            report("baseline", 5, None, 1),
        ])
        .unwrap();
        assert_eq!(
            (p.expected_rows, p.percent, p.eta_seconds),
            (None, None, None)
        );
        assert!(export_progress(&[]).is_none());
    }

    #[test]
    fn the_percent_is_floored_until_done_and_compaction_is_named() {
        let mut r = report("compaction", 1_997, Some(2_000), 1);
        let p = export_progress(std::slice::from_ref(&r)).unwrap();
        assert_eq!(
            (p.phase.as_str(), p.percent.as_deref()),
            (COMPACTING, Some("99%"))
        );
        r.done = true;
        let p = export_progress(&[r]).unwrap();
        assert_eq!(
            (p.phase.as_str(), p.percent.as_deref()),
            (COMPLETE, Some("100%"))
        );
        assert_eq!(p.eta_seconds, Some(0));
    }

    #[test]
    fn a_source_shows_the_engine_furthest_behind() {
        let mut done = report("baseline", 900, Some(900), 2);
        done.done = true;
        let engines = [
            report("baseline", 600, Some(900), 2),
            done.clone(),
            report("baseline", 300, Some(900), 2),
        ];
        let p = source_progress(&engines).unwrap();
        assert_eq!((p.phase.as_str(), p.rows, p.pods), (LOADING, 300, 3));
        assert_eq!(p.percent.as_deref(), Some("33%"));
        let p = source_progress(&[done.clone(), done]).unwrap();
        assert_eq!((p.phase.as_str(), p.rows), (COMPLETE, 900));
    }

    #[test]
    fn an_ended_run_is_complete_with_its_summary_rows_or_failed_where_it_stopped() {
        let running = export_progress(&[report("baseline", 120_000, Some(199_000), 10)]);
        let complete = ended(running.as_ref(), true, Some(200_000)).unwrap();
        assert_eq!(complete.phase, COMPLETE);
        assert_eq!(
            (complete.rows, complete.percent.as_deref()),
            (200_000, Some("100%"))
        );
        assert_eq!(complete.eta_seconds, Some(0));
        let failed = ended(running.as_ref(), false, None).unwrap();
        assert_eq!((failed.phase.as_str(), failed.rows), (FAILED, 120_000));
        assert_eq!((failed.eta_seconds, failed.rows_per_second), (None, None));
        assert_eq!(ended(None, true, Some(3)), None, "nothing ran");
        assert_eq!(
            ended(Some(&complete), false, None),
            Some(complete.clone()),
            "an ended operation stays as it ended"
        );
    }

    #[test]
    fn the_update_time_moves_only_with_the_figures_and_at_most_every_10s() {
        let at = |s: u64| jiff::Timestamp::from_second(1_800_000_000 + s as i64).unwrap();
        let p = export_progress(&[report("baseline", 10, Some(100), 1)]);
        let first = stamp(None, p.clone(), at(0)).unwrap();
        assert_eq!(first.updated_time.as_deref(), Some("2027-01-15T08:00:00Z"));
        let same = stamp(Some(&first), p, at(30)).unwrap();
        assert_eq!(
            same, first,
            "unchanged figures keep their time: no status write"
        );
        let moved = export_progress(&[report("baseline", 20, Some(100), 2)]);
        assert_eq!(
            stamp(Some(&first), moved.clone(), at(9)).as_ref(),
            Some(&first),
            "9 s after the last figures: not yet"
        );
        let later = stamp(Some(&first), moved, at(10)).unwrap();
        assert_eq!(
            (later.rows, later.updated_time.as_deref()),
            (20, Some("2027-01-15T08:00:10Z"))
        );
        // The end of the operation is written at once.
        let ended = ended(Some(&later), true, Some(100));
        let ended = stamp(Some(&later), ended, at(11)).unwrap();
        assert_eq!(
            (ended.phase.as_str(), ended.updated_time.as_deref()),
            (COMPLETE, Some("2027-01-15T08:00:11Z"))
        );
        assert_eq!(stamp(Some(&first), None, at(12)), None);
    }

    #[test]
    fn lag_is_zero_when_caught_up_and_the_furthest_engine_otherwise() {
        let caught_up = source_lag(&[Behind::default(), Behind::default()]).unwrap();
        assert_eq!(
            (caught_up.diffs, caught_up.bytes, caught_up.seconds),
            (0, 0, 0)
        );
        assert_eq!(caught_up.summary, "0");
        let behind = source_lag(&[
            Behind::default(),
            Behind {
                diffs: 2,
                bytes: 4096,
                seconds: 11.6,
            },
        ])
        .unwrap();
        assert_eq!((behind.diffs, behind.bytes, behind.seconds), (2, 4096, 12));
        assert_eq!(behind.summary, "2 diffs, 4.0 KiB, 12s");
        assert_eq!(source_lag(&[]), None);
    }
}
