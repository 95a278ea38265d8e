//! Every child of an ArchiveExport for one reconcile: the export's own (builders/export.rs) and
//! the slot monitor of a suspended continuous export (builders/cleanup.rs), and their apply and
//! prune (the reconcile's apply step).

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::ResourceExt;

use crate::builders::BuildContext;
use crate::crd::archive_export::{ArchiveExport, ExportMode};
use crate::export::build::{
    LeaseAccess, archive_pvc, cron_job, deployment, exports_as_one_set, job, lease_access, set_job,
};
use crate::export::lease_rights;
use crate::reconcile::apply::ChildSet;
use crate::reconcile::context::{Context, Error};

/// Every child an ArchiveExport wants, for one reconcile.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ExportChildren {
    pub pvc: Option<PersistentVolumeClaim>,
    pub jobs: Vec<Job>,
    pub cron_jobs: Vec<CronJob>,
    pub deployments: Vec<Deployment>,
    /// A suspended Continuous export: the monitor reporting its kept slots' WAL.
    pub slot_monitor: Option<Deployment>,
    /// Continuous, or a split run across pods: the single-writer Leases (one per table, W9) and
    /// the rights of the exporter's service account on exactly those Leases.
    pub lease_access: Option<LeaseAccess>,
}

/// Every desired child. `run` is the OneShot run to (re)apply Jobs for, if one is due or in
/// flight; the controller decides that from status (a finished run is never re-created).
pub fn children(export: &ArchiveExport, run: Option<&str>, ctx: &BuildContext) -> ExportChildren {
    let tables = export.spec.source.all_tables();
    let mut out = ExportChildren {
        pvc: archive_pvc(export),
        ..Default::default()
    };
    match export.spec.mode {
        ExportMode::Continuous => {
            out.deployments = tables.iter().map(|t| deployment(export, t, ctx)).collect();
            out.slot_monitor = crate::export::cleanup_job::slot_monitor(export, ctx);
            out.lease_access = Some(lease_access(export));
        }
        ExportMode::OneShot if exports_as_one_set(export) => {
            out.cron_jobs = cron_job(export, None, ctx).into_iter().collect();
            out.jobs = run
                .map(|run| set_job(export, run, ctx))
                .into_iter()
                .collect();
        }
        ExportMode::OneShot => {
            if export.spec.schedule.is_some() {
                out.cron_jobs = tables
                    .iter()
                    .filter_map(|t| cron_job(export, Some(t), ctx))
                    .collect();
            }
            if crate::export::split::split_workers(export).is_some() {
                out.lease_access = Some(lease_access(export));
            }
            if let Some(run) = run {
                out.jobs = tables.iter().map(|t| job(export, t, run, ctx)).collect();
                // A split across pods: its workers after the coordinator.
                out.jobs
                    .extend(crate::export::split::workers_job(export, run, ctx));
            }
        }
    }
    out
}

/// Applies the export's children; returns its writer Deployments as they now are. The Leases
/// and the exporter's rights on them go first: a new pod finds them.
pub async fn apply_children(
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
pub async fn prune_children(
    set: &mut ChildSet<'_>,
    children: &ExportChildren,
    (ctx, export): (&Context, &ArchiveExport),
) -> Result<(), Error> {
    let ns = &export.namespace().ok_or(Error::NoNamespace)?;
    set.prune::<CronJob>(ns).await?;
    let deployments_pruned = set.prune::<Deployment>(ns).await?;
    // After the Deployments, so no exporter outlives its Lease rights. Only where some can be
    // stale: an export holding Leases (its tables changed), one that just left Continuous
    // mode, or one whose runs were split across pods.
    let was_split = export.status.as_ref().is_some_and(|s| s.split.is_some());
    if children.lease_access.is_some() || deployments_pruned > 0 || was_split {
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
