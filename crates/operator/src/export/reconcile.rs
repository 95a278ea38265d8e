//! The ArchiveExport controller: dereference (the Secrets, keys, CA bundles and claim the spec
//! names) → validate (what the schema cannot check) → build → apply (server-side apply, one
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
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};

use crate::builders::{ANNOTATION_TABLE, LABEL_EXPORT, LABEL_RUN};
use crate::crd::archive_export::{
    ArchiveExport, ArchiveExportStatus, ExportMode, ExportSummary, RUN_REQUESTED_ANNOTATION,
    RunStatus, WriterStatus,
};
use crate::crd::progress::OperationProgress;
use crate::export::build;
use crate::export::children::{self, ExportChildren};
use crate::export::conditions::{
    EXPORT_TYPES, ExportObservation, PodOutcome, WriterCounts, export_conditions, run_outcome,
};
use crate::export::dereference::export_references;
use crate::export::lease_rights;
use crate::export::observe::SlotReport;
use crate::export::{observe, validate};
use crate::reconcile::apply::{Applier, ChildSet};
use crate::reconcile::conditions::{self, Problem, Status, time_string};
use crate::reconcile::context::{Context, Error, MANAGER_EXPORT};
use crate::reconcile::dereference;
use crate::reconcile::job::JobPhase;
use crate::reconcile::pod_failure::{self, PodFailure};
use crate::reconcile::progress;
use larch_core::progress::ProgressReport;

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
    if export.metadata.deletion_timestamp.is_some() {
        return crate::export::finalizer::finalize(export, ctx).await;
    }
    if crate::export::finalizer::ensure_finalizer(&export, &ctx).await? {
        // The watch brings the object with its finalizer.
        return Ok(Action::await_change());
    }
    // Exports are few (not one per namespace): children are read back, not cached.
    let applier = Applier::new(&ctx, "export", MANAGER_EXPORT);
    // Nothing is built while what the spec names is missing or the spec cannot work.
    let blocked = dereference_and_validate(&export, &ctx, &ns).await?;
    let mut round = ExportRound::new(&export, &ctx, ns);
    if let Some((problem, recheck)) = blocked {
        round.obs.blocked = Some(problem);
        round.requeue = recheck.unwrap_or(round.requeue);
    }
    if round.obs.blocked.is_none() {
        let applied = round.build_apply_observe(&applier).await;
        round.settle(applied)?;
    }
    round.conditions();
    round.record_metrics();
    round.write_status(&applier).await?;
    Ok(Action::requeue(round.requeue))
}

/// Dereference (the Secrets, keys, CA bundles and claim the spec names), then validate: what
/// keeps the export from being built, and when to look again (a missing object is rechecked
/// soon).
async fn dereference_and_validate(
    export: &ArchiveExport,
    ctx: &Context,
    ns: &str,
) -> Result<Option<(Problem, Option<Duration>)>, Error> {
    let references = export_references(export);
    if let Some(missing) = dereference::check(&ctx.client, ns, &references)
        .await
        .map_err(Error::Dereference)?
    {
        let problem = Problem::new(missing.reason(), missing.message(ns));
        return Ok(Some((problem, Some(dereference::RECHECK))));
    }
    Ok(validate::export(export)
        .err()
        .map(|message| (Problem::new("InvalidSpec", message), None)))
}

/// One reconcile of an export: what it observed, the status and Events it will write.
struct ExportRound<'a> {
    export: &'a ArchiveExport,
    ctx: &'a Context,
    ns: String,
    now: Timestamp,
    old: ArchiveExportStatus,
    status: ArchiveExportStatus,
    obs: ExportObservation,
    events: Vec<Event>,
    requeue: Duration,
}

impl<'a> ExportRound<'a> {
    fn new(export: &'a ArchiveExport, ctx: &'a Context, ns: String) -> Self {
        let old = export.status.clone().unwrap_or_default();
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
        };
        Self {
            export,
            ctx,
            ns,
            now: ctx.now(),
            status: ArchiveExportStatus {
                observed_generation: export.metadata.generation,
                ..old.clone()
            },
            old,
            obs,
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

    /// The label selector of the export's children.
    fn selector(&self) -> String {
        format!("{LABEL_EXPORT}={}", self.export.name_any())
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

    /// Build, apply and prune the children, then observe what they report.
    async fn build_apply_observe(&mut self, applier: &Applier<'_>) -> Result<(), Error> {
        let new_run = self.start_run();
        let children = children::children(self.export, new_run.as_deref(), &self.ctx.build);
        let mut set = ChildSet::new(applier, self.selector());
        if children.lease_access.is_some() {
            lease_rights::ensure(self.ctx, &self.ns, self.export).await?;
        }
        let deployments = apply_children(&mut set, &children).await?;
        prune_children(&mut set, &children, (self.ctx, self.export)).await?;
        if let Some(id) = &new_run {
            self.events.push(export_started(id, children.jobs.len()));
        }
        self.observe_run(new_run.is_some()).await?;
        match self.export.spec.mode {
            ExportMode::OneShot => self.observe_export_pods().await,
            ExportMode::Continuous => self.observe_writers(&deployments).await,
        }
    }

    /// A child the API server refused: nothing of this run started, the export is blocked.
    fn settle(&mut self, applied: Result<(), Error>) -> Result<(), Error> {
        match applied {
            Ok(()) => Ok(()),
            Err(Error::Rejected(r)) => {
                self.status.run = self.old.run.clone();
                self.obs.run = self.old.run.clone();
                self.obs.run_jobs = vec![];
                self.events.clear();
                self.obs.blocked = Some(Problem::new("ChildRejected", r.to_string()));
                self.requeue = Duration::from_secs(60);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Which run, if any, is new and needs its Jobs created; records it in status.
    fn start_run(&mut self) -> Option<String> {
        let (id, token) = wanted_run(self.export)?;
        if self.old.run.as_ref().is_some_and(|r| r.id == id) || self.obs.suspended {
            return None;
        }
        // The last run's progress is not this one's.
        self.status.progress = None;
        self.status.run = Some(RunStatus {
            id: id.clone(),
            token,
            start_time: Some(time_string(self.now)),
            completion_time: None,
            succeeded: None,
        });
        Some(id)
    }

    /// The current run's Jobs: their phases, and the run's outcome once all finished.
    async fn observe_run(&mut self, new_run: bool) -> Result<(), Error> {
        if let Some(run) = self.status.run.clone().filter(|r| r.succeeded.is_none()) {
            // One Job per table, or one for the whole set.
            let wanted: Vec<String> = if build::exports_as_one_set(self.export) {
                vec![build::set_job_name(self.export, &run.id)]
            } else {
                let tables = self.export.spec.source.all_tables();
                tables
                    .iter()
                    .map(|t| build::job_name(self.export, t, &run.id))
                    .collect()
            };
            if new_run {
                self.obs.run_jobs = vec![JobPhase::Active; wanted.len()];
            } else {
                let selector = format!("{},{LABEL_RUN}={}", self.selector(), run.id);
                let listed = self
                    .api::<Job>()
                    .list(&ListParams::default().labels(&selector))
                    .await
                    .map_err(Error::Observe)?;
                self.obs.run_jobs = wanted
                    .iter()
                    .map(|want| {
                        listed
                            .items
                            .iter()
                            .find(|j| j.metadata.name.as_deref() == Some(want.as_str()))
                            .map(crate::reconcile::job::job_phase)
                            .unwrap_or(JobPhase::Missing)
                    })
                    .collect();
                self.finish_run(&run.id);
            }
            self.requeue = Duration::from_secs(60);
        }
        self.obs.run = self.status.run.clone();
        Ok(())
    }

    /// Records the run's outcome once every Job of it finished.
    fn finish_run(&mut self, id: &str) {
        let Some(ok) = run_outcome(&self.obs.run_jobs) else {
            return;
        };
        if self.obs.run_jobs.contains(&JobPhase::Missing) {
            return;
        }
        let r = self.status.run.as_mut().expect("run exists");
        r.succeeded = Some(ok);
        r.completion_time = Some(time_string(self.now));
        let (type_, reason) = if ok {
            (EventType::Normal, "ExportSucceeded")
        } else {
            (EventType::Warning, "ExportFailed")
        };
        self.events.push(Event {
            type_,
            reason: reason.into(),
            note: Some(format!("run {id}")),
            action: "Export".into(),
            secondary: None,
        });
    }

    /// OneShot: summaries and outcomes from the export pods' termination messages.
    async fn observe_export_pods(&mut self) -> Result<(), Error> {
        let listed = self.owned_pods().await?;
        let found = read_pods(&listed);
        self.obs.last_outcome = found.newest.map(|n| n.outcome);
        // Why the newest attempt failed: of the current run (a scheduled export's last run is
        // its newest pod).
        let run_id = self.status.run.as_ref().map(|r| r.id.clone());
        let scheduled = self.export.spec.schedule.is_some();
        let attempts = listed.iter().filter(|p| {
            scheduled || run_id.is_some() && p.labels().get(LABEL_RUN) == run_id.as_ref()
        });
        self.obs.pod_failure = newest_failure(attempts).map(|f| Problem::of_pod("export", &f));
        self.status.tables =
            merge_summaries(std::mem::take(&mut self.status.tables), found.summaries);
        self.status.last_export = self
            .status
            .tables
            .iter()
            .max_by(|a, b| a.time.cmp(&b.time))
            .cloned();
        self.observe_run_progress(&listed).await;
        Ok(())
    }

    /// OneShot: the running export pods' `/status` progress (a Job's or a CronJob's run),
    /// summed over their tables; once none runs, the operation `Complete` (rows of the tables'
    /// summaries) or `Failed`. Comes back every [`progress::REQUEUE_WHILE_RUNNING`] meanwhile.
    async fn observe_run_progress(&mut self, pods: &[Pod]) {
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
        let old = self.status.progress.as_ref();
        let new = if !reports.is_empty() {
            progress::export_progress(&reports)
        } else if !running.is_empty() {
            // Started, its listener not up yet: nothing new to say.
            old.cloned()
        } else {
            let succeeded = match self.status.run.as_ref().and_then(|r| r.succeeded) {
                Some(ok) => ok,
                None => self.obs.last_outcome.as_ref().is_some_and(|o| o.succeeded),
            };
            let tables = self.export.spec.source.all_tables();
            let rows = self
                .status
                .tables
                .iter()
                .filter(|s| tables.iter().any(|t| t.qualified() == s.table))
                .map(|s| s.row_count)
                .sum::<Option<i64>>();
            progress::ended(old, succeeded, rows)
        };
        if !running.is_empty() {
            self.requeue = self.requeue.min(progress::REQUEUE_WHILE_RUNNING);
        }
        self.set_progress(new);
    }

    /// `status.progress`, its time moved only when its figures did.
    fn set_progress(&mut self, new: Option<OperationProgress>) {
        if progress::is_running(new.as_ref()) {
            self.requeue = self.requeue.min(progress::REQUEUE_WHILE_RUNNING);
        }
        self.status.progress = progress::stamp(self.old.progress.as_ref(), new, self.now);
    }

    /// Continuous: the writers' Deployments, pods and each ready pod's `/status`.
    async fn observe_writers(&mut self, deployments: &[Deployment]) -> Result<(), Error> {
        let suspended = self.obs.suspended;
        let tables = self.export.spec.source.all_tables().len() as i32;
        self.obs.writers = writer_counts(deployments, if suspended { 0 } else { tables });
        let listed = self.owned_pods().await?;
        if !suspended {
            self.obs.pod_failure = pod_failure::first_failure(&listed, build::CONTAINER, self.now)
                .map(|f| Problem::of_pod("writer", &f));
        }
        let (writers, monitor, reports) = probe_writers(self.ctx, &listed).await;
        let writers = crate::export::slots::merge_writers(
            self.export,
            &self.old.writers,
            writers,
            monitor,
            suspended,
        );
        self.events.extend(crate::export::slots::slot_events(
            &self.old.writers,
            &writers,
        ));
        if suspended {
            self.obs.suspended_slots = crate::export::slots::suspended_slots(self.export, &writers);
        }
        self.ctx.metrics.set_retained_wal(
            &self.ns,
            &self.export.name_any(),
            writers
                .iter()
                .filter_map(|w| Some((w.slot.clone()?, w.retained_wal_bytes?))),
        );
        self.obs.writers_with_snapshot = writers
            .iter()
            .filter(|w| w.last_snapshot_at.is_some())
            .count();
        if let Some(newest) = newest_snapshot(&writers) {
            self.status.last_export = Some(newest);
        }
        self.status.writers = writers;
        self.requeue = Duration::from_secs(30);
        // The writers' baseline or compaction; while none answers, what was last seen.
        let new = if reports.is_empty() {
            self.status.progress.clone()
        } else {
            progress::export_progress(&reports)
        };
        self.set_progress(new);
        Ok(())
    }

    /// The conditions the observation asks for, merged into the old ones.
    fn conditions(&mut self) {
        let desired = export_conditions(&self.obs);
        self.status.conditions = conditions::merge(
            &self.old.conditions,
            &desired,
            &EXPORT_TYPES,
            self.now,
            self.export.metadata.generation,
        );
    }

    /// The failing gauge and each table's last success.
    fn record_metrics(&self) {
        let (ns, name) = (self.ns.as_str(), self.export.name_any());
        let failing = self
            .status
            .conditions
            .iter()
            .any(|c| c.type_ == conditions::LAST_EXPORT_SUCCEEDED && c.status == Status::False);
        let metrics = &self.ctx.metrics;
        metrics
            .export_failing
            .with_label_values(&[ns, name.as_str()])
            .set(if failing { 1.0 } else { 0.0 });
        for t in &self.status.tables {
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
    async fn write_status(&mut self, applier: &Applier<'_>) -> Result<(), Error> {
        self.events.extend(crate::reconcile::status::export_events(
            &self.old.conditions,
            &self.status.conditions,
        ));
        let export = self.export;
        applier
            .report(
                &self.api::<ArchiveExport>(),
                export,
                export.status.as_ref(),
                &self.status,
                &self.events,
            )
            .await
    }
}

/// Applies the export's children; returns its writer Deployments as they now are. The Leases
/// and the exporter's rights on them go first: a new pod finds them.
async fn apply_children(
    set: &mut ChildSet<'_>,
    children: &ExportChildren,
) -> Result<Vec<Deployment>, Error> {
    if let Some(pvc) = &children.pvc {
        set.apply(pvc).await?;
    }
    for cj in &children.cron_jobs {
        set.apply(cj).await?;
    }
    if let Some(la) = &children.lease_access {
        if let Some(sa) = &la.service_account {
            set.apply(sa).await?;
        }
        set.apply(&la.role).await?;
        set.apply(&la.role_binding).await?;
        for l in &la.leases {
            set.apply(l).await?;
        }
    }
    let mut deployments = vec![];
    for d in &children.deployments {
        deployments.push(set.apply(d).await?);
    }
    if let Some(m) = &children.slot_monitor {
        set.apply(m).await?;
    }
    for j in &children.jobs {
        set.apply(j).await?;
    }
    Ok(deployments)
}

/// Deletes the children not wanted any more (mode, schedule or tables changed). Jobs are left
/// to their TTL.
async fn prune_children(
    set: &mut ChildSet<'_>,
    children: &ExportChildren,
    (ctx, export): (&Context, &ArchiveExport),
) -> Result<(), Error> {
    let ns = &export.namespace().ok_or(Error::NoNamespace)?;
    set.prune::<CronJob>(ns).await?;
    let deployments_pruned = set.prune::<Deployment>(ns).await?;
    // After the Deployments, so no exporter outlives its Lease rights. Only where some can be
    // stale: a continuous export (its tables changed) or one that just left that mode.
    if children.lease_access.is_some() || deployments_pruned > 0 {
        if children.lease_access.is_none() {
            lease_rights::ensure(ctx, ns, export).await?;
        }
        set.prune::<Lease>(ns).await?;
        set.prune::<RoleBinding>(ns).await?;
        set.prune::<Role>(ns).await?;
        set.prune::<ServiceAccount>(ns).await?;
    }
    Ok(())
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

/// Ready writers (one per Deployment at most) of `desired`, and whether one's rollout is stuck.
fn writer_counts(deployments: &[Deployment], desired: i32) -> WriterCounts {
    let ready = deployments
        .iter()
        .map(|d| {
            d.status
                .as_ref()
                .and_then(|s| s.available_replicas)
                .unwrap_or(0)
                .min(1)
        })
        .sum();
    let stalled = deployments.iter().any(|d| {
        d.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter().any(|c| {
                    c.type_.as_deref() == Some("Progressing")
                        && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
                })
            })
    });
    WriterCounts {
        ready,
        desired,
        stalled,
    }
}

/// Each pod's `/status`: the writers' (by table, at most 32), the slot monitor's, and the
/// writers' progress.
async fn probe_writers(
    ctx: &Context,
    pods: &[Pod],
) -> (Vec<WriterStatus>, Option<SlotReport>, Vec<ProgressReport>) {
    let mut writers: Vec<WriterStatus> = vec![];
    let mut monitor = None;
    let mut reports = vec![];
    for pod in pods.iter().take(progress::MAX_PROBED_PODS) {
        let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.clone()) else {
            continue;
        };
        let Ok(body) = ctx.prober.get(&ip, 8080, "/status").await else {
            continue;
        };
        if let Some(w) = observe::parse_writer_status(&body) {
            reports.extend(observe::parse_export_progress(&body));
            writers.push(w);
        } else if let Some(m) = observe::parse_slot_monitor(&body) {
            monitor = Some(m);
        }
    }
    writers.sort_by(|a, b| a.table.cmp(&b.table));
    writers.truncate(32);
    (writers, monitor, reports)
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

/// The newest snapshot of any writer, for the printer columns.
fn newest_snapshot(writers: &[WriterStatus]) -> Option<ExportSummary> {
    let w = writers
        .iter()
        .filter(|w| w.last_snapshot_at.is_some())
        .max_by(|a, b| a.last_snapshot_at.cmp(&b.last_snapshot_at))?;
    Some(ExportSummary {
        table: w.table.clone(),
        key_prefix: None,
        position: w.head_position.clone(),
        row_count: None,
        epoch: w.epoch,
        time: w.last_snapshot_at.clone(),
        pod: None,
    })
}

#[cfg(test)]
#[path = "tests/reconcile.rs"]
mod tests;
