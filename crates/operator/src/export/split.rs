//! A split export across pods (`spec.split.workers`): the run's export Job is the coordinator
//! (it holds the exported snapshot, writes the plan into the archive's store and commits), and
//! an Indexed Job `<name>-<run>-workers` of `workers` pods copies the ranges: worker `i`
//! (`JOB_COMPLETION_INDEX`) those `r` with `r % workers == i`, from the plan. The coordinator
//! holds the export's Lease from before it exports the snapshot until it commits; workers hold
//! none and mount no token; they need what the export pod needs (the DSN, the store, the
//! masking key).
//!
//! The run's outcome is the coordinator's, except that a workers Job that fails (an index's
//! retries exhausted, or a must-act exit) fails the run at once and stops the coordinator.

use k8s_openapi::api::batch::v1::{
    Job, JobSpec, PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement, PodFailurePolicyRule,
};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};

use crate::builders::{BuildContext, LABEL_RUN, child_meta, pod};
use crate::crd::archive_export::{ArchiveExport, ExportMode, RunStatus, SplitStatus};
use crate::crd::common::TableRef;
use crate::export::build::{self, DEFAULT_BACKOFF, DEFAULT_TTL};
use crate::reconcile::conditions::Problem;
use crate::reconcile::context::MANAGER_EXPORT;
use crate::reconcile::job::JobPhase;
use crate::reconcile::pod_failure;

/// The worker container's name: distinct from the coordinator's, so a worker's termination
/// message is never read as the export's summary.
pub const WORKER_CONTAINER: &str = "worker";

/// The pod annotation the Job controller sets to the pod's index (Indexed Jobs).
const INDEX_ANNOTATION: &str = "batch.kubernetes.io/job-completion-index";

/// The worker pods of a run: `spec.split.workers` of a OneShot export of one table.
pub fn split_workers(export: &ArchiveExport) -> Option<u16> {
    let spec = &export.spec;
    let one_table = spec.source.table.is_some();
    let oneshot = spec.mode == ExportMode::OneShot && spec.schedule.is_none();
    spec.split
        .and_then(|s| s.workers)
        .filter(|_| one_table && oneshot)
}

/// `<name>-<run>-workers`: the run's export Job's name with `-workers`.
pub fn workers_job_name(export: &ArchiveExport, table: &TableRef, run: &str) -> String {
    format!("{}-workers", build::job_name(export, table, run))
}

/// The workers Job's name for run `run`, when the export splits across pods.
pub fn run_workers_job_name(export: &ArchiveExport, run: &str) -> Option<String> {
    split_workers(export)?;
    let table = export.spec.source.table.as_ref()?;
    Some(workers_job_name(export, table, run))
}

/// `larch export split-worker --index $(JOB_COMPLETION_INDEX) --request '<json>'`: the
/// coordinator's own request; Kubernetes expands the index from the container's environment.
pub fn worker_args(export: &ArchiveExport, table: &TableRef) -> Vec<String> {
    let request = build::export_request(export, table);
    vec![
        "export".into(),
        "split-worker".into(),
        "--index".into(),
        "$(JOB_COMPLETION_INDEX)".into(),
        "--request".into(),
        request.to_json(),
    ]
}

/// The Indexed Job of run `run`'s workers; none unless the export splits across pods.
pub fn workers_job(export: &ArchiveExport, run: &str, ctx: &BuildContext) -> Option<Job> {
    let workers = i32::from(split_workers(export)?);
    let table = export.spec.source.table.as_ref()?;
    let mut template = build::pod_template(export, table, ctx, Some(run));
    let spec = template.spec.as_mut()?;
    // Only the coordinator talks to the API (its Lease): a worker mounts no token.
    spec.service_account_name = export.spec.service_account_name.clone();
    spec.automount_service_account_token = Some(false);
    let container = spec.containers.first_mut()?;
    container.name = WORKER_CONTAINER.into();
    container.args = Some(worker_args(export, table));
    // A worker serves nothing: the coordinator reports the run.
    container.ports = None;
    // The Job controller injects it too; named here so `--index $(JOB_COMPLETION_INDEX)`
    // expands from it whatever the controller's version.
    let index = format!("metadata.annotations['{INDEX_ANNOTATION}']");
    container
        .env
        .get_or_insert_with(Vec::new)
        .push(pod::field_env("JOB_COMPLETION_INDEX", &index));
    let mut labels = build::selector_labels(export, Some(table));
    labels.insert(LABEL_RUN.into(), run.into());
    Some(Job {
        metadata: child_meta(export, workers_job_name(export, table, run), labels),
        spec: Some(JobSpec {
            completion_mode: Some("Indexed".into()),
            completions: Some(workers),
            parallelism: Some(workers),
            // A killed worker is retried (from its ranges not yet checkpointed); one whose
            // retries are exhausted, or that exits must-act, fails the Job at once.
            backoff_limit_per_index: Some(export.spec.backoff_limit.unwrap_or(DEFAULT_BACKOFF)),
            max_failed_indexes: Some(0),
            pod_failure_policy: Some(fail_index_on_permanent_exit()),
            // A retried index runs once its last pod has stopped: never two writers of the
            // same part numbers.
            pod_replacement_policy: Some(build::ONE_POD_AT_A_TIME.into()),
            ttl_seconds_after_finished: Some(
                export
                    .spec
                    .ttl_seconds_after_finished
                    .unwrap_or(DEFAULT_TTL),
            ),
            template,
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// A worker exiting must-act (bad input) fails its index without retries.
fn fail_index_on_permanent_exit() -> PodFailurePolicy {
    PodFailurePolicy {
        rules: vec![PodFailurePolicyRule {
            action: "FailIndex".into(),
            on_exit_codes: Some(PodFailurePolicyOnExitCodesRequirement {
                container_name: Some(WORKER_CONTAINER.into()),
                operator: "In".into(),
                values: vec![larch_core::failure::EXIT_PERMANENT],
            }),
            on_pod_conditions: None,
        }],
    }
}

/// How many indexes a Job's `completedIndexes` (`0-2,5`) names.
pub fn count_indexes(list: &str) -> i32 {
    list.split(',')
        .filter(|p| !p.is_empty())
        .map(|part| match part.split_once('-') {
            Some((a, b)) => match (a.parse::<i32>(), b.parse::<i32>()) {
                (Ok(a), Ok(b)) if b >= a => b - a + 1,
                _ => 0,
            },
            None => i32::from(part.parse::<i32>().is_ok()),
        })
        .sum()
}

/// `status.split` of run `run`: from its workers Job (`None`: not created yet or gone).
pub fn split_status(export: &ArchiveExport, job: Option<&Job>) -> Option<SplitStatus> {
    let workers = split_workers(export)?;
    let ranges = export.spec.split.map_or(0, |s| s.ranges);
    let status = job.and_then(|j| j.status.as_ref());
    Some(SplitStatus {
        ranges: i32::from(ranges),
        workers: i32::from(workers),
        workers_succeeded: status
            .and_then(|s| s.completed_indexes.as_deref())
            .map_or(0, count_indexes),
        failed_indexes: status
            .and_then(|s| s.failed_indexes.clone())
            .filter(|f| !f.is_empty())
            .map(|f| f.chars().take(256).collect()),
    })
}

/// A split run's outcome from its Jobs' phases (the coordinator's, then the workers'): the
/// coordinator's success is the run's (it committed the manifest), once its workers, which
/// are exiting, are done too (so `status.split` counts them); else a Job that failed fails
/// the run at once, a missing one once the other is done.
pub fn run_outcome(jobs: &[JobPhase]) -> Option<bool> {
    use JobPhase::*;
    match jobs {
        [Succeeded, Active] => None,
        [Succeeded, ..] => Some(true),
        _ if jobs.contains(&Failed) => Some(false),
        _ => crate::export::conditions::run_outcome(jobs),
    }
}

/// Why the split run `run` failed when its workers Job did ([`workers_problem`]).
pub fn failed_workers(
    split: Option<&SplitStatus>,
    run: Option<&str>,
    pods: &[Pod],
) -> Option<Problem> {
    let split = split.filter(|s| s.failed_indexes.is_some())?;
    Some(workers_problem(split, run?, pods))
}

/// Why the run's workers Job failed, naming the worker index: the newest failed worker pod's
/// own words when one is left, else the indexes the Job lists as failed.
pub fn workers_problem(split: &SplitStatus, run: &str, pods: &[Pod]) -> Problem {
    let failed = split.failed_indexes.as_deref().unwrap_or("?");
    let of_run = pods
        .iter()
        .filter(|p| p.labels().get(LABEL_RUN).map(String::as_str) == Some(run));
    let newest = pod_failure::newest_terminated(of_run, WORKER_CONTAINER)
        .and_then(|(pod, t)| pod_failure::of_terminated(&pod, t).map(|f| (pod, f)));
    let Some((pod, failure)) = newest else {
        return Problem {
            reason: "SplitWorkerFailed".into(),
            message: format!(
                "split worker {failed} (of {}) failed with its retries exhausted",
                split.workers
            ),
            transient: false,
        };
    };
    let index = pods
        .iter()
        .find(|p| p.name_any() == pod)
        .and_then(|p| p.annotations().get(INDEX_ANNOTATION).cloned())
        .unwrap_or_else(|| failed.to_string());
    Problem::of_pod(
        &format!("split worker {index} (of {})", split.workers),
        &failure,
    )
}

/// A split run that failed: its Jobs (named `wanted`, in `phases`) still running are stopped.
pub async fn stop_if_failed(
    api: &Api<Job>,
    run: Option<&RunStatus>,
    wanted: &[String],
    phases: &[JobPhase],
) -> Result<(), kube::Error> {
    if run.and_then(|r| r.succeeded) != Some(false) {
        return Ok(());
    }
    let active = wanted
        .iter()
        .zip(phases)
        .filter(|(_, p)| **p == JobPhase::Active);
    let names: Vec<&str> = active.map(|(n, _)| n.as_str()).collect();
    stop_jobs(api, &names).await
}

/// Stops the run's Jobs still running once the run failed (the coordinator waiting for
/// workers that will not come, or workers of a coordinator that gave up): their deadline is
/// set to one second, so the Job controller ends their pods and marks them failed.
pub async fn stop_jobs(api: &Api<Job>, names: &[&str]) -> Result<(), kube::Error> {
    let patch = serde_json::json!({"spec": {"activeDeadlineSeconds": 1}});
    let params = PatchParams {
        field_manager: Some(MANAGER_EXPORT.into()),
        ..Default::default()
    };
    for name in names {
        match api.patch(name, &params, &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
