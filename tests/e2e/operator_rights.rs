//! The operator's rights and the secure defaults of the chart (issue 35, findings 8 and 9):
//! what the operator's ServiceAccount may do, as the API server's authorizer answers it, and
//! the engine API token the operator generates for an ArchiveSource that names none.

use serde_json::Value;

use super::helpers::{
    engine_ip, export_manifest, get_cr, source_manifest, wait_export_succeeded, wait_source_ready,
};
use super::support::{Env, OPERATOR_NS, REPO, env_with_operator, serial, wait_until};

/// `kubectl auth can-i VERB RESOURCE -n NS` as ServiceAccount `sa` of `sa_ns`.
fn can_i(e: &Env, sa: &str, sa_ns: &str, verb: &str, resource: &str, ns: &str) -> bool {
    let who = format!("--as=system:serviceaccount:{sa_ns}:{sa}");
    let mut args = vec!["auth", "can-i", verb, resource, who.as_str()];
    if !ns.is_empty() {
        args.extend(["-n", ns]);
    }
    let out = e.kubectl_out(&args, None);
    String::from_utf8_lossy(&out.stdout).trim() == "yes"
}

/// The rules of the ClusterRole `name` in a `helm template` rendering: (resources, verbs,
/// resourceNames) each as one string.
fn rules(rendered: &str, name: &str) -> Vec<(String, String, String)> {
    let docs = rendered.split("\n---");
    for d in docs {
        let Ok(v) = serde_saphyr::from_str::<Value>(d) else {
            continue;
        };
        if v["kind"] == "ClusterRole" && v["metadata"]["name"] == name {
            return v["rules"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| {
                    (
                        r["resources"].to_string(),
                        r["verbs"].to_string(),
                        r["resourceNames"].to_string(),
                    )
                })
                .collect();
        }
    }
    vec![]
}

fn render(e: &Env, set: &[&str]) -> String {
    let chart = format!("{REPO}/charts/larch");
    let mut args = vec!["template", "larch", chart.as_str()];
    for s in set {
        args.extend(["--set", s]);
    }
    let out = e.helm(&args);
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// Scenario 32: each feature value off renders no rule for that feature's rights, and the
/// defaults are the secure ones (NetworkPolicies, generated tokens, no Lease rights
/// cluster-wide: only `bind` on the export-leases ClusterRole).
#[test]
fn s32_chart_rights_follow_the_feature_values() {
    let e = super::support::env();
    let has = |rules: &[(String, String, String)], resource: &str| {
        rules
            .iter()
            .any(|(r, _, _)| r.contains(&format!("\"{resource}\"")))
    };
    let default = render(e, &[]);
    let main = rules(&default, "larch");
    assert!(!main.is_empty(), "{default}");
    assert!(
        !has(&main, "leases"),
        "no Lease right cluster-wide: {main:?}"
    );
    assert!(
        main.iter().any(|(r, v, n)| r.contains("clusterroles")
            && v == "[\"bind\"]"
            && n == "[\"larch-export-leases\"]"),
        "{main:?}"
    );
    // The flag as an argument (the CRDs' descriptions name it too).
    let np_flag = "- --network-policies\n";
    assert!(default.contains(np_flag), "NetworkPolicies on by default");
    assert!(default.contains("--export-lease-role=larch-export-leases"));
    assert!(!default.contains("--no-generated-engine-tokens"));

    let no_continuous = render(e, &["continuousExports.enabled=false"]);
    let r = rules(&no_continuous, "larch");
    for k in [
        "leases",
        "roles",
        "rolebindings",
        "serviceaccounts",
        "clusterroles",
    ] {
        assert!(!has(&r, k), "{k}: {r:?}");
    }
    assert!(rules(&no_continuous, "larch-export-leases").is_empty());
    assert!(!no_continuous.contains("--export-lease-role"));

    let no_sets = render(e, &["sourceSets.enabled=false"]);
    let r = rules(&no_sets, "larch");
    assert!(!has(&r, "namespaces"), "{r:?}");
    let secrets: Vec<_> = r.iter().filter(|(r, _, _)| r.contains("secrets")).collect();
    assert_eq!(secrets.len(), 1, "{r:?}");
    assert_eq!(secrets[0].1, "[\"create\"]", "engine tokens only: {r:?}");

    let neither = render(
        e,
        &["sourceSets.enabled=false", "engineTokens.generate=false"],
    );
    assert!(!has(&rules(&neither, "larch"), "secrets"));
    assert!(neither.contains("--no-generated-engine-tokens"));

    let no_np = render(e, &["networkPolicy.enabled=false"]);
    assert!(!no_np.contains(np_flag));

    let leader = render(e, &["leaderElection.enabled=true", "replicas=2"]);
    assert!(
        !has(&rules(&leader, "larch"), "leases"),
        "the leader Lease is a Role in the release namespace"
    );
    assert!(leader.contains("resourceNames: [\"larch-operator\"]"));
}

/// Scenario 33: the installed operator cannot touch kube-system's Leases (nor any Lease
/// outside a namespace where it runs continuous exports), can create but not read Secrets for
/// engine tokens; an installation without ArchiveSourceSets reads no Secret anywhere.
#[test]
fn s33_the_operator_cannot_read_kube_system_leases_or_unshared_secrets() {
    let _g = serial();
    let e = env_with_operator();
    let sa = "larch";
    for verb in ["get", "list", "update", "delete"] {
        assert!(
            !can_i(e, sa, OPERATOR_NS, verb, "leases", "kube-system"),
            "{verb} leases in kube-system"
        );
    }
    assert!(can_i(e, sa, OPERATOR_NS, "create", "secrets", "default"));
    assert!(can_i(
        e,
        sa,
        OPERATOR_NS,
        "bind",
        "clusterroles/larch-export-leases",
        ""
    ));
    assert!(!can_i(e, sa, OPERATOR_NS, "bind", "clusterroles/admin", ""));
    assert!(!can_i(e, sa, OPERATOR_NS, "escalate", "roles", "default"));

    // A second release of the chart without ArchiveSourceSets (no pod: replicas 0): its
    // ServiceAccount reads no Secret in a namespace that did not opt in to anything.
    let ns = "e2e-rights";
    let out = e.helm(&[
        "upgrade",
        "--install",
        "rights",
        &format!("{REPO}/charts/larch"),
        "--namespace",
        ns,
        "--create-namespace",
        "--set",
        "replicas=0",
        "--set",
        "crds.install=false",
        "--set",
        "rbac.aggregateToDefaultRoles=false",
        "--set",
        "sourceSets.enabled=false",
    ]);
    assert!(out.status.success(), "{out:?}");
    let sa2 = "rights-larch";
    e.namespace("e2e-no-opt-in", &[]);
    for verb in ["get", "list", "watch"] {
        assert!(
            !can_i(e, sa2, ns, verb, "secrets", "e2e-no-opt-in"),
            "{verb} secrets"
        );
    }
    assert!(can_i(e, sa2, ns, "create", "secrets", "e2e-no-opt-in"));
    assert!(!can_i(e, sa2, ns, "get", "leases", "kube-system"));
    let out = e.helm(&["uninstall", "rights", "--namespace", ns]);
    assert!(out.status.success(), "{out:?}");
    e.kubectl(&["delete", "namespace", ns, "e2e-no-opt-in", "--wait=false"]);
}

/// Scenario 34: an ArchiveSource without a token gets Secret `<name>-engine-token` (owned by
/// it; the value in no status); its engine answers the tables API 401 without the token and 200
/// with it; reconciles (a spec change, an operator restart) keep the token.
#[test]
fn s34_a_source_without_a_token_gets_a_generated_one() {
    let _g = serial();
    let e = env_with_operator();
    let ns = "e2e-token";
    e.namespace(ns, &[]);
    e.bucket("token");
    e.apply(&export_manifest(
        e, ns, "events", "events", "OneShot", "token",
    ));
    wait_export_succeeded(e, ns, "events", None);
    e.apply(&source_manifest(ns, "cache", "events"));
    wait_source_ready(e, ns, "cache");

    let secret = get_cr(e, "secret", ns, "cache-engine-token");
    let src = get_cr(e, "archivesource", ns, "cache");
    let owner = &secret["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "ArchiveSource");
    assert_eq!(owner["uid"], src["metadata"]["uid"], "{secret}");
    let token = e
        .secret_value(ns, "cache-engine-token", "token")
        .expect("the token");
    assert_eq!(token.len(), 64, "32 random bytes, hex");
    assert!(!src.to_string().contains(&token), "no token in the source");

    let ip = engine_ip(e, ns, "cache");
    let rows = format!("http://{ip}:8080/tables/public.events/rows?limit=1");
    let code = |t: Option<&str>| {
        let mut cmd = std::process::Command::new("curl");
        cmd.args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "10",
        ]);
        if let Some(t) = t {
            cmd.args(["-H", &format!("Authorization: Bearer {t}")]);
        }
        let out = cmd.arg(&rows).output().unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    assert_eq!(code(None), "401");
    assert_eq!(code(Some("not-the-token-0123456789")), "401");
    assert_eq!(code(Some(&token)), "200");

    // A spec change (a reconcile that rolls the engines) and an operator restart keep it.
    e.kubectl(&[
        "patch",
        "archivesource",
        "cache",
        "-n",
        ns,
        "--type=merge",
        "-p",
        r#"{"spec":{"rebaseline":{"maxPerHour":5}}}"#,
    ]);
    e.kubectl(&["rollout", "restart", "deployment/larch", "-n", OPERATOR_NS]);
    e.kubectl(&[
        "rollout",
        "status",
        "deployment/larch",
        "-n",
        OPERATOR_NS,
        "--timeout=120s",
    ]);
    wait_until("the source reconciled after the restart", 120, || {
        e.get(&["archivesource", "cache", "-n", ns])
            .is_some_and(|s| s["status"]["observedGeneration"] == s["metadata"]["generation"])
    });
    std::thread::sleep(std::time::Duration::from_secs(5));
    assert_eq!(
        e.secret_value(ns, "cache-engine-token", "token").as_deref(),
        Some(token.as_str()),
        "the token never changes while its Secret exists"
    );
    let logs = e.kubectl(&["logs", "-n", OPERATOR_NS, "deployment/larch", "--tail=-1"]);
    assert!(!logs.contains(&token), "the operator never logs the token");

    // Deleting the source deletes the Secret (garbage collection of owned objects).
    e.kubectl(&["delete", "archivesource", "cache", "-n", ns]);
    wait_until("the token Secret garbage-collected", 120, || {
        e.get(&["secret", "cache-engine-token", "-n", ns]).is_none()
    });
    e.kubectl(&["delete", "namespace", ns, "--wait=false"]);
}
