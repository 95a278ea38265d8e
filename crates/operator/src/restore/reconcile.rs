//! The ArchiveRestore controller: dereference (`exportRef`, the Secrets, keys and CA bundles
//! the pod mounts) → validate → start a run (its Job, created once) → observe (the Job, its
//! pod's termination message: the summary or the failure) → status, with Events.
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
use crate::reconcile::apply::{Applier, ChildSet};
use crate::reconcile::conditions::{self, Problem, time_string};
use crate::reconcile::context::{Context, Error, MANAGER_RESTORE};
use crate::reconcile::dereference::{self, Missing};
use crate::reconcile::job::JobPhase;
use crate::reconcile::job::job_phase;
use crate::reconcile::pod_failure;
use crate::restore::build::{self as build, LABEL_RESTORE};
use crate::restore::conditions::{
    DATABASE_UNAVAILABLE, RESTORE_TYPES, RestoreObservation, restore_conditions,
    without_credentials,
};
use crate::restore::dereference::restore_references;
use crate::restore::progress;
use crate::restore::validate;
use larch_contract::restore_request::RestoreSummary;

pub async fn reconcile(restore: Arc<ArchiveRestore>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = restore.namespace().ok_or(Error::NoNamespace)?;
    let applier = Applier::new(&ctx, "restore", MANAGER_RESTORE);
    let mut round = RestoreRound::new(&restore, &ctx, ns);
    if let Some(archive) = round.dereference_and_validate().await? {
        let started = round.start_run(&applier, &archive).await;
        if round.settle(started)? {
            round.observe_run(&applier, &archive).await?;
        }
    }
    round.conditions();
    round.write_status(&applier).await?;
    Ok(Action::requeue(round.requeue))
}

/// One reconcile of a restore.
struct RestoreRound<'a> {
    restore: &'a ArchiveRestore,
    ctx: &'a Context,
    ns: String,
    now: Timestamp,
    old: ArchiveRestoreStatus,
    status: ArchiveRestoreStatus,
    obs: RestoreObservation,
    events: Vec<Event>,
    requeue: Duration,
}

fn event(type_: EventType, reason: &str, note: String) -> Event {
    crate::reconcile::status::event(type_, reason, &note, "Restore")
}

impl<'a> RestoreRound<'a> {
    fn new(restore: &'a ArchiveRestore, ctx: &'a Context, ns: String) -> Self {
        let old = restore.status.clone().unwrap_or_default();
        Self {
            restore,
            ctx,
            ns,
            now: ctx.now(),
            status: ArchiveRestoreStatus {
                observed_generation: restore.metadata.generation,
                ..old.clone()
            },
            old,
            obs: RestoreObservation::default(),
            events: vec![],
            requeue: Duration::from_secs(300),
        }
    }

    fn api<K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>>(&self) -> Api<K>
    where
        K::DynamicType: Default,
    {
        Api::namespaced(self.ctx.client.clone(), &self.ns)
    }

    fn block(&mut self, reason: &str, message: String) {
        self.obs.blocked = Some(Problem::new(reason, message));
    }

    /// The export (`exportRef`) and what the pod mounts, then the archive it reads; `None`:
    /// blocked.
    async fn dereference_and_validate(&mut self) -> Result<Option<ResolvedArchive>, Error> {
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
        if let Some(missing) = missing {
            self.block(missing.reason(), missing.message(&self.ns));
            self.requeue = dereference::RECHECK;
            return Ok(None);
        }
        match validate::restore(self.restore)
            .and_then(|()| build::resolve(self.restore, export.as_ref()))
        {
            Ok(archive) => Ok(Some(archive)),
            Err(message) => {
                self.block("InvalidSpec", message);
                Ok(None)
            }
        }
    }

    /// Creates the Job of a run the spec and token ask for and status does not record yet.
    async fn start_run(
        &mut self,
        applier: &Applier<'_>,
        archive: &ResolvedArchive,
    ) -> Result<(), Error> {
        let token = self
            .restore
            .annotations()
            .get(RUN_REQUESTED_ANNOTATION)
            .cloned();
        let id = build::run_id(self.restore, token.as_deref());
        if self.old.run.as_ref().is_some_and(|r| r.id == id) {
            return Ok(());
        }
        let job = build::job(self.restore, archive, &id, &self.ctx.build);
        let selector = format!("{LABEL_RESTORE}={}", self.restore.name_any());
        let mut set = ChildSet::new(applier, selector);
        set.apply(&job).await?;
        self.status.database_wait = None;
        // The last run's progress is not this one's.
        self.status.progress = None;
        self.status.run = Some(RunStatus {
            id: id.clone(),
            token,
            start_time: Some(time_string(self.now)),
            completion_time: None,
            succeeded: None,
        });
        self.events.push(event(
            EventType::Normal,
            "RestoreStarted",
            format!(
                "run {id}: Job {} created",
                build::job_name(self.restore, &id)
            ),
        ));
        Ok(())
    }

    /// A Job the API server refused blocks the restore (nothing of the run started);
    /// `true`: go on observing.
    fn settle(&mut self, started: Result<(), Error>) -> Result<bool, Error> {
        match started {
            Ok(()) => Ok(true),
            Err(Error::Rejected(r)) => {
                self.status.run = self.old.run.clone();
                self.events.clear();
                self.block("ChildRejected", r.to_string());
                self.requeue = Duration::from_secs(60);
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// The run's Job and pods: its outcome, the summary or why it failed; a run whose database
    /// is not ready is tried again (a new Job) with backoff.
    async fn observe_run(
        &mut self,
        applier: &Applier<'_>,
        archive: &ResolvedArchive,
    ) -> Result<(), Error> {
        let Some(run) = self.status.run.clone() else {
            return Ok(());
        };
        self.obs.run = Some((run.id.clone(), run.succeeded));
        if self.old.run.as_ref().map(|r| &r.id) != Some(&run.id) {
            // Its Job was created this round: the watch on it brings the next.
            self.requeue = Duration::from_secs(15);
            return Ok(());
        }
        if run.succeeded.is_some() {
            // A finished run: what status recorded stands.
            self.obs.pod_failure = self.old_failure();
            self.obs.restored = self.restored_line();
            return Ok(());
        }
        // A running Job's progress is read this often.
        self.requeue = progress::REQUEUE_WHILE_RUNNING;
        let attempt = self.old.database_wait.as_ref().map_or(0, |w| w.attempts);
        let name = build::attempt_job_name(self.restore, &run.id, attempt);
        let job = self
            .api::<Job>()
            .get_opt(&name)
            .await
            .map_err(Error::Observe)?;
        if job.is_none()
            && let Some(wait) = self.old.database_wait.clone()
        {
            return self.next_attempt(applier, archive, &run.id, wait).await;
        }
        let phase = match job {
            Some(job) => job_phase(&job),
            None => JobPhase::Missing,
        };
        let selector = format!(
            "{LABEL_RESTORE}={},{LABEL_RUN}={}",
            self.restore.name_any(),
            run.id
        );
        let listed = self
            .api::<Pod>()
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(Error::Observe)?;
        let uid = self.restore.uid().unwrap_or_default();
        let pods =
            crate::reconcile::owned::owned_pods(&self.ctx.client, &self.ns, &uid, listed.items)
                .await
                .map_err(Error::Observe)?;
        self.obs.pod_failure = pod_failure::newest_terminated(pods.iter(), build::CONTAINER)
            .and_then(|(pod, t)| pod_failure::of_terminated(&pod, t))
            .map(|f| Problem::of_pod("restore", &f))
            // A retry that has not failed yet: the database is unavailable as far as we know.
            .or_else(|| self.old.database_wait.as_ref().map(DatabaseWait::problem));
        let old = self.old.progress.as_ref();
        self.status.progress = progress::of_run(self.ctx, &pods, &phase, old, self.now).await;
        let succeeded = match phase {
            JobPhase::Active => return Ok(()),
            JobPhase::Succeeded => self.record_summary(&pods, &name),
            JobPhase::Failed if self.obs.database_unavailable().is_some() => {
                return self.wait_for_database(applier, &name, attempt).await;
            }
            JobPhase::Failed => false,
            JobPhase::Missing => {
                self.obs.pod_failure.get_or_insert(Problem::new(
                    "JobMissing",
                    format!("Job {name} is gone before it finished; set a new {RUN_REQUESTED_ANNOTATION} to run again"),
                ));
                false
            }
        };
        self.finish_run(&run.id, succeeded);
        Ok(())
    }

    /// A completed Job's summary (from its pods' termination message) into status: whether
    /// one was found.
    fn record_summary(&mut self, pods: &[Pod], job: &str) -> bool {
        match pods.iter().find_map(summary_of) {
            Some(s) => {
                self.record(&s);
                true
            }
            None => {
                self.obs.pod_failure = Some(Problem::new(
                    "SummaryMissing",
                    format!("Job {job} completed, but no pod of it reported a summary"),
                ));
                false
            }
        }
    }

    /// The run ended: its outcome into status, and an Event saying so.
    fn finish_run(&mut self, run_id: &str, succeeded: bool) {
        self.status.database_wait = None;
        let r = self.status.run.as_mut().expect("run exists");
        r.succeeded = Some(succeeded);
        r.completion_time = Some(time_string(self.now));
        self.obs.run = Some((run_id.to_string(), Some(succeeded)));
        self.obs.restored = self.restored_line();
        self.requeue = Duration::from_secs(300);
        self.events.push(if succeeded {
            event(
                EventType::Normal,
                "RestoreSucceeded",
                format!(
                    "run {run_id}: {}",
                    self.obs.restored.clone().unwrap_or_default()
                ),
            )
        } else {
            let why = self
                .obs
                .pod_failure
                .as_ref()
                .map(|p| p.message.clone())
                .unwrap_or_else(|| "the Job failed".into());
            event(
                EventType::Warning,
                "RestoreFailed",
                format!("run {run_id}: {why}"),
            )
        });
    }

    /// The attempt's Job failed because the database is not ready: it is deleted (with its
    /// pods) and the next attempt scheduled after a backoff; the run stays in progress.
    async fn wait_for_database(
        &mut self,
        applier: &Applier<'_>,
        job: &str,
        attempt: i32,
    ) -> Result<(), Error> {
        applier
            .delete(&self.api::<Job>(), job)
            .await
            .map_err(Error::Apply)?;
        let attempts = attempt + 1;
        let backoff = database_backoff(attempts);
        let next = self.now + jiff::SignedDuration::from_secs(backoff.as_secs() as i64);
        let (reason, error) = self
            .obs
            .database_unavailable()
            .map(|p| (p.reason.clone(), without_credentials(&p.message)))
            .unwrap_or_default();
        self.status.database_wait = Some(DatabaseWait {
            reason,
            attempts,
            next_attempt_time: time_string(next),
            error: error.chars().take(1024).collect(),
        });
        self.requeue = backoff;
        if attempt == 0 {
            self.events.push(event(
                EventType::Warning,
                DATABASE_UNAVAILABLE,
                format!("the target database is not ready, retrying with backoff: {error}"),
            ));
        }
        Ok(())
    }

    /// A run waiting for its database: creates the next attempt's Job once its time came.
    async fn next_attempt(
        &mut self,
        applier: &Applier<'_>,
        archive: &ResolvedArchive,
        run: &str,
        wait: DatabaseWait,
    ) -> Result<(), Error> {
        // Still unavailable as far as we know: the last attempt's error stands.
        self.obs.pod_failure = Some(wait.problem());
        let due = wait
            .next_attempt_time
            .parse::<Timestamp>()
            .unwrap_or(self.now);
        if due > self.now {
            let left = due.duration_since(self.now).as_secs().max(1);
            self.requeue = Duration::from_secs(left as u64);
            return Ok(());
        }
        let job = build::attempt_job(self.restore, archive, run, wait.attempts, &self.ctx.build);
        let selector = format!("{LABEL_RESTORE}={}", self.restore.name_any());
        ChildSet::new(applier, selector).apply(&job).await?;
        self.requeue = Duration::from_secs(15);
        Ok(())
    }

    /// The failure status recorded for a finished run (its `Stalled` condition).
    fn old_failure(&self) -> Option<Problem> {
        self.old
            .conditions
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

    /// Puts a run's summary into status.
    fn record(&mut self, s: &RestoreSummary) {
        self.status.position = Some(s.position.clone());
        self.status.at = s.at.clone();
        self.status.duration_seconds = Some(s.duration_seconds);
        self.status.tables = s
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
            .collect();
    }

    /// `restored 2 tables (public.a 10 rows, …) at 0/16B3748 in 1.2s`, from status.
    fn restored_line(&self) -> Option<String> {
        let position = self.status.position.as_ref()?;
        let tables: Vec<String> = self
            .status
            .tables
            .iter()
            .map(|t| format!("{} {} rows", t.table, t.rows))
            .collect();
        Some(format!(
            "restored {} table(s) ({}) at {position} in {}s",
            tables.len(),
            tables.join(", "),
            self.status.duration_seconds.unwrap_or_default()
        ))
    }

    fn conditions(&mut self) {
        let desired = restore_conditions(&self.obs);
        self.status.conditions = conditions::merge(
            &self.old.conditions,
            &desired,
            &RESTORE_TYPES,
            self.now,
            self.restore.metadata.generation,
        );
    }

    /// Status (only when changed), with this round's Events and those of a block that starts
    /// or clears.
    async fn write_status(&mut self, applier: &Applier<'_>) -> Result<(), Error> {
        // A run's own Event says how it ended; the others report a block and its end.
        if self.events.is_empty() {
            self.events.extend(crate::reconcile::status::export_events(
                &self.old.conditions,
                &self.status.conditions,
            ));
        }
        let restore = self.restore;
        applier
            .report(
                &self.api::<ArchiveRestore>(),
                restore,
                restore.status.as_ref(),
                &self.status,
                &self.events,
            )
            .await
    }
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
