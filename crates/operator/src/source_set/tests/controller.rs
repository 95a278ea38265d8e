//! The ArchiveSourceSet controller against a scripted API server: copies, pruning, CA bundles,
//! large fleets and stamped restores.

use std::sync::Arc;

use http::Method;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::runtime::reflector::store::Writer;
use serde_json::{Value, json};

use crate::crd::ArchiveSource;
use crate::reconcile::tests::harness::*;
use crate::source_set::reconcile as source_set;

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
