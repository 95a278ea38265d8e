//! ArchiveRestore conditions from what its reconcile observed (pure).

use crate::reconcile::conditions::*;

pub const RESTORE_TYPES: [&str; 3] = [READY, RECONCILING, STALLED];

/// Condition reason of a restore whose database cannot be reached yet (it waits and retries).
pub const DATABASE_UNAVAILABLE: &str = "DatabaseUnavailable";

/// What an ArchiveRestore reconcile saw.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RestoreObservation {
    /// What the spec names is missing, or the spec cannot work: no Job is created.
    pub blocked: Option<Problem>,
    /// The current run's id and outcome (`None` while it runs).
    pub run: Option<(String, Option<bool>)>,
    /// Why the run's pod failed (its termination message, classified).
    pub pod_failure: Option<Problem>,
    /// The summary line of a run that succeeded.
    pub restored: Option<String>,
}

/// Pod failure reasons that say the target database is not there yet (not reachable, not
/// created, its role not provisioned): the restore waits and tries again, never fails for them.
pub const DATABASE_NOT_READY: [&str; 3] = [
    "ConnectionFailed",
    "DatabaseNotFound",
    "AuthenticationFailed",
];

impl RestoreObservation {
    /// The pod failure, when it says the database is not ready.
    pub fn database_unavailable(&self) -> Option<&Problem> {
        self.pod_failure
            .as_ref()
            .filter(|p| DATABASE_NOT_READY.contains(&p.reason.as_str()))
    }
}

/// `text` with the password of any connection URL (`postgresql://user:secret@host`) and any
/// `password=…` keyword masked: an error may quote the DSN it was given.
pub fn without_credentials(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (i, word) in text.split(' ').enumerate() {
        if i > 0 {
            out.push(' ');
        }
        if let Some(rest) = word.to_ascii_lowercase().find("password=").map(|p| p + 9) {
            out.push_str(&word[..rest]);
            out.push_str("***");
        } else if let (Some(scheme), Some(at)) = (word.find("://"), word.rfind('@'))
            && at > scheme + 3
        {
            let userinfo = &word[scheme + 3..at];
            match userinfo.find(':') {
                Some(colon) => {
                    out.push_str(&word[..scheme + 3 + colon + 1]);
                    out.push_str("***");
                    out.push_str(&word[at..]);
                }
                _ => out.push_str(word),
            }
        } else {
            out.push_str(word);
        }
    }
    out
}

/// kstatus conditions of an ArchiveRestore: `Reconciling` while its Job runs, `Ready` once a
/// run restored, `Stalled` when it cannot start or its run failed (a new spec or a new
/// `larch.dev/run-requested` token runs it again).
pub fn restore_conditions(o: &RestoreObservation) -> Vec<Cond> {
    use Status::*;
    if let Some(p) = &o.blocked {
        return blocked(p);
    }
    match &o.run {
        None => vec![
            c(READY, False, "Pending", "no run yet"),
            c(RECONCILING, True, "Pending", "no run yet"),
            c(STALLED, False, "Pending", ""),
        ],
        Some((id, None)) if o.database_unavailable().is_some() => {
            let p = o.database_unavailable().expect("checked");
            let message = format!(
                "run {id}: waiting for the database ({}), retrying with backoff: {}",
                p.reason,
                without_credentials(&p.message)
            );
            vec![
                c(READY, False, DATABASE_UNAVAILABLE, message.clone()),
                c(RECONCILING, True, DATABASE_UNAVAILABLE, message),
                c(STALLED, False, DATABASE_UNAVAILABLE, ""),
            ]
        }
        Some((id, None)) => {
            let message = match &o.pod_failure {
                Some(p) => format!("run {id}: retrying after a failure: {}", p.message),
                None => format!("run {id}: the restore Job is running"),
            };
            vec![
                c(READY, False, "Restoring", message.clone()),
                c(RECONCILING, True, "Restoring", message),
                c(STALLED, False, "Restoring", ""),
            ]
        }
        Some((id, Some(true))) => {
            let message = format!("run {id}: {}", o.restored.as_deref().unwrap_or("restored"));
            vec![
                c(READY, True, "Restored", message),
                c(RECONCILING, False, "Restored", ""),
                c(STALLED, False, "Restored", ""),
            ]
        }
        Some((id, Some(false))) => {
            let p = o.pod_failure.clone().unwrap_or_else(|| {
                Problem::new(
                    "RestoreFailed",
                    "the restore Job failed (its pod reported no reason)",
                )
            });
            let message = format!("run {id}: {}", p.message);
            vec![
                c(READY, False, &p.reason, message.clone()),
                c(RECONCILING, False, &p.reason, ""),
                c(STALLED, True, &p.reason, message),
            ]
        }
    }
}
