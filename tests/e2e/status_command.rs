//! Scenario 21: `larch status` and `kubectl larch status` on the real control plane: the one-shot
//! export, an ArchiveSource following it and the warning Events, as the CRs say them.

use std::process::Command;

use serde_json::Value;

use super::helpers::{oneshot_exported, source_manifest, wait_source_ready};
use super::support::{env, serial};

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
