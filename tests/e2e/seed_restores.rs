//! Scenario 29: an ArchiveSourceSet with a `restoreTemplate` seeds each selected namespace's own
//! PostgreSQL database (one database per namespace on the test PostgreSQL, its DSN in a Secret
//! of the same name in every namespace): each is restored to exactly the seed; a namespace whose
//! database is down shows `DatabaseUnavailable` in the set's status and recovers by itself once
//! it is back; `refresh: OnNewEpoch` restores every namespace again after a new one-shot export
//! (a new epoch), replacing the seeded table while a developer's own table survives; a
//! namespace that stops matching loses its ArchiveRestore, not its data.

use serde_json::Value;

use super::helpers::{export_manifest, wait_export_succeeded};
use super::support::{Env, env_with_operator, serial};

const SRC: &str = "e2e-seed29";
const BUCKET: &str = "seed29";
const SET: &str = "seed29";
const DEVS: [&str; 3] = ["e2e-seed29-a", "e2e-seed29-b", "e2e-seed29-c"];
const LABEL: (&str, &str) = ("larch.dev/seed29", "dev");

fn database(ns: &str) -> String {
    format!("seed29_{}", ns.rsplit('-').next().unwrap())
}

fn digest(e: &Env, database: &str) -> String {
    e.sql_in(
        database,
        "SELECT count(*)::text || ' rows, md5 ' || md5(string_agg(t::text, '|' ORDER BY id)) FROM public.events t",
    )
}

fn set_status(e: &Env) -> Value {
    e.get(&["archivesourceset", SET])
        .map(|o| o["status"].clone())
        .unwrap_or_default()
}

/// The set's record of namespace `ns`.
fn restore_entry(status: &Value, ns: &str) -> Value {
    status["restores"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["namespace"] == ns)
        .cloned()
        .unwrap_or_default()
}

/// Waits until the set reports every namespace of `namespaces` refreshed at `epoch`, none
/// failing; returns the set's status.
fn wait_refreshed(e: &Env, namespaces: &[&str], epoch: i64, what: &str) -> Value {
    e.wait_for(SRC, what, 150, || {
        let st = set_status(e);
        namespaces
            .iter()
            .all(|ns| {
                let r = restore_entry(&st, ns);
                r["epoch"] == epoch
                    && r["lastRefreshTime"].is_string()
                    && r["failureReason"].is_null()
            })
            .then_some(st)
    })
}

#[test]
fn s29_source_set_seeds_each_namespaces_own_postgres() {
    let _g = serial();
    let e = env_with_operator();
    e.namespace(SRC, &[]);
    e.bucket(BUCKET);
    e.apply(&export_manifest(
        e, SRC, "events", "events", "OneShot", BUCKET,
    ));
    let exported = wait_export_succeeded(e, SRC, "events", None);
    let last = &exported["status"]["lastExport"];
    let key_prefix = last["keyPrefix"]
        .as_str()
        .unwrap_or("public.events/")
        .to_string();
    let first_epoch = last["epoch"].as_i64().expect("the export's epoch");
    let first_run = exported["status"]["run"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let source = digest(e, "app");

    for ns in DEVS {
        let db = database(ns);
        e.sql(&format!("DROP DATABASE IF EXISTS {db}_down"));
        e.sql(&format!("DROP DATABASE IF EXISTS {db}"));
        e.sql(&format!("CREATE DATABASE {db}"));
        e.namespace(ns, &[LABEL]);
        let dsn = e.pg_dsn.replace("dbname=app", &format!("dbname={db}"));
        assert_ne!(dsn, e.pg_dsn, "the DSN names its database: {}", e.pg_dsn);
        e.apply(&format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: app-db, namespace: {ns}}}\nstringData:\n  uri: \"{dsn}\"\n"
        ));
    }
    // c's database is down (gone under its name) before its first restore.
    let down = database(DEVS[2]);
    e.sql(&format!("ALTER DATABASE {down} RENAME TO {down}_down"));

    e.apply(&format!(
        r#"apiVersion: larch.dev/v1alpha1
kind: ArchiveSourceSet
metadata: {{name: {SET}}}
spec:
  namespaceSelector:
    matchLabels: {{{k}: {v}}}
  credentials:
    secretRef: {{namespace: {SRC}, name: s3-credentials}}
    shareToNamespaces: true
  restoreTemplate:
    refresh: OnNewEpoch
    spec:
      archive:
        s3:
          bucket: {BUCKET}
          region: us-east-1
          endpoint: {endpoint}
          pathStyle: true
          credentials:
            secretRef: {{name: s3-credentials}}
        keyPrefix: {key_prefix}
      tables: [{{schema: public, name: events}}]
      target:
        postgres:
          connectionSecretRef: {{name: app-db, key: uri}}
      backoffLimit: 0
"#,
        k = LABEL.0,
        v = LABEL.1,
        endpoint = e.s3_endpoint
    ));

    // a and b: restored to exactly the seed; c: failing, waiting for its database.
    let st = e.wait_for(SRC, "a and b seeded, c DatabaseUnavailable", 150, || {
        let st = set_status(e);
        let seeded = DEVS[..2]
            .iter()
            .all(|ns| restore_entry(&st, ns)["lastRefreshTime"].is_string());
        let failing = st["failingNamespaces"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|f| f["namespace"] == DEVS[2] && f["reason"] == "DatabaseUnavailable");
        (seeded && failing).then_some(st)
    });
    assert_eq!(st["desiredNamespaces"], 3, "{st}");
    assert_eq!(st["headEpoch"].as_i64(), Some(first_epoch), "{st}");
    let rows: i64 = e.sql("SELECT count(*) FROM public.events").parse().unwrap();
    for ns in &DEVS[..2] {
        assert_eq!(
            digest(e, &database(ns)),
            source,
            "{ns} holds exactly the seed"
        );
        let r = restore_entry(&st, ns);
        assert_eq!(r["rows"].as_i64(), Some(rows), "{r}");
        assert_eq!(r["epoch"].as_i64(), Some(first_epoch), "{r}");
        assert!(r["durationSeconds"].as_f64().is_some(), "{r}");
    }
    let c = restore_entry(&st, DEVS[2]);
    assert_eq!(c["failureReason"], "DatabaseUnavailable", "{c}");
    let message = c["failureMessage"].as_str().unwrap_or_default();
    assert!(message.contains("does not exist"), "{message}");
    assert!(!message.contains("password="), "{message}");

    // c's database comes back: it recovers by itself.
    e.sql(&format!("ALTER DATABASE {down}_down RENAME TO {down}"));
    let st = wait_refreshed(e, &DEVS, first_epoch, "c recovered, all three seeded");
    assert_eq!(st["readyNamespaces"], 3, "{st}");
    assert!(
        st["failingNamespaces"].as_array().unwrap().is_empty(),
        "{st}"
    );
    assert_eq!(digest(e, &down), source, "c holds exactly the seed");

    // A developer works in a's database: their own table, and changes to the seeded one.
    let a = database(DEVS[0]);
    e.sql_in(
        &a,
        "CREATE TABLE public.mine (note text); INSERT INTO public.mine VALUES ('keep me')",
    );
    e.sql_in(&a, "DELETE FROM public.events WHERE id % 2 = 0");
    assert_ne!(digest(e, &a), source);

    // A new one-shot export: a new epoch; every namespace is restored again.
    e.kubectl(&[
        "annotate",
        "archiveexport",
        "events",
        "-n",
        SRC,
        "larch.dev/run-requested=seed29-epoch-2",
        "--overwrite",
    ]);
    let exported = wait_export_succeeded(e, SRC, "events", Some(&first_run));
    let epoch = exported["status"]["lastExport"]["epoch"].as_i64().unwrap();
    assert!(
        epoch > first_epoch,
        "a new epoch: {epoch} after {first_epoch}"
    );
    let st = wait_refreshed(
        e,
        &DEVS,
        epoch,
        "every namespace refreshed at the new epoch",
    );
    assert_eq!(st["headEpoch"].as_i64(), Some(epoch), "{st}");
    assert_eq!(digest(e, &a), source, "the seeded table is replaced");
    assert_eq!(
        e.sql_in(&a, "SELECT string_agg(note, ',') FROM public.mine"),
        "keep me",
        "the developer's own table is untouched"
    );
    let r = e
        .get(&["archiverestore", SET, "-n", DEVS[0]])
        .expect("a's ArchiveRestore");
    assert_eq!(
        r["status"]["tables"][0]["action"], "replaced",
        "{}",
        r["status"]
    );

    // b stops matching: its ArchiveRestore goes, its database stays as it is.
    e.kubectl(&["label", "namespace", DEVS[1], &format!("{}-", LABEL.0)]);
    e.wait_for(DEVS[1], "b's ArchiveRestore deleted", 60, || {
        e.get(&["archiverestore", SET, "-n", DEVS[1]])
            .is_none()
            .then_some(())
    });
    assert_eq!(
        digest(e, &database(DEVS[1])),
        source,
        "b's data is not touched"
    );
    e.kubectl(&["delete", "archivesourceset", SET, "--wait=false"]);
}
