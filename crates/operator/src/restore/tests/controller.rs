//! The ArchiveRestore controller against a scripted API server: runs, failures, waiting for the
//! database.

use larch_core::locks::MutexExt;
use std::sync::Arc;
use std::time::Duration;

use http::Method;
use jiff::Timestamp;
use serde_json::{Value, json};

use crate::reconcile::tests::harness::*;

const MANAGER_RESTORE_Q: &str = "&force=true&fieldManager=larch-operator%2Frestore";
const RESTORE_STATUS: &str = "/apis/larch.dev/v1alpha1/namespaces/data/archiverestores/invoices-yesterday/status?&force=true&fieldManager=larch-operator%2Frestore";

fn invoices_restore() -> crate::crd::ArchiveRestore {
    crate::builders::tests::restore_fixture("restore-s3-at-position")
}

async fn restore_reconcile(
    now: Timestamp,
    r: &crate::crd::ArchiveRestore,
    script: Vec<Expect>,
) -> (Vec<Value>, kube::runtime::controller::Action) {
    restore_reconcile_probed(now, r, script, Arc::default()).await
}

/// [`restore_reconcile`] with the pods' HTTP answers of `prober`.
async fn restore_reconcile_probed(
    now: Timestamp,
    r: &crate::crd::ArchiveRestore,
    script: Vec<Expect>,
    prober: Arc<FakeProber>,
) -> (Vec<Value>, kube::runtime::controller::Action) {
    let (ctx, handle, clock) = context(prober);
    *clock.locked() = now;
    let mut full = restore_references();
    full.extend(script);
    let server = tokio::spawn(serve(handle, full));
    let action = crate::restore::reconcile::reconcile(Arc::new(r.clone()), ctx)
        .await
        .unwrap();
    (server.await.unwrap(), action)
}

fn restore_with_status(
    r: &crate::crd::ArchiveRestore,
    status: &Value,
) -> crate::crd::ArchiveRestore {
    let mut r = r.clone();
    r.status = Some(serde_json::from_value(status.clone()).unwrap());
    r
}

fn restore_pod(run: &str, exit: i32, message: &str) -> Value {
    json!({"metadata": {"name": format!("invoices-yesterday-{run}-x"), "namespace": "data"},
        "status": {"containerStatuses": [{"name": "restore", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": exit, "message": message, "finishedAt": "2027-01-15T08:02:00Z"}}}]}})
}

/// The run's Job read and its pods listed.
fn restore_observed(run: &str, job_condition: &str, pods: Vec<Value>) -> Vec<Expect> {
    let job = json!({"metadata": {"name": format!("invoices-yesterday-{run}"), "namespace": "data"},
        "status": {"conditions": [{"type": job_condition, "status": "True"}]}});
    vec![
        expect(
            Method::GET,
            &format!("/apis/batch/v1/namespaces/data/jobs/invoices-yesterday-{run}"),
            Some(job),
        ),
        expect(
            Method::GET,
            &format!(
                "/api/v1/namespaces/data/pods?&labelSelector=larch.dev%2Farchive-restore%3Dinvoices-yesterday%2Clarch.dev%2Frun%3D{run}"
            ),
            owned_pods(RESTORE_UID, pods),
        ),
    ]
}

/// An ArchiveRestore creates its Job once (Reconciling, `RestoreStarted`), then reads the
/// pod's summary into status when the Job completes (Ready, rows per table, position,
/// duration, `RestoreSucceeded`); a new run-requested token runs it again.
#[tokio::test]
async fn an_archive_restore_runs_its_job_to_completion_and_reruns_by_annotation() {
    let r = invoices_restore();
    let run = crate::restore::build::run_id(&r, None);
    let job_path =
        format!("/apis/batch/v1/namespaces/data/jobs/invoices-yesterday-{run}?{MANAGER_RESTORE_Q}");
    let object = serde_json::to_value(&r).unwrap();
    let (bodies, _) = restore_reconcile(
        t(0),
        &r,
        vec![
            expect_read(&job_path, None),
            expect(Method::PATCH, &job_path, None),
            expect_status(RESTORE_STATUS, object.clone()),
            expect(Method::POST, EVENTS_POST, None),
        ],
    )
    .await;
    let job = &bodies[1];
    assert_eq!(
        job["metadata"]["ownerReferences"][0]["kind"],
        "ArchiveRestore"
    );
    let args = job["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap();
    let args: Vec<&str> = args.iter().map(|a| a.as_str().unwrap()).collect();
    assert_eq!(args[..2], ["restore", "--request"]);
    let request = larch_contract::restore_request::RestoreRequest::from_json(args[2]).unwrap();
    assert_eq!(request.at.as_deref(), Some("0/16B3748"), "{args:?}");
    let st = &bodies[2]["status"];
    assert_eq!(st["run"]["id"], run.as_str());
    assert_eq!(cond(st, "Reconciling")["status"], "True");
    assert_eq!(cond(st, "Ready")["status"], "False");
    assert_eq!(cond(st, "Stalled")["status"], "False");
    assert_eq!(bodies[3]["reason"], "RestoreStarted");

    // The Job completed; its pod's termination message is the summary.
    let running = restore_with_status(&r, st);
    let summary = r#"{"position":"0/16B3748","at":"0/16B3748","tables":[{"table":"sales.invoices","rows":42,"position":"0/16B0000","archived_at":"2027-01-15T07:00:00Z","action":"created"}],"duration_seconds":1.5}"#;
    let mut script = restore_observed(&run, "Complete", vec![restore_pod(&run, 0, summary)]);
    script.extend([
        expect_status(RESTORE_STATUS, object.clone()),
        expect(Method::POST, EVENTS_POST, None),
    ]);
    let (bodies, _) = restore_reconcile(t(3), &running, script).await;
    let st = &bodies[2]["status"];
    assert_eq!(st["run"]["succeeded"], true);
    assert_eq!(st["run"]["completionTime"], "2027-01-15T08:03:00Z");
    assert_eq!(st["position"], "0/16B3748");
    assert_eq!(st["durationSeconds"], 1.5);
    assert_eq!(st["tables"][0]["table"], "sales.invoices");
    assert_eq!(st["tables"][0]["rows"], 42);
    assert_eq!(st["tables"][0]["position"], "0/16B0000");
    assert_eq!(cond(st, "Ready")["status"], "True");
    assert_eq!(cond(st, "Reconciling")["status"], "False");
    assert!(
        cond(st, "Ready")["message"]
            .as_str()
            .unwrap()
            .contains("sales.invoices 42 rows"),
        "{st}"
    );
    assert_eq!(bodies[3]["reason"], "RestoreSucceeded");

    // Done: later reconciles only read what the spec names.
    let done = restore_with_status(&r, st);
    let (bodies, _) = restore_reconcile(t(10), &done, vec![]).await;
    assert!(bodies.is_empty());

    // A new token: a new run and a new Job.
    let mut again = done.clone();
    again.metadata.annotations = Some(
        [(
            crate::crd::archive_restore::RUN_REQUESTED_ANNOTATION.to_string(),
            "2027-01-16".to_string(),
        )]
        .into(),
    );
    let rerun = crate::restore::build::run_id(&again, Some("2027-01-16"));
    assert_ne!(rerun, run);
    let job_path = format!(
        "/apis/batch/v1/namespaces/data/jobs/invoices-yesterday-{rerun}?{MANAGER_RESTORE_Q}"
    );
    let (bodies, _) = restore_reconcile(
        t(11),
        &again,
        vec![
            expect_read(&job_path, None),
            expect(Method::PATCH, &job_path, None),
            expect_status(RESTORE_STATUS, object),
            expect(Method::POST, EVENTS_POST, None),
        ],
    )
    .await;
    let st = &bodies[2]["status"];
    assert_eq!(st["run"]["id"], rerun.as_str());
    assert_eq!(st["run"]["token"], "2027-01-16");
    assert_eq!(cond(st, "Reconciling")["status"], "True");
    assert_eq!(bodies[3]["reason"], "RestoreStarted");
}

/// A restore whose pod fails for good (an existing table with `ifExists: Fail`) stalls with
/// the pod's reason and message, and one `RestoreFailed` Warning.
#[tokio::test]
async fn a_failed_restore_stalls_with_the_pods_reason() {
    let r = invoices_restore();
    let run = crate::restore::build::run_id(&r, None);
    let running = restore_with_status(
        &r,
        &json!({"run": {"id": run, "startTime": "2027-01-15T08:00:00Z"}}),
    );
    let failure = r#"{"reason":"InvalidConfig","error":"table sales.invoices already exists in the target database (--if-exists fail): nothing was restored"}"#;
    let mut script = restore_observed(&run, "Failed", vec![restore_pod(&run, 2, failure)]);
    script.extend([
        expect_status(RESTORE_STATUS, serde_json::to_value(&r).unwrap()),
        expect(Method::POST, EVENTS_POST, None),
    ]);
    let (bodies, _) = restore_reconcile(t(2), &running, script).await;
    let st = &bodies[2]["status"];
    assert_eq!(st["run"]["succeeded"], false);
    assert_eq!(cond(st, "Stalled")["status"], "True");
    assert_eq!(cond(st, "Stalled")["reason"], "InvalidConfig");
    assert_eq!(cond(st, "Ready")["status"], "False");
    let message = cond(st, "Stalled")["message"].as_str().unwrap();
    assert!(
        message.contains("table sales.invoices already exists"),
        "{message}"
    );
    assert_eq!(
        (&bodies[3]["type"], &bodies[3]["reason"]),
        (&json!("Warning"), &json!("RestoreFailed"))
    );
}

/// A restore whose database is not there yet (no such database) never fails for it: the
/// failed attempt's Job is deleted, the run stays in progress with `DatabaseUnavailable`
/// (credentials masked), the next attempt's Job is created after the backoff, and its
/// success ends the wait.
#[tokio::test]
async fn a_restore_waits_for_its_database_and_recovers_by_itself() {
    let r = invoices_restore();
    let run = crate::restore::build::run_id(&r, None);
    let object = serde_json::to_value(&r).unwrap();
    let running = restore_with_status(
        &r,
        &json!({"run": {"id": run, "startTime": "2027-01-15T08:00:00Z"}}),
    );
    let failure = r#"{"reason":"DatabaseNotFound","error":"connecting to postgresql://app:hunter2@db/app: database \"app\" does not exist"}"#;
    let mut script = restore_observed(&run, "Failed", vec![restore_pod(&run, 2, failure)]);
    script.extend([
        expect(
            Method::DELETE,
            &format!("/apis/batch/v1/namespaces/data/jobs/invoices-yesterday-{run}?"),
            Some(json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 200})),
        ),
        expect_status(RESTORE_STATUS, object.clone()),
        expect(Method::POST, EVENTS_POST, None),
    ]);
    let (bodies, action) = restore_reconcile(t(2), &running, script).await;
    let st = &bodies[3]["status"];
    assert!(st["run"]["succeeded"].is_null(), "the run goes on: {st}");
    assert_eq!(st["databaseWait"]["attempts"], 1);
    assert_eq!(st["databaseWait"]["reason"], "DatabaseNotFound");
    assert_eq!(
        st["databaseWait"]["nextAttemptTime"],
        "2027-01-15T08:02:15Z"
    );
    assert_eq!(cond(st, "Ready")["reason"], "DatabaseUnavailable");
    assert_eq!(cond(st, "Reconciling")["status"], "True");
    assert_eq!(cond(st, "Stalled")["status"], "False");
    let message = cond(st, "Ready")["message"].as_str().unwrap();
    assert!(message.contains("does not exist"), "{message}");
    assert!(!format!("{st}{}", bodies[4]).contains("hunter2"), "{st}");
    assert_eq!(bodies[4]["reason"], "DatabaseUnavailable");
    assert_eq!(
        action,
        kube::runtime::controller::Action::requeue(Duration::from_secs(15))
    );

    // Before the backoff ends: nothing is created, the wait is reported as it was.
    let waiting = restore_with_status(&r, st);
    let retry_job = format!("invoices-yesterday-{run}-1");
    let job_read = expect(
        Method::GET,
        &format!("/apis/batch/v1/namespaces/data/jobs/{retry_job}"),
        not_found(),
    );
    let (bodies, action) = restore_reconcile(
        t(2) + jiff::SignedDuration::from_secs(5),
        &waiting,
        vec![job_read],
    )
    .await;
    assert_eq!(bodies.len(), 1, "no write while waiting");
    assert_eq!(
        action,
        kube::runtime::controller::Action::requeue(Duration::from_secs(10))
    );

    // The backoff is over: the next attempt's Job.
    let path = format!("/apis/batch/v1/namespaces/data/jobs/{retry_job}?{MANAGER_RESTORE_Q}");
    let (bodies, _) = restore_reconcile(
        t(3),
        &waiting,
        vec![
            expect(
                Method::GET,
                &format!("/apis/batch/v1/namespaces/data/jobs/{retry_job}"),
                not_found(),
            ),
            expect_read(&path, None),
            expect(Method::PATCH, &path, None),
        ],
    )
    .await;
    assert_eq!(bodies[2]["metadata"]["name"], retry_job.as_str());

    // That attempt succeeds: the wait ends, the run is recorded.
    let summary = r#"{"position":"0/16B3748","at":"0/16B3748","tables":[{"table":"sales.invoices","rows":42,"position":"0/16B0000","archived_at":"2027-01-15T07:00:00Z","action":"replaced"}],"duration_seconds":1.5}"#;
    let job = json!({"metadata": {"name": retry_job, "namespace": "data"},
        "status": {"conditions": [{"type": "Complete", "status": "True"}]}});
    let script = vec![
        expect(
            Method::GET,
            &format!("/apis/batch/v1/namespaces/data/jobs/{retry_job}"),
            Some(job),
        ),
        expect(
            Method::GET,
            &format!(
                "/api/v1/namespaces/data/pods?&labelSelector=larch.dev%2Farchive-restore%3Dinvoices-yesterday%2Clarch.dev%2Frun%3D{run}"
            ),
            owned_pods(RESTORE_UID, vec![restore_pod(&run, 0, summary)]),
        ),
        expect_status(RESTORE_STATUS, object),
        expect(Method::POST, EVENTS_POST, None),
    ];
    let (bodies, _) = restore_reconcile(t(4), &waiting, script).await;
    let st = &bodies[2]["status"];
    assert_eq!(st["run"]["succeeded"], true);
    assert!(st["databaseWait"].is_null(), "{st}");
    assert_eq!(cond(st, "Ready")["status"], "True");
    assert_eq!(bodies[3]["reason"], "RestoreSucceeded");
}

/// A restore pod's `/status` while it copies: `rows` of `total` at 5 000 rows/s.
fn restoring(rows: u64, total: u64) -> String {
    let rate = 5_000.0;
    json!({"state": "RESTORING", "tables": [], "progress": {
        "operation": "restore", "subject": "sales.invoices", "rows": rows, "bytes": rows * 50,
        "total_rows": total, "percent": rows as f64 * 100.0 / total as f64,
        "rows_per_second": rate, "bytes_per_second": rate * 50.0,
        "eta_seconds": (total - rows) as f64 / rate, "elapsed_seconds": rows as f64 / rate,
        "started_at": "2027-01-15T08:00:05Z", "done": false}})
    .to_string()
}

/// While its Job runs, an ArchiveRestore's `status.progress` is its pod's `/status` (phase
/// `Restoring`, rows against the snapshots' row counts, rate, ETA), read every 10 s; once the
/// Job completed, `Complete` with the summary's rows.
#[tokio::test]
async fn a_running_restore_shows_its_pods_progress_then_complete() {
    let r = invoices_restore();
    let run = crate::restore::build::run_id(&r, None);
    let running = restore_with_status(
        &r,
        &json!({"run": {"id": run, "startTime": "2027-01-15T08:00:00Z"}}),
    );
    let pod = json!({"metadata": {"name": format!("invoices-yesterday-{run}-x"), "namespace": "data"},
        "status": {"phase": "Running", "podIP": "10.0.0.7", "containerStatuses": [{"name": "restore",
            "image": "i", "imageID": "", "ready": true, "restartCount": 0,
            "state": {"running": {"startedAt": "2027-01-15T08:00:05Z"}}}]}});
    let prober = Arc::new(FakeProber::default());
    prober.set("10.0.0.7", "/status", &restoring(10_000, 40_000));
    let object = serde_json::to_value(&r).unwrap();
    let mut script = restore_observed(&run, "Unknown", vec![pod.clone()]);
    script.push(expect_status(RESTORE_STATUS, object.clone()));
    let (bodies, action) = restore_reconcile_probed(t(1), &running, script, prober.clone()).await;
    let st = &bodies[2]["status"];
    let p = &st["progress"];
    assert_eq!(p["phase"], "Restoring", "{st}");
    assert_eq!(
        (&p["rows"], &p["expectedRows"]),
        (&json!(10_000), &json!(40_000))
    );
    assert_eq!(p["percent"], "25%");
    assert_eq!(
        (&p["rowsPerSecond"], &p["etaSeconds"]),
        (&json!(5_000), &json!(6))
    );
    assert_eq!(p["bytes"], 500_000);
    assert_eq!(p["pods"], 1);
    assert_eq!(p["updatedTime"], "2027-01-15T08:01:00Z");
    assert_eq!(
        action,
        kube::runtime::controller::Action::requeue(Duration::from_secs(10))
    );

    // The Job completed: the summary's rows, whatever the last read said.
    let copying = restore_with_status(&r, st);
    let summary = r#"{"position":"0/16B3748","at":"0/16B3748","tables":[{"table":"sales.invoices","rows":40012,"position":"0/16B0000","archived_at":"2027-01-15T07:00:00Z","action":"created"}],"duration_seconds":8.0}"#;
    let mut script = restore_observed(&run, "Complete", vec![restore_pod(&run, 0, summary)]);
    script.extend([
        expect_status(RESTORE_STATUS, object),
        expect(Method::POST, EVENTS_POST, None),
    ]);
    let (bodies, _) = restore_reconcile(t(2), &copying, script).await;
    let p = &bodies[2]["status"]["progress"];
    assert_eq!(p["phase"], "Complete", "{p}");
    assert_eq!(
        (&p["rows"], &p["percent"]),
        (&json!(40_012), &json!("100%"))
    );
    assert_eq!(p["etaSeconds"], 0);
}
