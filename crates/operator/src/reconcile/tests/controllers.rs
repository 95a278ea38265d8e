//! Controller scenarios against a mocked API server (tower-test `mock::pair`, as in kube-rs
//! controller-rs): each scenario lists the exact requests a reconcile must make, in order —
//! server-side apply PATCHes of children with the controller's fieldManager, list calls, the
//! status apply and Events — answers them, and fails on any other request.

use larch_core::locks::MutexExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Request, Response};
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
use kube::Client;
use kube::client::Body;
use kube::core::{ObjectMeta, PartialObjectMeta, PartialObjectMetaExt};
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use prometheus::core::Collector;
use serde_json::{Value, json};

use crate::builders::tests::{export_fixture, source_fixture};
use crate::crd::{ArchiveExport, ArchiveSource};
use crate::export::reconcile as export;
use crate::metrics::Metrics;
use crate::reconcile::context::{CacheWriters, Context};
use crate::reconcile::probe::Prober;
use crate::source::reconcile as source;
use crate::source_set::reconcile as source_set;

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// One expected request: method, path (with query), and the JSON answer. `None` answers by
/// echoing the request body (as the API server does for apply and create).
struct Expect {
    method: Method,
    path: String,
    answer: Option<Value>,
    /// Object the echoed body is merged into (status applies answer with the whole object).
    base: Option<Value>,
    /// Whether `serve` returns its (empty) body: the dereference reads are left out, so the
    /// bodies of the requests after them keep their places.
    record: bool,
}

fn expect_status(path: &str, object: Value) -> Expect {
    Expect {
        method: Method::PATCH,
        path: path.into(),
        answer: None,
        base: Some(object),
        record: true,
    }
}

fn expect(method: Method, path: &str, answer: Option<Value>) -> Expect {
    Expect {
        method,
        path: path.into(),
        answer,
        base: None,
        record: true,
    }
}

/// The dereference read of a Secret (`keys`: its data keys; `None`: it does not exist).
fn secret_get(name: &str, keys: Option<&[&str]>) -> Expect {
    let answer = keys.map(|keys| {
        let data: serde_json::Map<String, Value> =
            keys.iter().map(|k| (k.to_string(), json!("eA=="))).collect();
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": "data"}, "data": data})
    });
    Expect {
        record: false,
        ..expect(
            Method::GET,
            &format!("/api/v1/namespaces/data/secrets/{name}"),
            answer.or_else(not_found),
        )
    }
}

/// The dereference read of a ConfigMap holding `keys`.
fn config_map_get(name: &str, keys: &[&str]) -> Expect {
    let data: serde_json::Map<String, Value> =
        keys.iter().map(|k| (k.to_string(), json!("pem"))).collect();
    Expect {
        record: false,
        ..expect(
            Method::GET,
            &format!("/api/v1/namespaces/data/configmaps/{name}"),
            Some(
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "data"}, "data": data}),
            ),
        )
    }
}

/// `script` after the dereference reads of the `users` export, all present.
fn with_users_references(script: Vec<Expect>) -> Vec<Expect> {
    let mut out = users_references(true);
    out.extend(script);
    out
}

/// What the `users` export (and a source reading it) names: its DSN (export only), its S3
/// keys and CA bundle, all present.
fn users_references(with_dsn: bool) -> Vec<Expect> {
    let mut out = vec![];
    if with_dsn {
        out.push(secret_get("pg-source", Some(&["dsn"])));
    }
    out.push(secret_get(
        "s3-credentials",
        Some(&["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]),
    ));
    out.push(config_map_get("corp-ca", &["ca.crt"]));
    out
}

fn not_found() -> Option<Value> {
    Some(
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}),
    )
}

/// A child read before its apply; `None`: it does not exist.
fn expect_read(patch_path: &str, answer: Option<Value>) -> Expect {
    let path = patch_path.split_once('?').map_or(patch_path, |(p, _)| p);
    expect(Method::GET, path, answer.or_else(not_found))
}

/// Pods as the workloads of the custom resource `uid` make them: controlled, through their
/// owner chain, by it (here directly: `controllers::owned` has the chain's own tests).
fn owned_pods(uid: &str, mut pods: Vec<Value>) -> Option<Value> {
    for p in &mut pods {
        p["metadata"]["ownerReferences"] = json!([{"apiVersion": "larch.dev/v1alpha1",
            "kind": "Owner", "name": "owner", "uid": uid, "controller": true}]);
    }
    list("PodList", "v1", pods)
}

const ONESHOT_UID: &str = "6b1f0c7e-0000-4000-8000-000000000001";
const CONTINUOUS_UID: &str = "6b1f0c7e-0000-4000-8000-000000000003";
const SOURCE_UID: &str = "6b1f0c7e-0000-4000-8000-000000000004";
const RESTORE_UID: &str = "6b1f0c7e-0000-4000-8000-000000000011";
const CLEANUP_JOB_UID: &str = "cleanup-job-uid";

fn list(kind: &str, api_version: &str, items: Vec<Value>) -> Option<Value> {
    Some(
        json!({"apiVersion": api_version, "kind": kind, "metadata": {"resourceVersion": "1"}, "items": items}),
    )
}

/// Serves `script` in order; returns the request bodies. Panics on a request out of script.
async fn serve(mut handle: Handle, script: Vec<Expect>) -> Vec<Value> {
    let mut bodies = vec![];
    for (i, e) in script.into_iter().enumerate() {
        let (req, send) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
            .await
            .unwrap_or_else(|_| panic!("request {i} ({} {}) never came", e.method, e.path))
            .expect("client dropped");
        let path = req.uri().path_and_query().unwrap().to_string();
        assert_eq!(
            (req.method(), path.as_str()),
            (&e.method, e.path.as_str()),
            "request {i}"
        );
        let body = req.into_body().collect_bytes().await.unwrap();
        let body: Value = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&body).unwrap()
        };
        let answer = e.answer.unwrap_or_else(|| {
            // Echo, as the server does for apply and create (a status apply carries no metadata).
            let mut echo = e.base.clone().unwrap_or(json!({}));
            for (k, v) in body.as_object().cloned().unwrap_or_default() {
                echo[k] = v;
            }
            echo
        });
        if e.record {
            bodies.push(body);
        }
        let code = answer
            .get("code")
            .and_then(Value::as_u64)
            .filter(|_| answer["kind"] == "Status")
            .unwrap_or(200);
        send.send_response(
            Response::builder()
                .status(code as u16)
                .body(Body::from(serde_json::to_vec(&answer).unwrap()))
                .unwrap(),
        );
    }
    // Nothing else may be asked.
    if let Ok(Some((req, _))) =
        tokio::time::timeout(Duration::from_millis(200), handle.next_request()).await
    {
        panic!("unexpected request {} {}", req.method(), req.uri());
    }
    bodies
}

/// Canned pod HTTP answers by `ip+path`.
#[derive(Default)]
struct FakeProber(Mutex<HashMap<String, String>>);

impl FakeProber {
    fn set(&self, ip: &str, path: &str, body: &str) {
        self.0.locked().insert(format!("{ip}{path}"), body.into());
    }
}

#[async_trait::async_trait]
impl Prober for FakeProber {
    async fn get(&self, ip: &str, port: u16, path: &str) -> Result<String, String> {
        assert_eq!(port, 8080);
        assert_ne!(
            ip, IMPOSTOR_IP,
            "the operator probed a pod that only carries its labels"
        );
        // Open whatever an engine's spec.access protects, and free of row data.
        assert!(
            path == "/status" || path.starts_with("/health/"),
            "the operator reads only /status and /health/* of its pods, not {path}"
        );
        self.0
            .locked()
            .get(&format!("{ip}{path}"))
            .cloned()
            .ok_or_else(|| "refused".into())
    }
}

fn t(mins: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + mins * 60).unwrap()
}

fn context(prober: Arc<FakeProber>) -> (Arc<Context>, Handle, Arc<Mutex<Timestamp>>) {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(svc, "default");
    let mut ctx = Context::new(
        client,
        "registry.example/larch:0.1.0".into(),
        Arc::new(Metrics::default()),
        prober,
    );
    let now = Arc::new(Mutex::new(t(0)));
    let clock = now.clone();
    ctx.clock = Arc::new(move || *clock.locked());
    (Arc::new(ctx), handle, now)
}

const MANAGER_EXPORT_Q: &str = "&force=true&fieldManager=larch-operator%2Fexport";
const MANAGER_SOURCE_Q: &str = "&force=true&fieldManager=larch-operator%2Fsource";
/// The export's finalizer merge patch: named, not forced (a compare-and-swap on resourceVersion).
const FINALIZER_Q: &str = "&fieldManager=larch-operator%2Fexport";
const EXPORT_SEL: &str = "labelSelector=larch.dev%2Farchive-export%3Dusers";

fn users_export() -> ArchiveExport {
    let mut e = export_fixture("export-oneshot-s3");
    e.metadata.annotations = None; // no run-requested token
    e.status = None;
    e
}

fn cond<'a>(status: &'a Value, t: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == t)
        .unwrap()
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
        // Leaving Continuous mode: the Lease, its Role and binding and the exporter's
        // service account are pruned too (none left here).
        expect(
            Method::GET,
            &format!("/apis/coordination.k8s.io/v1/namespaces/data/leases?&{EXPORT_SEL}"),
            list("LeaseList", "coordination.k8s.io/v1", vec![]),
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

fn sts_answer(ready: i32) -> Value {
    let mut sts = serde_json::to_value(
        crate::source::build::children(
            &source_fixture("source-exportref-memory"),
            &crate::builders::engine_config::resolve(
                &source_fixture("source-exportref-memory"),
                Some(&export_fixture("export-oneshot-s3")),
            )
            .unwrap(),
            &crate::builders::tests::ctx(),
        )
        .stateful_set,
    )
    .unwrap();
    sts["metadata"]["generation"] = json!(1);
    sts["status"] = json!({"observedGeneration": 1, "replicas": 1, "readyReplicas": ready, "updatedReplicas": 1});
    sts
}

fn engine_pod() -> Value {
    json!({"metadata": {"name": "users-cache-0", "namespace": "data", "creationTimestamp": "2027-01-15T07:00:00Z"},
           "status": {"podIP": "10.0.0.7"}})
}

fn export_get() -> Expect {
    expect(
        Method::GET,
        "/apis/larch.dev/v1alpha1/namespaces/data/archiveexports/users",
        Some(serde_json::to_value(export_fixture("export-oneshot-s3")).unwrap()),
    )
}

/// A tenant's pod with the engines' labels but no owner chain to the source.
const IMPOSTOR_IP: &str = "10.0.0.66";

/// The engine and, listed with it by the label, an impostor the operator must never probe.
fn pods_list() -> Expect {
    let mut list = owned_pods(SOURCE_UID, vec![engine_pod()]).unwrap();
    list["items"].as_array_mut().unwrap().push(json!({
        "metadata": {"name": "impostor", "namespace": "data", "creationTimestamp": "2027-01-15T07:00:00Z",
            "labels": {"larch.dev/archive-source": "users-cache"}},
        "status": {"podIP": IMPOSTOR_IP}}));
    expect(
        Method::GET,
        "/api/v1/namespaces/data/pods?&labelSelector=larch.dev%2Farchive-source%3Dusers-cache",
        Some(list),
    )
}

/// The export read and what the engines mount (the export's S3 keys and CA bundle).
fn export_gets() -> Vec<Expect> {
    let mut out = vec![export_get()];
    out.extend(users_references(false));
    out
}

/// The reads of the engines' optional children (NetworkPolicy, PodDisruptionBudget), neither
/// wanted nor present: nothing to prune.
fn optional_children_absent(source: &str) -> Vec<Expect> {
    [
        format!("/apis/networking.k8s.io/v1/namespaces/data/networkpolicies/{source}"),
        format!("/apis/policy/v1/namespaces/data/poddisruptionbudgets/{source}"),
    ]
    .iter()
    .map(|path| Expect {
        record: false,
        ..expect(Method::GET, path, not_found())
    })
    .collect()
}

/// The requests of a first visit: the export read, the three children applied, the pods listed.
fn source_script(ready: i32) -> Vec<Expect> {
    let mut out = export_gets();
    out.extend([
        expect(
            Method::PATCH,
            &format!("/api/v1/namespaces/data/configmaps/users-cache-engine?{MANAGER_SOURCE_Q}"),
            None,
        ),
        expect(
            Method::PATCH,
            &format!("/api/v1/namespaces/data/services/users-cache?{MANAGER_SOURCE_Q}"),
            None,
        ),
    ]);
    out.extend(optional_children_absent("users-cache"));
    out.extend([
        expect(
            Method::PATCH,
            &format!("/apis/apps/v1/namespaces/data/statefulsets/users-cache?{MANAGER_SOURCE_Q}"),
            Some(sts_answer(ready)),
        ),
        pods_list(),
    ]);
    out
}

/// Fills a cache as its watch does: one complete list, then ready.
fn fill<K>(writer: &mut Writer<K>, objects: impl IntoIterator<Item = K>)
where
    K: kube::runtime::reflector::Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    writer.apply_watcher_event(&watcher::Event::Init);
    for o in objects {
        writer.apply_watcher_event(&watcher::Event::InitApply(o));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
}

/// The metadata of an object as a metadata-only watch delivers it.
fn meta_of<K: kube::Resource<DynamicType = ()>>(body: &Value) -> PartialObjectMeta<K> {
    serde_json::from_value::<ObjectMeta>(body["metadata"].clone())
        .unwrap()
        .into_request_partial::<K>()
}

fn writers(ctx: &Context) -> CacheWriters {
    ctx.cache_writers.locked().take().unwrap()
}

/// Write requests counted by the operator's own metric.
fn writes(ctx: &Context) -> u64 {
    ctx.metrics
        .api_writes
        .collect()
        .iter()
        .flat_map(|mf| mf.get_metric())
        .map(|m| m.get_counter().get_value() as u64)
        .sum()
}

/// A second context on a new mock connection sharing the first one's caches, trackers, metrics
/// and clock (what lives across reconciles in one operator process).
fn same_operator(ctx: &Context, prober: Arc<FakeProber>) -> (Arc<Context>, Handle) {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(svc, "default");
    let ctx2 = Arc::new(Context {
        recorder: kube::runtime::events::Recorder::new(
            client.clone(),
            "larch-operator".to_string().into(),
        ),
        client,
        build: ctx.build.clone(),
        metrics: ctx.metrics.clone(),
        prober,
        trackers: Mutex::new(ctx.trackers.locked().clone()),
        clock: ctx.clock.clone(),
        caches: ctx.caches.clone(),
        cache_writers: Mutex::new(None),
        rejected: Mutex::new(ctx.rejected.locked().clone()),
        lease_rights: ctx.lease_rights.clone(),
    });
    (ctx2, handle)
}

/// What a first visit of the `users-cache` source left: its context (empty caches filled),
/// the caches' writers, the clock, the source, its status path, the request bodies (the three
/// children applied, the status, a Ready Event) and the action.
struct FirstVisit {
    ctx: Arc<Context>,
    caches: CacheWriters,
    now: Arc<Mutex<Timestamp>>,
    s: ArchiveSource,
    status_path: String,
    bodies: Vec<Value>,
    action: kube::runtime::controller::Action,
}

async fn first_source_visit(prober: Arc<FakeProber>) -> FirstVisit {
    let (ctx, handle, now) = context(prober);
    let mut caches = writers(&ctx);
    fill(&mut caches.config_maps, []);
    fill(&mut caches.services, []);
    fill(&mut caches.stateful_sets, []);
    let s = source_fixture("source-exportref-memory");
    let status_path = format!(
        "/apis/larch.dev/v1alpha1/namespaces/data/archivesources/users-cache/status?{MANAGER_SOURCE_Q}"
    );
    let mut script = source_script(1);
    script.push(expect_status(
        &status_path,
        serde_json::to_value(&s).unwrap(),
    ));
    script.push(expect(
        Method::POST,
        "/apis/events.k8s.io/v1/namespaces/data/events?",
        None,
    ));
    let server = tokio::spawn(serve(handle, script));
    let action = source::reconcile(Arc::new(s.clone()), ctx.clone())
        .await
        .unwrap();
    let bodies = server.await.unwrap();
    FirstVisit {
        ctx,
        caches,
        now,
        s,
        status_path,
        bodies,
        action,
    }
}

/// The caches as the watches fill them with the children a first visit applied (the
/// StatefulSet with its status).
fn watches_deliver(caches: &mut CacheWriters, bodies: &[Value]) {
    let mut sts = bodies[3].clone();
    sts["status"] = sts_answer(1)["status"].clone();
    sts["metadata"]["generation"] = json!(1);
    fill(&mut caches.config_maps, [meta_of::<ConfigMap>(&bodies[1])]);
    fill(&mut caches.services, [meta_of::<Service>(&bodies[2])]);
    fill(
        &mut caches.stateful_sets,
        [serde_json::from_value::<StatefulSet>(sts).unwrap()],
    );
}

#[tokio::test]
async fn archive_source_applies_children_and_turns_rebaselines_into_conditions_and_events() {
    let prober = Arc::new(FakeProber::default());
    prober.set("10.0.0.7", "/status", r#"{"sources":{"users-cache":{"state":"following","position":"0/10","head":"0/10","epoch":2,"lag_seconds":1.0,"head_time":"2027-01-15T07:59:59Z","rebaselines":4}},"pipelines":{"users-cache/memory":{"source":"users-cache","row_count":42}}}"#);
    // First visit: children applied, status written, engines ready → a Ready event.
    let FirstVisit {
        ctx,
        mut caches,
        now,
        s,
        status_path,
        bodies,
        ..
    } = first_source_visit(prober.clone()).await;
    assert_eq!(bodies[1]["kind"], "ConfigMap");
    assert!(
        bodies[1]["data"]["engine.yaml"]
            .as_str()
            .unwrap()
            .contains("key_prefix: team-a/public.users/")
    );
    assert_eq!(bodies[2]["spec"]["ports"][0]["name"], "http");
    assert_eq!(bodies[3]["kind"], "StatefulSet");
    for child in &bodies[1..4] {
        assert_eq!(
            child["metadata"]["annotations"]["larch.dev/applied-hash"]
                .as_str()
                .map(str::len),
            Some(16),
            "every applied child carries its hash: {}",
            child["kind"]
        );
    }
    let st = &bodies[5]["status"];
    assert_eq!(st["readyReplicas"], 1);
    assert_eq!(st["rows"], 42, "rows from the engine pipelines' row_count");
    assert_eq!(
        (
            st["position"].as_str(),
            st["head"].as_str(),
            st["headTime"].as_str()
        ),
        (Some("0/10"), Some("0/10"), Some("2027-01-15T07:59:59Z"))
    );
    assert!(st.get("lag").is_none(), "no ever-growing age in status");
    assert_eq!(
        st["rebaselines"]["total"], 0,
        "the first counter sample is a baseline"
    );
    for (t, s) in [
        ("Ready", "True"),
        ("CaughtUp", "True"),
        ("Rebaselining", "False"),
        ("Degraded", "False"),
        ("Stalled", "False"),
    ] {
        assert_eq!(cond(st, t)["status"], s, "{t}");
    }
    assert_eq!(bodies[6]["reason"], "Ready");
    assert_eq!(writes(&ctx), 5, "3 applies, the status, the Event");

    // The watches deliver what was applied (the StatefulSet with its status).
    watches_deliver(&mut caches, &bodies);

    // The counter goes up by 3 within the hour (maxPerHour is 2): Rebaselining and Degraded,
    // each with a Warning Event; the children are in place, so none is applied.
    *now.locked() = t(1);
    prober.set("10.0.0.7", "/status", r#"{"sources":{"users-cache":{"state":"following","position":"0/10","head":"0/10","epoch":2,"lag_seconds":1.0,"head_time":"2027-01-15T07:59:59Z","rebaselines":7}},"pipelines":{"users-cache/memory":{"source":"users-cache","row_count":42}}}"#);
    let mut s2 = s.clone();
    s2.status = Some(serde_json::from_value(st.clone()).unwrap());
    let (ctx2, handle2) = same_operator(&ctx, prober.clone());
    let mut script = export_gets();
    script.extend(optional_children_absent("users-cache"));
    script.extend([
        pods_list(),
        expect_status(&status_path, serde_json::to_value(&s2).unwrap()),
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
    let server = tokio::spawn(serve(handle2, script));
    source::reconcile(Arc::new(s2.clone()), ctx2.clone())
        .await
        .unwrap();
    let bodies = server.await.unwrap();
    let st = &bodies[2]["status"];
    assert_eq!(st["rebaselines"]["total"], 3);
    assert_eq!(st["rebaselines"]["lastTime"], "2027-01-15T08:01:00Z");
    assert_eq!(st["readyReplicas"], 1, "from the cached StatefulSet");
    assert_eq!(cond(st, "Rebaselining")["status"], "True");
    assert_eq!(cond(st, "Degraded")["status"], "True");
    assert_eq!(cond(st, "Degraded")["reason"], "FrequentRebaselines");
    let reasons: Vec<&str> = bodies[3..]
        .iter()
        .map(|b| b["reason"].as_str().unwrap())
        .collect();
    assert_eq!(reasons, ["Rebaselining", "FrequentRebaselines"]);
    assert!(bodies[3..].iter().all(|b| b["type"] == "Warning"));
    assert!(
        ctx2.metrics
            .render()
            .contains("larch_archive_source_degraded{name=\"users-cache\",namespace=\"data\"} 1")
    );

    // Nothing changed (the head only got older): the probe reads, nothing is written.
    let before = writes(&ctx);
    *now.locked() = t(2);
    prober.set("10.0.0.7", "/status", r#"{"sources":{"users-cache":{"state":"following","position":"0/10","head":"0/10","epoch":2,"lag_seconds":121.0,"head_time":"2027-01-15T07:59:59Z","rebaselines":7}},"pipelines":{"users-cache/memory":{"source":"users-cache","row_count":42}}}"#);
    let mut s3 = s.clone();
    s3.status = Some(serde_json::from_value(st.clone()).unwrap());
    let (ctx3, handle3) = same_operator(&ctx2, prober.clone());
    let mut script = export_gets();
    script.extend(optional_children_absent("users-cache"));
    script.push(pods_list());
    let server = tokio::spawn(serve(handle3, script));
    source::reconcile(Arc::new(s3), ctx3.clone()).await.unwrap();
    let asked = server.await.unwrap();
    assert_eq!(asked.len(), 2, "two reads, no write");
    assert_eq!(writes(&ctx3), before, "no write request counted");
    assert!(ctx3.metrics.render().contains(
        "larch_operator_applies_unchanged_total{controller=\"source\",kind=\"StatefulSet\"} 2"
    ));
}

/// A missing `exportRef` stalls the source (kstatus Failed) with a Warning Event; nothing is
/// built; the ArchiveExport watch brings it back once the export exists. Unchanged, the next
/// reconcile only reads.
#[tokio::test]
async fn archive_source_stalls_on_a_missing_export() {
    let (ctx, handle, _) = context(Arc::default());
    let s = source_fixture("source-exportref-memory");
    let missing_export = || {
        expect(
            Method::GET,
            "/apis/larch.dev/v1alpha1/namespaces/data/archiveexports/users",
            not_found(),
        )
    };
    let script = vec![
        missing_export(),
        expect_status(
            &format!(
                "/apis/larch.dev/v1alpha1/namespaces/data/archivesources/users-cache/status?{MANAGER_SOURCE_Q}"
            ),
            serde_json::to_value(&s).unwrap(),
        ),
        expect(
            Method::POST,
            "/apis/events.k8s.io/v1/namespaces/data/events?",
            None,
        ),
    ];
    let server = tokio::spawn(serve(handle, script));
    source::reconcile(Arc::new(s.clone()), ctx.clone())
        .await
        .unwrap();
    let bodies = server.await.unwrap();
    let st = &bodies[1]["status"];
    assert_eq!(cond(st, "Stalled")["status"], "True");
    assert_eq!(cond(st, "Stalled")["reason"], "ExportNotFound");
    assert_eq!(cond(st, "Reconciling")["status"], "False");
    assert_eq!(cond(st, "Ready")["reason"], "ExportNotFound");
    assert!(
        cond(st, "Stalled")["message"]
            .as_str()
            .unwrap()
            .contains("ArchiveExport data/users (named in spec.archive.exportRef) does not exist")
    );
    assert_eq!(
        (&bodies[2]["type"], &bodies[2]["reason"]),
        (&json!("Warning"), &json!("ExportNotFound"))
    );
    let mut s2 = s;
    s2.status = Some(serde_json::from_value(st.clone()).unwrap());
    let (ctx2, handle2) = same_operator(&ctx, Arc::default());
    let server = tokio::spawn(serve(handle2, vec![missing_export()]));
    source::reconcile(Arc::new(s2), ctx2.clone()).await.unwrap();
    server.await.unwrap();
    assert_eq!(
        writes(&ctx2),
        2,
        "the first reconcile's status and Event, nothing since"
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

fn continuous_tail_with(pods: Vec<Value>) -> Vec<Expect> {
    let sel = "labelSelector=larch.dev%2Farchive-export%3Devents";
    vec![
        expect(
            Method::GET,
            &format!("/apis/rbac.authorization.k8s.io/v1/namespaces/data/rolebindings?&{sel}"),
            list("RoleBindingList", "rbac.authorization.k8s.io/v1", vec![]),
        ),
        expect(
            Method::GET,
            &format!("/apis/rbac.authorization.k8s.io/v1/namespaces/data/roles?&{sel}"),
            list("RoleList", "rbac.authorization.k8s.io/v1", vec![]),
        ),
        expect(
            Method::GET,
            &format!("/api/v1/namespaces/data/serviceaccounts?&{sel}"),
            list("ServiceAccountList", "v1", vec![]),
        ),
        expect(
            Method::GET,
            &format!("/api/v1/namespaces/data/pods?&{sel}"),
            owned_pods(CONTINUOUS_UID, pods),
        ),
    ]
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
const EVENTS_POST: &str = "/apis/events.k8s.io/v1/namespaces/data/events?";

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

/// Reconciles the `source-exportref-memory` source whose one engine pod last exited with
/// status 2 and `termination_message`; the requests' bodies (the status patch at 5, the
/// Event at 6).
async fn reconcile_with_a_refusing_engine(termination_message: &str) -> Vec<Value> {
    let (ctx, handle, _) = context(Arc::default());
    let mut caches = writers(&ctx);
    fill(&mut caches.config_maps, []);
    fill(&mut caches.services, []);
    fill(&mut caches.stateful_sets, []);
    let s = source_fixture("source-exportref-memory");
    let mut script = source_script(0);
    let engine = json!({"metadata": {"name": "users-cache-0", "namespace": "data"},
        "status": {"podIP": "10.0.0.7", "containerStatuses": [{"name": "engine", "image": "i", "imageID": "", "ready": false, "restartCount": 2,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 2, "finishedAt": "2027-01-15T07:59:00Z",
                "message": termination_message}}}]}});
    script.pop();
    script.push(expect(
        Method::GET,
        "/api/v1/namespaces/data/pods?&labelSelector=larch.dev%2Farchive-source%3Dusers-cache",
        owned_pods(SOURCE_UID, vec![engine]),
    ));
    script.push(expect_status(
        &format!(
            "/apis/larch.dev/v1alpha1/namespaces/data/archivesources/users-cache/status?{MANAGER_SOURCE_Q}"
        ),
        serde_json::to_value(&s).unwrap(),
    ));
    script.push(expect(Method::POST, EVENTS_POST, None));
    let server = tokio::spawn(serve(handle, script));
    source::reconcile(Arc::new(s), ctx.clone()).await.unwrap();
    server.await.unwrap()
}

/// An engine that refuses its configuration (exit 2, ColumnNotFound) stalls the source with
/// the engine's message; before, the source said `Ready: EnginesReady`-to-be.
#[tokio::test]
async fn an_engine_refusing_its_configuration_stalls_the_source() {
    let bodies = reconcile_with_a_refusing_engine(
        "{\"reason\":\"ColumnNotFound\",\"error\":\"source users-cache: index field \\\"no_such_column\\\" is not a column of table public.users in the archive (its columns: id, name)\"}",
    )
    .await;
    let st = &bodies[5]["status"];
    assert_eq!(cond(st, "Stalled")["status"], "True");
    assert_eq!(cond(st, "Stalled")["reason"], "ColumnNotFound");
    assert_eq!(cond(st, "Ready")["reason"], "ColumnNotFound");
    assert_eq!(
        cond(st, "Stalled")["message"],
        "engine pod users-cache-0: exited with status 2: source users-cache: index field \"no_such_column\" is not a column of table public.users in the archive (its columns: id, name)"
    );
    assert_eq!(bodies[6]["reason"], "ColumnNotFound");
}

/// An engine of a source with `requireTransformed: true` over a raw archive exits with reason
/// `ArchiveNotTransformed`: the source stalls with that reason, its message naming the table
/// and the archive's manifest, and a Warning Event says so.
#[tokio::test]
async fn an_engine_refusing_a_raw_archive_stalls_the_source_as_not_transformed() {
    let bodies = reconcile_with_a_refusing_engine(
        "{\"reason\":\"ArchiveNotTransformed\",\"error\":\"source users-cache: require_transformed: the archive seeds/public.users/manifest.json (table public.users) records no masking transform (it was not exported with --transform / spec.transform): refusing to load raw rows\"}",
    )
    .await;
    let st = &bodies[5]["status"];
    assert_eq!(cond(st, "Stalled")["status"], "True");
    assert_eq!(cond(st, "Stalled")["reason"], "ArchiveNotTransformed");
    assert_eq!(cond(st, "Ready")["status"], "False");
    assert_eq!(cond(st, "Ready")["reason"], "ArchiveNotTransformed");
    let message = cond(st, "Stalled")["message"].as_str().unwrap();
    assert!(
        message.starts_with("engine pod users-cache-0: exited with status 2: source users-cache: require_transformed: the archive seeds/public.users/manifest.json (table public.users) records no masking transform"),
        "{message}"
    );
    assert_eq!(bodies[6]["reason"], "ArchiveNotTransformed");
    assert_eq!(bodies[6]["type"], "Warning");
}

// ---- ArchiveSourceSet ----

const MANAGER_SET_Q: &str = "&force=true&fieldManager=larch-operator%2Fsource-set";

fn set_owner() -> Value {
    json!([{"apiVersion": "larch.dev/v1alpha1", "kind": "ArchiveSourceSet", "name": "dev-seed",
            "uid": "5e7-uid", "controller": true, "blockOwnerDeletion": true}])
}

fn namespace(name: &str, labelled: bool) -> PartialObjectMeta<Namespace> {
    let labels = if labelled {
        json!({"larch.dev/seed": "events"})
    } else {
        json!({})
    };
    meta_of(&json!({"metadata": {"name": name, "labels": labels}}))
}

fn shared_secret() -> Value {
    json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "seed-reader", "namespace": "platform", "labels": {"team": "platform"}},
        "type": "Opaque", "data": {"AWS_ACCESS_KEY_ID": "YQ==", "AWS_SECRET_ACCESS_KEY": "Yg=="}})
}

fn shared_secret_get() -> Expect {
    expect(
        Method::GET,
        "/api/v1/namespaces/platform/secrets/seed-reader",
        Some(shared_secret()),
    )
}

fn set_source_path(ns: &str) -> String {
    format!("/apis/larch.dev/v1alpha1/namespaces/{ns}/archivesources/dev-seed?{MANAGER_SET_Q}")
}

fn copy_path(ns: &str) -> String {
    format!("/api/v1/namespaces/{ns}/secrets/dev-seed-credentials?{MANAGER_SET_Q}")
}

const SET_STATUS: &str = "/apis/larch.dev/v1alpha1/archivesourcesets/dev-seed/status?&force=true&fieldManager=larch-operator%2Fsource-set";

#[tokio::test]
async fn source_set_copies_applies_prunes_and_never_takes_over() {
    let (ctx, handle, _) = context(Arc::default());
    let set = crate::source_set::build::tests::set_fixture(true);
    let ok = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 200});
    let mut caches = writers(&ctx);
    fill(
        &mut caches.namespaces,
        [
            namespace("dev-a", true),
            namespace("dev-b", true),
            namespace("dev-old", false),
            namespace("kube-system", false),
        ],
    );
    // Ours, in a namespace no longer selected (labelled, so cached): deleted.
    fill(
        &mut caches.set_sources,
        [serde_json::from_value(json!({"apiVersion": "larch.dev/v1alpha1", "kind": "ArchiveSource",
               "metadata": {"name": "dev-seed", "namespace": "dev-old", "ownerReferences": set_owner(),
                            "labels": {"larch.dev/source-set": "dev-seed"}},
               "spec": {"archive": {"exportRef": {"name": "x"}}, "target": {"memory": {}}}}))
        .unwrap()],
    );
    fill(
        &mut caches.secrets,
        [meta_of::<Secret>(
            &json!({"metadata": {"name": "dev-seed-credentials", "namespace": "dev-old", "ownerReferences": set_owner()}}),
        )],
    );
    let script = vec![
        shared_secret_get(),
        // Not cached: read before creating, in case someone else's has the name.
        expect_read(&set_source_path("dev-a"), None),
        expect(Method::PATCH, &copy_path("dev-a"), None),
        expect(Method::PATCH, &set_source_path("dev-a"), None),
        // Someone else's ArchiveSource of the same name (unlabelled): left alone.
        expect_read(
            &set_source_path("dev-b"),
            Some(
                json!({"apiVersion": "larch.dev/v1alpha1", "kind": "ArchiveSource",
                   "metadata": {"name": "dev-seed", "namespace": "dev-b"},
                   "spec": {"archive": {"exportRef": {"name": "x"}}, "target": {"memory": {}}}}),
            ),
        ),
        expect(
            Method::DELETE,
            "/apis/larch.dev/v1alpha1/namespaces/dev-old/archivesources/dev-seed?",
            Some(ok.clone()),
        ),
        expect(
            Method::DELETE,
            "/api/v1/namespaces/dev-old/secrets/dev-seed-credentials?",
            Some(ok),
        ),
        expect_status(SET_STATUS, serde_json::to_value(&set).unwrap()),
        expect(
            Method::POST,
            "/apis/events.k8s.io/v1/namespaces/default/events?",
            None,
        ),
    ];
    let server = tokio::spawn(serve(handle, script));
    source_set::reconcile(Arc::new(set), ctx).await.unwrap();
    let bodies = server.await.unwrap();

    // The copy: the source's data and type, none of its labels.
    let copy = &bodies[2];
    assert_eq!(copy["data"]["AWS_ACCESS_KEY_ID"], "YQ==");
    assert_eq!(copy["type"], "Opaque");
    assert_eq!(
        copy["metadata"]["labels"]["larch.dev/source-set"],
        "dev-seed"
    );
    assert!(copy["metadata"]["labels"]["team"].is_null());
    assert_eq!(copy["metadata"]["ownerReferences"], set_owner());
    // The ArchiveSource points at the copy and carries the digest.
    let child = &bodies[3];
    assert_eq!(
        child["spec"]["archive"]["s3"]["credentials"]["secretRef"]["name"],
        "dev-seed-credentials"
    );
    assert_eq!(
        child["spec"]["pod"]["annotations"]["larch.dev/credentials-digest"]
            .as_str()
            .unwrap()
            .len(),
        16
    );
    // Status: two selected, none ready, dev-b failing with the conflict.
    let st = &bodies[7]["status"];
    assert_eq!(st["desiredNamespaces"], 2);
    assert_eq!(st["readyNamespaces"], 0);
    assert_eq!(st["failingNamespaces"][0]["namespace"], "dev-b");
    assert_eq!(st["failingNamespaces"][0]["reason"], "NameConflict");
    assert_eq!(st["failingNamespaces"].as_array().unwrap().len(), 1);
    assert_eq!(cond(st, "Stalled")["status"], "True");
    assert_eq!(cond(st, "Reconciling")["status"], "True");
    assert_eq!(cond(st, "Ready")["reason"], "NamespacesFailing");
    assert_eq!(bodies[8]["reason"], "NamespacesFailing");
    assert_eq!(bodies[8]["type"], "Warning");
    // No credential in the status, the Event or the copy's hash annotation.
    let text = format!(
        "{}{}{}",
        bodies[7], bodies[8], copy["metadata"]["annotations"]
    );
    assert!(!text.contains("YQ==") && !text.contains("Yg=="));
}

fn ca_copy_path(ns: &str) -> String {
    format!("/api/v1/namespaces/{ns}/configmaps/dev-seed-ca?{MANAGER_SET_Q}")
}

fn shared_ca() -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "pg-ca", "namespace": "platform", "labels": {"team": "platform"}},
        "data": {"ca.crt": "-----BEGIN CERTIFICATE-----", "root.pem": "-----BEGIN CERTIFICATE-----"}})
}

#[tokio::test]
async fn source_set_copies_its_ca_bundle_and_never_takes_one_over() {
    let (ctx, handle, _) = context(Arc::default());
    let set = crate::source_set::build::tests::set_with_ca();
    let ok = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 200});
    let mut caches = writers(&ctx);
    fill(
        &mut caches.namespaces,
        [
            namespace("dev-a", true),
            namespace("dev-b", true),
            namespace("dev-old", false),
        ],
    );
    fill(&mut caches.set_sources, []);
    fill(&mut caches.secrets, []);
    // Ours, in a namespace no longer selected (labelled, so cached): deleted.
    fill(
        &mut caches.config_maps,
        [meta_of::<ConfigMap>(
            &json!({"metadata": {"name": "dev-seed-ca", "namespace": "dev-old",
            "ownerReferences": set_owner(), "labels": {"larch.dev/source-set": "dev-seed"}}}),
        )],
    );
    let script = vec![
        shared_secret_get(),
        expect(
            Method::GET,
            "/api/v1/namespaces/platform/configmaps/pg-ca",
            Some(shared_ca()),
        ),
        expect_read(&set_source_path("dev-a"), None),
        expect(Method::PATCH, &copy_path("dev-a"), None),
        // Not cached: read before creating, in case someone else's has the name.
        expect_read(&ca_copy_path("dev-a"), None),
        expect(Method::PATCH, &ca_copy_path("dev-a"), None),
        expect(Method::PATCH, &set_source_path("dev-a"), None),
        expect_read(&set_source_path("dev-b"), None),
        expect(Method::PATCH, &copy_path("dev-b"), None),
        // Someone else's ConfigMap of the copy's name: left alone, and no ArchiveSource.
        expect_read(
            &ca_copy_path("dev-b"),
            Some(json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "dev-seed-ca", "namespace": "dev-b"}, "data": {"ca.crt": "theirs"}})),
        ),
        expect(
            Method::DELETE,
            "/api/v1/namespaces/dev-old/configmaps/dev-seed-ca?",
            Some(ok),
        ),
        expect_status(SET_STATUS, serde_json::to_value(&set).unwrap()),
        expect(
            Method::POST,
            "/apis/events.k8s.io/v1/namespaces/default/events?",
            None,
        ),
    ];
    let server = tokio::spawn(serve(handle, script));
    source_set::reconcile(Arc::new(set), ctx).await.unwrap();
    let bodies = server.await.unwrap();

    // The copy: the source's data, none of its labels.
    let copy = &bodies[5];
    assert_eq!(copy["data"], shared_ca()["data"]);
    assert_eq!(
        copy["metadata"]["labels"]["larch.dev/source-set"],
        "dev-seed"
    );
    assert!(copy["metadata"]["labels"]["team"].is_null());
    assert_eq!(copy["metadata"]["ownerReferences"], set_owner());
    assert_eq!(
        copy["metadata"]["annotations"]["larch.dev/copied-from"],
        "platform/pg-ca"
    );
    // The ArchiveSource reads both CA references from the copy and carries its digest.
    let child = &bodies[6];
    assert_eq!(
        child["spec"]["archive"]["s3"]["caBundle"]["configMap"],
        json!({"name": "dev-seed-ca", "key": "ca.crt"})
    );
    assert_eq!(
        child["spec"]["target"]["postgres"]["caBundle"]["configMap"],
        json!({"name": "dev-seed-ca", "key": "root.pem"})
    );
    let digest = child["spec"]["pod"]["annotations"]["larch.dev/ca-digest"]
        .as_str()
        .unwrap();
    assert_eq!(digest.len(), 16);
    let st = &bodies[11]["status"];
    assert_eq!(st["failingNamespaces"][0]["namespace"], "dev-b");
    assert_eq!(st["failingNamespaces"][0]["reason"], "ConfigMapConflict");
    assert_eq!(st["failingNamespaces"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn source_set_sharing_a_ca_it_does_not_use_or_cannot_find_stalls() {
    // The template names no ConfigMap of the shared name: invalid before anything is read.
    let (ctx, handle, _) = context(Arc::default());
    let mut set = crate::source_set::build::tests::set_with_ca();
    set.spec.ca_bundle.as_mut().unwrap().config_map_ref.name = "other-ca".into();
    let mut caches = writers(&ctx);
    fill(&mut caches.namespaces, [namespace("dev-a", true)]);
    fill(&mut caches.set_sources, []);
    fill(&mut caches.secrets, []);
    fill(&mut caches.config_maps, []);
    let script = vec![
        shared_secret_get(),
        expect_status(SET_STATUS, serde_json::to_value(&set).unwrap()),
        expect(
            Method::POST,
            "/apis/events.k8s.io/v1/namespaces/default/events?",
            None,
        ),
    ];
    let server = tokio::spawn(serve(handle, script));
    source_set::reconcile(Arc::new(set), ctx).await.unwrap();
    let bodies = server.await.unwrap();
    let st = &bodies[1]["status"];
    assert_eq!(cond(st, "Stalled")["reason"], "CaBundleUnused");
    assert!(
        cond(st, "Stalled")["message"]
            .as_str()
            .unwrap()
            .contains("ConfigMap platform/other-ca"),
        "{st}"
    );

    // The ConfigMap does not exist: invalid, named.
    let (ctx, handle, _) = context(Arc::default());
    let set = crate::source_set::build::tests::set_with_ca();
    let mut caches = writers(&ctx);
    fill(&mut caches.namespaces, [namespace("dev-a", true)]);
    fill(&mut caches.set_sources, []);
    fill(&mut caches.secrets, []);
    fill(&mut caches.config_maps, []);
    let script = vec![
        shared_secret_get(),
        expect(
            Method::GET,
            "/api/v1/namespaces/platform/configmaps/pg-ca",
            not_found(),
        ),
        expect_status(SET_STATUS, serde_json::to_value(&set).unwrap()),
        expect(
            Method::POST,
            "/apis/events.k8s.io/v1/namespaces/default/events?",
            None,
        ),
    ];
    let server = tokio::spawn(serve(handle, script));
    source_set::reconcile(Arc::new(set), ctx).await.unwrap();
    let bodies = server.await.unwrap();
    let st = &bodies[2]["status"];
    assert_eq!(cond(st, "Stalled")["reason"], "CaBundleNotFound");
    assert_eq!(
        cond(st, "Stalled")["message"],
        "the CA bundle ConfigMap platform/pg-ca (spec.caBundle.configMapRef) does not exist"
    );
}

#[tokio::test]
async fn source_set_without_its_secret_stalls_and_touches_nothing() {
    let (ctx, handle, _) = context(Arc::default());
    let mut set = crate::source_set::build::tests::set_fixture(true);
    set.metadata.generation = Some(1);
    let mut caches = writers(&ctx);
    fill(&mut caches.namespaces, [namespace("dev-a", true)]);
    fill(&mut caches.set_sources, []);
    // An existing copy stays: running engines still use it.
    fill(
        &mut caches.secrets,
        [meta_of::<Secret>(
            &json!({"metadata": {"name": "dev-seed-credentials", "namespace": "dev-a", "ownerReferences": set_owner()}}),
        )],
    );
    let script = vec![
        expect(
            Method::GET,
            "/api/v1/namespaces/platform/secrets/seed-reader",
            not_found(),
        ),
        expect_status(SET_STATUS, serde_json::to_value(&set).unwrap()),
        expect(
            Method::POST,
            "/apis/events.k8s.io/v1/namespaces/default/events?",
            None,
        ),
    ];
    let server = tokio::spawn(serve(handle, script));
    source_set::reconcile(Arc::new(set), ctx).await.unwrap();
    let bodies = server.await.unwrap();
    let st = &bodies[1]["status"];
    assert_eq!(cond(st, "Stalled")["reason"], "CredentialsNotFound");
    assert!(
        cond(st, "Ready")["message"]
            .as_str()
            .unwrap()
            .contains("platform/seed-reader")
    );
    assert_eq!(st["observedGeneration"], 1);
    assert_eq!(bodies[2]["reason"], "CredentialsNotFound");
}

/// An applied child as its watch delivers it later: with a generation, and `ready` or not.
fn observed_child(applied: &Value, ready: bool) -> ArchiveSource {
    let mut c = applied.clone();
    c["metadata"]["generation"] = json!(1);
    let status = if ready { "True" } else { "False" };
    c["status"] = json!({"observedGeneration": 1, "conditions": [
        {"type": "Ready", "status": status, "reason": "EnginesReady", "message": "1/1 engines ready",
         "lastTransitionTime": "2027-01-15T08:00:00Z"},
        {"type": "Stalled", "status": "False", "reason": "EnginesReady", "message": "",
         "lastTransitionTime": "2027-01-15T08:00:00Z"}]});
    serde_json::from_value(c).unwrap()
}

/// A set over 50 namespaces: the first reconcile copies and applies 50 of each; once the
/// children are in place and ready, a reconcile writes nothing; a child's status change writes
/// only the rollup; a template change re-applies each ArchiveSource once (no copy: the data is
/// the same).
#[tokio::test]
async fn source_set_of_50_namespaces_writes_only_what_changed() {
    let (ctx, handle, _) = context(Arc::default());
    let mut set = crate::source_set::build::tests::set_fixture(true);
    set.metadata.generation = Some(1);
    let names: Vec<String> = (0..50).map(|i| format!("dev-{i:02}")).collect();
    let mut caches = writers(&ctx);
    fill(
        &mut caches.namespaces,
        names.iter().map(|n| namespace(n, true)),
    );
    fill(&mut caches.set_sources, []);
    fill(&mut caches.secrets, []);

    // 1. Creation: per namespace a read (no such ArchiveSource), the copy, the ArchiveSource.
    let mut script = vec![shared_secret_get()];
    for ns in &names {
        script.push(expect_read(&set_source_path(ns), None));
        script.push(expect(Method::PATCH, &copy_path(ns), None));
        script.push(expect(Method::PATCH, &set_source_path(ns), None));
    }
    script.push(expect_status(
        SET_STATUS,
        serde_json::to_value(&set).unwrap(),
    ));
    let server = tokio::spawn(serve(handle, script));
    source_set::reconcile(Arc::new(set.clone()), ctx.clone())
        .await
        .unwrap();
    let bodies = server.await.unwrap();
    assert_eq!(
        writes(&ctx),
        101,
        "50 copies, 50 ArchiveSources, the status"
    );
    let copies: Vec<&Value> = bodies.iter().filter(|b| b["kind"] == "Secret").collect();
    let children: Vec<&Value> = bodies
        .iter()
        .filter(|b| b["kind"] == "ArchiveSource")
        .collect();
    assert_eq!((copies.len(), children.len()), (50, 50));
    let status = bodies.last().unwrap()["status"].clone();
    assert_eq!(status["readyNamespaces"], 0);

    // The watches deliver the copies and the children, which become ready.
    let observe = |set_sources: &mut Writer<ArchiveSource>, not_ready: Option<usize>| {
        fill(
            set_sources,
            children
                .iter()
                .enumerate()
                .map(|(i, c)| observed_child(c, Some(i) != not_ready)),
        )
    };
    fill(
        &mut caches.secrets,
        copies.iter().map(|c| meta_of::<Secret>(c)),
    );
    observe(&mut caches.set_sources, None);

    // 2. All ready: the rollup changes (one status write), nothing else is written.
    let mut seen = set.clone();
    seen.status = Some(serde_json::from_value(status).unwrap());
    let (ctx2, handle2) = same_operator(&ctx, Arc::default());
    let script = vec![
        shared_secret_get(),
        expect_status(SET_STATUS, serde_json::to_value(&seen).unwrap()),
        expect(
            Method::POST,
            "/apis/events.k8s.io/v1/namespaces/default/events?",
            None,
        ),
    ];
    let server = tokio::spawn(serve(handle2, script));
    source_set::reconcile(Arc::new(seen.clone()), ctx2.clone())
        .await
        .unwrap();
    let bodies = server.await.unwrap();
    let status = bodies[1]["status"].clone();
    assert_eq!(status["readyNamespaces"], 50);
    assert_eq!(bodies[2]["reason"], "Ready");
    assert_eq!(writes(&ctx), 103, "the rollup and its Ready Event only");

    // 3. Unchanged: one read (the shared Secret's data), no write.
    seen.status = Some(serde_json::from_value(status).unwrap());
    let (ctx3, handle3) = same_operator(&ctx, Arc::default());
    let server = tokio::spawn(serve(handle3, vec![shared_secret_get()]));
    source_set::reconcile(Arc::new(seen.clone()), ctx3)
        .await
        .unwrap();
    server.await.unwrap();
    assert_eq!(writes(&ctx), 103, "an unchanged set of 50 writes nothing");

    // 4. One child stops being ready: the rollup is written, no child is re-applied.
    observe(&mut caches.set_sources, Some(7));
    let (ctx4, handle4) = same_operator(&ctx, Arc::default());
    let script = vec![
        shared_secret_get(),
        expect_status(SET_STATUS, serde_json::to_value(&seen).unwrap()),
    ];
    let server = tokio::spawn(serve(handle4, script));
    source_set::reconcile(Arc::new(seen.clone()), ctx4)
        .await
        .unwrap();
    let bodies = server.await.unwrap();
    assert_eq!(bodies[1]["status"]["readyNamespaces"], 49);
    assert_eq!(writes(&ctx), 104, "one status write for one child's change");
    observe(&mut caches.set_sources, None);

    // 5. The template changes: each ArchiveSource is applied once; the copies stay.
    let mut changed = seen.clone();
    changed.metadata.generation = Some(2);
    changed.spec.template.as_mut().unwrap().spec.replicas = Some(2);
    let (ctx5, handle5) = same_operator(&ctx, Arc::default());
    let mut script = vec![shared_secret_get()];
    for ns in &names {
        script.push(expect(Method::PATCH, &set_source_path(ns), None));
    }
    script.push(expect_status(
        SET_STATUS,
        serde_json::to_value(&changed).unwrap(),
    ));
    let server = tokio::spawn(serve(handle5, script));
    source_set::reconcile(Arc::new(changed), ctx5)
        .await
        .unwrap();
    let bodies = server.await.unwrap();
    assert!(
        bodies
            .iter()
            .filter(|b| b["kind"] == "ArchiveSource")
            .all(|b| b["spec"]["replicas"] == 2)
    );
    assert_eq!(
        writes(&ctx),
        104 + 51,
        "50 ArchiveSources and the status (observedGeneration)"
    );
}

/// Issue 13: the finalizer, the deletion's cleanup Job and the suspended export's kept slot.
mod lifecycle {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kube::runtime::controller::Action;

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
            &format!(
                "/api/v1/namespaces/data/pods?&{SEL}%2Capp.kubernetes.io%2Fcomponent%3Dcleanup"
            ),
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
}

const MANAGER_RESTORE_Q: &str = "&force=true&fieldManager=larch-operator%2Frestore";
const RESTORE_STATUS: &str = "/apis/larch.dev/v1alpha1/namespaces/data/archiverestores/invoices-yesterday/status?&force=true&fieldManager=larch-operator%2Frestore";

fn invoices_restore() -> crate::crd::ArchiveRestore {
    crate::builders::tests::restore_fixture("restore-s3-at-position")
}

/// What the restore fixture names: its S3 keys and the target's DSN, all present.
fn restore_references() -> Vec<Expect> {
    vec![
        secret_get("s3-credentials", Some(&["id", "secret"])),
        secret_get("pg-restore", Some(&["dsn"])),
    ]
}

async fn restore_reconcile(
    now: Timestamp,
    r: &crate::crd::ArchiveRestore,
    script: Vec<Expect>,
) -> (Vec<Value>, kube::runtime::controller::Action) {
    let (ctx, handle, clock) = context(Arc::default());
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

/// The prune lists of a OneShot export's later rounds: its CronJobs and Deployments (none).
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

/// An engine loading its baseline behind the head: `status.lag` is its distance behind (diffs,
/// bytes, seconds), the head's age stays in `headTime`, `status.progress` is its load and the
/// reconcile comes back in 10 s; once loaded and caught up, LAG is 0 and the progress
/// `Complete`, the interval 30 s; the head getting older then writes nothing.
#[tokio::test]
async fn an_engine_loading_behind_the_head_reports_lag_and_progress() {
    use kube::runtime::controller::Action;
    let engine = |position: &str, behind: Value, rows: u64, done: bool, age: f64| {
        let mut load = larch_core::progress::ProgressReport {
            operation: "baseline".into(),
            subject: "users-cache".into(),
            ..larch_core::progress::compute(rows, 0, Some(900), Duration::from_secs(3))
        };
        load.done = done;
        json!({"sources": {"users-cache": {"state": "following", "position": position, "head": "0/30", "epoch": 2,
                "lag_seconds": age, "data_age_seconds": age, "behind": behind, "head_time": "2027-01-15T07:45:00Z", "rebaselines": 0}},
            "pipelines": {"users-cache/memory": {"source": "users-cache", "row_count": rows, "baseline_progress": load}}})
        .to_string()
    };
    let prober = Arc::new(FakeProber::default());
    prober.set(
        "10.0.0.7",
        "/status",
        &engine(
            "0/10",
            json!({"diffs": 2, "bytes": 4096, "seconds": 11.6}),
            300,
            false,
            900.0,
        ),
    );
    let FirstVisit {
        ctx,
        mut caches,
        now,
        s,
        status_path,
        bodies,
        action,
    } = first_source_visit(prober.clone()).await;
    let st = &bodies[5]["status"];
    assert_eq!(
        st["lag"],
        json!({"diffs": 2, "bytes": 4096, "seconds": 12, "summary": "2 diffs, 4.0 KiB, 12s"})
    );
    assert_eq!(
        st["headTime"], "2027-01-15T07:45:00Z",
        "the data's age, apart"
    );
    assert_eq!(st["progress"]["phase"], "Loading");
    assert_eq!(
        (&st["progress"]["rows"], &st["progress"]["expectedRows"]),
        (&json!(300), &json!(900))
    );
    assert_eq!(st["progress"]["percent"], "33%");
    assert_eq!(st["progress"]["pods"], 1);
    assert_eq!(action, Action::requeue(Duration::from_secs(10)));
    assert!(
        ctx.metrics.render().contains(
            "larch_archive_source_lag_seconds{name=\"users-cache\",namespace=\"data\"} 12"
        ),
        "the gauge is the lag, not the head's age"
    );
    watches_deliver(&mut caches, &bodies);

    // Loaded and caught up (the head is 15 minutes old all the same).
    *now.locked() = t(1);
    let caught_up = json!({"diffs": 0, "bytes": 0, "seconds": 0.0});
    prober.set(
        "10.0.0.7",
        "/status",
        &engine("0/30", caught_up.clone(), 900, true, 960.0),
    );
    let mut s2 = s.clone();
    s2.status = Some(serde_json::from_value(st.clone()).unwrap());
    let (ctx2, handle2) = same_operator(&ctx, prober.clone());
    let mut script = export_gets();
    script.extend(optional_children_absent("users-cache"));
    script.extend([
        pods_list(),
        expect_status(&status_path, serde_json::to_value(&s2).unwrap()),
    ]);
    let server = tokio::spawn(serve(handle2, script));
    let action = source::reconcile(Arc::new(s2.clone()), ctx2.clone())
        .await
        .unwrap();
    let bodies = server.await.unwrap();
    let st = &bodies[2]["status"];
    assert_eq!(
        st["lag"],
        json!({"diffs": 0, "bytes": 0, "seconds": 0, "summary": "0"})
    );
    assert_eq!(st["progress"]["phase"], "Complete");
    assert_eq!(
        (&st["progress"]["rows"], &st["progress"]["percent"]),
        (&json!(900), &json!("100%"))
    );
    assert_eq!(st["progress"]["updatedTime"], "2027-01-15T08:01:00Z");
    assert_eq!(cond(st, "CaughtUp")["status"], "True");
    assert_eq!(action, Action::requeue(Duration::from_secs(30)));

    // The head only gets older: nothing to write.
    *now.locked() = t(2);
    prober.set(
        "10.0.0.7",
        "/status",
        &engine("0/30", caught_up, 900, true, 1020.0),
    );
    let mut s3 = s.clone();
    s3.status = Some(serde_json::from_value(st.clone()).unwrap());
    let (ctx3, handle3) = same_operator(&ctx2, prober.clone());
    let mut script = export_gets();
    script.extend(optional_children_absent("users-cache"));
    script.push(pods_list());
    let server = tokio::spawn(serve(handle3, script));
    source::reconcile(Arc::new(s3), ctx3).await.unwrap();
    assert_eq!(server.await.unwrap().len(), 2, "two reads, no write");
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

fn set_restore_path(ns: &str) -> String {
    format!("/apis/larch.dev/v1alpha1/namespaces/{ns}/archiverestores/dev-seed?{MANAGER_SET_Q}")
}

fn stamped_restore(ns: &str, annotations: Value, status: Value) -> Value {
    json!({"apiVersion": "larch.dev/v1alpha1", "kind": "ArchiveRestore",
        "metadata": {"name": "dev-seed", "namespace": ns, "generation": 1, "ownerReferences": set_owner(),
                     "labels": {"larch.dev/source-set": "dev-seed"}, "annotations": annotations},
        "spec": {"archive": {"s3": {"bucket": "seeds"}}, "tables": [{"name": "events"}],
                 "target": {"postgres": {"connectionSecretRef": {"name": "app-db-app", "key": "uri"}}}},
        "status": status})
}

/// A set with a restoreTemplate stamps an ArchiveRestore per selected namespace (one labelled
/// list a reconcile, no per-namespace read of its own children), turns a developer's
/// `larch.dev/refresh-requested` into a new run token, deletes the restore of a namespace no
/// longer selected, and reports each namespace's last refresh and its failure
/// (`DatabaseUnavailable`).
#[tokio::test]
async fn a_restore_set_stamps_refreshes_on_request_and_reports_per_namespace() {
    let (ctx, handle, _) = context(Arc::default());
    let mut v = serde_json::to_value(crate::source_set::build::tests::restore_set_fixture(
        "Manual",
    ))
    .unwrap();
    v["spec"].as_object_mut().unwrap().remove("caBundle");
    v["spec"]["restoreTemplate"]["spec"]["archive"]["s3"]
        .as_object_mut()
        .unwrap()
        .remove("caBundle");
    let set: crate::crd::ArchiveSourceSet = serde_json::from_value(v).unwrap();
    let ok = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 200});
    let mut caches = writers(&ctx);
    fill(
        &mut caches.namespaces,
        [
            namespace("dev-a", true),
            namespace("dev-b", true),
            namespace("dev-c", true),
            namespace("dev-old", false),
        ],
    );
    fill(&mut caches.set_sources, []);
    fill(&mut caches.secrets, []);
    let done = json!({"observedGeneration": 1,
        "run": {"id": "r1", "token": "initial", "startTime": "2027-01-15T08:00:00Z",
                "completionTime": "2027-01-15T08:01:00Z", "succeeded": true},
        "durationSeconds": 2.5,
        "tables": [{"table": "public.events", "rows": 40, "position": "0/1", "action": "created"},
                   {"table": "app.users", "rows": 2, "position": "0/1", "action": "created"}],
        "conditions": [{"type": "Ready", "status": "True", "reason": "Restored", "message": "ok", "lastTransitionTime": "2027-01-15T08:01:00Z"}]});
    let waiting = json!({"observedGeneration": 1,
        "run": {"id": "r2", "token": "initial", "startTime": "2027-01-15T08:00:00Z"},
        "conditions": [{"type": "Ready", "status": "False", "reason": "DatabaseUnavailable",
                        "message": "run r2: waiting for the database (ConnectionFailed), retrying with backoff: connection refused",
                        "lastTransitionTime": "2027-01-15T08:01:00Z"}]});
    let dev_b = stamped_restore(
        "dev-b",
        json!({"larch.dev/run-requested": "initial", "larch.dev/refresh-requested": "please"}),
        done.clone(),
    );
    let dev_c = stamped_restore(
        "dev-c",
        json!({"larch.dev/run-requested": "initial"}),
        waiting,
    );
    // The API server answers an apply with the whole object (its generation unchanged by an
    // annotation).
    let applied = |path: String, live: &Value, token: &str| {
        let mut answer = live.clone();
        answer["metadata"]["annotations"]["larch.dev/run-requested"] = json!(token);
        expect(Method::PATCH, &path, Some(answer))
    };
    let listed = vec![
        // dev-b: restored, and its developer asks for a fresh copy.
        dev_b.clone(),
        // dev-c: its database is down.
        dev_c.clone(),
        // dev-old: no longer selected: its restore goes (its database is not touched).
        stamped_restore(
            "dev-old",
            json!({"larch.dev/run-requested": "initial"}),
            done,
        ),
    ];
    let script = vec![
        shared_secret_get(),
        expect(
            Method::GET,
            "/apis/larch.dev/v1alpha1/archiverestores?&labelSelector=larch.dev%2Fsource-set%3Ddev-seed",
            list("ArchiveRestoreList", "larch.dev/v1alpha1", listed),
        ),
        // dev-a: not listed, read before creating, in case someone else's has the name.
        expect_read(&set_restore_path("dev-a"), None),
        expect(Method::PATCH, &copy_path("dev-a"), None),
        expect(Method::PATCH, &set_restore_path("dev-a"), None),
        expect(Method::PATCH, &copy_path("dev-b"), None),
        applied(set_restore_path("dev-b"), &dev_b, "initial+manual-please"),
        expect(Method::PATCH, &copy_path("dev-c"), None),
        applied(set_restore_path("dev-c"), &dev_c, "initial"),
        expect(
            Method::DELETE,
            "/apis/larch.dev/v1alpha1/namespaces/dev-old/archiverestores/dev-seed?",
            Some(ok),
        ),
        expect_status(SET_STATUS, serde_json::to_value(&set).unwrap()),
        expect(
            Method::POST,
            "/apis/events.k8s.io/v1/namespaces/default/events?",
            None,
        ),
    ];
    let server = tokio::spawn(serve(handle, script));
    source_set::reconcile(Arc::new(set), ctx).await.unwrap();
    let bodies = server.await.unwrap();
    let (a, b, c) = (&bodies[4], &bodies[6], &bodies[8]);
    assert_eq!(
        a["metadata"]["annotations"]["larch.dev/run-requested"],
        "initial"
    );
    assert_eq!(a["spec"]["ifExists"], "Replace");
    assert_eq!(
        a["spec"]["archive"]["s3"]["credentials"]["secretRef"]["name"],
        "dev-seed-credentials"
    );
    assert_eq!(
        b["metadata"]["annotations"]["larch.dev/run-requested"],
        "initial+manual-please"
    );
    // The developer's annotation is theirs: the set does not apply it.
    assert!(b["metadata"]["annotations"]["larch.dev/refresh-requested"].is_null());
    assert_eq!(
        c["metadata"]["annotations"]["larch.dev/run-requested"],
        "initial"
    );
    let st = &bodies[10]["status"];
    assert_eq!(st["desiredNamespaces"], 3);
    assert_eq!(st["readyNamespaces"], 0);
    assert_eq!(st["failingNamespaces"][0]["namespace"], "dev-c");
    assert_eq!(st["failingNamespaces"][0]["reason"], "DatabaseUnavailable");
    let restores = st["restores"].as_array().unwrap();
    // Failing first, then by name.
    let order: Vec<&str> = restores
        .iter()
        .map(|r| r["namespace"].as_str().unwrap())
        .collect();
    assert_eq!(order, ["dev-c", "dev-a", "dev-b"]);
    assert_eq!(restores[0]["failureReason"], "DatabaseUnavailable");
    assert!(restores[1]["lastRefreshTime"].is_null());
    assert_eq!(restores[2]["lastRefreshTime"], "2027-01-15T08:01:00Z");
    assert_eq!(restores[2]["rows"], 42);
    assert_eq!(restores[2]["durationSeconds"], 2.5);
    assert!(restores[2]["failureReason"].is_null());
    assert_eq!(cond(st, "Stalled")["reason"], "NamespacesFailing");
    assert_eq!(bodies[11]["reason"], "NamespacesFailing");
}

/// One visit of `users-cache` by an operator that generates engine tokens, the token Secret's
/// create answered with `secret_answer` (`None`: created). Returns the request bodies.
async fn visit_generating_tokens(secret_answer: Option<Value>) -> Vec<Value> {
    let (ctx, handle, _) = context(Arc::default());
    let mut ctx = Arc::try_unwrap(ctx).ok().expect("a new context");
    ctx.build.generate_engine_tokens = true;
    let ctx = Arc::new(ctx);
    let mut caches = writers(&ctx);
    fill(&mut caches.config_maps, []);
    fill(&mut caches.services, []);
    fill(&mut caches.stateful_sets, []);
    let s = source_fixture("source-exportref-memory");
    let mut script = source_script(1);
    script.insert(
        export_gets().len(),
        expect(
            Method::POST,
            "/api/v1/namespaces/data/secrets?&fieldManager=larch-operator%2Fsource",
            secret_answer,
        ),
    );
    script.push(expect_status(
        &format!(
            "/apis/larch.dev/v1alpha1/namespaces/data/archivesources/users-cache/status?{MANAGER_SOURCE_Q}"
        ),
        serde_json::to_value(&s).unwrap(),
    ));
    script.push(expect(
        Method::POST,
        "/apis/events.k8s.io/v1/namespaces/data/events?",
        None,
    ));
    let server = tokio::spawn(serve(handle, script));
    source::reconcile(Arc::new(s), ctx).await.unwrap();
    server.await.unwrap()
}

/// Without `spec.access.tokenSecretRef` the operator creates Secret `<source>-engine-token`
/// (owned by the source, a 64-hex-character token) before the engines that mount it, and
/// only creates it: when it exists (409) nothing reads, patches or replaces it, and the
/// reconcile goes on. The token is in no other request (status, Event, children).
#[tokio::test]
async fn a_generated_token_secret_is_created_once_and_never_rewritten() {
    let bodies = visit_generating_tokens(None).await;
    let find = |bodies: &[Value], kind: &str| {
        bodies
            .iter()
            .position(|b| b["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind} sent"))
    };
    let at = find(&bodies, "Secret");
    let secret = &bodies[at];
    assert!(
        at < find(&bodies, "StatefulSet"),
        "the Secret before the engines"
    );
    assert_eq!(secret["metadata"]["name"], "users-cache-engine-token");
    let owner = &secret["metadata"]["ownerReferences"][0];
    assert_eq!(
        (&owner["kind"], &owner["name"]),
        (&json!("ArchiveSource"), &json!("users-cache"))
    );
    let b64 = secret["data"]["token"].as_str().unwrap();
    assert_eq!(b64.len(), 88, "base64 of 64 hex characters: {b64}");
    let sts = &bodies[find(&bodies, "StatefulSet")];
    let volumes = sts["spec"]["template"]["spec"]["volumes"].to_string();
    assert!(volumes.contains("users-cache-engine-token"), "{volumes}");
    for (i, b) in bodies.iter().enumerate().filter(|(i, _)| *i != at) {
        assert!(
            !b.to_string().contains(b64),
            "the token leaked into request {i}: {b}"
        );
    }

    let exists = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "reason": "AlreadyExists", "code": 409,
        "message": "secrets \"users-cache-engine-token\" already exists"});
    let again = visit_generating_tokens(Some(exists)).await;
    let status = &again[again.len() - 2]["status"];
    assert_eq!(cond(status, "Stalled")["status"], "False", "{status}");
    // A new draw each visit, never sent over the existing one (serve fails on any other request).
    let sent = &again[find(&again, "Secret")];
    assert_ne!(sent["data"]["token"], secret["data"]["token"]);
}
