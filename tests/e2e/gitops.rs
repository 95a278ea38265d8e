//! What GitOps pipelines see of larch's objects, computed by the libraries their tools run
//! (`larch-gitops`, e2e/gitops: kstatus from `sigs.k8s.io/cli-utils`, the repository's Argo CD
//! health Lua in gopher-lua), and that the operator leaves what Git declares alone.

use std::collections::BTreeMap;

use serde_json::Value;

use super::helpers::{export_manifest, source_manifest, wait_export_succeeded};
use super::support::{
    Env, KStatus, Verdict, argocd_health, env_with_operator, kstatus_verdict, serial,
};

/// An object as both tools see it: (kstatus, kstatus message, Argo CD health, its message).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    kstatus: KStatus,
    kstatus_message: String,
    health: String,
    health_message: String,
}

fn seen(o: &Value) -> Seen {
    let k = kstatus_verdict(o);
    let Verdict { status, message } = argocd_health(o);
    Seen {
        kstatus: KStatus::of(&k),
        kstatus_message: k.message,
        health: status,
        health_message: message,
    }
}

/// `kubectl patch --type=merge`, returning the object as the API server answered the patch: the
/// new generation with the status of before (what a GitOps tool sees right after a sync).
fn merge_patch(e: &Env, kind: &str, ns: Option<&str>, name: &str, patch: &str) -> Value {
    let mut args = vec![
        "patch",
        kind,
        name,
        "--type=merge",
        "-p",
        patch,
        "-o",
        "json",
    ];
    if let Some(ns) = ns {
        args.extend(["-n", ns]);
    }
    serde_json::from_str(&e.kubectl(&args)).expect("kubectl patch JSON")
}

/// Watches `kind/name` until both tools say `want` (kstatus) / `health`, recording every change
/// of what they say on the way (samples before the operator's first status are checked apart:
/// cli-utils reads a custom resource without status as Current, "Resource is current").
fn watch_until(
    e: &Env,
    kind: &str,
    ns: Option<&str>,
    name: &str,
    want: KStatus,
    health: &str,
    secs: u64,
) -> (Vec<Seen>, Value) {
    let mut changes: Vec<Seen> = Vec::new();
    let mut args = vec![kind, name];
    if let Some(ns) = ns {
        args.extend(["-n", ns]);
    }
    let what = format!("{kind} {name}: kstatus {want:?}, Argo CD {health}");
    let last = e.wait_for(ns.unwrap_or("default"), &what, secs, || {
        let o = e.get(&args)?;
        let s = seen(&o);
        if o.get("status").is_none() {
            assert_eq!(
                (s.kstatus, s.kstatus_message.as_str(), s.health.as_str()),
                (KStatus::Current, "Resource is current", "Progressing"),
                "{o}"
            );
            return None;
        }
        if changes.last() != Some(&s) {
            changes.push(s.clone());
        }
        (s.kstatus == want && s.health == health).then_some(o)
    });
    (changes, last)
}

fn assert_statuses(what: &str, changes: &[Seen], kstatus: &[KStatus], health: &[&str]) {
    let mut ks: Vec<KStatus> = changes.iter().map(|s| s.kstatus).collect();
    ks.dedup();
    let mut hs: Vec<&str> = changes.iter().map(|s| s.health.as_str()).collect();
    hs.dedup();
    assert_eq!(ks, kstatus, "{what}: {changes:#?}");
    assert_eq!(hs, health, "{what}: {changes:#?}");
}

/// Right after a spec change, before the operator observed it: kstatus InProgress with
/// cli-utils' generation message, Argo CD Progressing.
fn assert_spec_change_in_progress(o: &Value) {
    let g = o["metadata"]["generation"].as_i64().unwrap();
    let s = seen(o);
    assert_eq!(s.kstatus, KStatus::InProgress, "{o}");
    assert!(
        s.kstatus_message.contains(&format!(
            "generation is {g}, but latest observed generation is"
        )),
        "{s:?}"
    );
    assert_eq!(s.health, "Progressing", "{s:?}");
    assert_eq!(
        s.health_message,
        format!("Waiting for the operator to observe generation {g}")
    );
}

const BAD_AFFINITY: &str = r#"{"nodeAffinity":"anywhere"}"#;

/// Scenario 10: kstatus and Argo CD health, for the three kinds, by the tools' own libraries:
/// InProgress/Progressing while the run or the rollout is under way, Current/Healthy once Ready;
/// a spec change is InProgress until observed; a spec the operator cannot use (Stalled) is
/// Failed/Degraded with its reason and message; fixing it recovers to Current/Healthy.
#[test]
fn s10_kstatus() {
    let _g = serial();
    let e = env_with_operator();
    let ns = "e2e-kstatus";
    let dev = "e2e-kstatus-dev";
    let label = ("larch.dev/e2e-gitops", "kstatus");
    e.namespace(ns, &[]);
    e.namespace(dev, &[label]);
    e.bucket("kstatus");
    e.apply(&export_manifest(
        e, ns, "ks", "events", "OneShot", "kstatus",
    ));
    e.apply(&source_manifest(ns, "ks-cache", "ks"));

    // Created: under way, then Ready.
    let mut objects: BTreeMap<&str, (&str, Option<&str>, &str)> = BTreeMap::new();
    objects.insert("export", ("archiveexport", Some(ns), "ks"));
    objects.insert("source", ("archivesource", Some(ns), "ks-cache"));
    for (what, (kind, ns, name)) in &objects {
        let (changes, o) = watch_until(e, kind, *ns, name, KStatus::Current, "Healthy", 300);
        assert_statuses(
            what,
            &changes,
            &[KStatus::InProgress, KStatus::Current],
            &["Progressing", "Healthy"],
        );
        let s = seen(&o);
        assert_eq!(s.kstatus_message, "Resource is Ready", "{what}");
        let ready = super::support::condition(&o, "Ready").unwrap();
        assert_eq!(
            s.health_message,
            format!(
                "{}: {}",
                ready["reason"].as_str().unwrap(),
                ready["message"].as_str().unwrap()
            ),
            "{what}"
        );
    }
    let key_prefix = wait_export_succeeded(e, ns, "ks", None)["status"]["lastExport"]["keyPrefix"]
        .as_str()
        .unwrap_or("public.events/")
        .to_string();
    e.apply(&format!(
        r#"apiVersion: larch.dev/v1alpha1
kind: ArchiveSourceSet
metadata: {{name: ks-set}}
spec:
  namespaceSelector:
    matchLabels: {{{k}: {v}}}
  template:
    spec:
      archive:
        s3:
          bucket: kstatus
          region: us-east-1
          endpoint: {endpoint}
          pathStyle: true
          credentials:
            secretRef: {{name: s3-credentials}}
        keyPrefix: {key_prefix}
      table: {{schema: public, name: events}}
      target:
        memory: {{}}
"#,
        k = label.0,
        v = label.1,
        endpoint = e.s3_endpoint
    ));
    objects.insert("set", ("archivesourceset", None, "ks-set"));
    let (changes, _) = watch_until(
        e,
        "archivesourceset",
        None,
        "ks-set",
        KStatus::Current,
        "Healthy",
        300,
    );
    assert_statuses(
        "set",
        &changes,
        &[KStatus::InProgress, KStatus::Current],
        &["Progressing", "Healthy"],
    );

    // A spec change: InProgress until observed, then Current again.
    let o = merge_patch(
        e,
        "archivesource",
        Some(ns),
        "ks-cache",
        r#"{"spec":{"pollInterval":"3s"}}"#,
    );
    assert_spec_change_in_progress(&o);
    watch_until(
        e,
        "archivesource",
        Some(ns),
        "ks-cache",
        KStatus::Current,
        "Healthy",
        180,
    );

    // Failure: a pod affinity that is no Affinity stalls each kind (the set through the
    // ArchiveSource it makes); then recovery once it is removed.
    let bad_pod = format!(r#"{{"spec":{{"pod":{{"affinity":{BAD_AFFINITY}}}}}}}"#);
    let bad_template = format!(r#"{{"spec":{{"template":{bad_pod}}}}}"#);
    for (what, (kind, ns, name)) in &objects {
        let (bad, good) = if *what == "set" {
            (
                bad_template.clone(),
                r#"{"spec":{"template":{"spec":{"pod":null}}}}"#.to_string(),
            )
        } else {
            (bad_pod.clone(), r#"{"spec":{"pod":null}}"#.to_string())
        };
        let o = merge_patch(e, kind, *ns, name, &bad);
        assert_spec_change_in_progress(&o);
        let (changes, o) = watch_until(e, kind, *ns, name, KStatus::Failed, "Degraded", 180);
        let s = seen(&o);
        let stalled = super::support::condition(&o, "Stalled").unwrap();
        let reason = stalled["reason"].as_str().unwrap();
        let message = stalled["message"].as_str().unwrap();
        assert_eq!(
            s.kstatus_message, message,
            "{what}: kstatus says the Stalled message"
        );
        assert_eq!(s.health_message, format!("{reason}: {message}"), "{what}");
        if *what == "set" {
            assert_eq!(reason, "NamespacesFailing", "{o}");
            assert!(
                message.contains(&format!("{dev} (InvalidSpec)")),
                "{message}"
            );
        } else {
            assert_eq!(reason, "InvalidSpec", "{o}");
            assert!(
                message.starts_with("spec.pod.affinity is not a valid Affinity"),
                "{message}"
            );
        }
        assert!(
            !changes.iter().any(|c| c.kstatus == KStatus::Current),
            "{what}: a stalled spec is never Current: {changes:#?}"
        );

        let o = merge_patch(e, kind, *ns, name, &good);
        assert_spec_change_in_progress(&o);
        let (changes, _) = watch_until(e, kind, *ns, name, KStatus::Current, "Healthy", 300);
        assert!(
            !changes.iter().any(|c| c.kstatus == KStatus::Failed),
            "{what}: recovered without failing again: {changes:#?}"
        );
    }

    e.kubectl(&[
        "delete",
        "archivesourceset",
        "ks-set",
        "--wait=true",
        "--timeout=120s",
    ]);
    e.kubectl(&["delete", "namespace", ns, dev, "--wait=false"]);
}

/// What the operator may write on a user's larch object besides status (docs/gitops.md): the
/// cleanup finalizer of an ArchiveExport.
const OPERATOR_FINALIZERS: [&str; 1] = ["larch.dev/cleanup"];

/// The operator's field managers (one per controller).
const OPERATOR_MANAGERS: [&str; 4] = [
    "larch-operator/export",
    "larch-operator/source",
    "larch-operator/source-set",
    "larch-operator/restore",
];

/// Every field of `managed` (a managedFields `fieldsV1`) as a path, e.g. `f:spec.f:replicas`.
fn field_paths(prefix: &str, fields: &Value, out: &mut Vec<String>) {
    let Some(map) = fields.as_object() else {
        return;
    };
    for (k, v) in map {
        if k == "." {
            continue;
        }
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        if v.as_object().is_some_and(|m| m.keys().any(|k| k != ".")) {
            field_paths(&path, v, out);
        } else {
            out.push(path);
        }
    }
}

/// Scenario 18: no drift. Every example (examples/ adapted by e2e/examples.sh, and the fleet
/// example) applied server-side as Git holds it: once the operator has reconciled (run done,
/// engines Ready), each larch object's spec, labels and annotations are what was applied, the
/// operator's field managers own only status and its documented finalizer, and a server-side
/// diff of the live objects against the manifest is empty (no default filled in behind Git).
#[test]
fn s18_examples_do_not_drift() {
    let _g = serial();
    let e = env_with_operator();
    let ns = "e2e-drift";
    e.namespace(ns, &[]);
    let examples: Value = serde_json::from_str(&super::helpers::examples_for(e, ns)).unwrap();
    // The fleet example as it is (cluster-scoped; it selects no namespace here).
    e.kubectl(&["create", "namespace", "platform"]);
    // `kubectl create --dry-run -o json` prints one JSON document per object.
    let fleet = e.kubectl(&[
        "create",
        "--dry-run=client",
        "-o",
        "json",
        "-f",
        &format!("{}/examples/fleet/", super::support::REPO),
    ]);
    let mut items = examples["items"].as_array().unwrap().clone();
    for o in serde_json::Deserializer::from_str(&fleet).into_iter::<Value>() {
        let o = o.expect("kubectl JSON");
        match o["kind"].as_str() {
            Some("List") => items.extend(o["items"].as_array().unwrap().iter().cloned()),
            _ => items.push(o),
        }
    }
    let manifest =
        serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string();
    e.apply(&manifest);

    let applied: Vec<&Value> = items
        .iter()
        .filter(|o| {
            o["apiVersion"]
                .as_str()
                .is_some_and(|a| a.starts_with("larch.dev/"))
        })
        .collect();
    assert!(
        applied.len() >= 4,
        "the examples hold larch objects: {applied:?}"
    );
    let live = |o: &Value| -> Value {
        let kind = o["kind"].as_str().unwrap().to_lowercase();
        let name = o["metadata"]["name"].as_str().unwrap();
        let mut args = vec![kind.as_str(), name, "--show-managed-fields"];
        if kind != "archivesourceset" {
            args.extend(["-n", ns]);
        }
        e.get(&args)
            .unwrap_or_else(|| panic!("{kind} {name} not found"))
    };
    // Reconciled: every object observed and Ready (the one-shot run done, its engines serving);
    // the continuous example's export and engine need nothing outside the cluster either.
    super::helpers::wait_export_succeeded(e, ns, "users", None);
    super::helpers::wait_source_ready(e, ns, "users-cache");
    for o in &applied {
        let what = format!("{} {}", o["kind"], o["metadata"]["name"]);
        e.wait_for(
            ns,
            &format!("{what} observed and Ready or Stalled"),
            300,
            || {
                let l = live(o);
                (l["status"]["observedGeneration"] == l["metadata"]["generation"]
                    && super::support::condition(&l, "Ready")
                        .is_some_and(|c| c["status"] != "Unknown"))
                .then_some(())
            },
        );
    }

    let mut report = String::new();
    for o in &applied {
        let l = live(o);
        let what = format!(
            "{} {}",
            o["kind"].as_str().unwrap(),
            o["metadata"]["name"].as_str().unwrap()
        );
        assert_eq!(l["spec"], o["spec"], "{what}: the spec is what was applied");
        for key in ["labels", "annotations"] {
            let want = o["metadata"].get(key).cloned().unwrap_or(Value::Null);
            let got = l["metadata"].get(key).cloned().unwrap_or(Value::Null);
            assert_eq!(got, want, "{what}: metadata.{key} is what was applied");
        }
        for f in l["metadata"]["finalizers"].as_array().into_iter().flatten() {
            assert!(
                OPERATOR_FINALIZERS.contains(&f.as_str().unwrap()),
                "{what}: finalizer {f} is not one the operator documents"
            );
        }
        assert_eq!(
            l["metadata"]["generation"], 1,
            "{what}: nobody changed the spec"
        );
        for m in l["metadata"]["managedFields"].as_array().unwrap() {
            let manager = m["manager"].as_str().unwrap();
            let sub = m["subresource"].as_str().unwrap_or("");
            let mut paths = Vec::new();
            field_paths("", &m["fieldsV1"], &mut paths);
            report.push_str(&format!(
                "{what}: {manager} ({} {sub}): {}\n",
                m["operation"].as_str().unwrap(),
                paths.join(", ")
            ));
            if manager == "larch-e2e" {
                assert_eq!(m["operation"], "Apply", "{what}: {m}");
                continue;
            }
            assert!(
                OPERATOR_MANAGERS.contains(&manager),
                "{what}: a field manager that is neither Git's nor the operator's: {m}"
            );
            if sub == "status" {
                assert!(
                    paths.iter().all(|p| p.starts_with("f:status")),
                    "{what}: {m}"
                );
                continue;
            }
            assert_eq!(manager, "larch-operator/export", "{what}: {m}");
            assert!(
                paths
                    .iter()
                    .all(|p| p == "f:metadata.f:finalizers"
                        || p.starts_with("f:metadata.f:finalizers.")),
                "{what}: {manager} writes more than the finalizer: {paths:?}"
            );
        }
    }
    eprintln!("field managers of every field:\n{report}");

    // What a GitOps tool's server-side diff of the live objects against Git shows: nothing.
    let diff = e.kubectl_out(
        &[
            "diff",
            "--server-side",
            "--field-manager=larch-e2e",
            "-f",
            "-",
        ],
        Some(&manifest),
    );
    assert_eq!(
        diff.status.code(),
        Some(0),
        "kubectl diff --server-side: {}{}",
        String::from_utf8_lossy(&diff.stdout),
        String::from_utf8_lossy(&diff.stderr)
    );
    assert!(
        diff.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&diff.stdout)
    );

    e.kubectl(&[
        "delete",
        "archivesourceset",
        "dev-seed",
        "--wait=true",
        "--timeout=120s",
    ]);
    e.kubectl(&["delete", "namespace", ns, "platform", "--wait=false"]);
}

/// The argocd-cm users install carries the health files the e2e scenarios run, byte for byte.
#[test]
fn argocd_cm_holds_the_health_files_byte_for_byte() {
    let cm: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(super::support::ARGOCD_CM).unwrap())
            .unwrap();
    let data = cm["data"].as_object().expect("argocd-cm data");
    let dir = format!("{}/deploy/argocd/health/larch.dev", super::support::REPO);
    let mut kinds: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|d| d.unwrap().file_name().into_string().unwrap())
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        ["ArchiveExport", "ArchiveSource", "ArchiveSourceSet"]
    );
    assert_eq!(
        data.len(),
        kinds.len(),
        "one health check per kind, nothing else"
    );
    for kind in kinds {
        let key = format!("resource.customizations.health.larch.dev_{kind}");
        let file = std::fs::read_to_string(format!("{dir}/{kind}/health.lua")).unwrap();
        assert_eq!(
            data.get(key.as_str()).and_then(|v| v.as_str()),
            Some(file.as_str()),
            "{key} in deploy/argocd/argocd-cm.yaml differs from {dir}/{kind}/health.lua"
        );
    }
}
