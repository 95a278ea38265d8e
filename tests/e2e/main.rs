//! End-to-end scenarios of the operator (issue 6) against a real control plane: a real
//! kube-apiserver accepts the CRDs and validates the CEL rules, a real kube-controller-manager
//! runs the Jobs, Deployments and StatefulSets the operator creates, the fake kubelet runs their
//! pods as this build's `larch`, and the data really flows PostgreSQL 15 → SeaweedFS → engine.
//!
//! One environment per test process (see `support`); scenarios run one at a time.
//! Run: `cargo test --test e2e` (needs `bash e2e/build.sh` once; see e2e/README.md).

mod gitops;
mod invalid_crs;
mod masked_seeds;
mod monitoring;
mod multi_tenancy;
mod operator_rights;
mod parallel_export;
mod progress;
mod restore;
mod seed_restores;
mod slot_collisions;
mod status_command;
mod support;

use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;
use support::{
    Env, KStatus, OPERATOR_NS, condition, condition_is, env, env_with_operator, kstatus, serial,
};

/// An ArchiveExport of `table` to bucket `bucket` on the environment's SeaweedFS.
fn export_manifest(e: &Env, ns: &str, name: &str, table: &str, mode: &str, bucket: &str) -> String {
    format!(
        r#"apiVersion: larch.dev/v1alpha1
kind: ArchiveExport
metadata: {{name: {name}, namespace: {ns}}}
spec:
  mode: {mode}
  source:
    connectionSecretRef: {{name: pg-source, key: dsn}}
    table: {{schema: public, name: {table}}}
  destination:
    s3:
      bucket: {bucket}
      region: us-east-1
      endpoint: {endpoint}
      pathStyle: true
      credentials:
        secretRef: {{name: s3-credentials}}
"#,
        endpoint = e.s3_endpoint
    )
}

/// An ArchiveSource replaying export `export` into memory, following it.
fn source_manifest(ns: &str, name: &str, export: &str) -> String {
    format!(
        r#"apiVersion: larch.dev/v1alpha1
kind: ArchiveSource
metadata: {{name: {name}, namespace: {ns}}}
spec:
  archive:
    exportRef: {{name: {export}}}
  follow: true
  pollInterval: 2s
  target:
    memory: {{}}
"#
    )
}

fn get_cr(e: &Env, kind: &str, ns: &str, name: &str) -> Value {
    e.get(&[kind, name, "-n", ns])
        .unwrap_or_else(|| panic!("{kind} {ns}/{name} not found"))
}

/// Waits until the export's `LastExportSucceeded` is True (and, with `after_run`, for a run other
/// than that one); returns the object.
fn wait_export_succeeded(e: &Env, ns: &str, name: &str, after_run: Option<&str>) -> Value {
    e.wait_for(
        ns,
        &format!("ArchiveExport {ns}/{name} LastExportSucceeded=True"),
        300,
        || {
            let o = e.get(&["archiveexport", name, "-n", ns])?;
            if condition_is(&o, "LastExportSucceeded", "False")
                || condition_is(&o, "Stalled", "True")
            {
                panic!(
                    "export {ns}/{name} failed: {}\n{}",
                    serde_json::to_string_pretty(&o["status"]).unwrap(),
                    e.diagnostics(ns)
                );
            }
            let run = o["status"]["run"]["id"].as_str().map(str::to_string);
            (condition_is(&o, "LastExportSucceeded", "True")
                && condition_is(&o, "Ready", "True")
                && (after_run.is_none() || run.as_deref() != after_run))
                .then_some(o)
        },
    )
}

fn wait_source_ready(e: &Env, ns: &str, name: &str) -> Value {
    e.wait_for(
        ns,
        &format!("ArchiveSource {ns}/{name} Ready=True"),
        300,
        || {
            let o = e.get(&["archivesource", name, "-n", ns])?;
            condition_is(&o, "Ready", "True").then_some(o)
        },
    )
}

/// The pod IPs of a source's engine pods (`name-0`, …).
fn engine_ip(e: &Env, ns: &str, name: &str) -> String {
    let pod = get_cr(e, "pod", ns, &format!("{name}-0"));
    pod["status"]["podIP"]
        .as_str()
        .expect("engine pod IP")
        .to_string()
}

/// Every row the engine serves for `table`, following `next` page by page.
fn engine_rows(e: &Env, ip: &str, table: &str) -> Option<Vec<Value>> {
    let mut rows = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut url = format!("http://{ip}:8080/tables/{table}/rows?limit=300");
        if let Some(a) = &after {
            url.push_str(&format!("&after={}", urlencode(a)));
        }
        let page = e.http_json(&url)?;
        pages += 1;
        rows.extend(page["rows"].as_array()?.iter().cloned());
        match page["next"].as_str() {
            Some(n) => after = Some(n.to_string()),
            None => break,
        }
        assert!(pages < 10_000, "pagination does not end");
    }
    Some(rows)
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The table's rows in PostgreSQL as comparable tuples (id, tenant, kind, amount, flag, ref).
fn pg_rows(e: &Env, table: &str) -> Vec<(i64, String, Option<String>, f64, bool, String)> {
    let out = e.sql(&format!(
        "SELECT id, tenant, coalesce(kind, '\\N'), amount, flag, ref FROM public.{table} ORDER BY id"
    ));
    out.lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            (
                f[0].parse().unwrap(),
                f[1].to_string(),
                (f[2] != "\\N").then(|| f[2].to_string()),
                f[3].parse().unwrap(),
                f[4] == "t",
                f[5].to_string(),
            )
        })
        .collect()
}

/// The engine's rows through the documented value mapping (docs/postgres-types.md): int8 → JSON
/// integer, numeric → number literal, text → string, boolean → true/false, uuid → string.
fn engine_tuples(rows: &[Value]) -> Vec<(i64, String, Option<String>, f64, bool, String)> {
    rows.iter()
        .map(|r| {
            (
                r["id"].as_i64().unwrap_or_else(|| panic!("id of {r}")),
                r["tenant"].as_str().unwrap().to_string(),
                r["kind"].as_str().map(str::to_string),
                r["amount"]
                    .as_f64()
                    .unwrap_or_else(|| panic!("amount of {r}")),
                r["flag"].as_bool().unwrap(),
                r["ref"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Waits until the engine of source `name` serves exactly the rows of `table` in PostgreSQL.
fn wait_engine_matches(e: &Env, ns: &str, name: &str, table: &str) {
    let expected = pg_rows(e, table);
    let mut last = String::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    loop {
        let ip = engine_ip(e, ns, name);
        if let Some(rows) = engine_rows(e, &ip, &format!("public.{table}")) {
            let got = engine_tuples(&rows);
            if got == expected {
                return;
            }
            let ids: Vec<i64> = got.iter().map(|t| t.0).collect();
            last = format!(
                "engine has {} rows (first ids {:?}), PostgreSQL {}",
                got.len(),
                &ids[..ids.len().min(5)],
                expected.len()
            );
        }
        if std::time::Instant::now() > deadline {
            panic!(
                "the engine of {ns}/{name} never served the rows of {table}: {last}\n{}",
                e.diagnostics(ns)
            );
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The one-shot export shared by scenarios 3 and 4: namespace `e2e-oneshot`, export `events`
/// of public.events into bucket `oneshot`, succeeded.
/// Scenario 17 (the image contract): a generated engine pod's process is this build's `larch`, runs
/// as UID and GID 65532 on a read-only root filesystem (the fake kubelet applies runAsUser and
/// readOnlyRootFilesystem as a kubelet does): writing to `/` fails there, its emptyDir `/tmp` takes
/// writes, and the engine serves the table all the same.
#[test]
fn s17_pods_run_as_65532_on_a_read_only_root() {
    let _g = serial();
    oneshot_exported();
    let e = env();
    let ns = "e2e-oneshot";
    e.apply(&source_manifest(ns, "events-cache", "events"));
    wait_source_ready(e, ns, "events-cache");
    wait_engine_matches(e, ns, "events-cache", "events");
    let pod = get_cr(e, "pod", ns, "events-cache-0");
    let id = pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .expect("containerID");
    let pid: u32 = id
        .strip_prefix("fake://")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("containerID {id}"));
    let proc_status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    for id in ["Uid", "Gid"] {
        assert!(
            proc_status.contains(&format!("{id}:\t65532\t65532\t65532\t65532\n")),
            "{id} of pid {pid}: {proc_status}"
        );
    }
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    let larch = std::fs::canonicalize(&e.vars["LARCH_E2E_LARCH"]).unwrap();
    assert_eq!(std::fs::canonicalize(exe).unwrap(), larch);
    // mountinfo: ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS …; the last "/" is the one on top
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let root = mountinfo
        .lines()
        .rfind(|l| l.split(' ').nth(4) == Some("/"))
        .expect("a root mount");
    let options = root.split(' ').nth(5).unwrap();
    assert!(options.split(',').any(|o| o == "ro"), "{root}");
    let in_pod = |path: &str| {
        std::process::Command::new("nsenter")
            .args(["-t", &pid.to_string(), "-m", "touch", path])
            .output()
            .expect("nsenter (util-linux)")
    };
    let denied = in_pod("/larch-e2e-write-probe");
    assert!(!denied.status.success(), "{denied:?}");
    assert!(
        String::from_utf8_lossy(&denied.stderr).contains("Read-only file system"),
        "{denied:?}"
    );
    let tmp = in_pod("/tmp/larch-e2e-write-probe");
    assert!(
        tmp.status.success(),
        "the emptyDir on /tmp is writable: {tmp:?}"
    );
    assert!(!std::path::Path::new("/larch-e2e-write-probe").exists());
}

fn oneshot_exported() -> &'static Value {
    static DONE: OnceLock<Value> = OnceLock::new();
    DONE.get_or_init(|| {
        let e = env_with_operator();
        e.namespace("e2e-oneshot", &[]);
        e.bucket("oneshot");
        e.apply(&export_manifest(
            e,
            "e2e-oneshot",
            "events",
            "events",
            "OneShot",
            "oneshot",
        ));
        wait_export_succeeded(e, "e2e-oneshot", "events", None)
    })
}

// ---------------------------------------------------------------------------------------------

/// Scenario 1: `helm install` of charts/larch: the operator runs as a pod (this build's larch, through the
/// fake kubelet's image mapping) and becomes Ready.
#[test]
fn s01_helm_install_operator_ready() {
    let _g = serial();
    let e = env_with_operator();
    let list: Value =
        serde_json::from_slice(&e.helm(&["list", "-n", OPERATOR_NS, "-o", "json"]).stdout).unwrap();
    assert_eq!(list[0]["name"], "larch", "{list}");
    assert_eq!(list[0]["status"], "deployed", "{list}");
    let pods = e.list(&["pods", "-n", OPERATOR_NS]);
    assert_eq!(pods.len(), 1, "one operator pod");
    let pod = &pods[0];
    assert!(
        condition_is(pod, "Ready", "True"),
        "operator pod Ready: {pod}"
    );
    assert_eq!(pod["spec"]["containers"][0]["image"], support::IMAGE);
    assert_eq!(pod["spec"]["containers"][0]["args"][0], "operator");
    // Its health endpoint answers on the pod IP.
    let ip = pod["status"]["podIP"].as_str().unwrap();
    let out = std::process::Command::new("curl")
        .args(["-sf", &format!("http://{ip}:8080/health/ready")])
        .output()
        .unwrap();
    assert!(out.status.success(), "operator /health/ready on {ip}");

    // Least privilege: without ArchiveSourceSets the chart grants no namespace or Secret rights
    // and the operator runs without that controller.
    let chart = format!("{}/charts/larch", support::REPO);
    let render = |set: &[&str]| {
        let mut args = vec!["template", "larch", chart.as_str()];
        args.extend_from_slice(set);
        let out = e.helm(&args);
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let default = render(&[]);
    assert!(default.contains("resources: [\"secrets\"]"), "{default}");
    let without = render(&["--set", "sourceSets.enabled=false"]);
    // Only the engine tokens' create (s32 checks each feature's rules).
    assert!(
        without.contains("resources: [\"secrets\"]\n    verbs: [\"create\"]"),
        "{without}"
    );
    assert!(!without.contains("\"namespaces\""), "{without}");
    assert!(without.contains("--disable-source-sets"), "{without}");
}

/// examples/*.yaml adapted to this environment by e2e/examples.sh, for namespace `ns`: a List.
fn examples_for(e: &Env, ns: &str) -> String {
    let out = std::process::Command::new("bash")
        .arg(format!("{}/e2e/examples.sh", support::REPO))
        .arg(&e.dir)
        .arg(ns)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Scenario 2: The CRDs apply server-side (over helm's copies, no conflicts: the same content), and the
/// examples apply unchanged apart from the environment's endpoints and Secret values
/// (e2e/examples.sh); the one-shot example exports, its ArchiveSource becomes Ready.
#[test]
fn s02_apply_crds_and_examples() {
    let _g = serial();
    let e = env_with_operator();
    let out = e.kubectl(&[
        "apply",
        "--server-side",
        "--field-manager=larch-e2e",
        "-f",
        &format!("{}/crds/", support::REPO),
    ]);
    assert!(
        out.contains("archiveexports.larch.dev serverside-applied"),
        "{out}"
    );
    assert!(
        out.contains("archivesources.larch.dev serverside-applied"),
        "{out}"
    );
    for crd in ["archiveexports.larch.dev", "archivesources.larch.dev"] {
        let c = get_cr(e, "crd", "", crd);
        assert!(condition_is(&c, "Established", "True"), "{crd} established");
    }

    let ns = "e2e-examples";
    e.namespace(ns, &[]);
    e.apply(&examples_for(e, ns));
    let exports = e.list(&["archiveexports", "-n", ns]);
    let sources = e.list(&["archivesources", "-n", ns]);
    assert!(
        !exports.is_empty() && !sources.is_empty(),
        "examples applied"
    );

    // The one-shot example (users) exports; its ArchiveSource (users-cache) serves the rows.
    wait_export_succeeded(e, ns, "users", None);
    let src = wait_source_ready(e, ns, "users-cache");
    let replicas = src["spec"]["replicas"].as_i64().unwrap_or(1);
    assert_eq!(
        src["status"]["readyReplicas"].as_i64(),
        Some(replicas),
        "{src}"
    );
    wait_engine_matches(e, ns, "users-cache", "events");
    e.kubectl(&["delete", "namespace", ns, "--wait=false"]);
}

/// Scenario 3: A OneShot ArchiveExport to SeaweedFS: the Job succeeds, the archive verifies, the status
/// says LastExportSucceeded=True with the position and the table's row count.
#[test]
fn s03_oneshot_export_to_s3() {
    let _g = serial();
    let o = oneshot_exported();
    let e = env();
    let ns = "e2e-oneshot";
    let jobs = e.list(&["jobs", "-n", ns, "-l", "larch.dev/archive-export=events"]);
    assert_eq!(jobs.len(), 1, "one Job");
    assert_eq!(jobs[0]["status"]["succeeded"], 1, "{}", jobs[0]["status"]);
    assert!(condition_is(&jobs[0], "Complete", "True"));

    let count: i64 = e.sql("SELECT count(*) FROM public.events").parse().unwrap();
    let last = &o["status"]["lastExport"];
    assert_eq!(last["rowCount"].as_i64(), Some(count), "{last}");
    let position = last["position"].as_str().expect("position");
    assert!(
        larch::archive::position::Lsn::parse(position).is_some(),
        "an LSN: {position}"
    );
    let key_prefix = last["keyPrefix"].as_str().unwrap_or("public.events/");
    e.larch(&archive_args(e, &["verify"], "oneshot", key_prefix));
    let text = e.larch(&archive_args(
        e,
        &["inspect", "--json"],
        "oneshot",
        key_prefix,
    ));
    assert!(
        text.contains(position),
        "the manifest holds position {position}: {text}"
    );
    assert!(text.contains(&count.to_string()), "{text}");
}

/// `larch archive <command>` arguments for an archive in the environment's SeaweedFS.
fn archive_args<'a>(
    e: &'a Env,
    command: &[&'a str],
    bucket: &'a str,
    key_prefix: &'a str,
) -> Vec<&'a str> {
    let mut a = vec!["archive"];
    a.extend_from_slice(command);
    a.extend([
        "--store",
        "s3",
        "--bucket",
        bucket,
        "--endpoint",
        &e.s3_endpoint,
        "--region",
        "us-east-1",
        "--path-style",
        "--key-prefix",
        key_prefix,
    ]);
    a
}

/// Scenario 4: An ArchiveSource with exportRef: the engine becomes Ready and its HTTP API, page by page,
/// returns exactly the table's rows; the status reports the export's position, caught up.
#[test]
fn s04_source_exportref_serves_the_table() {
    let _g = serial();
    oneshot_exported();
    let e = env();
    let ns = "e2e-oneshot";
    e.apply(&source_manifest(ns, "events-cache", "events"));
    let o = wait_source_ready(e, ns, "events-cache");
    assert_eq!(o["status"]["readyReplicas"].as_i64(), Some(1), "{o}");
    wait_engine_matches(e, ns, "events-cache", "events");
    // The engines report the archive's head: the export's position.
    let position = oneshot_exported()["status"]["lastExport"]["position"].clone();
    e.wait_for(ns, "status.position at the export's position", 90, || {
        let o = get_cr(e, "archivesource", ns, "events-cache");
        (o["status"]["position"] == position && condition_is(&o, "CaughtUp", "True")).then_some(())
    });
}

/// Scenario 6: A replacement: a new one-shot run over the archive (new epoch). The engine re-baselines
/// once (`status.rebaselines.total` + 1, `Rebaselining=True`, an Event) and serves the new rows
/// only.
#[test]
fn s06_replacement_rebaselines() {
    let _g = serial();
    let e = env_with_operator();
    let ns = "e2e-replace";
    e.sql(
        "DROP TABLE IF EXISTS public.replaced; \
         CREATE TABLE public.replaced AS SELECT * FROM public.events WHERE id <= 300; \
         ALTER TABLE public.replaced ADD PRIMARY KEY (id)",
    );
    e.namespace(ns, &[]);
    e.bucket("replace");
    e.apply(&export_manifest(
        e, ns, "replaced", "replaced", "OneShot", "replace",
    ));
    let first = wait_export_succeeded(e, ns, "replaced", None);
    e.apply(&source_manifest(ns, "replaced-cache", "replaced"));
    wait_source_ready(e, ns, "replaced-cache");
    wait_engine_matches(e, ns, "replaced-cache", "replaced");
    let before = get_cr(e, "archivesource", ns, "replaced-cache")["status"]["rebaselines"]["total"]
        .as_i64()
        .unwrap_or(0);

    // New content, then a new run.
    e.sql(
        "DELETE FROM public.replaced WHERE id <= 100; \
         UPDATE public.replaced SET tenant = 'moved', amount = 1.25 WHERE id BETWEEN 101 AND 150; \
         INSERT INTO public.replaced SELECT id + 10000, tenant, kind, amount, payload, created_at, \
           tags, flag, ref, blob FROM public.events WHERE id <= 50",
    );
    let run = first["status"]["run"]["id"].as_str().map(str::to_string);
    e.kubectl(&[
        "annotate",
        "archiveexport",
        "replaced",
        "-n",
        ns,
        "--overwrite",
        "larch.dev/run-requested=second",
    ]);
    wait_export_succeeded(e, ns, "replaced", run.as_deref());

    let o = e.wait_for(
        ns,
        "rebaselines.total + 1 and Rebaselining=True",
        240,
        || {
            let o = e.get(&["archivesource", "replaced-cache", "-n", ns])?;
            let total = o["status"]["rebaselines"]["total"].as_i64().unwrap_or(0);
            (total == before + 1 && condition_is(&o, "Rebaselining", "True")).then_some(o)
        },
    );
    assert!(o["status"]["rebaselines"]["lastTime"].is_string(), "{o}");
    wait_engine_matches(e, ns, "replaced-cache", "replaced");
    e.wait_for(ns, "a re-baseline Event", 60, || {
        let events = e.list(&["events", "-n", ns]);
        events
            .iter()
            .find(|ev| {
                ev["involvedObject"]["name"] == "replaced-cache" && ev["reason"] == "Rebaselining"
            })
            .cloned()
    });
    // Exactly one: the total does not move further.
    std::thread::sleep(Duration::from_secs(10));
    let o = get_cr(e, "archivesource", ns, "replaced-cache");
    assert_eq!(
        o["status"]["rebaselines"]["total"].as_i64(),
        Some(before + 1),
        "{o}"
    );
}

/// Scenario 7: A CR breaking a CEL rule is rejected by the apiserver with the rule's message.
#[test]
fn s07_cel_rule_rejected() {
    let _g = serial();
    let e = env_with_operator();
    let ns = "e2e-cel";
    e.namespace(ns, &[]);
    let mut bad = export_manifest(e, ns, "bad", "events", "Continuous", "cel");
    bad.push_str("  schedule: {cron: \"@daily\"}\n");
    let out = e.kubectl_out(&["apply", "--server-side", "-f", "-"], Some(&bad));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted: {bad}");
    assert!(
        err.contains("schedule applies only to mode OneShot"),
        "{err}"
    );

    let src = "apiVersion: larch.dev/v1alpha1\nkind: ArchiveSource\nmetadata: {name: bad, namespace: e2e-cel}\nspec:\n  archive: {exportRef: {name: x}}\n  target: {memory: {}, postgres: {connectionSecretRef: {name: a, key: b}}}\n";
    let out = e.kubectl_out(&["apply", "--server-side", "-f", "-"], Some(src));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("set exactly one of memory or postgres"),
        "{err}"
    );
    assert!(e.get(&["archiveexport", "bad", "-n", ns]).is_none());
}

/// Scenario 8: Deleting a CR garbage-collects its children; restarting the operator (deleting its pod)
/// creates no duplicate Job.
#[test]
fn s08_garbage_collection_and_operator_restart() {
    let _g = serial();
    let e = env_with_operator();
    let ns = "e2e-gc";
    e.namespace(ns, &[]);
    e.bucket("gc-archives");
    e.apply(&export_manifest(
        e,
        ns,
        "gc",
        "events",
        "OneShot",
        "gc-archives",
    ));
    wait_export_succeeded(e, ns, "gc", None);
    e.apply(&source_manifest(ns, "gc-cache", "gc"));
    wait_source_ready(e, ns, "gc-cache");
    let jobs = |e: &Env| -> Vec<String> {
        e.list(&["jobs", "-n", ns])
            .iter()
            .map(|j| j["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    let before = jobs(e);
    assert_eq!(before.len(), 1, "{before:?}");

    // Operator restart.
    let old = e.list(&["pods", "-n", OPERATOR_NS]);
    let old_name = old[0]["metadata"]["name"].as_str().unwrap().to_string();
    e.kubectl(&["delete", "pod", &old_name, "-n", OPERATOR_NS, "--wait=true"]);
    e.wait_for(OPERATOR_NS, "a new Ready operator pod", 180, || {
        let pods = e.list(&["pods", "-n", OPERATOR_NS]);
        pods.iter()
            .find(|p| {
                p["metadata"]["name"] != old_name.as_str() && condition_is(p, "Ready", "True")
            })
            .cloned()
    });
    // Give the new operator time to reconcile everything (it requeues every 30s at most).
    std::thread::sleep(Duration::from_secs(35));
    assert_eq!(jobs(e), before, "no duplicate Job after the restart");
    assert!(condition_is(
        &get_cr(e, "archiveexport", ns, "gc"),
        "LastExportSucceeded",
        "True"
    ));
    assert_eq!(e.list(&["statefulsets", "-n", ns]).len(), 1);

    // Garbage collection.
    let sts = get_cr(e, "statefulset", ns, "gc-cache");
    assert_eq!(
        sts["metadata"]["ownerReferences"][0]["kind"],
        "ArchiveSource"
    );
    e.kubectl(&["delete", "archivesource", "gc-cache", "-n", ns]);
    e.kubectl(&["delete", "archiveexport", "gc", "-n", ns]);
    e.wait_for(ns, "children garbage-collected", 180, || {
        let left: usize = [
            "jobs",
            "statefulsets",
            "services",
            "configmaps",
            "deployments",
        ]
        .iter()
        .map(|k| {
            e.list(&[
                k,
                "-n",
                ns,
                "-l",
                "app.kubernetes.io/managed-by=larch-operator",
            ])
            .len()
        })
        .sum();
        let pods = e
            .list(&["pods", "-n", ns])
            .iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .count();
        (left == 0 && pods == 0).then_some(())
    });
}

/// Scenario 9: A namespace enforcing `restricted` Pod Security admits every generated pod: the export
/// Job's, the continuous export Deployment's and the engine StatefulSet's.
#[test]
fn s09_restricted_namespace_admits_generated_pods() {
    let _g = serial();
    let e = env_with_operator();
    let ns = "e2e-restricted";
    e.namespace(ns, &[("pod-security.kubernetes.io/enforce", "restricted")]);
    // The label is enforced: a default pod is rejected.
    let plain = "apiVersion: v1\nkind: Pod\nmetadata: {name: plain, namespace: e2e-restricted}\nspec:\n  containers: [{name: c, image: larch}]\n";
    let out = e.kubectl_out(&["apply", "-f", "-"], Some(plain));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("violates PodSecurity"));

    e.bucket("restricted");
    e.apply(&export_manifest(
        e,
        ns,
        "once",
        "events",
        "OneShot",
        "restricted",
    ));
    e.apply(&export_manifest(
        e,
        ns,
        "follow",
        "events",
        "Continuous",
        "restricted",
    ));
    wait_export_succeeded(e, ns, "once", None);
    e.apply(&source_manifest(ns, "cache", "once"));
    e.wait_for(ns, "a pod of each generated workload", 180, || {
        let pods = e.list(&["pods", "-n", ns]);
        let has = |component: &str, owner: &str| {
            pods.iter().any(|p| {
                p["metadata"]["labels"]["app.kubernetes.io/component"] == component
                    && p["metadata"]["ownerReferences"][0]["kind"] == owner
            })
        };
        (has("export", "Job") && has("export", "ReplicaSet") && has("engine", "StatefulSet"))
            .then_some(())
    });
    let events = e.list(&["events", "-n", ns]);
    for ev in &events {
        let msg = ev["message"].as_str().unwrap_or("");
        assert!(!msg.contains("violates PodSecurity"), "{msg}");
    }
    for kind in ["jobs", "replicasets", "statefulsets"] {
        for w in e.list(&[kind, "-n", ns]) {
            let failure = condition(&w, "ReplicaFailure");
            assert!(failure.is_none_or(|c| c["status"] != "True"), "{w}");
        }
    }
    wait_source_ready(e, ns, "cache");
}

// Scenario 10 (kstatus and Argo CD health of the three kinds) and the no-drift scenario: gitops.rs.

/// Table `public.<name>` as a copy of the first `rows` events, and a Continuous ArchiveExport
/// `<name>` of it (diffs every second) into `bucket`, Ready.
fn continuous_export_of_copy(e: &Env, ns: &str, name: &str, rows: i64, bucket: &str) {
    e.sql(&format!(
        "DROP TABLE IF EXISTS public.{name}; \
         CREATE TABLE public.{name} AS SELECT * FROM public.events WHERE id <= {rows}; \
         ALTER TABLE public.{name} ADD PRIMARY KEY (id)"
    ));
    e.namespace(ns, &[]);
    e.bucket(bucket);
    let mut m = export_manifest(e, ns, name, name, "Continuous", bucket);
    m.push_str("  continuous: {diffInterval: 1s}\n");
    e.apply(&m);
    e.wait_for(ns, "the continuous export Ready", 300, || {
        let o = e.get(&["archiveexport", name, "-n", ns])?;
        condition_is(&o, "Ready", "True").then_some(())
    });
}

/// Scenario 5: a Continuous ArchiveExport (a Deployment running `larch export --follow`) and an
/// ArchiveSource following it: rows inserted, updated and deleted in PostgreSQL show up through
/// the engine. Then an ArchiveSource with `at.time` serves the table as it was at that time (a
/// later transaction is not in it), its status shows the point served, and the export's status
/// shows the restorable window.
#[test]
fn s05_continuous_export_followed_by_engine() {
    let _g = serial();
    let e = env_with_operator();
    let ns = "e2e-continuous";
    continuous_export_of_copy(e, ns, "followed", 500, "continuous");
    e.apply(&source_manifest(ns, "followed-cache", "followed"));
    wait_source_ready(e, ns, "followed-cache");
    wait_engine_matches(e, ns, "followed-cache", "followed");

    e.sql(
        "INSERT INTO public.followed SELECT id + 20000, tenant, kind, amount, payload, created_at, \
           tags, flag, ref, blob FROM public.events WHERE id <= 25; \
         UPDATE public.followed SET tenant = 'updated', kind = NULL, amount = 99.99 WHERE id BETWEEN 10 AND 19; \
         DELETE FROM public.followed WHERE id BETWEEN 100 AND 149",
    );
    wait_engine_matches(e, ns, "followed-cache", "followed");
    // A second transaction after the first has been followed.
    e.sql("UPDATE public.followed SET flag = NOT flag WHERE id = 1; DELETE FROM public.followed WHERE id = 2");
    wait_engine_matches(e, ns, "followed-cache", "followed");

    // The table at a time, then a transaction after it that the pinned source must not serve.
    let then = pg_rows(e, "followed");
    let at = e
        .sql("SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')")
        .trim()
        .to_string();
    e.sql("DELETE FROM public.followed WHERE id BETWEEN 300 AND 399; UPDATE public.followed SET tenant = 'later' WHERE id = 5");
    wait_engine_matches(e, ns, "followed-cache", "followed");
    e.apply(&format!(
        r#"apiVersion: larch.dev/v1alpha1
kind: ArchiveSource
metadata: {{name: followed-then, namespace: {ns}}}
spec:
  archive:
    exportRef: {{name: followed}}
  at: {{time: "{at}"}}
  target:
    memory: {{}}
"#
    ));
    let o = wait_source_ready(e, ns, "followed-then");
    let ip = engine_ip(e, ns, "followed-then");
    let served = engine_tuples(&engine_rows(e, &ip, "public.followed").unwrap());
    assert_eq!(served.len(), then.len(), "rows at {at}");
    assert!(
        served == then,
        "the pinned engine serves the table as it was at {at}"
    );
    let restored = e.wait_for(ns, "status.restored of followed-then", 120, || {
        let o = e.get(&["archivesource", "followed-then", "-n", ns])?;
        o["status"]["restored"]["position"]
            .as_str()
            .map(|_| o["status"]["restored"].clone())
    });
    assert_eq!(restored["precision"], "transaction", "{o}");
    let time = |t: &str| chrono::DateTime::parse_from_rfc3339(t).unwrap();
    assert!(
        time(restored["time"].as_str().unwrap()) <= time(&at),
        "{restored}"
    );
    let export = get_cr(e, "archiveexport", ns, "followed");
    let window = &export["status"]["writers"][0]["restorable"];
    assert!(
        window["earliestTime"].is_string() && window["latestPosition"].is_string(),
        "{export}"
    );
}

/// The writer pod of a continuous export's Deployment (not a copy made by the test).
fn writer_pods(e: &Env, ns: &str, export: &str) -> Vec<Value> {
    e.list(&[
        "pods",
        "-n",
        ns,
        "-l",
        &format!("larch.dev/archive-export={export}"),
    ])
    .into_iter()
    .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
    .collect()
}

fn lease_holder(e: &Env, ns: &str, name: &str) -> Option<String> {
    e.get(&["lease", name, "-n", ns])?["spec"]["holderIdentity"]
        .as_str()
        .map(str::to_string)
}

fn pod_status_json(e: &Env, ns: &str, pod: &str) -> Option<Value> {
    let p = e.get(&["pod", pod, "-n", ns])?;
    let ip = p["status"]["podIP"].as_str()?;
    e.http_json(&format!("http://{ip}:8080/status"))
}

/// The verified archive's row count at its head.
fn archive_row_count(e: &Env, bucket: &str, key_prefix: &str) -> i64 {
    e.larch(&archive_args(e, &["verify"], bucket, key_prefix));
    let text = e.larch(&archive_args(e, &["reconstruct"], bucket, key_prefix));
    let v: Value = serde_json::from_str(&text).unwrap();
    v["row_count"].as_i64().unwrap()
}

/// Scenario 12 (W9): two exporters for one ArchiveExport — the operator's Deployment pod and a
/// copy of its pod — and only the Lease holder writes; a holder whose Lease is taken stops and
/// exits with status 3; after the Lease expires exactly one exporter takes over and writes.
#[test]
fn s12_two_exporters_only_the_lease_holder_writes() {
    let _g = serial();
    let e = env_with_operator();
    let ns = "e2e-lease";
    continuous_export_of_copy(e, ns, "leased", 300, "lease");
    // Exactly the Lease rights the exporter needs, on exactly its Lease.
    let role = get_cr(e, "role", ns, "leased-export-lease");
    assert_eq!(
        role["rules"][0]["resourceNames"],
        serde_json::json!(["leased"])
    );
    assert_eq!(
        role["rules"][0]["verbs"],
        serde_json::json!(["get", "update"])
    );
    let first = e.wait_for(ns, "the writer pod holding the Lease", 120, || {
        let pods = writer_pods(e, ns, "leased");
        let name = pods.first()?["metadata"]["name"].as_str()?.to_string();
        (lease_holder(e, ns, "leased").as_deref() == Some(name.as_str())).then_some(name)
    });

    // A second exporter: the same pod template, outside the Deployment.
    let dep = get_cr(e, "deployment", ns, "leased");
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "leased-second", "namespace": ns, "labels": {"e2e": "second-writer"}},
        "spec": dep["spec"]["template"]["spec"],
    });
    e.apply(&pod.to_string());
    e.wait_for(ns, "the second exporter waiting for the Lease", 120, || {
        let s = pod_status_json(e, ns, "leased-second")?;
        (s["state"] == "WAITING_FOR_LEASE").then_some(())
    });
    let diffs = |pod: &str| {
        pod_status_json(e, ns, pod)
            .and_then(|s| s["diffs"].as_u64())
            .unwrap_or(0)
    };
    let before = diffs(&first);
    e.sql(
        "INSERT INTO public.leased SELECT id + 50000, tenant, kind, amount, payload, created_at, \
           tags, flag, ref, blob FROM public.events WHERE id <= 20",
    );
    e.wait_for(ns, "the holder to write the change", 120, || {
        (diffs(&first) > before).then_some(())
    });
    let table_count = || -> i64 { e.sql("SELECT count(*) FROM public.leased").parse().unwrap() };
    e.wait_for(ns, "the archive to hold the change", 60, || {
        (archive_row_count(e, "lease", "public.leased/") == table_count()).then_some(())
    });
    let second = pod_status_json(e, ns, "leased-second").expect("second exporter status");
    assert_eq!(second["state"], "WAITING_FOR_LEASE", "{second}");
    assert_eq!(second["diffs"], 0, "{second}");
    assert_eq!(second["snapshots"], 0, "{second}");

    // Someone else takes the Lease: the holder stops writing at once and exits with status 3.
    let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%.6fZ");
    e.kubectl(&[
        "patch",
        "lease",
        "leased",
        "-n",
        ns,
        "--type",
        "merge",
        "-p",
        &format!(r#"{{"spec":{{"holderIdentity":"e2e-thief","renewTime":"{now}"}}}}"#),
    ]);
    e.wait_for(ns, "the former holder to exit with status 3", 60, || {
        let p = e.get(&["pod", &first, "-n", ns])?;
        let c = &p["status"]["containerStatuses"][0];
        [&c["lastState"]["terminated"], &c["state"]["terminated"]]
            .iter()
            .any(|t| t["exitCode"] == 3)
            .then_some(())
    });

    // The thief never renews: once its Lease expires exactly one exporter takes over and writes.
    e.sql(
        "UPDATE public.leased SET tenant = 'after-handover' WHERE id <= 10; \
         DELETE FROM public.leased WHERE id BETWEEN 50001 AND 50005",
    );
    let holder = e.wait_for(ns, "a new holder", 120, || {
        let h = lease_holder(e, ns, "leased")?;
        (h == first || h == "leased-second").then_some(h)
    });
    e.wait_for(ns, "the new holder to write the changes", 120, || {
        let updated = e.sql("SELECT count(*) FROM public.leased WHERE tenant = 'after-handover'");
        let (_, rows) = (updated, archive_row_count(e, "lease", "public.leased/"));
        (rows == table_count()).then_some(())
    });
    let other = if holder == first {
        "leased-second".to_string()
    } else {
        first.clone()
    };
    e.wait_for(ns, "the other exporter to wait", 60, || {
        let s = pod_status_json(e, ns, &other)?;
        (s["state"] == "WAITING_FOR_LEASE").then_some(())
    });
    assert!(diffs(&holder) > 0, "the new holder writes");
    e.kubectl(&["delete", "pod", "leased-second", "-n", ns, "--wait=false"]);
    e.kubectl(&[
        "delete",
        "archiveexport",
        "leased",
        "-n",
        ns,
        "--wait=false",
    ]);
}

/// The engine pods of `source` in `ns` that are not terminating.
fn engine_pods(e: &Env, ns: &str, source: &str) -> Vec<Value> {
    e.list(&[
        "pods",
        "-n",
        ns,
        "-l",
        &format!("larch.dev/archive-source={source}"),
    ])
    .into_iter()
    .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
    .collect()
}

/// Whether some engine of `source` in `ns` answers a rows request right now.
fn some_engine_answers(e: &Env, ns: &str, source: &str) -> bool {
    engine_pods(e, ns, source).iter().any(|p| {
        p["status"]["podIP"].as_str().is_some_and(|ip| {
            e.http_json(&format!(
                "http://{ip}:8080/tables/public.events/rows?limit=1"
            ))
            .is_some_and(|v| v["rows"].as_array().is_some_and(|r| r.len() == 1))
        })
    })
}

/// Waits until every engine pod of `source` in `ns` serves exactly public.events.
fn wait_all_engines_match(e: &Env, ns: &str, source: &str, replicas: usize) {
    let expected = pg_rows(e, "events");
    e.wait_for(
        ns,
        &format!("{replicas} engines of {ns}/{source} serving the seed"),
        240,
        || {
            let pods = engine_pods(e, ns, source);
            if pods.len() != replicas {
                return None;
            }
            pods.iter()
                .all(|p| {
                    p["status"]["podIP"].as_str().is_some_and(|ip| {
                        engine_rows(e, ip, "public.events")
                            .is_some_and(|rows| engine_tuples(&rows) == expected)
                    })
                })
                .then_some(())
        },
    );
}

fn secret_data(e: &Env, ns: &str, name: &str) -> Option<Value> {
    e.get(&["secret", name, "-n", ns])
        .map(|s| s["data"].clone())
}

/// `kind/namespace/name → resourceVersion` of the set and of what it and its ArchiveSources
/// own in `namespaces` (ArchiveSources with their status, Secrets, StatefulSets, ConfigMaps,
/// Services).
fn fleet_versions(e: &Env, set: &str, namespaces: &[String]) -> Vec<(String, String)> {
    let mut out = vec![];
    let mut add = |items: Vec<Value>| {
        for o in items {
            out.push((
                format!(
                    "{}/{}/{}",
                    o["kind"].as_str().unwrap_or_default(),
                    o["metadata"]["namespace"].as_str().unwrap_or_default(),
                    o["metadata"]["name"].as_str().unwrap_or_default()
                ),
                o["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            ));
        }
    };
    add(vec![
        e.get(&["archivesourceset", set]).expect("the set exists"),
    ]);
    for ns in namespaces {
        add(e.list(&[
            "archivesources,secrets,statefulsets,configmaps,services",
            "-n",
            ns,
        ]));
    }
    out.sort();
    out
}

/// The set controller's write requests, from the operator's own metrics.
fn set_writes(e: &Env) -> f64 {
    let pods = e.list(&["pods", "-n", OPERATOR_NS]);
    let ip = pods[0]["status"]["podIP"]
        .as_str()
        .expect("operator pod IP");
    let out = std::process::Command::new("curl")
        .args(["-sf", &format!("http://{ip}:8080/metrics")])
        .output()
        .unwrap();
    assert!(out.status.success(), "operator /metrics on {ip}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| {
            l.starts_with("larch_operator_api_writes_total{")
                && l.contains("controller=\"source-set\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Scenario 11: fleet seeding. An ArchiveSourceSet selects namespaces by label and shares a
/// read-only credentials Secret (opt-in): three labelled namespaces each get a Ready engine
/// serving the seed; a labelled namespace whose ResourceQuota allows no pods is listed as
/// failing with the reason; unlabelling a namespace removes its ArchiveSource and Secret copy;
/// rotating the Secret updates every copy and rolls the engines while they keep serving;
/// deleting the set garbage-collects the rest.
#[test]
fn s11_fleet_seeding() {
    let _g = serial();
    let e = env_with_operator();
    let platform = "e2e-fleet-platform";
    let label = ("larch.dev/e2e-seed", "fleet");
    let devs = ["e2e-fleet-a", "e2e-fleet-b", "e2e-fleet-c"];
    let quota_ns = "e2e-fleet-quota";
    let set = "dev-seed";
    let copy = "dev-seed-credentials";

    // The seed: a one-shot export of public.events, made by the platform team.
    e.namespace(platform, &[]);
    e.bucket("fleet-seed");
    e.apply(&export_manifest(
        e,
        platform,
        "seed",
        "events",
        "OneShot",
        "fleet-seed",
    ));
    let exported = wait_export_succeeded(e, platform, "seed", None);
    let key_prefix = exported["status"]["lastExport"]["keyPrefix"]
        .as_str()
        .unwrap_or("public.events/")
        .to_string();
    e.apply(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: seed-reader, namespace: {platform}}}\nstringData:\n  AWS_ACCESS_KEY_ID: reader-1\n  AWS_SECRET_ACCESS_KEY: reader-secret-1\n"
    ));
    for ns in devs {
        e.namespace(ns, &[label]);
    }
    // A namespace that cannot run the engine: no pods allowed.
    e.namespace(quota_ns, &[label]);
    e.apply(&format!(
        "apiVersion: v1\nkind: ResourceQuota\nmetadata: {{name: no-pods, namespace: {quota_ns}}}\nspec:\n  hard: {{pods: \"0\"}}\n"
    ));
    e.apply(&format!(
        r#"apiVersion: larch.dev/v1alpha1
kind: ArchiveSourceSet
metadata: {{name: {set}}}
spec:
  namespaceSelector:
    matchLabels: {{{k}: {v}}}
  credentials:
    secretRef: {{namespace: {platform}, name: seed-reader}}
    shareToNamespaces: true
  template:
    spec:
      archive:
        s3:
          bucket: fleet-seed
          region: us-east-1
          endpoint: {endpoint}
          pathStyle: true
        keyPrefix: {key_prefix}
      table: {{schema: public, name: events}}
      follow: true
      pollInterval: 2s
      replicas: 2
      target:
        memory: {{}}
"#,
        k = label.0,
        v = label.1,
        endpoint = e.s3_endpoint
    ));

    // Every labelled namespace gets a Ready engine serving the seed, through the copy.
    let source_data = secret_data(e, platform, "seed-reader").unwrap();
    for ns in devs {
        let o = wait_source_ready(e, ns, set);
        assert_eq!(o["metadata"]["labels"]["larch.dev/source-set"], set);
        assert_eq!(
            o["metadata"]["ownerReferences"][0]["kind"],
            "ArchiveSourceSet"
        );
        assert_eq!(
            o["spec"]["archive"]["s3"]["credentials"]["secretRef"]["name"], copy,
            "the template's credentials point at the copy"
        );
        let c = get_cr(e, "secret", ns, copy);
        assert_eq!(
            c["data"], source_data,
            "{ns}: the copy holds the shared data"
        );
        assert_eq!(c["metadata"]["labels"]["larch.dev/source-set"], set);
        assert_eq!(c["metadata"]["ownerReferences"][0]["name"], set);
        // The namespace's own Secret of the same purpose is left alone.
        assert!(secret_data(e, ns, "s3-credentials").is_some());
        wait_all_engines_match(e, ns, set, 2);
    }

    // The quota'd namespace is listed as failing, with the reason of its ArchiveSource.
    let status = e.wait_for(
        quota_ns,
        "the set's rollup: 3 ready, the quota'd namespace failing",
        180,
        || {
            let o = e.get(&["archivesourceset", set])?;
            let s = &o["status"];
            let failing = s["failingNamespaces"].as_array()?;
            (s["desiredNamespaces"] == 4
                && s["readyNamespaces"] == 3
                && failing.len() == 1
                && failing[0]["namespace"] == quota_ns
                && failing[0]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("exceeded quota: no-pods"))
                && o["status"]["observedGeneration"] == o["metadata"]["generation"])
                .then(|| o.clone())
        },
    );
    let failing = &status["status"]["failingNamespaces"][0];
    assert_eq!(failing["reason"], "PodCreationFailed", "{status}");
    let msg = failing["message"].as_str().unwrap();
    assert!(msg.contains("exceeded quota: no-pods"), "{msg}");
    assert!(condition_is(&status, "Ready", "False"), "{status}");
    assert!(condition_is(&status, "Stalled", "True"), "{status}");
    assert_eq!(kstatus(&status), KStatus::Failed);
    let q = get_cr(e, "archivesource", quota_ns, set);
    assert_eq!(
        condition(&q, "Stalled").unwrap()["reason"],
        "PodCreationFailed"
    );

    // Unlabel one namespace: its ArchiveSource, engines and copy go; its own Secret stays.
    let gone = devs[2];
    e.kubectl(&["label", "namespace", gone, &format!("{}-", label.0)]);
    e.wait_for(
        gone,
        "the ArchiveSource and the Secret copy removed",
        120,
        || {
            (e.get(&["archivesource", set, "-n", gone]).is_none()
                && e.get(&["secret", copy, "-n", gone]).is_none())
            .then_some(())
        },
    );
    e.wait_for(gone, "the engines garbage-collected", 180, || {
        (e.get(&["statefulset", set, "-n", gone]).is_none() && engine_pods(e, gone, set).is_empty())
            .then_some(())
    });
    assert!(secret_data(e, gone, "s3-credentials").is_some());
    e.wait_for(gone, "desiredNamespaces 3", 60, || {
        let o = e.get(&["archivesourceset", set])?;
        (o["status"]["desiredNamespaces"] == 3 && o["status"]["readyNamespaces"] == 2).then_some(())
    });

    // Rotate the shared Secret: the copies follow, the engines roll to the new keys and serve
    // throughout (two replicas, one replaced at a time).
    let kept = &devs[..2];
    let digest_of = |ns: &str| -> Value {
        get_cr(e, "archivesource", ns, set)["spec"]["pod"]["annotations"]
            ["larch.dev/credentials-digest"]
            .clone()
    };
    let before: Vec<Value> = kept.iter().map(|ns| digest_of(ns)).collect();
    e.apply(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: seed-reader, namespace: {platform}}}\nstringData:\n  AWS_ACCESS_KEY_ID: reader-2\n  AWS_SECRET_ACCESS_KEY: reader-secret-2\n"
    ));
    let rotated = secret_data(e, platform, "seed-reader").unwrap();
    assert_ne!(rotated, source_data);
    let mut gaps: Vec<String> = vec![];
    let (mut polls, started) = (0, std::time::Instant::now());
    e.wait_for(
        kept[0],
        "copies updated and engines rolled to the new keys",
        300,
        || {
            polls += 1;
            for ns in kept {
                if !some_engine_answers(e, ns, set) {
                    gaps.push(format!("{ns} at {:?}", std::time::SystemTime::now()));
                }
            }
            let done = kept.iter().zip(&before).all(|(ns, old)| {
                let digest = digest_of(ns);
                let copied = secret_data(e, ns, copy).as_ref() == Some(&rotated);
                let pods = engine_pods(e, ns, set);
                copied
                    && digest.is_string()
                    && &digest != old
                    && pods.len() == 2
                    && pods.iter().all(|p| {
                        p["metadata"]["annotations"]["larch.dev/credentials-digest"] == digest
                            && condition_is(p, "Ready", "True")
                    })
            });
            done.then_some(())
        },
    );
    assert!(
        gaps.is_empty(),
        "no engine answered during the rotation: {gaps:?}"
    );
    eprintln!(
        "s11: rotation rolled out in {:?}; an engine answered in each namespace at all {polls} polls",
        started.elapsed()
    );
    for ns in kept {
        wait_all_engines_match(e, ns, set, 2);
        let o = get_cr(e, "archivesource", ns, set);
        assert!(condition_is(&o, "Ready", "True"), "{o}");
    }

    // Steady state: nothing changes, so for longer than the ArchiveSources' 30 s probe interval
    // the operator writes nothing: every object of the set keeps its resourceVersion, and the
    // operator's own write counter for this set's controller stays put.
    let mut watched: Vec<String> = kept.iter().map(|ns| ns.to_string()).collect();
    watched.push(quota_ns.to_string());
    // The roll's last status updates (the StatefulSet controller's, the rollup) settle first.
    let mut last = fleet_versions(e, set, &watched);
    e.wait_for(kept[0], "the fleet settled after the rotation", 120, || {
        std::thread::sleep(std::time::Duration::from_secs(5));
        let now = fleet_versions(e, set, &watched);
        let settled = now == last;
        last = now;
        settled.then_some(())
    });
    let before = (fleet_versions(e, set, &watched), set_writes(e));
    std::thread::sleep(std::time::Duration::from_secs(40));
    let after = (fleet_versions(e, set, &watched), set_writes(e));
    assert_eq!(
        before, after,
        "an unchanged fleet: no object rewritten, no write request"
    );

    // Deleting the set garbage-collects its ArchiveSources and copies.
    e.kubectl(&["delete", "archivesourceset", set]);
    e.wait_for(kept[0], "the set's objects garbage-collected", 180, || {
        // This set's only: another scenario's set may still be going.
        let selector = format!("larch.dev/source-set={set}");
        let left = e.list(&["archivesources", "-A", "-l", &selector]).len()
            + e.list(&["secrets", "-A", "-l", &selector]).len();
        (left == 0).then_some(())
    });
}

// ---------------------------------------------------------------------------------------------
// Issue 13: what an ArchiveExport leaves on the source database.

/// The replication slot and publication names the operator derives for `ns`/`name`.
fn derived_slot(ns: &str, name: &str) -> String {
    larch::operator::export::build::export_slot_name(ns, name, None)
}

fn slot_count(e: &Env, slot: &str) -> i64 {
    e.sql(&format!(
        "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}'"
    ))
    .parse()
    .unwrap()
}

fn publication_count(e: &Env, name: &str) -> i64 {
    e.sql(&format!(
        "SELECT count(*) FROM pg_publication WHERE pubname = '{name}'"
    ))
    .parse()
    .unwrap()
}

/// The Events of `object` in `ns` with `reason`, oldest first.
fn events_of(e: &Env, ns: &str, object: &str, reason: &str) -> Vec<Value> {
    e.list(&["events", "-n", ns])
        .into_iter()
        .filter(|ev| ev["involvedObject"]["name"] == object && ev["reason"] == reason)
        .collect()
}

/// Scenario 13: deleting a Continuous ArchiveExport drops its replication slot and publication
/// (the finalizer's cleanup Job), within 60 s; the time is printed.
#[test]
fn s13_delete_drops_the_slot_and_the_publication() {
    let _g = serial();
    let e = env_with_operator();
    let ns = "e2e-delete";
    continuous_export_of_copy(e, ns, "dropped", 200, "delete");
    let slot = derived_slot(ns, "dropped");
    e.wait_for(ns, "the writer's slot and publication", 60, || {
        (slot_count(e, &slot) == 1 && publication_count(e, &slot) == 1).then_some(())
    });
    // The record cleanup goes by.
    assert_eq!(
        e.sql(&format!(
            "SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = '{slot}'"
        )),
        format!("larch: created for replication slot {slot} by archiveexport/{ns}/dropped")
    );
    let o = get_cr(e, "archiveexport", ns, "dropped");
    assert_eq!(
        o["metadata"]["finalizers"],
        serde_json::json!(["larch.dev/cleanup"])
    );
    let t0 = std::time::Instant::now();
    e.kubectl(&[
        "delete",
        "archiveexport",
        "dropped",
        "-n",
        ns,
        "--wait=false",
    ]);
    e.wait_for(ns, "slot and publication dropped", 60, || {
        (slot_count(e, &slot) == 0 && publication_count(e, &slot) == 0).then_some(())
    });
    let dropped = t0.elapsed();
    e.wait_for(ns, "the ArchiveExport gone", 60, || {
        e.get(&["archiveexport", "dropped", "-n", ns])
            .is_none()
            .then_some(())
    });
    eprintln!(
        "e2e s13: delete → slot gone in {:.1}s, ArchiveExport gone in {:.1}s",
        dropped.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    let ok = events_of(e, ns, "dropped", "CleanupSucceeded");
    assert!(!ok.is_empty(), "a CleanupSucceeded Event");
    // The operator deletes the Job right after it lets the object go.
    e.wait_for(ns, "the cleanup Job removed", 60, || {
        e.list(&[
            "jobs",
            "-n",
            ns,
            "-l",
            "app.kubernetes.io/component=cleanup",
        ])
        .is_empty()
        .then_some(())
    });
    assert_eq!(
        ok.len(),
        1,
        "one cleanup, so one CleanupSucceeded Event: {ok:?}"
    );
}

/// Scenario 14: deleting while PostgreSQL is down: `CleanupFailed` (condition and Event with
/// the error), retried; once PostgreSQL is back the slot and publication go, then the object.
#[test]
fn s14_delete_while_postgres_is_down_cleans_up_once_it_is_back() {
    let _g = serial();
    let e = env_with_operator();
    let ns = "e2e-delete-down";
    continuous_export_of_copy(e, ns, "unreachable", 100, "delete-down");
    let slot = derived_slot(ns, "unreachable");
    e.wait_for(ns, "the writer's slot", 60, || {
        (slot_count(e, &slot) == 1).then_some(())
    });
    /// Starts PostgreSQL again however the scenario ends: the next ones need it.
    struct Restart<'a>(&'a Env, bool);
    impl Restart<'_> {
        fn now(&mut self) {
            if !std::mem::replace(&mut self.1, true) {
                self.0.pg_start();
            }
        }
    }
    impl Drop for Restart<'_> {
        fn drop(&mut self) {
            self.now();
        }
    }
    e.pg_stop();
    let mut restart = Restart(e, false);
    e.kubectl(&[
        "delete",
        "archiveexport",
        "unreachable",
        "-n",
        ns,
        "--wait=false",
    ]);
    let failed = e.wait_for(ns, "CleanupFailed", 180, || {
        let o = e.get(&["archiveexport", "unreachable", "-n", ns])?;
        let ready = condition(&o, "Ready")?;
        (ready["reason"] == "CleanupFailed").then(|| o.clone())
    });
    let message = condition(&failed, "Ready").unwrap()["message"]
        .as_str()
        .unwrap()
        .to_string();
    let events = events_of(e, ns, "unreachable", "CleanupFailed");
    restart.now();
    let back = std::time::Instant::now();
    assert!(
        message.contains("cannot connect to PostgreSQL")
            && message.contains("larch.dev/skip-cleanup"),
        "{message}"
    );
    assert!(!events.is_empty(), "a CleanupFailed Event");
    assert!(
        failed["status"]["cleanup"]["lastError"]
            .as_str()
            .unwrap()
            .contains("cannot connect"),
        "{}",
        failed["status"]
    );
    assert_eq!(slot_count(e, &slot), 1, "nothing dropped while down");
    e.wait_for(
        ns,
        "slot and publication dropped after the restart",
        180,
        || (slot_count(e, &slot) == 0 && publication_count(e, &slot) == 0).then_some(()),
    );
    eprintln!(
        "e2e s14: PostgreSQL back → slot gone in {:.1}s (the next retry after its backoff)",
        back.elapsed().as_secs_f64()
    );
    e.wait_for(ns, "the ArchiveExport gone", 60, || {
        e.get(&["archiveexport", "unreachable", "-n", ns])
            .is_none()
            .then_some(())
    });
}

/// Scenario 15: suspend keeps the slot (so resume continues) and status shows the WAL it holds
/// growing under writes; resume continues from the slot; with `deletionPolicy: Retain` the
/// slot and publication outlive the ArchiveExport.
#[test]
fn s15_suspend_keeps_the_slot_and_retain_keeps_it_after_delete() {
    let _g = serial();
    let e = env_with_operator();
    let ns = "e2e-suspend";
    continuous_export_of_copy(e, ns, "paused", 300, "suspend");
    let slot = derived_slot(ns, "paused");
    let epoch = e.wait_for(ns, "the writer's slot in status", 120, || {
        let o = e.get(&["archiveexport", "paused", "-n", ns])?;
        let w = &o["status"]["writers"][0];
        (w["slot"] == slot.as_str() && w["retainedWalBytes"].is_i64())
            .then(|| w["epoch"].as_i64().unwrap())
    });
    e.kubectl(&[
        "patch",
        "archiveexport",
        "paused",
        "-n",
        ns,
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"suspend":true}}"#,
    ]);
    let at_suspension = e.wait_for(ns, "the WAL held at suspension in status", 180, || {
        let o = e.get(&["archiveexport", "paused", "-n", ns])?;
        let w = &o["status"]["writers"][0];
        let ready = condition(&o, "Ready")?;
        (ready["reason"] == "Suspended"
            && writer_pods(e, ns, "paused")
                .iter()
                .all(|p| p["metadata"]["labels"]["app.kubernetes.io/component"] != "export"))
        .then(|| w["retainedWalBytesAtSuspension"].as_i64())
        .flatten()
    });
    assert_eq!(slot_count(e, &slot), 1, "suspend keeps the slot");
    // Writes while suspended: the slot holds more and more WAL.
    e.sql(
        "INSERT INTO public.paused SELECT id + 100000, tenant, kind, amount, payload, created_at, \
           tags, flag, ref, blob FROM public.events; \
         INSERT INTO public.paused SELECT id + 200000, tenant, kind, amount, payload, created_at, \
           tags, flag, ref, blob FROM public.events",
    );
    let grown = e.wait_for(ns, "the retained WAL growing in status", 180, || {
        let o = e.get(&["archiveexport", "paused", "-n", ns])?;
        let w = &o["status"]["writers"][0];
        let now = w["retainedWalBytes"].as_i64()?;
        (now > at_suspension + 100_000).then(|| (now, o.clone()))
    });
    let message = condition(&grown.1, "Ready").unwrap()["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        message.contains(&format!(
            "replication slot {slot} is kept so resume continues"
        )) && message.contains("at suspension"),
        "{message}"
    );
    let sql_retained: i64 = e
        .sql(&format!(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::int8 FROM pg_replication_slots WHERE slot_name = '{slot}'"
        ))
        .parse()
        .unwrap();
    eprintln!(
        "e2e s15: WAL held by the suspended slot: {at_suspension} B at suspension, {} B in status after the writes ({sql_retained} B per pg_replication_slots now)",
        grown.0
    );
    assert!(sql_retained >= grown.0, "status never over-reports");

    // Resume: the same epoch continues from the slot and catches up on the writes.
    e.kubectl(&[
        "patch",
        "archiveexport",
        "paused",
        "-n",
        ns,
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"suspend":false}}"#,
    ]);
    let table: i64 = e.sql("SELECT count(*) FROM public.paused").parse().unwrap();
    e.wait_for(
        ns,
        "the resumed writer to hold the suspended writes",
        180,
        || (archive_row_count(e, "suspend", "public.paused/") == table).then_some(()),
    );
    // The resumed writer reports its epoch a little after it starts writing.
    let resumed = e.wait_for(ns, "the resumed writer's epoch in status", 120, || {
        let o = e.get(&["archiveexport", "paused", "-n", ns])?;
        o["status"]["writers"][0]["epoch"].as_i64()
    });
    assert_eq!(resumed, epoch, "resumed, no new baseline");
    e.wait_for(ns, "the slot monitor gone", 60, || {
        e.get(&["deployment", "paused-slot-monitor", "-n", ns])
            .is_none()
            .then_some(())
    });

    // Retain: the finalizer goes, and the slot and publication stay after the delete.
    e.kubectl(&[
        "patch",
        "archiveexport",
        "paused",
        "-n",
        ns,
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"source":{"deletionPolicy":"Retain"}}}"#,
    ]);
    e.wait_for(ns, "the finalizer removed", 60, || {
        let o = e.get(&["archiveexport", "paused", "-n", ns])?;
        o["metadata"]["finalizers"].is_null().then_some(())
    });
    e.kubectl(&["delete", "archiveexport", "paused", "-n", ns]);
    e.wait_for(ns, "the writer gone", 120, || {
        writer_pods(e, ns, "paused").is_empty().then_some(())
    });
    assert_eq!((slot_count(e, &slot), publication_count(e, &slot)), (1, 1));
    // What the operator would have run: the CLI drops them.
    let out = e.larch(&[
        "export",
        "cleanup",
        "--connection",
        &e.pg_dsn,
        "--slot",
        &slot,
        "--owner",
        &format!("archiveexport/{ns}/paused"),
    ]);
    assert!(out.contains(r#""outcome":"dropped""#), "{out}");
    assert_eq!((slot_count(e, &slot), publication_count(e, &slot)), (0, 0));
}

/// Scenario 16: a Scheduled export run four times with `retention.keepEpochs: 2` leaves exactly
/// two epochs' objects in SeaweedFS.
#[test]
fn s16_scheduled_runs_keep_two_epochs() {
    let _g = serial();
    let e = env_with_operator();
    let ns = "e2e-retention";
    e.namespace(ns, &[]);
    e.bucket("retention");
    let mut m = export_manifest(e, ns, "kept", "events", "OneShot", "retention");
    m.push_str(
        "  schedule: {cron: \"0 0 1 1 *\"}\n  retention: {keepEpochs: 2}\n  keyPrefix: kept/\n",
    );
    e.apply(&m);
    let mut last: Option<String> = None;
    for run in 1..=4 {
        e.kubectl(&[
            "annotate",
            "archiveexport",
            "kept",
            "-n",
            ns,
            "--overwrite",
            &format!("larch.dev/run-requested=run-{run}"),
        ]);
        let id = e.wait_for(ns, &format!("run {run} succeeded"), 180, || {
            let o = e.get(&["archiveexport", "kept", "-n", ns])?;
            let r = &o["status"]["run"];
            let id = r["id"].as_str()?.to_string();
            (Some(&id) != last.as_ref() && r["succeeded"] == true).then_some(id)
        });
        last = Some(id);
    }
    let keys = e.s3_keys("retention", "kept/");
    let mut epochs: Vec<&str> = keys
        .iter()
        .filter_map(|k| k.split('/').find(|p| p.starts_with("epoch=")))
        .collect();
    epochs.sort();
    epochs.dedup();
    assert_eq!(epochs, ["epoch=3", "epoch=4"], "{keys:?}");
    let text = e.larch(&archive_args(
        e,
        &["inspect", "--json"],
        "retention",
        "kept/",
    ));
    let doc: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["epoch"], 4);
    e.larch(&archive_args(e, &["verify"], "retention", "kept/"));
}

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
