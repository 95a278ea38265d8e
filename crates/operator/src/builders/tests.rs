//! Builder tests: golden outputs of every child for a set of specs (regenerate with
//! `LARCH_UPDATE_GOLDEN=1 cargo test`), plus properties every child must have.

use k8s_openapi::api::core::v1::PodSpec;
use larch_contract::export_request::ExportRequest;
use serde::Serialize;
use serde_json::Value;

use super::engine_config::{ResolvedArchive, resolve};
use super::*;
use crate::crd::{ArchiveExport, ArchiveRestore, ArchiveSource};
use crate::export::build as export;
use crate::export::children::{ExportChildren, children};
use crate::restore::build as restore;
use crate::source::build::{self as source, SourceChildren};

pub(crate) fn ctx() -> BuildContext {
    BuildContext {
        image: "registry.example/larch:0.1.0".into(),
        operator_namespace: "larch-system".into(),
        network_policies: false,
        generate_engine_tokens: true,
        pod_user: pod::PodUser::default(),
    }
}

pub(crate) fn export_fixture(name: &str) -> ArchiveExport {
    let path = format!(
        "{}/src/builders/testdata/{name}.input.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

pub(crate) fn source_fixture(name: &str) -> ArchiveSource {
    let path = format!(
        "{}/src/builders/testdata/{name}.input.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

pub(crate) fn docs<T: Serialize>(items: &[T]) -> String {
    items
        .iter()
        .map(|i| format!("---\n{}", serde_saphyr::to_string(i).unwrap()))
        .collect()
}

pub(crate) fn golden(name: &str, actual: &str) {
    crate::crd::tests::assert_golden(
        &format!("crates/operator/src/builders/testdata/{name}.golden.yaml"),
        actual,
    );
}

pub(crate) const EXPORTS: [&str; 5] = [
    "export-oneshot-s3",
    "export-scheduled-tables",
    "export-continuous-s3",
    "export-oneshot-set",
    "export-oneshot-split",
];

pub(crate) fn export_children(name: &str) -> ExportChildren {
    export_children_in(name, &ctx())
}

pub(crate) fn export_children_in(name: &str, ctx: &BuildContext) -> ExportChildren {
    let e = export_fixture(name);
    let run = export::run_id(&e, None);
    children(&e, Some(&run), ctx)
}

/// (fixture, referenced export fixture)
pub(crate) const SOURCES: [(&str, Option<&str>); 4] = [
    ("source-exportref-memory", Some("export-oneshot-s3")),
    ("source-s3-postgres", None),
    ("source-exportref-volume", Some("export-scheduled-tables")),
    ("source-access-networkpolicy", None),
];

pub(crate) fn resolved(name: &str, export: Option<&str>) -> (ArchiveSource, ResolvedArchive) {
    let s = source_fixture(name);
    let e = export.map(export_fixture);
    let r = resolve(&s, e.as_ref()).unwrap();
    (s, r)
}

pub(crate) fn source_children(name: &str, export: Option<&str>) -> SourceChildren {
    source_children_in(name, export, &ctx())
}

pub(crate) fn source_children_in(
    name: &str,
    export: Option<&str>,
    ctx: &BuildContext,
) -> SourceChildren {
    let (s, r) = resolved(name, export);
    source::children(&s, &r, ctx)
}

/// (fixture, referenced export fixture)
pub(crate) const RESTORES: [(&str, Option<&str>); 2] = [
    ("restore-exportref-tables", Some("export-scheduled-tables")),
    ("restore-s3-at-position", None),
];

pub(crate) fn restore_fixture(name: &str) -> ArchiveRestore {
    let path = format!(
        "{}/src/builders/testdata/{name}.input.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

pub(crate) fn restore_job_in(
    name: &str,
    export: Option<&str>,
    ctx: &BuildContext,
) -> k8s_openapi::api::batch::v1::Job {
    let r = restore_fixture(name);
    let e = export.map(export_fixture);
    let archive = restore::resolve(&r, e.as_ref()).unwrap();
    restore::job(&r, &archive, &restore::run_id(&r, None), ctx)
}

/// Every pod meets Pod Security "restricted" (plus a read-only root filesystem).
pub(crate) fn assert_restricted(what: &str, spec: &PodSpec) {
    let psc = spec.security_context.as_ref().expect("pod securityContext");
    assert_eq!(psc.run_as_non_root, Some(true), "{what}");
    assert_ne!(psc.run_as_user, Some(0), "{what}");
    assert_eq!(
        psc.seccomp_profile.as_ref().unwrap().type_,
        "RuntimeDefault",
        "{what}"
    );
    assert_eq!(spec.host_network, None, "{what}");
    assert_eq!(spec.host_pid, None, "{what}");
    assert_eq!(spec.host_ipc, None, "{what}");
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    for c in containers {
        let sc = c
            .security_context
            .as_ref()
            .expect("container securityContext");
        assert_eq!(
            sc.allow_privilege_escalation,
            Some(false),
            "{what}/{}",
            c.name
        );
        assert_eq!(
            sc.read_only_root_filesystem,
            Some(true),
            "{what}/{}",
            c.name
        );
        assert_eq!(sc.run_as_non_root, Some(true), "{what}/{}", c.name);
        assert_eq!(sc.privileged, None, "{what}/{}", c.name);
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop,
            Some(vec!["ALL".to_string()]),
            "{what}/{}",
            c.name
        );
        assert_eq!(
            sc.capabilities.as_ref().unwrap().add,
            None,
            "{what}/{}",
            c.name
        );
        assert!(
            c.ports.iter().flatten().all(|p| p.host_port.is_none()),
            "{what}/{}",
            c.name
        );
        let mounts = c.volume_mounts.as_ref().unwrap();
        assert!(
            mounts.iter().any(|m| m.mount_path == "/tmp"),
            "{what}: /tmp must be writable"
        );
    }
    for v in spec.volumes.iter().flatten() {
        let allowed = v.config_map.is_some()
            || v.secret.is_some()
            || v.empty_dir.is_some()
            || v.persistent_volume_claim.is_some()
            || v.projected.is_some()
            || v.downward_api.is_some();
        assert!(
            allowed && v.host_path.is_none(),
            "{what}: volume {} not allowed",
            v.name
        );
    }
}

pub(crate) fn all_pod_specs() -> Vec<(String, PodSpec)> {
    all_pod_specs_in(&ctx())
}

pub(crate) fn all_pod_specs_in(ctx: &BuildContext) -> Vec<(String, PodSpec)> {
    let mut out = vec![];
    for name in EXPORTS {
        let c = export_children_in(name, ctx);
        for j in &c.jobs {
            out.push((
                format!("{name} job"),
                j.spec.clone().unwrap().template.spec.unwrap(),
            ));
        }
        for cj in &c.cron_jobs {
            let t = cj.spec.job_template.spec.clone().unwrap().template;
            out.push((format!("{name} cronjob"), t.spec.unwrap()));
        }
        for d in &c.deployments {
            out.push((
                format!("{name} deployment"),
                d.spec.template.spec.clone().unwrap(),
            ));
        }
    }
    for (name, export) in SOURCES {
        let c = source_children_in(name, export, ctx);
        out.push((
            format!("{name} statefulset"),
            c.stateful_set.spec.template.spec.unwrap(),
        ));
    }
    for (name, export) in RESTORES {
        let j = restore_job_in(name, export, ctx);
        out.push((
            format!("{name} job"),
            j.spec.unwrap().template.spec.unwrap(),
        ));
    }
    out
}

#[test]
fn every_generated_pod_is_pod_security_restricted() {
    let specs = all_pod_specs();
    assert!(
        specs.len() >= 7,
        "fixtures cover Job, CronJob, Deployment and StatefulSet pods"
    );
    for (what, spec) in &specs {
        assert_restricted(what, spec);
        // Only the pods that hold a Lease talk to the API: a continuous exporter and a split
        // run's coordinator (not its workers). No other pod gets a token.
        let coordinator = what.starts_with("export-oneshot-split")
            && spec.containers[0].name != crate::export::split::WORKER_CONTAINER;
        let leased = what.contains("continuous") || coordinator;
        assert_eq!(spec.automount_service_account_token, Some(leased), "{what}");
    }
}

/// `--pod-run-as-user platform` (OpenShift): no UID, GID or fsGroup in any generated pod, which
/// stays "restricted"; by default all three are the image's user.
#[test]
fn the_uid_of_generated_pods_is_fixed_or_left_to_the_platform() {
    for (what, spec) in all_pod_specs() {
        let psc = spec.security_context.unwrap();
        let ids = (psc.run_as_user, psc.run_as_group, psc.fs_group);
        assert_eq!(ids, (Some(65532), Some(65532), Some(65532)), "{what}");
    }
    let platform = BuildContext {
        pod_user: pod::PodUser::Platform,
        ..ctx()
    };
    let specs = all_pod_specs_in(&platform);
    assert!(specs.len() >= 7);
    for (what, spec) in &specs {
        assert_restricted(what, spec);
        let psc = spec.security_context.as_ref().unwrap();
        assert_eq!(
            (psc.run_as_user, psc.run_as_group, psc.fs_group),
            (None, None, None),
            "{what}"
        );
    }
    let cleanup =
        crate::export::cleanup_job::cleanup_job(&export_fixture("export-continuous-s3"), &platform);
    let psc = cleanup
        .spec
        .unwrap()
        .template
        .spec
        .unwrap()
        .security_context
        .unwrap();
    assert_eq!(psc.run_as_user, None);
    assert_eq!(psc.run_as_non_root, Some(true));

    use std::str::FromStr;
    assert_eq!(
        pod::PodUser::from_str("1000680000"),
        Ok(pod::PodUser::Fixed(1000680000))
    );
    assert_eq!(
        pod::PodUser::from_str("platform"),
        Ok(pod::PodUser::Platform)
    );
    assert!(pod::PodUser::from_str("0").unwrap_err().contains("root"));
    assert!(pod::PodUser::from_str("-5").unwrap_err().contains("\"-5\""));
    assert!(pod::PodUser::from_str("nobody").is_err());
    assert_eq!(pod::PodUser::default().to_string(), "65532");
}

/// The export request a container's `larch export [split-worker] --request '<json>'` carries.
pub(crate) fn request_of(args: &[String]) -> ExportRequest {
    let flags = match args.get(1).map(String::as_str) {
        Some("split-worker") => {
            assert_eq!(
                args[2..4],
                ["--index", "$(JOB_COMPLETION_INDEX)"],
                "{args:?}"
            );
            &args[4..]
        }
        _ => &args[1..],
    };
    assert_eq!(args[0], "export", "{args:?}");
    assert_eq!(flags.len(), 2, "{args:?}");
    assert_eq!(flags[0], "--request", "{args:?}");
    ExportRequest::from_json(&flags[1]).unwrap()
}

/// `larch engine` and `larch export --follow` listen on loopback unless told otherwise: every
/// pod that serves HTTP passes its pod IP explicitly, so probes and scrapes reach it.
#[test]
fn every_serving_container_passes_listen_explicitly() {
    let mut serving = 0;
    for (what, spec) in all_pod_specs() {
        for c in &spec.containers {
            let args = c.args.clone().unwrap_or_default();
            let listen = match args.first().map(String::as_str) {
                Some("engine") => args
                    .iter()
                    .position(|a| a == "--listen")
                    .and_then(|i| args.get(i + 1))
                    .cloned(),
                Some("export") => match request_of(&args) {
                    r if r.follow => r.listen,
                    _ => continue,
                },
                _ => continue,
            };
            serving += 1;
            assert_eq!(
                listen.as_deref(),
                Some("$(POD_IP):8080"),
                "{what}: {args:?}"
            );
        }
    }
    assert!(serving >= 3, "engines and continuous exports covered");
}

pub(crate) fn all_children_json() -> Vec<Value> {
    let mut out: Vec<Value> = vec![];
    for name in EXPORTS {
        let c = export_children(name);
        out.extend(c.pvc.iter().map(|x| serde_json::to_value(x).unwrap()));
        out.extend(c.jobs.iter().map(|x| serde_json::to_value(x).unwrap()));
        out.extend(c.cron_jobs.iter().map(|x| serde_json::to_value(x).unwrap()));
        out.extend(
            c.deployments
                .iter()
                .map(|x| serde_json::to_value(x).unwrap()),
        );
        if let Some(la) = &c.lease_access {
            out.extend(la.leases.iter().map(|x| serde_json::to_value(x).unwrap()));
            out.extend(
                la.service_account
                    .iter()
                    .map(|x| serde_json::to_value(x).unwrap()),
            );
            out.push(serde_json::to_value(&la.role).unwrap());
            out.push(serde_json::to_value(&la.role_binding).unwrap());
        }
    }
    for (name, export) in SOURCES {
        let c = source_children(name, export);
        out.push(serde_json::to_value(&c.config_map).unwrap());
        out.push(serde_json::to_value(&c.stateful_set).unwrap());
        out.push(serde_json::to_value(&c.service).unwrap());
        out.extend(
            c.network_policy
                .iter()
                .map(|x| serde_json::to_value(x).unwrap()),
        );
        out.extend(
            c.pod_disruption_budget
                .iter()
                .map(|x| serde_json::to_value(x).unwrap()),
        );
    }
    out
}

#[test]
fn every_child_is_owned_and_carries_no_labels_or_annotations_of_the_custom_resource() {
    let children = all_children_json();
    assert!(children.len() >= 12);
    for c in &children {
        let refs = c["metadata"]["ownerReferences"]
            .as_array()
            .expect("ownerReferences");
        assert_eq!(refs.len(), 1, "{}", c["metadata"]["name"]);
        assert_eq!(refs[0]["controller"], true);
        assert_eq!(refs[0]["blockOwnerDeletion"], true);
        assert_eq!(refs[0]["apiVersion"], "larch.dev/v1alpha1");
        assert!(
            c["apiVersion"].is_string() && c["kind"].is_string(),
            "SSA needs apiVersion/kind"
        );
        // The fixtures carry Argo CD tracking metadata and a team label: none may leak.
        let text = c.to_string();
        assert!(!text.contains("argocd.argoproj.io"), "{text}");
        assert!(!text.contains("\"team\":"), "{text}");
        assert!(!text.contains("larch.dev/run-requested"), "{text}");
    }
}

#[test]
fn credentials_come_only_from_secret_references() {
    let c = export_children("export-oneshot-s3");
    let pod = c.jobs[0].spec.clone().unwrap().template.spec.unwrap();
    let env = pod.containers[0].env.clone().unwrap();
    for var in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"] {
        let e = env.iter().find(|e| e.name == var).unwrap();
        assert!(e.value.is_none(), "{var} must not be inline");
        assert_eq!(
            e.value_from
                .as_ref()
                .unwrap()
                .secret_key_ref
                .as_ref()
                .unwrap()
                .name,
            "s3-credentials"
        );
    }
    assert!(
        env.iter().any(
            |e| e.name == "AWS_CA_BUNDLE" && e.value.as_deref() == Some("/etc/larch/ca/ca.crt")
        )
    );
    // With workload identity there are no key variables at all.
    let irsa = export_children("export-continuous-s3");
    let pod = irsa.deployments[0].spec.template.spec.clone().unwrap();
    assert!(
        pod.containers[0]
            .env
            .iter()
            .flatten()
            .all(|e| !e.name.starts_with("AWS_"))
    );
    assert_eq!(pod.service_account_name.as_deref(), Some("exporter"));
}

#[test]
fn postgres_ca_bundles_are_mounted_where_the_docs_say() {
    let mounted = |spec: &PodSpec, volume: &str| {
        let c = &spec.containers[0];
        let m = c
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == volume)
            .unwrap_or_else(|| panic!("mount {volume}"));
        assert_eq!(m.read_only, Some(true));
        let v = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == volume)
            .unwrap_or_else(|| panic!("volume {volume}"));
        let items = v
            .config_map
            .as_ref()
            .and_then(|c| c.items.clone())
            .or_else(|| v.secret.as_ref().and_then(|s| s.items.clone()))
            .unwrap();
        assert_eq!(items[0].path, "ca.crt");
        m.mount_path.clone()
    };
    let specs = all_pod_specs();
    let export = &specs
        .iter()
        .find(|(w, _)| w == "export-continuous-s3 deployment")
        .unwrap()
        .1;
    assert_eq!(mounted(export, "source-ca"), "/etc/larch/source-ca");
    let engine = &specs
        .iter()
        .find(|(w, _)| w == "source-s3-postgres statefulset")
        .unwrap()
        .1;
    assert_eq!(mounted(engine, "target-ca"), "/etc/larch/target-ca");
}
