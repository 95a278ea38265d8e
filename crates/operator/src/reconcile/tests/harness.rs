//! The scripted API server the controller tests run against (each expected request and its
//! answer, in order), a fake prober, and the fixtures and helpers several kinds' tests use.

use larch_core::locks::MutexExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Request, Response};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::client::Body;
use kube::core::{ObjectMeta, PartialObjectMeta, PartialObjectMetaExt};
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use prometheus::core::Collector;
use serde_json::{Value, json};

use crate::builders::tests::{export_fixture, source_fixture};
use crate::crd::ArchiveSource;
use crate::metrics::Metrics;
use crate::reconcile::context::{CacheWriters, Context};
use crate::reconcile::probe::Prober;

pub(crate) type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// One expected request: method, path (with query), and the JSON answer. `None` answers by
/// echoing the request body (as the API server does for apply and create).
pub(crate) struct Expect {
    pub(crate) method: Method,
    pub(crate) path: String,
    pub(crate) answer: Option<Value>,
    /// Object the echoed body is merged into (status applies answer with the whole object).
    pub(crate) base: Option<Value>,
    /// Whether `serve` returns its (empty) body: the dereference reads are left out, so the
    /// bodies of the requests after them keep their places.
    pub(crate) record: bool,
}

pub(crate) fn expect_status(path: &str, object: Value) -> Expect {
    Expect {
        method: Method::PATCH,
        path: path.into(),
        answer: None,
        base: Some(object),
        record: true,
    }
}

pub(crate) fn expect(method: Method, path: &str, answer: Option<Value>) -> Expect {
    Expect {
        method,
        path: path.into(),
        answer,
        base: None,
        record: true,
    }
}

/// The dereference read of a Secret (`keys`: its data keys; `None`: it does not exist).
pub(crate) fn secret_get(name: &str, keys: Option<&[&str]>) -> Expect {
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
pub(crate) fn config_map_get(name: &str, keys: &[&str]) -> Expect {
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

/// What the `users` export (and a source reading it) names: its DSN (export only), its S3
/// keys and CA bundle, all present.
pub(crate) fn users_references(with_dsn: bool) -> Vec<Expect> {
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

pub(crate) fn not_found() -> Option<Value> {
    Some(
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}),
    )
}

/// A child read before its apply; `None`: it does not exist.
pub(crate) fn expect_read(patch_path: &str, answer: Option<Value>) -> Expect {
    let path = patch_path.split_once('?').map_or(patch_path, |(p, _)| p);
    expect(Method::GET, path, answer.or_else(not_found))
}

/// Pods as the workloads of the custom resource `uid` make them: controlled, through their
/// owner chain, by it (here directly: `reconcile::owned` has the chain's own tests).
pub(crate) fn owned_pods(uid: &str, mut pods: Vec<Value>) -> Option<Value> {
    for p in &mut pods {
        p["metadata"]["ownerReferences"] = json!([{"apiVersion": "larch.dev/v1alpha1",
            "kind": "Owner", "name": "owner", "uid": uid, "controller": true}]);
    }
    list("PodList", "v1", pods)
}
pub(crate) const CONTINUOUS_UID: &str = "6b1f0c7e-0000-4000-8000-000000000003";
pub(crate) const SOURCE_UID: &str = "6b1f0c7e-0000-4000-8000-000000000004";
pub(crate) const RESTORE_UID: &str = "6b1f0c7e-0000-4000-8000-000000000011";

pub(crate) fn list(kind: &str, api_version: &str, items: Vec<Value>) -> Option<Value> {
    Some(
        json!({"apiVersion": api_version, "kind": kind, "metadata": {"resourceVersion": "1"}, "items": items}),
    )
}

/// Serves `script` in order; returns the request bodies. Panics on a request out of script.
pub(crate) async fn serve(mut handle: Handle, script: Vec<Expect>) -> Vec<Value> {
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
pub(crate) struct FakeProber(Mutex<HashMap<String, String>>);

impl FakeProber {
    pub(crate) fn set(&self, ip: &str, path: &str, body: &str) {
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

pub(crate) fn t(mins: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + mins * 60).unwrap()
}

pub(crate) fn context(prober: Arc<FakeProber>) -> (Arc<Context>, Handle, Arc<Mutex<Timestamp>>) {
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

pub(crate) const MANAGER_EXPORT_Q: &str = "&force=true&fieldManager=larch-operator%2Fexport";
pub(crate) const MANAGER_SOURCE_Q: &str = "&force=true&fieldManager=larch-operator%2Fsource";
pub(crate) const EXPORT_SEL: &str = "labelSelector=larch.dev%2Farchive-export%3Dusers";

pub(crate) fn cond<'a>(status: &'a Value, t: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == t)
        .unwrap()
}

pub(crate) fn sts_answer(ready: i32) -> Value {
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

pub(crate) fn engine_pod() -> Value {
    json!({"metadata": {"name": "users-cache-0", "namespace": "data", "creationTimestamp": "2027-01-15T07:00:00Z"},
           "status": {"podIP": "10.0.0.7"}})
}

pub(crate) fn export_get() -> Expect {
    expect(
        Method::GET,
        "/apis/larch.dev/v1alpha1/namespaces/data/archiveexports/users",
        Some(serde_json::to_value(export_fixture("export-oneshot-s3")).unwrap()),
    )
}

/// A tenant's pod with the engines' labels but no owner chain to the source.
pub(crate) const IMPOSTOR_IP: &str = "10.0.0.66";

/// The engine and, listed with it by the label, an impostor the operator must never probe.
pub(crate) fn pods_list() -> Expect {
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
pub(crate) fn export_gets() -> Vec<Expect> {
    let mut out = vec![export_get()];
    out.extend(users_references(false));
    out
}

/// The reads of the engines' optional children (NetworkPolicy, PodDisruptionBudget), neither
/// wanted nor present: nothing to prune.
pub(crate) fn optional_children_absent(source: &str) -> Vec<Expect> {
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
pub(crate) fn source_script(ready: i32) -> Vec<Expect> {
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
pub(crate) fn fill<K>(writer: &mut Writer<K>, objects: impl IntoIterator<Item = K>)
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
pub(crate) fn meta_of<K: kube::Resource<DynamicType = ()>>(body: &Value) -> PartialObjectMeta<K> {
    serde_json::from_value::<ObjectMeta>(body["metadata"].clone())
        .unwrap()
        .into_request_partial::<K>()
}

pub(crate) fn writers(ctx: &Context) -> CacheWriters {
    ctx.cache_writers.locked().take().unwrap()
}

/// Write requests counted by the operator's own metric.
pub(crate) fn writes(ctx: &Context) -> u64 {
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
pub(crate) fn same_operator(ctx: &Context, prober: Arc<FakeProber>) -> (Arc<Context>, Handle) {
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
pub(crate) struct FirstVisit {
    pub(crate) ctx: Arc<Context>,
    pub(crate) caches: CacheWriters,
    pub(crate) now: Arc<Mutex<Timestamp>>,
    pub(crate) s: ArchiveSource,
    pub(crate) status_path: String,
    pub(crate) bodies: Vec<Value>,
    pub(crate) action: kube::runtime::controller::Action,
}

pub(crate) fn continuous_tail_with(pods: Vec<Value>) -> Vec<Expect> {
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
pub(crate) const EVENTS_POST: &str = "/apis/events.k8s.io/v1/namespaces/data/events?";

// ---- ArchiveSourceSet ----

pub(crate) const MANAGER_SET_Q: &str = "&force=true&fieldManager=larch-operator%2Fsource-set";

pub(crate) fn set_owner() -> Value {
    json!([{"apiVersion": "larch.dev/v1alpha1", "kind": "ArchiveSourceSet", "name": "dev-seed",
            "uid": "5e7-uid", "controller": true, "blockOwnerDeletion": true}])
}

pub(crate) fn namespace(name: &str, labelled: bool) -> PartialObjectMeta<Namespace> {
    let labels = if labelled {
        json!({"larch.dev/seed": "events"})
    } else {
        json!({})
    };
    meta_of(&json!({"metadata": {"name": name, "labels": labels}}))
}

pub(crate) fn shared_secret() -> Value {
    json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "seed-reader", "namespace": "platform", "labels": {"team": "platform"}},
        "type": "Opaque", "data": {"AWS_ACCESS_KEY_ID": "YQ==", "AWS_SECRET_ACCESS_KEY": "Yg=="}})
}

/// What the restore fixture names: its S3 keys and the target's DSN, all present.
pub(crate) fn restore_references() -> Vec<Expect> {
    vec![
        secret_get("s3-credentials", Some(&["id", "secret"])),
        secret_get("pg-restore", Some(&["dsn"])),
    ]
}
