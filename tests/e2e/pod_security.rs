//! Pod security: scenario 9 (a `restricted` namespace admits every generated pod) and 17 (pods
//! run as 65532 on a read-only root).

use super::helpers::{
    export_manifest, get_cr, oneshot_exported, source_manifest, wait_engine_matches,
    wait_export_succeeded, wait_source_ready,
};
use super::support::{condition, env, env_with_operator, serial};

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
