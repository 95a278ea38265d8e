//! Masked dev seeds (issue 18) on the real control plane: a masked one-shot export seeds three
//! developer namespaces through an ArchiveSourceSet that requires a masked archive; no raw value
//! of a masked column reaches an engine's rows, a pod log, an Event or a status, and an unmasked
//! archive is refused with a condition naming it.

use serde_json::Value;

use super::helpers::{
    engine_ip, engine_rows, export_manifest, wait_export_succeeded, wait_source_ready, wait_stalled,
};
use super::support::{OPERATOR_NS, env_with_operator, serial};

const PLATFORM: &str = "e2e-mask-platform";
const DEVS: [&str; 3] = ["e2e-mask-a", "e2e-mask-b", "e2e-mask-c"];
const LABEL: (&str, &str) = ("larch.dev/e2e-masked-seed", "yes");
const SET: &str = "masked-seed";
const ROWS: i64 = 120;

/// The raw values of row `i`'s masked columns: distinctive, so a hit is never a coincidence.
fn raw_values(i: i64) -> [String; 3] {
    [
        format!("rawmail{i}x@corp-e2e.test"),
        format!("Rawname Zq{i}"),
        format!("ssn-7d1e-{i:04}"),
    ]
}

/// Scenario 30: an ArchiveSourceSet with `requireTransformed: true` seeds three namespaces from
/// a masked export (id and email hashed, name faked, ssn dropped); every engine serves all the
/// rows, masked; none of the raw emails, names or ssns is in any engine's rows, pod log, Event,
/// custom resource or pod status; an ArchiveSource requiring a masked archive over an unmasked
/// export of the same table stalls with reason `ArchiveNotTransformed`, naming the table.
#[test]
fn s30_masked_seed_in_three_namespaces_leaks_no_raw_value() {
    let _g = serial();
    let e = env_with_operator();
    e.sql(&format!(
        "DROP TABLE IF EXISTS public.masked_users; \
         CREATE TABLE public.masked_users (id int8 PRIMARY KEY, email text NOT NULL, \
         name varchar(40), ssn text, plan text); \
         INSERT INTO public.masked_users SELECT g, 'rawmail'||g||'x@corp-e2e.test', \
         'Rawname Zq'||g, 'ssn-7d1e-'||lpad(g::text, 4, '0'), 'plan-'||(g % 3) \
         FROM generate_series(1, {ROWS}) g"
    ));
    e.namespace(PLATFORM, &[]);
    e.bucket("masked-seed");
    e.apply(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: seed-hash-key, namespace: {PLATFORM}}}\n\
         stringData: {{key: e2e-masking-key-0123456789abcdef}}\n"
    ));
    let masked = export_manifest(
        e,
        PLATFORM,
        "masked",
        "masked_users",
        "OneShot",
        "masked-seed",
    ) + "  keyPrefix: masked/\n"
        + "  transform:\n"
        + "    keySecretRef: {name: seed-hash-key, key: key}\n"
        + "    tables:\n"
        + "      public.masked_users:\n"
        + "        undeclared: null\n"
        + "        columns: {id: hash, email: hash, name: {fake: full_name}, ssn: drop, plan: keep}\n";
    e.apply(&masked);
    let raw = export_manifest(e, PLATFORM, "raw", "masked_users", "OneShot", "masked-seed")
        + "  keyPrefix: raw/\n";
    e.apply(&raw);
    wait_export_succeeded(e, PLATFORM, "masked", None);
    wait_export_succeeded(e, PLATFORM, "raw", None);

    for ns in DEVS {
        e.namespace(ns, &[LABEL]);
    }
    e.apply(&format!(
        r#"apiVersion: larch.dev/v1alpha1
kind: ArchiveSourceSet
metadata: {{name: {SET}}}
spec:
  namespaceSelector:
    matchLabels: {{{k}: "{v}"}}
  credentials:
    secretRef: {{namespace: {PLATFORM}, name: s3-credentials}}
    shareToNamespaces: true
  template:
    spec:
      archive:
        s3:
          bucket: masked-seed
          region: us-east-1
          endpoint: {endpoint}
          pathStyle: true
        keyPrefix: masked/
      table: {{schema: public, name: masked_users}}
      requireTransformed: true
      target:
        memory: {{}}
"#,
        k = LABEL.0,
        v = LABEL.1,
        endpoint = e.s3_endpoint
    ));
    // An unmasked archive under requireTransformed: refused with a condition naming it.
    e.apply(&format!(
        r#"apiVersion: larch.dev/v1alpha1
kind: ArchiveSource
metadata: {{name: raw-refused, namespace: {PLATFORM}}}
spec:
  archive:
    exportRef: {{name: raw}}
  requireTransformed: true
  target:
    memory: {{}}
"#
    ));

    // Every namespace serves every row, masked: hashed ids and emails, faked names, no ssn.
    let mut served: Vec<(String, String)> = vec![];
    for ns in DEVS {
        wait_source_ready(e, ns, SET);
        let ip = engine_ip(e, ns, SET);
        let rows = engine_rows(e, &ip, "public.masked_users").expect("the engine's rows");
        assert_eq!(rows.len() as i64, ROWS, "{ns}: every row is served");
        for r in &rows {
            assert!(r.get("ssn").is_none(), "{ns}: ssn is dropped: {r}");
            let email = r["email"]
                .as_str()
                .unwrap_or_else(|| panic!("email of {r}"));
            assert!(
                email.contains('@'),
                "{ns}: a hashed email keeps its shape: {r}"
            );
            assert!(r["name"].as_str().is_some_and(|n| !n.is_empty()), "{r}");
            assert!(
                r["plan"].as_str().is_some_and(|p| p.starts_with("plan-")),
                "{r}"
            );
        }
        let ids: std::collections::BTreeSet<String> =
            rows.iter().map(|r| r["id"].to_string()).collect();
        assert_eq!(ids.len() as i64, ROWS, "{ns}: hashed ids stay distinct");
        served.push((format!("{ns} engine rows"), Value::Array(rows).to_string()));
    }

    let message = wait_stalled(
        e,
        "archivesource",
        PLATFORM,
        "raw-refused",
        "ArchiveNotTransformed",
    );
    assert!(
        message.contains("public.masked_users") && message.contains("raw/"),
        "the condition names the table and the archive: {message}"
    );

    // Everything a developer or a platform team can read, searched for every raw value.
    let mut namespaces = DEVS.to_vec();
    namespaces.extend([PLATFORM, OPERATOR_NS]);
    let mut gathered = e.pod_logs(&namespaces);
    let log_files = gathered.len();
    assert!(
        log_files >= 6,
        "two exporters, three engines and the operator logged: {:?}",
        gathered.iter().map(|(p, _)| p).collect::<Vec<_>>()
    );
    for args in [
        &["get", "events", "-A", "-o", "json"][..],
        &[
            "get",
            "archiveexports,archivesources,archivesourcesets",
            "-A",
            "-o",
            "json",
        ][..],
        &["get", "pods,configmaps", "-A", "-o", "json"][..],
    ] {
        gathered.push((format!("kubectl {}", args.join(" ")), e.kubectl(args)));
    }
    for ns in DEVS {
        let ip = engine_ip(e, ns, SET);
        let status = e
            .http_json(&format!("http://{ip}:8080/status"))
            .expect("engine /status");
        gathered.push((format!("{ns} engine /status"), status.to_string()));
    }
    gathered.extend(served);
    let mut leaks = vec![];
    for i in 1..=ROWS {
        for value in raw_values(i) {
            for (what, text) in &gathered {
                if text.contains(&value) {
                    leaks.push(format!("{value:?} in {what}"));
                }
            }
        }
    }
    let bytes: usize = gathered.iter().map(|(_, t)| t.len()).sum();
    assert!(bytes > 20_000, "something was gathered ({bytes} bytes)");
    assert!(leaks.is_empty(), "raw values leaked: {leaks:#?}");
    // The set counts the three namespaces ready.
    e.wait_for(PLATFORM, "the set's rollup: 3 ready", 120, || {
        let o = e.get(&["archivesourceset", SET])?;
        (o["status"]["readyNamespaces"] == 3).then_some(())
    });
    eprintln!(
        "s30: {} sources, {bytes} bytes searched, no raw value of {} found",
        gathered.len(),
        ROWS * 3
    );
    e.kubectl(&["delete", "archivesourceset", SET, "--wait=false"]);
    e.kubectl(&[
        "delete",
        "archivesource",
        "raw-refused",
        "-n",
        PLATFORM,
        "--wait=false",
    ]);
}
