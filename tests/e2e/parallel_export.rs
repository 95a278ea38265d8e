//! Several tables at one position (issue 16, item 3) on the real control plane: an ArchiveExport
//! with `tables` and `parallel` runs one Job that exports every table at one shared snapshot,
//! each into its own archive, and an ArchiveSource over the export serves them all; the API
//! server refuses `parallel` where it does not apply. A `subset` that follows foreign keys runs
//! in that one Job, and `status.tables` shows the rows the closure kept per table.

use super::helpers::{engine_ip, engine_rows, wait_export_succeeded, wait_source_ready};
use super::support::{env_with_operator, serial};

const NS: &str = "e2e-parallel";
const BUCKET: &str = "parallel";
/// Rows of each table: distinct counts, so a table served from another's archive shows.
const TABLES: [(&str, i64); 3] = [("par_a", 900), ("par_b", 450), ("par_c", 120)];

/// An OneShot ArchiveExport of `tables` with `extra` under `spec:`.
fn export_doc(
    e: &super::support::Env,
    name: &str,
    mode: &str,
    source: &str,
    extra: &str,
) -> String {
    format!(
        r#"apiVersion: larch.dev/v1alpha1
kind: ArchiveExport
metadata: {{name: {name}, namespace: {NS}}}
spec:
  mode: {mode}
  source:
    connectionSecretRef: {{name: pg-source, key: dsn}}
{source}
  destination:
    s3:
      bucket: {BUCKET}
      region: us-east-1
      endpoint: {endpoint}
      pathStyle: true
      credentials:
        secretRef: {{name: s3-credentials}}
{extra}"#,
        endpoint = e.s3_endpoint
    )
}

/// Scenario 31: `parallel: 2` over three tables makes exactly one Job; `status.tables` has the
/// three at one position with their row counts; an ArchiveSource with `exportRef` serves each
/// table's rows from its own archive; `parallel` on a single table or a Continuous export is
/// refused by the API server, naming the rule.
#[test]
fn s31_parallel_export_puts_every_table_at_one_position() {
    let _g = serial();
    let e = env_with_operator();
    for (table, rows) in TABLES {
        e.sql(&format!(
            "DROP TABLE IF EXISTS public.{table}; \
             CREATE TABLE public.{table} (id int8 PRIMARY KEY, label text NOT NULL); \
             INSERT INTO public.{table} SELECT g, '{table}-'||g FROM generate_series(1, {rows}) g"
        ));
    }
    e.namespace(NS, &[]);
    e.bucket(BUCKET);

    // Where parallel does not apply: refused before anything runs.
    let tables_yaml = format!(
        "    tables: [{}]",
        TABLES
            .iter()
            .map(|(t, _)| format!("{{schema: public, name: {t}}}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let single = "    table: {schema: public, name: par_a}";
    for (what, doc) in [
        (
            "a single table",
            export_doc(e, "par-single", "OneShot", single, "  parallel: 2\n"),
        ),
        (
            "a Continuous export",
            export_doc(e, "par-cont", "Continuous", &tables_yaml, "  parallel: 2\n"),
        ),
    ] {
        let out = e.kubectl_out(&["apply", "--dry-run=server", "-f", "-"], Some(&doc));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success()
                && stderr.contains("parallel applies to mode OneShot with source.tables"),
            "parallel on {what} must be refused naming the rule: {stderr}"
        );
    }

    e.apply(&export_doc(
        e,
        "trio",
        "OneShot",
        &tables_yaml,
        "  parallel: 2\n  keyPrefix: sets/\n",
    ));
    let done = wait_export_succeeded(e, NS, "trio", None);
    let jobs = e.list(&["jobs", "-n", NS]);
    assert_eq!(jobs.len(), 1, "one Job for every table: {jobs:?}");
    let job = &jobs[0];
    let args = &job["spec"]["template"]["spec"]["containers"][0]["args"];
    assert_eq!(args[1], "--request", "{args}");
    let request =
        larch::contract::export_request::ExportRequest::from_json(args[2].as_str().unwrap())
            .unwrap();
    assert!(
        request.parallel.is_some() && request.tables.len() == 3,
        "{args}"
    );

    let status = &done["status"]["tables"];
    let summaries = status.as_array().expect("status.tables");
    assert_eq!(summaries.len(), TABLES.len(), "{status}");
    let positions: std::collections::BTreeSet<&str> = summaries
        .iter()
        .map(|s| s["position"].as_str().expect("a position"))
        .collect();
    assert_eq!(positions.len(), 1, "every table at one position: {status}");
    for (table, rows) in TABLES {
        let s = summaries
            .iter()
            .find(|s| s["table"] == format!("public.{table}"))
            .unwrap_or_else(|| panic!("public.{table} in {status}"));
        assert_eq!(s["rowCount"], rows, "{s}");
        assert_eq!(s["keyPrefix"], format!("sets/public.{table}/"), "{s}");
    }

    // The archives are what an engine serves: each table its own rows.
    e.apply(&format!(
        r#"apiVersion: larch.dev/v1alpha1
kind: ArchiveSource
metadata: {{name: trio-cache, namespace: {NS}}}
spec:
  archive:
    exportRef: {{name: trio}}
  target:
    memory: {{}}
"#
    ));
    wait_source_ready(e, NS, "trio-cache");
    let ip = engine_ip(e, NS, "trio-cache");
    for (table, rows) in TABLES {
        let served = engine_rows(e, &ip, &format!("public.{table}")).expect("the engine's rows");
        assert_eq!(served.len() as i64, rows, "public.{table}");
        assert!(
            served.iter().all(|r| r["label"]
                .as_str()
                .is_some_and(|l| l.starts_with(&format!("{table}-")))),
            "public.{table} serves its own rows"
        );
    }
    e.kubectl(&["delete", "namespace", NS, "--wait=false"]);
}

/// s31b's own namespace: s31's is still terminating when it starts.
const SUBSET_NS: &str = "e2e-subset";

fn in_subset_ns(doc: String) -> String {
    doc.replace(
        &format!("namespace: {NS}"),
        &format!("namespace: {SUBSET_NS}"),
    )
}

/// Scenario 31b (issue 37, item 6): an ArchiveExport with `subset` keeps 1 % of the orders and
/// every customer they reference (upward), exported at one position in one Job; `status.tables`
/// shows the kept rows per table; `subset` without `parallel` is refused by the API server.
#[test]
fn s31b_a_subset_export_keeps_the_closure_of_its_roots() {
    let _g = serial();
    let e = env_with_operator();
    e.sql(
        "DROP TABLE IF EXISTS public.sub_orders, public.sub_customers; \
         CREATE TABLE public.sub_customers (id int8 PRIMARY KEY, name text NOT NULL); \
         CREATE TABLE public.sub_orders (id int8 PRIMARY KEY, \
             customer int8 NOT NULL REFERENCES public.sub_customers, total int8 NOT NULL); \
         INSERT INTO public.sub_customers SELECT g, 'c'||g FROM generate_series(1, 500) g; \
         INSERT INTO public.sub_orders SELECT g, 1 + (g * 7) % 500, g FROM generate_series(1, 3000) g",
    );
    let want_customers: i64 = e
        .sql("SELECT count(DISTINCT customer) FROM public.sub_orders WHERE id <= 30")
        .parse()
        .unwrap();
    e.namespace(SUBSET_NS, &[]);
    e.bucket(BUCKET);
    let tables =
        "    tables: [{schema: public, name: sub_orders}, {schema: public, name: sub_customers}]";
    let subset = "  subset:\n    roots:\n      public.sub_orders: {where: \"id <= 30\"}\n";
    let out = e.kubectl_out(
        &["apply", "--dry-run=server", "-f", "-"],
        Some(&in_subset_ns(export_doc(
            e,
            "sub-noparallel",
            "OneShot",
            tables,
            subset,
        ))),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && stderr.contains("subset (following foreign keys) applies to mode OneShot"),
        "{stderr}"
    );
    e.apply(&in_subset_ns(export_doc(
        e,
        "subset",
        "OneShot",
        tables,
        &format!("  parallel: 2\n  keyPrefix: subset/\n{subset}"),
    )));
    let done = wait_export_succeeded(e, SUBSET_NS, "subset", None);
    let status = &done["status"]["tables"];
    let rows = |table: &str| {
        status
            .as_array()
            .and_then(|a| a.iter().find(|s| s["table"] == table))
            .and_then(|s| s["rowCount"].as_i64())
            .unwrap_or_else(|| panic!("{table} in {status}"))
    };
    assert_eq!(rows("public.sub_orders"), 30, "{status}");
    assert_eq!(rows("public.sub_customers"), want_customers, "{status}");
    e.kubectl(&["delete", "namespace", SUBSET_NS, "--wait=false"]);
}
