//! Scenario 21c: `larch run-now` and `larch logs` on the real control plane: a OneShot export
//! runs again when asked, and its pod's logs are printed through the API server (the fake
//! kubelet serves them as a kubelet does).

use std::process::Command;

use serde_json::Value;

use super::helpers::{export_manifest, wait_export_succeeded};
use super::support::{env_with_operator, serial};

/// `larch ARGS` with the environment's kubeconfig: (exit code, stdout, stderr).
fn larch(kubeconfig: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_larch"))
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .expect("running larch");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn s21c_run_now_starts_a_new_run_and_logs_prints_its_pod() {
    let _g = serial();
    let e = env_with_operator();
    let ns = "e2e-run-now";
    e.namespace(ns, &[]);
    e.bucket("run-now");
    e.apply(&export_manifest(
        e, ns, "events", "events", "OneShot", "run-now",
    ));
    let first = wait_export_succeeded(e, ns, "events", None);
    let first_run = first["status"]["run"]["id"].as_str().unwrap().to_string();

    let (code, out, err) = larch(
        &e.kubeconfig,
        &["run-now", "archiveexport/events", "-n", ns, "-o", "json"],
    );
    assert_eq!(code, 0, "{err}");
    let requested: Value = serde_json::from_str(&out).unwrap();
    let token = requested["token"].as_str().unwrap();
    let second = wait_export_succeeded(e, ns, "events", Some(&first_run));
    assert_eq!(second["status"]["run"]["token"], token, "{second}");
    assert_eq!(
        second["metadata"]["annotations"]["larch.dev/run-requested"],
        token
    );

    // The newest pod is the second run's: its summary (stdout) names the run's position.
    let (code, logs, err) = larch(&e.kubeconfig, &["logs", "archiveexport/events", "-n", ns]);
    assert_eq!(code, 0, "{err}");
    let position = second["status"]["lastExport"]["position"].as_str().unwrap();
    assert!(
        logs.contains(position),
        "no {position} in the logs:\n{logs}"
    );
    let (code, all, err) = larch(
        &e.kubeconfig,
        &["logs", "archiveexport/events", "-n", ns, "--all"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        all.matches("==> pod events-").count() >= 2,
        "both runs' pods:\n{all}"
    );

    // What cannot be run or has no pods is refused, naming why (exit 2).
    let (code, _, err) = larch(&e.kubeconfig, &["run-now", "archivesource/x", "-n", ns]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("run-now takes an archiveexport"), "{err}");
    let (code, _, err) = larch(&e.kubeconfig, &["run-now", "archiveexport/nope", "-n", ns]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("ArchiveExport e2e-run-now/nope not found"),
        "{err}"
    );
    let (code, _, err) = larch(&e.kubeconfig, &["logs", "archivesourceset/x"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("runs no pod of its own"), "{err}");
    e.kubectl(&["delete", "namespace", ns, "--wait=false"]);
}
