//! ArchiveExport conditions from what its reconcile observed (pure).

use larch_contract::preflight::PreflightSummary;
use larch_core::failure::Reason;

use crate::crd::archive_export::{ExportMode, RunStatus};
use crate::reconcile::conditions::*;
use crate::reconcile::job::JobPhase;

pub const EXPORT_TYPES: [&str; 7] = [
    READY,
    RECONCILING,
    STALLED,
    LAST_EXPORT_SUCCEEDED,
    DEGRADED,
    UNREVIEWED_COLUMNS,
    VALIDATED,
];

/// What the export pods' constraint preflight found: whether the transform can break a
/// UNIQUE, CHECK, NOT NULL or FOREIGN KEY constraint of the exported tables.
pub const VALIDATED: &str = "Validated";

/// A masked Continuous export's writers report columns its rules do not name (they go through
/// `undeclared` until the rules name them).
pub const UNREVIEWED_COLUMNS: &str = "UnreviewedColumns";

/// Columns listed in `UnreviewedColumns`' message, at most (the rest are counted).
const UNREVIEWED_LISTED: usize = 10;

/// How a finished export pod ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodOutcome {
    pub succeeded: bool,
    /// What it exported, or why it failed.
    pub detail: String,
}

/// A continuous export's writer Deployments.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriterCounts {
    pub ready: i32,
    pub desired: i32,
    /// A Deployment exceeded its progress deadline.
    pub stalled: bool,
}

/// What the export controller observed, reduced to what conditions depend on.
#[derive(Clone, Debug, PartialEq)]
pub struct ExportObservation {
    /// Nothing could be built: a missing reference, an invalid spec, a refused child.
    pub blocked: Option<Problem>,
    /// The export pods' failure: the current run's newest failed pod (OneShot), the last
    /// scheduled run's, or a failing writer (Continuous).
    pub pod_failure: Option<Problem>,
    pub mode: ExportMode,
    pub scheduled: bool,
    pub suspended: bool,
    /// The current (or last) OneShot run, as recorded in status after this reconcile.
    pub run: Option<RunStatus>,
    /// Phases of the current run's Jobs, if the run is not recorded as finished.
    pub run_jobs: Vec<JobPhase>,
    /// Outcome of the most recent finished export pod (scheduled runs).
    pub last_outcome: Option<PodOutcome>,
    /// Continuous: how many writers are ready of how many wanted.
    pub writers: WriterCounts,
    /// Continuous: writers whose `/status` reports a snapshot.
    pub writers_with_snapshot: usize,
    /// Continuous and suspended: what each kept replication slot holds (for Ready's message).
    pub suspended_slots: Vec<String>,
    /// The spec has a transform (masked export).
    pub masked: bool,
    /// Continuous and masked: the columns the writers report their rules do not name, each
    /// `table.column` with its suggestion; None when no writer answered this round.
    pub unreviewed: Option<Vec<String>>,
    /// Masked: the constraint preflight the newest finished export pod (OneShot) or every
    /// writer (Continuous, merged) reported; None when none reported one.
    pub preflight: Option<PreflightSummary>,
}

/// Folds the phases of a run's Jobs: `Some(true)` all succeeded, `Some(false)` one failed or
/// is missing, `None` still running.
pub fn run_outcome(jobs: &[JobPhase]) -> Option<bool> {
    if jobs.contains(&JobPhase::Active) {
        return None;
    }
    Some(!jobs.is_empty() && jobs.iter().all(|j| *j == JobPhase::Succeeded))
}

pub fn export_conditions(o: &ExportObservation) -> Vec<Cond> {
    if let Some(p) = &o.blocked {
        return blocked(p);
    }
    let mut out = match o.mode {
        ExportMode::Continuous => continuous_conditions(o),
        ExportMode::OneShot if o.scheduled => scheduled_conditions(o),
        ExportMode::OneShot => oneshot_conditions(o),
    };
    if !out.iter().any(|c| c.type_ == DEGRADED) {
        out.push(match &o.pod_failure {
            Some(p) if !o.suspended => c(DEGRADED, Status::True, &p.reason, p.message.clone()),
            _ => not_degraded(),
        });
    }
    out.extend(unreviewed_condition(o));
    out.extend(validated_condition(o));
    out
}

/// `Validated`: True `ConstraintsHold` when the pods' preflight finds no constraint the
/// transform can break; False `ConstraintsAtRisk` naming them (or when `requireValidated`
/// refused the export); Unknown `PreflightFailed` when the preflight could not run; True
/// `NotMasked` without a transform (the rows go out as they are). None (the last one kept)
/// until a pod reports.
fn validated_condition(o: &ExportObservation) -> Option<Cond> {
    use Status::*;
    if !o.masked {
        return Some(c(
            VALIDATED,
            True,
            "NotMasked",
            "the export has no transform: the rows go out as they are and break no constraint",
        ));
    }
    let at_risk = Reason::ConstraintsAtRisk.as_str();
    if let Some(p) = o.pod_failure.as_ref().filter(|p| p.reason == at_risk) {
        return Some(c(VALIDATED, False, at_risk, p.message.clone()));
    }
    let p = o.preflight.as_ref()?;
    if let (0, Some(e)) = (p.at_risk, &p.error) {
        return Some(c(
            VALIDATED,
            Unknown,
            "PreflightFailed",
            format!("the constraint preflight could not run: {e}"),
        ));
    }
    if p.at_risk == 0 {
        return Some(c(
            VALIDATED,
            True,
            "ConstraintsHold",
            format!(
                "the transform can break none of the {} constraints checked (UNIQUE, CHECK, \
                 NOT NULL, FOREIGN KEY)",
                p.constraints_checked
            ),
        ));
    }
    Some(c(
        VALIDATED,
        False,
        at_risk,
        format!(
            "the transform can break {} of the {} constraints checked, so a restore of the \
             masked archive into a database with them would fail: {}; change spec.transform \
             (`larch export --check` lists every one)",
            p.at_risk,
            p.constraints_checked,
            p.listed()
        ),
    ))
}

/// The writers' preflights as one: counts added, the listed constraints joined (up to
/// [`larch_contract::preflight::LISTED`]), the first error kept.
pub fn merge_preflights(reports: &[PreflightSummary]) -> PreflightSummary {
    let mut out = PreflightSummary::default();
    for r in reports {
        out.constraints_checked += r.constraints_checked;
        out.at_risk += r.at_risk;
        out.problems.extend(r.problems.iter().cloned());
        if out.error.is_none() {
            out.error.clone_from(&r.error);
        }
    }
    out.problems.sort();
    out.problems.dedup();
    out.problems.truncate(larch_contract::preflight::LISTED);
    out
}

/// `UnreviewedColumns`: True, naming each `table.column` and its suggested rule, while a
/// Continuous masked export's writers report columns the rules do not name; False once they
/// name them all. None (the last one kept) while no writer answers.
fn unreviewed_condition(o: &ExportObservation) -> Option<Cond> {
    use Status::*;
    if !o.masked {
        return Some(c(
            UNREVIEWED_COLUMNS,
            False,
            "NotMasked",
            "the export has no transform",
        ));
    }
    if o.mode != ExportMode::Continuous {
        return Some(c(
            UNREVIEWED_COLUMNS,
            False,
            "NotContinuous",
            "reported by Continuous exports; review a OneShot export's columns with `larch transform suggest`",
        ));
    }
    let columns = o.unreviewed.as_ref()?;
    if columns.is_empty() {
        return Some(c(
            UNREVIEWED_COLUMNS,
            False,
            "AllColumnsReviewed",
            "the transform rules name every column of the exported tables",
        ));
    }
    let mut listed = columns[..columns.len().min(UNREVIEWED_LISTED)].join("; ");
    if columns.len() > UNREVIEWED_LISTED {
        listed.push_str(&format!("; and {} more", columns.len() - UNREVIEWED_LISTED));
    }
    Some(c(
        UNREVIEWED_COLUMNS,
        True,
        "UnreviewedColumns",
        format!(
            "{} column(s) the transform rules do not name go through `undeclared` until \
             spec.transform names them: {listed}",
            columns.len()
        ),
    ))
}

fn oneshot_conditions(o: &ExportObservation) -> Vec<Cond> {
    use Status::*;
    let running = o.run_jobs.contains(&JobPhase::Active);
    let Some(run) = &o.run else {
        return if o.suspended {
            vec![
                c(READY, True, "Suspended", "suspended: no export is started"),
                c(RECONCILING, False, "Suspended", ""),
                c(STALLED, False, "Suspended", ""),
            ]
        } else {
            vec![
                c(READY, False, "Pending", "no run yet"),
                c(RECONCILING, True, "Pending", "starting the export"),
                c(STALLED, False, "Pending", ""),
            ]
        };
    };
    // A split run fails as soon as one of its Jobs does, while the other is being stopped.
    if (running && run.succeeded.is_none()) || (run.succeeded.is_none() && o.run_jobs.is_empty()) {
        let msg = format!("export run {} in progress", run.id);
        return vec![
            c(READY, False, "ExportRunning", msg.clone()),
            c(RECONCILING, True, "ExportRunning", msg),
            c(STALLED, False, "ExportRunning", ""),
        ];
    }
    let lost = o.run_jobs.contains(&JobPhase::Missing) && run.succeeded != Some(true);
    if lost {
        let msg = format!(
            "a Job of run {} disappeared before it finished; set the larch.dev/run-requested annotation to a new value to run again",
            run.id
        );
        return vec![
            c(READY, False, "JobMissing", msg.clone()),
            c(RECONCILING, False, "JobMissing", ""),
            c(STALLED, True, "JobMissing", msg.clone()),
            c(LAST_EXPORT_SUCCEEDED, Unknown, "JobMissing", msg),
        ];
    }
    match run.succeeded {
        Some(true) => vec![
            c(
                READY,
                True,
                "ExportSucceeded",
                format!("run {} succeeded", run.id),
            ),
            c(RECONCILING, False, "ExportSucceeded", ""),
            c(STALLED, False, "ExportSucceeded", ""),
            c(
                LAST_EXPORT_SUCCEEDED,
                True,
                "ExportSucceeded",
                format!("run {} succeeded", run.id),
            ),
        ],
        _ => {
            // The reason the pod gave (TableNotFound...), else the generic one.
            let (reason, why) = match &o.pod_failure {
                Some(p) => (p.reason.as_str(), format!(": {}", p.message)),
                None => ("ExportFailed", String::new()),
            };
            let msg = format!(
                "run {} failed{why}; fix the cause and set the larch.dev/run-requested annotation to a new value to retry",
                run.id
            );
            let detail = o
                .last_outcome
                .as_ref()
                .map(|o| o.detail.clone())
                .unwrap_or_default();
            vec![
                c(READY, False, reason, msg.clone()),
                c(RECONCILING, False, reason, ""),
                c(STALLED, True, reason, msg),
                c(LAST_EXPORT_SUCCEEDED, False, "ExportFailed", detail),
            ]
        }
    }
}

fn scheduled_conditions(o: &ExportObservation) -> Vec<Cond> {
    use Status::*;
    let running = o.run_jobs.contains(&JobPhase::Active);
    // The last run failed for a reason that will not clear by itself: the next runs will
    // fail alike until someone acts.
    let stuck = o
        .pod_failure
        .as_ref()
        .filter(|p| !p.transient && !o.suspended)
        .filter(|_| o.last_outcome.as_ref().is_some_and(|l| !l.succeeded));
    let mut out = vec![match stuck {
        Some(p) => c(
            STALLED,
            True,
            &p.reason,
            format!("the last scheduled export failed: {}", p.message),
        ),
        None => c(STALLED, False, "Scheduled", ""),
    }];
    out.push(if running {
        c(
            RECONCILING,
            True,
            "ExportRunning",
            "a requested run is in progress",
        )
    } else {
        c(RECONCILING, False, "Scheduled", "")
    });
    let (ready, last) = scheduled_outcome(o, stuck);
    let ready = if running && ready.status == True {
        c(
            READY,
            False,
            "ExportRunning",
            "a requested run is in progress",
        )
    } else {
        ready
    };
    out.push(ready);
    out.extend(last);
    out
}

/// `Ready` and `LastExportSucceeded` of a schedule from its last finished run.
fn scheduled_outcome(o: &ExportObservation, stuck: Option<&Problem>) -> (Cond, Option<Cond>) {
    use Status::*;
    match &o.last_outcome {
        _ if o.suspended => (
            c(READY, True, "Suspended", "the schedule is suspended"),
            None,
        ),
        Some(PodOutcome {
            succeeded: true,
            detail: m,
        }) => (
            c(
                READY,
                True,
                "Scheduled",
                "scheduled; the last export succeeded",
            ),
            Some(c(LAST_EXPORT_SUCCEEDED, True, "ExportSucceeded", m.clone())),
        ),
        Some(PodOutcome {
            succeeded: false,
            detail: m,
        }) => (
            c(
                READY,
                False,
                stuck.map_or("LastExportFailed", |p| p.reason.as_str()),
                format!("the last scheduled export failed: {m}"),
            ),
            Some(c(LAST_EXPORT_SUCCEEDED, False, "ExportFailed", m.clone())),
        ),
        None => (
            c(
                READY,
                True,
                "Scheduled",
                "scheduled; no export has finished yet",
            ),
            Some(c(
                LAST_EXPORT_SUCCEEDED,
                Unknown,
                "NoExportYet",
                "no export has finished yet",
            )),
        ),
    }
}

fn continuous_conditions(o: &ExportObservation) -> Vec<Cond> {
    use Status::*;
    let WriterCounts {
        ready,
        desired,
        stalled,
    } = o.writers;
    let snapshot = if desired > 0 && o.writers_with_snapshot as i32 >= desired {
        c(
            LAST_EXPORT_SUCCEEDED,
            True,
            "SnapshotWritten",
            "every writer reports a snapshot",
        )
    } else {
        c(
            LAST_EXPORT_SUCCEEDED,
            Unknown,
            "WaitingForSnapshot",
            "waiting for the writers' first snapshot",
        )
    };
    if o.suspended {
        let slots = if o.suspended_slots.is_empty() {
            "no replication slot is kept (temporary slots)".to_string()
        } else {
            o.suspended_slots.join("; ")
        };
        return vec![
            c(
                READY,
                True,
                "Suspended",
                format!("the writer is scaled to zero; {slots}"),
            ),
            c(RECONCILING, False, "Suspended", ""),
            c(STALLED, False, "Suspended", ""),
        ];
    }
    if let Some(p) = &o.pod_failure {
        let mut out = failing(p).to_vec();
        out.push(snapshot);
        return out;
    }
    if stalled {
        let msg =
            "a writer Deployment exceeded its progress deadline (see its pods' events and logs)";
        return vec![
            c(READY, False, "WriterNotProgressing", msg),
            c(RECONCILING, False, "WriterNotProgressing", ""),
            c(STALLED, True, "WriterNotProgressing", msg),
            snapshot,
        ];
    }
    if ready < desired {
        let msg = format!("{ready}/{desired} writers ready");
        return vec![
            c(READY, False, "WaitingForWriter", msg.clone()),
            c(RECONCILING, True, "WaitingForWriter", msg),
            c(STALLED, False, "WaitingForWriter", ""),
            snapshot,
        ];
    }
    vec![
        c(
            READY,
            True,
            "Running",
            format!("{ready}/{desired} writers ready"),
        ),
        c(RECONCILING, False, "Running", ""),
        c(STALLED, False, "Running", ""),
        snapshot,
    ]
}
