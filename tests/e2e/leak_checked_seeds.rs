//! Leak-checked dev seeds (issue 38) on the real control plane: an ArchiveExport with
//! `transform.leakCheck: true` records a passed leak check in its archive's manifest, and an
//! ArchiveSourceSet with `requireLeakCheck: true` serves it in every selected namespace; the
//! same masked export without the check is refused (`ArchiveNotTransformed`), and an export
//! whose rules keep a column holding a raw email fails with reason `LeakFound`, naming the
//! table and column but not the value. Their rules hash the UNIQUE email column: condition
//! `Validated` is False naming the constraint, and with `transform.requireValidated` the
//! export refuses to run (`ConstraintsAtRisk`).

use super::helpers::{
    engine_ip, engine_rows, export_manifest, wait_export_succeeded, wait_source_ready, wait_stalled,
};
use super::support::{condition, env_with_operator, serial};

const PLATFORM: &str = "e2e-leak-platform";
const DEVS: [&str; 2] = ["e2e-leak-a", "e2e-leak-b"];
const LABEL: (&str, &str) = ("larch.dev/e2e-leak-checked", "yes");
const SET: &str = "leak-checked-seed";
const ROWS: i64 = 80;
/// The raw email copied into row 7's free-text column.
const PLANTED: &str = "rawleak7x@corp-e2e.test";

/// An export of `leak_users` under `prefix`, its notes column masked with `notes`.
fn masked_export(e: &super::support::Env, name: &str, notes: &str, leak_check: bool) -> String {
    export_manifest(e, PLATFORM, name, "leak_users", "OneShot", "leak-seed")
        + &format!("  keyPrefix: {name}/\n")
        + "  transform:\n"
        + &format!("    leakCheck: {leak_check}\n")
        + "    keySecretRef: {name: seed-hash-key, key: key}\n"
        + "    tables:\n"
        + "      public.leak_users:\n"
        + "        undeclared: null\n"
        + &format!("        columns: {{id: hash, email: hash, plan: keep, notes: {notes}}}\n")
}

/// Scenario 30b: a leak-checked masked export is served under `requireLeakCheck` in two
/// namespaces; the same export unchecked is refused, and a leaking one fails with `LeakFound`.
#[test]
fn s30b_require_leak_check_serves_a_checked_seed_and_refuses_the_rest() {
    let _g = serial();
    let e = env_with_operator();
    e.sql(&format!(
        "DROP TABLE IF EXISTS public.leak_users; \
         CREATE TABLE public.leak_users (id int8 PRIMARY KEY, email text NOT NULL UNIQUE, plan text, \
         notes text); \
         INSERT INTO public.leak_users SELECT g, 'rawleak'||g||'x@corp-e2e.test', \
         'plan-'||(g % 3), 'note '||g FROM generate_series(1, {ROWS}) g; \
         UPDATE public.leak_users SET notes = 'write to {PLANTED}' WHERE id = 3"
    ));
    e.namespace(PLATFORM, &[]);
    e.bucket("leak-seed");
    e.apply(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: seed-hash-key, namespace: {PLATFORM}}}\n\
         stringData: {{key: e2e-masking-key-0123456789abcdef}}\n"
    ));
    e.apply(&masked_export(e, "checked", "hash", true));
    e.apply(&masked_export(e, "unchecked", "hash", false));
    e.apply(&masked_export(e, "leaky", "keep", true));
    e.apply(&(masked_export(e, "strict", "hash", false) + "    requireValidated: true\n"));
    wait_export_succeeded(e, PLATFORM, "checked", None);
    wait_export_succeeded(e, PLATFORM, "unchecked", None);

    // The hashed UNIQUE email: the preflight of the export pod names it; informational here.
    let at_risk = "public.leak_users.leak_users_email_key (UNIQUE): column \"email\": hash on text";
    let validated = e.wait_for(PLATFORM, "checked Validated", 60, || {
        let o = e.get(&["archiveexport", "checked", "-n", PLATFORM])?;
        condition(&o, "Validated")
            .filter(|c| c["status"] != "Unknown")
            .cloned()
    });
    assert_eq!(
        (&validated["status"], &validated["reason"]),
        (&"False".into(), &"ConstraintsAtRisk".into()),
        "{validated}"
    );
    let message = validated["message"].as_str().unwrap_or_default();
    assert!(message.contains(at_risk), "{message}");
    assert!(!message.contains("rawleak"), "no value quoted: {message}");
    let message = wait_stalled(e, "archiveexport", PLATFORM, "strict", "ConstraintsAtRisk");
    assert!(
        message.contains(at_risk) && message.contains("nothing was exported"),
        "{message}"
    );
    let strict = e.get(&["archiveexport", "strict", "-n", PLATFORM]).unwrap();
    let v = condition(&strict, "Validated").unwrap();
    assert_eq!(
        (&v["status"], &v["reason"]),
        (&"False".into(), &"ConstraintsAtRisk".into())
    );

    let message = wait_stalled(e, "archiveexport", PLATFORM, "leaky", "LeakFound");
    assert!(
        message.contains("public.leak_users: email 1 of"),
        "the condition names the table and the column: {message}"
    );
    assert!(!message.contains(PLANTED), "no value quoted: {message}");

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
          bucket: leak-seed
          region: us-east-1
          endpoint: {endpoint}
          pathStyle: true
        keyPrefix: checked/
      table: {{schema: public, name: leak_users}}
      requireTransformed: true
      requireLeakCheck: true
      target:
        memory: {{}}
"#,
        k = LABEL.0,
        v = LABEL.1,
        endpoint = e.s3_endpoint
    ));
    e.apply(&format!(
        r#"apiVersion: larch.dev/v1alpha1
kind: ArchiveSource
metadata: {{name: unchecked-refused, namespace: {PLATFORM}}}
spec:
  archive:
    exportRef: {{name: unchecked}}
  requireTransformed: true
  requireLeakCheck: true
  target:
    memory: {{}}
"#
    ));

    for ns in DEVS {
        wait_source_ready(e, ns, SET);
        let ip = engine_ip(e, ns, SET);
        let rows = engine_rows(e, &ip, "public.leak_users").expect("the engine's rows");
        assert_eq!(rows.len() as i64, ROWS, "{ns}: every row is served");
        let text = serde_json::Value::Array(rows).to_string();
        assert!(!text.contains("rawleak"), "{ns}: no raw email served");
    }
    let message = wait_stalled(
        e,
        "archivesource",
        PLATFORM,
        "unchecked-refused",
        "ArchiveNotTransformed",
    );
    assert!(
        message.contains("leak check") && message.contains("unchecked/"),
        "the condition says why and names the archive: {message}"
    );
    e.kubectl(&["delete", "archivesourceset", SET, "--wait=false"]);
    e.kubectl(&[
        "delete",
        "archivesource",
        "unchecked-refused",
        "-n",
        PLATFORM,
        "--wait=false",
    ]);
}
