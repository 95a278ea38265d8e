//! Scenario 8: children garbage-collected with their custom resource; an operator restart
//! creates no duplicate Job.

use std::time::Duration;

use super::helpers::{
    export_manifest, get_cr, source_manifest, wait_export_succeeded, wait_source_ready,
};
use super::support::{Env, OPERATOR_NS, condition_is, env_with_operator, serial};

/// Scenario 8: Deleting a CR garbage-collects its children; restarting the operator (deleting its pod)
/// creates no duplicate Job.
#[test]
fn s08_garbage_collection_and_operator_restart() {
    let _g = serial();
    let e = env_with_operator();
    let ns = "e2e-gc";
    e.namespace(ns, &[]);
    e.bucket("gc-archives");
    e.apply(&export_manifest(
        e,
        ns,
        "gc",
        "events",
        "OneShot",
        "gc-archives",
    ));
    wait_export_succeeded(e, ns, "gc", None);
    e.apply(&source_manifest(ns, "gc-cache", "gc"));
    wait_source_ready(e, ns, "gc-cache");
    let jobs = |e: &Env| -> Vec<String> {
        e.list(&["jobs", "-n", ns])
            .iter()
            .map(|j| j["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    let before = jobs(e);
    assert_eq!(before.len(), 1, "{before:?}");

    // Operator restart.
    let old = e.list(&["pods", "-n", OPERATOR_NS]);
    let old_name = old[0]["metadata"]["name"].as_str().unwrap().to_string();
    e.kubectl(&["delete", "pod", &old_name, "-n", OPERATOR_NS, "--wait=true"]);
    e.wait_for(OPERATOR_NS, "a new Ready operator pod", 180, || {
        let pods = e.list(&["pods", "-n", OPERATOR_NS]);
        pods.iter()
            .find(|p| {
                p["metadata"]["name"] != old_name.as_str() && condition_is(p, "Ready", "True")
            })
            .cloned()
    });
    // Give the new operator time to reconcile everything (it requeues every 30s at most).
    std::thread::sleep(Duration::from_secs(35));
    assert_eq!(jobs(e), before, "no duplicate Job after the restart");
    assert!(condition_is(
        &get_cr(e, "archiveexport", ns, "gc"),
        "LastExportSucceeded",
        "True"
    ));
    assert_eq!(e.list(&["statefulsets", "-n", ns]).len(), 1);

    // Garbage collection.
    let sts = get_cr(e, "statefulset", ns, "gc-cache");
    assert_eq!(
        sts["metadata"]["ownerReferences"][0]["kind"],
        "ArchiveSource"
    );
    e.kubectl(&["delete", "archivesource", "gc-cache", "-n", ns]);
    e.kubectl(&["delete", "archiveexport", "gc", "-n", ns]);
    e.wait_for(ns, "children garbage-collected", 180, || {
        let left: usize = [
            "jobs",
            "statefulsets",
            "services",
            "configmaps",
            "deployments",
        ]
        .iter()
        .map(|k| {
            e.list(&[
                k,
                "-n",
                ns,
                "-l",
                "app.kubernetes.io/managed-by=larch-operator",
            ])
            .len()
        })
        .sum();
        let pods = e
            .list(&["pods", "-n", ns])
            .iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .count();
        (left == 0 && pods == 0).then_some(())
    });
}
