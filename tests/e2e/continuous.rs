//! Continuous exports: scenario 5 (followed by an engine, restorable at a time) and 12 (two
//! exporters, only the Lease holder writes).

use serde_json::Value;

use super::helpers::{
    archive_row_count, continuous_export_of_copy, engine_ip, engine_rows, engine_tuples, get_cr,
    pg_rows, source_manifest, wait_engine_matches, wait_source_ready, writer_pods,
};
use super::support::{Env, env_with_operator, serial};

/// Scenario 5: a Continuous ArchiveExport (a Deployment running `larch export --follow`) and an
/// ArchiveSource following it: rows inserted, updated and deleted in PostgreSQL show up through
/// the engine. Then an ArchiveSource with `at.time` serves the table as it was at that time (a
/// later transaction is not in it), its status shows the point served, and the export's status
/// shows the restorable window.
#[test]
fn s05_continuous_export_followed_by_engine() {
    let _g = serial();
    let e = env_with_operator();
    let ns = "e2e-continuous";
    continuous_export_of_copy(e, ns, "followed", 500, "continuous");
    e.apply(&source_manifest(ns, "followed-cache", "followed"));
    wait_source_ready(e, ns, "followed-cache");
    wait_engine_matches(e, ns, "followed-cache", "followed");

    e.sql(
        "INSERT INTO public.followed SELECT id + 20000, tenant, kind, amount, payload, created_at, \
           tags, flag, ref, blob FROM public.events WHERE id <= 25; \
         UPDATE public.followed SET tenant = 'updated', kind = NULL, amount = 99.99 WHERE id BETWEEN 10 AND 19; \
         DELETE FROM public.followed WHERE id BETWEEN 100 AND 149",
    );
    wait_engine_matches(e, ns, "followed-cache", "followed");
    // A second transaction after the first has been followed.
    e.sql("UPDATE public.followed SET flag = NOT flag WHERE id = 1; DELETE FROM public.followed WHERE id = 2");
    wait_engine_matches(e, ns, "followed-cache", "followed");

    // The table at a time, then a transaction after it that the pinned source must not serve.
    let then = pg_rows(e, "followed");
    let at = e
        .sql("SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')")
        .trim()
        .to_string();
    e.sql("DELETE FROM public.followed WHERE id BETWEEN 300 AND 399; UPDATE public.followed SET tenant = 'later' WHERE id = 5");
    wait_engine_matches(e, ns, "followed-cache", "followed");
    e.apply(&format!(
        r#"apiVersion: larch.dev/v1alpha1
kind: ArchiveSource
metadata: {{name: followed-then, namespace: {ns}}}
spec:
  archive:
    exportRef: {{name: followed}}
  at: {{time: "{at}"}}
  target:
    memory: {{}}
"#
    ));
    let o = wait_source_ready(e, ns, "followed-then");
    let ip = engine_ip(e, ns, "followed-then");
    let served = engine_tuples(&engine_rows(e, &ip, "public.followed").unwrap());
    assert_eq!(served.len(), then.len(), "rows at {at}");
    assert!(
        served == then,
        "the pinned engine serves the table as it was at {at}"
    );
    let restored = e.wait_for(ns, "status.restored of followed-then", 120, || {
        let o = e.get(&["archivesource", "followed-then", "-n", ns])?;
        o["status"]["restored"]["position"]
            .as_str()
            .map(|_| o["status"]["restored"].clone())
    });
    assert_eq!(restored["precision"], "transaction", "{o}");
    let time = |t: &str| chrono::DateTime::parse_from_rfc3339(t).unwrap();
    assert!(
        time(restored["time"].as_str().unwrap()) <= time(&at),
        "{restored}"
    );
    let export = get_cr(e, "archiveexport", ns, "followed");
    let window = &export["status"]["writers"][0]["restorable"];
    assert!(
        window["earliestTime"].is_string() && window["latestPosition"].is_string(),
        "{export}"
    );
}

fn lease_holder(e: &Env, ns: &str, name: &str) -> Option<String> {
    e.get(&["lease", name, "-n", ns])?["spec"]["holderIdentity"]
        .as_str()
        .map(str::to_string)
}

fn pod_status_json(e: &Env, ns: &str, pod: &str) -> Option<Value> {
    let p = e.get(&["pod", pod, "-n", ns])?;
    let ip = p["status"]["podIP"].as_str()?;
    e.http_json(&format!("http://{ip}:8080/status"))
}

/// Scenario 12 (W9): two exporters for one ArchiveExport — the operator's Deployment pod and a
/// copy of its pod — and only the Lease holder writes; a holder whose Lease is taken stops and
/// exits with status 3; after the Lease expires exactly one exporter takes over and writes.
#[test]
fn s12_two_exporters_only_the_lease_holder_writes() {
    let _g = serial();
    let e = env_with_operator();
    let ns = "e2e-lease";
    continuous_export_of_copy(e, ns, "leased", 300, "lease");
    // Exactly the Lease rights the exporter needs, on exactly its Lease.
    let role = get_cr(e, "role", ns, "leased-export-lease");
    assert_eq!(
        role["rules"][0]["resourceNames"],
        serde_json::json!(["leased"])
    );
    assert_eq!(
        role["rules"][0]["verbs"],
        serde_json::json!(["get", "update"])
    );
    let first = e.wait_for(ns, "the writer pod holding the Lease", 120, || {
        let pods = writer_pods(e, ns, "leased");
        let name = pods.first()?["metadata"]["name"].as_str()?.to_string();
        (lease_holder(e, ns, "leased").as_deref() == Some(name.as_str())).then_some(name)
    });

    // A second exporter: the same pod template, outside the Deployment.
    let dep = get_cr(e, "deployment", ns, "leased");
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "leased-second", "namespace": ns, "labels": {"e2e": "second-writer"}},
        "spec": dep["spec"]["template"]["spec"],
    });
    e.apply(&pod.to_string());
    e.wait_for(ns, "the second exporter waiting for the Lease", 120, || {
        let s = pod_status_json(e, ns, "leased-second")?;
        (s["state"] == "WAITING_FOR_LEASE").then_some(())
    });
    let diffs = |pod: &str| {
        pod_status_json(e, ns, pod)
            .and_then(|s| s["diffs"].as_u64())
            .unwrap_or(0)
    };
    let before = diffs(&first);
    e.sql(
        "INSERT INTO public.leased SELECT id + 50000, tenant, kind, amount, payload, created_at, \
           tags, flag, ref, blob FROM public.events WHERE id <= 20",
    );
    e.wait_for(ns, "the holder to write the change", 120, || {
        (diffs(&first) > before).then_some(())
    });
    let table_count = || -> i64 { e.sql("SELECT count(*) FROM public.leased").parse().unwrap() };
    e.wait_for(ns, "the archive to hold the change", 60, || {
        (archive_row_count(e, "lease", "public.leased/") == table_count()).then_some(())
    });
    let second = pod_status_json(e, ns, "leased-second").expect("second exporter status");
    assert_eq!(second["state"], "WAITING_FOR_LEASE", "{second}");
    assert_eq!(second["diffs"], 0, "{second}");
    assert_eq!(second["snapshots"], 0, "{second}");

    // Someone else takes the Lease: the holder stops writing at once and exits with status 3.
    let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%.6fZ");
    e.kubectl(&[
        "patch",
        "lease",
        "leased",
        "-n",
        ns,
        "--type",
        "merge",
        "-p",
        &format!(r#"{{"spec":{{"holderIdentity":"e2e-thief","renewTime":"{now}"}}}}"#),
    ]);
    e.wait_for(ns, "the former holder to exit with status 3", 60, || {
        let p = e.get(&["pod", &first, "-n", ns])?;
        let c = &p["status"]["containerStatuses"][0];
        [&c["lastState"]["terminated"], &c["state"]["terminated"]]
            .iter()
            .any(|t| t["exitCode"] == 3)
            .then_some(())
    });

    // The thief never renews: once its Lease expires exactly one exporter takes over and writes.
    e.sql(
        "UPDATE public.leased SET tenant = 'after-handover' WHERE id <= 10; \
         DELETE FROM public.leased WHERE id BETWEEN 50001 AND 50005",
    );
    let holder = e.wait_for(ns, "a new holder", 120, || {
        let h = lease_holder(e, ns, "leased")?;
        (h == first || h == "leased-second").then_some(h)
    });
    e.wait_for(ns, "the new holder to write the changes", 120, || {
        let updated = e.sql("SELECT count(*) FROM public.leased WHERE tenant = 'after-handover'");
        let (_, rows) = (updated, archive_row_count(e, "lease", "public.leased/"));
        (rows == table_count()).then_some(())
    });
    let other = if holder == first {
        "leased-second".to_string()
    } else {
        first.clone()
    };
    e.wait_for(ns, "the other exporter to wait", 60, || {
        let s = pod_status_json(e, ns, &other)?;
        (s["state"] == "WAITING_FOR_LEASE").then_some(())
    });
    assert!(diffs(&holder) > 0, "the new holder writes");
    e.kubectl(&["delete", "pod", "leased-second", "-n", ns, "--wait=false"]);
    e.kubectl(&[
        "delete",
        "archiveexport",
        "leased",
        "-n",
        ns,
        "--wait=false",
    ]);
}
