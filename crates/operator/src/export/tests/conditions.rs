//! ArchiveExport conditions.

use larch_contract::preflight::PreflightSummary;

use crate::crd::archive_export::{ExportMode, RunStatus};
use crate::export::conditions::*;
use crate::reconcile::conditions::*;
use crate::reconcile::job::JobPhase;
use crate::reconcile::tests::conditions::{get_cond, status_of, t};

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
        masked: false,
        unreviewed: None,
        preflight: None,
    }
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

#[test]
fn unreviewed_columns_of_a_masked_continuous_export() {
    use crate::export::observe::parse_unreviewed;
    let mut o = export_obs();
    o.mode = ExportMode::Continuous;
    o.run = None;
    o.run_jobs = vec![];
    o.writers = WriterCounts {
        ready: 1,
        desired: 1,
        stalled: false,
    };
    // Without a transform there is nothing to review.
    assert_eq!(
        status_of(&export_conditions(&o), UNREVIEWED_COLUMNS),
        (Status::False, "NotMasked")
    );
    o.masked = true;
    // What a writer's `/status` says after `ALTER TABLE users ADD COLUMN phone2 text`.
    let body = r#"{"table":"public.users","state":"STREAMING","epoch":2,"unreviewed_columns":[{"table":"public.users","column":"phone2","applied":"null","suggestion":"{fake: phone}","reason":"its name suggests phone numbers"}]}"#;
    o.unreviewed = parse_unreviewed(body);
    let cs = export_conditions(&o);
    let cond = get_cond(&cs, UNREVIEWED_COLUMNS);
    assert_eq!(
        (cond.status, cond.reason.as_str()),
        (Status::True, "UnreviewedColumns")
    );
    assert!(
        cond.message.contains(
            "public.users.phone2 (now: null; suggested: {fake: phone}, its name suggests phone numbers)"
        ),
        "{}",
        cond.message
    );
    assert_eq!(
        status_of(&cs, READY),
        (Status::True, "Running"),
        "informational only"
    );
    let first = merge(&[], &cs, &EXPORT_TYPES, t(0), Some(1));
    // A round where no writer answered keeps the last word.
    o.unreviewed = None;
    let cs = export_conditions(&o);
    assert!(cs.iter().all(|c| c.type_ != UNREVIEWED_COLUMNS));
    let kept = merge(&first, &cs, &EXPORT_TYPES, t(1), Some(1));
    let k = kept.iter().find(|c| c.type_ == UNREVIEWED_COLUMNS).unwrap();
    assert_eq!(k.status, Status::True);
    // The rules now name the column: the writer reports none.
    o.unreviewed = parse_unreviewed(r#"{"table":"public.users","state":"STREAMING","epoch":3}"#);
    assert_eq!(
        status_of(&export_conditions(&o), UNREVIEWED_COLUMNS),
        (Status::False, "AllColumnsReviewed")
    );
    // Many columns: ten listed, the rest counted.
    let many: Vec<String> = (0..12)
        .map(|i| format!("public.t.c{i} (now: null)"))
        .collect();
    o.unreviewed = Some(many);
    let cs = export_conditions(&o);
    let m = &get_cond(&cs, UNREVIEWED_COLUMNS).message;
    assert!(
        m.starts_with("12 column(s)") && m.ends_with("; and 2 more"),
        "{m}"
    );
    assert!(parse_unreviewed("<html>").is_none());
    o.mode = ExportMode::OneShot;
    assert_eq!(
        status_of(&export_conditions(&o), UNREVIEWED_COLUMNS).1,
        "NotContinuous"
    );
}

/// A one-shot export's summary (its termination message) with the preflight the pod ran.
fn summary_with(preflight: &PreflightSummary) -> String {
    let summary = serde_json::json!({
        "epoch": 1, "key_prefix": "public.users/", "position": "0/16B3748",
        "row_count": 3, "table": "public.users", "preflight": preflight,
    });
    serde_json::to_string_pretty(&summary).unwrap()
}

#[test]
fn validated_from_the_preflight_a_oneshot_pod_reports() {
    use crate::export::observe::parse_preflight;
    let mut o = export_obs();
    o.run_jobs = vec![JobPhase::Succeeded];
    o.run.as_mut().unwrap().succeeded = Some(true);
    assert_eq!(
        status_of(&export_conditions(&o), VALIDATED),
        (Status::True, "NotMasked")
    );
    o.masked = true;
    // No pod has reported yet: Unknown until one does.
    let cs = export_conditions(&o);
    assert!(cs.iter().all(|c| c.type_ != VALIDATED));
    let pending = merge(&[], &cs, &EXPORT_TYPES, t(0), Some(1));
    let v = pending.iter().find(|c| c.type_ == VALIDATED).unwrap();
    assert_eq!((v.status, v.reason.as_str()), (Status::Unknown, "Pending"));
    // A summary from before the preflight existed says nothing.
    let old = r#"{"table":"public.users","row_count":3,"epoch":1}"#;
    assert_eq!(parse_preflight(old), None);

    let lines: Vec<String> = (0..7)
        .map(|i| {
            format!(
                "public.users.users_c{i}_key (UNIQUE): column \"c{i}\": hash on text is not unique"
            )
        })
        .collect();
    o.preflight = parse_preflight(&summary_with(&PreflightSummary::of(9, lines)));
    let cs = export_conditions(&o);
    let v = get_cond(&cs, VALIDATED);
    assert_eq!(
        (v.status, v.reason.as_str()),
        (Status::False, "ConstraintsAtRisk")
    );
    assert!(
        v.message.starts_with("the transform can break 7 of the 9 constraints checked")
            && v.message.contains(
                "public.users.users_c0_key (UNIQUE): column \"c0\": hash on text is not unique; public.users.users_c1_key"
            )
            && !v.message.contains("users_c5_key")
            && v.message.contains("; and 2 more; change spec.transform"),
        "{}",
        v.message
    );
    assert_eq!(
        status_of(&cs, READY),
        (Status::True, "ExportSucceeded"),
        "informational unless requireValidated"
    );

    o.preflight = parse_preflight(&summary_with(&PreflightSummary::of(4, vec![])));
    let v = get_cond(&export_conditions(&o), VALIDATED).clone();
    assert_eq!(
        (v.status, v.reason.as_str()),
        (Status::True, "ConstraintsHold")
    );
    assert!(
        v.message.contains("none of the 4 constraints"),
        "{}",
        v.message
    );

    o.preflight = Some(PreflightSummary::failed("connecting: connection refused"));
    assert_eq!(
        status_of(&export_conditions(&o), VALIDATED),
        (Status::Unknown, "PreflightFailed")
    );

    // requireValidated: the pod refused with the reason; its message names the constraints.
    o.preflight = None;
    o.run.as_mut().unwrap().succeeded = Some(false);
    o.run_jobs = vec![JobPhase::Failed];
    o.pod_failure = Some(pod_problem("ConstraintsAtRisk", false));
    let cs = export_conditions(&o);
    let v = get_cond(&cs, VALIDATED);
    assert_eq!(
        (v.status, v.reason.as_str()),
        (Status::False, "ConstraintsAtRisk")
    );
    assert!(v.message.contains("ConstraintsAtRisk"), "{}", v.message);
    assert_eq!(status_of(&cs, STALLED), (Status::True, "ConstraintsAtRisk"));
    // Another failure says nothing of the constraints: the last word is kept.
    o.pod_failure = Some(pod_problem("ConnectionFailed", true));
    assert!(export_conditions(&o).iter().all(|c| c.type_ != VALIDATED));
}

#[test]
fn validated_of_a_continuous_export_merges_its_writers() {
    use crate::export::observe::parse_preflight;
    let users = r#"{"table":"public.users","state":"STREAMING","epoch":1,"preflight":{"constraints_checked":5,"at_risk":1,"problems":["public.users.email (NOT NULL): null on a NOT NULL column"]}}"#;
    let orders = r#"{"table":"public.orders","state":"STREAMING","epoch":1,"preflight":{"constraints_checked":3,"at_risk":0}}"#;
    let reports: Vec<PreflightSummary> = [users, orders]
        .iter()
        .filter_map(|b| parse_preflight(b))
        .collect();
    let merged = merge_preflights(&reports);
    assert_eq!((merged.constraints_checked, merged.at_risk), (8, 1));
    let mut o = export_obs();
    o.mode = ExportMode::Continuous;
    o.run = None;
    o.run_jobs = vec![];
    o.masked = true;
    o.preflight = Some(merged);
    let v = get_cond(&export_conditions(&o), VALIDATED).clone();
    assert_eq!(
        (v.status, v.reason.as_str()),
        (Status::False, "ConstraintsAtRisk")
    );
    assert!(
        v.message.contains("1 of the 8 constraints checked")
            && v.message
                .contains("public.users.email (NOT NULL): null on a NOT NULL column")
            && !v.message.contains("more"),
        "{}",
        v.message
    );
    // A writer whose preflight could not run does not hide another's findings.
    let failed = PreflightSummary::failed("connecting: timed out");
    o.preflight = Some(merge_preflights(&[failed.clone(), reports[0].clone()]));
    assert_eq!(
        status_of(&export_conditions(&o), VALIDATED).0,
        Status::False
    );
    o.preflight = Some(merge_preflights(&[failed, reports[1].clone()]));
    assert_eq!(
        status_of(&export_conditions(&o), VALIDATED),
        (Status::Unknown, "PreflightFailed")
    );
    assert_eq!(parse_preflight("<html>"), None);
}
