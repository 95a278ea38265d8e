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
    // One coordinator wrote: it took the export's Lease (the operator made it, and the rights
    // on it), and released it once committed.
    let lease = e
        .get(&["lease", "big", "-n", NS])
        .expect("the export's Lease");
    assert!(
        lease["spec"]["acquireTime"].is_string() && lease["spec"]["holderIdentity"].is_null(),
        "{lease}"
    );
    // Someone else holds the Lease: the next run's coordinator waits for it to expire (20 s
    // without renewal) before it exports and commits.
    let taken = chrono::Utc::now();
    e.kubectl(&[
        "patch",
        "lease",
        "big",
        "-n",
        NS,
        "--type",
        "merge",
        "-p",
        &format!(
            r#"{{"spec":{{"holderIdentity":"e2e-other","leaseDurationSeconds":20,"renewTime":"{}"}}}}"#,
            taken.format("%Y-%m-%dT%H:%M:%S%.6fZ")
        ),
    ]);
    e.kubectl(&[
        "annotate",
        "archiveexport",
        "big",
        "-n",
        NS,
        "--overwrite",
        "larch.dev/run-requested=second",
    ]);
    wait_export_succeeded(e, NS, "big", Some(&run));
    let lease = e
        .get(&["lease", "big", "-n", NS])
        .expect("the export's Lease");
    let acquired = lease["spec"]["acquireTime"]
        .as_str()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .expect("acquireTime");
    assert!(
        acquired.timestamp() >= taken.timestamp() + 19,
        "the coordinator took the Lease only once the other holder's expired: {lease}"
    );

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

/// s37b's own namespace: s37's may still be terminating.
const KILL_NS: &str = "e2e-split-kill";
/// Rows of s37b's table: some 7 MB of COPY text, a worker's share taking ~10 s through the
/// throttled proxy.
const KILL_ROWS: i64 = 100_000;

/// Scenario 37b: a worker pod deleted mid-copy is replaced for its index and the run still
/// succeeds. PostgreSQL is read through a TCP proxy passing 256 KiB/s a connection, so the
/// workers copy for seconds; worker 0's pod is deleted once the plan is in the store and it has
/// copied for a while; the Job runs index 0 again (a second pod of index 0), the run succeeds and
/// the archive holds exactly the table (reconstructed row by row) in one snapshot object.
#[test]
fn s37b_a_deleted_worker_pod_is_replaced_and_the_run_succeeds() {
    let _g = serial();
    let e = env_with_operator();
    let table = "split_kill";
    e.sql(&format!(
        "DROP TABLE IF EXISTS public.{table}; \
         CREATE TABLE public.{table} (id int8 PRIMARY KEY, note text NOT NULL); \
         INSERT INTO public.{table} SELECT g, 'row ' || g || repeat('y', 50) \
           FROM generate_series(1, {KILL_ROWS}) g; ANALYZE public.{table}"
    ));
    e.namespace(KILL_NS, &[]);
    e.bucket(BUCKET);
    let proxy = super::helpers::throttled_proxy(e.pg_port.parse().unwrap(), 256 * 1024);
    let dsn = e
        .pg_dsn
        .replace(&format!("port={}", e.pg_port), &format!("port={proxy}"));
    assert_ne!(dsn, e.pg_dsn, "the DSN names the proxy's port");
    e.apply(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: pg-source, namespace: {KILL_NS}}}\nstringData:\n  dsn: \"{dsn}\"\n"
    ));
    let doc = export_doc(e, "killed", "{ranges: 4, workers: 2}")
        .replace(NS, KILL_NS)
        .replace(TABLE, table);
    e.apply(&doc);
    let key_prefix = format!("public.{table}/");
    e.wait_for(KILL_NS, "the coordinator's plan in the store", 120, || {
        let keys = e.s3_keys(BUCKET, &key_prefix);
        keys.iter().any(|k| k.contains("split/")).then_some(())
    });
    let index_pods = |index: &str| -> Vec<Value> {
        let selector = format!("batch.kubernetes.io/job-completion-index={index}");
        let pods = e.list(&["pods", "-n", KILL_NS, "-l", &selector]);
        pods.into_iter()
            .filter(|p| p["metadata"]["labels"]["larch.dev/archive-export"] == "killed")
            .collect()
    };
    let victim = e.wait_for(KILL_NS, "worker 0 running", 60, || {
        let pods = index_pods("0");
        let running = pods.iter().find(|p| p["status"]["phase"] == "Running")?;
        running["metadata"]["name"].as_str().map(str::to_string)
    });
    std::thread::sleep(std::time::Duration::from_secs(4));
    let before = get_cr(e, "archiveexport", KILL_NS, "killed");
    assert!(
        !condition_is(&before, "LastExportSucceeded", "True"),
        "the run ended before worker 0 could be deleted: make the copy slower"
    );
    e.kubectl(&["delete", "pod", &victim, "-n", KILL_NS, "--wait=false"]);
    let done = wait_export_succeeded(e, KILL_NS, "killed", None);
    let again: Vec<String> = index_pods("0")
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
        .filter(|n| *n != victim)
        .collect();
    assert!(!again.is_empty(), "index 0 ran again after {victim}");
    eprintln!("s37b: {victim} deleted, index 0 ran again in {again:?}");
    assert_eq!(done["status"]["lastExport"]["rowCount"], KILL_ROWS);
    assert_eq!(
        done["status"]["split"]["workersSucceeded"], 2,
        "{}",
        done["status"]
    );
    let want: BTreeSet<(i64, String)> = e
        .sql(&format!("SELECT id || '|' || note FROM public.{table}"))
        .lines()
        .map(|l| {
            let (id, note) = l.split_once('|').unwrap();
            (id.parse().unwrap(), note.to_string())
        })
        .collect();
    let got = archive_rows(e, &key_prefix);
    assert_eq!(got.len(), want.len(), "row count");
    assert!(got == want, "the archive differs from the table");
    let snapshots = e.s3_keys(BUCKET, &key_prefix);
    let snapshots: Vec<&String> = snapshots
        .iter()
        .filter(|k| k.contains("/snapshot-"))
        .collect();
    assert_eq!(snapshots.len(), 1, "one snapshot object: {snapshots:?}");
    e.kubectl(&["delete", "namespace", KILL_NS, "--wait=false"]);
}
