//! Scenario 22: the chart's Grafana dashboard and alerts against real scrapes: every metric a
//! dashboard query or variable, or an alert of the rendered PrometheusRule, names is exposed by
//! the operator (after a one-shot and a continuous export), a continuous exporter or an engine
//! running on the control plane; every alert links a section of docs/runbook.md; and every
//! metric they expose is on docs/metrics.md.

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::Value;

use super::helpers::{
    continuous_export_of_copy, engine_ip, oneshot_exported, source_manifest, wait_source_ready,
    writer_pods,
};
use super::support::{Env, OPERATOR_NS, env_with_operator, serial};

fn scrape(ip: &str) -> String {
    let out = Command::new("curl")
        .args([
            "-sf",
            "--max-time",
            "10",
            &format!("http://{ip}:8080/metrics"),
        ])
        .output()
        .expect("running curl");
    assert!(out.status.success(), "GET http://{ip}:8080/metrics");
    String::from_utf8(out.stdout).unwrap()
}

fn pod_ip(pod: &Value) -> String {
    pod["status"]["podIP"]
        .as_str()
        .expect("a pod IP")
        .to_string()
}

/// The metric families of a scrape (`# TYPE` lines).
fn families(scrape: &str) -> BTreeSet<String> {
    scrape
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split(' ').next().unwrap().to_string())
        .collect()
}

/// Metric names in a PromQL expression: identifiers of larch's, laredo's and the process
/// families (a histogram's `_bucket`/`_count`/`_sum` series named by their family).
fn metrics_in(expr: &str, known: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        // A label value (`source=~"larch_.*"`) names no metric.
        if bytes[i] == b'"' {
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
            i += 1;
        }
        if i > start {
            let word = &expr[start..i];
            let ours = ["larch_", "laredo_", "snapshotter_", "process_"]
                .iter()
                .any(|p| word.starts_with(p));
            // A label name (`component="engine"`) or a function is no metric.
            let next = expr[i..].trim_start().chars().next();
            if ours && next != Some('=') && next != Some('!') && next != Some('(') {
                let family = ["_bucket", "_count", "_sum"]
                    .iter()
                    .find_map(|s| word.strip_suffix(s).filter(|f| known.contains(*f)))
                    .unwrap_or(word);
                out.push(family.to_string());
            }
        } else {
            i += 1;
        }
    }
    out
}

#[test]
fn metrics_in_names_families_not_labels_values_or_functions() {
    let known: BTreeSet<String> = ["larch_export_commit_lag_seconds".to_string()].into();
    assert_eq!(
        metrics_in(
            r#"histogram_quantile(0.95, sum by (le) (rate(larch_export_commit_lag_seconds_bucket[5m]))) + laredo_source_lag_bytes{source=~"larch_.*"} * on (instance) larch_build_info{component="engine"}"#,
            &known
        ),
        [
            "larch_export_commit_lag_seconds",
            "laredo_source_lag_bytes",
            "larch_build_info"
        ]
    );
}

fn monitored(e: &Env) -> (String, String, String) {
    let ns = "e2e-monitoring";
    continuous_export_of_copy(e, ns, "monitored", 300, "monitoring");
    e.apply(&source_manifest(ns, "monitored-cache", "monitored"));
    wait_source_ready(e, ns, "monitored-cache");
    // A change, so the exporter commits a diff and the engine applies it.
    e.sql("UPDATE public.monitored SET flag = NOT flag WHERE id <= 5");
    let writer = writer_pods(e, ns, "monitored")
        .first()
        .map(pod_ip)
        .expect("the writer pod");
    let operator = e.list(&["pods", "-n", OPERATOR_NS]);
    (
        pod_ip(&operator[0]),
        writer,
        engine_ip(e, ns, "monitored-cache"),
    )
}

/// The chart's PrometheusRule as `helm template` renders it with every alert on: (alert,
/// expression) pairs. Each alert's runbook_url must name a section of docs/runbook.md.
fn alert_queries(e: &Env) -> Vec<(String, String)> {
    let out = e.helm(&[
        "template",
        "larch",
        &format!("{}/charts/larch", super::support::REPO),
        "--set",
        "metrics.prometheusRule.enabled=true",
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--show-only",
        "templates/prometheusrule.yaml",
    ]);
    assert!(out.status.success(), "{out:?}");
    let rule: serde_json::Value = serde_saphyr::from_slice(&out.stdout).unwrap();
    let runbook =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/runbook.md")).unwrap();
    let mut queries = Vec::new();
    for group in rule["spec"]["groups"].as_array().unwrap() {
        for r in group["rules"].as_array().unwrap() {
            let alert = r["alert"].as_str().unwrap().to_string();
            let url = r["annotations"]["runbook_url"].as_str().unwrap_or("");
            assert!(
                url.ends_with(&format!("runbook.md#{}", alert.to_lowercase()))
                    && runbook.contains(&format!("\n## {alert}\n")),
                "{alert}: runbook_url {url:?} is not a section of docs/runbook.md"
            );
            queries.push((alert, r["expr"].as_str().unwrap().to_string()));
        }
    }
    assert!(
        queries.iter().any(|(a, _)| a == "LarchOperatorAbsent"),
        "{queries:?}"
    );
    queries
}

#[test]
fn s22_dashboard_queries_only_scraped_metrics() {
    let _g = serial();
    let e = env_with_operator();
    // A one-shot export's success too: the operator's freshness gauge is per succeeded export.
    oneshot_exported();
    let (operator, writer, engine) = monitored(e);
    // The diff's commit shows in the exporter's and the engine's counters.
    let scrapes = e.wait_for("e2e-monitoring", "a diff exported and applied", 120, || {
        let w = scrape(&writer);
        let g = scrape(&engine);
        (w.contains("kind=\"diff\"") && g.contains("laredo_changes_applied_total{"))
            .then(|| vec![scrape(&operator), w, g])
    });
    let exposed: BTreeSet<String> = scrapes.iter().flat_map(|s| families(s)).collect();
    for (component, s) in ["operator", "export", "engine"].iter().zip(&scrapes) {
        assert!(
            s.contains(&format!("component=\"{component}\"")),
            "{component}: {s}"
        );
    }

    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/charts/larch/dashboards/larch.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let mut queries: Vec<(String, String)> = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().into_iter().flatten() {
            let title = format!("panel {}", panel["title"]);
            queries.push((title, t["expr"].as_str().unwrap().to_string()));
        }
    }
    for v in dashboard["templating"]["list"].as_array().unwrap() {
        if v["type"] == "query" {
            let title = format!("variable {}", v["name"]);
            queries.push((title, v["query"]["query"].as_str().unwrap().to_string()));
        }
    }
    queries.extend(alert_queries(e));
    let mut queried = BTreeSet::new();
    for (title, expr) in &queries {
        let names = metrics_in(expr, &exposed);
        assert!(!names.is_empty(), "{title}: no metric in {expr}");
        queried.extend(names);
    }
    let missing: Vec<_> = queried.difference(&exposed).collect();
    assert!(
        missing.is_empty(),
        "the dashboard or the alerts query metrics no scrape exposes: {missing:?}"
    );
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md")).unwrap();
    let undocumented: Vec<_> = exposed
        .iter()
        .filter(|m| !page.contains(&format!("`{m}`")))
        .collect();
    assert!(
        undocumented.is_empty(),
        "not on docs/metrics.md: {undocumented:?}"
    );
    e.kubectl(&["delete", "namespace", "e2e-monitoring", "--wait=false"]);
}
