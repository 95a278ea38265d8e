use jiff::Timestamp;

use super::*;
use crate::source::rebaseline::{RebaselineSample, RebaselineTracker};

fn t(mins: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + mins * 60).unwrap()
}

fn get<'a>(cs: &'a [Condition], t: &str) -> &'a Condition {
    cs.iter().find(|c| c.type_ == t).unwrap()
}

fn status_of<'a>(cs: &'a [Cond], t: &str) -> (Status, &'a str) {
    let c = cs
        .iter()
        .find(|c| c.type_ == t)
        .unwrap_or_else(|| panic!("no {t} in {cs:?}"));
    (c.status, c.reason.as_str())
}

fn export_obs() -> ExportObservation {
    ExportObservation {
        blocked: None,
        pod_failure: None,
        mode: ExportMode::OneShot,
        scheduled: false,
        suspended: false,
        run: Some(RunStatus {
            id: "abcd1234".into(),
            ..Default::default()
        }),
        run_jobs: vec![JobPhase::Active],
        last_outcome: None,
        writers: WriterCounts::default(),
        writers_with_snapshot: 0,
        suspended_slots: vec![],
    }
}

#[test]
fn merge_sets_every_type_on_first_visit_and_keeps_transition_times() {
    let first = merge(&[], &[], &EXPORT_TYPES, t(0), Some(1));
    assert_eq!(first.len(), 5);
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

#[test]
fn oneshot_lifecycle() {
    let mut o = export_obs();
    let running = export_conditions(&o);
    assert_eq!(
        status_of(&running, RECONCILING),
        (Status::True, "ExportRunning")
    );
    assert_eq!(status_of(&running, READY), (Status::False, "ExportRunning"));

    o.run_jobs = vec![JobPhase::Succeeded];
    o.run.as_mut().unwrap().succeeded = Some(true);
    let done = export_conditions(&o);
    assert_eq!(status_of(&done, READY), (Status::True, "ExportSucceeded"));
    assert_eq!(
        status_of(&done, LAST_EXPORT_SUCCEEDED),
        (Status::True, "ExportSucceeded")
    );
    assert_eq!(status_of(&done, STALLED).0, Status::False);

    // Later the Job is removed by its TTL: the recorded success stands.
    o.run_jobs = vec![];
    assert_eq!(
        status_of(&export_conditions(&o), READY),
        (Status::True, "ExportSucceeded")
    );

    o.run.as_mut().unwrap().succeeded = Some(false);
    o.run_jobs = vec![JobPhase::Succeeded, JobPhase::Failed];
    o.last_outcome = Some(PodOutcome {
        succeeded: false,
        detail: "connection refused".into(),
    });
    let failed = export_conditions(&o);
    assert_eq!(status_of(&failed, STALLED), (Status::True, "ExportFailed"));
    assert_eq!(
        status_of(&failed, LAST_EXPORT_SUCCEEDED),
        (Status::False, "ExportFailed")
    );
    let msg = &failed
        .iter()
        .find(|c| c.type_ == LAST_EXPORT_SUCCEEDED)
        .unwrap()
        .message;
    assert_eq!(msg, "connection refused");

    o.run.as_mut().unwrap().succeeded = None;
    o.run_jobs = vec![JobPhase::Missing];
    let lost = export_conditions(&o);
    assert_eq!(status_of(&lost, STALLED), (Status::True, "JobMissing"));
    assert_eq!(
        status_of(&lost, LAST_EXPORT_SUCCEEDED),
        (Status::Unknown, "JobMissing")
    );
}

#[test]
fn run_outcome_folds_job_phases() {
    use JobPhase::*;
    assert_eq!(run_outcome(&[Succeeded, Active]), None);
    assert_eq!(run_outcome(&[Succeeded, Succeeded]), Some(true));
    assert_eq!(run_outcome(&[Succeeded, Failed]), Some(false));
    assert_eq!(run_outcome(&[Missing]), Some(false));
    assert_eq!(run_outcome(&[]), Some(false));
}

#[test]
fn invalid_spec_stalls() {
    let mut o = export_obs();
    o.blocked = Some(Problem::new(
        "InvalidSpec",
        "affinity is not a valid Affinity",
    ));
    let cs = export_conditions(&o);
    assert_eq!(status_of(&cs, STALLED), (Status::True, "InvalidSpec"));
    assert_eq!(status_of(&cs, READY).0, Status::False);
    assert_eq!(status_of(&cs, RECONCILING).0, Status::False);
}

fn pod_problem(reason: &str, transient: bool) -> Problem {
    Problem {
        reason: reason.into(),
        message: format!("writer pod w-0: exited with status 2: {reason}"),
        transient,
    }
}

/// A failing writer: permanent → Stalled (kstatus Failed), transient → Reconciling (kstatus
/// InProgress); Degraded either way, with the pod's reason and message.
#[test]
fn a_failing_writer_is_stalled_or_degraded_by_its_reason() {
    let mut c = export_obs();
    c.mode = ExportMode::Continuous;
    c.run = None;
    c.run_jobs = vec![];
    c.writers = WriterCounts {
        ready: 0,
        desired: 1,
        stalled: false,
    };
    c.pod_failure = Some(pod_problem("TableNotFound", false));
    let cs = export_conditions(&c);
    assert_eq!(status_of(&cs, STALLED), (Status::True, "TableNotFound"));
    assert_eq!(status_of(&cs, RECONCILING).0, Status::False);
    assert_eq!(status_of(&cs, READY), (Status::False, "TableNotFound"));
    assert_eq!(status_of(&cs, DEGRADED), (Status::True, "TableNotFound"));
    assert!(get_cond(&cs, STALLED).message.contains("writer pod w-0"));
    c.pod_failure = Some(pod_problem("ConnectionFailed", true));
    let cs = export_conditions(&c);
    assert_eq!(status_of(&cs, STALLED).0, Status::False);
    assert_eq!(
        status_of(&cs, RECONCILING),
        (Status::True, "ConnectionFailed")
    );
    assert_eq!(status_of(&cs, DEGRADED), (Status::True, "ConnectionFailed"));
    // Recovered: Degraded goes back to False.
    c.pod_failure = None;
    c.writers = WriterCounts {
        ready: 1,
        desired: 1,
        stalled: false,
    };
    let cs = export_conditions(&c);
    assert_eq!(status_of(&cs, DEGRADED), (Status::False, "AsExpected"));
    assert_eq!(status_of(&cs, READY), (Status::True, "Running"));
}

fn get_cond<'a>(cs: &'a [Cond], t: &str) -> &'a Cond {
    cs.iter().find(|c| c.type_ == t).unwrap()
}

#[test]
fn a_failed_run_stalls_with_the_pods_reason() {
    let mut o = export_obs();
    // Still running, a pod failed: the Job retries, the export is Degraded meanwhile.
    o.pod_failure = Some(pod_problem("ConnectionFailed", true));
    let cs = export_conditions(&o);
    assert_eq!(status_of(&cs, RECONCILING), (Status::True, "ExportRunning"));
    assert_eq!(status_of(&cs, DEGRADED), (Status::True, "ConnectionFailed"));
    // The run failed.
    o.run_jobs = vec![JobPhase::Failed];
    o.run.as_mut().unwrap().succeeded = Some(false);
    o.pod_failure = Some(pod_problem("TableNotFound", false));
    o.last_outcome = Some(PodOutcome {
        succeeded: false,
        detail: "pod x exited 2".into(),
    });
    let cs = export_conditions(&o);
    assert_eq!(status_of(&cs, STALLED), (Status::True, "TableNotFound"));
    let msg = &get_cond(&cs, STALLED).message;
    assert!(
        msg.starts_with("run abcd1234 failed: writer pod w-0: exited with status 2")
            && msg.contains("larch.dev/run-requested"),
        "{msg}"
    );
    assert_eq!(
        status_of(&cs, LAST_EXPORT_SUCCEEDED),
        (Status::False, "ExportFailed")
    );
    // Scheduled: a permanent failure stalls, a transient one only degrades.
    let mut s = export_obs();
    s.scheduled = true;
    s.run = None;
    s.run_jobs = vec![];
    s.last_outcome = Some(PodOutcome {
        succeeded: false,
        detail: "pod x exited 2".into(),
    });
    s.pod_failure = Some(pod_problem("PermissionDenied", false));
    let cs = export_conditions(&s);
    assert_eq!(status_of(&cs, STALLED), (Status::True, "PermissionDenied"));
    assert_eq!(status_of(&cs, READY), (Status::False, "PermissionDenied"));
    s.pod_failure = Some(pod_problem("ConnectionFailed", true));
    let cs = export_conditions(&s);
    assert_eq!(status_of(&cs, STALLED).0, Status::False);
    assert_eq!(status_of(&cs, DEGRADED), (Status::True, "ConnectionFailed"));
}

#[test]
fn scheduled_and_continuous() {
    let mut o = export_obs();
    o.scheduled = true;
    o.run = None;
    o.run_jobs = vec![];
    let cs = export_conditions(&o);
    assert_eq!(status_of(&cs, READY), (Status::True, "Scheduled"));
    assert_eq!(
        status_of(&cs, LAST_EXPORT_SUCCEEDED),
        (Status::Unknown, "NoExportYet")
    );
    o.last_outcome = Some(PodOutcome {
        succeeded: false,
        detail: "exit code 1".into(),
    });
    let cs = export_conditions(&o);
    assert_eq!(status_of(&cs, READY), (Status::False, "LastExportFailed"));
    assert_eq!(
        status_of(&cs, STALLED).0,
        Status::False,
        "the next scheduled run retries"
    );
    o.suspended = true;
    assert_eq!(
        status_of(&export_conditions(&o), READY),
        (Status::True, "Suspended")
    );

    let mut c = export_obs();
    c.mode = ExportMode::Continuous;
    c.run = None;
    c.run_jobs = vec![];
    c.writers = WriterCounts {
        ready: 0,
        desired: 2,
        stalled: false,
    };
    let cs = export_conditions(&c);
    assert_eq!(
        status_of(&cs, RECONCILING),
        (Status::True, "WaitingForWriter")
    );
    c.writers = WriterCounts {
        ready: 2,
        desired: 2,
        stalled: false,
    };
    c.writers_with_snapshot = 2;
    let cs = export_conditions(&c);
    assert_eq!(status_of(&cs, READY), (Status::True, "Running"));
    assert_eq!(
        status_of(&cs, LAST_EXPORT_SUCCEEDED),
        (Status::True, "SnapshotWritten")
    );
    c.writers = WriterCounts {
        ready: 0,
        desired: 2,
        stalled: true,
    };
    assert_eq!(
        status_of(&export_conditions(&c), STALLED),
        (Status::True, "WriterNotProgressing")
    );
}

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
        short_chain: Some(crate::observe::EngineShortChain {
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

fn child(
    generation: i64,
    observed: Option<i64>,
    conds: &[(&str, &str, &str, &str)],
) -> crate::crd::ArchiveSource {
    let mut s: crate::crd::ArchiveSource = serde_json::from_value(serde_json::json!({
        "apiVersion": "larch.dev/v1alpha1", "kind": "ArchiveSource",
        "metadata": {"name": "seed", "namespace": "dev-a", "generation": generation},
        "spec": {"archive": {"exportRef": {"name": "x"}}, "target": {"memory": {}}}
    }))
    .unwrap();
    s.status = Some(crate::crd::ArchiveSourceStatus {
        observed_generation: observed,
        conditions: conds
            .iter()
            .map(|(t, st, r, m)| Condition {
                type_: t.to_string(),
                status: serde_json::from_value(serde_json::json!(st)).unwrap(),
                reason: r.to_string(),
                message: m.to_string(),
                last_transition_time: "2026-01-01T00:00:00Z".into(),
                observed_generation: observed,
            })
            .collect(),
        ..Default::default()
    });
    s
}

#[test]
fn namespace_state_from_the_child() {
    let p = |s: &str| NamespaceState::Progressing(s.into());
    assert_eq!(
        namespace_state(None, None),
        p("the ArchiveSource is not created yet")
    );
    // The set's own finding wins.
    let ready = child(1, Some(1), &[(READY, "True", "EnginesReady", "1/1")]);
    assert_eq!(
        namespace_state(Some(Problem::new("SecretConflict", "taken")), Some(&ready)),
        NamespaceState::Failing {
            reason: "SecretConflict".into(),
            message: "taken".into()
        }
    );
    assert_eq!(namespace_state(None, Some(&ready)), NamespaceState::Ready);
    // A status for an older generation says nothing about the current spec.
    let stale = child(2, Some(1), &[(READY, "True", "EnginesReady", "1/1")]);
    assert_eq!(
        namespace_state(None, Some(&stale)),
        p("the ArchiveSource is not observed yet")
    );
    let stalled = child(
        1,
        Some(1),
        &[
            (READY, "False", "PodCreationFailed", "quota"),
            (
                STALLED,
                "True",
                "PodCreationFailed",
                "0/1 engines ready; quota",
            ),
        ],
    );
    assert_eq!(
        namespace_state(None, Some(&stalled)),
        NamespaceState::Failing {
            reason: "PodCreationFailed".into(),
            message: "0/1 engines ready; quota".into()
        }
    );
    let waiting = child(
        1,
        Some(1),
        &[
            (READY, "False", "WaitingForEngines", "0/1 engines ready"),
            (STALLED, "False", "WaitingForEngines", ""),
        ],
    );
    assert_eq!(
        namespace_state(None, Some(&waiting)),
        p("0/1 engines ready")
    );
}

#[test]
fn source_set_rollup() {
    let obs = |states: Vec<NamespaceState>| SetObservation {
        invalid: None,
        namespaces: states
            .into_iter()
            .enumerate()
            .map(|(i, s)| (format!("dev-{i}"), s))
            .collect(),
    };
    let fail = |r: &str| NamespaceState::Failing {
        reason: r.into(),
        message: "m".into(),
    };
    let prog = NamespaceState::Progressing("p".into());
    use NamespaceState::Ready as R;

    let cs = source_set_conditions(&obs(vec![]));
    assert_eq!(status_of(&cs, READY), (Status::True, "NoNamespaces"));

    let cs = source_set_conditions(&obs(vec![R, R]));
    assert_eq!(status_of(&cs, READY), (Status::True, "NamespacesReady"));
    assert_eq!(status_of(&cs, RECONCILING).0, Status::False);
    assert_eq!(status_of(&cs, STALLED).0, Status::False);
    assert_eq!(
        cs.iter().find(|c| c.type_ == READY).unwrap().message,
        "2/2 namespaces ready"
    );

    let cs = source_set_conditions(&obs(vec![R, prog.clone()]));
    assert_eq!(
        status_of(&cs, READY),
        (Status::False, "WaitingForNamespaces")
    );
    assert_eq!(status_of(&cs, RECONCILING).0, Status::True);
    assert_eq!(status_of(&cs, STALLED).0, Status::False);

    let o = obs(vec![R, fail("PodCreationFailed"), prog]);
    assert_eq!(o.ready(), 1);
    assert_eq!(o.failing(), [("dev-1", "PodCreationFailed", "m")]);
    let cs = source_set_conditions(&o);
    assert_eq!(status_of(&cs, READY), (Status::False, "NamespacesFailing"));
    assert_eq!(status_of(&cs, STALLED), (Status::True, "NamespacesFailing"));
    assert_eq!(
        status_of(&cs, RECONCILING),
        (Status::True, "WaitingForNamespaces")
    );
    let msg = &cs.iter().find(|c| c.type_ == STALLED).unwrap().message;
    assert!(
        msg.contains("1/3 namespaces ready; 1 failing: dev-1 (PodCreationFailed)"),
        "{msg}"
    );

    let cs = source_set_conditions(&obs(vec![R, fail("SecretNotFound")]));
    assert_eq!(
        status_of(&cs, RECONCILING),
        (Status::False, "NamespacesFailing")
    );

    let cs = source_set_conditions(&SetObservation {
        invalid: Some(Problem::new(
            "CredentialsNotFound",
            "Secret platform/x not found",
        )),
        namespaces: vec![("dev-0".into(), R)],
    });
    assert_eq!(
        status_of(&cs, READY),
        (Status::False, "CredentialsNotFound")
    );
    assert_eq!(
        status_of(&cs, STALLED),
        (Status::True, "CredentialsNotFound")
    );
}

#[test]
fn credentials_are_masked_in_database_errors() {
    assert_eq!(
        without_credentials("connecting to postgresql://app:hunter2@db:5432/app failed"),
        "connecting to postgresql://app:***@db:5432/app failed"
    );
    assert_eq!(
        without_credentials("dsn host=db password=hunter2 dbname=app: refused"),
        "dsn host=db password=*** dbname=app: refused"
    );
    // No password, no URL, an @ before the scheme: left as they are.
    for text in [
        "postgresql://app@db/app refused",
        "database \"app\" does not exist",
        "a@b://c",
    ] {
        assert_eq!(without_credentials(text), text);
    }
}

#[test]
fn a_restore_waiting_for_its_database_is_reconciling_not_stalled() {
    let o = RestoreObservation {
        run: Some(("r1".into(), None)),
        pod_failure: Some(Problem::new(
            "DatabaseNotFound",
            "restore pod x: database \"app\" does not exist",
        )),
        ..Default::default()
    };
    let cs = restore_conditions(&o);
    assert_eq!(status_of(&cs, READY), (Status::False, DATABASE_UNAVAILABLE));
    assert_eq!(
        status_of(&cs, RECONCILING),
        (Status::True, DATABASE_UNAVAILABLE)
    );
    assert_eq!(status_of(&cs, STALLED).0, Status::False);
    // Another failure of a running Job is a retry, not the database.
    let other = RestoreObservation {
        pod_failure: Some(Problem::new("StorageUnavailable", "s3 down")),
        ..o
    };
    assert_eq!(status_of(&restore_conditions(&other), READY).1, "Restoring");
}

#[test]
fn a_stamped_restores_state_follows_its_token_and_conditions() {
    use crate::crd::ArchiveRestore;
    let restore = |token: &str, run_token: &str, ready: (&str, &str)| -> ArchiveRestore {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "larch.dev/v1alpha1", "kind": "ArchiveRestore",
            "metadata": {"name": "s", "namespace": "dev-a", "generation": 1,
                         "annotations": {"larch.dev/run-requested": token}},
            "spec": {"archive": {"s3": {"bucket": "b"}}, "tables": [{"name": "t"}],
                     "target": {"postgres": {"connectionSecretRef": {"name": "db", "key": "uri"}}}},
            "status": {"observedGeneration": 1, "run": {"id": "x", "token": run_token},
                       "conditions": [{"type": "Ready", "status": ready.0, "reason": ready.1,
                                       "message": "m", "lastTransitionTime": "2026-12-01T00:00:00Z"}]}
        }))
        .unwrap()
    };
    let ready = restore("epoch-2", "epoch-2", ("True", "Restored"));
    assert_eq!(
        restore_namespace_state(None, Some(&ready)),
        NamespaceState::Ready
    );
    // A new token the restore has not started yet: in progress, not ready.
    let asked = restore("epoch-3", "epoch-2", ("True", "Restored"));
    assert!(matches!(
        restore_namespace_state(None, Some(&asked)),
        NamespaceState::Progressing(_)
    ));
    let waiting = restore("epoch-2", "epoch-2", ("False", DATABASE_UNAVAILABLE));
    assert_eq!(
        restore_namespace_state(None, Some(&waiting)),
        NamespaceState::Failing {
            reason: DATABASE_UNAVAILABLE.into(),
            message: "m".into()
        }
    );
    let running = restore("epoch-2", "epoch-2", ("False", "Restoring"));
    assert!(matches!(
        restore_namespace_state(None, Some(&running)),
        NamespaceState::Progressing(_)
    ));
    assert!(matches!(
        restore_namespace_state(None, None),
        NamespaceState::Progressing(_)
    ));
}
