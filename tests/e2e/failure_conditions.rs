//! Scenario 19 (issue #24): what a new user gets wrong is reported where they look.

use std::time::Duration;

use serde_json::Value;

use super::helpers::{events_of, export_manifest, oneshot_exported};
use super::support::{KStatus, condition, env_with_operator, kstatus, serial};

/// One expected failure of scenario 19: the condition (`Stalled` or `Degraded`) that must be
/// True on the custom resource, its reason, words its message must hold, and kstatus.
struct Reported {
    kind: &'static str,
    ns: &'static str,
    name: &'static str,
    condition: &'static str,
    reason: &'static str,
    words: &'static [&'static str],
    kstatus: KStatus,
}

impl Reported {
    fn matches(&self, o: &Value) -> bool {
        condition(o, self.condition).is_some_and(|c| {
            c["status"] == "True"
                && c["reason"] == self.reason
                && self
                    .words
                    .iter()
                    .all(|w| c["message"].as_str().unwrap_or("").contains(w))
        }) && kstatus(o) == self.kstatus
    }
}

/// Scenario 19 (issue #24): what a new user gets wrong is reported where they look. What CEL
/// can express is refused at admission with the field named; the rest is accepted and then
/// shown on the custom resource within a bounded time: `Stalled=True` (kstatus Failed) with a
/// reason and a message naming the object, or `Degraded=True` and still `Reconciling` (kstatus
/// InProgress) for a failure that clears by itself, plus a Warning Event with the reason. The
/// custom resources are applied together and checked together.
#[test]
fn s19_failures_show_in_the_conditions() {
    let _g = serial();
    oneshot_exported();
    let e = env_with_operator();
    let ns = "e2e-failures";
    e.namespace(ns, &[]);
    e.bucket("failures");
    let rows_before = e.sql("SELECT count(*) FROM public.events");

    // Refused at admission, the field named.
    let mut escape = export_manifest(e, ns, "escape", "events", "OneShot", "failures");
    escape.push_str("  keyPrefix: ../../etc/\n");
    let out = e.kubectl_out(&["apply", "--server-side", "-f", "-"], Some(&escape));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted: {escape}");
    assert!(
        err.contains("spec.keyPrefix")
            && err.contains("keyPrefix must not start with '/' nor hold a '.' or '..' segment"),
        "{err}"
    );

    // Accepted, then reported. Exports whose source cannot be reached keep what they would
    // drop on delete (`Retain`): their cleanup could not connect either.
    let continuous = |name: &str, table: &str, secret: &str| {
        let mut m = export_manifest(e, ns, name, table, "Continuous", "failures");
        m.push_str("  continuous: {diffInterval: 1s}\n");
        if secret != "pg-source" {
            m = m.replace(
                "    connectionSecretRef: {name: pg-source, key: dsn}\n",
                &format!(
                    "    connectionSecretRef: {{name: {secret}, key: dsn}}\n    deletionPolicy: Retain\n"
                ),
            );
        }
        m
    };
    e.apply(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: pg-refused, namespace: {ns}}}\nstringData:\n  dsn: \"host=127.0.0.1 port=1 user=postgres dbname=app\"\n"
    ));
    let mut bad_cron = export_manifest(e, ns, "bad-cron", "events", "OneShot", "failures");
    bad_cron.push_str("  schedule: {cron: \"61 25 * * *\"}\n");
    let t0 = std::time::Instant::now();
    for m in [
        continuous("missing-table", "no_such_table", "pg-source"),
        continuous("missing-secret", "events", "pg-missing"),
        continuous("unreachable", "events", "pg-refused"),
        export_manifest(
            e,
            ns,
            "injection",
            "\"events; DROP TABLE events\"",
            "OneShot",
            "failures",
        ),
        bad_cron,
        // The archive of the shared one-shot export has the columns of public.events.
        "apiVersion: larch.dev/v1alpha1\nkind: ArchiveSource\nmetadata: {name: bad-index, namespace: e2e-oneshot}\nspec:\n  archive: {exportRef: {name: events}}\n  target: {memory: {indexFields: [no_such_column]}}\n".to_string(),
    ] {
        e.apply(&m);
    }
    let expected = [
        Reported {
            kind: "archiveexport",
            ns,
            name: "missing-table",
            condition: "Stalled",
            reason: "TableNotFound",
            words: &["writer pod", "table public.no_such_table does not exist"],
            kstatus: KStatus::Failed,
        },
        Reported {
            kind: "archiveexport",
            ns,
            name: "missing-secret",
            condition: "Stalled",
            reason: "SecretNotFound",
            words: &[
                "Secret e2e-failures/pg-missing (named in spec.source.connectionSecretRef) does not exist",
            ],
            kstatus: KStatus::Failed,
        },
        Reported {
            kind: "archiveexport",
            ns,
            name: "unreachable",
            condition: "Degraded",
            reason: "ConnectionFailed",
            words: &["cannot connect to PostgreSQL at 127.0.0.1:1"],
            kstatus: KStatus::InProgress,
        },
        Reported {
            kind: "archiveexport",
            ns,
            name: "injection",
            condition: "Stalled",
            reason: "TableNotFound",
            words: &["table public.events; DROP TABLE events does not exist"],
            kstatus: KStatus::Failed,
        },
        Reported {
            kind: "archiveexport",
            ns,
            name: "bad-cron",
            condition: "Stalled",
            reason: "InvalidSpec",
            words: &["spec.schedule.cron \"61 25 * * *\" is not a valid schedule"],
            kstatus: KStatus::Failed,
        },
        Reported {
            kind: "archivesource",
            ns: "e2e-oneshot",
            name: "bad-index",
            condition: "Stalled",
            reason: "ColumnNotFound",
            words: &[
                "engine pod bad-index-0",
                "index field \"no_such_column\" is not a column of table public.events",
            ],
            kstatus: KStatus::Failed,
        },
    ];
    // Pods start, fail and are read on the next reconcile (every 30 s at most): 180 s bounds
    // it on a loaded machine.
    let mut seen: std::collections::BTreeMap<&str, f64> = Default::default();
    e.wait_for(ns, "every failure on its custom resource", 180, || {
        let mut pending = vec![];
        for r in &expected {
            let o = e.get(&[r.kind, r.name, "-n", r.ns])?;
            if r.matches(&o) {
                seen.entry(r.name).or_insert(t0.elapsed().as_secs_f64());
            } else {
                seen.remove(r.name);
                pending.push(format!(
                    "{} {}: {}",
                    r.kind,
                    r.name,
                    serde_json::to_string(&o["status"]["conditions"]).unwrap()
                ));
            }
        }
        if !pending.is_empty() && t0.elapsed() > Duration::from_secs(170) {
            eprintln!("still not reported: {pending:#?}");
        }
        pending.is_empty().then_some(())
    });
    eprintln!("e2e s19: reported after (s) {seen:?}");
    for r in &expected {
        let events = events_of(e, r.ns, r.name, r.reason);
        assert!(
            events.iter().any(|ev| ev["type"] == "Warning"),
            "a Warning Event {} for {} {}: {events:?}",
            r.reason,
            r.kind,
            r.name
        );
    }
    // Nothing was dropped: the name was looked up, quoted.
    assert_eq!(e.sql("SELECT count(*) FROM public.events"), rows_before);

    // Re-checked when what was missing appears: a Secret without the key named.
    e.apply(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: pg-missing, namespace: {ns}}}\nstringData:\n  other: x\n"
    ));
    e.wait_for(ns, "SecretKeyNotFound once the Secret exists", 60, || {
        let o = e.get(&["archiveexport", "missing-secret", "-n", ns])?;
        let c = condition(&o, "Stalled")?;
        (c["reason"] == "SecretKeyNotFound"
            && c["message"]
                .as_str()?
                .contains("Secret e2e-failures/pg-missing has no key \"dsn\""))
        .then_some(())
    });

    e.kubectl(&["delete", "archivesource", "bad-index", "-n", "e2e-oneshot"]);
    for name in [
        "missing-table",
        "missing-secret",
        "unreachable",
        "injection",
        "bad-cron",
    ] {
        e.kubectl(&["delete", "archiveexport", name, "-n", ns, "--wait=false"]);
    }
}
