//! Deleting an ArchiveExport (`source.deletionPolicy: Delete`, the default): the finalizer
//! `larch.dev/cleanup` holds the object while the operator stops its writers and runs a cleanup
//! Job (`larch export cleanup`) that drops the replication slot(s) and publication(s) larch
//! created. A failed attempt (the database unreachable, a wrong password) sets
//! `Ready=False/CleanupFailed`, emits a `CleanupFailed` Event with the error and is retried
//! with a backoff (10 s doubling to 5 min) until it succeeds or someone sets
//! `larch.dev/skip-cleanup: "true"`, which removes the finalizer and leaves the objects.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::builders::{LABEL_COMPONENT, LABEL_EXPORT};
use crate::crd::archive_export::{
    ArchiveExport, CLEANUP_FINALIZER, CleanupStatus, DeletionPolicy, SKIP_CLEANUP_ANNOTATION,
};
use crate::export::build::{export_owner, slot_and_publication};
use crate::export::cleanup_job::{
    CLEANUP_CONTAINER, cleanup_job, cleanup_job_name, deletion_policy,
};
use crate::export::conditions::EXPORT_TYPES;
use crate::reconcile::apply::{Applier, ChildSet};
use crate::reconcile::conditions::{self, Cond, Status, time_string};
use crate::reconcile::context::{Context, Error, MANAGER_EXPORT};
use crate::reconcile::job::JobPhase;

/// The export controller's writes (counted in `larch_operator_api_writes_total`).
fn writes(ctx: &Context) -> Applier<'_> {
    Applier::new(ctx, "export", MANAGER_EXPORT)
}

fn has_finalizer(export: &ArchiveExport) -> bool {
    export.finalizers().iter().any(|f| f == CLEANUP_FINALIZER)
}

/// Sets `metadata.finalizers` to `finalizers`, failing (409) if the object changed meanwhile:
/// the resourceVersion makes the merge patch a compare-and-swap of the list.
async fn set_finalizers(
    ctx: &Context,
    export: &ArchiveExport,
    finalizers: Vec<String>,
) -> Result<(), Error> {
    let api: Api<ArchiveExport> =
        Api::namespaced(ctx.client.clone(), &export.namespace().unwrap_or_default());
    let patch = json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": export.resource_version(),
    }});
    writes(ctx).count("ArchiveExport", "patch");
    // Named, so managedFields tell whose the finalizer is (not "unknown").
    let params = PatchParams {
        field_manager: Some(MANAGER_EXPORT.into()),
        ..PatchParams::default()
    };
    api.patch(&export.name_any(), &params, &Patch::Merge(&patch))
        .await
        .map_err(Error::Finalizer)?;
    Ok(())
}

/// Adds the finalizer when the policy is `Delete` (the default), removes it for `Retain`.
/// Returns whether it changed the object (the watch brings the new version).
pub async fn ensure_finalizer(export: &ArchiveExport, ctx: &Context) -> Result<bool, Error> {
    let wanted = deletion_policy(export) == DeletionPolicy::Delete;
    if wanted == has_finalizer(export) {
        return Ok(false);
    }
    let mut finalizers: Vec<String> = export
        .finalizers()
        .iter()
        .filter(|f| *f != CLEANUP_FINALIZER)
        .cloned()
        .collect();
    if wanted {
        finalizers.push(CLEANUP_FINALIZER.into());
    }
    set_finalizers(ctx, export, finalizers).await?;
    Ok(true)
}

/// The slot/publication pairs of the export, for messages.
fn objects(export: &ArchiveExport) -> String {
    export
        .spec
        .source
        .all_tables()
        .iter()
        .map(|t| {
            let (s, p) = slot_and_publication(export, t);
            format!("replication slot {s} and publication {p}")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn backoff(attempts: i32) -> Duration {
    let secs = 10u64.saturating_mul(1 << attempts.clamp(1, 6).saturating_sub(1) as u32);
    Duration::from_secs(secs.min(300))
}

/// The deletion path of the reconcile: stop the export's pods, run the cleanup Job until it
/// succeeds (or is given up), then let the object go.
pub async fn finalize(cached: Arc<ArchiveExport>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !has_finalizer(&cached) {
        return Ok(Action::await_change());
    }
    let Some(deletion) = Deletion::read(&cached, &ctx).await? else {
        return Ok(Action::await_change());
    };
    if let Some(why) = deletion.skip_reason() {
        return deletion.skip(why).await;
    }
    // Nothing may stream from the slot while it is dropped: stop the writers and runs.
    if export_pods_running(&ctx, &deletion.export, &deletion.ns).await? {
        return Ok(Action::requeue(Duration::from_secs(2)));
    }
    let job = deletion.cleanup_job().await?;
    match job.as_ref().map(crate::reconcile::job::job_phase) {
        None => deletion.start_attempt().await,
        Some(JobPhase::Active) | Some(JobPhase::Missing) => {
            Ok(Action::requeue(Duration::from_secs(3)))
        }
        Some(JobPhase::Succeeded) => deletion.succeeded(job.as_ref()).await,
        Some(JobPhase::Failed) => deletion.failed(job.as_ref()).await,
    }
}

/// One deletion in progress: the live export and its cleanup Job's coordinates.
struct Deletion<'a> {
    ctx: &'a Context,
    export: ArchiveExport,
    ns: String,
    name: String,
    jobs: Api<Job>,
    job_name: String,
}

impl<'a> Deletion<'a> {
    /// The export as the API server has it, when it is still the one being deleted. The cache
    /// can lag a finished deletion (the watch has not brought the finalizer's removal yet):
    /// acting on it would start a second cleanup Job that nobody deletes. The live object's
    /// resourceVersion also makes the finalizer patch succeed.
    async fn read(cached: &ArchiveExport, ctx: &'a Context) -> Result<Option<Deletion<'a>>, Error> {
        let ns = cached.namespace().ok_or(Error::NoNamespace)?;
        let name = cached.name_any();
        let exports: Api<ArchiveExport> = Api::namespaced(ctx.client.clone(), &ns);
        let export = match exports.get_opt(&name).await.map_err(Error::Cleanup)? {
            Some(live) if live.uid() == cached.uid() && has_finalizer(&live) => live,
            _ => return Ok(None),
        };
        Ok(Some(Deletion {
            ctx,
            jobs: Api::namespaced(ctx.client.clone(), &ns),
            job_name: cleanup_job_name(&export),
            export,
            ns,
            name,
        }))
    }

    /// The Events are what the user sees of a cleanup: one that could not be published (the
    /// API server busy, a timeout) fails the reconcile, which is retried before the Job is
    /// deleted or the object let go, instead of being lost with a warning. A namespace being
    /// deleted admits no new Event: that one is let pass.
    async fn publish(&self, type_: EventType, reason: &str, note: String) -> Result<(), Error> {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: "Cleanup".into(),
            secondary: None,
        };
        writes(self.ctx).count("Event", "create");
        match self
            .ctx
            .recorder
            .publish(&event, &self.export.object_ref(&()))
            .await
        {
            Ok(()) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("being terminated") => {
                tracing::warn!(reason, "namespace being deleted: no Event");
                Ok(())
            }
            Err(err) => {
                tracing::warn!(%err, reason, "could not publish the Event: retrying");
                Err(Error::Cleanup(err))
            }
        }
    }

    /// Why the database objects are left in place, if they are.
    fn skip_reason(&self) -> Option<&'static str> {
        let skip = self
            .export
            .annotations()
            .get(SKIP_CLEANUP_ANNOTATION)
            .is_some_and(|v| v == "true");
        if skip {
            Some("larch.dev/skip-cleanup")
        } else if deletion_policy(&self.export) == DeletionPolicy::Retain {
            Some("deletionPolicy Retain")
        } else {
            None
        }
    }

    /// Leaves the slot(s) and publication(s), says so, and lets the object go.
    async fn skip(&self, why: &str) -> Result<Action, Error> {
        self.delete_job().await?;
        let note = format!(
            "{why}: left on the source database ({}); drop them with `larch export cleanup --owner {}`",
            objects(&self.export),
            export_owner(&self.export)
        );
        self.publish(EventType::Warning, "CleanupSkipped", note)
            .await?;
        remove_finalizer(self.ctx, &self.export).await?;
        Ok(Action::await_change())
    }

    async fn cleanup_job(&self) -> Result<Option<Job>, Error> {
        self.jobs
            .get_opt(&self.job_name)
            .await
            .map_err(Error::Cleanup)
    }

    async fn delete_job(&self) -> Result<(), Error> {
        writes(self.ctx)
            .delete(&self.jobs, &self.job_name)
            .await
            .map_err(Error::Cleanup)
    }

    /// What `status.cleanup` says of the attempts so far.
    fn attempts(&self) -> CleanupStatus {
        self.export
            .status
            .as_ref()
            .and_then(|s| s.cleanup.clone())
            .unwrap_or_default()
    }

    /// Starts the next cleanup Job once its backoff has passed.
    async fn start_attempt(&self) -> Result<Action, Error> {
        let now = self.ctx.now();
        let mut cleanup = self.attempts();
        if let Some(wait) = time_until(cleanup.next_attempt_time.as_deref(), now) {
            return Ok(Action::requeue(wait));
        }
        writes(self.ctx).count("Job", "create");
        match self
            .jobs
            .create(
                &PostParams::default(),
                &cleanup_job(&self.export, &self.ctx.build),
            )
            .await
        {
            Ok(_) => {}
            // Created by an earlier reconcile whose status write was lost.
            Err(kube::Error::Api(e)) if e.code == 409 => {
                return Ok(Action::requeue(Duration::from_secs(3)));
            }
            // The namespace is being deleted: Kubernetes admits no new pod (nor Event) there,
            // so the cleanup can never run. Holding the object would keep the namespace
            // terminating forever; say what stays and let it go.
            Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains("being terminated") => {
                tracing::warn!(
                    export = %format!("{}/{}", self.ns, self.name),
                    "the namespace is being deleted, so no cleanup pod can run: left on the source database: {}; drop them with `larch export cleanup --owner {}`",
                    objects(&self.export),
                    export_owner(&self.export)
                );
                remove_finalizer(self.ctx, &self.export).await?;
                return Ok(Action::await_change());
            }
            Err(e) => return Err(Error::Cleanup(e)),
        }
        cleanup.attempts += 1;
        cleanup.last_attempt_time = Some(time_string(now));
        cleanup.next_attempt_time = None;
        let message = if cleanup.last_error.is_some() {
            format!("cleanup attempt {} started", cleanup.attempts)
        } else {
            format!("dropping {}", objects(&self.export))
        };
        write_status(self.ctx, &self.export, cleanup, &message).await?;
        Ok(Action::requeue(Duration::from_secs(5)))
    }

    /// Reports what was dropped and kept, then lets the object go.
    async fn succeeded(&self, job: Option<&Job>) -> Result<Action, Error> {
        let report = termination_message(self.ctx, &self.ns, &self.name, job).await?;
        let kept = kept_objects(&report);
        let (type_, note) = if kept.is_empty() {
            (
                EventType::Normal,
                format!("dropped what larch created: {}", dropped_objects(&report)),
            )
        } else {
            (
                EventType::Warning,
                format!(
                    "dropped: {}; kept (not recorded as this export's): {}",
                    dropped_objects(&report),
                    kept.join("; ")
                ),
            )
        };
        self.publish(type_, "CleanupSucceeded", note.chars().take(1000).collect())
            .await?;
        // The finalizer first: were the Job deleted first and the patch then refused, the
        // retry would find no Job and run the cleanup again.
        remove_finalizer(self.ctx, &self.export).await?;
        if let Err(err) = self.delete_job().await {
            tracing::warn!(%err, job = %format!("{}/{}", self.ns, self.job_name), "could not delete the finished cleanup Job (its TTL removes it)");
        }
        Ok(Action::await_change())
    }

    /// Records the failure, says how to give up, and schedules the next attempt.
    async fn failed(&self, job: Option<&Job>) -> Result<Action, Error> {
        let now = self.ctx.now();
        let mut cleanup = self.attempts();
        let message = termination_message(self.ctx, &self.ns, &self.name, job).await?;
        let error = failure_text(&message, job);
        let delay = backoff(cleanup.attempts);
        cleanup.last_error = Some(error.chars().take(2000).collect());
        cleanup.next_attempt_time = Some(time_string(
            now.checked_add(jiff::SignedDuration::from_secs(delay.as_secs() as i64))
                .unwrap_or(now),
        ));
        let note = format!(
            "attempt {}: {error}; retrying in {}s. To give up and leave the slot(s) on the source: kubectl annotate archiveexport {} {SKIP_CLEANUP_ANNOTATION}=true",
            cleanup.attempts,
            delay.as_secs(),
            self.name
        );
        self.publish(
            EventType::Warning,
            "CleanupFailed",
            note.chars().take(1000).collect(),
        )
        .await?;
        write_status(self.ctx, &self.export, cleanup, &note).await?;
        self.delete_job().await?;
        Ok(Action::requeue(delay))
    }
}

/// How long until `next_attempt` (at least 1 s), or `None` when it is due (or unreadable, so
/// a garbled status cannot hold a deletion forever).
fn time_until(next_attempt: Option<&str>, now: jiff::Timestamp) -> Option<Duration> {
    let at = next_attempt?.parse::<jiff::Timestamp>().ok()?;
    (at > now).then(|| Duration::from_secs(at.duration_since(now).as_secs().max(1) as u64))
}

async fn remove_finalizer(ctx: &Context, export: &ArchiveExport) -> Result<(), Error> {
    let rest: Vec<String> = export
        .finalizers()
        .iter()
        .filter(|f| *f != CLEANUP_FINALIZER)
        .cloned()
        .collect();
    set_finalizers(ctx, export, rest).await
}

/// Deletes the export's workloads (writers, the slot monitor, CronJobs and run Jobs) and
/// reports whether any of their pods is still there.
async fn export_pods_running(
    ctx: &Context,
    export: &ArchiveExport,
    ns: &str,
) -> Result<bool, Error> {
    let client = ctx.client.clone();
    let name = export.name_any();
    let all = format!("{LABEL_EXPORT}={name}");
    let runs = format!("{all},{LABEL_COMPONENT}=export");
    // Nothing of the export is wanted any more: each ChildSet prunes all it lists.
    let writer = writes(ctx);
    let mut workloads = ChildSet::new(&writer, all.clone());
    workloads.prune::<Deployment>(ns).await?;
    workloads.prune::<CronJob>(ns).await?;
    ChildSet::new(&writer, runs).prune::<Job>(ns).await?;
    let pods: Api<Pod> = Api::namespaced(client, ns);
    let left = pods
        .list(&ListParams::default().labels(&all))
        .await
        .map_err(Error::Cleanup)?
        .items
        .into_iter()
        .filter(|p| p.labels().get(LABEL_COMPONENT).map(String::as_str) != Some("cleanup"))
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded") | Some("Failed"))
        })
        .count();
    Ok(left > 0)
}

/// The termination message of the newest finished cleanup container of `job` (only its pods:
/// one with the labels alone is not read).
async fn termination_message(
    ctx: &Context,
    ns: &str,
    name: &str,
    job: Option<&Job>,
) -> Result<String, Error> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let listed = pods
        .list(
            &ListParams::default()
                .labels(&format!("{LABEL_EXPORT}={name},{LABEL_COMPONENT}=cleanup")),
        )
        .await
        .map_err(Error::Cleanup)?;
    let uid = job.and_then(|j| j.metadata.uid.clone()).unwrap_or_default();
    let listed = crate::reconcile::owned::owned_pods(&ctx.client, ns, &uid, listed.items)
        .await
        .map_err(Error::Cleanup)?;
    let newest = crate::reconcile::pod_failure::newest_terminated(&listed, CLEANUP_CONTAINER);
    Ok(newest
        .map(|(_, t)| {
            t.message.clone().unwrap_or_else(|| {
                format!(
                    "exit code {} ({})",
                    t.exit_code,
                    t.reason.as_deref().unwrap_or("Error")
                )
            })
        })
        .unwrap_or_default())
}

fn report_json(message: &str) -> serde_json::Value {
    message
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<serde_json::Value>(l.trim()).ok())
        .unwrap_or_default()
}

/// Objects a successful cleanup kept, with the reason.
pub fn kept_objects(message: &str) -> Vec<String> {
    report_json(message)["objects"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|o| o["outcome"] == "kept")
        .map(|o| {
            format!(
                "{} {}: {}",
                o["kind"].as_str().unwrap_or(""),
                o["name"].as_str().unwrap_or(""),
                o["reason"].as_str().unwrap_or("")
            )
        })
        .collect()
}

fn dropped_objects(message: &str) -> String {
    let dropped: Vec<String> = report_json(message)["objects"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|o| o["outcome"] == "dropped")
        .map(|o| {
            format!(
                "{} {}",
                o["kind"].as_str().unwrap_or(""),
                o["name"].as_str().unwrap_or("")
            )
        })
        .collect();
    if dropped.is_empty() {
        "nothing (already gone)".into()
    } else {
        dropped.join(", ")
    }
}

/// Why a cleanup attempt failed: the error the command wrote, else what Kubernetes says.
pub fn failure_text(message: &str, job: Option<&Job>) -> String {
    if let Some(e) = report_json(message)["error"].as_str() {
        return e.to_string();
    }
    if !message.trim().is_empty() {
        return message.trim().to_string();
    }
    job.and_then(|j| j.status.as_ref())
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Failed"))
        .map(|c| {
            format!(
                "the cleanup Job failed: {} {}",
                c.reason.as_deref().unwrap_or(""),
                c.message.as_deref().unwrap_or("")
            )
        })
        .unwrap_or_else(|| "the cleanup Job failed".into())
}

/// Status while deleting: `Ready=False` (reason `CleanupFailed` after a failure, else
/// `Deleting`), `Reconciling=True`, plus `status.cleanup`.
async fn write_status(
    ctx: &Context,
    export: &ArchiveExport,
    cleanup: CleanupStatus,
    message: &str,
) -> Result<(), Error> {
    let old = export.status.clone().unwrap_or_default();
    let reason = if cleanup.last_error.is_some() {
        "CleanupFailed"
    } else {
        "Deleting"
    };
    let desired = [
        Cond {
            type_: conditions::READY,
            status: Status::False,
            reason: reason.into(),
            message: message.into(),
        },
        Cond {
            type_: conditions::RECONCILING,
            status: Status::True,
            reason: reason.into(),
            message: message.into(),
        },
        Cond {
            type_: conditions::STALLED,
            status: Status::False,
            reason: reason.into(),
            message: String::new(),
        },
    ];
    let mut status = old.clone();
    status.cleanup = Some(cleanup);
    status.conditions = conditions::merge(
        &old.conditions,
        &desired,
        &EXPORT_TYPES,
        ctx.now(),
        export.metadata.generation,
    );
    let api: Api<ArchiveExport> =
        Api::namespaced(ctx.client.clone(), &export.namespace().unwrap_or_default());
    writes(ctx)
        .report(&api, export, export.status.as_ref(), &status, &[])
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_and_failures_read_from_the_termination_message() {
        let ok = r#"{"server":"db:5432/app as user u","objects":[{"kind":"slot","name":"s","outcome":"dropped"},{"kind":"publication","name":"p","outcome":"kept","reason":"not created by larch (no larch ownership comment)"}]}"#;
        assert_eq!(
            kept_objects(ok),
            ["publication p: not created by larch (no larch ownership comment)"]
        );
        assert_eq!(dropped_objects(ok), "slot s");
        let failed = r#"{"error":"cannot connect to PostgreSQL at db:5432/app as user u: connection refused"}"#;
        assert!(failure_text(failed, None).starts_with("cannot connect"));
        assert_eq!(failure_text("", None), "the cleanup Job failed");
    }

    #[test]
    fn the_next_attempt_waits_for_its_time() {
        let now: jiff::Timestamp = "2026-12-01T10:00:00Z".parse().unwrap();
        assert_eq!(time_until(None, now), None);
        assert_eq!(time_until(Some("2026-12-01T09:59:00Z"), now), None);
        assert_eq!(time_until(Some("2026-12-01T10:00:00Z"), now), None);
        assert_eq!(time_until(Some("garbled"), now), None);
        assert_eq!(
            time_until(Some("2026-12-01T10:00:40Z"), now),
            Some(Duration::from_secs(40))
        );
        assert_eq!(
            time_until(Some("2026-12-01T10:00:00.2Z"), now),
            Some(Duration::from_secs(1))
        );
    }

    #[test]
    fn retries_back_off_to_five_minutes() {
        let secs: Vec<u64> = (1..=8).map(|a| backoff(a).as_secs()).collect();
        assert_eq!(secs, [10, 20, 40, 80, 160, 300, 300, 300]);
    }
}
