//! Condition computation from observed state (pure). kstatus-compatible: every type is set on the
//! first visit (Unknown when nothing is known), `Ready` summarises, `Reconciling` and `Stalled` are
//! the abnormal-true pair, and `lastTransitionTime` only moves when a status flips. What every kind
//! shares is here; each kind's own conditions are in its folder (`crate::export::conditions`, ...).

use jiff::Timestamp;

use crate::crd::common::Condition;
pub use crate::time::time_string;

pub const READY: &str = "Ready";
pub const RECONCILING: &str = "Reconciling";
pub const STALLED: &str = "Stalled";
pub const LAST_EXPORT_SUCCEEDED: &str = "LastExportSucceeded";
pub const CAUGHT_UP: &str = "CaughtUp";
pub const REBASELINING: &str = "Rebaselining";
pub const DEGRADED: &str = "Degraded";

pub use crate::crd::common::ConditionStatus as Status;

/// A desired condition, before times and generations are filled in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cond {
    pub type_: &'static str,
    pub status: Status,
    pub reason: String,
    pub message: String,
}

pub(crate) fn c(
    type_: &'static str,
    status: Status,
    reason: impl Into<String>,
    message: impl Into<String>,
) -> Cond {
    Cond {
        type_,
        status,
        reason: reason.into(),
        message: message.into(),
    }
}

/// Something that keeps a custom resource from working, with its reason: what the spec names
/// is missing, the spec cannot work, the API server refused a child, or a pod fails.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub reason: String,
    pub message: String,
    /// Clears by itself (the database restarts): `Degraded` and still `Reconciling`, never
    /// `Stalled`.
    pub transient: bool,
}

impl Problem {
    pub fn new(reason: impl Into<String>, message: impl Into<String>) -> Problem {
        Problem {
            reason: reason.into(),
            message: message.into(),
            transient: false,
        }
    }

    /// A failing pod: `what` names its role (`writer`, `engine`, `export`).
    pub fn of_pod(what: &str, f: &crate::reconcile::pod_failure::PodFailure) -> Problem {
        Problem {
            reason: f.reason.clone(),
            message: f.describe(what),
            transient: f.transient,
        }
    }
}

/// `Ready`, `Reconciling`, `Stalled` (and `Degraded`) of a custom resource that cannot be
/// built: nothing is applied until someone acts.
pub(crate) fn blocked(p: &Problem) -> Vec<Cond> {
    use Status::*;
    vec![
        c(READY, False, &p.reason, p.message.clone()),
        c(RECONCILING, False, &p.reason, ""),
        c(STALLED, True, &p.reason, p.message.clone()),
        c(DEGRADED, False, &p.reason, ""),
    ]
}

/// The summary conditions of a failing pod: a transient failure is still being worked on
/// (`Reconciling`, kstatus InProgress), any other is `Stalled` (kstatus Failed); both are
/// `Degraded` with the pod's reason.
pub(crate) fn failing(p: &Problem) -> [Cond; 4] {
    use Status::*;
    let (reconciling, stalled) = if p.transient {
        (
            c(RECONCILING, True, &p.reason, p.message.clone()),
            c(STALLED, False, &p.reason, ""),
        )
    } else {
        (
            c(RECONCILING, False, &p.reason, ""),
            c(STALLED, True, &p.reason, p.message.clone()),
        )
    };
    [
        c(READY, False, &p.reason, p.message.clone()),
        reconciling,
        stalled,
        c(DEGRADED, True, &p.reason, p.message.clone()),
    ]
}

pub(crate) fn not_degraded() -> Cond {
    c(DEGRADED, Status::False, "AsExpected", "")
}

/// Merges `desired` into `previous`: for each of `types`, the desired condition if given, else
/// the previous one, else `Unknown`/`Pending`. `lastTransitionTime` is kept while the status is
/// unchanged. Output order follows `types`.
pub fn merge(
    previous: &[Condition],
    desired: &[Cond],
    types: &[&'static str],
    now: Timestamp,
    generation: Option<i64>,
) -> Vec<Condition> {
    types
        .iter()
        .map(|t| {
            let prev = previous.iter().find(|p| p.type_ == *t);
            let want = desired.iter().find(|d| d.type_ == *t).cloned().or_else(|| {
                prev.is_none()
                    .then(|| c(t, Status::Unknown, "Pending", "not observed yet"))
            });
            match (want, prev) {
                (Some(w), prev) => Condition {
                    type_: w.type_.into(),
                    status: w.status,
                    reason: w.reason,
                    message: w.message,
                    last_transition_time: match prev {
                        Some(p) if p.status == w.status => p.last_transition_time.clone(),
                        _ => time_string(now),
                    },
                    observed_generation: generation,
                },
                (None, Some(p)) => Condition {
                    observed_generation: generation,
                    ..p.clone()
                },
                (None, None) => unreachable!("a missing condition is always wanted"),
            }
        })
        .collect()
}

/// Conditions whose status changed between `before` and `after` (for Events).
pub fn transitions<'a>(before: &[Condition], after: &'a [Condition]) -> Vec<&'a Condition> {
    after
        .iter()
        .filter(|a| {
            before
                .iter()
                .find(|b| b.type_ == a.type_)
                .is_none_or(|b| b.status != a.status)
        })
        .collect()
}

pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == Status::True)
}
