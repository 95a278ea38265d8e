//! Scenario 27: progress and honest columns on the real control plane. A one-shot export of
//! 200 000 rows, read through a bandwidth-throttled TCP proxy in front of PostgreSQL (so the
//! copy takes about 45 s, deterministically, with nothing test-only in larch), shows
//! `status.progress` advancing before it completes; an ArchiveSource following it has LAG 0 once
//! caught up while its data age is separate and grows; every printer column of the three kinds
//! (`kubectl get`, `-o wide`) has the header and the value the status says.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::helpers::{
    export_manifest, get_cr, source_manifest, throttled_proxy, wait_export_succeeded,
    wait_source_ready,
};
use super::support::{Env, condition_is, env_with_operator, serial};

const NS: &str = "e2e-progress";
const ROWS: i64 = 200_000;
/// What the proxy lets through from PostgreSQL: ~11 MB of COPY text in ~45 s.
const BYTES_PER_SECOND: usize = 256 * 1024;

/// `kubectl get KIND NAME [-o wide]` as (header, value) pairs, cut at the header's columns
/// (kubectl pads every column to its widest cell, left-aligned).
fn columns(
    e: &Env,
    kind: &str,
    name: &str,
    namespace: Option<&str>,
    wide: bool,
) -> Vec<(String, String)> {
    let mut args = vec!["get", kind, name];
    if let Some(ns) = namespace {
        args.extend(["-n", ns]);
    }
    if wide {
        args.extend(["-o", "wide"]);
    }
    let text = e.kubectl(&args);
    let mut lines = text.lines();
    let header = lines.next().unwrap_or_default();
    let row = lines.next().unwrap_or_else(|| panic!("no row in:\n{text}"));
    // Column starts: a non-space after two spaces (or the line's start).
    let bytes = header.as_bytes();
    let starts: Vec<usize> = (0..bytes.len())
        .filter(|&i| bytes[i] != b' ' && (i == 0 || (i >= 2 && &bytes[i - 2..i] == b"  ")))
        .collect();
    starts
        .iter()
        .enumerate()
        .map(|(k, &s)| {
            let end = starts.get(k + 1).copied().unwrap_or(usize::MAX);
            let cut = |l: &str| l.get(s..end.min(l.len())).unwrap_or("").trim().to_string();
            (cut(header), cut(row))
        })
        .collect()
}

fn headers(cols: &[(String, String)]) -> Vec<&str> {
    cols.iter().map(|(h, _)| h.as_str()).collect()
}

fn value<'a>(cols: &'a [(String, String)], header: &str) -> &'a str {
    cols.iter()
        .find(|(h, _)| h == header)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no column {header} in {cols:?}"))
}

/// Asserts that column `header` shows `status` (an absent value: empty or `<none>`, as kubectl
/// prints a missing path).
fn assert_cell(cols: &[(String, String)], header: &str, status: &Value) {
    let cell = value(cols, header);
    match status {
        Value::Null => assert!(
            cell.is_empty() || cell == "<none>",
            "{header}: {cell:?} for an absent value"
        ),
        Value::String(s) => assert_eq!(cell, s, "{header}"),
        other => assert_eq!(cell, other.to_string(), "{header}"),
    }
}

#[test]
fn s28_progress_advances_and_the_columns_say_what_the_status_says() {
    let _g = serial();
    let e = env_with_operator();
    e.sql(&format!(
        "DROP TABLE IF EXISTS public.progress_rows; \
         CREATE TABLE public.progress_rows AS SELECT g AS id, md5(g::text) AS payload FROM generate_series(1, {ROWS}) g; \
         ALTER TABLE public.progress_rows ADD PRIMARY KEY (id)"
    ));
    // VACUUM reads every page: the catalog's estimate (reltuples) is the count.
    e.sql("VACUUM ANALYZE public.progress_rows");
    let estimate: f64 = e
        .sql("SELECT reltuples FROM pg_class WHERE oid = 'public.progress_rows'::regclass")
        .parse()
        .unwrap();
    let estimate = estimate as i64;
    e.namespace(NS, &[]);
    e.bucket("progress");
    // The export reads PostgreSQL through the throttled proxy.
    let proxy = throttled_proxy(e.pg_port.parse().unwrap(), BYTES_PER_SECOND);
    let dsn = e
        .pg_dsn
        .replace(&format!("port={}", e.pg_port), &format!("port={proxy}"));
    assert_ne!(dsn, e.pg_dsn, "the DSN names the proxy's port");
    e.apply(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: pg-source, namespace: {NS}}}\nstringData:\n  dsn: \"{dsn}\"\n"
    ));

    // 1. The run's progress while it copies: at least two row counts before it completes.
    let t0 = Instant::now();
    e.apply(&export_manifest(
        e,
        NS,
        "progress",
        "progress_rows",
        "OneShot",
        "progress",
    ));
    let mut seen: Vec<Value> = vec![];
    loop {
        assert!(
            t0.elapsed() < Duration::from_secs(300),
            "the export did not complete in 300 s; progress seen: {seen:?}\n{}",
            e.diagnostics(NS)
        );
        let o = get_cr(e, "archiveexport", NS, "progress");
        let p = &o["status"]["progress"];
        if p["phase"] == "Copying" && seen.last() != Some(p) {
            eprintln!("s28: {:.1}s {p}", t0.elapsed().as_secs_f64());
            seen.push(p.clone());
        }
        if condition_is(&o, "LastExportSucceeded", "True") || condition_is(&o, "Stalled", "True") {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let o = wait_export_succeeded(e, NS, "progress", None);
    let rows: Vec<i64> = seen.iter().map(|p| p["rows"].as_i64().unwrap()).collect();
    // Below the table's count: copied before the run completed (all rows may be copied a
    // moment before the snapshot commits).
    let mut distinct: Vec<i64> = rows.iter().copied().filter(|r| *r < ROWS).collect();
    distinct.dedup();
    assert!(
        distinct.len() >= 2,
        "at least two row counts before completion, saw {rows:?} in {seen:?}"
    );
    assert!(
        rows.windows(2).all(|w| w[0] <= w[1]) && rows.iter().all(|r| *r <= ROWS),
        "rows only grow and never pass the table's while copying: {rows:?}"
    );
    // Before the first row the estimate may not be read yet.
    for p in seen.iter().filter(|p| p["rows"].as_i64() > Some(0)) {
        assert_eq!(p["expectedRows"], estimate, "the catalog's estimate: {p}");
        assert_eq!(p["pods"], 1, "{p}");
        assert!(p["bytes"].as_i64().unwrap() > 0, "{p}");
        assert!(p["updatedTime"].is_string(), "{p}");
        let percent = p["percent"].as_str().unwrap();
        let expected = p["rows"].as_i64().unwrap() * 100 / estimate;
        assert_eq!(percent, format!("{expected}%"), "{p}");
    }
    assert!(
        seen.iter()
            .any(|p| p["etaSeconds"].as_i64().is_some_and(|s| s > 0)),
        "an ETA while copying: {seen:?}"
    );
    let done = &o["status"]["progress"];
    assert_eq!(done["phase"], "Complete", "{done}");
    assert_eq!(done["rows"], ROWS, "{done}");
    assert_eq!(done["percent"], "100%", "{done}");
    assert_eq!(o["status"]["lastExport"]["rowCount"], ROWS);

    // 2. ArchiveExport columns.
    let cols = columns(e, "archiveexport", "progress", Some(NS), false);
    assert_eq!(
        headers(&cols),
        [
            "NAME",
            "READY",
            "MODE",
            "LAST EXPORT",
            "POSITION",
            "PROGRESS",
            "AGE"
        ]
    );
    let st = &o["status"];
    assert_eq!(value(&cols, "READY"), "True");
    assert_eq!(value(&cols, "MODE"), "OneShot");
    assert_eq!(
        value(&cols, "POSITION"),
        st["lastExport"]["position"].as_str().unwrap()
    );
    assert_eq!(value(&cols, "PROGRESS"), "100%");
    assert!(!value(&cols, "LAST EXPORT").is_empty());
    let wide = columns(e, "archiveexport", "progress", Some(NS), true);
    let mut wide_headers = headers(&cols);
    wide_headers.splice(6..6, ["ROWS", "WAL HELD"]);
    assert_eq!(headers(&wide), wide_headers);
    assert_eq!(value(&wide, "ROWS"), ROWS.to_string());
    // A one-shot export holds no slot: WAL HELD is a Continuous writer's.
    assert_cell(&wide, "WAL HELD", &st["writers"][0]["retainedWalBytes"]);

    // 3. An ArchiveSource following it: LAG 0 once caught up, the data's age apart.
    e.apply(&source_manifest(NS, "progress-cache", "progress"));
    wait_source_ready(e, NS, "progress-cache");
    let s = e.wait_for(
        NS,
        "the source caught up with its load complete",
        300,
        || {
            let s = e.get(&["archivesource", "progress-cache", "-n", NS])?;
            let st = &s["status"];
            (st["lag"]["summary"] == "0" && st["progress"]["phase"] == "Complete").then_some(s)
        },
    );
    let st = &s["status"];
    assert_eq!(
        (
            &st["lag"]["diffs"],
            &st["lag"]["bytes"],
            &st["lag"]["seconds"]
        ),
        (&Value::from(0), &Value::from(0), &Value::from(0)),
        "{st}"
    );
    assert_eq!(st["progress"]["rows"], ROWS, "{st}");
    assert_eq!(
        st["progress"]["expectedRows"], ROWS,
        "the manifest's row_count: {st}"
    );
    let head_time: jiff::Timestamp = st["headTime"].as_str().unwrap().parse().unwrap();
    // Longer than the 30 s probe interval: nothing is written into the archive, the head ages,
    // the lag stays 0.
    std::thread::sleep(Duration::from_secs(35));
    let s = get_cr(e, "archivesource", NS, "progress-cache");
    let st = &s["status"];
    assert_eq!(
        st["lag"]["summary"], "0",
        "a caught-up source's lag does not count up: {st}"
    );
    assert_eq!(st["lag"]["seconds"], 0, "{st}");
    let age = jiff::Timestamp::now().as_second() - head_time.as_second();
    assert!(
        age >= 35,
        "the data's age grows ({age} s) while the lag stays 0"
    );
    let cols = columns(e, "archivesource", "progress-cache", Some(NS), false);
    assert_eq!(
        headers(&cols),
        [
            "NAME",
            "READY",
            "POSITION",
            "LAG",
            "DATA AGE",
            "PROGRESS",
            "REBASELINES",
            "AGE"
        ]
    );
    assert_eq!(value(&cols, "READY"), "True");
    assert_eq!(value(&cols, "POSITION"), st["position"].as_str().unwrap());
    assert_eq!(value(&cols, "LAG"), "0");
    assert_eq!(value(&cols, "PROGRESS"), "100%");
    assert_cell(&cols, "REBASELINES", &st["rebaselines"]["total"]);
    let data_age = value(&cols, "DATA AGE");
    assert!(
        data_age.ends_with('s') || data_age.ends_with('m'),
        "DATA AGE is an age ({data_age}), of {}",
        st["headTime"]
    );
    let wide = columns(e, "archivesource", "progress-cache", Some(NS), true);
    let mut wide_headers = headers(&cols);
    wide_headers.insert(7, "REPLICAS");
    assert_eq!(headers(&wide), wide_headers);
    assert_cell(&wide, "REPLICAS", &st["readyReplicas"]);
    assert_eq!(value(&wide, "REPLICAS"), "1");

    // 4. An ArchiveSourceSet whose selector matches no namespace.
    e.apply(&format!(
        r#"apiVersion: larch.dev/v1alpha1
kind: ArchiveSourceSet
metadata: {{name: progress-columns}}
spec:
  namespaceSelector:
    matchLabels: {{larch.dev/e2e-progress: none}}
  credentials:
    secretRef: {{namespace: {NS}, name: s3-credentials}}
    shareToNamespaces: true
  template:
    spec:
      archive:
        s3:
          bucket: progress
          region: us-east-1
          endpoint: {endpoint}
          pathStyle: true
        keyPrefix: public.progress_rows/
      table: {{schema: public, name: progress_rows}}
      target:
        memory: {{}}
"#,
        endpoint = e.s3_endpoint
    ));
    let set = e.wait_for(NS, "the set observed", 120, || {
        let o = e.get(&["archivesourceset", "progress-columns"])?;
        o["status"]["observedGeneration"].is_number().then_some(o)
    });
    let st = &set["status"];
    for wide in [false, true] {
        let cols = columns(e, "archivesourceset", "progress-columns", None, wide);
        assert_eq!(
            headers(&cols),
            [
                "NAME",
                "READY",
                "DESIRED",
                "READY NAMESPACES",
                "FAILING",
                "AGE"
            ],
            "wide: {wide}"
        );
        let ready =
            super::support::condition(&set, "Ready").map_or(Value::Null, |c| c["status"].clone());
        assert_cell(&cols, "READY", &ready);
        assert_cell(&cols, "DESIRED", &st["desiredNamespaces"]);
        assert_cell(&cols, "READY NAMESPACES", &st["readyNamespaces"]);
        assert!(
            st["failingNamespaces"]
                .as_array()
                .is_none_or(|f| f.is_empty()),
            "{st}"
        );
        assert_cell(&cols, "FAILING", &Value::Null);
    }
    e.kubectl(&["delete", "archivesourceset", "progress-columns"]);
    e.kubectl(&["delete", "archivesource", "progress-cache", "-n", NS]);
    e.kubectl(&["delete", "archiveexport", "progress", "-n", NS]);
}
