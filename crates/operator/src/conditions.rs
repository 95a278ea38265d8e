//! Condition computation from observed state (pure). kstatus-compatible: every type is set on the
//! first visit (Unknown when nothing is known), `Ready` summarises, `Reconciling` and `Stalled` are
//! the abnormal-true pair, and `lastTransitionTime` only moves when a status flips.

use jiff::Timestamp;

use crate::crd::archive_export::{ExportMode, RunStatus};
use crate::crd::common::Condition;
use crate::observe::EngineSource;
pub use crate::time::time_string;

pub const READY: &str = "Ready";
pub const RECONCILING: &str = "Reconciling";
pub const STALLED: &str = "Stalled";
pub const LAST_EXPORT_SUCCEEDED: &str = "LastExportSucceeded";
pub const CAUGHT_UP: &str = "CaughtUp";
pub const REBASELINING: &str = "Rebaselining";
pub const DEGRADED: &str = "Degraded";

pub const EXPORT_TYPES: [&str; 5] = [READY, RECONCILING, STALLED, LAST_EXPORT_SUCCEEDED, DEGRADED];
pub const SOURCE_SET_TYPES: [&str; 3] = [READY, RECONCILING, STALLED];
pub const RESTORE_TYPES: [&str; 3] = [READY, RECONCILING, STALLED];
pub const SOURCE_TYPES: [&str; 6] = [
    READY,
    RECONCILING,
    STALLED,
    CAUGHT_UP,
    REBASELINING,
    DEGRADED,
];

pub use crate::crd::common::ConditionStatus as Status;

/// A desired condition, before times and generations are filled in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cond {
    pub type_: &'static str,
    pub status: Status,
    pub reason: String,
    pub message: String,
}

fn c(
    type_: &'static str,
    status: Status,
    reason: impl Into<String>,
    message: impl Into<String>,
) -> Cond {
    Cond {
        type_,
        status,
        reason: reason.into(),
        message: message.into(),
    }
}

/// Something that keeps a custom resource from working, with its reason: what the spec names
/// is missing, the spec cannot work, the API server refused a child, or a pod fails.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub reason: String,
    pub message: String,
    /// Clears by itself (the database restarts): `Degraded` and still `Reconciling`, never
    /// `Stalled`.
    pub transient: bool,
}

impl Problem {
    pub fn new(reason: impl Into<String>, message: impl Into<String>) -> Problem {
        Problem {
            reason: reason.into(),
            message: message.into(),
            transient: false,
        }
    }

    /// A failing pod: `what` names its role (`writer`, `engine`, `export`).
    pub fn of_pod(what: &str, f: &crate::reconcile::pod_failure::PodFailure) -> Problem {
        Problem {
            reason: f.reason.clone(),
            message: f.describe(what),
            transient: f.transient,
        }
    }
}

/// `Ready`, `Reconciling`, `Stalled` (and `Degraded`) of a custom resource that cannot be
/// built: nothing is applied until someone acts.
fn blocked(p: &Problem) -> Vec<Cond> {
    use Status::*;
    vec![
        c(READY, False, &p.reason, p.message.clone()),
        c(RECONCILING, False, &p.reason, ""),
        c(STALLED, True, &p.reason, p.message.clone()),
        c(DEGRADED, False, &p.reason, ""),
    ]
}

/// The summary conditions of a failing pod: a transient failure is still being worked on
/// (`Reconciling`, kstatus InProgress), any other is `Stalled` (kstatus Failed); both are
/// `Degraded` with the pod's reason.
fn failing(p: &Problem) -> [Cond; 4] {
    use Status::*;
    let (reconciling, stalled) = if p.transient {
        (
            c(RECONCILING, True, &p.reason, p.message.clone()),
            c(STALLED, False, &p.reason, ""),
        )
    } else {
        (
            c(RECONCILING, False, &p.reason, ""),
            c(STALLED, True, &p.reason, p.message.clone()),
        )
    };
    [
        c(READY, False, &p.reason, p.message.clone()),
        reconciling,
        stalled,
        c(DEGRADED, True, &p.reason, p.message.clone()),
    ]
}

fn not_degraded() -> Cond {
    c(DEGRADED, Status::False, "AsExpected", "")
}

/// Merges `desired` into `previous`: for each of `types`, the desired condition if given, else
/// the previous one, else `Unknown`/`Pending`. `lastTransitionTime` is kept while the status is
/// unchanged. Output order follows `types`.
pub fn merge(
    previous: &[Condition],
    desired: &[Cond],
    types: &[&'static str],
    now: Timestamp,
    generation: Option<i64>,
) -> Vec<Condition> {
    types
        .iter()
        .map(|t| {
            let prev = previous.iter().find(|p| p.type_ == *t);
            let want = desired.iter().find(|d| d.type_ == *t).cloned().or_else(|| {
                prev.is_none()
                    .then(|| c(t, Status::Unknown, "Pending", "not observed yet"))
            });
            match (want, prev) {
                (Some(w), prev) => Condition {
                    type_: w.type_.into(),
                    status: w.status,
                    reason: w.reason,
                    message: w.message,
                    last_transition_time: match prev {
                        Some(p) if p.status == w.status => p.last_transition_time.clone(),
                        _ => time_string(now),
                    },
                    observed_generation: generation,
                },
                (None, Some(p)) => Condition {
                    observed_generation: generation,
                    ..p.clone()
                },
                (None, None) => unreachable!("a missing condition is always wanted"),
            }
        })
        .collect()
}

/// Conditions whose status changed between `before` and `after` (for Events).
pub fn transitions<'a>(before: &[Condition], after: &'a [Condition]) -> Vec<&'a Condition> {
    after
        .iter()
        .filter(|a| {
            before
                .iter()
                .find(|b| b.type_ == a.type_)
                .is_none_or(|b| b.status != a.status)
        })
        .collect()
}

pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == Status::True)
}

// ---------------------------------------------------------------------------------------------
// ArchiveExport

/// State of one Job of a OneShot run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobPhase {
    Active,
    Succeeded,
    Failed,
    /// Not found (removed by its TTL or by hand) before the run was recorded as finished.
    Missing,
}

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
    out
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
    if running || (run.succeeded.is_none() && o.run_jobs.is_empty()) {
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
    let (ready, last) = match &o.last_outcome {
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
    };
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

// ---------------------------------------------------------------------------------------------
// ArchiveSource

/// Lag below which an engine counts as caught up.
pub const CAUGHT_UP_LAG_SECONDS: f64 = 60.0;
/// Default of `spec.rebaseline.maxPerHour`.
pub const DEFAULT_MAX_REBASELINES_PER_HOUR: u64 = 3;

#[derive(Clone, Debug, PartialEq)]
pub struct SourceObservation {
    /// Nothing could be built: the referenced ArchiveExport or a Secret is missing, the spec
    /// cannot work, the API server refused a child.
    pub blocked: Option<Problem>,
    /// The first failing engine pod (crash-looping, cannot start).
    pub pod_failure: Option<Problem>,
    pub suspended: bool,
    pub desired_replicas: i32,
    pub ready_replicas: i32,
    /// The StatefulSet controller has seen the latest template and every replica runs it.
    pub rolled_out: bool,
    /// The StatefulSet has fewer pods than wanted and the last attempt to create one failed
    /// (its `FailedCreate` event: a quota, a LimitRange, a missing ServiceAccount...).
    pub pods_not_created: Option<String>,
    /// The engines' `/status` entries for this source (pods that answered).
    pub engines: Vec<EngineSource>,
    pub rebaselining: bool,
    pub rebaselines_last_hour: u64,
    pub max_per_hour: u64,
}

pub fn source_conditions(o: &SourceObservation) -> Vec<Cond> {
    use Status::*;
    let mut out = vec![];
    if let Some(p) = &o.blocked {
        return blocked(p);
    }
    let pod_failure = o.pod_failure.as_ref().filter(|_| !o.suspended);
    if o.suspended {
        out.extend([
            c(READY, True, "Suspended", "scaled to zero"),
            c(RECONCILING, False, "Suspended", ""),
            c(STALLED, False, "Suspended", ""),
        ]);
    } else if let Some(err) = o
        .pods_not_created
        .as_ref()
        .filter(|_| o.ready_replicas < o.desired_replicas)
    {
        let msg = format!(
            "{}/{} engines ready; the StatefulSet cannot create engine pods: {err}",
            o.ready_replicas, o.desired_replicas
        );
        out.extend([
            c(READY, False, "PodCreationFailed", msg.clone()),
            c(RECONCILING, False, "PodCreationFailed", ""),
            c(STALLED, True, "PodCreationFailed", msg),
        ]);
    } else if let Some(p) = pod_failure {
        out.extend(failing(p).into_iter().take(3));
    } else if o.ready_replicas >= o.desired_replicas && o.rolled_out {
        let msg = format!("{}/{} engines ready", o.ready_replicas, o.desired_replicas);
        out.extend([
            c(READY, True, "EnginesReady", msg),
            c(RECONCILING, False, "EnginesReady", ""),
            c(STALLED, False, "EnginesReady", ""),
        ]);
    } else {
        let msg = format!(
            "{}/{} engines ready (an engine is ready once every table has its first baseline)",
            o.ready_replicas, o.desired_replicas
        );
        out.extend([
            c(READY, False, "WaitingForEngines", msg.clone()),
            c(RECONCILING, True, "WaitingForEngines", msg),
            c(STALLED, False, "WaitingForEngines", ""),
        ]);
    }
    out.push(caught_up(&o.engines));
    out.push(if o.rebaselining {
        c(
            REBASELINING,
            True,
            "RebaselineObserved",
            "an engine re-baselined recently",
        )
    } else {
        c(REBASELINING, False, "Stable", "no recent re-baseline")
    });
    let short: Vec<String> = o
        .engines
        .iter()
        .filter_map(|e| e.short_chain.as_ref())
        .map(|s| {
            format!(
                "the diff chain stops at {} before the head {} ({})",
                s.reached, s.head, s.reason
            )
        })
        .collect();
    out.push(if let Some(p) = pod_failure {
        // Worse than anything the running engines report: an engine does not run.
        c(DEGRADED, True, &p.reason, p.message.clone())
    } else if let Some(first) = short.first() {
        // Worse than frequent re-baselines: the engines serve an older state than the head.
        c(
            DEGRADED,
            True,
            "ShortChain",
            format!(
                "{}/{} engines serve an older state than the archive's head: {first}; the writer must repair the chain or write a new epoch (see `larch archive verify`)",
                short.len(),
                o.engines.len()
            ),
        )
    } else if o.rebaselines_last_hour > o.max_per_hour {
        c(
            DEGRADED,
            True,
            "FrequentRebaselines",
            format!(
                "{} re-baselines in the last hour (more than {} per hour): the archive's diffs may be broken or too far behind",
                o.rebaselines_last_hour, o.max_per_hour
            ),
        )
    } else {
        c(DEGRADED, False, "AsExpected", format!("{} re-baselines in the last hour", o.rebaselines_last_hour))
    });
    out
}

fn caught_up(engines: &[EngineSource]) -> Cond {
    use Status::*;
    if engines.is_empty() {
        return c(
            CAUGHT_UP,
            Unknown,
            "NoData",
            "no engine reported its status",
        );
    }
    if let Some(s) = engines.iter().find_map(|e| e.short_chain.as_ref()) {
        return c(
            CAUGHT_UP,
            False,
            "ShortChain",
            format!(
                "an engine is stuck at {}: the diff chain does not reach the head {}",
                s.reached, s.head
            ),
        );
    }
    let lagging: Vec<String> = engines
        .iter()
        .filter(|e| {
            let at_head = matches!((&e.position, &e.head), (Some(p), Some(h)) if p == h);
            // How long the oldest diff not applied has waited; from engines without
            // `behind`, the head's age.
            let waited = e.behind.map(|b| b.seconds).or(e.lag_seconds);
            let small_lag = waited.is_some_and(|l| l <= CAUGHT_UP_LAG_SECONDS);
            !(at_head || small_lag)
        })
        // Positions, not the age of the head: the message must not change by itself.
        .map(|e| match (&e.position, &e.head) {
            (Some(p), Some(h)) => format!("at {p}, head {h}"),
            _ => "position behind head".into(),
        })
        .collect();
    if lagging.is_empty() {
        c(
            CAUGHT_UP,
            True,
            "CaughtUp",
            "every engine is at the archive's head",
        )
    } else {
        c(
            CAUGHT_UP,
            False,
            "Lagging",
            format!(
                "{}/{} engines behind: {}",
                lagging.len(),
                engines.len(),
                lagging.join(", ")
            ),
        )
    }
}

// ---------------------------------------------------------------------------------------------
// ArchiveSourceSet

/// Where one selected namespace stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NamespaceState {
    Ready,
    /// Working on it (creating, waiting for engines): the message says what.
    Progressing(String),
    /// Cannot get a working ArchiveSource without someone acting.
    Failing {
        reason: String,
        message: String,
    },
}

/// A namespace's state from the set's own finding (`problem`) or else from
/// its ArchiveSource: Stalled=True is a failure (with its reason and message), Ready=True for
/// the current generation is ready, anything else is in progress.
pub fn namespace_state(
    problem: Option<Problem>,
    child: Option<&crate::crd::ArchiveSource>,
) -> NamespaceState {
    let child = child.map(|c| (c.metadata.generation, c.status.clone().unwrap_or_default()));
    child_state(
        "ArchiveSource",
        problem,
        child
            .as_ref()
            .map(|(g, s)| (*g, s.observed_generation, &s.conditions[..])),
        |_| false,
    )
}

/// A child's state: the set's `problem`, else not created or not observed yet (in progress),
/// Stalled=True or a Ready=False that `failing_ready` calls failing (a failure, with its
/// reason and message), Ready=True (ready), anything else (in progress). `child`: its
/// generation, observed generation and conditions.
fn child_state(
    kind: &str,
    problem: Option<Problem>,
    child: Option<(Option<i64>, Option<i64>, &[Condition])>,
    failing_ready: impl Fn(&Condition) -> bool,
) -> NamespaceState {
    if let Some(Problem {
        reason, message, ..
    }) = problem
    {
        return NamespaceState::Failing { reason, message };
    }
    let Some((generation, observed, conditions)) = child else {
        return NamespaceState::Progressing(format!("the {kind} is not created yet"));
    };
    if observed.is_none() || observed != generation {
        return NamespaceState::Progressing(format!("the {kind} is not observed yet"));
    }
    let find = |t: &str| conditions.iter().find(|c| c.type_ == t);
    let failing = |c: &Condition| NamespaceState::Failing {
        reason: c.reason.clone(),
        message: c.message.clone(),
    };
    if let Some(s) = find(STALLED).filter(|c| c.status == Status::True) {
        return failing(s);
    }
    match find(READY) {
        Some(r) if r.status == Status::True => NamespaceState::Ready,
        Some(r) if failing_ready(r) => failing(r),
        Some(r) => NamespaceState::Progressing(r.message.clone()),
        None => NamespaceState::Progressing(format!("the {kind} reports no Ready condition")),
    }
}

/// A namespace's state from the set's own finding or else from its ArchiveRestore: Stalled,
/// or a run waiting for its database (`DatabaseUnavailable`), is failing; Ready for the
/// current generation is ready; anything else (a run in progress) is in progress.
pub fn restore_namespace_state(
    problem: Option<Problem>,
    child: Option<&crate::crd::ArchiveRestore>,
) -> NamespaceState {
    let status = child.map(|c| c.status.clone().unwrap_or_default());
    // A token the restore has not started a run for yet: not ready, whatever the last run did.
    if problem.is_none()
        && let (Some(c), Some(s)) = (child, &status)
    {
        let token = c
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(crate::crd::archive_restore::RUN_REQUESTED_ANNOTATION));
        if token.is_some() && s.run.as_ref().and_then(|r| r.token.as_ref()) != token {
            return NamespaceState::Progressing("a refresh is requested".into());
        }
    }
    child_state(
        "ArchiveRestore",
        problem,
        child.zip(status.as_ref()).map(|(c, s)| {
            (
                c.metadata.generation,
                s.observed_generation,
                &s.conditions[..],
            )
        }),
        |r| r.reason == DATABASE_UNAVAILABLE,
    )
}

/// Condition reason of a restore whose database cannot be reached yet (it waits and retries).
pub const DATABASE_UNAVAILABLE: &str = "DatabaseUnavailable";

/// What the set controller observed, reduced to what its conditions depend on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetObservation {
    /// The set itself cannot work, e.g. its credentials Secret is missing.
    pub invalid: Option<Problem>,
    /// Every selected namespace, by name.
    pub namespaces: Vec<(String, NamespaceState)>,
}

impl SetObservation {
    pub fn ready(&self) -> usize {
        self.namespaces
            .iter()
            .filter(|(_, s)| *s == NamespaceState::Ready)
            .count()
    }
    /// Failing namespaces, by name: (namespace, reason, message).
    pub fn failing(&self) -> Vec<(&str, &str, &str)> {
        self.namespaces
            .iter()
            .filter_map(|(ns, s)| match s {
                NamespaceState::Failing { reason, message } => {
                    Some((ns.as_str(), reason.as_str(), message.as_str()))
                }
                _ => None,
            })
            .collect()
    }
}

pub fn source_set_conditions(o: &SetObservation) -> Vec<Cond> {
    use Status::*;
    if let Some(Problem {
        reason, message, ..
    }) = &o.invalid
    {
        return vec![
            c(READY, False, reason, message.clone()),
            c(RECONCILING, False, reason, ""),
            c(STALLED, True, reason, message.clone()),
        ];
    }
    let desired = o.namespaces.len();
    let ready = o.ready();
    let failing = o.failing();
    let progressing = desired - ready - failing.len();
    if desired == 0 {
        let msg = "no namespace matches the selector";
        return vec![
            c(READY, True, "NoNamespaces", msg),
            c(RECONCILING, False, "NoNamespaces", ""),
            c(STALLED, False, "NoNamespaces", ""),
        ];
    }
    let counts = format!("{ready}/{desired} namespaces ready");
    if !failing.is_empty() {
        let names: Vec<String> = failing
            .iter()
            .take(10)
            .map(|(ns, reason, _)| format!("{ns} ({reason})"))
            .collect();
        let more = if failing.len() > 10 { ", ..." } else { "" };
        let msg = format!(
            "{counts}; {} failing: {}{more} (see status.failingNamespaces)",
            failing.len(),
            names.join(", ")
        );
        return vec![
            c(READY, False, "NamespacesFailing", msg.clone()),
            if progressing > 0 {
                c(
                    RECONCILING,
                    True,
                    "WaitingForNamespaces",
                    format!("{progressing} namespaces in progress"),
                )
            } else {
                c(RECONCILING, False, "NamespacesFailing", "")
            },
            c(STALLED, True, "NamespacesFailing", msg),
        ];
    }
    if progressing > 0 {
        return vec![
            c(READY, False, "WaitingForNamespaces", counts.clone()),
            c(RECONCILING, True, "WaitingForNamespaces", counts),
            c(STALLED, False, "WaitingForNamespaces", ""),
        ];
    }
    vec![
        c(READY, True, "NamespacesReady", counts),
        c(RECONCILING, False, "NamespacesReady", ""),
        c(STALLED, False, "NamespacesReady", ""),
    ]
}

#[cfg(test)]
mod tests;

/// What an ArchiveRestore reconcile saw.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RestoreObservation {
    /// What the spec names is missing, or the spec cannot work: no Job is created.
    pub blocked: Option<Problem>,
    /// The current run's id and outcome (`None` while it runs).
    pub run: Option<(String, Option<bool>)>,
    /// Why the run's pod failed (its termination message, classified).
    pub pod_failure: Option<Problem>,
    /// The summary line of a run that succeeded.
    pub restored: Option<String>,
}

/// Pod failure reasons that say the target database is not there yet (not reachable, not
/// created, its role not provisioned): the restore waits and tries again, never fails for them.
pub const DATABASE_NOT_READY: [&str; 3] = [
    "ConnectionFailed",
    "DatabaseNotFound",
    "AuthenticationFailed",
];

impl RestoreObservation {
    /// The pod failure, when it says the database is not ready.
    pub fn database_unavailable(&self) -> Option<&Problem> {
        self.pod_failure
            .as_ref()
            .filter(|p| DATABASE_NOT_READY.contains(&p.reason.as_str()))
    }
}

/// `text` with the password of any connection URL (`postgresql://user:secret@host`) and any
/// `password=…` keyword masked: an error may quote the DSN it was given.
pub fn without_credentials(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (i, word) in text.split(' ').enumerate() {
        if i > 0 {
            out.push(' ');
        }
        if let Some(rest) = word.to_ascii_lowercase().find("password=").map(|p| p + 9) {
            out.push_str(&word[..rest]);
            out.push_str("***");
        } else if let (Some(scheme), Some(at)) = (word.find("://"), word.rfind('@'))
            && at > scheme + 3
        {
            let userinfo = &word[scheme + 3..at];
            match userinfo.find(':') {
                Some(colon) => {
                    out.push_str(&word[..scheme + 3 + colon + 1]);
                    out.push_str("***");
                    out.push_str(&word[at..]);
                }
                _ => out.push_str(word),
            }
        } else {
            out.push_str(word);
        }
    }
    out
}

/// kstatus conditions of an ArchiveRestore: `Reconciling` while its Job runs, `Ready` once a
/// run restored, `Stalled` when it cannot start or its run failed (a new spec or a new
/// `larch.dev/run-requested` token runs it again).
pub fn restore_conditions(o: &RestoreObservation) -> Vec<Cond> {
    use Status::*;
    if let Some(p) = &o.blocked {
        return blocked(p);
    }
    match &o.run {
        None => vec![
            c(READY, False, "Pending", "no run yet"),
            c(RECONCILING, True, "Pending", "no run yet"),
            c(STALLED, False, "Pending", ""),
        ],
        Some((id, None)) if o.database_unavailable().is_some() => {
            let p = o.database_unavailable().expect("checked");
            let message = format!(
                "run {id}: waiting for the database ({}), retrying with backoff: {}",
                p.reason,
                without_credentials(&p.message)
            );
            vec![
                c(READY, False, DATABASE_UNAVAILABLE, message.clone()),
                c(RECONCILING, True, DATABASE_UNAVAILABLE, message),
                c(STALLED, False, DATABASE_UNAVAILABLE, ""),
            ]
        }
        Some((id, None)) => {
            let message = match &o.pod_failure {
                Some(p) => format!("run {id}: retrying after a failure: {}", p.message),
                None => format!("run {id}: the restore Job is running"),
            };
            vec![
                c(READY, False, "Restoring", message.clone()),
                c(RECONCILING, True, "Restoring", message),
                c(STALLED, False, "Restoring", ""),
            ]
        }
        Some((id, Some(true))) => {
            let message = format!("run {id}: {}", o.restored.as_deref().unwrap_or("restored"));
            vec![
                c(READY, True, "Restored", message),
                c(RECONCILING, False, "Restored", ""),
                c(STALLED, False, "Restored", ""),
            ]
        }
        Some((id, Some(false))) => {
            let p = o.pod_failure.clone().unwrap_or_else(|| {
                Problem::new(
                    "RestoreFailed",
                    "the restore Job failed (its pod reported no reason)",
                )
            });
            let message = format!("run {id}: {}", p.message);
            vec![
                c(READY, False, &p.reason, message.clone()),
                c(RECONCILING, False, &p.reason, ""),
                c(STALLED, True, &p.reason, message),
            ]
        }
    }
}
