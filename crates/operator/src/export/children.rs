//! Every child of an ArchiveExport for one reconcile: the export's own (builders/export.rs) and
//! the slot monitor of a suspended continuous export (builders/cleanup.rs).

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use crate::builders::BuildContext;
use crate::crd::archive_export::{ArchiveExport, ExportMode};
use crate::export::build::{
    LeaseAccess, archive_pvc, cron_job, deployment, exports_as_one_set, job, lease_access, set_job,
};

/// Every child an ArchiveExport wants, for one reconcile.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ExportChildren {
    pub pvc: Option<PersistentVolumeClaim>,
    pub jobs: Vec<Job>,
    pub cron_jobs: Vec<CronJob>,
    pub deployments: Vec<Deployment>,
    /// A suspended Continuous export: the monitor reporting its kept slots' WAL.
    pub slot_monitor: Option<Deployment>,
    /// Continuous only: the single-writer Leases (one per table, W9) and the rights of the
    /// exporter's service account on exactly those Leases.
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
            if let Some(run) = run {
                out.jobs = tables.iter().map(|t| job(export, t, run, ctx)).collect();
            }
        }
    }
    out
}
