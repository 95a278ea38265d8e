//! The ArchiveSource controller against a scripted API server: children, caches, rebaselines,
//! engine failures, lag and the generated API token.

use larch_core::locks::MutexExt;
use std::sync::Arc;
use std::time::Duration;

use http::Method;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use serde_json::{Value, json};

use crate::builders::tests::source_fixture;
use crate::reconcile::context::CacheWriters;
use crate::reconcile::tests::harness::*;
use crate::source::reconcile as source;

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
