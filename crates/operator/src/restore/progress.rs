//! ArchiveRestore `status.progress`: while the run's Job is active, its pod's `/status` (the
//! whole restore's rows against its tables' snapshots' row counts, as an export pod reports a
//! baseline); once the Job ended, `Complete` (the summary's rows) or `Failed`.

use k8s_openapi::api::core::v1::Pod;

use crate::crd::progress::OperationProgress;
use crate::reconcile::context::Context;
use crate::reconcile::job::JobPhase;
pub use crate::reconcile::progress::REQUEUE_WHILE_RUNNING;
use crate::reconcile::progress::{self, Runner};
use crate::restore::build;
use crate::restore::reconcile::summary_of;
use larch_core::progress::ProgressReport;

/// The `progress` of a restore pod's `/status`; `None` before it planned its tables (or when
/// the body is no restore's).
pub fn parse_restore_progress(body: &str) -> Option<ProgressReport> {
    crate::export::observe::parse_export_progress(body)
}

/// `status.progress` of a run in `phase`, from `old` (the last written), the running pod's
/// `/status` (probed while the Job is active) and, once it succeeded, its pods' summary; its
/// time stamped with `now` when the figures moved.
pub async fn of_run(
    ctx: &Context,
    pods: &[Pod],
    phase: &JobPhase,
    old: Option<&OperationProgress>,
    now: jiff::Timestamp,
) -> Option<OperationProgress> {
    let new = match phase {
        JobPhase::Active => match probe(ctx, pods).await {
            Some(r) => Some(progress::to_status(&r, Runner::Restore, 1)),
            // Not serving yet (or between attempts): nothing new to say.
            None => old.cloned(),
        },
        JobPhase::Succeeded => {
            let summary = pods.iter().find_map(summary_of);
            let rows = summary.map(|s| s.tables.iter().map(|t| t.rows as i64).sum::<i64>());
            progress::ended(old, true, rows).or_else(|| rows.map(complete))
        }
        JobPhase::Failed | JobPhase::Missing => progress::ended(old, false, None),
    };
    progress::stamp(old, new, now)
}

/// A run that ended before its progress was ever read: `Complete` with the summary's rows.
fn complete(rows: i64) -> OperationProgress {
    OperationProgress {
        phase: progress::COMPLETE.into(),
        rows,
        eta_seconds: Some(0),
        percent: Some("100%".into()),
        pods: 1,
        ..Default::default()
    }
}

/// The `/status` progress of the run's running pod (at most one: a Job of one pod).
async fn probe(ctx: &Context, pods: &[Pod]) -> Option<ProgressReport> {
    for pod in pods.iter().filter(|p| is_running(p)) {
        if let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.as_deref())
            && let Ok(body) = ctx.prober.get(ip, 8080, "/status").await
            && let Some(r) = parse_restore_progress(&body)
        {
            return Some(r);
        }
    }
    None
}

fn is_running(pod: &Pod) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restore_pods_status_reads_as_restoring() {
        let body = r#"{"state":"RESTORING","progress":{"operation":"restore","subject":"2 tables","rows":120,"bytes":9000,"total_rows":200,"percent":60.0,"rows_per_second":40.0,"bytes_per_second":3000.0,"eta_seconds":2.0,"elapsed_seconds":3.0,"started_at":"2027-01-15T08:00:00Z","done":false},"tables":[]}"#;
        let r = parse_restore_progress(body).unwrap();
        let p = progress::to_status(&r, Runner::Restore, 1);
        assert_eq!(p.phase, progress::RESTORING);
        assert_eq!((p.rows, p.expected_rows), (120, Some(200)));
        assert_eq!(p.percent.as_deref(), Some("60%"));
        assert_eq!((p.rows_per_second, p.eta_seconds), (Some(40), Some(2)));
        let planning = r#"{"state":"PLANNING","progress":null,"tables":[]}"#;
        assert!(parse_restore_progress(planning).is_none());
        assert_eq!(complete(42).percent.as_deref(), Some("100%"));
    }
}
