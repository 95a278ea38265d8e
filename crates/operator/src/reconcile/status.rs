//! The Events the three controllers publish with their status ([`super::apply::Applier::report`]
//! writes the status only when it changed, then publishes them): one per condition transition
//! that matters to someone watching `kubectl get events`, never while nothing changes.

use kube::runtime::events::{Event, EventType};

use crate::crd::common::Condition;
use crate::reconcile::conditions::{
    self, DEGRADED, READY, REBASELINING, STALLED, Status, is_true, transitions,
};

/// A condition whose status changed this round (or that is new).
pub struct Transition<'a> {
    pub condition: &'a Condition,
    /// The condition before; `None` on the first visit.
    pub previous: Option<&'a Condition>,
}

impl Transition<'_> {
    /// Whether the condition is `type_` and now has `status`.
    pub fn is(&self, type_: &str, status: Status) -> bool {
        self.condition.type_ == type_ && self.condition.status == status
    }

    pub fn first(&self) -> bool {
        self.previous.is_none()
    }
}

/// An Event about a condition (its note bounded as the API server wants it).
pub fn event(type_: EventType, reason: &str, note: &str, action: &str) -> Event {
    Event {
        type_,
        reason: reason.into(),
        note: Some(note.chars().take(1000).collect()),
        action: action.into(),
        secondary: None,
    }
}

/// One Event per transition `event_for` names (type and reason; the note is the condition's
/// message), in the order of `after`.
pub fn transition_events<'a>(
    before: &'a [Condition],
    after: &'a [Condition],
    action: &str,
    event_for: impl Fn(&Transition<'a>) -> Option<(EventType, &'a str)>,
) -> Vec<Event> {
    transitions(before, after)
        .into_iter()
        .filter_map(|condition| {
            let t = Transition {
                condition,
                previous: before.iter().find(|b| b.type_ == condition.type_),
            };
            let (type_, reason) = event_for(&t)?;
            Some(event(type_, reason, &condition.message, action))
        })
        .collect()
}

/// An ArchiveExport's Events for its failure conditions: `Stalled=True` (its reason,
/// Warning), `Degraded=True` without `Stalled` (its reason, Warning), and `Recovered` once a
/// failure that was reported clears. A failure that is True for another reason than before
/// (one cause fixed, the next one found) is reported again. At most one Event a round.
pub fn export_events(before: &[Condition], after: &[Condition]) -> Vec<Event> {
    let was_failing = is_true(before, STALLED) || is_true(before, DEGRADED);
    let failing = is_true(after, STALLED) || is_true(after, DEGRADED);
    let changed = transitions(before, after);
    let newly_true = |t: &str| {
        after.iter().find(|c| {
            c.type_ == t
                && c.status == Status::True
                && (changed.iter().any(|x| x.type_ == t)
                    || before.iter().any(|b| b.type_ == t && b.reason != c.reason))
        })
    };
    let action = "Reconcile";
    if let Some(s) = newly_true(STALLED) {
        return vec![event(EventType::Warning, &s.reason, &s.message, action)];
    }
    if let Some(d) = newly_true(DEGRADED).filter(|_| !is_true(after, STALLED)) {
        return vec![event(EventType::Warning, &d.reason, &d.message, action)];
    }
    if was_failing && !failing {
        let note = "the failure reported before has cleared";
        return vec![event(EventType::Normal, "Recovered", note, action)];
    }
    vec![]
}

/// An ArchiveSource's Events for failure, re-baseline and readiness transitions (first
/// visits only when abnormal).
pub fn source_events(before: &[Condition], after: &[Condition]) -> Vec<Event> {
    use Status::{False, True};
    // A failure's own Event says why it is not ready.
    let failing = transitions(before, after)
        .iter()
        .any(|c| c.status == True && (c.type_ == STALLED || c.type_ == DEGRADED));
    transition_events(before, after, "Observe", |t| {
        let reason = t.condition.reason.as_str();
        Some(match () {
            _ if t.is(REBASELINING, True) => (EventType::Warning, "Rebaselining"),
            _ if t.is(REBASELINING, False) && !t.first() => {
                (EventType::Normal, "RebaselineSettled")
            }
            // The condition's reason: a failing engine's, FrequentRebaselines or ShortChain.
            _ if t.is(STALLED, True) => (EventType::Warning, reason),
            _ if t.is(DEGRADED, True) && !is_true(after, STALLED) => (EventType::Warning, reason),
            _ if t.is(DEGRADED, False) && !t.first() => {
                let rebaselines = t
                    .previous
                    .is_some_and(|d| d.reason == "FrequentRebaselines" || d.reason == "ShortChain");
                let reason = if rebaselines {
                    "RebaselinesNormal"
                } else {
                    "Recovered"
                };
                (EventType::Normal, reason)
            }
            _ if t.is(READY, True) => (EventType::Normal, "Ready"),
            _ if t.is(READY, False) && !t.first() && !failing => (EventType::Warning, "NotReady"),
            _ => return None,
        })
    })
}

/// An ArchiveSourceSet's Events: when it becomes ready or starts failing (first visits only
/// when abnormal).
pub fn set_events(before: &[Condition], after: &[Condition]) -> Vec<Event> {
    use Status::{False, True};
    transition_events(before, after, "Reconcile", |t| {
        Some(match () {
            _ if t.is(conditions::READY, True) => (EventType::Normal, "Ready"),
            _ if t.is(STALLED, True) => (EventType::Warning, t.condition.reason.as_str()),
            _ if t.is(STALLED, False) && !t.first() => (EventType::Normal, "Recovered"),
            _ => return None,
        })
    })
}
