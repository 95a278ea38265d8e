//! The ArchiveExport controller against a scripted API server: runs, writers, progress, failures.

use larch_core::locks::MutexExt;
use std::sync::Arc;
use std::time::Duration;

use http::Method;
use serde_json::{Value, json};

use crate::builders::tests::export_fixture;
use crate::crd::ArchiveExport;
use crate::export::reconcile as export;
use crate::reconcile::context::Context;
use crate::reconcile::tests::harness::*;

/// `script` after the dereference reads of the `users` export, all present.
fn with_users_references(script: Vec<Expect>) -> Vec<Expect> {
    let mut out = users_references(true);
    out.extend(script);
    out
}

const ONESHOT_UID: &str = "6b1f0c7e-0000-4000-8000-000000000001";

fn users_export() -> ArchiveExport {
    let mut e = export_fixture("export-oneshot-s3");
    e.metadata.annotations = None; // no run-requested token
    e.status = None;
    e
}

#[tokio::test]
async fn oneshot_export_creates_its_job_once_and_records_the_run() {
    let (ctx, handle, now) = context(Arc::default());
    let e = users_export();
    let run = crate::export::build::run_id(&e, None);
    let job_path = format!("/apis/batch/v1/namespaces/data/jobs/users-{run}?{MANAGER_EXPORT_Q}");
    let status_path = format!(
        "/apis/larch.dev/v1alpha1/namespaces/data/archiveexports/users/status?{MANAGER_EXPORT_Q}"
    );

    // 1. First reconcile: what it names is there; the Job is applied, stale kinds pruned, the
    //    run recorded, an Event sent.
    let mut script = users_references(true);
    script.extend([
        expect_read(&job_path, None),
        expect(Method::PATCH, &job_path, None),
        expect(
            Method::GET,
            &format!("/apis/batch/v1/namespaces/data/cronjobs?&{EXPORT_SEL}"),
            list("CronJobList", "batch/v1", vec![]),
        ),
        expect(
            Method::GET,
            &format!("/apis/apps/v1/namespaces/data/deployments?&{EXPORT_SEL}"),
            list(
                "DeploymentList",
                "apps/v1",
                vec![
                    // A Deployment left over from Continuous mode is deleted.
                    json!({"metadata": {"name": "users", "namespace": "data"}, "spec": {"selector": {}, "template": {}}}),
                ],
            ),
        ),
        expect(
            Method::DELETE,
            "/apis/apps/v1/namespaces/data/deployments/users?",
            Some(
                json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "metadata": {}}),
            ),
        ),
    ]);
    // Leaving Continuous mode: the Lease, its Role and binding and the exporter's service
    // account are pruned too (none left here).
    script.extend(lease_prune_lists(vec![]));
    script.extend([
        expect(
            Method::GET,
            &format!("/api/v1/namespaces/data/pods?&{EXPORT_SEL}"),
            list("PodList", "v1", vec![]),
        ),
        expect_status(&status_path, serde_json::to_value(&e).unwrap()),
        expect(
            Method::POST,
            "/apis/events.k8s.io/v1/namespaces/data/events?",
            None,
        ),
    ]);
    let server = tokio::spawn(serve(handle, script));
    export::reconcile(Arc::new(e.clone()), ctx.clone())
        .await
        .unwrap();
    let bodies = server.await.unwrap();
    let job = &bodies[1];
    assert_eq!(
        (job["apiVersion"].as_str(), job["kind"].as_str()),
        (Some("batch/v1"), Some("Job"))
    );
    assert_eq!(
        job["metadata"]["ownerReferences"][0]["kind"],
        "ArchiveExport"
    );
    assert_eq!(
        job["spec"]["template"]["spec"]["containers"][0]["args"][0],
        "export"
    );
    let status = &bodies[10];
    assert_eq!(status["apiVersion"], "larch.dev/v1alpha1");
    assert_eq!(status["kind"], "ArchiveExport");
    let st = &status["status"];
    assert_eq!(st["run"]["id"], run.as_str());
    assert_eq!(st["run"]["startTime"], "2027-01-15T08:00:00Z");
    assert_eq!(cond(st, "Reconciling")["status"], "True");
    assert_eq!(cond(st, "Ready")["status"], "False");
    assert_eq!(cond(st, "LastExportSucceeded")["status"], "Unknown");
    assert_eq!(st["observedGeneration"], 1);
    assert_eq!(cond(st, "Ready")["observedGeneration"], 1);
    assert_eq!(bodies[11]["reason"], "ExportStarted");

    // 2. The Job completed and its pod wrote the summary: the run is recorded as succeeded.
    *now.locked() = t(3);
    let mut e2 = e.clone();
    e2.status = Some(serde_json::from_value(st.clone()).unwrap());
    let (ctx2, handle2, _) = {
        let (c, h, n) = context(Arc::default());
        *n.locked() = t(3);
        (c, h, n)
    };
    let summary = r#"{"key_prefix": "team-a/public.users/", "position": "0/016B3748", "row_count": 3, "table": "public.users", "epoch": 2}"#;
    let pod = json!({"metadata": {"name": format!("users-{run}-x"), "namespace": "data", "annotations": {"larch.dev/table": "public.users"}},
        "status": {"containerStatuses": [{"name": "larch", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 0, "message": summary, "finishedAt": "2027-01-15T08:02:00Z"}}}]}});
    let done_job = json!({"metadata": {"name": format!("users-{run}"), "namespace": "data"},
        "status": {"conditions": [{"type": "Complete", "status": "True"}]}});
    let script = with_users_references(vec![
        expect(
            Method::GET,
            &format!("/apis/batch/v1/namespaces/data/cronjobs?&{EXPORT_SEL}"),
            list("CronJobList", "batch/v1", vec![]),
        ),
        expect(
            Method::GET,
            &format!("/apis/apps/v1/namespaces/data/deployments?&{EXPORT_SEL}"),
            list("DeploymentList", "apps/v1", vec![]),
        ),
        expect(
            Method::GET,
            &format!("/apis/batch/v1/namespaces/data/jobs?&{EXPORT_SEL}%2Clarch.dev%2Frun%3D{run}"),
            list("JobList", "batch/v1", vec![done_job]),
        ),
        expect(
            Method::GET,
            &format!("/api/v1/namespaces/data/pods?&{EXPORT_SEL}"),
            owned_pods(ONESHOT_UID, vec![pod]),
        ),
        expect_status(&status_path, serde_json::to_value(&e2).unwrap()),
        expect(
            Method::POST,
            "/apis/events.k8s.io/v1/namespaces/data/events?",
            None,
        ),
    ]);
    let server = tokio::spawn(serve(handle2, script));
    export::reconcile(Arc::new(e2.clone()), ctx2).await.unwrap();
    let bodies = server.await.unwrap();
    let st = &bodies[4]["status"];
    assert_eq!(st["run"]["succeeded"], true);
    assert_eq!(st["run"]["completionTime"], "2027-01-15T08:03:00Z");
    assert_eq!(st["lastExport"]["position"], "0/016B3748");
    assert_eq!(st["lastExport"]["rowCount"], 3);
    assert_eq!(st["lastExport"]["epoch"], 2);
    assert_eq!(st["lastExport"]["time"], "2027-01-15T08:02:00Z");
    assert_eq!(cond(st, "Ready")["status"], "True");
    assert_eq!(cond(st, "LastExportSucceeded")["status"], "True");
    assert_eq!(bodies[5]["reason"], "ExportSucceeded");

    // 3. Later the Job and its pod are gone (TTL): nothing is re-created, status is unchanged,
    //    so there is no status write either.
    let mut e3 = e.clone();
    e3.status = Some(serde_json::from_value(st.clone()).unwrap());
    let (ctx3, handle3, n3) = context(Arc::default());
    *n3.locked() = t(600);
    let script = with_users_references(vec![
        expect(
            Method::GET,
            &format!("/apis/batch/v1/namespaces/data/cronjobs?&{EXPORT_SEL}"),
            list("CronJobList", "batch/v1", vec![]),
        ),
        expect(
            Method::GET,
            &format!("/apis/apps/v1/namespaces/data/deployments?&{EXPORT_SEL}"),
            list("DeploymentList", "apps/v1", vec![]),
        ),
        expect(
            Method::GET,
            &format!("/api/v1/namespaces/data/pods?&{EXPORT_SEL}"),
            list("PodList", "v1", vec![]),
        ),
    ]);
    let server = tokio::spawn(serve(handle3, script));
    export::reconcile(Arc::new(e3.clone()), ctx3).await.unwrap();
    server.await.unwrap();

    // 4. A new run-requested token starts a new run with a new Job.
    let mut e4 = e3.clone();
    e4.metadata.annotations =
        Some([("larch.dev/run-requested".to_string(), "again".to_string())].into());
    let run2 = crate::export::build::run_id(&e4, Some("again"));
    assert_ne!(run2, run);
    let (ctx4, handle4, _) = context(Arc::default());
    let job2_path = format!("/apis/batch/v1/namespaces/data/jobs/users-{run2}?{MANAGER_EXPORT_Q}");
    let script = with_users_references(vec![
        expect_read(&job2_path, None),
        expect(Method::PATCH, &job2_path, None),
        expect(
            Method::GET,
            &format!("/apis/batch/v1/namespaces/data/cronjobs?&{EXPORT_SEL}"),
            list("CronJobList", "batch/v1", vec![]),
        ),
        expect(
            Method::GET,
            &format!("/apis/apps/v1/namespaces/data/deployments?&{EXPORT_SEL}"),
            list("DeploymentList", "apps/v1", vec![]),
        ),
        expect(
            Method::GET,
            &format!("/api/v1/namespaces/data/pods?&{EXPORT_SEL}"),
            list("PodList", "v1", vec![]),
        ),
        expect_status(&status_path, serde_json::to_value(&e4).unwrap()),
        expect(
            Method::POST,
            "/apis/events.k8s.io/v1/namespaces/data/events?",
            None,
        ),
    ]);
    let server = tokio::spawn(serve(handle4, script));
    export::reconcile(Arc::new(e4.clone()), ctx4).await.unwrap();
    let bodies = server.await.unwrap();
    assert_eq!(bodies[5]["status"]["run"]["token"], "again");
    assert_eq!(
        bodies[5]["status"]["lastExport"]["position"], "0/016B3748",
        "the last export is kept"
    );
}

/// What the `events` export names: its DSN and the CA bundle of its database.
fn events_references() -> Vec<Expect> {
    vec![
        secret_get("pg-source", Some(&["dsn"])),
        config_map_get("pg-ca", &["ca.crt"]),
    ]
}

/// What a reconcile of the `events` continuous export asks after its applies: the prune lists
/// (its own Deployment and Lease kept), then its pods.
fn continuous_lists(dep: &Value, leases: Vec<Value>) -> Vec<Expect> {
    let sel = "labelSelector=larch.dev%2Farchive-export%3Devents";
    vec![
        expect(
            Method::GET,
            &format!("/apis/batch/v1/namespaces/data/cronjobs?&{sel}"),
            list("CronJobList", "batch/v1", vec![]),
        ),
        expect(
            Method::GET,
            &format!("/apis/apps/v1/namespaces/data/deployments?&{sel}"),
            list("DeploymentList", "apps/v1", vec![dep.clone()]),
        ),
        expect(
            Method::GET,
            &format!("/apis/coordination.k8s.io/v1/namespaces/data/leases?&{sel}"),
            list("LeaseList", "coordination.k8s.io/v1", leases),
        ),
    ]
}

fn continuous_tail() -> Vec<Expect> {
    continuous_tail_with(vec![
        json!({"metadata": {"name": "events-abc", "namespace": "data"}, "status": {"podIP": "10.0.0.9"}}),
    ])
}

#[tokio::test]
async fn continuous_export_applies_its_deployment_and_reads_the_writer_status() {
    let prober = Arc::new(FakeProber::default());
    prober.set(
        "10.0.0.9",
        "/status",
        r#"{"table":"public.events","epoch":3,"head_position":"0/2A","buffer_depth":5,"last_snapshot_at":"2027-01-15T07:59:00Z"}"#,
    );
    let (ctx, handle, _) = context(prober.clone());
    let e = export_fixture("export-continuous-s3");
    let mut dep = serde_json::to_value(crate::export::build::deployment(
        &e,
        &e.spec.source.all_tables()[0],
        &crate::builders::tests::ctx(),
    ))
    .unwrap();
    dep["status"] = json!({"availableReplicas": 1, "readyReplicas": 1, "replicas": 1});
    let role = format!(
        "/apis/rbac.authorization.k8s.io/v1/namespaces/data/roles/events-export-lease?{MANAGER_EXPORT_Q}"
    );
    let binding = format!(
        "/apis/rbac.authorization.k8s.io/v1/namespaces/data/rolebindings/events-export-lease?{MANAGER_EXPORT_Q}"
    );
    let lease =
        format!("/apis/coordination.k8s.io/v1/namespaces/data/leases/events?{MANAGER_EXPORT_Q}");
    let deployment = format!("/apis/apps/v1/namespaces/data/deployments/events?{MANAGER_EXPORT_Q}");
    let status_path = format!(
        "/apis/larch.dev/v1alpha1/namespaces/data/archiveexports/events/status?{MANAGER_EXPORT_Q}"
    );
    let mut script = events_references();
    script.extend([
        // The exporter's Lease access first: Role, RoleBinding, Lease (the spec names the
        // service account, so none is created). Each is read, then applied (none exists).
        expect_read(&role, None),
        expect(Method::PATCH, &role, None),
        expect_read(&binding, None),
        expect(Method::PATCH, &binding, None),
        expect_read(&lease, None),
        expect(Method::PATCH, &lease, None),
        expect_read(&deployment, None),
        expect(Method::PATCH, &deployment, Some(dep.clone())),
    ]);
    // A Lease of a table no longer exported is pruned; its own are kept.
    script.extend(continuous_lists(
        &dep,
        vec![
            json!({"metadata": {"name": "events", "namespace": "data"}}),
            json!({"metadata": {"name": "events-stale", "namespace": "data"}}),
        ],
    ));
    script.push(expect(
        Method::DELETE,
        "/apis/coordination.k8s.io/v1/namespaces/data/leases/events-stale?",
        Some(json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "metadata": {}})),
    ));
    script.extend(continuous_tail());
    script.push(expect_status(
        &status_path,
        serde_json::to_value(&e).unwrap(),
    ));
    let server = tokio::spawn(serve(handle, script));
    export::reconcile(Arc::new(e.clone()), ctx.clone())
        .await
        .unwrap();
    let bodies = server.await.unwrap();
    let role_body = &bodies[1];
    assert_eq!(role_body["rules"][0]["resourceNames"], json!(["events"]));
    assert_eq!(role_body["rules"][0]["verbs"], json!(["get", "update"]));
    assert_eq!(bodies[3]["subjects"][0]["name"], "exporter");
    assert_eq!(bodies[5]["metadata"]["name"], "events");
    let pod = &bodies[7]["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "exporter");
    assert_eq!(pod["automountServiceAccountToken"], true);
    let args = pod["containers"][0]["args"].as_array().unwrap();
    assert_eq!(args[..2], [json!("export"), json!("--request")]);
    let request =
        larch_contract::export_request::ExportRequest::from_json(args[2].as_str().unwrap())
            .unwrap();
    assert_eq!(request.lease.as_deref(), Some("events"));
    assert_eq!(bodies[7]["spec"]["strategy"]["type"], "Recreate");
    assert_eq!(bodies[7]["spec"]["replicas"], 1);
    let st = &bodies[16]["status"];
    assert_eq!(st["writers"][0]["headPosition"], "0/2A");
    assert_eq!(st["writers"][0]["bufferDepth"], 5);
    assert_eq!(st["lastExport"]["position"], "0/2A");
    assert_eq!(st["lastExport"]["time"], "2027-01-15T07:59:00Z");
    assert_eq!(cond(st, "Ready")["status"], "True");
    assert_eq!(cond(st, "Ready")["reason"], "Running");
    assert_eq!(cond(st, "LastExportSucceeded")["status"], "True");
    assert!(st.get("run").is_none(), "Continuous exports have no runs");
    assert_eq!(writes(&ctx), 6, "4 applies, 1 delete, the status");

    // The next reconcile finds every child as applied (each carries its hash) and the same
    // writer status: reads only, no write request.
    let mut applied_dep = bodies[7].clone();
    applied_dep["status"] = dep["status"].clone();
    let mut e2 = e.clone();
    e2.status = Some(serde_json::from_value(st.clone()).unwrap());
    let (ctx2, handle2) = same_operator(&ctx, prober);
    let mut script = events_references();
    script.extend([
        expect_read(&role, Some(bodies[1].clone())),
        expect_read(&binding, Some(bodies[3].clone())),
        expect_read(&lease, Some(bodies[5].clone())),
        expect_read(&deployment, Some(applied_dep.clone())),
    ]);
    script.extend(continuous_lists(
        &applied_dep,
        vec![json!({"metadata": {"name": "events", "namespace": "data"}})],
    ));
    script.extend(continuous_tail());
    let server = tokio::spawn(serve(handle2, script));
    export::reconcile(Arc::new(e2), ctx2.clone()).await.unwrap();
    server.await.unwrap();
    assert_eq!(writes(&ctx2), 6, "no write request in the second reconcile");
}

// ---- Failures on the custom resource (issue 24) ----

const USERS_STATUS: &str = "/apis/larch.dev/v1alpha1/namespaces/data/archiveexports/users/status?&force=true&fieldManager=larch-operator%2Fexport";

/// A reconcile of `e` against `script`: the request bodies and the action.
async fn export_reconcile(
    ctx: &Arc<Context>,
    handle: Handle,
    e: &ArchiveExport,
    script: Vec<Expect>,
) -> (Vec<Value>, kube::runtime::controller::Action) {
    let server = tokio::spawn(serve(handle, script));
    let action = export::reconcile(Arc::new(e.clone()), ctx.clone())
        .await
        .unwrap();
    (server.await.unwrap(), action)
}

fn with_status(e: &ArchiveExport, status: &Value) -> ArchiveExport {
    let mut e = e.clone();
    e.status = Some(serde_json::from_value(status.clone()).unwrap());
    e
}

/// A Secret the spec names is missing: nothing is built, `Stalled=True SecretNotFound` names
/// the Secret and the field, one Warning Event; it is looked at again after 10 s, and while
/// nothing changes those reconciles only read. Then the Secret without the key.
#[tokio::test]
async fn a_missing_secret_stalls_the_export_and_nothing_is_built() {
    let (ctx, handle, _) = context(Arc::default());
    let e = users_export();
    let script = vec![
        secret_get("pg-source", None),
        expect_status(USERS_STATUS, serde_json::to_value(&e).unwrap()),
        expect(Method::POST, EVENTS_POST, None),
    ];
    let (bodies, action) = export_reconcile(&ctx, handle, &e, script).await;
    let st = &bodies[0]["status"];
    assert_eq!(cond(st, "Stalled")["status"], "True");
    assert_eq!(cond(st, "Stalled")["reason"], "SecretNotFound");
    assert_eq!(cond(st, "Reconciling")["status"], "False");
    assert_eq!(cond(st, "Ready")["reason"], "SecretNotFound");
    let msg = cond(st, "Stalled")["message"].as_str().unwrap();
    assert!(
        msg.starts_with(
            "Secret data/pg-source (named in spec.source.connectionSecretRef) does not exist"
        ),
        "{msg}"
    );
    assert!(st.get("run").is_none(), "no run started");
    assert_eq!(
        (&bodies[1]["type"], &bodies[1]["reason"], &bodies[1]["note"]),
        (&json!("Warning"), &json!("SecretNotFound"), &json!(msg))
    );
    assert_eq!(
        action,
        kube::runtime::controller::Action::requeue(Duration::from_secs(10))
    );

    let stalled = with_status(&e, st);
    let (ctx2, handle2) = same_operator(&ctx, Arc::default());
    export_reconcile(
        &ctx2,
        handle2,
        &stalled,
        vec![secret_get("pg-source", None)],
    )
    .await;
    assert_eq!(
        writes(&ctx2),
        2,
        "unchanged and failing: no write since the first"
    );

    // The Secret appears without the key the spec names.
    let (ctx3, handle3) = same_operator(&ctx, Arc::default());
    let script = vec![
        secret_get("pg-source", Some(&["password"])),
        expect_status(USERS_STATUS, serde_json::to_value(&stalled).unwrap()),
        expect(Method::POST, EVENTS_POST, None),
    ];
    let (bodies, _) = export_reconcile(&ctx3, handle3, &stalled, script).await;
    let st = &bodies[0]["status"];
    assert_eq!(cond(st, "Stalled")["reason"], "SecretKeyNotFound");
    assert!(
        cond(st, "Stalled")["message"]
            .as_str()
            .unwrap()
            .starts_with("Secret data/pg-source has no key \"dsn\" (named in spec.source.connectionSecretRef)")
    );
    assert_eq!(
        bodies[1]["reason"], "SecretKeyNotFound",
        "a new reason, a new Event"
    );
}

/// What the API server cannot check is checked before building: a schedule Kubernetes'
/// CronJob parser refuses stalls the export (`InvalidSpec`, the field and robfig's words), and
/// no CronJob is sent.
#[tokio::test]
async fn an_invalid_schedule_stalls_before_any_cronjob_is_sent() {
    let (ctx, handle, _) = context(Arc::default());
    let mut e = users_export();
    e.spec.schedule = Some(serde_json::from_value(json!({"cron": "61 25 * * *"})).unwrap());
    let mut script = users_references(true);
    script.extend([
        expect_status(USERS_STATUS, serde_json::to_value(&e).unwrap()),
        expect(Method::POST, EVENTS_POST, None),
    ]);
    let (bodies, _) = export_reconcile(&ctx, handle, &e, script).await;
    let st = &bodies[0]["status"];
    assert_eq!(cond(st, "Stalled")["reason"], "InvalidSpec");
    assert_eq!(
        cond(st, "Stalled")["message"],
        "spec.schedule.cron \"61 25 * * *\" is not a valid schedule: end of range (61) above maximum (59): 61"
    );
}

/// A child the API server refuses becomes `Stalled=True ChildRejected` with the server's
/// message; the same child is not sent again (no write while nothing changes).
#[tokio::test]
async fn a_child_the_api_server_refuses_is_a_condition_with_its_message() {
    let (ctx, handle, _) = context(Arc::default());
    let mut e = users_export();
    e.spec.schedule = Some(
        serde_json::from_value(json!({"cron": "0 2 * * *", "timeZone": "Mars/Olympus"})).unwrap(),
    );
    let cron = format!("/apis/batch/v1/namespaces/data/cronjobs/users?{MANAGER_EXPORT_Q}");
    let refused = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "reason": "Invalid", "code": 422,
        "message": "CronJob.batch \"users\" is invalid: spec.timeZone: Invalid value: \"Mars/Olympus\": unknown time zone Mars/Olympus"});
    let mut script = users_references(true);
    script.extend([
        expect_read(&cron, None),
        expect(Method::PATCH, &cron, Some(refused)),
        expect_status(USERS_STATUS, serde_json::to_value(&e).unwrap()),
        expect(Method::POST, EVENTS_POST, None),
    ]);
    let (bodies, action) = export_reconcile(&ctx, handle, &e, script).await;
    let st = &bodies[2]["status"];
    assert_eq!(cond(st, "Stalled")["reason"], "ChildRejected");
    assert_eq!(
        cond(st, "Stalled")["message"],
        "the API server refused CronJob users: CronJob.batch \"users\" is invalid: spec.timeZone: Invalid value: \"Mars/Olympus\": unknown time zone Mars/Olympus"
    );
    assert_eq!(bodies[3]["reason"], "ChildRejected");
    assert_eq!(
        action,
        kube::runtime::controller::Action::requeue(Duration::from_secs(60))
    );
    // The next reconcile reads, does not send the refused CronJob again, writes nothing.
    let (ctx2, handle2) = same_operator(&ctx, Arc::default());
    let mut script = users_references(true);
    script.push(expect_read(&cron, None));
    export_reconcile(&ctx2, handle2, &with_status(&e, st), script).await;
    assert_eq!(
        writes(&ctx2),
        3,
        "the apply, the status and the Event of the first reconcile"
    );
}

/// A writer crash-looping on a missing table: `Stalled=True TableNotFound` (kstatus Failed)
/// with the termination message, `Degraded=True`, a Warning Event; a writer failing to
/// connect is `Degraded` and still `Reconciling` (kstatus InProgress).
#[tokio::test]
async fn a_crash_looping_writer_reports_its_reason_on_the_export() {
    let e = &export_fixture("export-continuous-s3");
    let writer = |message: &str, code: i32| {
        json!({"metadata": {"name": "events-7d4f-x", "namespace": "data"},
            "status": {"containerStatuses": [{"name": "larch", "image": "i", "imageID": "", "ready": false, "restartCount": 4,
                "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
                "lastState": {"terminated": {"exitCode": code, "message": message, "finishedAt": "2027-01-15T07:59:00Z"}}}]}})
    };
    let run = |pod: Value| async move {
        let (ctx, handle, _) = context(Arc::default());
        let mut dep = serde_json::to_value(crate::export::build::deployment(
            e,
            &e.spec.source.all_tables()[0],
            &crate::builders::tests::ctx(),
        ))
        .unwrap();
        dep["status"] = json!({"replicas": 1, "unavailableReplicas": 1});
        let mut script = events_references();
        for path in [
            format!(
                "/apis/rbac.authorization.k8s.io/v1/namespaces/data/roles/events-export-lease?{MANAGER_EXPORT_Q}"
            ),
            format!(
                "/apis/rbac.authorization.k8s.io/v1/namespaces/data/rolebindings/events-export-lease?{MANAGER_EXPORT_Q}"
            ),
            format!(
                "/apis/coordination.k8s.io/v1/namespaces/data/leases/events?{MANAGER_EXPORT_Q}"
            ),
        ] {
            script.push(expect_read(&path, None));
            script.push(expect(Method::PATCH, &path, None));
        }
        let deployment =
            format!("/apis/apps/v1/namespaces/data/deployments/events?{MANAGER_EXPORT_Q}");
        script.push(expect_read(&deployment, None));
        script.push(expect(Method::PATCH, &deployment, Some(dep.clone())));
        script.extend(continuous_lists(
            &dep,
            vec![json!({"metadata": {"name": "events", "namespace": "data"}})],
        ));
        script.extend(continuous_tail_with(vec![pod]));
        script.push(expect_status(
            "/apis/larch.dev/v1alpha1/namespaces/data/archiveexports/events/status?&force=true&fieldManager=larch-operator%2Fexport",
            serde_json::to_value(e).unwrap(),
        ));
        script.push(expect(Method::POST, EVENTS_POST, None));
        let (bodies, _) = export_reconcile(&ctx, handle, e, script).await;
        let n = bodies.len();
        (bodies[n - 2]["status"].clone(), bodies[n - 1].clone())
    };
    let (st, event) = run(writer(
        r#"{"reason":"TableNotFound","error":"table public.events does not exist"}"#,
        2,
    ))
    .await;
    assert_eq!(cond(&st, "Stalled")["status"], "True");
    assert_eq!(cond(&st, "Stalled")["reason"], "TableNotFound");
    assert_eq!(cond(&st, "Reconciling")["status"], "False");
    assert_eq!(cond(&st, "Degraded")["reason"], "TableNotFound");
    assert_eq!(
        cond(&st, "Stalled")["message"],
        "writer pod events-7d4f-x: exited with status 2: table public.events does not exist"
    );
    assert_eq!(
        (&event["type"], &event["reason"]),
        (&json!("Warning"), &json!("TableNotFound"))
    );
    let (st, event) = run(writer(
        r#"{"reason":"ConnectionFailed","error":"cannot connect to PostgreSQL at db:5432/app as user u: Connection refused (os error 111) (is the server running and reachable?)"}"#,
        1,
    ))
    .await;
    assert_eq!(cond(&st, "Stalled")["status"], "False");
    assert_eq!(cond(&st, "Reconciling")["status"], "True");
    assert_eq!(cond(&st, "Reconciling")["reason"], "ConnectionFailed");
    assert_eq!(cond(&st, "Degraded")["status"], "True");
    assert_eq!(event["reason"], "ConnectionFailed");
}

/// The prune lists of a OneShot export's later rounds: its CronJobs and Deployments (none).
/// The prune lists of the `users` export's Lease access: its Leases (`leases` kept), then
/// the RoleBindings, Roles and ServiceAccounts (none).
fn lease_prune_lists(leases: Vec<Value>) -> Vec<Expect> {
    vec![
        expect(
            Method::GET,
            &format!("/apis/coordination.k8s.io/v1/namespaces/data/leases?&{EXPORT_SEL}"),
            list("LeaseList", "coordination.k8s.io/v1", leases),
        ),
        expect(
            Method::GET,
            &format!(
                "/apis/rbac.authorization.k8s.io/v1/namespaces/data/rolebindings?&{EXPORT_SEL}"
            ),
            list("RoleBindingList", "rbac.authorization.k8s.io/v1", vec![]),
        ),
        expect(
            Method::GET,
            &format!("/apis/rbac.authorization.k8s.io/v1/namespaces/data/roles?&{EXPORT_SEL}"),
            list("RoleList", "rbac.authorization.k8s.io/v1", vec![]),
        ),
        expect(
            Method::GET,
            &format!("/api/v1/namespaces/data/serviceaccounts?&{EXPORT_SEL}"),
            list("ServiceAccountList", "v1", vec![]),
        ),
    ]
}

fn oneshot_prune_lists() -> Vec<Expect> {
    vec![
        expect(
            Method::GET,
            &format!("/apis/batch/v1/namespaces/data/cronjobs?&{EXPORT_SEL}"),
            list("CronJobList", "batch/v1", vec![]),
        ),
        expect(
            Method::GET,
            &format!("/apis/apps/v1/namespaces/data/deployments?&{EXPORT_SEL}"),
            list("DeploymentList", "apps/v1", vec![]),
        ),
    ]
}

/// The `/status` a one-shot exporter serves while it copies: `rows` of `total` after `secs`.
fn copying(rows: u64, total: u64, secs: f64) -> String {
    let r = larch_core::progress::ProgressReport {
        operation: "baseline".into(),
        subject: "public.users".into(),
        ..larch_core::progress::compute(rows, rows * 50, Some(total), Duration::from_secs_f64(secs))
    };
    json!({"table": "public.users", "state": "BASELINE", "epoch": 0, "progress": r}).to_string()
}

/// A OneShot run's pod copying: its `/status` progress reaches `status.progress` (phase,
/// rows of the estimate, rate, ETA, percent), the reconcile comes back in 10 s; an unchanged
/// report writes nothing; once the Job completed, the run's progress is `Complete` with the
/// summary's rows, and the usual interval is back.
#[tokio::test]
async fn a_running_export_reports_its_progress_and_requeues_until_it_completes() {
    use kube::runtime::controller::Action;
    let e = users_export();
    let run = crate::export::build::run_id(&e, None);
    let status_path = format!(
        "/apis/larch.dev/v1alpha1/namespaces/data/archiveexports/users/status?{MANAGER_EXPORT_Q}"
    );
    let recorded = json!({"run": {"id": run, "startTime": "2027-01-15T08:00:00Z"}});
    let pod = |state: Value| {
        json!({"metadata": {"name": format!("users-{run}-x"), "namespace": "data", "labels": {"larch.dev/run": run}},
            "status": {"phase": if state.get("running").is_some() { "Running" } else { "Succeeded" }, "podIP": "10.0.0.9",
                "containerStatuses": [{"name": "larch", "image": "i", "imageID": "", "ready": true, "restartCount": 0, "state": state}]}})
    };
    let running = pod(json!({"running": {"startedAt": "2027-01-15T08:00:05Z"}}));
    let round = |job: Value, pod: Value, write: bool| {
        let mut lists = oneshot_prune_lists();
        lists.push(expect(
            Method::GET,
            &format!("/apis/batch/v1/namespaces/data/jobs?&{EXPORT_SEL}%2Clarch.dev%2Frun%3D{run}"),
            list("JobList", "batch/v1", vec![job]),
        ));
        lists.push(expect(
            Method::GET,
            &format!("/api/v1/namespaces/data/pods?&{EXPORT_SEL}"),
            owned_pods(ONESHOT_UID, vec![pod]),
        ));
        let mut script = with_users_references(lists);
        if write {
            script.push(expect_status(
                &status_path,
                serde_json::to_value(&e).unwrap(),
            ));
        }
        script
    };
    let active_job = json!({"metadata": {"name": format!("users-{run}"), "namespace": "data"}, "status": {"active": 1}});

    // 1. 120 000 of ~200 000 rows after 10 s.
    let prober = Arc::new(FakeProber::default());
    prober.set("10.0.0.9", "/status", &copying(120_000, 200_000, 10.0));
    let (ctx, handle, _) = context(prober.clone());
    let e1 = with_status(&e, &recorded);
    let script = round(active_job.clone(), running.clone(), true);
    let (bodies, action) = export_reconcile(&ctx, handle, &e1, script).await;
    let st = &bodies.last().unwrap()["status"];
    assert_eq!(
        st["progress"],
        json!({"phase": "Copying", "rows": 120_000, "expectedRows": 200_000, "bytes": 6_000_000,
               "rowsPerSecond": 12_000, "etaSeconds": 7, "percent": "60%", "pods": 1,
               "updatedTime": "2027-01-15T08:00:00Z"})
    );
    assert_eq!(action, Action::requeue(Duration::from_secs(10)));

    // 2. Asked again with the same figures: nothing to write, still every 10 s.
    let e2 = with_status(&e, st);
    let (ctx2, handle2, now2) = context(prober.clone());
    *now2.locked() = t(1);
    let script = round(active_job.clone(), running.clone(), false);
    let (_, action) = export_reconcile(&ctx2, handle2, &e2, script).await;
    assert_eq!(action, Action::requeue(Duration::from_secs(10)));

    // 3. Further on: the rows and the time move.
    prober.set("10.0.0.9", "/status", &copying(180_000, 200_000, 15.0));
    let (ctx3, handle3, now3) = context(prober.clone());
    *now3.locked() = t(2);
    let script = round(active_job, running, true);
    let (bodies, _) = export_reconcile(&ctx3, handle3, &e2, script).await;
    let st = &bodies.last().unwrap()["status"];
    assert_eq!(st["progress"]["rows"], 180_000);
    assert_eq!(st["progress"]["percent"], "90%");
    assert_eq!(st["progress"]["updatedTime"], "2027-01-15T08:02:00Z");

    // 4. The Job completed, its pod wrote the summary (200 123 rows: the estimate was low).
    let summary = r#"{"key_prefix": "team-a/public.users/", "position": "0/016B3748", "row_count": 200123, "table": "public.users", "epoch": 1}"#;
    let done = pod(
        json!({"terminated": {"exitCode": 0, "message": summary, "finishedAt": "2027-01-15T08:02:30Z"}}),
    );
    let done_job = json!({"metadata": {"name": format!("users-{run}"), "namespace": "data"},
        "status": {"conditions": [{"type": "Complete", "status": "True"}]}});
    let e4 = with_status(&e, st);
    let (ctx4, handle4, now4) = context(prober.clone());
    *now4.locked() = t(3);
    let mut script = round(done_job, done, true);
    script.push(expect(Method::POST, EVENTS_POST, None));
    let (bodies, action) = export_reconcile(&ctx4, handle4, &e4, script).await;
    let st = &bodies[bodies.len() - 2]["status"];
    assert_eq!(st["run"]["succeeded"], true);
    assert_eq!(
        st["progress"],
        json!({"phase": "Complete", "rows": 200_123, "expectedRows": 200_000, "bytes": 9_000_000,
               "etaSeconds": 0, "percent": "100%", "pods": 1, "updatedTime": "2027-01-15T08:03:00Z"})
    );
    assert_eq!(
        action,
        Action::requeue(Duration::from_secs(60)),
        "no pod running: the run's interval"
    );
}

/// A split across pods whose workers Job failed (worker 1's retries exhausted) while the
/// coordinator still waits: the run fails at once, naming the worker and its reason, the
/// coordinator is stopped (its deadline set to 1 s), and `status.split` counts the workers.
#[tokio::test]
async fn a_failed_split_worker_fails_the_run_and_stops_the_coordinator() {
    let (ctx, handle, now) = context(Arc::default());
    *now.locked() = t(5);
    let mut e = users_export();
    e.spec.split = Some(crate::crd::archive_export::ExportSplit {
        ranges: 4,
        workers: Some(2),
    });
    let run = crate::export::build::run_id(&e, None);
    e.status = Some(crate::crd::archive_export::ArchiveExportStatus {
        run: Some(crate::crd::archive_export::RunStatus {
            id: run.clone(),
            start_time: Some("2027-01-15T08:00:00Z".into()),
            ..Default::default()
        }),
        ..Default::default()
    });
    let status_path = format!(
        "/apis/larch.dev/v1alpha1/namespaces/data/archiveexports/users/status?{MANAGER_EXPORT_Q}"
    );
    let coordinator = json!({"metadata": {"name": format!("users-{run}"), "namespace": "data"}, "status": {"active": 1}});
    let workers = json!({"metadata": {"name": format!("users-{run}-workers"), "namespace": "data"},
        "status": {"completedIndexes": "0", "failedIndexes": "1",
                   "conditions": [{"type": "Failed", "status": "True"}]}});
    let failure = r#"{"reason":"ConnectionFailed","error":"connection to the source refused"}"#;
    let worker_pod = json!({"metadata": {"name": format!("users-{run}-workers-1-abcde"), "namespace": "data",
            "labels": {"larch.dev/run": run},
            "annotations": {"batch.kubernetes.io/job-completion-index": "1"}},
        "status": {"containerStatuses": [{"name": "worker", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 1, "message": failure, "finishedAt": "2027-01-15T08:04:00Z"}}}]}});
    // The coordinator's Lease access first (its account, Role, RoleBinding, Lease), each read
    // then applied; the prune lists then keep them.
    let mut script = Vec::new();
    for path in [
        "/api/v1/namespaces/data/serviceaccounts/users-exporter",
        "/apis/rbac.authorization.k8s.io/v1/namespaces/data/roles/users-export-lease",
        "/apis/rbac.authorization.k8s.io/v1/namespaces/data/rolebindings/users-export-lease",
        "/apis/coordination.k8s.io/v1/namespaces/data/leases/users",
    ] {
        let path = format!("{path}?{MANAGER_EXPORT_Q}");
        script.push(expect_read(&path, None));
        script.push(expect(Method::PATCH, &path, None));
    }
    script.extend([
        expect(
            Method::GET,
            &format!("/apis/batch/v1/namespaces/data/cronjobs?&{EXPORT_SEL}"),
            list("CronJobList", "batch/v1", vec![]),
        ),
        expect(
            Method::GET,
            &format!("/apis/apps/v1/namespaces/data/deployments?&{EXPORT_SEL}"),
            list("DeploymentList", "apps/v1", vec![]),
        ),
    ]);
    script.extend(lease_prune_lists(vec![
        json!({"metadata": {"name": "users", "namespace": "data"}}),
    ]));
    script.extend([
        expect(
            Method::GET,
            &format!("/apis/batch/v1/namespaces/data/jobs?&{EXPORT_SEL}%2Clarch.dev%2Frun%3D{run}"),
            list("JobList", "batch/v1", vec![coordinator, workers]),
        ),
        expect(
            Method::PATCH,
            &format!(
                "/apis/batch/v1/namespaces/data/jobs/users-{run}?&fieldManager=larch-operator%2Fexport"
            ),
            None,
        ),
        expect(
            Method::GET,
            &format!("/api/v1/namespaces/data/pods?&{EXPORT_SEL}"),
            owned_pods(ONESHOT_UID, vec![worker_pod]),
        ),
        expect_status(&status_path, serde_json::to_value(&e).unwrap()),
        expect(
            Method::POST,
            "/apis/events.k8s.io/v1/namespaces/data/events?",
            None,
        ),
        expect(
            Method::POST,
            "/apis/events.k8s.io/v1/namespaces/data/events?",
            None,
        ),
    ]);
    let script = with_users_references(script);
    let server = tokio::spawn(serve(handle, script));
    export::reconcile(Arc::new(e), ctx).await.unwrap();
    let bodies = server.await.unwrap();
    let role = &bodies[3];
    assert_eq!(role["rules"][0]["resourceNames"], json!(["users"]));
    assert_eq!(bodies[5]["subjects"][0]["name"], "users-exporter");
    // Past the Lease access and its prune lists.
    let bodies = &bodies[12..];
    assert_eq!(bodies[3], json!({"spec": {"activeDeadlineSeconds": 1}}));
    let st = &bodies[5]["status"];
    assert_eq!(st["run"]["succeeded"], false, "{st}");
    assert_eq!(
        st["split"],
        json!({"ranges": 4, "workers": 2, "workersSucceeded": 1, "failedIndexes": "1"})
    );
    let ready = cond(st, "Ready");
    assert_eq!(ready["status"], "False");
    assert_eq!(ready["reason"], "ConnectionFailed", "{ready}");
    let message = ready["message"].as_str().unwrap();
    assert!(
        message.contains(&format!(
            "split worker 1 (of 2) pod users-{run}-workers-1-abcde"
        )) && message.contains("connection to the source refused"),
        "{message}"
    );
    assert_eq!(cond(st, "LastExportSucceeded")["status"], "False");
    assert_eq!(bodies[6]["reason"], "ExportFailed");
}
