//! What a Continuous export's writers show: their Deployments' readiness, each pod's
//! `/status` (the writers', the slot monitor's, their progress), the newest snapshot.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;

use crate::crd::archive_export::{ExportSummary, WriterStatus};
use crate::export::conditions::WriterCounts;
use crate::export::observe::{self, SlotReport};
use crate::reconcile::context::Context;
use crate::reconcile::progress;
use larch_core::progress::ProgressReport;

/// Ready writers (one per Deployment at most) of `desired`, and whether one's rollout is stuck.
pub fn writer_counts(deployments: &[Deployment], desired: i32) -> WriterCounts {
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

/// What the pods' `/status` said.
pub struct Probed {
    /// The writers' (by table, at most 32).
    pub writers: Vec<WriterStatus>,
    /// The slot monitor's (a suspended export).
    pub monitor: Option<SlotReport>,
    /// The writers' progress.
    pub reports: Vec<ProgressReport>,
    /// The columns the writers' transform rules do not name ([`observe::parse_unreviewed`]).
    pub unreviewed: Vec<String>,
    /// The writers' constraint preflights ([`observe::parse_preflight`]), one per writer
    /// that reports one.
    pub preflights: Vec<larch_contract::preflight::PreflightSummary>,
}

/// Each pod's `/status`.
pub async fn probe_writers(ctx: &Context, pods: &[Pod]) -> Probed {
    let mut writers: Vec<WriterStatus> = vec![];
    let mut monitor = None;
    let mut reports = vec![];
    let mut unreviewed = vec![];
    let mut preflights = vec![];
    for pod in pods.iter().take(progress::MAX_PROBED_PODS) {
        let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.clone()) else {
            continue;
        };
        let Ok(body) = ctx.prober.get(&ip, 8080, "/status").await else {
            continue;
        };
        if let Some(w) = observe::parse_writer_status(&body) {
            reports.extend(observe::parse_export_progress(&body));
            unreviewed.extend(observe::parse_unreviewed(&body).unwrap_or_default());
            preflights.extend(observe::parse_preflight(&body));
            writers.push(w);
        } else if let Some(m) = observe::parse_slot_monitor(&body) {
            monitor = Some(m);
        }
    }
    writers.sort_by(|a, b| a.table.cmp(&b.table));
    writers.truncate(32);
    unreviewed.sort();
    unreviewed.dedup();
    Probed {
        writers,
        monitor,
        reports,
        unreviewed,
        preflights,
    }
}

/// The newest snapshot of any writer, for the printer columns.
pub fn newest_snapshot(writers: &[WriterStatus]) -> Option<ExportSummary> {
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
