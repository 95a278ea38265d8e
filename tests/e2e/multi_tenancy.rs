//! Dev namespaces a platform team hands to developers (issue 20): an engine whose API needs a
//! token in a default-deny namespace, developer access through the built-in roles, CRDs that
//! `helm upgrade` upgrades, and no Secret value anywhere a developer can read.
//!
//! The control plane here enforces no NetworkPolicy (no CNI): the scenarios check the policy
//! objects and that the operator's probe path needs nothing but `/status` on port 8080.

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

use super::helpers::{
    export_manifest, get_cr, source_manifest, wait_export_succeeded, wait_source_ready,
};
use super::support::{Env, OPERATOR_NS, REPO, env_with_operator, serial, wait_until};

const NS: &str = "e2e-tenant";
const SOURCE: &str = "guarded";
/// Distinctive Secret values, searched for in everything a scenario leaves readable.
const TOKEN: &str = "tenant-engine-token-3b9d7e1f0a2c4e6f";
const S3_KEY_ID: &str = "AKIATENANT7Q2W9X4Z";
const S3_SECRET: &str = "tenant-s3-secret-9f8e7d6c5b4a3210";
const DB_PASSWORD: &str = "tenant-db-password-51c0ffee";

/// `e2e-tenant`: default-deny (ingress and egress) NetworkPolicy, its own credentials, a OneShot
/// export and ArchiveSource `guarded` (2 replicas; token, control, protected reads; its own
/// NetworkPolicy) Ready.
fn tenant() -> &'static Env {
    static DONE: OnceLock<()> = OnceLock::new();
    let e = env_with_operator();
    DONE.get_or_init(|| {
        // The environment's PostgreSQL trusts local connections: the password is never asked
        // for, but the exporter holds it in its DSN like any other.
        let dsn = format!("{} password={DB_PASSWORD}", e.pg_dsn);
        e.apply(&format!(
            r#"apiVersion: v1
kind: Namespace
metadata: {{name: {NS}}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {{name: default-deny, namespace: {NS}}}
spec:
  podSelector: {{}}
  policyTypes: [Ingress, Egress]
---
apiVersion: v1
kind: Secret
metadata: {{name: pg-source, namespace: {NS}}}
stringData: {{dsn: "{dsn}"}}
---
apiVersion: v1
kind: Secret
metadata: {{name: s3-credentials, namespace: {NS}}}
stringData: {{AWS_ACCESS_KEY_ID: {S3_KEY_ID}, AWS_SECRET_ACCESS_KEY: {S3_SECRET}}}
---
apiVersion: v1
kind: Secret
metadata: {{name: engine-token, namespace: {NS}}}
stringData: {{token: {TOKEN}}}
"#
        ));
        wait_until(&format!("ServiceAccount {NS}/default"), 60, || {
            e.get(&["serviceaccount", "default", "-n", NS]).is_some()
        });
        e.bucket("tenant");
        e.apply(&export_manifest(
            e, NS, "events", "events", "OneShot", "tenant",
        ));
        wait_export_succeeded(e, NS, "events", None);
        let source = source_manifest(NS, SOURCE, "events")
            + "  replicas: 2\n"
            + "  access:\n"
            + "    tokenSecretRef: {name: engine-token, key: token}\n"
            + "    control: true\n"
            + "    protectReads: true\n"
            + "  networkPolicy:\n"
            + "    enabled: true\n"
            + "    from: [{podSelector: {matchLabels: {app: storefront}}}]\n";
        e.apply(&source);
        wait_source_ready(e, NS, SOURCE);
    });
    e
}

/// `curl` of an engine URL: (HTTP status, body).
fn curl(method: &str, url: &str, token: Option<&str>) -> (u16, String) {
    let mut cmd = Command::new("curl");
    cmd.args([
        "-s",
        "--max-time",
        "10",
        "-X",
        method,
        "-w",
        "\n%{http_code}",
    ]);
    if let Some(t) = token {
        cmd.args(["-H", &format!("Authorization: Bearer {t}")]);
    }
    let out = cmd.arg(url).output().expect("running curl");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

fn engine_ips(e: &Env) -> Vec<String> {
    e.list(&[
        "pods",
        "-n",
        NS,
        "-l",
        &format!("larch.dev/archive-source={SOURCE}"),
    ])
    .iter()
    .filter_map(|p| p["status"]["podIP"].as_str().map(str::to_string))
    .collect()
}

/// Scenario 23: in a default-deny namespace the engines still become Ready (the operator reads
/// only `/status`, with the engines' token since reads are protected); the generated NetworkPolicy
/// admits the operator's namespace on 8080 and the listed clients; two replicas get a
/// PodDisruptionBudget; pause answers 401 without the token and 200 with it; rows need it too.
#[test]
fn s23_token_protected_engine_in_a_default_deny_namespace() {
    let _g = serial();
    let e = tenant();
    let src = get_cr(e, "archivesource", NS, SOURCE);
    assert!(
        src["status"]["rows"].as_i64().unwrap_or(0) > 0,
        "the operator read the engines' /status: {}",
        src["status"]
    );

    let np = get_cr(e, "networkpolicy", NS, SOURCE);
    assert_eq!(np["spec"]["policyTypes"], serde_json::json!(["Ingress"]));
    assert_eq!(
        np["spec"]["podSelector"]["matchLabels"]["larch.dev/archive-source"],
        SOURCE
    );
    let rules = np["spec"]["ingress"].as_array().unwrap();
    assert_eq!(
        rules[0]["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        OPERATOR_NS,
        "{np}"
    );
    assert_eq!(
        rules[0]["ports"],
        serde_json::json!([{"port": 8080, "protocol": "TCP"}])
    );
    assert_eq!(
        rules[1]["from"][0]["podSelector"]["matchLabels"]["app"],
        "storefront"
    );
    let pdb = get_cr(e, "poddisruptionbudget", NS, SOURCE);
    assert_eq!(pdb["spec"]["maxUnavailable"], 1, "{pdb}");

    let ips = engine_ips(e);
    assert_eq!(ips.len(), 2, "two engines");
    let ip = &ips[0];
    let pause = format!("http://{ip}:8080/sources/{SOURCE}/pause");
    assert_eq!(curl("POST", &pause, None).0, 401);
    assert_eq!(
        curl("POST", &pause, Some("not-the-token-0123456789")).0,
        401
    );
    // Protected reads protect /status too: without the token it says nothing.
    let status_url = format!("http://{ip}:8080/status");
    assert_eq!(curl("GET", &status_url, None).0, 401);
    let status_of = || -> serde_json::Value {
        let (code, body) = curl("GET", &status_url, Some(TOKEN));
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    };
    let status = status_of();
    assert_eq!(status["sources"][SOURCE]["state"], "STREAMING", "{status}");
    assert_eq!(
        curl("POST", &pause, Some(TOKEN)),
        (200, r#"{"paused":true}"#.into())
    );
    let status = status_of();
    assert_eq!(status["sources"][SOURCE]["state"], "PAUSED", "{status}");
    let resume = format!("http://{ip}:8080/sources/{SOURCE}/resume");
    assert_eq!(curl("POST", &resume, Some(TOKEN)).0, 200);

    let rows = format!("http://{ip}:8080/tables/public.events/rows?limit=1");
    let (code, body) = curl("GET", &rows, None);
    assert_eq!(code, 401, "{body}");
    let (code, body) = curl("GET", &rows, Some(TOKEN));
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"rows\":[{"), "{body}");
}

/// `kubectl --as USER ARGS` (no groups: only the RoleBindings naming the user apply).
fn kubectl_as(e: &Env, user: &str, args: &[&str], stdin: Option<&str>) -> (bool, String) {
    let mut all = vec!["--as", user];
    all.extend_from_slice(args);
    let out = e.kubectl_out(&all, stdin);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// `kubectl auth can-i VERB RESOURCE` (`RESOURCE/SUB` asks about the subresource).
fn can_i(e: &Env, user: &str, verb: &str, resource: &str, ns: &str) -> bool {
    let (resource, sub) = match resource.split_once('/') {
        Some((r, sub)) => (r, format!("--subresource={sub}")),
        None => (resource, "--subresource=".to_string()),
    };
    kubectl_as(
        e,
        user,
        &["auth", "can-i", verb, resource, &sub, "-n", ns],
        None,
    )
    .1
    .trim()
    .starts_with("yes")
}

/// Scenario 24: the chart's aggregated ClusterRoles: a user bound to `edit` in one namespace
/// lists, gets, creates and deletes its ArchiveSources and ArchiveExports, never their status,
/// and nothing in another namespace; a user bound to `view` reads only.
#[test]
fn s24_developers_bound_to_edit_or_view_use_their_namespace_only() {
    let _g = serial();
    let e = env_with_operator();
    let (mine, theirs) = ("e2e-dev-alice", "e2e-dev-bob");
    for ns in [mine, theirs] {
        e.apply(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n"
        ));
        e.apply(&source_manifest(ns, "seed", "events"));
    }
    e.apply(&format!(
        r#"apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: alice-edit, namespace: {mine}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: edit}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: alice}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: carol-view, namespace: {mine}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: view}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: carol}}]
"#
    ));
    // The clusterrole-aggregation controller folds the chart's rules into edit and view.
    wait_until("edit aggregates the larch rules", 60, || {
        can_i(e, "alice", "list", "archivesources.larch.dev", mine)
            && can_i(e, "carol", "list", "archivesources.larch.dev", mine)
    });

    let (ok, out) = kubectl_as(
        e,
        "alice",
        &["get", "archivesources", "-n", mine, "-o", "name"],
        None,
    );
    assert!(ok && out.contains("archivesource.larch.dev/seed"), "{out}");
    let (ok, out) = kubectl_as(
        e,
        "alice",
        &["get", "archivesource", "seed", "-n", mine, "-o", "json"],
        None,
    );
    assert!(ok, "{out}");
    let (ok, out) = kubectl_as(e, "alice", &["get", "archivesources", "-n", theirs], None);
    assert!(!ok && out.contains("Forbidden"), "{out}");
    let (ok, out) = kubectl_as(
        e,
        "alice",
        &["get", "archivesource", "seed", "-n", theirs],
        None,
    );
    assert!(!ok && out.contains("Forbidden"), "{out}");

    let other = source_manifest(mine, "alices", "events");
    let (ok, out) = kubectl_as(
        e,
        "alice",
        &["apply", "--server-side", "-f", "-"],
        Some(&other),
    );
    assert!(ok, "alice creates in her namespace: {out}");
    let (ok, out) = kubectl_as(
        e,
        "alice",
        &["delete", "archivesource", "alices", "-n", mine],
        None,
    );
    assert!(ok, "{out}");
    let intrusion = source_manifest(theirs, "alices", "events");
    let (ok, out) = kubectl_as(
        e,
        "alice",
        &["apply", "--server-side", "-f", "-"],
        Some(&intrusion),
    );
    assert!(!ok && out.contains("forbidden"), "{out}");
    let (ok, out) = kubectl_as(
        e,
        "alice",
        &["delete", "archivesource", "seed", "-n", theirs],
        None,
    );
    assert!(!ok && out.contains("Forbidden"), "{out}");
    assert!(e.get(&["archivesource", "seed", "-n", theirs]).is_some());

    assert!(can_i(
        e,
        "alice",
        "create",
        "archiveexports.larch.dev",
        mine
    ));
    assert!(!can_i(
        e,
        "alice",
        "patch",
        "archivesources.larch.dev/status",
        mine
    ));
    assert!(!can_i(
        e,
        "alice",
        "create",
        "archivesourcesets.larch.dev",
        mine
    ));
    assert!(can_i(e, "carol", "get", "archiveexports.larch.dev", mine));
    assert!(!can_i(
        e,
        "carol",
        "create",
        "archivesources.larch.dev",
        mine
    ));
    assert!(!can_i(
        e,
        "carol",
        "list",
        "archivesources.larch.dev",
        theirs
    ));

    for ns in [mine, theirs] {
        e.kubectl(&["delete", "namespace", ns, "--wait=false"]);
    }
}

fn crd_description(e: &Env, marker: &str) -> bool {
    get_cr(e, "crd", "", "archivesources.larch.dev")
        .to_string()
        .contains(marker)
}

fn copy_dir(from: &Path, to: &Path) {
    let status = Command::new("cp")
        .arg("-r")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(status.success());
}

/// Scenario 25: `helm upgrade` to a chart whose CRD changed applies the new CRD (they are
/// templates kept on uninstall), leaves the custom resources alone, and upgrading back restores
/// the CRD of this repository.
#[test]
fn s25_helm_upgrade_upgrades_changed_crds() {
    let _g = serial();
    let e = env_with_operator();
    let ns = "e2e-crd-upgrade";
    e.apply(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n"
    ));
    e.apply(&source_manifest(ns, "kept", "events"));
    let uid = get_cr(e, "archivesource", ns, "kept")["metadata"]["uid"].clone();

    let marker = "CRD-UPGRADE-MARKER-20";
    let dir = tempfile::tempdir().unwrap();
    let chart = dir.path().join("larch");
    copy_dir(&Path::new(REPO).join("charts/larch"), &chart);
    let crd_file = chart.join("files/crds/archivesources.larch.dev.yaml");
    let text = std::fs::read_to_string(&crd_file).unwrap();
    let changed = text.replacen(
        "Engine replicas (default 1).",
        &format!("Engine replicas (default 1). {marker}"),
        1,
    );
    assert_ne!(text, changed, "the marker went into the CRD");
    std::fs::write(&crd_file, changed).unwrap();
    assert!(!crd_description(e, marker));

    let upgrade = |chart: &Path| {
        let out = e.helm(&[
            "upgrade",
            "larch",
            chart.to_str().unwrap(),
            "--namespace",
            OPERATOR_NS,
            "--reuse-values",
            "--wait",
            "--timeout",
            "180s",
        ]);
        assert!(
            out.status.success(),
            "helm upgrade: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    upgrade(&chart);
    assert!(
        crd_description(e, marker),
        "helm upgrade applied the changed CRD"
    );
    let crd = get_cr(e, "crd", "", "archivesources.larch.dev");
    assert_eq!(
        crd["metadata"]["annotations"]["helm.sh/resource-policy"], "keep",
        "{}",
        crd["metadata"]
    );
    assert_eq!(
        get_cr(e, "archivesource", ns, "kept")["metadata"]["uid"],
        uid
    );

    upgrade(&Path::new(REPO).join("charts/larch"));
    assert!(
        !crd_description(e, marker),
        "upgrading back restored the CRD"
    );
    assert_eq!(
        get_cr(e, "archivesource", ns, "kept")["metadata"]["uid"],
        uid
    );
    let history: Value = serde_json::from_slice(
        &e.helm(&["history", "larch", "-n", OPERATOR_NS, "-o", "json"])
            .stdout,
    )
    .unwrap();
    assert!(history.as_array().unwrap().len() >= 3, "{history}");
    e.kubectl(&["delete", "namespace", ns, "--wait=false"]);
}

/// Scenario 26: after an export, two engines, token-checked requests (right and wrong) and a
/// pause, none of the Secret values — the database password, the S3 key pair, the engine token —
/// is in any pod log (exporter, engines, operator), Event, custom resource, pod status
/// (termination messages), engine `/status` or the operator's `/metrics`.
#[test]
fn s26_no_secret_value_in_logs_events_status_or_engine_status() {
    let _g = serial();
    let e = tenant();
    let ip = &engine_ips(e)[0];
    // Traffic that carries the token, wrong and right.
    let pause = format!("http://{ip}:8080/sources/{SOURCE}/pause");
    curl("POST", &pause, Some(&format!("{TOKEN}x")));
    assert_eq!(curl("POST", &pause, Some(TOKEN)).0, 200);
    let resume = format!("http://{ip}:8080/sources/{SOURCE}/resume");
    assert_eq!(curl("POST", &resume, Some(TOKEN)).0, 200);

    let mut gathered: Vec<(String, String)> = e.pod_logs(&[NS, OPERATOR_NS]);
    let log_files = gathered.len();
    assert!(
        log_files >= 4,
        "exporter, two engines and the operator logged: {:?}",
        gathered.iter().map(|(p, _)| p).collect::<Vec<_>>()
    );
    for args in [
        &["get", "events", "-A", "-o", "json"][..],
        &["get", "archiveexports,archivesources", "-A", "-o", "json"][..],
        &["get", "pods", "-n", NS, "-o", "json"][..],
        &[
            "get",
            "jobs,statefulsets,configmaps",
            "-n",
            NS,
            "-o",
            "json",
        ][..],
    ] {
        gathered.push((format!("kubectl {}", args.join(" ")), e.kubectl(args)));
    }
    let events = &gathered[log_files].1;
    assert!(
        events.contains(NS),
        "Events of the tenant namespace gathered"
    );
    for ip in engine_ips(e) {
        // protectReads with the source's own token: /status needs it too (issue 35)
        let (code, body) = curl("GET", &format!("http://{ip}:8080/status"), Some(TOKEN));
        assert_eq!(code, 200);
        assert!(body.contains(SOURCE), "{body}");
        gathered.push((format!("engine {ip} /status"), body));
    }
    let operator = &e.list(&["pods", "-n", OPERATOR_NS])[0];
    let op_ip = operator["status"]["podIP"].as_str().unwrap();
    let (_, metrics) = curl("GET", &format!("http://{op_ip}:8080/metrics"), None);
    assert!(
        metrics.contains("larch_operator"),
        "operator metrics gathered"
    );
    gathered.push(("operator /metrics".into(), metrics));

    let mut leaks = vec![];
    for (what, text) in &gathered {
        for (name, secret) in [
            ("database password", DB_PASSWORD),
            ("S3 access key id", S3_KEY_ID),
            ("S3 secret key", S3_SECRET),
            ("engine token", TOKEN),
        ] {
            if text.contains(secret) {
                leaks.push(format!("{name} in {what}"));
            }
        }
    }
    let bytes: usize = gathered.iter().map(|(_, t)| t.len()).sum();
    assert!(bytes > 10_000, "something was gathered ({bytes} bytes)");
    assert!(leaks.is_empty(), "Secret values leaked: {leaks:#?}");
    eprintln!(
        "s26: {} sources, {bytes} bytes searched, no Secret value found",
        gathered.len()
    );
}

/// The sum of `larch_operator_reconciles_total{controller=…}` on the operator's /metrics.
fn reconciles(e: &Env, controller: &str) -> u64 {
    let operator = &e.list(&["pods", "-n", OPERATOR_NS])[0];
    let ip = operator["status"]["podIP"].as_str().unwrap();
    let (code, metrics) = curl("GET", &format!("http://{ip}:8080/metrics"), None);
    assert_eq!(code, 200, "the operator answers /metrics");
    let prefix = format!("larch_operator_reconciles_total{{controller=\"{controller}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.trim().parse::<f64>().unwrap() as u64)
}

/// A tenant's own pod serving an endless `/status` on port 8080, labelled as the source's
/// engines are; `/count` says how many `/status` requests it got.
const ENDLESS_STATUS: &str = r#"
import http.server, os
count = 0
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global count
        if self.path == "/count":
            body = str(count).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        count += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        try:
            self.wfile.write(b'{"sources":{"guarded":{"state":"STREAMING","rows":1,"pad":"')
            while True:
                self.wfile.write(b"A" * 65536)
        except Exception:
            pass
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer((os.environ["POD_IP"], 8080), H).serve_forever()
"#;

/// Issue 35, finding 6: a pod the tenant made itself, carrying the source's labels and serving
/// an endless `/status`, is never probed (the operator reads only pods whose owner chain
/// reaches the ArchiveSource's UID): the source's status stays the engines' and the operator
/// keeps answering and reconciling.
#[test]
fn s35_a_tenant_pod_with_the_sources_labels_is_never_probed() {
    let _g = serial();
    let e = tenant();
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "impostor", "namespace": NS, "labels": {
            "larch.dev/archive-source": SOURCE, "app.kubernetes.io/name": "larch",
            "app.kubernetes.io/component": "engine"}},
        "spec": {"containers": [{
            "name": "engine", "image": super::support::IMAGE,
            "command": ["/usr/bin/python3", "-c", ENDLESS_STATUS],
            "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
            "ports": [{"containerPort": 8080}]}]}
    });
    e.apply(&pod.to_string());
    let ip = e.wait_for(NS, "the impostor serving", 60, || {
        let p = e.get(&["pod", "impostor", "-n", NS])?;
        let ip = p["status"]["podIP"].as_str()?.to_string();
        (curl("GET", &format!("http://{ip}:8080/count"), None) == (200, "0".into())).then_some(ip)
    });
    let before = get_cr(e, "archivesource", NS, SOURCE);
    let rows = before["status"]["rows"].as_i64().unwrap();
    let (sources, exports) = (reconciles(e, "source"), reconciles(e, "export"));
    // Reconciles of the source (and of another custom resource) while the impostor is there.
    for i in 0..3 {
        for kind in ["archivesource/guarded", "archiveexport/events"] {
            e.kubectl(&[
                "annotate",
                kind,
                "-n",
                NS,
                &format!("e2e.larch.dev/poke={i}"),
                "--overwrite",
            ]);
        }
        std::thread::sleep(std::time::Duration::from_secs(4));
    }
    wait_until("reconciles of the source and the export", 60, || {
        reconciles(e, "source") >= sources + 3 && reconciles(e, "export") > exports
    });
    assert_eq!(
        curl("GET", &format!("http://{ip}:8080/count"), None),
        (200, "0".into()),
        "the operator never read the impostor's /status"
    );
    let after = get_cr(e, "archivesource", NS, SOURCE);
    assert_eq!(
        after["status"]["rows"].as_i64(),
        Some(rows),
        "{}",
        after["status"]
    );
    assert_eq!(
        super::support::condition(&after, "Ready").unwrap()["status"],
        "True",
        "{}",
        after["status"]
    );
    e.kubectl(&["delete", "pod", "impostor", "-n", NS, "--wait=false"]);
}
