//! Tests of the condition machinery every kind shares, and helpers the kinds' condition tests use.

use jiff::Timestamp;

use crate::crd::common::Condition;
use crate::export::conditions::EXPORT_TYPES;
use crate::reconcile::conditions::*;

pub(crate) fn t(mins: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + mins * 60).unwrap()
}

pub(crate) fn get<'a>(cs: &'a [Condition], t: &str) -> &'a Condition {
    cs.iter().find(|c| c.type_ == t).unwrap()
}

pub(crate) fn status_of<'a>(cs: &'a [Cond], t: &str) -> (Status, &'a str) {
    let c = cs
        .iter()
        .find(|c| c.type_ == t)
        .unwrap_or_else(|| panic!("no {t} in {cs:?}"));
    (c.status, c.reason.as_str())
}

pub(crate) fn get_cond<'a>(cs: &'a [Cond], t: &str) -> &'a Cond {
    cs.iter().find(|c| c.type_ == t).unwrap()
}

#[test]
fn merge_sets_every_type_on_first_visit_and_keeps_transition_times() {
    let first = merge(&[], &[], &EXPORT_TYPES, t(0), Some(1));
    assert_eq!(first.len(), EXPORT_TYPES.len());
    assert!(
        first
            .iter()
            .all(|c| c.status == Status::Unknown && c.observed_generation == Some(1))
    );
    let ready = [c(READY, Status::True, "X", "")];
    let second = merge(&first, &ready, &EXPORT_TYPES, t(1), Some(2));
    assert_eq!(get(&second, READY).last_transition_time, time_string(t(1)));
    assert_eq!(
        get(&second, STALLED).last_transition_time,
        time_string(t(0))
    );
    assert_eq!(get(&second, STALLED).observed_generation, Some(2));
    let same = [c(READY, Status::True, "Y", "other message")];
    let third = merge(&second, &same, &EXPORT_TYPES, t(5), Some(2));
    assert_eq!(
        get(&third, READY).last_transition_time,
        time_string(t(1)),
        "no flip, no new time"
    );
    assert_eq!(get(&third, READY).reason, "Y");
    assert_eq!(transitions(&second, &third).len(), 0);
    let flipped = merge(
        &third,
        &[c(READY, Status::False, "Z", "")],
        &EXPORT_TYPES,
        t(6),
        Some(2),
    );
    let tr = transitions(&third, &flipped);
    assert_eq!(tr.len(), 1);
    assert_eq!((tr[0].type_.as_str(), tr[0].status), (READY, Status::False));
    assert_eq!(time_string(t(0)), "2027-01-15T08:00:00Z");
}
