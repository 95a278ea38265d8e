//! Scenario 27: an ArchiveRestore of the one-shot export completes into a second database: the
//! restored table equals the source, status and conditions say so with the rows, position and
//! duration, Events `RestoreStarted` and `RestoreSucceeded`; a new `larch.dev/run-requested`
//! restores again (`ifExists: Replace`); a restore into a table that exists with `ifExists:
//! Fail` stalls naming the table; one at a time before the archive starts stalls naming the
//! earliest point.

use serde_json::Value;

use super::helpers::oneshot_exported;
use super::support::{Env, condition_is, env, serial};

const NS: &str = "e2e-oneshot";
const DATABASE: &str = "e2e_restored";

fn digest(e: &Env, database: &str) -> String {
    e.sql_in(
        database,
        "SELECT count(*)::text || ' rows, md5 ' || md5(string_agg(t::text, '|' ORDER BY id)) FROM public.events t",
    )
}

fn restore_manifest(name: &str, if_exists: &str) -> String {
    format!(
        r#"apiVersion: larch.dev/v1alpha1
kind: ArchiveRestore
metadata: {{name: {name}, namespace: {NS}}}
spec:
  archive:
    exportRef: {{name: events}}
  target:
    postgres:
      connectionSecretRef: {{name: pg-restored, key: dsn}}
  ifExists: {if_exists}
  backoffLimit: 0
"#
    )
}

/// Waits for the restore's run other than `after_run` to end; returns the object.
fn wait_run_ended(e: &Env, name: &str, after_run: Option<&str>) -> Value {
    e.wait_for(
        NS,
        &format!("ArchiveRestore {NS}/{name} run ended"),
        240,
        || {
            let o = e.get(&["archiverestore", name, "-n", NS])?;
            let run = &o["status"]["run"];
            (run["succeeded"].is_boolean() && run["id"].as_str() != after_run).then_some(o)
        },
    )
}

/// The Stalled condition and its message.
fn stalled_condition(o: &Value) -> (Value, String) {
    let c = o["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Stalled")
        .unwrap()
        .clone();
    let message = c["message"].as_str().unwrap().to_string();
    (c, message)
}

fn event_reasons(e: &Env, name: &str) -> Vec<String> {
    e.list(&["events", "-n", NS])
        .iter()
        .filter(|ev| ev["involvedObject"]["name"] == name)
        .filter_map(|ev| ev["reason"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn s27_archive_restore_completes_into_a_second_database() {
    let _g = serial();
    let exported = oneshot_exported();
    let e = env();
    e.sql(&format!("DROP DATABASE IF EXISTS {DATABASE}"));
    e.sql(&format!("CREATE DATABASE {DATABASE}"));
    let dsn = e
        .pg_dsn
        .replace("dbname=app", &format!("dbname={DATABASE}"));
    assert_ne!(dsn, e.pg_dsn, "the DSN names its database: {}", e.pg_dsn);
    e.apply(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: pg-restored, namespace: {NS}}}\nstringData:\n  dsn: \"{dsn}\"\n"
    ));
    let source = digest(e, "app");

    e.apply(&restore_manifest("events-back", "Replace"));
    let o = wait_run_ended(e, "events-back", None);
    let status = &o["status"];
    assert_eq!(status["run"]["succeeded"], true, "{}", e.diagnostics(NS));
    assert!(condition_is(&o, "Ready", "True"), "{status}");
    assert!(condition_is(&o, "Reconciling", "False"), "{status}");
    assert!(condition_is(&o, "Stalled", "False"), "{status}");
    assert_eq!(
        digest(e, DATABASE),
        source,
        "the restored table equals the source"
    );
    let rows: i64 = e.sql("SELECT count(*) FROM public.events").parse().unwrap();
    assert_eq!(status["tables"][0]["table"], "public.events", "{status}");
    assert_eq!(status["tables"][0]["rows"].as_i64(), Some(rows), "{status}");
    assert_eq!(status["tables"][0]["action"], "created", "{status}");
    let position = &exported["status"]["lastExport"]["position"];
    assert_eq!(&status["position"], position, "{status}");
    assert!(status["durationSeconds"].as_f64().is_some(), "{status}");
    // status.progress: read from the pod's /status while it ran, then Complete with the rows.
    let progress = &status["progress"];
    assert_eq!(progress["phase"], "Complete", "{status}");
    assert_eq!(progress["rows"].as_i64(), Some(rows), "{status}");
    assert_eq!(progress["percent"], "100%", "{status}");
    let first_run = status["run"]["id"].as_str().unwrap().to_string();
    e.wait_for(NS, "RestoreStarted and RestoreSucceeded Events", 60, || {
        let reasons = event_reasons(e, "events-back");
        (reasons.iter().any(|r| r == "RestoreStarted")
            && reasons.iter().any(|r| r == "RestoreSucceeded"))
        .then_some(())
    });

    // A rerun by annotation replaces the rows (changed since by hand) with the archive's again.
    e.sql_in(DATABASE, "DELETE FROM public.events WHERE id % 2 = 0");
    assert_ne!(digest(e, DATABASE), source);
    e.kubectl(&[
        "annotate",
        "archiverestore",
        "events-back",
        "-n",
        NS,
        "larch.dev/run-requested=rerun-1",
        "--overwrite",
    ]);
    let o = wait_run_ended(e, "events-back", Some(&first_run));
    assert_eq!(o["status"]["run"]["succeeded"], true, "{}", o["status"]);
    assert_eq!(o["status"]["run"]["token"], "rerun-1");
    assert_eq!(o["status"]["tables"][0]["action"], "replaced");
    assert_eq!(digest(e, DATABASE), source, "restored again");

    // Into the table that now exists, with Fail: Stalled, naming the table; the rows stay.
    e.apply(&restore_manifest("events-again", "Fail"));
    let o = wait_run_ended(e, "events-again", None);
    assert_eq!(o["status"]["run"]["succeeded"], false, "{}", o["status"]);
    assert!(condition_is(&o, "Stalled", "True"), "{}", o["status"]);
    let (stalled, message) = stalled_condition(&o);
    assert!(
        message.contains("table public.events already exists"),
        "{stalled}"
    );
    assert_eq!(digest(e, DATABASE), source, "left untouched");
    e.wait_for(NS, "a RestoreFailed Event", 60, || {
        event_reasons(e, "events-again")
            .iter()
            .any(|r| r == "RestoreFailed")
            .then_some(())
    });

    // At a time before the archive starts: Stalled, naming the earliest point; nothing written.
    e.apply(&format!(
        r#"apiVersion: larch.dev/v1alpha1
kind: ArchiveRestore
metadata: {{name: events-too-early, namespace: {NS}}}
spec:
  archive:
    exportRef: {{name: events}}
  at: {{time: "2000-01-01T00:00:00Z"}}
  target:
    postgres:
      connectionSecretRef: {{name: pg-restored, key: dsn}}
  ifExists: Replace
  backoffLimit: 0
"#
    ));
    let o = wait_run_ended(e, "events-too-early", None);
    assert_eq!(o["status"]["run"]["succeeded"], false, "{}", o["status"]);
    assert!(condition_is(&o, "Stalled", "True"), "{}", o["status"]);
    let (stalled, message) = stalled_condition(&o);
    assert!(
        message.contains("predates the archive: its earliest point is position "),
        "{stalled}"
    );
    assert_eq!(digest(e, DATABASE), source, "nothing written");
}
