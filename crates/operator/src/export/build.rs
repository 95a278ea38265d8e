//! ArchiveExport → Jobs (OneShot), CronJobs (OneShot + schedule), Deployments (Continuous) and
//! the archive PVC the operator creates for `destination.volume.size`.
//!
//! `tables`: one child per table (a Job, CronJob or Deployment each), named
//! `<name>-<8-hex table id>`; a single `table` uses `<name>` alone. Jobs append the run id.
//! OneShot `tables` with `parallel`: one Job (or CronJob) `<name>` exporting every table at one
//! position.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy};
use k8s_openapi::api::batch::v1::{CronJob, CronJobSpec, Job, JobSpec, JobTemplateSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    Container, PersistentVolumeClaim, PersistentVolumeClaimSpec, PodSpec, PodTemplateSpec,
    ServiceAccount, Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::ResourceExt;

use crate::builders::pod;
use crate::builders::{
    ANNOTATION_TABLE, BuildContext, LABEL_COMPONENT, LABEL_EXPORT, LABEL_MANAGED_BY, LABEL_NAME,
    LABEL_RUN, LABEL_TABLE, MANAGED_BY, child_meta, labels, short_hash, table_id,
};
use crate::crd::archive_export::{ArchiveExport, ConcurrencyPolicy, ExportMode, SlotMode};
use crate::crd::common::{TableRef, VolumeAccessMode};
use larch_contract::export_request::{ExportRequest, SlotMode as RequestSlotMode};

pub const CONTAINER: &str = "larch";
pub const DSN_DIR: &str = "/etc/larch/source";
pub const DSN_FILE: &str = "/etc/larch/source/dsn";
/// Where `spec.transform.keySecretRef` is mounted.
pub const TRANSFORM_KEY_DIR: &str = "/etc/larch/transform-key";
pub const TRANSFORM_KEY_FILE: &str = "/etc/larch/transform-key/key";
pub const TERMINATION_LOG: &str = "/dev/termination-log";
/// Where a continuous exporter spills buffered changes: an emptyDir of `continuous.spillSize`.
pub const SPILL_DIR: &str = "/var/lib/larch/spill";
const DEFAULT_SPILL_SIZE: &str = "8Gi";
pub(crate) const DEFAULT_TTL: i32 = 86_400;
pub(crate) const DEFAULT_BACKOFF: i32 = 2;

/// What a continuous export needs to hold its Leases: the Leases themselves (created by the
/// operator, so the exporter needs no `create`), a service account unless the spec names one,
/// and a Role granting `get` and `update` on those Lease names only.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseAccess {
    pub leases: Vec<Lease>,
    pub service_account: Option<ServiceAccount>,
    pub role: Role,
    pub role_binding: RoleBinding,
}

/// Identity of a OneShot run: a hash of the spec and the run-requested token. A new spec
/// generation or a new token is a new run; anything else (labels, status) is not.
pub fn run_id(export: &ArchiveExport, token: Option<&str>) -> String {
    let spec = serde_json::to_vec(&export.spec).expect("spec serialises");
    let mut data = spec;
    data.push(0);
    data.extend(token.unwrap_or("").as_bytes());
    short_hash(&data, 8)
}

/// Name of the child for `table`: `<name>` for a single table, `<name>-<table id>` for `tables`.
pub fn child_base_name(export: &ArchiveExport, table: &TableRef) -> String {
    if export.spec.source.tables.is_some() {
        format!("{}-{}", export.name_any(), table_id(&table.qualified()))
    } else {
        export.name_any()
    }
}

pub fn job_name(export: &ArchiveExport, table: &TableRef, run: &str) -> String {
    format!("{}-{run}", child_base_name(export, table))
}

/// Whether one Job (or CronJob) exports every table at one position: `parallel` set on a
/// OneShot export of `tables`. Unset, each table keeps a child of its own.
pub fn exports_as_one_set(export: &ArchiveExport) -> bool {
    let spec = &export.spec;
    spec.parallel.is_some() && spec.source.tables.is_some() && spec.mode == ExportMode::OneShot
}

/// The Jobs of run `run`: one per table, or one for the whole set; a split's workers Job
/// after its own.
pub fn run_job_names(export: &ArchiveExport, run: &str) -> Vec<String> {
    let mut names: Vec<String> = if exports_as_one_set(export) {
        vec![set_job_name(export, run)]
    } else {
        let tables = export.spec.source.all_tables();
        tables.iter().map(|t| job_name(export, t, run)).collect()
    };
    names.extend(crate::export::split::run_workers_job_name(export, run));
    names
}

/// Name of the child exporting a whole set ([`exports_as_one_set`]): `<name>`.
pub fn set_job_name(export: &ArchiveExport, run: &str) -> String {
    format!("{}-{run}", export.name_any())
}

/// The Lease a continuous export of `table` holds while writing: named after the export (and
/// the table, for `tables`), like its Deployment.
pub fn lease_name(export: &ArchiveExport, table: &TableRef) -> String {
    child_base_name(export, table)
}

/// The service account of the pods that hold a Lease ([`holds_lease`]): the spec's, else
/// `<name>-exporter`.
pub fn exporter_service_account(export: &ArchiveExport) -> String {
    export
        .spec
        .service_account_name
        .clone()
        .unwrap_or_else(|| format!("{}-exporter", export.name_any()))
}

/// Name of the PVC the operator creates for `destination.volume.size`.
pub fn archive_claim_name(export: &ArchiveExport) -> String {
    format!("{}-archive", export.name_any())
}

/// Labels selecting every pod of an export (and, with `table`, of one table).
pub fn selector_labels(
    export: &ArchiveExport,
    table: Option<&TableRef>,
) -> BTreeMap<String, String> {
    let mut l = labels(&[
        (LABEL_NAME, "larch"),
        (LABEL_COMPONENT, "export"),
        (LABEL_MANAGED_BY, MANAGED_BY),
        (LABEL_EXPORT, &export.name_any()),
    ]);
    if let Some(t) = table {
        l.insert(LABEL_TABLE.into(), table_id(&t.qualified()));
    }
    l
}

pub use crate::export::slot_names::{
    derived_slot_name, export_owner, export_slot_name, legacy_slot_name, set_slot_name,
    slot_and_publication,
};

/// What the export pod of one table runs.
pub fn export_request(export: &ArchiveExport, table: &TableRef) -> ExportRequest {
    request_for(export, Some(table))
}

/// What the export pod of every table at one position runs ([`exports_as_one_set`]).
pub fn set_export_request(export: &ArchiveExport) -> ExportRequest {
    request_for(export, None)
}

/// `larch export --request '<json>'`: the container's arguments for `request`.
pub fn export_args(request: &ExportRequest) -> Vec<String> {
    vec!["export".into(), "--request".into(), request.to_json()]
}

/// `table`: one table's export; None: the whole set's.
fn request_for(export: &ArchiveExport, table: Option<&TableRef>) -> ExportRequest {
    let spec = &export.spec;
    let src = &spec.source;
    let (schema, tables, parallel) = match table {
        Some(table) => (
            Some(table.schema().to_string()),
            vec![table.name.clone()],
            None,
        ),
        None => {
            let tables = src.all_tables().iter().map(|t| t.qualified()).collect();
            (None, tables, Some(spec.parallel.unwrap_or(1)))
        }
    };
    // A set's export puts each table under the prefix itself, by the same rule.
    let key_prefix = match (&spec.key_prefix, table.filter(|_| src.tables.is_some())) {
        (Some(kp), Some(table)) => Some(format!("{kp}{}/", table.qualified())),
        (Some(kp), None) => Some(kp.clone()),
        (None, _) => None,
    };
    // Slot (and, by default, publication) names belong to this export, never to the table:
    // two exports of one table must not share a slot or rewrite each other's publication.
    let slot = match table {
        Some(table) => slot_and_publication(export, table).0,
        None => set_slot_name(export),
    };
    let transform = spec.transform.as_ref();
    let request = ExportRequest {
        connection_file: Some(DSN_FILE.into()),
        schema,
        tables,
        parallel,
        store: pod::store_spec(&spec.destination),
        key_prefix,
        formats: spec.format.into_iter().collect(),
        key_fields: src.key_fields.clone().unwrap_or_default(),
        summary_file: Some(TERMINATION_LOG.into()),
        slot: Some(slot),
        publication: src.publication_name.clone(),
        owner: Some(export_owner(export)),
        transform: transform.map(|t| t.rules()),
        transform_key_file: transform
            .and_then(|t| t.key_secret_ref.as_ref())
            .map(|_| TRANSFORM_KEY_FILE.into()),
        leak_check: transform.is_some_and(|t| t.leak_check),
        // The closure is computed over the whole set at one position.
        subset: spec.subset.clone().filter(|_| table.is_none()),
        require_validated: transform.is_some_and(|t| t.require_validated),
        split: spec.split.map(|s| s.ranges).filter(|_| table.is_some()),
        split_workers: crate::export::split::split_workers(export).filter(|_| table.is_some()),
        // The baseline's progress (one-shot) or the exporter's state on /status and /metrics.
        listen: Some(pod::listen_arg()),
        ..Default::default()
    };
    let request = with_session_limits(export, with_retention(export, request));
    if spec.mode == ExportMode::Continuous {
        let table = table.expect("a continuous export is one table per process");
        continuous_request(export, table, request)
    } else if let (Some(table), Some(_)) = (table, crate::export::split::split_workers(export)) {
        // A split run's coordinator: one at a time commits (its workers hold no Lease).
        ExportRequest {
            lease: Some(lease_name(export, table)),
            ..request
        }
    } else {
        request
    }
}

/// Whether the export's pods hold a Lease while writing: a Continuous export's writers, and
/// the coordinator of a split run across pods.
pub fn holds_lease(export: &ArchiveExport) -> bool {
    export.spec.mode == ExportMode::Continuous
        || crate::export::split::split_workers(export).is_some()
}

/// Retention in every mode; continuous.keepEpochs is the deprecated spelling.
fn with_retention(export: &ArchiveExport, request: ExportRequest) -> ExportRequest {
    let spec = &export.spec;
    let retention = spec.retention.clone().unwrap_or_default();
    let keep = retention.keep_epochs.or_else(|| {
        spec.continuous
            .as_ref()
            .and_then(|c| c.keep_epochs)
            .filter(|_| spec.mode == ExportMode::Continuous)
    });
    ExportRequest {
        keep_epochs: keep.map_or(0, |k| u32::try_from(k).unwrap_or(0)),
        max_age: retention.max_age,
        ..request
    }
}

/// `spec.source.sessionLimits`; what is unset keeps `larch export`'s default.
fn with_session_limits(export: &ArchiveExport, request: ExportRequest) -> ExportRequest {
    let limits = export
        .spec
        .source
        .session_limits
        .clone()
        .unwrap_or_default();
    ExportRequest {
        statement_timeout: limits.statement_timeout,
        lock_timeout: limits.lock_timeout,
        idle_in_transaction_timeout: limits.idle_in_transaction_timeout,
        snapshot_max_age: limits.snapshot_max_age,
        ..request
    }
}

/// A continuous export's part of the request: `follow`, its policy, its spill and its Lease.
fn continuous_request(
    export: &ArchiveExport,
    table: &TableRef,
    request: ExportRequest,
) -> ExportRequest {
    let c = export.spec.continuous.clone().unwrap_or_default();
    let spill = spill_settings(export);
    let count = |v: Option<i64>| v.map(|v| u64::try_from(v).unwrap_or(0));
    ExportRequest {
        slot_mode: export.spec.source.slot_mode.map(|m| match m {
            SlotMode::Persistent => RequestSlotMode::Persistent,
            SlotMode::Temporary => RequestSlotMode::Temporary,
        }),
        follow: true,
        diff_interval: Some(c.diff_interval.unwrap_or_else(|| "30s".into())),
        min_interval: c.min_interval,
        max_interval: c.max_interval,
        max_diff_bytes: count(c.max_diff_bytes),
        max_diff_fraction: c.max_diff_fraction,
        max_churn_records: count(c.max_churn_records),
        max_churn_fraction: c.max_churn_fraction,
        buffer_memory: Some(spill.buffer_memory),
        spill_dir: Some(SPILL_DIR.into()),
        spill_limit: Some(spill.limit),
        lease: Some(lease_name(export, table)),
        ..request
    }
}

/// What every pod talking to the source database mounts: the connection Secret, `/tmp`, and the
/// CA bundle when there is one.
pub fn source_mounts(export: &ArchiveExport) -> (Vec<VolumeMount>, Vec<Volume>) {
    let src = &export.spec.source;
    let mut mounts = vec![
        pod::mount("source", DSN_DIR, true),
        pod::mount("tmp", "/tmp", false),
    ];
    let mut volumes = vec![
        pod::secret_file_volume(
            "source",
            &src.connection_secret_ref.name,
            &src.connection_secret_ref.key,
            "dsn",
        ),
        pod::empty_dir("tmp"),
    ];
    if let Some(ca) = &src.ca_bundle {
        let (v, m) = pod::ca_bundle("source-ca", pod::SOURCE_CA_DIR, ca);
        volumes.push(v);
        mounts.push(m);
    }
    if let Some(key) = export
        .spec
        .transform
        .as_ref()
        .and_then(|t| t.key_secret_ref.as_ref())
    {
        mounts.push(pod::mount("transform-key", TRANSFORM_KEY_DIR, true));
        volumes.push(pod::secret_file_volume(
            "transform-key",
            &key.name,
            &key.key,
            "key",
        ));
    }
    (mounts, volumes)
}

/// How a continuous exporter bounds its memory and its spill volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpillSettings {
    /// `--buffer-memory` in bytes.
    pub buffer_memory: u64,
    /// The spill emptyDir's `sizeLimit` (a quantity).
    pub size: String,
    /// `--spill-limit` in bytes: 90% of the volume, so larch stops with its own error before
    /// the kubelet evicts the pod.
    pub limit: u64,
}

/// `continuous.bufferMemory` and `spillSize`, or their defaults: a quarter of the container's
/// memory limit (16Mi to 1Gi; 64Mi without a limit) and 8Gi.
pub fn spill_settings(export: &ArchiveExport) -> SpillSettings {
    use larch_archive::spill::{DEFAULT_MEMORY_LIMIT, parse_size};
    let c = export.spec.continuous.clone().unwrap_or_default();
    let limit_memory = export
        .spec
        .resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get("memory"))
        .and_then(|m| parse_size(m).ok());
    let buffer_memory = c
        .buffer_memory
        .as_deref()
        .and_then(|m| parse_size(m).ok())
        .unwrap_or_else(|| match limit_memory {
            Some(l) => (l / 4).clamp(16 << 20, 1 << 30),
            None => DEFAULT_MEMORY_LIMIT,
        });
    let size = c
        .spill_size
        .unwrap_or_else(|| DEFAULT_SPILL_SIZE.to_string());
    let bytes = parse_size(&size).unwrap_or(8 << 30);
    SpillSettings {
        buffer_memory,
        size,
        limit: bytes / 10 * 9,
    }
}

/// The pod template of one table's export.
pub fn pod_template(
    export: &ArchiveExport,
    table: &TableRef,
    ctx: &BuildContext,
    run: Option<&str>,
) -> PodTemplateSpec {
    template_for(export, Some(table), ctx, run)
}

/// `table`: one table's export; None: the whole set's ([`exports_as_one_set`]).
fn template_for(
    export: &ArchiveExport,
    table: Option<&TableRef>,
    ctx: &BuildContext,
    run: Option<&str>,
) -> PodTemplateSpec {
    let spec = &export.spec;
    let access = pod::store_access(&spec.destination, &archive_claim_name(export), false);
    let (mut mounts, mut volumes) = source_mounts(export);
    mounts.extend(access.mounts);
    volumes.extend(access.volumes);
    let continuous = spec.mode == ExportMode::Continuous;
    if continuous {
        let mut spill = pod::empty_dir("spill");
        if let Some(e) = spill.empty_dir.as_mut() {
            e.size_limit = Some(Quantity(spill_settings(export).size));
        }
        volumes.push(spill);
        mounts.push(pod::mount("spill", SPILL_DIR, false));
    }
    // POD_IP first: the request's `listen: $(POD_IP):8080` refers to it. POD_NAME and
    // POD_NAMESPACE: the Lease's holder identity and namespace.
    let mut env = vec![pod::pod_ip_env()];
    if holds_lease(export) {
        env.push(pod::field_env("POD_NAME", "metadata.name"));
        env.push(pod::field_env("POD_NAMESPACE", "metadata.namespace"));
    }
    env.extend(access.env);
    let container = Container {
        name: CONTAINER.into(),
        image: Some(ctx.image.clone()),
        command: Some(vec!["larch".into()]),
        args: Some(export_args(&request_for(export, table))),
        env: Some(env),
        volume_mounts: Some(mounts),
        resources: pod::resources(spec.resources.as_ref()),
        security_context: Some(pod::container_security()),
        // The exporter writes its summary or its failure there; a crash leaves the log's end.
        termination_message_path: Some(TERMINATION_LOG.into()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    };
    let mut pod_spec = exporter_pod_spec(export, container, volumes, ctx);
    let mut annotations =
        pod::apply_overrides(&mut pod_spec, spec.pod.as_ref()).unwrap_or_default();
    let named = match table {
        Some(t) => t.qualified(),
        None => tables_list(export),
    };
    annotations.insert(ANNOTATION_TABLE.into(), named);
    let mut pod_labels = selector_labels(export, table);
    if let Some(run) = run {
        pod_labels.insert(LABEL_RUN.into(), run.into());
    }
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(pod_labels),
            annotations: Some(annotations),
            ..Default::default()
        }),
        spec: Some(pod_spec),
    }
}

/// The exporter's pod around its container: a Deployment's serves HTTP with probes and renews
/// its Lease through the API; a Job's serves `/status` and never restarts (a split run's
/// coordinator renews its Lease too).
fn exporter_pod_spec(
    export: &ArchiveExport,
    container: Container,
    volumes: Vec<Volume>,
    ctx: &BuildContext,
) -> PodSpec {
    let spec = &export.spec;
    if spec.mode == ExportMode::Continuous {
        let mut p = pod::base_pod_spec(
            pod::serving_http(container),
            volumes,
            Some(&exporter_service_account(export)),
            ctx.pod_user,
        );
        // The exporter renews its Lease through the API: it needs its token.
        p.automount_service_account_token = Some(true);
        return p;
    }
    // Serves /status and /metrics while it runs; no probes: a Job's pod is not a backend.
    let container = Container {
        ports: Some(vec![pod::http_port()]),
        ..container
    };
    let leased = holds_lease(export).then(|| exporter_service_account(export));
    let mut p = pod::base_pod_spec(
        container,
        volumes,
        leased.as_ref().or(spec.service_account_name.as_ref()),
        ctx.pod_user,
    );
    if leased.is_some() {
        p.automount_service_account_token = Some(true);
    }
    p.restart_policy = Some("Never".into());
    p
}

/// The set's tables, `schema.name` comma-separated (the pod's table annotation).
fn tables_list(export: &ArchiveExport) -> String {
    let names: Vec<String> = export
        .spec
        .source
        .all_tables()
        .iter()
        .map(|t| t.qualified())
        .collect();
    names.join(",")
}

/// The Job exporting `table` in run `run`.
pub fn job(export: &ArchiveExport, table: &TableRef, run: &str, ctx: &BuildContext) -> Job {
    job_for(export, Some(table), job_name(export, table, run), run, ctx)
}

/// The one Job exporting every table at one position in run `run` ([`exports_as_one_set`]).
pub fn set_job(export: &ArchiveExport, run: &str, ctx: &BuildContext) -> Job {
    job_for(export, None, set_job_name(export, run), run, ctx)
}

fn job_for(
    export: &ArchiveExport,
    table: Option<&TableRef>,
    name: String,
    run: &str,
    ctx: &BuildContext,
) -> Job {
    let mut l = selector_labels(export, table);
    l.insert(LABEL_RUN.into(), run.into());
    Job {
        metadata: child_meta(export, name, l),
        spec: Some(job_spec(export, table, ctx, Some(run))),
        ..Default::default()
    }
}

/// The Job `podReplacementPolicy` that starts a pod again only once the one it replaces has
/// terminated (the default under a `podFailurePolicy`, named so no default can change it).
pub(crate) const ONE_POD_AT_A_TIME: &str = "Failed";

fn job_spec(
    export: &ArchiveExport,
    table: Option<&TableRef>,
    ctx: &BuildContext,
    run: Option<&str>,
) -> JobSpec {
    JobSpec {
        backoff_limit: Some(export.spec.backoff_limit.unwrap_or(DEFAULT_BACKOFF)),
        pod_failure_policy: Some(pod::fail_fast(CONTAINER)),
        // One writer at a time: a retry's pod starts only once the last one has stopped (a
        // terminating exporter, or split coordinator, may still be writing).
        pod_replacement_policy: Some(ONE_POD_AT_A_TIME.into()),
        ttl_seconds_after_finished: Some(
            export
                .spec
                .ttl_seconds_after_finished
                .unwrap_or(DEFAULT_TTL),
        ),
        template: template_for(export, table, ctx, run),
        ..Default::default()
    }
}

/// The CronJob running `table`'s export on the schedule; None: the whole set's
/// ([`exports_as_one_set`]), named `<name>`.
pub fn cron_job(
    export: &ArchiveExport,
    table: Option<&TableRef>,
    ctx: &BuildContext,
) -> Option<CronJob> {
    let sched = export.spec.schedule.as_ref()?;
    let l = selector_labels(export, table);
    let name = match table {
        Some(t) => child_base_name(export, t),
        None => export.name_any(),
    };
    Some(CronJob {
        metadata: child_meta(export, name, l.clone()),
        spec: CronJobSpec {
            schedule: sched.cron.clone(),
            time_zone: sched.time_zone.clone(),
            suspend: Some(sched.suspend == Some(true) || export.spec.suspend == Some(true)),
            concurrency_policy: Some(
                match sched
                    .concurrency_policy
                    .unwrap_or(ConcurrencyPolicy::Forbid)
                {
                    ConcurrencyPolicy::Forbid => "Forbid",
                    ConcurrencyPolicy::Replace => "Replace",
                }
                .into(),
            ),
            successful_jobs_history_limit: Some(sched.successful_jobs_history_limit.unwrap_or(3)),
            failed_jobs_history_limit: Some(sched.failed_jobs_history_limit.unwrap_or(3)),
            job_template: JobTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(l),
                    ..Default::default()
                }),
                spec: Some(job_spec(export, table, ctx, None)),
            },
            ..Default::default()
        },
        ..Default::default()
    })
}

/// The Deployment running `table`'s continuous export (1 replica, Recreate: never two writers).
pub fn deployment(export: &ArchiveExport, table: &TableRef, ctx: &BuildContext) -> Deployment {
    let l = selector_labels(export, Some(table));
    Deployment {
        metadata: child_meta(export, child_base_name(export, table), l.clone()),
        spec: DeploymentSpec {
            replicas: Some(if export.spec.suspend == Some(true) {
                0
            } else {
                1
            }),
            selector: LabelSelector {
                match_labels: Some(l),
                ..Default::default()
            },
            strategy: Some(DeploymentStrategy {
                type_: Some("Recreate".into()),
                ..Default::default()
            }),
            template: pod_template(export, table, ctx, None),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The Leases, service account and Role of an export whose pods hold a Lease (see
/// [`LeaseAccess`]).
pub fn lease_access(export: &ArchiveExport) -> LeaseAccess {
    let l = selector_labels(export, None);
    let names: Vec<String> = export
        .spec
        .source
        .all_tables()
        .iter()
        .map(|t| lease_name(export, t))
        .collect();
    let leases = export
        .spec
        .source
        .all_tables()
        .iter()
        .map(|t| Lease {
            metadata: child_meta(
                export,
                lease_name(export, t),
                selector_labels(export, Some(t)),
            ),
            spec: None,
        })
        .collect();
    let sa = exporter_service_account(export);
    let service_account = export
        .spec
        .service_account_name
        .is_none()
        .then(|| ServiceAccount {
            metadata: child_meta(export, sa.clone(), l.clone()),
            automount_service_account_token: Some(false),
            ..Default::default()
        });
    let role_name = format!("{}-export-lease", export.name_any());
    let role = Role {
        metadata: child_meta(export, role_name.clone(), l.clone()),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["coordination.k8s.io".into()]),
            resources: Some(vec!["leases".into()]),
            resource_names: Some(names),
            verbs: vec!["get".into(), "update".into()],
            ..Default::default()
        }]),
    };
    let role_binding = RoleBinding {
        metadata: child_meta(export, role_name.clone(), l),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: role_name,
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: sa,
            namespace: export.metadata.namespace.clone(),
            ..Default::default()
        }]),
    };
    LeaseAccess {
        leases,
        service_account,
        role,
        role_binding,
    }
}

/// The archive claim, when the destination asks the operator to create one.
pub fn archive_pvc(export: &ArchiveExport) -> Option<PersistentVolumeClaim> {
    let vol = export.spec.destination.volume.as_ref()?;
    let size = vol.size.as_ref()?;
    let mode = match vol.access_mode.unwrap_or(VolumeAccessMode::ReadWriteOnce) {
        VolumeAccessMode::ReadWriteOnce => "ReadWriteOnce",
        VolumeAccessMode::ReadWriteMany => "ReadWriteMany",
    };
    Some(PersistentVolumeClaim {
        metadata: child_meta(
            export,
            archive_claim_name(export),
            selector_labels(export, None),
        ),
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec![mode.into()]),
            storage_class_name: vol.storage_class_name.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".into(), Quantity(size.clone()))])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    })
}
