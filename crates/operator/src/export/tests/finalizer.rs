//! Issue 13: the finalizer, the deletion's cleanup Job and the suspended export's kept slot.

use std::sync::Arc;
use std::time::Duration;

use http::Method;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::controller::Action;
use serde_json::{Value, json};

use crate::builders::tests::export_fixture;
use crate::crd::ArchiveExport;
use crate::export::reconcile as export;
use crate::reconcile::tests::harness::*;

const CLEANUP_JOB_UID: &str = "cleanup-job-uid";
/// The export's finalizer merge patch: named, not forced (a compare-and-swap on resourceVersion).
const FINALIZER_Q: &str = "&fieldManager=larch-operator%2Fexport";

const SEL: &str = "labelSelector=larch.dev%2Farchive-export%3Devents";
const EXPORT: &str = "/apis/larch.dev/v1alpha1/namespaces/data/archiveexports/events";
const JOB: &str = "/apis/batch/v1/namespaces/data/jobs/events-cleanup";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/data/events?";

fn deleting() -> ArchiveExport {
    let mut e = export_fixture("export-continuous-s3");
    e.metadata.deletion_timestamp = Some(Time(t(0)));
    e.metadata.resource_version = Some("7".into());
    e
}

fn ok_status() -> Option<Value> {
    Some(json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "metadata": {}}))
}

fn not_found() -> Option<Value> {
    Some(
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "metadata": {}}),
    )
}

/// Reconciles `e` against `script`: the request bodies and the action.
async fn reconcile_with(e: ArchiveExport, script: Vec<Expect>) -> (Vec<Value>, Action) {
    let (ctx, handle, _) = context(Arc::default());
    let server = tokio::spawn(serve(handle, script));
    let action = export::reconcile(Arc::new(e), ctx).await.unwrap();
    (server.await.unwrap(), action)
}

/// The deletion path reads the object itself first (the cache may lag a finished cleanup).
fn live(e: &ArchiveExport) -> Expect {
    expect(Method::GET, EXPORT, Some(serde_json::to_value(e).unwrap()))
}

/// The live read, then the workloads are deleted and listed again until no export pod is
/// left.
fn stop_workloads(pods: Vec<Value>, deployments: Vec<Value>) -> Vec<Expect> {
    let mut s = vec![
        live(&deleting()),
        expect(
            Method::GET,
            &format!("/apis/apps/v1/namespaces/data/deployments?&{SEL}"),
            list("DeploymentList", "apps/v1", deployments.clone()),
        ),
    ];
    for d in &deployments {
        s.push(expect(
            Method::DELETE,
            &format!(
                "/apis/apps/v1/namespaces/data/deployments/{}?",
                d["metadata"]["name"].as_str().unwrap()
            ),
            ok_status(),
        ));
    }
    s.extend([
            expect(
                Method::GET,
                &format!("/apis/batch/v1/namespaces/data/cronjobs?&{SEL}"),
                list("CronJobList", "batch/v1", vec![]),
            ),
            expect(
                Method::GET,
                &format!(
                    "/apis/batch/v1/namespaces/data/jobs?&{SEL}%2Capp.kubernetes.io%2Fcomponent%3Dexport"
                ),
                list("JobList", "batch/v1", vec![]),
            ),
            expect(
                Method::GET,
                &format!("/api/v1/namespaces/data/pods?&{SEL}"),
                list("PodList", "v1", pods),
            ),
        ]);
    s
}

fn cleanup_pod(exit: i32, message: &str) -> Value {
    json!({"metadata": {"name": "events-cleanup-x", "namespace": "data",
                "labels": {"app.kubernetes.io/component": "cleanup"}},
            "status": {"phase": if exit == 0 { "Succeeded" } else { "Failed" },
                "containerStatuses": [{"name": "cleanup", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": exit, "message": message, "finishedAt": "2027-01-15T08:00:30Z"}}}]}})
}

fn cleanup_pods(pod: Value) -> Expect {
    expect(
        Method::GET,
        &format!("/api/v1/namespaces/data/pods?&{SEL}%2Capp.kubernetes.io%2Fcomponent%3Dcleanup"),
        owned_pods(CLEANUP_JOB_UID, vec![pod]),
    )
}

#[tokio::test]
async fn a_live_export_gets_the_finalizer_and_retain_removes_it() {
    let mut e = export_fixture("export-continuous-s3");
    e.metadata.finalizers = Some(vec!["other.example/keep".into()]);
    e.metadata.resource_version = Some("5".into());
    let script = vec![expect_status(
        &format!("{EXPORT}?{FINALIZER_Q}"),
        serde_json::to_value(&e).unwrap(),
    )];
    let (bodies, _) = reconcile_with(e.clone(), script).await;
    assert_eq!(
        bodies[0],
        json!({"metadata": {"finalizers": ["other.example/keep", "larch.dev/cleanup"], "resourceVersion": "5"}})
    );

    e.metadata.finalizers = Some(vec!["larch.dev/cleanup".into()]);
    e.spec.source.deletion_policy = Some(crate::crd::archive_export::DeletionPolicy::Retain);
    let script = vec![expect_status(
        &format!("{EXPORT}?{FINALIZER_Q}"),
        serde_json::to_value(&e).unwrap(),
    )];
    let (bodies, _) = reconcile_with(e, script).await;
    assert_eq!(bodies[0]["metadata"]["finalizers"], json!([]));
}

#[tokio::test]
async fn deleting_stops_the_writer_before_the_cleanup_job() {
    let writer = json!({"metadata": {"name": "events", "namespace": "data"}, "spec": {"selector": {}, "template": {}}});
    let running = json!({"metadata": {"name": "events-abc", "namespace": "data",
            "labels": {"app.kubernetes.io/component": "export"}}, "status": {"phase": "Running"}});
    let script = stop_workloads(vec![running], vec![writer]);
    let (_, action) = reconcile_with(deleting(), script).await;
    assert_eq!(action, Action::requeue(Duration::from_secs(2)));
}

#[tokio::test]
async fn the_cleanup_job_runs_with_the_exports_secret_and_no_owner() {
    let mut script = stop_workloads(vec![], vec![]);
    script.extend([
        expect(Method::GET, JOB, not_found()),
        expect(Method::POST, "/apis/batch/v1/namespaces/data/jobs?", None),
        expect_status(
            &format!("{EXPORT}/status?{MANAGER_EXPORT_Q}"),
            serde_json::to_value(deleting()).unwrap(),
        ),
    ]);
    let n = script.len();
    let (bodies, _) = reconcile_with(deleting(), script).await;
    let job = &bodies[n - 2];
    assert!(job["metadata"]["ownerReferences"].is_null());
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(pod["volumes"][0]["secret"]["secretName"], "pg-source");
    assert_eq!(pod["serviceAccountName"], "exporter");
    let args = pod["containers"][0]["args"].as_array().unwrap();
    assert_eq!(args[..2], [json!("export"), json!("cleanup")]);
    let slot = crate::export::build::export_slot_name("data", "events", None);
    assert!(args.contains(&json!(slot)), "{args:?}");
    assert!(
        args.contains(&json!("archiveexport/data/events")),
        "{args:?}"
    );
    let st = &bodies[n - 1]["status"];
    assert_eq!(st["cleanup"]["attempts"], 1);
    assert_eq!(cond(st, "Ready")["reason"], "Deleting");
    assert!(
        cond(st, "Ready")["message"]
            .as_str()
            .unwrap()
            .contains(&format!(
                "dropping replication slot {slot} and publication {slot}"
            ))
    );
}

#[tokio::test]
async fn a_failed_cleanup_is_reported_and_retried_with_backoff() {
    let mut e = deleting();
    e.status = Some(crate::crd::archive_export::ArchiveExportStatus {
        cleanup: Some(crate::crd::archive_export::CleanupStatus {
            attempts: 2,
            ..Default::default()
        }),
        ..Default::default()
    });
    let failed = json!({"metadata": {"name": "events-cleanup", "namespace": "data", "uid": CLEANUP_JOB_UID},
            "status": {"conditions": [{"type": "Failed", "status": "True"}]}});
    let error = r#"{"error":"cannot connect to PostgreSQL at 127.0.0.1:5432/app as user postgres: Connection refused (os error 111) (is the server running and reachable?)"}"#;
    let mut script = stop_workloads(vec![cleanup_pod(1, error)], vec![]);
    script[0] = live(&e);
    script.extend([
        expect(Method::GET, JOB, Some(failed)),
        cleanup_pods(cleanup_pod(1, error)),
        expect(Method::POST, EVENTS, None),
        expect_status(
            &format!("{EXPORT}/status?{MANAGER_EXPORT_Q}"),
            serde_json::to_value(&e).unwrap(),
        ),
        expect(Method::DELETE, &format!("{JOB}?"), ok_status()),
    ]);
    let n = script.len();
    let (bodies, action) = reconcile_with(e, script).await;
    assert_eq!(action, Action::requeue(Duration::from_secs(20)));
    let event = &bodies[n - 3];
    assert_eq!(event["reason"], "CleanupFailed");
    let note = event["note"].as_str().unwrap();
    assert!(
        note.contains("Connection refused") && note.contains("larch.dev/skip-cleanup=true"),
        "{note}"
    );
    let st = &bodies[n - 2]["status"];
    assert_eq!(cond(st, "Ready")["reason"], "CleanupFailed");
    assert_eq!(cond(st, "Reconciling")["status"], "True");
    assert!(
        st["cleanup"]["lastError"]
            .as_str()
            .unwrap()
            .contains("Connection refused")
    );
    assert_eq!(st["cleanup"]["nextAttemptTime"], "2027-01-15T08:00:20Z");
}

#[tokio::test]
async fn a_successful_cleanup_lets_the_export_go() {
    let done = json!({"metadata": {"name": "events-cleanup", "namespace": "data", "uid": CLEANUP_JOB_UID},
            "status": {"conditions": [{"type": "Complete", "status": "True"}]}});
    let report = r#"{"server":"db","objects":[{"kind":"slot","name":"larch_data_events","outcome":"dropped"},{"kind":"publication","name":"larch_data_events","outcome":"dropped"}]}"#;
    let mut script = stop_workloads(vec![cleanup_pod(0, report)], vec![]);
    script.extend([
        expect(Method::GET, JOB, Some(done)),
        cleanup_pods(cleanup_pod(0, report)),
        expect(Method::POST, EVENTS, None),
        // The finalizer before the Job: a refused patch retries with the Job still there.
        expect_status(
            &format!("{EXPORT}?{FINALIZER_Q}"),
            serde_json::to_value(deleting()).unwrap(),
        ),
        expect(Method::DELETE, &format!("{JOB}?"), ok_status()),
    ]);
    let n = script.len();
    let (bodies, _) = reconcile_with(deleting(), script).await;
    assert_eq!(bodies[n - 3]["reason"], "CleanupSucceeded");
    assert!(
        bodies[n - 3]["note"]
            .as_str()
            .unwrap()
            .contains("slot larch_data_events, publication larch_data_events")
    );
    assert_eq!(
        bodies[n - 2],
        json!({"metadata": {"finalizers": [], "resourceVersion": "7"}})
    );
}

/// A reconcile from a cache that has not seen the finalizer go (the cleanup already ran):
/// the live object has no finalizer, so no second cleanup Job.
#[tokio::test]
async fn a_stale_cache_does_not_start_a_second_cleanup() {
    let mut gone = deleting();
    gone.metadata.finalizers = Some(vec![]);
    let (bodies, action) = reconcile_with(deleting(), vec![live(&gone)]).await;
    assert_eq!(bodies.len(), 1);
    assert_eq!(action, Action::await_change());
    let (_, action) =
        reconcile_with(deleting(), vec![expect(Method::GET, EXPORT, not_found())]).await;
    assert_eq!(action, Action::await_change());
}

/// The CleanupSucceeded Event is what the user sees of a cleanup: when the API server does
/// not take it (busy, a timeout), the Job and the finalizer stay and the next reconcile
/// publishes it again, instead of the object going without it (e2e s13 once saw no Event).
#[tokio::test]
async fn a_cleanup_event_the_server_refuses_holds_the_export_until_it_is_published() {
    let done = json!({"metadata": {"name": "events-cleanup", "namespace": "data", "uid": CLEANUP_JOB_UID},
            "status": {"conditions": [{"type": "Complete", "status": "True"}]}});
    let report = r#"{"server":"db","objects":[{"kind":"slot","name":"larch_data_events","outcome":"dropped"}]}"#;
    let busy = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": "ServiceUnavailable", "code": 503, "message": "the server is currently unable to handle the request"});
    let mut script = stop_workloads(vec![cleanup_pod(0, report)], vec![]);
    script.extend([
        expect(Method::GET, JOB, Some(done)),
        cleanup_pods(cleanup_pod(0, report)),
        expect(Method::POST, EVENTS, Some(busy)),
    ]);
    let (ctx, handle, _) = context(Arc::default());
    let server = tokio::spawn(serve(handle, script));
    let err = export::reconcile(Arc::new(deleting()), ctx)
        .await
        .expect_err("the reconcile fails, to be retried");
    assert_eq!(err.label(), "Cleanup", "{err}");
    // No Job delete, no finalizer patch: serve() fails on any further request.
    let bodies = server.await.unwrap();
    assert_eq!(bodies.last().unwrap()["reason"], "CleanupSucceeded");
}

/// Kubernetes admits no pod in a terminating namespace: the finalizer goes (the namespace
/// must not stay terminating forever) and the slot stays.
#[tokio::test]
async fn a_terminating_namespace_lets_the_export_go() {
    let forbidden = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
            "message": "jobs \"events-cleanup\" is forbidden: unable to create new content in namespace data because it is being terminated",
            "metadata": {}});
    let mut script = stop_workloads(vec![], vec![]);
    script.extend([
        expect(Method::GET, JOB, not_found()),
        expect(
            Method::POST,
            "/apis/batch/v1/namespaces/data/jobs?",
            Some(forbidden),
        ),
        expect_status(
            &format!("{EXPORT}?{FINALIZER_Q}"),
            serde_json::to_value(deleting()).unwrap(),
        ),
    ]);
    let n = script.len();
    let (bodies, _) = reconcile_with(deleting(), script).await;
    assert_eq!(bodies[n - 1]["metadata"]["finalizers"], json!([]));
}

#[tokio::test]
async fn the_skip_annotation_gives_up_and_leaves_the_slot() {
    let mut e = deleting();
    e.metadata.annotations =
        Some([("larch.dev/skip-cleanup".to_string(), "true".to_string())].into());
    let script = vec![
        live(&e),
        expect(Method::DELETE, &format!("{JOB}?"), not_found()),
        expect(Method::POST, EVENTS, None),
        expect_status(
            &format!("{EXPORT}?{FINALIZER_Q}"),
            serde_json::to_value(&e).unwrap(),
        ),
    ];
    let (bodies, _) = reconcile_with(e, script).await;
    assert_eq!(bodies[2]["reason"], "CleanupSkipped");
    assert!(
        bodies[2]["note"]
            .as_str()
            .unwrap()
            .contains("replication slot larch_data_events")
    );
    assert_eq!(bodies[3]["metadata"]["finalizers"], json!([]));
}
