//! One big table across pods (issue 39, item 2) on the real control plane: an ArchiveExport
//! with `split: {ranges: 4, workers: 2}` runs its Job as the coordinator and an Indexed Job of
//! two worker pods (the kube-controller-manager's Job controller gives each its
//! `JOB_COMPLETION_INDEX`) that copy the ranges; the run succeeds and the archive holds the
//! table in one snapshot object.

use std::collections::BTreeSet;

use serde_json::Value;

use super::helpers::{archive_args, get_cr, wait_export_succeeded, wait_stalled};
use super::support::{Env, condition_is, env_with_operator, serial};

const NS: &str = "e2e-split";
const BUCKET: &str = "split";
const TABLE: &str = "split_events";
/// Enough pages for four ranges (some 150 pages of 8 KiB).
const ROWS: i64 = 20_000;

fn export_doc(e: &Env, name: &str, split: &str) -> String {
    format!(
        r#"apiVersion: larch.dev/v1alpha1
kind: ArchiveExport
metadata: {{name: {name}, namespace: {NS}}}
spec:
  mode: OneShot
  source:
    connectionSecretRef: {{name: pg-source, key: dsn}}
    table: {{schema: public, name: {TABLE}}}
  destination:
    s3:
      bucket: {BUCKET}
      region: us-east-1
      endpoint: {endpoint}
      pathStyle: true
      credentials:
        secretRef: {{name: s3-credentials}}
  split: {split}
"#,
        endpoint = e.s3_endpoint
    )
}

/// `(id, note)` of every row of the archive's head, from `larch archive reconstruct`.
fn archive_rows(e: &Env, key_prefix: &str) -> BTreeSet<(i64, String)> {
    e.larch(&archive_args(e, &["verify"], BUCKET, key_prefix));
    let text = e.larch(&archive_args(e, &["reconstruct"], BUCKET, key_prefix));
    let v: Value = serde_json::from_str(&text).unwrap();
    let rows = v["rows"].as_array().expect("rows");
    assert_eq!(v["row_count"].as_u64(), Some(rows.len() as u64));
    rows.iter()
        .map(|r| {
            let id = r["id"].as_i64().expect("an id");
            (id, r["note"].as_str().expect("a note").to_string())
        })
        .collect()
}

/// Scenario 37: a split across pods. Refused at admission where it cannot work (`ranges` below
/// 2, `workers` above `ranges`); then a OneShot export of a 20 000-row table with `split:
/// {ranges: 4, workers: 2}`: the run succeeds; its Jobs are the coordinator `<name>-<run>` and
/// the Indexed `<name>-<run>-workers` with both indexes succeeded, each by a pod of its own
/// index; `status.split` says so; the archive verifies, holds exactly the table's rows
/// (reconstructed, compared row by row) and one snapshot object. Then an export of a missing
/// table: the coordinator stalls the run (`TableNotFound`) and the operator stops its workers
/// (their Job `activeDeadlineSeconds: 1`, failed `DeadlineExceeded`).
#[test]
fn s37_a_split_export_copies_its_ranges_in_an_indexed_job_of_workers() {
    let _g = serial();
    let e = env_with_operator();
    e.sql(&format!(
        "DROP TABLE IF EXISTS public.{TABLE}; \
         CREATE TABLE public.{TABLE} (id int8 PRIMARY KEY, note text NOT NULL); \
         INSERT INTO public.{TABLE} SELECT g, 'row ' || g || repeat('x', 40) \
           FROM generate_series(1, {ROWS}) g; ANALYZE public.{TABLE}"
    ));
    e.namespace(NS, &[]);
    e.bucket(BUCKET);

    for (split, rule) in [
        ("{ranges: 1}", "spec.split.ranges"),
        (
            "{ranges: 2, workers: 3}",
            "split.workers must not exceed split.ranges",
        ),
    ] {
        let doc = export_doc(e, "split-refused", split);
        let out = e.kubectl_out(&["apply", "--dry-run=server", "-f", "-"], Some(&doc));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(rule),
            "split: {split} must be refused naming {rule}: {stderr}"
        );
    }

    e.apply(&export_doc(e, "big", "{ranges: 4, workers: 2}"));
    let done = wait_export_succeeded(e, NS, "big", None);
    let run = done["status"]["run"]["id"]
        .as_str()
        .expect("a run")
        .to_string();
    let jobs = e.list(&["jobs", "-n", NS, "-l", "larch.dev/archive-export=big"]);
    let names: BTreeSet<&str> = jobs
        .iter()
        .filter_map(|j| j["metadata"]["name"].as_str())
        .collect();
    let workers_name = format!("big-{run}-workers");
    assert_eq!(
        names,
        BTreeSet::from([format!("big-{run}").as_str(), workers_name.as_str()]),
        "the coordinator and the workers"
    );
    let workers = jobs
        .iter()
        .find(|j| j["metadata"]["name"] == workers_name.as_str())
        .unwrap();
    assert_eq!(workers["spec"]["completionMode"], "Indexed");
    // The run is recorded once the coordinator committed and its workers are done.
    assert!(
        condition_is(workers, "Complete", "True"),
        "{}",
        workers["status"]
    );
    assert_eq!(workers["status"]["succeeded"], 2, "{}", workers["status"]);
    // Kubernetes writes two consecutive indexes as a list, three or more as a range.
    let completed = workers["status"]["completedIndexes"].as_str();
    assert!(
        matches!(completed, Some("0,1" | "0-1")),
        "{}",
        workers["status"]
    );
    let pods = e.list(&[
        "pods",
        "-n",
        NS,
        "-l",
        &format!("batch.kubernetes.io/job-name={workers_name}"),
    ]);
    let indexes: BTreeSet<&str> = pods
        .iter()
        .filter(|p| p["status"]["phase"] == "Succeeded")
        .filter_map(|p| {
            p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"].as_str()
        })
        .collect();
    assert_eq!(indexes, BTreeSet::from(["0", "1"]), "one pod per index");
    assert_eq!(
        done["status"]["split"],
        serde_json::json!({"ranges": 4, "workers": 2, "workersSucceeded": 2})
    );

    let last = &done["status"]["lastExport"];
    assert_eq!(last["rowCount"].as_i64(), Some(ROWS), "{last}");
    let key_prefix = last["keyPrefix"].as_str().unwrap_or("public.split_events/");
    let want: BTreeSet<(i64, String)> = e
        .sql(&format!("SELECT id || '|' || note FROM public.{TABLE}"))
        .lines()
        .map(|l| {
            let (id, note) = l.split_once('|').unwrap();
            (id.parse().unwrap(), note.to_string())
        })
        .collect();
    assert_eq!(want.len() as i64, ROWS);
    let got = archive_rows(e, key_prefix);
    assert_eq!(got.len(), want.len(), "row count");
    assert!(got == want, "the archive differs from the table");
    let snapshots: Vec<String> = e
        .s3_keys(BUCKET, key_prefix)
        .into_iter()
        .filter(|k| k.contains("/snapshot-"))
        .collect();
    assert_eq!(snapshots.len(), 1, "one snapshot object: {snapshots:?}");

    // A coordinator that fails (its table is gone) fails the run, and the operator stops the
    // workers still waiting for its plan: their Job ends past its deadline.
    e.apply(&export_doc(e, "gone", "{ranges: 4, workers: 2}").replace(TABLE, "no_such_table"));
    let message = wait_stalled(e, "archiveexport", NS, "gone", "TableNotFound");
    assert!(message.contains("no_such_table"), "{message}");
    let run = get_cr(e, "archiveexport", NS, "gone")["status"]["run"]["id"]
        .as_str()
        .expect("a run")
        .to_string();
    let stopped = e.wait_for(NS, "the workers Job stopped", 90, || {
        let j = e.get(&["job", &format!("gone-{run}-workers"), "-n", NS])?;
        condition_is(&j, "Failed", "True").then_some(j)
    });
    assert_eq!(stopped["spec"]["activeDeadlineSeconds"], 1, "{stopped}");
    let failed = stopped["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Failed"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(failed["reason"], "DeadlineExceeded", "{failed}");
    e.kubectl(&["delete", "namespace", NS, "--wait=false"]);
}
