//! Scenario 19: invalid CRs on the real API server (issue 14). Every one is refused by the CRD
//! schema or its CEL rules with the field named, or — what the schema cannot express — reported
//! in a condition without crashing the operator or making it write in a loop.
//!
//! Durations first: the same table of texts (`larch::duration::AGREEMENT_CASES`) goes into every
//! duration field; the API server (cel-go's `duration()`, Go's `time.ParseDuration`) must accept
//! exactly the texts larch's parser accepts. The offline evaluator of the unit tests is not
//! cel-go, so this is the check that counts.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use super::support::{Env, OPERATOR_NS, condition, env_with_operator, serial};

const NS: &str = "e2e-invalid";

fn export_doc(name: &str, extra: &str) -> String {
    format!(
        r#"apiVersion: larch.dev/v1alpha1
kind: ArchiveExport
metadata: {{name: {name}, namespace: {NS}}}
spec:
  mode: Continuous
  source:
    connectionSecretRef: {{name: pg-source, key: dsn}}
    table: {{schema: public, name: events}}
  destination:
    s3: {{bucket: invalid, endpoint: "http://127.0.0.1:1", pathStyle: true}}
{extra}"#
    )
}

fn source_doc(name: &str, extra: &str) -> String {
    format!(
        r#"apiVersion: larch.dev/v1alpha1
kind: ArchiveSource
metadata: {{name: {name}, namespace: {NS}}}
spec:
  archive:
    exportRef: {{name: x}}
  target:
    memory: {{}}
{extra}"#
    )
}

/// An ArchiveSourceSet (cluster-scoped) with `body` under `spec:` after its selector.
fn set_doc(name: &str, body: &str) -> String {
    format!(
        r#"apiVersion: larch.dev/v1alpha1
kind: ArchiveSourceSet
metadata: {{name: {name}}}
spec:
  namespaceSelector: {{matchLabels: {{larch.dev/seed: invalid}}}}
{body}"#
    )
}

const SET_SOURCE_TEMPLATE: &str = "  template:
    spec: {archive: {s3: {bucket: seeds}, keyPrefix: public.events/}, table: {name: events}, target: {memory: {}}}
";
const SET_RESTORE_TEMPLATE: &str = "  restoreTemplate:
    spec: {archive: {s3: {bucket: seeds}, keyPrefix: public.events/}, tables: [{name: events}], target: {postgres: {connectionSecretRef: {name: app-db-app, key: uri}}}}
";

/// `kubectl apply --dry-run=server` of many documents: name → the API server's error (None:
/// accepted). Every document is accounted for.
fn dry_run(e: &Env, docs: &BTreeMap<String, String>) -> BTreeMap<String, Option<String>> {
    let all: Vec<&str> = docs.values().map(String::as_str).collect();
    let out = e.kubectl_out(
        &["apply", "--dry-run=server", "-f", "-"],
        Some(&all.join("---\n")),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let mut verdict = BTreeMap::new();
    for name in docs.keys() {
        let accepted = stdout
            .lines()
            .any(|l| l.contains(&format!("/{name} ")) && l.contains("(server dry run)"));
        let quoted = format!("\"{name}\" is invalid");
        let refused: Vec<&str> = stderr.lines().filter(|l| l.contains(&quoted)).collect();
        assert!(
            accepted == refused.is_empty(),
            "{name}: accepted {accepted}, refused {refused:?}\nstdout:\n{stdout}\nstderr:\n{stderr}"
        );
        verdict.insert(name.clone(), refused.first().map(|s| s.to_string()));
    }
    verdict
}

type Parser = fn(&str) -> Result<Duration, String>;

#[test]
fn s20_invalid_crs_are_refused_with_the_field_named() {
    let _g = serial();
    let e = env_with_operator();
    e.namespace(NS, &[]);

    // 1. Durations: the API server and larch's parser agree on every case in every field.
    use larch::duration::{AGREEMENT_CASES, parse_age, parse_positive};
    let fields: [(&str, &str, Parser); 9] = [
        (
            "spec.continuous.diffInterval",
            "diffInterval",
            parse_positive,
        ),
        ("spec.continuous.minInterval", "minInterval", parse_positive),
        ("spec.continuous.maxInterval", "maxInterval", parse_positive),
        ("spec.retention.maxAge", "maxAge", parse_age),
        ("spec.pollInterval", "pollInterval", parse_positive),
        (
            "spec.source.sessionLimits.statementTimeout",
            "statementTimeout",
            parse_positive,
        ),
        (
            "spec.source.sessionLimits.lockTimeout",
            "lockTimeout",
            parse_positive,
        ),
        (
            "spec.source.sessionLimits.idleInTransactionTimeout",
            "idleInTransactionTimeout",
            parse_positive,
        ),
        (
            "spec.source.sessionLimits.snapshotMaxAge",
            "snapshotMaxAge",
            parse_age,
        ),
    ];
    let mut docs = BTreeMap::new();
    let mut want = BTreeMap::new();
    for (fi, (path, key, parser)) in fields.iter().enumerate() {
        for (ci, text) in AGREEMENT_CASES.iter().enumerate() {
            let name = format!("d{fi}-{ci}");
            let value = serde_json::to_string(text).unwrap();
            let doc = match *key {
                "maxAge" => export_doc(&name, &format!("  retention: {{maxAge: {value}}}\n")),
                "pollInterval" => source_doc(&name, &format!("  pollInterval: {value}\n")),
                k if path.starts_with("spec.source.") => export_doc(&name, "").replace(
                    "    table: {schema: public, name: events}\n",
                    &format!(
                        "    table: {{schema: public, name: events}}\n    sessionLimits: {{{k}: {value}}}\n"
                    ),
                ),
                k => export_doc(&name, &format!("  continuous: {{{k}: {value}}}\n")),
            };
            docs.insert(name.clone(), doc);
            want.insert(name, (*path, *text, parser(text)));
        }
    }
    let verdict = dry_run(e, &docs);
    let mut disagreements = Vec::new();
    for (name, (path, text, parsed)) in &want {
        let server = &verdict[name];
        match (server, parsed) {
            (None, Ok(_)) => {}
            (Some(err), Err(_)) if err.contains(path) => {}
            _ => disagreements.push(format!(
                "{path} = {text:?}: API server {server:?}, larch {parsed:?}"
            )),
        }
    }
    assert!(
        disagreements.is_empty(),
        "the API server and larch::duration disagree:\n{}",
        disagreements.join("\n")
    );
    eprintln!(
        "s20: {} duration cases agree ({} accepted)",
        want.len(),
        verdict.values().filter(|v| v.is_none()).count()
    );

    // 2. Other fields: refused with the field and the reason named.
    let cases: Vec<(&str, String, &str, &str)> = vec![
        (
            "slot-upper",
            export_doc("slot-upper", "").replace(
                "table: {schema: public, name: events}",
                "table: {schema: public, name: events}\n    slotName: Orders",
            ),
            "spec.source.slotName",
            "should match",
        ),
        (
            "no-table",
            export_doc("no-table", "").replace("    table: {schema: public, name: events}\n", ""),
            "spec.source",
            "set exactly one of table or tables",
        ),
        (
            "prefix-slash",
            export_doc("prefix-slash", "  keyPrefix: nightly\n"),
            "spec.keyPrefix",
            "keyPrefix must end with '/'",
        ),
        (
            "endpoint",
            export_doc("endpoint", "").replace("http://127.0.0.1:1", "minio:9000"),
            "spec.destination.s3.endpoint",
            "http:// or https://",
        ),
        (
            "bucket-case",
            export_doc("bucket-case", "").replace("bucket: invalid", "bucket: Invalid_Bucket"),
            "spec.destination.s3.bucket",
            "should match",
        ),
        (
            "keep-zero",
            export_doc("keep-zero", "  retention: {keepEpochs: 0}\n"),
            "spec.retention.keepEpochs",
            "greater than or equal to 1",
        ),
        (
            "fraction",
            export_doc("fraction", "  continuous: {maxDiffFraction: \"1.5\"}\n"),
            "spec.continuous.maxDiffFraction",
            "should match",
        ),
        (
            "inverted",
            export_doc(
                "inverted",
                "  continuous: {minInterval: 10m, maxInterval: 90s}\n",
            ),
            "spec.continuous",
            "minInterval must not exceed maxInterval",
        ),
        (
            "mode",
            export_doc("mode", "").replace("mode: Continuous", "mode: Sometimes"),
            "spec.mode",
            "Unsupported value",
        ),
        (
            "two-targets",
            source_doc("two-targets", "").replace(
                "memory: {}",
                "memory: {}\n    postgres: {connectionSecretRef: {name: a, key: b}}",
            ),
            "spec.target",
            "set exactly one of memory or postgres",
        ),
        (
            "replicas",
            source_doc("replicas", "  replicas: 101\n"),
            "spec.replicas",
            "less than or equal to 100",
        ),
        (
            "state-size",
            source_doc("state-size", "  state: {size: ten-gigs}\n"),
            "spec.state.size",
            "should match",
        ),
        (
            "volume-claim",
            source_doc("volume-claim", "")
                .replace("exportRef: {name: x}", "volume: {size: 1Gi}")
                .replace("  target:", "  table: {name: events}\n  target:"),
            "spec.archive",
            "claimName",
        ),
        (
            "at-and-follow",
            source_doc("at-and-follow", "  follow: true\n  at: {position: 0/10}\n"),
            "spec",
            "at serves the table as it was at a point in time and never follows",
        ),
        (
            "at-both",
            source_doc(
                "at-both",
                "  at: {position: 0/10, time: \"2026-11-30T14:00:00Z\"}\n",
            ),
            "spec.at",
            "set exactly one of position or time",
        ),
        (
            "at-time",
            source_doc(
                "at-time",
                "  at: {time: \"noon on the 30th of November\"}\n",
            ),
            "spec.at.time",
            "time must be an RFC 3339 time",
        ),
        (
            "set-both-templates",
            set_doc(
                "set-both-templates",
                &format!("{SET_SOURCE_TEMPLATE}{SET_RESTORE_TEMPLATE}"),
            ),
            "spec",
            "set exactly one of template (an ArchiveSource per namespace) or restoreTemplate",
        ),
        (
            "set-no-template",
            set_doc("set-no-template", ""),
            "spec",
            "set exactly one of template (an ArchiveSource per namespace) or restoreTemplate",
        ),
        (
            "set-restore-exportref",
            set_doc(
                "set-restore-exportref",
                &SET_RESTORE_TEMPLATE.replace(
                    "archive: {s3: {bucket: seeds}, keyPrefix: public.events/}",
                    "archive: {exportRef: {name: nightly}}",
                ),
            ),
            "spec",
            "restoreTemplate.spec.archive must name the archive's location",
        ),
        (
            "set-epoch-volume",
            set_doc(
                "set-epoch-volume",
                &SET_RESTORE_TEMPLATE.replace(
                    "spec: {archive: {s3: {bucket: seeds}",
                    "refresh: OnNewEpoch
    spec: {archive: {volume: {claimName: seeds}",
                ),
            ),
            "spec",
            "refresh: OnNewEpoch needs an s3 archive",
        ),
        (
            "a-source-name-longer-than-forty-characters-x",
            source_doc("a-source-name-longer-than-forty-characters-x", ""),
            // A rule on the object itself: the API server names no path, the message the field.
            "<nil>",
            "name must be at most 40 characters",
        ),
    ];
    let docs: BTreeMap<String, String> = cases
        .iter()
        .map(|(n, d, _, _)| (n.to_string(), d.clone()))
        .collect();
    let verdict = dry_run(e, &docs);
    for (name, _, path, needle) in &cases {
        let err = verdict[*name]
            .as_deref()
            .unwrap_or_else(|| panic!("{name}: accepted"));
        assert!(
            err.contains(path) && err.contains(needle),
            "{name}: expected {path} and {needle:?} in {err}"
        );
    }

    // 3. What the schema cannot tell: reported in a condition, without a crash or a write loop.
    let operator_restarts = || -> i64 {
        e.list(&["pods", "-n", OPERATOR_NS])
            .iter()
            .flat_map(|p| {
                p["status"]["containerStatuses"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .map(|c| c["restartCount"].as_i64().unwrap_or(0))
            .sum()
    };
    let restarts_before = operator_restarts();
    e.apply(
        &source_doc("orphan", "").replace("exportRef: {name: x}", "exportRef: {name: nowhere}"),
    );
    e.apply(&export_doc(
        "bad-affinity",
        "  pod: {affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: 7}}}\n",
    ));
    let reported = |kind: &str, name: &str, cond: &str, status: &str, reason: &str| -> Value {
        e.wait_for(
            NS,
            &format!("{kind} {name} {cond}={status} {reason}"),
            120,
            || {
                let o = e.get(&[kind, name, "-n", NS])?;
                let c = condition(&o, cond)?;
                (c["status"] == status && c["reason"] == reason).then_some(o)
            },
        )
    };
    let orphan = reported(
        "archivesource",
        "orphan",
        "Ready",
        "False",
        "ExportNotFound",
    );
    let msg = condition(&orphan, "Ready").unwrap()["message"].to_string();
    assert!(msg.contains("nowhere"), "{msg}");
    let affinity = reported(
        "archiveexport",
        "bad-affinity",
        "Stalled",
        "True",
        "InvalidSpec",
    );
    let msg = condition(&affinity, "Stalled").unwrap()["message"].to_string();
    assert!(msg.contains("spec.pod.affinity"), "{msg}");
    // Settled: no write loop (one sample a second for 15 s; a periodic re-check may write now
    // and then, a loop would write every time), and the operator did not restart.
    let versions = || {
        [
            ("archivesource", "orphan"),
            ("archiveexport", "bad-affinity"),
        ]
        .map(|(k, n)| e.get(&[k, n, "-n", NS]).unwrap()["metadata"]["resourceVersion"].to_string())
    };
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..15 {
        seen.insert(versions());
        std::thread::sleep(Duration::from_secs(1));
    }
    assert!(
        seen.len() <= 4,
        "the operator keeps rewriting invalid objects: {seen:?}"
    );
    assert_eq!(
        operator_restarts(),
        restarts_before,
        "the operator restarted"
    );
    let children = e.list(&["jobs,deployments,statefulsets", "-n", NS]);
    assert!(
        children.is_empty(),
        "children of invalid objects: {children:?}"
    );
}
