//! What the controllers read off a Job.

use k8s_openapi::api::batch::v1::Job;

/// State of one Job of a run (a OneShot export's or a restore's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobPhase {
    Active,
    Succeeded,
    Failed,
    /// Not found (removed by its TTL or by hand) before the run was recorded as finished.
    Missing,
}

/// A Job's phase from its conditions: succeeded, failed, or still active.
pub fn job_phase(job: &Job) -> JobPhase {
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
