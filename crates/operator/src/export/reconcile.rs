//! The ArchiveExport controller, as steps that take and return values: dereference (the
//! Secrets, keys, CA bundles and claim the spec names) → validate (what the schema cannot check) → build → apply (server-side apply, one
//! field manager; a refused child is a condition) → observe (Jobs, pods' termination messages
//! and failures, writers' `/status`) → status, with Events on failure transitions.
//!
//! OneShot runs: a run is identified by a hash of the spec and the `larch.dev/run-requested`
//! token. Its Jobs are created once, when the run is new; the run is then recorded in status, and
//! a recorded run is only ever observed, never re-created, so a Job removed by its TTL (or by
//! hand) does not run again. A new spec or a new token starts a new run.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};

use crate::builders::{ANNOTATION_TABLE, LABEL_EXPORT, LABEL_RUN};
use crate::crd::archive_export::{
    ArchiveExport, ArchiveExportStatus, ExportMode, ExportSummary, RUN_REQUESTED_ANNOTATION,
    RunStatus,
};
use crate::crd::progress::OperationProgress;
use crate::export::build;
use crate::export::children::{self, ExportChildren, apply_children, prune_children};
use crate::export::conditions::{
    EXPORT_TYPES, ExportObservation, PodOutcome, WriterCounts, export_conditions, run_outcome,
};
use crate::export::dereference::export_references;
use crate::export::lease_rights;
use crate::export::writers::{newest_snapshot, probe_writers, writer_counts};
use crate::export::{observe, split, validate};
use crate::reconcile::apply::{Applier, ChildSet};
use crate::reconcile::conditions::{self, Problem, Status, time_string};
use crate::reconcile::context::{Context, Error, MANAGER_EXPORT, Rejected};
use crate::reconcile::dereference;
use crate::reconcile::job::JobPhase;
use crate::reconcile::pod_failure::{self, PodFailure};
use crate::reconcile::progress;
use crate::reconcile::step::Blocked;

/// The run the spec and token ask for: always one without a schedule; with a schedule only
/// when the run-requested annotation is set.
pub fn wanted_run(export: &ArchiveExport) -> Option<(String, Option<String>)> {
    if export.spec.mode != ExportMode::OneShot {
        return None;
    }
    let token = export.annotations().get(RUN_REQUESTED_ANNOTATION).cloned();
    if export.spec.schedule.is_some() && token.is_none() {
        return None;
    }
    Some((build::run_id(export, token.as_deref()), token))
}

/// Finished export pods: successes (parsed summaries) and the outcome of the newest one.
struct PodFindings {
    summaries: Vec<ExportSummary>,
    newest: Option<FinishedPod>,
}

/// The newest finished export container.
struct FinishedPod {
    /// When it finished (RFC 3339; empty when unknown).
    finished_at: String,
    outcome: PodOutcome,
}

fn read_pods(pods: &[Pod]) -> PodFindings {
    let mut out = PodFindings {
        summaries: vec![],
        newest: None,
    };
    for pod in pods {
        let Some(statuses) = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
        else {
            continue;
        };
        for cs in statuses.iter().filter(|c| c.name == build::CONTAINER) {
            let Some(term) = cs.state.as_ref().and_then(|s| s.terminated.as_ref()) else {
                continue;
            };
            let finished = term.finished_at.as_ref().map(|t| time_string(t.0));
            let message = term.message.clone().unwrap_or_default();
            let ok = term.exit_code == 0;
            if ok {
                // A set's export summarises every table it exported.
                for mut s in
                    observe::parse_summaries(&message, finished.clone(), Some(pod.name_any()))
                {
                    if s.table.is_empty()
                        && let Some(t) = pod.annotations().get(ANNOTATION_TABLE)
                    {
                        s.table = t.clone();
                    }
                    out.summaries.push(s);
                }
            }
            let detail = if ok {
                format!("pod {} exported", pod.name_any())
            } else {
                let reason = term.reason.clone().unwrap_or_else(|| "Error".into());
                let msg: String = message.chars().take(512).collect();
                format!(
                    "pod {} exited {} ({reason}): {msg}",
                    pod.name_any(),
                    term.exit_code
                )
            };
            let finished_at = finished.unwrap_or_default();
            if out
                .newest
                .as_ref()
                .is_none_or(|n| finished_at > n.finished_at)
            {
                out.newest = Some(FinishedPod {
                    finished_at,
                    outcome: PodOutcome {
                        succeeded: ok,
                        detail,
                    },
                });
            }
        }
    }
    out
}

/// The constraint preflight of the newest finished export container among `pods`, if that
/// one succeeded and its summary has one.
fn newest_preflight<'a>(
    pods: impl Iterator<Item = &'a Pod>,
) -> Option<larch_contract::preflight::PreflightSummary> {
    let (_, terminated) = pod_failure::newest_terminated(pods, build::CONTAINER)?;
    match terminated.exit_code {
        0 => observe::parse_preflight(terminated.message.as_deref()?),
        _ => None,
    }
}

/// The failure of the newest finished export container among `pods`, if that one failed.
fn newest_failure<'a>(pods: impl Iterator<Item = &'a Pod>) -> Option<PodFailure> {
    let (pod, terminated) = pod_failure::newest_terminated(pods, build::CONTAINER)?;
    pod_failure::of_terminated(&pod, terminated)
}

/// Keeps the newest summary per table.
fn merge_summaries(mut known: Vec<ExportSummary>, new: Vec<ExportSummary>) -> Vec<ExportSummary> {
    for s in new {
        match known.iter_mut().find(|k| k.table == s.table) {
            Some(k) if k.time <= s.time => *k = s,
            Some(_) => {}
            None => known.push(s),
        }
    }
    known.sort_by(|a, b| a.table.cmp(&b.table));
    known.truncate(32);
    known
}

pub async fn reconcile(export: Arc<ArchiveExport>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = export.namespace().ok_or(Error::NoNamespace)?;
    if let Some(action) = finalize(&export, &ctx).await? {
        return Ok(action);
    }
    // Exports are few (not one per namespace): children are read back, not cached. Nothing
    // is built while what the spec names is missing or the spec cannot work.
    let applier = Applier::new(&ctx, "export", MANAGER_EXPORT);
    let round = Round::new(&export, &ctx, &applier, ns);
    let old = export.status.clone().unwrap_or_default();
    let resolved = round.dereference().await?;
    let found = match resolved.and_then(|()| validate(&export)) {
        Err(blocked) => Found::blocked(&export, &old, blocked),
        Ok(()) => {
            let new_run = build_run(&export, &old, round.now);
            let run_id = new_run.as_ref().map(|r| r.id.as_str());
            let children = children::children(&export, run_id, &ctx.build);
            match round.apply(&children).await {
                Err(Error::Rejected(r)) => Found::rejected(&export, &old, &r, new_run.is_some()),
                applied => round.observe(&old, new_run, &children, &applied?).await?,
            }
        }
    };
    let (status, events, requeue) = status(&export, &old, found, round.now);
    round.record_metrics(&status);
    round.write_status(&status, &events).await?;
    Ok(Action::requeue(requeue))
}

/// A deleted export is finalized; one without the finalizer gets it first (the watch brings
/// it back with it). `None`: go on reconciling.
async fn finalize(
    export: &Arc<ArchiveExport>,
    ctx: &Arc<Context>,
) -> Result<Option<Action>, Error> {
    if export.metadata.deletion_timestamp.is_some() {
        let action = crate::export::finalizer::finalize(export.clone(), ctx.clone()).await?;
        return Ok(Some(action));
    }
    let added = crate::export::finalizer::ensure_finalizer(export, ctx).await?;
    Ok(added.then(Action::await_change))
}

/// What the schema cannot check.
fn validate(export: &ArchiveExport) -> Result<(), Blocked> {
    validate::export(export).map_err(Blocked::invalid)
}

/// The run the spec and token ask for that status does not record yet (none while suspended),
/// as status records it once its Jobs are created.
fn build_run(
    export: &ArchiveExport,
    old: &ArchiveExportStatus,
    now: Timestamp,
) -> Option<RunStatus> {
    let (id, token) = wanted_run(export)?;
    if old.run.as_ref().is_some_and(|r| r.id == id) || export.spec.suspend == Some(true) {
        return None;
    }
    Some(RunStatus {
        id,
        token,
        start_time: Some(time_string(now)),
        completion_time: None,
        succeeded: None,
    })
}

/// What one reconcile of an export works with; its steps change none of it.
struct Round<'a> {
    export: &'a ArchiveExport,
    ctx: &'a Context,
    applier: &'a Applier<'a>,
    ns: String,
    now: Timestamp,
}

/// What a round found of its export: the observation its conditions come from, the status
/// with what was observed (conditions come last), the Events of its run and slots, the
/// requeue. Each observe step takes it and returns it with what it saw.
struct Found {
    obs: ExportObservation,
    status: ArchiveExportStatus,
    events: Vec<Event>,
    requeue: Duration,
}

impl Found {
    /// Before anything is observed: the old status, the spec's mode.
    fn new(export: &ArchiveExport, old: &ArchiveExportStatus) -> Found {
        let obs = ExportObservation {
            blocked: None,
            pod_failure: None,
            mode: export.spec.mode,
            scheduled: export.spec.schedule.is_some(),
            suspended: export.spec.suspend == Some(true),
            run: old.run.clone(),
            run_jobs: vec![],
            last_outcome: None,
            writers: WriterCounts::default(),
            writers_with_snapshot: 0,
            suspended_slots: vec![],
            masked: export.spec.transform.is_some(),
            unreviewed: None,
            preflight: None,
        };
        Found {
            obs,
            status: ArchiveExportStatus {
                observed_generation: export.metadata.generation,
                ..old.clone()
            },
            events: vec![],
            requeue: Duration::from_secs(300),
        }
    }

    /// Nothing is built.
    fn blocked(export: &ArchiveExport, old: &ArchiveExportStatus, blocked: Blocked) -> Found {
        let found = Found::new(export, old);
        Found {
            requeue: blocked.recheck.unwrap_or(found.requeue),
            obs: ExportObservation {
                blocked: Some(blocked.problem),
                ..found.obs
            },
            ..found
        }
    }

    /// A child the API server refused: nothing of this run started, the export is blocked. A
    /// new run's start still clears the last run's progress, as it always did.
    fn rejected(
        export: &ArchiveExport,
        old: &ArchiveExportStatus,
        rejected: &Rejected,
        new_run: bool,
    ) -> Found {
        let found = Found::blocked(export, old, Blocked::rejected(rejected));
        let progress = found.status.progress.clone().filter(|_| !new_run);
        Found {
            status: ArchiveExportStatus {
                progress,
                ..found.status
            },
            ..found
        }
    }
}

impl<'a> Round<'a> {
    fn new(
        export: &'a ArchiveExport,
        ctx: &'a Context,
        applier: &'a Applier<'a>,
        ns: String,
    ) -> Self {
        Self {
            export,
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

    /// The label selector of the export's children.
    fn selector(&self) -> String {
        format!("{LABEL_EXPORT}={}", self.export.name_any())
    }

    /// The Secrets, keys, CA bundles and claim the spec names; a missing one is looked at
    /// again soon.
    async fn dereference(&self) -> Result<Result<(), Blocked>, Error> {
        let references = export_references(self.export);
        let missing = dereference::check(&self.ctx.client, &self.ns, &references)
            .await
            .map_err(Error::Dereference)?;
        Ok(match missing {
            Some(missing) => Err(Blocked::missing(&missing, &self.ns)),
            None => Ok(()),
        })
    }

    /// The export's pods: those with its label whose owner chain reaches it (a tenant's pod
    /// with the label is never read).
    async fn owned_pods(&self) -> Result<Vec<Pod>, Error> {
        let listed = self
            .api::<Pod>()
            .list(&ListParams::default().labels(&self.selector()))
            .await
            .map_err(Error::Observe)?;
        let uid = self.export.uid().unwrap_or_default();
        crate::reconcile::owned::owned_pods(&self.ctx.client, &self.ns, &uid, listed.items)
            .await
            .map_err(Error::Observe)
    }

    /// Applies and prunes the children; returns the writer Deployments as they now are.
    async fn apply(&self, children: &ExportChildren) -> Result<Vec<Deployment>, Error> {
        let mut set = ChildSet::new(self.applier, self.selector());
        if children.lease_access.is_some() {
            lease_rights::ensure(self.ctx, &self.ns, self.export).await?;
        }
        let deployments = apply_children(&mut set, children).await?;
        prune_children(&mut set, children, (self.ctx, self.export)).await?;
        Ok(deployments)
    }

    /// The new run (its Jobs were just created), the current run's Jobs, then the export
    /// pods (OneShot) or the writers (Continuous).
    async fn observe(
        &self,
        old: &ArchiveExportStatus,
        new_run: Option<RunStatus>,
        children: &ExportChildren,
        deployments: &[Deployment],
    ) -> Result<Found, Error> {
        let found = Found::new(self.export, old);
        let started = new_run.is_some();
        let found = match new_run {
            Some(run) => Found {
                events: vec![export_started(&run.id, children.jobs.len())],
                status: ArchiveExportStatus {
                    // The last run's progress is not this one's.
                    progress: None,
                    run: Some(run),
                    ..found.status
                },
                ..found
            },
            None => found,
        };
        let found = self.observe_run(found, started).await?;
        match self.export.spec.mode {
            ExportMode::OneShot => self.observe_export_pods(old, found).await,
            ExportMode::Continuous => self.observe_writers(old, found, deployments).await,
        }
    }

    /// The current run's Jobs: their phases, and the run's outcome once all finished.
    async fn observe_run(&self, found: Found, new_run: bool) -> Result<Found, Error> {
        let Some(run) = found.status.run.clone().filter(|r| r.succeeded.is_none()) else {
            return Ok(found);
        };
        let wanted = build::run_job_names(self.export, &run.id);
        let workers = split::run_workers_job_name(self.export, &run.id);
        let listed = match new_run {
            true => vec![],
            false => self.run_jobs(&run.id).await?,
        };
        let find = |want: &str| listed.iter().find(|j| j.name_any() == want);
        let run_jobs: Vec<JobPhase> = match new_run {
            true => vec![JobPhase::Active; wanted.len()],
            false => wanted
                .iter()
                .map(|want| find(want).map_or(JobPhase::Missing, crate::reconcile::job::job_phase))
                .collect(),
        };
        let split = split::split_status(self.export, workers.as_deref().and_then(find));
        let found = Found {
            obs: ExportObservation {
                run_jobs,
                ..found.obs
            },
            status: ArchiveExportStatus {
                split: if new_run {
                    split
                } else {
                    split.or(found.status.split)
                },
                ..found.status
            },
            requeue: Duration::from_secs(60),
            ..found
        };
        let found = match new_run {
            true => found,
            false => finish_run(found, run, self.now, workers.is_some()),
        };
        if workers.is_some() {
            let (run, phases) = (found.status.run.as_ref(), &found.obs.run_jobs);
            let stopped = split::stop_if_failed(&self.api(), run, &wanted, phases).await;
            stopped.map_err(Error::Observe)?;
        }
        Ok(Found {
            obs: ExportObservation {
                run: found.status.run.clone(),
                ..found.obs
            },
            ..found
        })
    }

    /// The Jobs of run `run`.
    async fn run_jobs(&self, run: &str) -> Result<Vec<Job>, Error> {
        let selector = format!("{},{LABEL_RUN}={run}", self.selector());
        let params = ListParams::default().labels(&selector);
        let listed = self.api::<Job>().list(&params).await;
        Ok(listed.map_err(Error::Observe)?.items)
    }

    /// OneShot: summaries and outcomes from the export pods' termination messages.
    async fn observe_export_pods(
        &self,
        old: &ArchiveExportStatus,
        found: Found,
    ) -> Result<Found, Error> {
        let listed = self.owned_pods().await?;
        let pods = read_pods(&listed);
        // Why the newest attempt failed: of the current run (a scheduled export's last run is
        // its newest pod).
        let run_id = found.status.run.as_ref().map(|r| r.id.clone());
        let scheduled = self.export.spec.schedule.is_some();
        let attempts = listed.iter().filter(|p| {
            scheduled || run_id.is_some() && p.labels().get(LABEL_RUN) == run_id.as_ref()
        });
        let attempts: Vec<&Pod> = attempts.collect();
        // A split's workers Job that failed is why the run failed.
        let split = found.status.split.as_ref();
        let workers_problem = split::failed_workers(split, run_id.as_deref(), &listed);
        let tables = merge_summaries(found.status.tables, pods.summaries);
        let last_export = tables.iter().max_by(|a, b| a.time.cmp(&b.time)).cloned();
        let found = Found {
            obs: ExportObservation {
                last_outcome: pods.newest.map(|n| n.outcome),
                pod_failure: workers_problem.or_else(|| {
                    newest_failure(attempts.iter().copied()).map(|f| Problem::of_pod("export", &f))
                }),
                preflight: newest_preflight(attempts.iter().copied()),
                ..found.obs
            },
            status: ArchiveExportStatus {
                tables,
                last_export,
                ..found.status
            },
            ..found
        };
        Ok(self.observe_run_progress(old, found, &listed).await)
    }

    /// OneShot: the running export pods' `/status` progress (a Job's or a CronJob's run),
    /// summed over their tables; once none runs, the operation `Complete` (rows of the tables'
    /// summaries) or `Failed`. Comes back every [`progress::REQUEUE_WHILE_RUNNING`] meanwhile.
    async fn observe_run_progress(
        &self,
        old: &ArchiveExportStatus,
        found: Found,
        pods: &[Pod],
    ) -> Found {
        let running: Vec<&Pod> = pods
            .iter()
            .filter(|p| is_running_export(p))
            .take(progress::MAX_PROBED_PODS)
            .collect();
        let mut reports = vec![];
        for pod in &running {
            if let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.as_deref())
                && let Ok(body) = self.ctx.prober.get(ip, 8080, "/status").await
                && let Some(r) = observe::parse_export_progress(&body)
            {
                reports.push(r);
            }
        }
        // What this round starts from (a new run starts from nothing).
        let current = found.status.progress.as_ref();
        let new = if !reports.is_empty() {
            progress::export_progress(&reports)
        } else if !running.is_empty() {
            // Started, its listener not up yet: nothing new to say.
            current.cloned()
        } else {
            let succeeded = match found.status.run.as_ref().and_then(|r| r.succeeded) {
                Some(ok) => ok,
                None => found.obs.last_outcome.as_ref().is_some_and(|o| o.succeeded),
            };
            let tables = self.export.spec.source.all_tables();
            let rows = found
                .status
                .tables
                .iter()
                .filter(|s| tables.iter().any(|t| t.qualified() == s.table))
                .map(|s| s.row_count)
                .sum::<Option<i64>>();
            progress::ended(current, succeeded, rows)
        };
        let requeue = match running.is_empty() {
            true => found.requeue,
            false => found.requeue.min(progress::REQUEUE_WHILE_RUNNING),
        };
        with_progress(Found { requeue, ..found }, old, new, self.now)
    }

    /// Continuous: the writers' Deployments, pods and each ready pod's `/status`.
    async fn observe_writers(
        &self,
        old: &ArchiveExportStatus,
        found: Found,
        deployments: &[Deployment],
    ) -> Result<Found, Error> {
        let suspended = found.obs.suspended;
        let tables = self.export.spec.source.all_tables().len() as i32;
        let listed = self.owned_pods().await?;
        let pod_failure = match suspended {
            true => found.obs.pod_failure.clone(),
            false => pod_failure::first_failure(&listed, build::CONTAINER, self.now)
                .map(|f| Problem::of_pod("writer", &f)),
        };
        let probed = probe_writers(self.ctx, &listed).await;
        let (writers, monitor, reports) = (probed.writers, probed.monitor, probed.reports);
        // Known when every writer answered, or when one that did reports columns.
        let answered = writers.len() as i32;
        let unreviewed = (!suspended
            && (!probed.unreviewed.is_empty() || (tables > 0 && answered >= tables)))
            .then_some(probed.unreviewed);
        // Known when every writer reported one, or when one finds a constraint at risk.
        let reported = probed.preflights.len() as i32;
        let at_risk = probed.preflights.iter().any(|p| p.at_risk > 0);
        let preflight = (!suspended && (at_risk || (tables > 0 && reported >= tables)))
            .then(|| crate::export::conditions::merge_preflights(&probed.preflights));
        let writers = crate::export::slots::merge_writers(
            self.export,
            &old.writers,
            writers,
            monitor,
            suspended,
        );
        let slot_events = crate::export::slots::slot_events(&old.writers, &writers);
        let suspended_slots = match suspended {
            true => crate::export::slots::suspended_slots(self.export, &writers),
            false => found.obs.suspended_slots.clone(),
        };
        self.ctx.metrics.set_retained_wal(
            &self.ns,
            &self.export.name_any(),
            writers
                .iter()
                .filter_map(|w| Some((w.slot.clone()?, w.retained_wal_bytes?))),
        );
        // The writers' baseline or compaction; while none answers, what was last seen.
        let new = match reports.is_empty() {
            true => found.status.progress.clone(),
            false => progress::export_progress(&reports),
        };
        let found = Found {
            obs: ExportObservation {
                writers: writer_counts(deployments, if suspended { 0 } else { tables }),
                pod_failure,
                suspended_slots,
                writers_with_snapshot: writers
                    .iter()
                    .filter(|w| w.last_snapshot_at.is_some())
                    .count(),
                unreviewed,
                preflight,
                ..found.obs
            },
            status: ArchiveExportStatus {
                last_export: newest_snapshot(&writers).or(found.status.last_export),
                writers,
                ..found.status
            },
            events: found.events.into_iter().chain(slot_events).collect(),
            requeue: Duration::from_secs(30),
        };
        Ok(with_progress(found, old, new, self.now))
    }

    /// The failing gauge and each table's last success.
    fn record_metrics(&self, status: &ArchiveExportStatus) {
        let (ns, name) = (self.ns.as_str(), self.export.name_any());
        let failing = status
            .conditions
            .iter()
            .any(|c| c.type_ == conditions::LAST_EXPORT_SUCCEEDED && c.status == Status::False);
        let metrics = &self.ctx.metrics;
        metrics
            .export_failing
            .with_label_values(&[ns, name.as_str()])
            .set(if failing { 1.0 } else { 0.0 });
        for t in &status.tables {
            if let Some(ts) = t
                .time
                .as_deref()
                .and_then(|s| s.parse::<jiff::Timestamp>().ok())
            {
                metrics.set_export_success(ns, &name, &t.table, ts.as_second() as f64);
            }
        }
    }

    /// Status (only when changed), with the Events of this round and of failure transitions.
    async fn write_status(
        &self,
        status: &ArchiveExportStatus,
        events: &[Event],
    ) -> Result<(), Error> {
        let export = self.export;
        self.applier
            .report(
                &self.api::<ArchiveExport>(),
                export,
                export.status.as_ref(),
                status,
                events,
            )
            .await
    }
}

/// Records the run's outcome once every Job of it finished, with its Event.
fn finish_run(found: Found, run: RunStatus, now: Timestamp, split: bool) -> Found {
    let outcome = match split {
        true => split::run_outcome(&found.obs.run_jobs),
        false => run_outcome(&found.obs.run_jobs),
    };
    let Some(ok) = outcome else {
        return found;
    };
    if !ok && found.obs.run_jobs.contains(&JobPhase::Missing) {
        return found;
    }
    let (type_, reason) = if ok {
        (EventType::Normal, "ExportSucceeded")
    } else {
        (EventType::Warning, "ExportFailed")
    };
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(format!("run {}", run.id)),
        action: "Export".into(),
        secondary: None,
    };
    Found {
        status: ArchiveExportStatus {
            run: Some(RunStatus {
                succeeded: Some(ok),
                completion_time: Some(time_string(now)),
                ..run
            }),
            ..found.status
        },
        events: found.events.into_iter().chain([event]).collect(),
        ..found
    }
}

/// `status.progress`, its time moved only when its figures did; a running operation brings
/// the export back every [`progress::REQUEUE_WHILE_RUNNING`].
fn with_progress(
    found: Found,
    old: &ArchiveExportStatus,
    new: Option<OperationProgress>,
    now: Timestamp,
) -> Found {
    let requeue = match progress::is_running(new.as_ref()) {
        true => found.requeue.min(progress::REQUEUE_WHILE_RUNNING),
        false => found.requeue,
    };
    Found {
        status: ArchiveExportStatus {
            progress: progress::stamp(old.progress.as_ref(), new, now),
            ..found.status
        },
        requeue,
        ..found
    }
}

/// The status of what the round found: its conditions merged into the old ones, this round's
/// Events with those of failure transitions, the requeue.
fn status(
    export: &ArchiveExport,
    old: &ArchiveExportStatus,
    found: Found,
    now: Timestamp,
) -> (ArchiveExportStatus, Vec<Event>, Duration) {
    let status = ArchiveExportStatus {
        conditions: conditions::merge(
            &old.conditions,
            &export_conditions(&found.obs),
            &EXPORT_TYPES,
            now,
            export.metadata.generation,
        ),
        ..found.status
    };
    let transitions = crate::reconcile::status::export_events(&old.conditions, &status.conditions);
    let events = found.events.into_iter().chain(transitions).collect();
    (status, events, found.requeue)
}

fn export_started(run: &str, jobs: usize) -> Event {
    Event {
        type_: EventType::Normal,
        reason: "ExportStarted".into(),
        note: Some(format!("run {run}: {jobs} Job(s) created")),
        action: "CreateJobs".into(),
        secondary: None,
    }
}

/// An export pod whose exporter is still running (it may answer `/status`).
fn is_running_export(pod: &Pod) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    status.phase.as_deref() == Some("Running")
        && status.container_statuses.as_ref().is_some_and(|cs| {
            cs.iter().any(|c| {
                c.name == build::CONTAINER && c.state.as_ref().is_some_and(|s| s.running.is_some())
            })
        })
}

#[cfg(test)]
#[path = "tests/reconcile.rs"]
mod tests;
