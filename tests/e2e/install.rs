//! Installing larch: scenario 1 (`helm install` of the chart, the operator Ready), 2 (the CRDs
//! and the examples applied), 7 (a CEL rule refused at admission) and 44 (the chart's values).

use serde_json::Value;

use super::helpers::{
    examples_for, export_manifest, get_cr, wait_engine_matches, wait_export_succeeded,
    wait_source_ready,
};
use super::support::{OPERATOR_NS, condition_is, env_with_operator, serial};

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
    assert_eq!(pod["spec"]["containers"][0]["image"], super::support::IMAGE);
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
    let chart = format!("{}/charts/larch", super::support::REPO);
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
        &format!("{}/crds/", super::support::REPO),
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

/// The documents of a `helm template` rendering, by kind and name.
fn rendered(e: &super::support::Env, set: &[&str]) -> Vec<Value> {
    let chart = format!("{}/charts/larch", super::support::REPO);
    let mut args = vec!["template", "larch", chart.as_str(), "-n", "larch-system"];
    for s in set {
        args.extend(["--set", s]);
    }
    let out = e.helm(&args);
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .split("\n---")
        .filter_map(|d| serde_saphyr::from_str::<Value>(d).ok())
        .filter(|v| v.is_object())
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// Scenario 44: the chart's values a cluster operator expects of any chart: nameOverride and
/// fullnameOverride name the objects, podLabels, extraEnv and extraArgs reach the operator's pod
/// (the selector labels stay), the ServiceMonitor keeps the operator's object labels, the
/// PodMonitors scrape only the watched namespace and name each series by its object, and the
/// release's notes point at `larch status`.
#[test]
fn s44_chart_overrides_extras_and_scoped_monitors() {
    let e = env_with_operator();
    let docs = rendered(e, &["nameOverride=lx"]);
    find(&docs, "Deployment", "larch-lx");
    let docs = rendered(
        e,
        &[
            "fullnameOverride=ops",
            "nameOverride=lx",
            "podLabels.team=data",
            "podLabels.app\\.kubernetes\\.io/component=other",
            "extraEnv[0].name=HTTPS_PROXY",
            "extraEnv[0].value=http://proxy:3128",
            "extraArgs[0]=--extra-flag",
        ],
    );
    let deploy = find(&docs, "Deployment", "ops");
    find(&docs, "ServiceAccount", "ops");
    assert_eq!(deploy["metadata"]["labels"]["app.kubernetes.io/name"], "lx");
    let pod = &deploy["spec"]["template"];
    assert_eq!(pod["metadata"]["labels"]["team"], "data", "{pod}");
    assert_eq!(
        pod["metadata"]["labels"]["app.kubernetes.io/component"], "operator",
        "a podLabel must not change the selector labels: {pod}"
    );
    let container = &pod["spec"]["containers"][0];
    let env = container["env"].as_array().unwrap();
    assert!(
        env.iter()
            .any(|v| v["name"] == "HTTPS_PROXY" && v["value"] == "http://proxy:3128"),
        "{env:?}"
    );
    assert_eq!(
        container["args"].as_array().unwrap().last().unwrap(),
        "--extra-flag"
    );

    let monitors = [
        "metrics.serviceMonitor.enabled=true",
        "metrics.podMonitors.enabled=true",
    ];
    let docs = rendered(e, &monitors);
    let sm = find(&docs, "ServiceMonitor", "larch");
    assert_eq!(sm["spec"]["endpoints"][0]["honorLabels"], true, "{sm}");
    for (component, label) in [
        ("export", "archive_export"),
        ("engine", "archive_source"),
        ("restore", "archive_restore"),
    ] {
        let pm = find(&docs, "PodMonitor", &format!("larch-{component}"));
        assert_eq!(pm["spec"]["namespaceSelector"]["any"], true, "{pm}");
        let relabel = &pm["spec"]["podMetricsEndpoints"][0]["relabelings"][0];
        assert_eq!(
            relabel["sourceLabels"][0],
            format!("__meta_kubernetes_pod_label_larch_dev_{label}")
        );
        assert_eq!(relabel["targetLabel"], "name");
    }
    let scoped = rendered(e, &[monitors[0], monitors[1], "watchNamespace=team-a"]);
    let pm = find(&scoped, "PodMonitor", "larch-engine");
    assert_eq!(
        pm["spec"]["namespaceSelector"],
        serde_json::json!({"matchNames": ["team-a"]})
    );

    let chart = format!("{}/charts/larch", super::support::REPO);
    let out = e.helm(&[
        "install",
        "notes",
        &chart,
        "-n",
        "larch-notes",
        "--dry-run=server",
        // The CRDs belong to the release the environment installed.
        "--set",
        "crds.install=false",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout.contains("larch status") && stdout.contains("kubectl larch status"),
        "{stdout}"
    );
}
