//! The Job of an ArchiveRestore run: one pod running `larch restore` (docs/restore.md) with the
//! store access and Pod Security "restricted" context every generated pod has, the target's
//! DSN as a Secret file, and its summary (or failure) in the termination message.

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{Container, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;

use crate::builders::engine_config::{ResolvedArchive, TARGET_DSN_FILE, resolve_archive};
use crate::builders::{
    BuildContext, LABEL_COMPONENT, LABEL_MANAGED_BY, LABEL_NAME, LABEL_RUN, MANAGED_BY, child_meta,
    labels, pod, short_hash,
};
use crate::crd::archive_export::ArchiveExport;
use crate::crd::archive_restore::{ArchiveRestore, IfExists};
use crate::export::build::{SPILL_DIR, TERMINATION_LOG};
use larch_contract::restore_request::{IfExists as RequestIfExists, RestoreRequest};

pub const LABEL_RESTORE: &str = "larch.dev/archive-restore";
pub const CONTAINER: &str = "restore";
/// Retries of the restore pod when the spec does not say.
pub const DEFAULT_BACKOFF: i32 = 2;
/// Finished Jobs are kept a day (the status records the outcome when it is observed).
pub const DEFAULT_TTL: i32 = 86400;

/// Identity of a run: a hash of the spec and the run-requested token (as an export's).
pub fn run_id(restore: &ArchiveRestore, token: Option<&str>) -> String {
    let mut data = serde_json::to_vec(&restore.spec).expect("spec serialises");
    data.push(0);
    data.extend(token.unwrap_or("").as_bytes());
    short_hash(&data, 8)
}

pub fn job_name(restore: &ArchiveRestore, run: &str) -> String {
    format!("{}-{run}", restore.name_any())
}

/// The Job of attempt `attempt` of a run: the first is [`job_name`], each retry after the
/// database was unavailable gets `-<attempt>`.
pub fn attempt_job_name(restore: &ArchiveRestore, run: &str, attempt: i32) -> String {
    match attempt {
        0 => job_name(restore, run),
        n => format!("{}-{n}", job_name(restore, run)),
    }
}

/// The archive the restore reads, `exportRef` resolved (`export`: the referenced one).
pub fn resolve(
    restore: &ArchiveRestore,
    export: Option<&ArchiveExport>,
) -> Result<ResolvedArchive, String> {
    let tables = restore.spec.tables.clone();
    let group = tables.as_ref().is_some_and(|t| t.len() > 1);
    resolve_archive(&restore.spec.archive, tables, group, None, export)
}

pub fn selector_labels(restore: &ArchiveRestore) -> std::collections::BTreeMap<String, String> {
    labels(&[
        (LABEL_NAME, "larch"),
        (LABEL_COMPONENT, "restore"),
        (LABEL_MANAGED_BY, MANAGED_BY),
        (LABEL_RESTORE, &restore.name_any()),
    ])
}

/// What the restore pod runs, for the resolved archive.
pub fn restore_request(restore: &ArchiveRestore, archive: &ResolvedArchive) -> RestoreRequest {
    let (key_prefix_root, key_prefix) = if archive.group {
        (archive.key_prefix.clone(), None)
    } else {
        (String::new(), Some(archive.key_prefix.clone()))
    };
    RestoreRequest {
        store: pod::store_spec(&archive.location),
        tables: archive.tables.iter().map(|t| t.qualified()).collect(),
        key_prefix_root,
        key_prefix,
        formats: archive.formats.clone().unwrap_or_default(),
        at: restore
            .spec
            .at
            .as_ref()
            .and_then(|a| a.arg())
            .map(str::to_string),
        if_exists: match restore.spec.if_exists.unwrap_or(IfExists::Fail) {
            IfExists::Fail => RequestIfExists::Fail,
            IfExists::Replace => RequestIfExists::Replace,
        },
        split: restore.spec.split,
        connection_file: Some(TARGET_DSN_FILE.into()),
        buffer_memory: None,
        spill_dir: Some(SPILL_DIR.into()),
        summary_file: Some(TERMINATION_LOG.into()),
        // Its progress on /status, which the operator reads into status.progress.
        listen: Some(pod::listen_arg()),
    }
}

/// `larch restore --request '<json>'`: the container's arguments for `request`.
pub fn restore_args(request: &RestoreRequest) -> Vec<String> {
    vec!["restore".into(), "--request".into(), request.to_json()]
}

fn pod_template(
    restore: &ArchiveRestore,
    archive: &ResolvedArchive,
    run: &str,
    ctx: &BuildContext,
) -> PodTemplateSpec {
    let spec = &restore.spec;
    let claim = archive.claim_name.clone().unwrap_or_default();
    let access = pod::store_access(&archive.location, &claim, true);
    let target = &spec.target.postgres;
    let (mut volumes, mut mounts) =
        pod::target_dsn(&target.connection_secret_ref, target.ca_bundle.as_ref());
    volumes.extend([pod::empty_dir("spill"), pod::empty_dir("tmp")]);
    mounts.extend([
        pod::mount("spill", SPILL_DIR, false),
        pod::mount("tmp", "/tmp", false),
    ]);
    volumes.extend(access.volumes);
    mounts.extend(access.mounts);
    // POD_IP first: the request's `listen: $(POD_IP):8080` refers to it.
    let mut env = vec![pod::pod_ip_env()];
    env.extend(access.env);
    let container = Container {
        name: CONTAINER.into(),
        image: Some(ctx.image.clone()),
        command: Some(vec!["larch".into()]),
        args: Some(restore_args(&restore_request(restore, archive))),
        env: Some(env),
        // Serves /status and /metrics while it runs; no probes: a Job's pod is not a backend.
        ports: Some(vec![pod::http_port()]),
        volume_mounts: Some(mounts),
        resources: pod::resources(spec.resources.as_ref()),
        security_context: Some(pod::container_security()),
        // `larch restore` writes its summary or its failure there.
        termination_message_path: Some(TERMINATION_LOG.into()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    };
    let mut pod_spec = pod::base_pod_spec(
        container,
        volumes,
        spec.service_account_name.as_ref(),
        ctx.pod_user,
    );
    pod_spec.restart_policy = Some("Never".into());
    let annotations = pod::apply_overrides(&mut pod_spec, spec.pod.as_ref());
    let mut pod_labels = selector_labels(restore);
    pod_labels.insert(LABEL_RUN.into(), run.into());
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(pod_labels),
            annotations,
            ..Default::default()
        }),
        spec: Some(pod_spec),
    }
}

/// The Job of run `run`.
pub fn job(
    restore: &ArchiveRestore,
    archive: &ResolvedArchive,
    run: &str,
    ctx: &BuildContext,
) -> Job {
    attempt_job(restore, archive, run, 0, ctx)
}

/// The Job of attempt `attempt` of run `run` ([`attempt_job_name`]).
pub fn attempt_job(
    restore: &ArchiveRestore,
    archive: &ResolvedArchive,
    run: &str,
    attempt: i32,
    ctx: &BuildContext,
) -> Job {
    let mut l = selector_labels(restore);
    l.insert(LABEL_RUN.into(), run.into());
    Job {
        metadata: child_meta(restore, attempt_job_name(restore, run, attempt), l),
        spec: Some(JobSpec {
            backoff_limit: Some(restore.spec.backoff_limit.unwrap_or(DEFAULT_BACKOFF)),
            pod_failure_policy: Some(pod::fail_fast(CONTAINER)),
            ttl_seconds_after_finished: Some(DEFAULT_TTL),
            template: pod_template(restore, archive, run, ctx),
            ..Default::default()
        }),
        ..Default::default()
    }
}
