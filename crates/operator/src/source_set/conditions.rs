//! ArchiveSourceSet conditions, and each selected namespace's state, from what its reconcile
//! observed (pure).

use crate::crd::common::Condition;
use crate::reconcile::conditions::*;
use crate::restore::conditions::DATABASE_UNAVAILABLE;

pub const SOURCE_SET_TYPES: [&str; 3] = [READY, RECONCILING, STALLED];

/// Where one selected namespace stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NamespaceState {
    Ready,
    /// Working on it (creating, waiting for engines): the message says what.
    Progressing(String),
    /// Cannot get a working ArchiveSource without someone acting.
    Failing {
        reason: String,
        message: String,
    },
}

/// A namespace's state from the set's own finding (`problem`) or else from
/// its ArchiveSource: Stalled=True is a failure (with its reason and message), Ready=True for
/// the current generation is ready, anything else is in progress.
pub fn namespace_state(
    problem: Option<Problem>,
    child: Option<&crate::crd::ArchiveSource>,
) -> NamespaceState {
    let child = child.map(|c| (c.metadata.generation, c.status.clone().unwrap_or_default()));
    child_state(
        "ArchiveSource",
        problem,
        child
            .as_ref()
            .map(|(g, s)| (*g, s.observed_generation, &s.conditions[..])),
        |_| false,
    )
}

/// A child's state: the set's `problem`, else not created or not observed yet (in progress),
/// Stalled=True or a Ready=False that `failing_ready` calls failing (a failure, with its
/// reason and message), Ready=True (ready), anything else (in progress). `child`: its
/// generation, observed generation and conditions.
fn child_state(
    kind: &str,
    problem: Option<Problem>,
    child: Option<(Option<i64>, Option<i64>, &[Condition])>,
    failing_ready: impl Fn(&Condition) -> bool,
) -> NamespaceState {
    if let Some(Problem {
        reason, message, ..
    }) = problem
    {
        return NamespaceState::Failing { reason, message };
    }
    let Some((generation, observed, conditions)) = child else {
        return NamespaceState::Progressing(format!("the {kind} is not created yet"));
    };
    if observed.is_none() || observed != generation {
        return NamespaceState::Progressing(format!("the {kind} is not observed yet"));
    }
    let find = |t: &str| conditions.iter().find(|c| c.type_ == t);
    let failing = |c: &Condition| NamespaceState::Failing {
        reason: c.reason.clone(),
        message: c.message.clone(),
    };
    if let Some(s) = find(STALLED).filter(|c| c.status == Status::True) {
        return failing(s);
    }
    match find(READY) {
        Some(r) if r.status == Status::True => NamespaceState::Ready,
        Some(r) if failing_ready(r) => failing(r),
        Some(r) => NamespaceState::Progressing(r.message.clone()),
        None => NamespaceState::Progressing(format!("the {kind} reports no Ready condition")),
    }
}

/// A namespace's state from the set's own finding or else from its ArchiveRestore: Stalled,
/// or a run waiting for its database (`DatabaseUnavailable`), is failing; Ready for the
/// current generation is ready; anything else (a run in progress) is in progress.
pub fn restore_namespace_state(
    problem: Option<Problem>,
    child: Option<&crate::crd::ArchiveRestore>,
) -> NamespaceState {
    let status = child.map(|c| c.status.clone().unwrap_or_default());
    // A token the restore has not started a run for yet: not ready, whatever the last run did.
    if problem.is_none()
        && let (Some(c), Some(s)) = (child, &status)
    {
        let token = c
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(crate::crd::archive_restore::RUN_REQUESTED_ANNOTATION));
        if token.is_some() && s.run.as_ref().and_then(|r| r.token.as_ref()) != token {
            return NamespaceState::Progressing("a refresh is requested".into());
        }
    }
    child_state(
        "ArchiveRestore",
        problem,
        child.zip(status.as_ref()).map(|(c, s)| {
            (
                c.metadata.generation,
                s.observed_generation,
                &s.conditions[..],
            )
        }),
        |r| r.reason == DATABASE_UNAVAILABLE,
    )
}

/// What the set controller observed, reduced to what its conditions depend on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetObservation {
    /// The set itself cannot work, e.g. its credentials Secret is missing.
    pub invalid: Option<Problem>,
    /// Every selected namespace, by name.
    pub namespaces: Vec<(String, NamespaceState)>,
}

impl SetObservation {
    pub fn ready(&self) -> usize {
        self.namespaces
            .iter()
            .filter(|(_, s)| *s == NamespaceState::Ready)
            .count()
    }
    /// Failing namespaces, by name: (namespace, reason, message).
    pub fn failing(&self) -> Vec<(&str, &str, &str)> {
        self.namespaces
            .iter()
            .filter_map(|(ns, s)| match s {
                NamespaceState::Failing { reason, message } => {
                    Some((ns.as_str(), reason.as_str(), message.as_str()))
                }
                _ => None,
            })
            .collect()
    }
}

pub fn source_set_conditions(o: &SetObservation) -> Vec<Cond> {
    use Status::*;
    if let Some(Problem {
        reason, message, ..
    }) = &o.invalid
    {
        return vec![
            c(READY, False, reason, message.clone()),
            c(RECONCILING, False, reason, ""),
            c(STALLED, True, reason, message.clone()),
        ];
    }
    let desired = o.namespaces.len();
    let ready = o.ready();
    let failing = o.failing();
    let progressing = desired - ready - failing.len();
    if desired == 0 {
        let msg = "no namespace matches the selector";
        return vec![
            c(READY, True, "NoNamespaces", msg),
            c(RECONCILING, False, "NoNamespaces", ""),
            c(STALLED, False, "NoNamespaces", ""),
        ];
    }
    let counts = format!("{ready}/{desired} namespaces ready");
    if !failing.is_empty() {
        let names: Vec<String> = failing
            .iter()
            .take(10)
            .map(|(ns, reason, _)| format!("{ns} ({reason})"))
            .collect();
        let more = if failing.len() > 10 { ", ..." } else { "" };
        let msg = format!(
            "{counts}; {} failing: {}{more} (see status.failingNamespaces)",
            failing.len(),
            names.join(", ")
        );
        return vec![
            c(READY, False, "NamespacesFailing", msg.clone()),
            if progressing > 0 {
                c(
                    RECONCILING,
                    True,
                    "WaitingForNamespaces",
                    format!("{progressing} namespaces in progress"),
                )
            } else {
                c(RECONCILING, False, "NamespacesFailing", "")
            },
            c(STALLED, True, "NamespacesFailing", msg),
        ];
    }
    if progressing > 0 {
        return vec![
            c(READY, False, "WaitingForNamespaces", counts.clone()),
            c(RECONCILING, True, "WaitingForNamespaces", counts),
            c(STALLED, False, "WaitingForNamespaces", ""),
        ];
    }
    vec![
        c(READY, True, "NamespacesReady", counts),
        c(RECONCILING, False, "NamespacesReady", ""),
        c(STALLED, False, "NamespacesReady", ""),
    ]
}
