//! What `larch status` shows, one line per object, read from the objects' status.

use k8s_openapi::api::core::v1::Event;
use serde::Serialize;

use crate::operator::crd::common::{Condition, ConditionStatus};
use crate::operator::crd::progress::OperationProgress;
use crate::operator::crd::{ArchiveExport, ArchiveRestore, ArchiveSource, ArchiveSourceSet};

/// The kinds whose warning Events are shown.
pub const KINDS: [&str; 4] = [
    "ArchiveExport",
    "ArchiveSource",
    "ArchiveSourceSet",
    "ArchiveRestore",
];

#[derive(Debug, Default, Serialize)]
pub struct Overview {
    pub exports: Vec<ExportLine>,
    pub sources: Vec<SourceLine>,
    pub source_sets: Vec<SourceSetLine>,
    pub restores: Vec<RestoreLine>,
    pub warnings: Vec<WarningLine>,
    /// What could not be listed (not allowed), and what was shown instead.
    pub notes: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct ExportLine {
    pub namespace: String,
    pub name: String,
    pub mode: String,
    pub ready: String,
    /// Why it is not Ready (the Ready condition's reason).
    pub reason: Option<String>,
    pub last_export: Option<String>,
    pub position: Option<String>,
    pub epoch: Option<i64>,
    pub rows: Option<i64>,
    /// The cron of a scheduled OneShot export (`suspended` when suspended).
    pub schedule: Option<String>,
    /// The run in progress or the last one: `running`, `succeeded`, `failed`.
    pub run: Option<String>,
    /// When the schedule fires next (RFC 3339 UTC; the schedule's `timeZone`, else UTC);
    /// absent without a schedule or while it is suspended.
    pub next_run: Option<String>,
    /// `status.progress`: the phase and percent of the baseline being written (`Copying 42%`).
    pub progress: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct SourceLine {
    pub namespace: String,
    pub name: String,
    pub ready: String,
    pub reason: Option<String>,
    pub engines_ready: Option<i32>,
    pub engines: Option<i32>,
    pub position: Option<String>,
    pub head: Option<String>,
    /// Whether the engines applied the archive's head (`CaughtUp`).
    pub caught_up: Option<bool>,
    /// When the head was written: the age of the data served.
    pub head_time: Option<String>,
    pub rebaselines: Option<i64>,
    pub rows: Option<i64>,
    /// Distance behind the head (`status.lag.summary`): `0` when caught up.
    pub lag: Option<String>,
    /// `status.progress` of the engines' baseline load (`Loading 42%`).
    pub progress: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct SourceSetLine {
    pub name: String,
    pub ready: String,
    pub desired_namespaces: Option<i32>,
    pub ready_namespaces: Option<i32>,
    /// `namespace: reason`.
    pub failing: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct WarningLine {
    pub namespace: String,
    /// `Kind/name`.
    pub object: String,
    pub reason: String,
    pub message: String,
    pub last_seen: Option<String>,
    pub count: i32,
}

#[derive(Debug, Serialize)]
pub struct RestoreLine {
    pub namespace: String,
    pub name: String,
    pub ready: String,
    pub reason: Option<String>,
    /// The run in progress or the last one: `running`, `succeeded`, `failed`.
    pub run: Option<String>,
    /// Rows the last successful run restored (every table).
    pub rows: Option<i64>,
    /// Its tables (`schema.table`).
    pub tables: Vec<String>,
    /// The archive position it restored at.
    pub position: Option<String>,
    /// `spec.at` of that run, as given.
    pub at: Option<String>,
    pub completed: Option<String>,
    pub duration_seconds: Option<f64>,
    /// A run waiting for its database: `reason (attempt N, next at T)`.
    pub database_wait: Option<String>,
}

pub(super) fn condition(conditions: &[Condition], kind: &str) -> Option<Condition> {
    conditions.iter().find(|c| c.type_ == kind).cloned()
}

pub(super) fn ready_of(conditions: &[Condition]) -> (String, Option<String>) {
    match condition(conditions, "Ready") {
        Some(c) if c.status == ConditionStatus::True => ("True".into(), None),
        Some(c) => (c.status.as_str().into(), Some(c.reason)),
        None => ("Unknown".into(), None),
    }
}

/// One export's line: its Ready condition, last export (else first writer) and schedule.
pub(super) fn export_line(e: &ArchiveExport) -> ExportLine {
    let status = e.status.clone().unwrap_or_default();
    let (ready, reason) = ready_of(&status.conditions);
    let last = status.last_export.clone();
    let run = status.run.as_ref().map(run_text);
    ExportLine {
        namespace: e.metadata.namespace.clone().unwrap_or_default(),
        name: e.metadata.name.clone().unwrap_or_default(),
        mode: format!("{:?}", e.spec.mode),
        ready,
        reason,
        last_export: last.as_ref().and_then(|l| l.time.clone()),
        position: last
            .as_ref()
            .and_then(|l| l.position.clone())
            .or_else(|| status.writers.first().and_then(|w| w.head_position.clone())),
        epoch: last
            .as_ref()
            .and_then(|l| l.epoch)
            .or_else(|| status.writers.first().and_then(|w| w.epoch)),
        rows: last.as_ref().and_then(|l| l.row_count),
        schedule: e.spec.schedule.as_ref().map(|s| {
            if s.suspend == Some(true) {
                format!("{} (suspended)", s.cron)
            } else {
                s.cron.clone()
            }
        }),
        run,
        next_run: next_run(e, jiff::Timestamp::now()),
        progress: status.progress.as_ref().map(progress_text),
    }
}

pub(super) fn source_line(s: &ArchiveSource) -> SourceLine {
    let status = s.status.clone().unwrap_or_default();
    let (ready, reason) = ready_of(&status.conditions);
    SourceLine {
        namespace: s.metadata.namespace.clone().unwrap_or_default(),
        name: s.metadata.name.clone().unwrap_or_default(),
        ready,
        reason,
        engines_ready: status.ready_replicas,
        engines: s.spec.replicas,
        position: status.position.clone(),
        head: status.head.clone(),
        caught_up: condition(&status.conditions, "CaughtUp")
            .map(|c| c.status == ConditionStatus::True),
        head_time: status.head_time.clone(),
        rebaselines: status.rebaselines.as_ref().map(|r| r.total),
        rows: status.rows,
        lag: status.lag.as_ref().map(|l| l.summary.clone()),
        progress: status.progress.as_ref().map(progress_text),
    }
}

pub(super) fn source_set_line(set: &ArchiveSourceSet) -> SourceSetLine {
    let status = set.status.clone().unwrap_or_default();
    SourceSetLine {
        name: set.metadata.name.clone().unwrap_or_default(),
        ready: ready_of(&status.conditions).0,
        desired_namespaces: status.desired_namespaces,
        ready_namespaces: status.ready_namespaces,
        failing: status
            .failing_namespaces
            .iter()
            .map(|f| format!("{}: {}", f.namespace, f.reason))
            .collect(),
    }
}

/// `running`, `succeeded` or `failed`.
fn run_text(r: &crate::operator::crd::archive_export::RunStatus) -> String {
    match r.succeeded {
        Some(true) => "succeeded",
        Some(false) => "failed",
        None => "running",
    }
    .to_string()
}

/// One restore's line: its Ready condition, run, and what its last successful run restored.
pub(super) fn restore_line(r: &ArchiveRestore) -> RestoreLine {
    let status = r.status.clone().unwrap_or_default();
    let (ready, reason) = ready_of(&status.conditions);
    RestoreLine {
        namespace: r.metadata.namespace.clone().unwrap_or_default(),
        name: r.metadata.name.clone().unwrap_or_default(),
        ready,
        reason,
        run: status.run.as_ref().map(run_text),
        rows: (!status.tables.is_empty()).then(|| status.tables.iter().map(|t| t.rows).sum()),
        tables: status.tables.iter().map(|t| t.table.clone()).collect(),
        position: status.position.clone(),
        at: status.at.clone(),
        completed: status.run.as_ref().and_then(|r| r.completion_time.clone()),
        duration_seconds: status.duration_seconds,
        database_wait: status.database_wait.as_ref().map(|w| {
            format!(
                "{} (attempt {}, next at {})",
                w.reason, w.attempts, w.next_attempt_time
            )
        }),
    }
}

/// When an Event was last seen (its last timestamp, else its event time, else its creation).
pub(super) fn event_seen(e: &Event) -> Option<String> {
    e.last_timestamp
        .as_ref()
        .map(|t| t.0.to_string())
        .or_else(|| e.event_time.as_ref().map(|t| t.0.to_string()))
        .or_else(|| {
            e.metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.to_string())
        })
}

/// The newest `events` warning Events about the three kinds, newest first.
pub(super) fn warning_lines(warnings: Vec<Event>, events: usize) -> Vec<WarningLine> {
    let mut ours: Vec<Event> = warnings
        .into_iter()
        .filter(|e| {
            e.involved_object
                .kind
                .as_deref()
                .is_some_and(|k| KINDS.contains(&k))
        })
        .collect();
    ours.sort_by_key(|e| std::cmp::Reverse(event_seen(e)));
    ours.into_iter()
        .take(events)
        .map(|e| WarningLine {
            namespace: e.metadata.namespace.clone().unwrap_or_default(),
            object: format!(
                "{}/{}",
                e.involved_object.kind.clone().unwrap_or_default(),
                e.involved_object.name.clone().unwrap_or_default()
            ),
            reason: e.reason.clone().unwrap_or_default(),
            message: e.message.clone().unwrap_or_default(),
            last_seen: event_seen(&e),
            count: e.count.unwrap_or(1),
        })
        .collect()
}

/// When a scheduled, unsuspended export runs next after `now` (its cron in its time zone);
/// `None` for one the operator would refuse too.
pub(super) fn next_run(e: &ArchiveExport, now: jiff::Timestamp) -> Option<String> {
    let s = e.spec.schedule.as_ref()?;
    if s.suspend == Some(true) || e.spec.suspend == Some(true) {
        return None;
    }
    let next = crate::operator::cron::next_after(&s.cron, s.time_zone.as_deref(), now).ok()??;
    Some(next.to_string())
}

/// `Copying 42%`, `Complete 100%`, or the phase and rows without an expected total.
pub(super) fn progress_text(p: &OperationProgress) -> String {
    match &p.percent {
        Some(pct) => format!("{} {pct}", p.phase),
        None => format!("{} {} rows", p.phase, p.rows),
    }
}
