//! The ArchiveExport controller: dereference (the Secrets, keys, CA bundles and claim the spec
//! names) → validate (what the schema cannot check) → build → apply (server-side apply, one
//! field manager; a refused child is a condition) → observe (Jobs, pods' termination messages
//! and failures, writers' `/status`) → status, with Events on failure transitions.
//!
//! OneShot runs: a run is identified by a hash of the spec and the `larch.dev/run-requested`
//! token. Its Jobs are created once, when the run is new; the run is then recorded in status, and
//! a recorded run is only ever observed, never re-created, so a Job removed by its TTL (or by
//! hand) does not run again. A new spec or a new token starts a new run.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};

use super::apply::Applier;
use super::context::{Context, Error, MANAGER_EXPORT};
use crate::operator::builders::export::{self as build, ExportChildren};
use crate::operator::builders::{ANNOTATION_TABLE, LABEL_EXPORT, LABEL_RUN};
use crate::operator::conditions::{
    self, EXPORT_TYPES, ExportObservation, JobPhase, Problem, export_conditions, run_outcome,
    time_string,
};
use crate::operator::crd::archive_export::{
    ArchiveExport, ArchiveExportStatus, ExportMode, ExportSummary, RUN_REQUESTED_ANNOTATION,
    RunStatus, WriterStatus,
};
use crate::operator::pod_failure::{self, PodFailure};
use crate::operator::{dereference, observe, validate};

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

pub(super) fn job_phase(job: &Job) -> JobPhase {
    let conds = job.status.as_ref().and_then(|s| s.conditions.as_ref());
    let has =
        |t: &str| conds.is_some_and(|cs| cs.iter().any(|c| c.type_ == t && c.status == "True"));
    if has("Complete") || has("SuccessCriteriaMet") {
        JobPhase::Succeeded
    } else if has("Failed") || has("FailureTarget") {
        JobPhase::Failed
    } else {
        JobPhase::Active
    }
}

/// Finished export pods: successes (parsed summaries) and the outcome of the newest one.
struct PodFindings {
    summaries: Vec<ExportSummary>,
    /// (finished at, success, message) of the newest finished export container.
    newest: Option<(String, bool, String)>,
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
            if ok
                && let Some(mut s) =
                    observe::parse_summary(&message, finished.clone(), Some(pod.name_any()))
            {
                if s.table.is_empty()
                    && let Some(t) = pod.annotations().get(ANNOTATION_TABLE)
                {
                    s.table = t.clone();
                }
                out.summaries.push(s);
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
            let key = finished.unwrap_or_default();
            if out.newest.as_ref().is_none_or(|(t, _, _)| key > *t) {
                out.newest = Some((key, ok, detail));
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

/// Applies a child unless it is in place already; returns it as it now is.
async fn apply<K: super::Child>(applier: &Applier<'_>, api: &Api<K>, obj: &K) -> Result<K, Error> {
    applier.apply_read(api, obj.clone()).await
}

/// Deletes the export's children of kind `K` that are not wanted any more (mode or schedule
/// changed); returns how many. Jobs are left to their TTL.
async fn prune<K: super::Child>(
    applier: &Applier<'_>,
    api: &Api<K>,
    selector: &str,
    keep: &BTreeSet<String>,
) -> Result<usize, Error> {
    let mut deleted = 0;
    for obj in api.list(&ListParams::default().labels(selector)).await? {
        let name = obj.name_any();
        if !keep.contains(&name) {
            applier.delete(api, &name).await?;
            deleted += 1;
        }
    }
    Ok(deleted)
}

pub async fn reconcile(export: Arc<ArchiveExport>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = export.namespace().ok_or(Error::NoNamespace)?;
    let name = export.name_any();
    if export.metadata.deletion_timestamp.is_some() {
        return super::cleanup::finalize(export, ctx).await;
    }
    if super::cleanup::ensure_finalizer(&export, &ctx).await? {
        // The watch brings the object with its finalizer.
        return Ok(Action::await_change());
    }
    let now = ctx.now();
    let client = ctx.client.clone();
    let old = export.status.clone().unwrap_or_default();
    // Exports are few (not one per namespace): children are read back, not cached.
    let applier = Applier::new(&ctx, "export", MANAGER_EXPORT);
    let mut status = ArchiveExportStatus {
        observed_generation: export.metadata.generation,
        ..old.clone()
    };
    let suspended = export.spec.suspend == Some(true);
    let mut obs = ExportObservation {
        blocked: None,
        pod_failure: None,
        mode: export.spec.mode,
        scheduled: export.spec.schedule.is_some(),
        suspended,
        run: old.run.clone(),
        run_jobs: vec![],
        last_outcome: None,
        writers: (0, 0, false),
        writers_with_snapshot: 0,
        suspended_slots: vec![],
    };
    let mut events: Vec<Event> = vec![];
    let mut requeue = Duration::from_secs(300);

    // Dereference, then validate: nothing is built while what the spec names is missing or
    // the spec cannot work.
    let references = dereference::export_references(&export);
    if let Some(missing) = dereference::check(&client, &ns, &references).await? {
        obs.blocked = Some(Problem::new(missing.reason(), missing.message(&ns)));
        requeue = dereference::RECHECK;
    } else if let Err(message) = validate::export(&export) {
        obs.blocked = Some(Problem::new("InvalidSpec", message));
    }

    if obs.blocked.is_none() {
        let built: Result<Duration, Error> = async {
            let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
            let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
            let selector = format!("{LABEL_EXPORT}={name}");
            let tables = export.spec.source.all_tables();

            // Which run, if any, is new and needs its Jobs created.
            let mut new_run = None;
            if let Some((id, token)) = wanted_run(&export)
                && old.run.as_ref().is_none_or(|r| r.id != id)
                && !suspended
            {
                new_run = Some(id.clone());
                status.run = Some(RunStatus {
                    id,
                    token,
                    start_time: Some(time_string(now)),
                    completion_time: None,
                    succeeded: None,
                });
            }

            // Build and apply.
            let children: ExportChildren = build::children(&export, new_run.as_deref(), &ctx.build);
            if let Some(pvc) = &children.pvc {
                apply(
                    &applier,
                    &Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns),
                    pvc,
                )
                .await?;
            }
            let cron_api: Api<CronJob> = Api::namespaced(client.clone(), &ns);
            for cj in &children.cron_jobs {
                apply(&applier, &cron_api, cj).await?;
            }
            // The Leases and the exporter's rights on them go first: a new pod finds them.
            let lease_api: Api<Lease> = Api::namespaced(client.clone(), &ns);
            let sa_api: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
            let role_api: Api<Role> = Api::namespaced(client.clone(), &ns);
            let binding_api: Api<RoleBinding> = Api::namespaced(client.clone(), &ns);
            let mut keep_leases = BTreeSet::new();
            let mut keep_sa = BTreeSet::new();
            let mut keep_roles = BTreeSet::new();
            if let Some(la) = &children.lease_access {
                if let Some(sa) = &la.service_account {
                    keep_sa.insert(apply(&applier, &sa_api, sa).await?.name_any());
                }
                keep_roles.insert(apply(&applier, &role_api, &la.role).await?.name_any());
                apply(&applier, &binding_api, &la.role_binding).await?;
                for l in &la.leases {
                    keep_leases.insert(apply(&applier, &lease_api, l).await?.name_any());
                }
            }
            let dep_api: Api<Deployment> = Api::namespaced(client.clone(), &ns);
            let mut applied_deps = vec![];
            for d in &children.deployments {
                applied_deps.push(apply(&applier, &dep_api, d).await?);
            }
            if let Some(m) = &children.slot_monitor {
                apply(&applier, &dep_api, m).await?;
            }
            for j in &children.jobs {
                apply(&applier, &jobs, j).await?;
            }
            let names = |v: Vec<Option<String>>| v.into_iter().flatten().collect::<BTreeSet<_>>();
            prune(
                &applier,
                &cron_api,
                &selector,
                &names(
                    children
                        .cron_jobs
                        .iter()
                        .map(|c| c.metadata.name.clone())
                        .collect(),
                ),
            )
            .await?;
            let deployments_pruned = prune(
                &applier,
                &dep_api,
                &selector,
                &names(
                    children
                        .deployments
                        .iter()
                        .chain(&children.slot_monitor)
                        .map(|c| c.metadata.name.clone())
                        .collect(),
                ),
            )
            .await?;
            // After the Deployments, so no exporter outlives its Lease rights. Only where some can
            // be stale: a continuous export (its tables changed) or one that just left that mode.
            if children.lease_access.is_some() || deployments_pruned > 0 {
                prune(&applier, &lease_api, &selector, &keep_leases).await?;
                prune(&applier, &binding_api, &selector, &keep_roles).await?;
                prune(&applier, &role_api, &selector, &keep_roles).await?;
                prune(&applier, &sa_api, &selector, &keep_sa).await?;
            }
            if let Some(id) = &new_run {
                events.push(Event {
                    type_: EventType::Normal,
                    reason: "ExportStarted".into(),
                    note: Some(format!("run {id}: {} Job(s) created", children.jobs.len())),
                    action: "CreateJobs".into(),
                    secondary: None,
                });
            }

            // Observe the current run's Jobs.
            if let Some(run) = status.run.clone().filter(|r| r.succeeded.is_none()) {
                if new_run.is_some() {
                    obs.run_jobs = vec![JobPhase::Active; tables.len()];
                } else {
                    let listed = jobs
                        .list(
                            &ListParams::default()
                                .labels(&format!("{selector},{LABEL_RUN}={}", run.id)),
                        )
                        .await?;
                    obs.run_jobs = tables
                        .iter()
                        .map(|t| {
                            let want = build::job_name(&export, t, &run.id);
                            listed
                                .items
                                .iter()
                                .find(|j| j.metadata.name.as_deref() == Some(want.as_str()))
                                .map(job_phase)
                                .unwrap_or(JobPhase::Missing)
                        })
                        .collect();
                    if let Some(ok) = run_outcome(&obs.run_jobs)
                        && !obs.run_jobs.contains(&JobPhase::Missing)
                    {
                        let r = status.run.as_mut().expect("run exists");
                        r.succeeded = Some(ok);
                        r.completion_time = Some(time_string(now));
                        events.push(Event {
                            type_: if ok {
                                EventType::Normal
                            } else {
                                EventType::Warning
                            },
                            reason: if ok {
                                "ExportSucceeded"
                            } else {
                                "ExportFailed"
                            }
                            .into(),
                            note: Some(format!("run {}", run.id)),
                            action: "Export".into(),
                            secondary: None,
                        });
                    }
                }
                requeue = Duration::from_secs(60);
            }
            obs.run = status.run.clone();

            // Summaries and outcomes from the export pods' termination messages.
            if export.spec.mode == ExportMode::OneShot {
                let listed = pods.list(&ListParams::default().labels(&selector)).await?;
                let found = read_pods(&listed.items);
                obs.last_outcome = found.newest.map(|(_, ok, msg)| (ok, msg));
                // Why the newest attempt failed: of the current run (a scheduled export's last
                // run is its newest pod).
                let run_id = status.run.as_ref().map(|r| r.id.clone());
                let attempts = listed.items.iter().filter(|p| {
                    export.spec.schedule.is_some()
                        || run_id.is_some() && p.labels().get(LABEL_RUN) == run_id.as_ref()
                });
                obs.pod_failure = newest_failure(attempts).map(|f| Problem::of_pod("export", &f));
                status.tables =
                    merge_summaries(std::mem::take(&mut status.tables), found.summaries);
                status.last_export = status
                    .tables
                    .iter()
                    .max_by(|a, b| a.time.cmp(&b.time))
                    .cloned();
            }

            // Continuous writers: Deployment status and each ready pod's /status.
            if export.spec.mode == ExportMode::Continuous {
                let desired = if suspended { 0 } else { tables.len() as i32 };
                let ready: i32 = applied_deps
                    .iter()
                    .map(|d| {
                        d.status
                            .as_ref()
                            .and_then(|s| s.available_replicas)
                            .unwrap_or(0)
                            .min(1)
                    })
                    .sum();
                let stalled = applied_deps.iter().any(|d| {
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
                obs.writers = (ready, desired, stalled);
                let listed = pods.list(&ListParams::default().labels(&selector)).await?;
                if !suspended {
                    obs.pod_failure =
                        pod_failure::first_failure(&listed.items, build::CONTAINER, now)
                            .map(|f| Problem::of_pod("writer", &f));
                }
                let mut writers: Vec<WriterStatus> = vec![];
                let mut monitor = None;
                for pod in &listed.items {
                    let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.clone()) else {
                        continue;
                    };
                    let Ok(body) = ctx.prober.get(&ip, 8080, "/status").await else {
                        continue;
                    };
                    if let Some(w) = observe::parse_writer_status(&body) {
                        writers.push(w);
                    } else if let Some(m) = observe::parse_slot_monitor(&body) {
                        monitor = Some(m);
                    }
                }
                writers.sort_by(|a, b| a.table.cmp(&b.table));
                writers.truncate(32);
                let writers =
                    super::slots::merge_writers(&export, &old.writers, writers, monitor, suspended);
                events.extend(super::slots::slot_events(&old.writers, &writers));
                if suspended {
                    obs.suspended_slots = super::slots::suspended_slots(&export, &writers);
                }
                ctx.metrics.set_retained_wal(
                    &ns,
                    &name,
                    writers
                        .iter()
                        .filter_map(|w| Some((w.slot.clone()?, w.retained_wal_bytes?))),
                );
                obs.writers_with_snapshot = writers
                    .iter()
                    .filter(|w| w.last_snapshot_at.is_some())
                    .count();
                // The printer columns show the newest snapshot of any writer.
                if let Some(w) = writers
                    .iter()
                    .filter(|w| w.last_snapshot_at.is_some())
                    .max_by(|a, b| a.last_snapshot_at.cmp(&b.last_snapshot_at))
                {
                    status.last_export = Some(ExportSummary {
                        table: w.table.clone(),
                        key_prefix: None,
                        position: w.head_position.clone(),
                        row_count: None,
                        epoch: w.epoch,
                        time: w.last_snapshot_at.clone(),
                        pod: None,
                    });
                }
                status.writers = writers;
                requeue = Duration::from_secs(30);
            }
            Ok(requeue)
        }
        .await;
        match built {
            Ok(r) => requeue = r,
            // A child the API server refused: nothing of this run started.
            Err(Error::Rejected(r)) => {
                status.run = old.run.clone();
                obs.run = old.run.clone();
                obs.run_jobs = vec![];
                events.clear();
                obs.blocked = Some(Problem::new("ChildRejected", r.to_string()));
                requeue = Duration::from_secs(60);
            }
            Err(e) => return Err(e),
        }
    }

    // Conditions, metrics, status (only when changed), events.
    let desired = export_conditions(&obs);
    status.conditions = conditions::merge(
        &old.conditions,
        &desired,
        &EXPORT_TYPES,
        now,
        export.metadata.generation,
    );
    events.extend(super::failure_events(&old.conditions, &status.conditions));
    let failing = status
        .conditions
        .iter()
        .any(|c| c.type_ == conditions::LAST_EXPORT_SUCCEEDED && c.status == "False");
    ctx.metrics
        .export_failing
        .with_label_values(&[ns.as_str(), name.as_str()])
        .set(if failing { 1.0 } else { 0.0 });
    for t in &status.tables {
        if let Some(ts) = t
            .time
            .as_deref()
            .and_then(|s| s.parse::<jiff::Timestamp>().ok())
        {
            ctx.metrics
                .set_export_success(&ns, &name, &t.table, ts.as_second() as f64);
        }
    }
    applier
        .report(
            &Api::<ArchiveExport>::namespaced(client.clone(), &ns),
            &*export,
            export.status.as_ref(),
            &status,
            &events,
        )
        .await?;
    Ok(Action::requeue(requeue))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStatus, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn pod(name: &str, exit: i32, msg: &str, minute: i64) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.status = Some(PodStatus {
            container_statuses: Some(vec![ContainerStatus {
                name: "larch".into(),
                state: Some(ContainerState {
                    terminated: Some(ContainerStateTerminated {
                        exit_code: exit,
                        message: Some(msg.into()),
                        finished_at: Some(Time(
                            jiff::Timestamp::from_second(1_800_000_000 + minute * 60).unwrap(),
                        )),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        });
        p
    }

    #[test]
    fn pods_yield_summaries_and_the_newest_outcome() {
        let ok = r#"{"key_prefix":"public.a/","position":"0/1","row_count":3,"table":"public.a","epoch":1}"#;
        let ok2 = r#"{"key_prefix":"public.a/","position":"0/2","row_count":4,"table":"public.a","epoch":1}"#;
        let pods = [
            pod("p1", 0, ok, 1),
            pod("p2", 1, "connection refused", 3),
            pod("p3", 0, ok2, 2),
        ];
        let f = read_pods(&pods);
        assert_eq!(f.summaries.len(), 2);
        let (_, success, msg) = f.newest.unwrap();
        assert!(!success);
        assert!(
            msg.contains("exited 1") && msg.contains("connection refused"),
            "{msg}"
        );
        let merged = merge_summaries(vec![], f.summaries);
        assert_eq!(merged.len(), 1);
        assert_eq!(
            merged[0].position.as_deref(),
            Some("0/2"),
            "the newest summary per table wins"
        );
    }
}
