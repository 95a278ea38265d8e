//! Scenario 21: `larch status` and `kubectl larch status` on the real control plane: the one-shot
//! export, an ArchiveSource following it and the warning Events, as the CRs say them.

use std::process::Command;

use serde_json::Value;

use super::helpers::{oneshot_exported, source_manifest, wait_source_ready};
use super::support::{Env, env, serial, wait_until};

fn status(kubeconfig: &str, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_larch"))
        .arg("status")
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .expect("running larch status");
    assert!(
        out.status.success(),
        "larch status {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn s21_larch_status_shows_every_archive() {
    let _g = serial();
    let o = oneshot_exported();
    let e = env();
    let ns = "e2e-oneshot";
    e.apply(&source_manifest(ns, "status-cache", "events"));
    wait_source_ready(e, ns, "status-cache");

    let json: Value = serde_json::from_str(&status(&e.kubeconfig, &["-o", "json"])).unwrap();
    let export = json["exports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["namespace"] == ns && x["name"] == "events")
        .unwrap_or_else(|| panic!("no export {ns}/events in {json}"));
    let last = &o["status"]["lastExport"];
    assert_eq!(export["mode"], "OneShot", "{export}");
    assert_eq!(export["ready"], "True", "{export}");
    assert_eq!(export["position"], last["position"], "{export}");
    assert_eq!(export["rows"], last["rowCount"], "{export}");
    assert_eq!(export["epoch"], last["epoch"], "{export}");
    assert_eq!(export["run"], "succeeded", "{export}");
    let source = json["sources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["namespace"] == ns && x["name"] == "status-cache")
        .unwrap_or_else(|| panic!("no source {ns}/status-cache in {json}"));
    assert_eq!(source["ready"], "True", "{source}");
    assert_eq!(source["engines_ready"], 1, "{source}");
    for w in json["warnings"].as_array().unwrap() {
        let object = w["object"].as_str().unwrap();
        assert!(object.starts_with("Archive"), "only larch's kinds: {w}");
    }

    // -n limits the namespace; the screen has the export's line.
    let text = status(&e.kubeconfig, &["-n", ns]);
    let line = text
        .lines()
        .find(|l| l.starts_with(ns) && l.contains(" events ") && l.contains("OneShot"))
        .unwrap_or_else(|| panic!("no line for {ns}/events:\n{text}"));
    assert!(line.contains(last["position"].as_str().unwrap()), "{line}");
    assert!(
        text.contains("ARCHIVE SOURCES") && text.contains("status-cache"),
        "{text}"
    );
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("e2e-") && !l.starts_with(ns)),
        "other namespaces shown with -n:\n{text}"
    );

    // The same binary as a kubectl plugin.
    let bin = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_larch"),
        bin.path().join("kubectl-larch"),
    )
    .unwrap();
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new(&e.kubectl)
        .args(["larch", "status", "-n", ns, "-o", "json"])
        .env("PATH", path)
        .env("KUBECONFIG", &e.kubeconfig)
        .output()
        .expect("kubectl larch status");
    assert!(
        out.status.success(),
        "kubectl larch status: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plugin: Value = serde_json::from_slice(&out.stdout).unwrap();
    let listed = plugin["exports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == "events")
        .unwrap_or_else(|| panic!("kubectl larch status: no export events in {plugin}"));
    assert_eq!(listed["position"], last["position"], "{plugin}");
    e.kubectl(&["delete", "archivesource", "status-cache", "-n", ns]);
}

const VIEWER: &str = "status-viewer";
const RESTORE: &str = "status-back";
const RESTORE_DB: &str = "e2e_status_restored";

/// `larch ARGS` with nothing but the flags to find the cluster (`KUBECONFIG` points nowhere):
/// its exit success, stdout and stderr.
fn larch_as_viewer(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_larch"))
        .args(args)
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env("HOME", "/nonexistent")
        .output()
        .expect("running larch status");
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A completed ArchiveRestore `status-back` of export `events` in `ns`, into its own database.
fn restore_completed(e: &Env, ns: &str) -> Value {
    e.sql(&format!("DROP DATABASE IF EXISTS {RESTORE_DB}"));
    e.sql(&format!("CREATE DATABASE {RESTORE_DB}"));
    let dsn = e
        .pg_dsn
        .replace("dbname=app", &format!("dbname={RESTORE_DB}"));
    e.apply(&format!(
        r#"apiVersion: v1
kind: Secret
metadata: {{name: pg-status-restored, namespace: {ns}}}
stringData: {{dsn: "{dsn}"}}
---
apiVersion: larch.dev/v1alpha1
kind: ArchiveRestore
metadata: {{name: {RESTORE}, namespace: {ns}}}
spec:
  archive:
    exportRef: {{name: events}}
  target:
    postgres:
      connectionSecretRef: {{name: pg-status-restored, key: dsn}}
  ifExists: Replace
  backoffLimit: 0
"#
    ));
    e.wait_for(
        ns,
        &format!("ArchiveRestore {ns}/{RESTORE} run ended"),
        240,
        || {
            let o = e.get(&["archiverestore", RESTORE, "-n", ns])?;
            o["status"]["run"]["succeeded"].is_boolean().then_some(o)
        },
    )
}

/// A kubeconfig for ServiceAccount `status-viewer` of `ns`, bound only to the built-in `view`
/// there (which the chart's aggregated role extends to larch's kinds). Its current context
/// points at a closed port: only `--context viewer` reaches the cluster.
fn viewer_kubeconfig(e: &Env, ns: &str, dir: &std::path::Path) -> String {
    e.apply(&format!(
        r#"apiVersion: v1
kind: ServiceAccount
metadata: {{name: {VIEWER}, namespace: {ns}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: {VIEWER}, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: view}}
subjects: [{{kind: ServiceAccount, name: {VIEWER}, namespace: {ns}}}]
"#
    ));
    let who = format!("--as=system:serviceaccount:{ns}:{VIEWER}");
    wait_until("view aggregates the chart's rules", 60, || {
        let out = e.kubectl_out(
            &["auth", "can-i", "list", "archiverestores", "-n", ns, &who],
            None,
        );
        String::from_utf8_lossy(&out.stdout).trim() == "yes"
    });
    let token = e.kubectl(&["create", "token", VIEWER, "-n", ns, "--duration=1h"]);
    let admin: Value = serde_json::from_str(&e.kubectl(&[
        "config",
        "view",
        "--raw",
        "--minify",
        "--flatten",
        "-o",
        "json",
    ]))
    .unwrap();
    let cluster = &admin["clusters"][0]["cluster"];
    let path = dir.join("viewer.kubeconfig");
    std::fs::write(
        &path,
        format!(
            r#"apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster: {{server: "{}", certificate-authority-data: "{}"}}
- name: closed
  cluster: {{server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}
users:
- name: viewer
  user: {{token: "{}"}}
contexts:
- name: viewer
  context: {{cluster: e2e, user: viewer, namespace: {ns}}}
- name: elsewhere
  context: {{cluster: closed, user: viewer}}
current-context: elsewhere
"#,
            cluster["server"].as_str().unwrap(),
            cluster["certificate-authority-data"].as_str().unwrap(),
            token.trim()
        ),
    )
    .unwrap();
    path.display().to_string()
}

fn named<'a>(list: &'a Value, name: &str) -> &'a Value {
    list.as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {list}"))
}

/// Scenario 21b (issue 41): a developer bound only to `view` in one namespace runs `larch
/// status` with `--kubeconfig` and `--context`: that namespace's export and restore, the
/// cluster-scoped ArchiveSourceSets skipped with a note; without `-n` the kinds refused in
/// every namespace are shown for the context's namespace, with a note; one object's view.
#[test]
fn s21b_larch_status_as_a_namespace_viewer() {
    let _g = serial();
    let o = oneshot_exported();
    let e = env();
    let ns = "e2e-oneshot";
    let restore = restore_completed(e, ns);
    assert_eq!(
        restore["status"]["run"]["succeeded"],
        true,
        "{}",
        e.diagnostics(ns)
    );
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = viewer_kubeconfig(e, ns, dir.path());
    let flags = ["status", "--kubeconfig", &kubeconfig, "--context", "viewer"];

    let (ok, stdout, stderr) = larch_as_viewer(&[&flags[..], &["-n", ns, "-o", "json"]].concat());
    assert!(ok, "larch status -n {ns} as the viewer: {stderr}");
    let json: Value = serde_json::from_str(&stdout).unwrap();
    let last = &o["status"]["lastExport"];
    let export = named(&json["exports"], "events");
    assert_eq!(export["position"], last["position"], "{json}");
    let r = named(&json["restores"], RESTORE);
    assert_eq!(r["namespace"], ns, "{r}");
    assert_eq!(r["ready"], "True", "{r}");
    assert_eq!(r["run"], "succeeded", "{r}");
    assert_eq!(r["position"], restore["status"]["position"], "{r}");
    assert_eq!(r["rows"], restore["status"]["tables"][0]["rows"], "{r}");
    assert_eq!(r["tables"], serde_json::json!(["public.events"]), "{r}");
    assert_eq!(
        json["notes"],
        serde_json::json!(["ArchiveSourceSets: not allowed to list (cluster-scoped)"]),
        "{json}"
    );

    let (ok, text, stderr) = larch_as_viewer(&[&flags[..], &["-n", ns]].concat());
    assert!(ok, "{stderr}");
    let line = text
        .lines()
        .find(|l| l.starts_with(ns) && l.contains(RESTORE))
        .unwrap_or_else(|| panic!("no line for {ns}/{RESTORE}:\n{text}"));
    assert!(line.contains("succeeded"), "{line}");
    assert!(
        text.contains("\nNOTES\nArchiveSourceSets: not allowed to list (cluster-scoped)\n"),
        "{text}"
    );

    // Every namespace: refused, so the context's namespace, said once per kind.
    let (ok, stdout, stderr) = larch_as_viewer(&[&flags[..], &["-o", "json"]].concat());
    assert!(ok, "larch status as the viewer, every namespace: {stderr}");
    let json: Value = serde_json::from_str(&stdout).unwrap();
    named(&json["exports"], "events");
    named(&json["restores"], RESTORE);
    let notes: Vec<&str> = json["notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    for kind in [
        "ArchiveExports",
        "ArchiveSources",
        "ArchiveRestores",
        "Events",
    ] {
        let said = format!(
            "{kind}: not allowed to list in every namespace; showing namespace {ns} (the kubeconfig's)"
        );
        assert!(notes.contains(&said.as_str()), "{said} in {notes:?}");
    }
    assert!(notes.contains(&"ArchiveSourceSets: not allowed to list (cluster-scoped)"));

    // A namespace the viewer has no rights in: notes, no failure; the default context: refused.
    let (ok, stdout, stderr) =
        larch_as_viewer(&[&flags[..], &["-n", "default", "-o", "json"]].concat());
    assert!(ok, "{stderr}");
    let json: Value = serde_json::from_str(&stdout).unwrap();
    assert!(
        json["notes"]
            .to_string()
            .contains("ArchiveExports: not allowed to list in namespace default"),
        "{json}"
    );
    let (ok, _, stderr) = larch_as_viewer(&["status", "--kubeconfig", &kubeconfig]);
    assert!(
        !ok && stderr.contains("the cluster at https://127.0.0.1:1/"),
        "the current context's server: {stderr}"
    );

    // One object: the restore's conditions and Events (namespace from the context).
    e.wait_for(ns, "Event RestoreSucceeded", 60, || {
        e.list(&["events", "-n", ns])
            .iter()
            .any(|ev| ev["involvedObject"]["name"] == RESTORE && ev["reason"] == "RestoreSucceeded")
            .then_some(())
    });
    let object = format!("archiverestore/{RESTORE}");
    let (ok, stdout, stderr) =
        larch_as_viewer(&[&flags[..], &[object.as_str(), "-o", "json"]].concat());
    assert!(ok, "larch status {object}: {stderr}");
    let view: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(view["kind"], "ArchiveRestore", "{view}");
    let ready = named_type(&view["conditions"], "Ready");
    assert_eq!(ready["status"], "True", "{view}");
    let reasons: Vec<&Value> = view["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["reason"])
        .collect();
    assert!(reasons.iter().any(|r| *r == "RestoreSucceeded"), "{view}");
    let (ok, text, stderr) = larch_as_viewer(&[&flags[..], &[object.as_str()]].concat());
    assert!(ok, "{stderr}");
    assert!(
        text.starts_with(&format!("ArchiveRestore {ns}/{RESTORE}\n")),
        "{text}"
    );
    assert!(
        text.contains("\nCONDITIONS\n") && text.contains("RestoreSucceeded"),
        "{text}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_larch"))
        .args([&flags[..], &["archiveexport/nope"]].concat())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "no such object: {stderr}");
    assert!(stderr.contains("ArchiveExport nope not found"), "{stderr}");

    e.kubectl(&["delete", "archiverestore", RESTORE, "-n", ns]);
    e.kubectl(&["delete", "rolebinding,serviceaccount", VIEWER, "-n", ns]);
}

fn named_type<'a>(list: &'a Value, type_: &str) -> &'a Value {
    list.as_array()
        .unwrap()
        .iter()
        .find(|x| x["type"] == type_)
        .unwrap_or_else(|| panic!("no condition {type_} in {list}"))
}
