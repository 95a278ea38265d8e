//! The ArchiveRestore controller, as steps that take and return values: dereference
//! (`exportRef`, the Secrets, keys and CA bundles the pod mounts) → validate → build (the run
//! and its Job, when new) → apply (the Job, created once) → observe (the Job, its pod's
//! termination message: the summary or the failure) → status, with Events.
//!
//! A run is identified, as a OneShot export's, by a hash of the spec and the
//! `larch.dev/run-requested` token: a new spec or a new token restores again; a recorded run is
//! only observed, never re-created (its Job removed by its TTL does not run again).

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};

use crate::builders::LABEL_RUN;
use crate::builders::engine_config::ResolvedArchive;
use crate::crd::archive_export::{ArchiveExport, RunStatus};
use crate::crd::archive_restore::{
    ArchiveRestore, ArchiveRestoreStatus, DatabaseWait, RUN_REQUESTED_ANNOTATION, RestoredTable,
};
use crate::crd::progress::OperationProgress;
use crate::reconcile::apply::{Applier, ChildSet};
use crate::reconcile::conditions::{self, Problem, time_string};
use crate::reconcile::context::{Context, Error, MANAGER_RESTORE};
use crate::reconcile::dereference::{self, Missing};
use crate::reconcile::job::JobPhase;
use crate::reconcile::job::job_phase;
use crate::reconcile::pod_failure;
use crate::reconcile::step::Blocked;
use crate::restore::build::{self as build, LABEL_RESTORE};
use crate::restore::conditions::{
    DATABASE_NOT_READY, DATABASE_UNAVAILABLE, RESTORE_TYPES, RestoreObservation,
    restore_conditions, without_credentials,
};
use crate::restore::dereference::restore_references;
use crate::restore::progress;
use crate::restore::validate;
use larch_contract::restore_request::RestoreSummary;

/// The requeue of a restore with nothing under way.
const IDLE: Duration = Duration::from_secs(300);
/// The requeue while a run's Job runs: how often its progress is read.
const RUNNING: Duration = progress::REQUEUE_WHILE_RUNNING;

pub async fn reconcile(restore: Arc<ArchiveRestore>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = restore.namespace().ok_or(Error::NoNamespace)?;
    let applier = Applier::new(&ctx, "restore", MANAGER_RESTORE);
    let round = Round::new(&restore, &ctx, &applier, ns);
    let old = restore.status.clone().unwrap_or_default();
    let resolved = round.dereference().await?;
    let found = match resolved.and_then(|export| validate(&restore, export.as_ref())) {
        Err(blocked) => Found::blocked(&old, blocked),
        Ok(archive) => {
            let new_run = build_run(&restore, &old, &archive, &ctx.build, round.now);
            match round.apply(new_run).await {
                Err(Error::Rejected(r)) => Found::blocked(&old, Blocked::rejected(&r)),
                started => round.observe(&old, &archive, started?).await?,
            }
        }
    };
    let (status, events, requeue) = status(&restore, old, found, round.now);
    round.write_status(&status, &events).await?;
    Ok(Action::requeue(requeue))
}

/// What one reconcile of a restore works with; its steps change none of it.
struct Round<'a> {
    restore: &'a ArchiveRestore,
    ctx: &'a Context,
    applier: &'a Applier<'a>,
    ns: String,
    now: Timestamp,
}

/// What a round found of its restore and did to its run: all its status is made of.
struct Found {
    /// Nothing was built (the observation's `blocked`), and when to look again.
    blocked: Option<Blocked>,
    /// The run status records (the old one while nothing changed it).
    run: Option<RunStatus>,
    /// The database wait status records.
    database_wait: Option<DatabaseWait>,
    /// Why the run's pod failed, or what status recorded for a finished run.
    pod_failure: Option<Problem>,
    /// The summary of a run that just succeeded.
    summary: Option<RestoreSummary>,
    /// The run's progress status records (none for a run started this round).
    progress: Option<OperationProgress>,
    /// What happened to the run, for its Event.
    change: Change,
    requeue: Duration,
}

/// What happened to the run this round (each has its Event).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Change {
    None,
    Started,
    /// Its database is not ready: the next attempt waits (`first`: the first time).
    Waiting {
        first: bool,
    },
    /// It ended, successfully or not.
    Ended(bool),
}

impl Found {
    /// Nothing was done: status keeps its run.
    fn blocked(old: &ArchiveRestoreStatus, blocked: Blocked) -> Found {
        Found {
            requeue: blocked.recheck.unwrap_or(IDLE),
            blocked: Some(blocked),
            ..Found::kept(old)
        }
    }

    /// The old run as status recorded it, nothing new.
    fn kept(old: &ArchiveRestoreStatus) -> Found {
        Found {
            blocked: None,
            run: old.run.clone(),
            database_wait: old.database_wait.clone(),
            pod_failure: None,
            summary: None,
            progress: old.progress.clone(),
            change: Change::None,
            requeue: IDLE,
        }
    }
}

/// What the schema cannot check, then the archive the pod reads.
pub(crate) fn validate(
    restore: &ArchiveRestore,
    export: Option<&ArchiveExport>,
) -> Result<ResolvedArchive, Blocked> {
    let archive = validate::restore(restore)
        .and_then(|()| build::resolve(restore, export))
        .map_err(Blocked::invalid)?;
    // Applied together (GitOps), the restore would start before its export wrote anything and
    // fail for an archive that is only not there yet: it waits for the export's first archive.
    if let Some(export) = export.filter(|e| {
        e.status
            .as_ref()
            .and_then(|s| s.last_export.as_ref())
            .is_none()
    }) {
        return Err(Blocked {
            problem: Problem::new(
                "ExportNotReady",
                format!(
                    "ArchiveExport {} has written no archive yet: the restore starts once it has",
                    export.name_any()
                ),
            ),
            recheck: Some(crate::reconcile::dereference::RECHECK),
        });
    }
    Ok(archive)
}

/// A run the spec and token ask for and status does not record yet, and its Job.
fn build_run(
    restore: &ArchiveRestore,
    old: &ArchiveRestoreStatus,
    archive: &ResolvedArchive,
    build_ctx: &crate::builders::BuildContext,
    now: Timestamp,
) -> Option<(RunStatus, Job)> {
    let token = restore.annotations().get(RUN_REQUESTED_ANNOTATION).cloned();
    let id = build::run_id(restore, token.as_deref());
    if old.run.as_ref().is_some_and(|r| r.id == id) {
        return None;
    }
    let job = build::job(restore, archive, &id, build_ctx);
    let run = RunStatus {
        id,
        token,
        start_time: Some(time_string(now)),
        completion_time: None,
        succeeded: None,
    };
    Some((run, job))
}

impl<'a> Round<'a> {
    fn new(
        restore: &'a ArchiveRestore,
        ctx: &'a Context,
        applier: &'a Applier<'a>,
        ns: String,
    ) -> Self {
        Self {
            restore,
            ctx,
            applier,
            ns,
            now: ctx.now(),
        }
    }

    fn api<K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>>(&self) -> Api<K>
    where
        K::DynamicType: Default,
    {
        Api::namespaced(self.ctx.client.clone(), &self.ns)
    }

    /// The export (`exportRef`), then what the pod mounts; returns the export.
    async fn dereference(&self) -> Result<Result<Option<ArchiveExport>, Blocked>, Error> {
        let spec = &self.restore.spec;
        let export = match &spec.archive.export_ref {
            Some(r) => self
                .api::<ArchiveExport>()
                .get_opt(&r.name)
                .await
                .map_err(Error::Dereference)?,
            None => None,
        };
        let missing = match (&spec.archive.export_ref, &export) {
            (Some(r), None) => Some(Missing::Export {
                name: r.name.clone(),
            }),
            _ => {
                let references = restore_references(self.restore, export.as_ref());
                dereference::check(&self.ctx.client, &self.ns, &references)
                    .await
                    .map_err(Error::Dereference)?
            }
        };
        Ok(match missing {
            Some(missing) => Err(Blocked::missing(&missing, &self.ns)),
            None => Ok(export),
        })
    }

    /// Creates the Job of a new run; returns the run it started.
    async fn apply(&self, new_run: Option<(RunStatus, Job)>) -> Result<Option<RunStatus>, Error> {
        let Some((run, job)) = new_run else {
            return Ok(None);
        };
        ChildSet::new(self.applier, self.selector())
            .apply(&job)
            .await?;
        Ok(Some(run))
    }

    fn selector(&self) -> String {
        format!("{LABEL_RESTORE}={}", self.restore.name_any())
    }

    /// The run: one started this round waits for its Job's watch, a finished one stands as
    /// status recorded it, a running one is observed ([`Self::observe_attempt`]).
    async fn observe(
        &self,
        old: &ArchiveRestoreStatus,
        archive: &ResolvedArchive,
        started: Option<RunStatus>,
    ) -> Result<Found, Error> {
        let kept = Found::kept(old);
        if let Some(run) = started {
            return Ok(Found {
                run: Some(run),
                database_wait: None,
                // The last run's progress is not this one's.
                progress: None,
                change: Change::Started,
                requeue: RUNNING,
                ..kept
            });
        }
        match &old.run {
            None => Ok(kept),
            Some(run) if run.succeeded.is_some() => Ok(Found {
                pod_failure: old_failure(old),
                ..kept
            }),
            Some(run) => self.observe_attempt(old, archive, &run.id, kept).await,
        }
    }

    /// The running attempt's Job and pods: its outcome, the summary or why it failed; a run
    /// whose database is not ready is tried again (a new Job) with backoff.
    async fn observe_attempt(
        &self,
        old: &ArchiveRestoreStatus,
        archive: &ResolvedArchive,
        run: &str,
        kept: Found,
    ) -> Result<Found, Error> {
        let attempt = old.database_wait.as_ref().map_or(0, |w| w.attempts);
        let name = build::attempt_job_name(self.restore, run, attempt);
        let job = self
            .api::<Job>()
            .get_opt(&name)
            .await
            .map_err(Error::Observe)?;
        if job.is_none()
            && let Some(wait) = old.database_wait.clone()
        {
            return self.next_attempt(archive, run, wait, kept).await;
        }
        let phase = job.as_ref().map_or(JobPhase::Missing, job_phase);
        let pods = self.run_pods(run).await?;
        let pod_failure = pod_failure::newest_terminated(pods.iter(), build::CONTAINER)
            .and_then(|(pod, t)| pod_failure::of_terminated(&pod, t))
            .map(|f| Problem::of_pod("restore", &f))
            // A retry that has not failed yet: the database is unavailable as far as we know.
            .or_else(|| old.database_wait.as_ref().map(DatabaseWait::problem));
        let progress =
            progress::of_run(self.ctx, &pods, &phase, old.progress.as_ref(), self.now).await;
        let running = Found {
            pod_failure,
            progress,
            requeue: RUNNING,
            ..kept
        };
        Ok(match phase {
            JobPhase::Active => running,
            JobPhase::Succeeded => match pods.iter().find_map(summary_of) {
                Some(summary) => ended(running, true, Some(summary)),
                None => ended(
                    Found {
                        pod_failure: Some(Problem::new(
                            "SummaryMissing",
                            format!("Job {name} completed, but no pod of it reported a summary"),
                        )),
                        ..running
                    },
                    false,
                    None,
                ),
            },
            JobPhase::Failed if database_unavailable(&running).is_some() => {
                return self.wait_for_database(&name, attempt, running).await;
            }
            JobPhase::Failed => ended(running, false, None),
            JobPhase::Missing => {
                let missing = Problem::new(
                    "JobMissing",
                    format!(
                        "Job {name} is gone before it finished; set a new {RUN_REQUESTED_ANNOTATION} to run again"
                    ),
                );
                let pod_failure = running.pod_failure.clone().or(Some(missing));
                ended(
                    Found {
                        pod_failure,
                        ..running
                    },
                    false,
                    None,
                )
            }
        })
    }

    /// The run's pods (those whose owner chain reaches the restore).
    async fn run_pods(&self, run: &str) -> Result<Vec<Pod>, Error> {
        let selector = format!("{},{LABEL_RUN}={run}", self.selector());
        let listed = self
            .api::<Pod>()
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(Error::Observe)?;
        let uid = self.restore.uid().unwrap_or_default();
        crate::reconcile::owned::owned_pods(&self.ctx.client, &self.ns, &uid, listed.items)
            .await
            .map_err(Error::Observe)
    }

    /// The attempt's Job failed because the database is not ready: it is deleted (with its
    /// pods) and the next attempt scheduled after a backoff; the run stays in progress.
    async fn wait_for_database(
        &self,
        job: &str,
        attempt: i32,
        found: Found,
    ) -> Result<Found, Error> {
        self.applier
            .delete(&self.api::<Job>(), job)
            .await
            .map_err(Error::Apply)?;
        let attempts = attempt + 1;
        let backoff = database_backoff(attempts);
        let next = self.now + jiff::SignedDuration::from_secs(backoff.as_secs() as i64);
        let (reason, error) = database_unavailable(&found)
            .map(|p| (p.reason.clone(), without_credentials(&p.message)))
            .unwrap_or_default();
        Ok(Found {
            database_wait: Some(DatabaseWait {
                reason,
                attempts,
                next_attempt_time: time_string(next),
                error: error.chars().take(1024).collect(),
            }),
            change: Change::Waiting {
                first: attempt == 0,
            },
            requeue: backoff,
            ..found
        })
    }

    /// A run waiting for its database: creates the next attempt's Job once its time came.
    async fn next_attempt(
        &self,
        archive: &ResolvedArchive,
        run: &str,
        wait: DatabaseWait,
        kept: Found,
    ) -> Result<Found, Error> {
        // Still unavailable as far as we know: the last attempt's error stands.
        let waiting = Found {
            pod_failure: Some(wait.problem()),
            ..kept
        };
        let due = wait
            .next_attempt_time
            .parse::<Timestamp>()
            .unwrap_or(self.now);
        if due > self.now {
            let left = due.duration_since(self.now).as_secs().max(1);
            return Ok(Found {
                requeue: Duration::from_secs(left as u64),
                ..waiting
            });
        }
        let job = build::attempt_job(self.restore, archive, run, wait.attempts, &self.ctx.build);
        ChildSet::new(self.applier, self.selector())
            .apply(&job)
            .await?;
        Ok(Found {
            requeue: RUNNING,
            ..waiting
        })
    }

    /// Status (only when changed), with this round's Events.
    async fn write_status(
        &self,
        status: &ArchiveRestoreStatus,
        events: &[Event],
    ) -> Result<(), Error> {
        let restore = self.restore;
        self.applier
            .report(
                &self.api::<ArchiveRestore>(),
                restore,
                restore.status.as_ref(),
                status,
                events,
            )
            .await
    }
}

/// The run ended this round: its outcome (and a success's summary) for status.
fn ended(found: Found, succeeded: bool, summary: Option<RestoreSummary>) -> Found {
    Found {
        database_wait: None,
        summary,
        change: Change::Ended(succeeded),
        requeue: IDLE,
        ..found
    }
}

/// The pod failure, when it says the database is not ready.
fn database_unavailable(found: &Found) -> Option<&Problem> {
    found
        .pod_failure
        .as_ref()
        .filter(|p| DATABASE_NOT_READY.contains(&p.reason.as_str()))
}

/// The status of what the round found: the run and its summary, the conditions, this round's
/// Events (a run's own says how it ended; the others report a block and its end), the requeue.
fn status(
    restore: &ArchiveRestore,
    old: ArchiveRestoreStatus,
    found: Found,
    now: Timestamp,
) -> (ArchiveRestoreStatus, Vec<Event>, Duration) {
    let run = found.run.clone().map(|run| match found.change {
        Change::Ended(ok) => RunStatus {
            succeeded: Some(ok),
            completion_time: Some(time_string(now)),
            ..run
        },
        _ => run,
    });
    let status = with_summary(
        ArchiveRestoreStatus {
            observed_generation: restore.metadata.generation,
            run: run.clone(),
            database_wait: found.database_wait.clone(),
            progress: found.progress.clone(),
            ..old.clone()
        },
        found.summary.as_ref(),
    );
    let obs = RestoreObservation {
        run: run
            .as_ref()
            .filter(|_| found.blocked.is_none())
            .map(|r| (r.id.clone(), r.succeeded)),
        restored: run
            .as_ref()
            .filter(|r| found.blocked.is_none() && r.succeeded.is_some())
            .and_then(|_| restored_line(&status)),
        blocked: found.blocked.map(|b| b.problem),
        pod_failure: found.pod_failure,
    };
    let status = ArchiveRestoreStatus {
        conditions: conditions::merge(
            &old.conditions,
            &restore_conditions(&obs),
            &RESTORE_TYPES,
            now,
            restore.metadata.generation,
        ),
        ..status
    };
    let mut events = run_events(restore, run.as_ref(), found.change, &obs);
    if events.is_empty() {
        events = crate::reconcile::status::export_events(&old.conditions, &status.conditions);
    }
    (status, events, found.requeue)
}

fn event(type_: EventType, reason: &str, note: String) -> Event {
    crate::reconcile::status::event(type_, reason, &note, "Restore")
}

/// The Event of what happened to the run this round, if anything did.
fn run_events(
    restore: &ArchiveRestore,
    run: Option<&RunStatus>,
    change: Change,
    obs: &RestoreObservation,
) -> Vec<Event> {
    let id = run.map(|r| r.id.as_str()).unwrap_or_default();
    let event = match change {
        Change::None | Change::Waiting { first: false } => return vec![],
        Change::Started => event(
            EventType::Normal,
            "RestoreStarted",
            format!("run {id}: Job {} created", build::job_name(restore, id)),
        ),
        Change::Waiting { first: true } => {
            let error = obs
                .database_unavailable()
                .map(|p| without_credentials(&p.message))
                .unwrap_or_default();
            event(
                EventType::Warning,
                DATABASE_UNAVAILABLE,
                format!("the target database is not ready, retrying with backoff: {error}"),
            )
        }
        Change::Ended(true) => event(
            EventType::Normal,
            "RestoreSucceeded",
            format!("run {id}: {}", obs.restored.clone().unwrap_or_default()),
        ),
        Change::Ended(false) => {
            let why = obs
                .pod_failure
                .as_ref()
                .map(|p| p.message.clone())
                .unwrap_or_else(|| "the Job failed".into());
            event(
                EventType::Warning,
                "RestoreFailed",
                format!("run {id}: {why}"),
            )
        }
    };
    vec![event]
}

/// The failure status recorded for a finished run (its `Stalled` condition).
fn old_failure(old: &ArchiveRestoreStatus) -> Option<Problem> {
    old.conditions
        .iter()
        .find(|c| c.type_ == conditions::STALLED && c.status == conditions::Status::True)
        .map(|c| {
            let message = c
                .message
                .split_once(": ")
                .map(|(_, m)| m)
                .unwrap_or(&c.message);
            Problem::new(c.reason.clone(), message.to_string())
        })
}

/// `status` with a run's summary in it.
fn with_summary(status: ArchiveRestoreStatus, s: Option<&RestoreSummary>) -> ArchiveRestoreStatus {
    let Some(s) = s else {
        return status;
    };
    ArchiveRestoreStatus {
        position: Some(s.position.clone()),
        at: s.at.clone(),
        duration_seconds: Some(s.duration_seconds),
        tables: s
            .tables
            .iter()
            .take(32)
            .map(|t| RestoredTable {
                table: t.table.clone(),
                rows: i64::try_from(t.rows).unwrap_or(i64::MAX),
                position: t.position.clone(),
                archived_at: (!t.archived_at.is_empty()).then(|| t.archived_at.clone()),
                action: t.action.clone(),
            })
            .collect(),
        ..status
    }
}

/// `restored 2 tables (public.a 10 rows, …) at 0/16B3748 in 1.2s`, from status.
fn restored_line(status: &ArchiveRestoreStatus) -> Option<String> {
    let position = status.position.as_ref()?;
    let tables: Vec<String> = status
        .tables
        .iter()
        .map(|t| format!("{} {} rows", t.table, t.rows))
        .collect();
    Some(format!(
        "restored {} table(s) ({}) at {position} in {}s",
        tables.len(),
        tables.join(", "),
        status.duration_seconds.unwrap_or_default()
    ))
}

impl DatabaseWait {
    fn problem(&self) -> Problem {
        Problem::new(self.reason.clone(), self.error.clone())
    }
}

/// Wait before attempt `attempts + 1` of a run whose database was not ready: 15 s, doubling,
/// at most 5 minutes.
pub fn database_backoff(attempts: i32) -> Duration {
    let exp = attempts.clamp(1, 6) - 1;
    Duration::from_secs((15u64 << exp).min(300))
}

/// The summary in the termination message of a pod's restore container that exited 0.
pub(crate) fn summary_of(pod: &Pod) -> Option<RestoreSummary> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    statuses
        .iter()
        .filter(|c| c.name == build::CONTAINER)
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref())
        .filter(|t| t.exit_code == 0)
        .find_map(|t| serde_json::from_str(t.message.as_deref()?.trim()).ok())
}

#[cfg(test)]
mod tests {
    use super::database_backoff;
    use std::time::Duration;

    #[test]
    fn the_database_backoff_doubles_up_to_five_minutes() {
        let secs: Vec<u64> = (1..=8).map(|n| database_backoff(n).as_secs()).collect();
        assert_eq!(secs, [15, 30, 60, 120, 240, 300, 300, 300]);
        assert_eq!(database_backoff(0), Duration::from_secs(15));
    }
}
