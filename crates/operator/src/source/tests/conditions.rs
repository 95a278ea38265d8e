//! ArchiveSource conditions.

use crate::crd::common::Condition;
use crate::reconcile::conditions::*;
use crate::reconcile::tests::conditions::{get, status_of, t};
use crate::source::conditions::*;
use crate::source::observe::EngineSource;
use crate::source::rebaseline::{RebaselineSample, RebaselineTracker};

fn source_obs() -> SourceObservation {
    SourceObservation {
        blocked: None,
        pod_failure: None,
        suspended: false,
        desired_replicas: 2,
        ready_replicas: 2,
        rolled_out: true,
        pods_not_created: None,
        engines: vec![],
        rebaselining: false,
        rebaselines_last_hour: 0,
        max_per_hour: 2,
    }
}

#[test]
fn source_readiness_and_caught_up() {
    let mut o = source_obs();
    let cs = source_conditions(&o);
    assert_eq!(status_of(&cs, READY), (Status::True, "EnginesReady"));
    assert_eq!(status_of(&cs, CAUGHT_UP), (Status::Unknown, "NoData"));
    o.ready_replicas = 1;
    assert_eq!(
        status_of(&source_conditions(&o), RECONCILING),
        (Status::True, "WaitingForEngines")
    );
    o.engines = vec![
        EngineSource {
            position: Some("0/10".into()),
            head: Some("0/10".into()),
            ..Default::default()
        },
        EngineSource {
            lag_seconds: Some(303.0),
            position: Some("0/08".into()),
            head: Some("0/10".into()),
            ..Default::default()
        },
    ];
    let cs = source_conditions(&o);
    assert_eq!(status_of(&cs, CAUGHT_UP), (Status::False, "Lagging"));
    assert!(
        cs.iter().any(|c| c.message.contains("at 0/08, head 0/10")),
        "{cs:?}"
    );
    // The message names positions, not the growing age: the same state, the same condition.
    o.engines[1].lag_seconds = Some(304.0);
    assert_eq!(source_conditions(&o), cs);
    o.engines[1].lag_seconds = Some(3.0);
    assert_eq!(
        status_of(&source_conditions(&o), CAUGHT_UP),
        (Status::True, "CaughtUp")
    );
    o.blocked = Some(Problem::new(
        "ExportNotFound",
        "ArchiveExport data/users (named in spec.archive.exportRef) does not exist",
    ));
    let cs = source_conditions(&o);
    assert_eq!(status_of(&cs, READY), (Status::False, "ExportNotFound"));
    assert_eq!(status_of(&cs, STALLED), (Status::True, "ExportNotFound"));
    assert_eq!(status_of(&cs, RECONCILING).0, Status::False);
}

/// An engine that refuses its configuration (exits 2, ColumnNotFound) stalls the source over
/// everything the running engines report; a transient one keeps it reconciling.
#[test]
fn a_failing_engine_stalls_or_degrades_the_source() {
    let mut o = source_obs();
    o.ready_replicas = 0;
    o.rebaselines_last_hour = 9;
    o.pod_failure = Some(Problem {
        reason: "ColumnNotFound".into(),
        message: "engine pod s-0: exited with status 2: index field \"x\" is not a column".into(),
        transient: false,
    });
    let cs = source_conditions(&o);
    assert_eq!(status_of(&cs, STALLED), (Status::True, "ColumnNotFound"));
    assert_eq!(status_of(&cs, DEGRADED), (Status::True, "ColumnNotFound"));
    assert_eq!(status_of(&cs, READY), (Status::False, "ColumnNotFound"));
    o.pod_failure.as_mut().unwrap().transient = true;
    o.pod_failure.as_mut().unwrap().reason = "ConnectionFailed".into();
    let cs = source_conditions(&o);
    assert_eq!(status_of(&cs, STALLED).0, Status::False);
    assert_eq!(
        status_of(&cs, RECONCILING),
        (Status::True, "ConnectionFailed")
    );
    // Suspended: no engine runs, nothing fails.
    o.suspended = true;
    let cs = source_conditions(&o);
    assert_eq!(status_of(&cs, READY), (Status::True, "Suspended"));
    assert_eq!(
        status_of(&cs, DEGRADED),
        (Status::True, "FrequentRebaselines")
    );
}

/// An engine stuck at the end of a chain that stops before the head: Degraded (ShortChain, over
/// frequent re-baselines) and not caught up, even with a small lag.
#[test]
fn a_short_chain_degrades_the_source() {
    let mut o = source_obs();
    o.rebaselines_last_hour = 9;
    o.engines = vec![EngineSource {
        position: Some("0/20".into()),
        head: Some("0/40".into()),
        lag_seconds: Some(1.0),
        short_chain: Some(crate::source::observe::EngineShortChain {
            reached: "0/20".into(),
            head: "0/40".into(),
            reason: "no diff starts at 0/20".into(),
        }),
        ..Default::default()
    }];
    let cs = source_conditions(&o);
    assert_eq!(status_of(&cs, DEGRADED), (Status::True, "ShortChain"));
    assert_eq!(status_of(&cs, CAUGHT_UP), (Status::False, "ShortChain"));
    let msg = &cs.iter().find(|c| c.type_ == DEGRADED).unwrap().message;
    assert!(msg.contains("stops at 0/20 before the head 0/40"), "{msg}");
    o.engines[0].short_chain = None;
    assert_eq!(
        status_of(&source_conditions(&o), DEGRADED),
        (Status::True, "FrequentRebaselines")
    );
}

/// Counter samples over time → Rebaselining / Degraded, through the same path the controller
/// uses (tracker → observation → conditions → merge → transitions for Events).
#[test]
fn rebaseline_feed_drives_rebaselining_and_degraded() {
    let mut tracker = RebaselineTracker::default();
    let mut conds: Vec<Condition> = vec![];
    let mut events: Vec<(i64, String, String)> = vec![];
    // (minute, counter of pod-0, counter of pod-1)
    let samples = [
        (0, 5.0, 2.0),  // baseline
        (1, 5.0, 2.0),  // quiet
        (2, 6.0, 2.0),  // one re-baseline → Rebaselining
        (10, 6.0, 2.0), // quiet for 8 min → Rebaselining clears
        (20, 7.0, 3.0), // two more (3 in the last hour > maxPerHour 2) → Degraded
        (21, 7.0, 3.0),
        (90, 7.0, 3.0), // the hour has passed → Degraded clears
    ];
    let mut seen = vec![];
    for (m, a, b) in samples {
        let now = t(m);
        let sample = |pod: &str, total| RebaselineSample {
            pod: pod.into(),
            total,
            new_pod: false,
        };
        tracker.observe(now, &[sample("p-0", a), sample("p-1", b)]);
        let mut o = source_obs();
        o.rebaselining = tracker.recent(now);
        o.rebaselines_last_hour = tracker.in_last_hour(now);
        let next = merge(&conds, &source_conditions(&o), &SOURCE_TYPES, now, Some(1));
        for tr in transitions(&conds, &next) {
            if tr.type_ == REBASELINING || tr.type_ == DEGRADED {
                events.push((m, tr.type_.clone(), tr.status.as_str().to_string()));
            }
        }
        seen.push((
            m,
            get(&next, REBASELINING).status.as_str().to_string(),
            get(&next, DEGRADED).status.as_str().to_string(),
        ));
        conds = next;
    }
    let s = |a: &str, b: &str| (a.to_string(), b.to_string());
    let statuses: Vec<(String, String)> = seen
        .iter()
        .map(|(_, r, d)| (r.clone(), d.clone()))
        .collect();
    assert_eq!(
        statuses,
        vec![
            s("False", "False"),
            s("False", "False"),
            s("True", "False"),
            s("False", "False"),
            s("True", "True"),
            s("True", "True"),
            s("False", "False"),
        ]
    );
    assert_eq!(tracker.total, 3);
    assert_eq!(get(&conds, DEGRADED).reason, "AsExpected");
    // One Event per transition: first visit sets both, then each flip.
    let flips: Vec<(i64, &str, &str)> = events
        .iter()
        .map(|(m, t, s)| (*m, t.as_str(), s.as_str()))
        .collect();
    assert_eq!(
        flips,
        vec![
            (0, REBASELINING, "False"),
            (0, DEGRADED, "False"),
            (2, REBASELINING, "True"),
            (10, REBASELINING, "False"),
            (20, REBASELINING, "True"),
            (20, DEGRADED, "True"),
            (90, REBASELINING, "False"),
            (90, DEGRADED, "False"),
        ]
    );
}

#[test]
fn source_pods_that_cannot_be_created_stall_it() {
    let mut o = source_obs();
    o.ready_replicas = 0;
    o.pods_not_created = Some("pods \"seed-0\" is forbidden: exceeded quota: no-pods".into());
    let cs = source_conditions(&o);
    assert_eq!(status_of(&cs, READY), (Status::False, "PodCreationFailed"));
    assert_eq!(status_of(&cs, STALLED), (Status::True, "PodCreationFailed"));
    assert_eq!(
        status_of(&cs, RECONCILING),
        (Status::False, "PodCreationFailed")
    );
    let msg = &cs.iter().find(|c| c.type_ == STALLED).unwrap().message;
    assert!(
        msg.contains("0/2 engines ready") && msg.contains("exceeded quota"),
        "{msg}"
    );
    // Once the engines are there, an old failure does not matter.
    o.ready_replicas = 2;
    assert_eq!(
        status_of(&source_conditions(&o), READY),
        (Status::True, "EnginesReady")
    );
    // Suspended wins.
    o.ready_replicas = 0;
    o.suspended = true;
    assert_eq!(
        status_of(&source_conditions(&o), READY),
        (Status::True, "Suspended")
    );
}
