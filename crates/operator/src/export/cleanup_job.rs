//! What an ArchiveExport runs against its source database besides the export itself: the
//! cleanup Job of a deletion (`larch export cleanup`) and, while a Continuous export is
//! suspended, the slot monitor (`larch export slot-status`) that keeps reporting the WAL its
//! kept slot holds.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy};
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{Container, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::ResourceExt;

use crate::builders::pod;
use crate::builders::{
    BuildContext, LABEL_COMPONENT, LABEL_EXPORT, LABEL_MANAGED_BY, LABEL_NAME, MANAGED_BY,
    child_meta, labels,
};
use crate::crd::archive_export::{
    ADOPT_LEGACY_SLOT_ANNOTATION, ArchiveExport, DeletionPolicy, ExportMode, SlotMode,
};
use crate::crd::common::TableRef;
use crate::export::build::{DSN_FILE, TERMINATION_LOG, source_mounts};
use crate::export::slot_names::{export_owner, slot_and_publication};

pub const CLEANUP_CONTAINER: &str = "cleanup";
pub const MONITOR_CONTAINER: &str = "slot-monitor";
/// How long the cleanup waits for a slot still in use (the writer finishing its last diff).
const CLEANUP_WAIT: &str = "60s";

/// `Delete` unless the spec says `Retain`.
pub fn deletion_policy(export: &ArchiveExport) -> DeletionPolicy {
    export
        .spec
        .source
        .deletion_policy
        .unwrap_or(DeletionPolicy::Delete)
}

pub fn cleanup_job_name(export: &ArchiveExport) -> String {
    format!("{}-cleanup", export.name_any())
}

pub fn slot_monitor_name(export: &ArchiveExport) -> String {
    format!("{}-slot-monitor", export.name_any())
}

fn component_labels(export: &ArchiveExport, component: &str) -> BTreeMap<String, String> {
    labels(&[
        (LABEL_NAME, "larch"),
        (LABEL_COMPONENT, component),
        (LABEL_MANAGED_BY, MANAGED_BY),
        (LABEL_EXPORT, &export.name_any()),
    ])
}

/// `larch export cleanup` arguments: every table's slot (and its publication).
pub fn cleanup_args(export: &ArchiveExport) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "export".into(),
        "cleanup".into(),
        "--connection-file".into(),
        DSN_FILE.into(),
    ];
    let tables = export.spec.source.all_tables();
    if crate::export::build::exports_as_one_set(export) {
        // One slot for the whole set (temporary: this waits for a run still holding it).
        a.extend(["--slot".into(), crate::export::build::set_slot_name(export)]);
    } else {
        for t in &tables {
            a.extend(["--slot".into(), slot_and_publication(export, t).0]);
        }
    }
    // An explicit publication exists for a single table only (CEL); with several tables each
    // publication is named like its slot, the cleanup's default.
    if let (Some(p), 1) = (&export.spec.source.publication_name, tables.len()) {
        a.extend(["--publication".into(), p.clone()]);
    }
    a.extend(["--owner".into(), export_owner(export)]);
    a.extend(session_limit_args(export));
    if export
        .annotations()
        .get(ADOPT_LEGACY_SLOT_ANNOTATION)
        .is_some_and(|v| v == "true")
    {
        a.push("--adopt-legacy".into());
    }
    a.extend([
        "--wait".into(),
        CLEANUP_WAIT.into(),
        "--summary-file".into(),
        TERMINATION_LOG.into(),
    ]);
    a
}

/// `spec.source.sessionLimits` for the cleanup and the slot monitor: their sessions on the
/// source hold no snapshot, so only the three session timeouts apply. Unset ones keep
/// `larch export`'s defaults.
fn session_limit_args(export: &ArchiveExport) -> Vec<String> {
    let Some(limits) = &export.spec.source.session_limits else {
        return vec![];
    };
    [
        ("--statement-timeout", &limits.statement_timeout),
        ("--lock-timeout", &limits.lock_timeout),
        (
            "--idle-in-transaction-timeout",
            &limits.idle_in_transaction_timeout,
        ),
    ]
    .into_iter()
    .filter_map(|(flag, value)| value.as_ref().map(|v| [flag.to_string(), v.clone()]))
    .flatten()
    .collect()
}

/// A pod that talks to the source database only: the export's connection Secret, CA bundle,
/// service account (for workload identity) and placement, no store, no API token.
fn source_pod(
    export: &ArchiveExport,
    container: &str,
    args: Vec<String>,
    ctx: &BuildContext,
    labels: BTreeMap<String, String>,
    http: bool,
) -> PodTemplateSpec {
    let spec = &export.spec;
    let (mounts, volumes) = source_mounts(export);
    let c = Container {
        name: container.into(),
        image: Some(ctx.image.clone()),
        command: Some(vec!["larch".into()]),
        args: Some(args),
        env: http.then(|| vec![pod::pod_ip_env()]),
        volume_mounts: Some(mounts),
        security_context: Some(pod::container_security()),
        termination_message_path: Some(TERMINATION_LOG.into()),
        termination_message_policy: Some("File".into()),
        ..Default::default()
    };
    let c = if http { pod::serving_http(c) } else { c };
    let mut pod_spec =
        pod::base_pod_spec(c, volumes, spec.service_account_name.as_ref(), ctx.pod_user);
    if !http {
        pod_spec.restart_policy = Some("Never".into());
    }
    let annotations =
        pod::apply_overrides(&mut pod_spec, spec.pod.as_ref()).filter(|a| !a.is_empty());
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels),
            annotations,
            ..Default::default()
        }),
        spec: Some(pod_spec),
    }
}

/// The cleanup Job of a deletion. It has no owner reference on purpose: a foreground deletion
/// (`kubectl delete --cascade=foreground`) deletes owned objects while the finalizer still
/// holds the owner, which would kill the cleanup it waits for. The operator deletes it itself
/// before it removes the finalizer (and the TTL removes a forgotten one). One attempt per Job
/// (`backoffLimit: 0`): the operator reads each failure, reports it and starts the next
/// attempt after a backoff.
pub fn cleanup_job(export: &ArchiveExport, ctx: &BuildContext) -> Job {
    let l = component_labels(export, "cleanup");
    let template = source_pod(
        export,
        CLEANUP_CONTAINER,
        cleanup_args(export),
        ctx,
        l.clone(),
        false,
    );
    Job {
        metadata: ObjectMeta {
            name: Some(cleanup_job_name(export)),
            namespace: export.metadata.namespace.clone(),
            labels: Some(l.clone()),
            ..Default::default()
        },
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            active_deadline_seconds: Some(300),
            ttl_seconds_after_finished: Some(3600),
            template,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The slots a suspended Continuous export keeps (persistent ones), by table.
pub fn kept_slots(export: &ArchiveExport) -> Vec<(TableRef, String)> {
    let continuous = export.spec.mode == ExportMode::Continuous;
    let persistent =
        export.spec.source.slot_mode.unwrap_or(SlotMode::Persistent) == SlotMode::Persistent;
    if !(continuous && persistent) {
        return vec![];
    }
    export
        .spec
        .source
        .all_tables()
        .into_iter()
        .map(|t| {
            let slot = slot_and_publication(export, &t).0;
            (t, slot)
        })
        .collect()
}

/// While a Continuous export with persistent slots is suspended: a Deployment running
/// `larch export slot-status`, so status (and the retained-WAL alert) keeps seeing the WAL the
/// kept slots hold. It reads `pg_replication_slots` every 10 s and writes nothing.
pub fn slot_monitor(export: &ArchiveExport, ctx: &BuildContext) -> Option<Deployment> {
    if export.spec.suspend != Some(true) {
        return None;
    }
    let slots = kept_slots(export);
    if slots.is_empty() {
        return None;
    }
    let mut args: Vec<String> = vec![
        "export".into(),
        "slot-status".into(),
        "--connection-file".into(),
        DSN_FILE.into(),
    ];
    for (_, s) in &slots {
        args.extend(["--slot".into(), s.clone()]);
    }
    args.extend(session_limit_args(export));
    args.extend([
        "--listen".into(),
        pod::listen_arg(),
        "--interval".into(),
        "10s".into(),
    ]);
    let l = component_labels(export, "slot-monitor");
    let template = source_pod(export, MONITOR_CONTAINER, args, ctx, l.clone(), true);
    Some(Deployment {
        metadata: child_meta(export, slot_monitor_name(export), l.clone()),
        spec: DeploymentSpec {
            replicas: Some(1),
            selector: LabelSelector {
                match_labels: Some(l.clone()),
                ..Default::default()
            },
            strategy: Some(DeploymentStrategy {
                type_: Some("Recreate".into()),
                ..Default::default()
            }),
            template,
            ..Default::default()
        },
        ..Default::default()
    })
}

/// `table` of the slot, for status: the writer table whose slot this is.
pub fn table_of_slot(export: &ArchiveExport, slot: &str) -> Option<String> {
    kept_slots(export)
        .into_iter()
        .find(|(_, s)| s == slot)
        .map(|(t, _)| t.qualified())
}
