//! Scenario 11: fleet seeding by an ArchiveSourceSet.

use serde_json::Value;

use super::helpers::{
    engine_rows, engine_tuples, export_manifest, get_cr, pg_rows, wait_export_succeeded,
    wait_source_ready,
};
use super::support::{
    Env, KStatus, OPERATOR_NS, condition, condition_is, env_with_operator, kstatus, serial,
};

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
