//! Builder tests: golden outputs of every child for a set of specs (regenerate with
//! `LARCH_UPDATE_GOLDEN=1 cargo test`), plus properties every child must have.

use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use larch_contract::export_request::ExportRequest;
use serde::Serialize;
use serde_json::Value;

use super::engine_config::{ResolvedArchive, resolve};
use super::export;
use super::export_children::{ExportChildren, children};
use super::source::{self, SourceChildren};
use super::*;
use crate::crd::archive_source::EngineAccess;
use crate::crd::{ArchiveExport, ArchiveRestore, ArchiveSource};

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
    serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

pub(crate) fn source_fixture(name: &str) -> ArchiveSource {
    let path = format!(
        "{}/src/builders/testdata/{name}.input.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn docs<T: Serialize>(items: &[T]) -> String {
    items
        .iter()
        .map(|i| format!("---\n{}", serde_yaml_ng::to_string(i).unwrap()))
        .collect()
}

fn export_docs(c: &ExportChildren) -> String {
    let mut out = String::new();
    if let Some(p) = &c.pvc {
        out += &docs(&[p]);
    }
    out += &(docs(&c.jobs) + &docs(&c.cron_jobs) + &docs(&c.deployments));
    if let Some(la) = &c.lease_access {
        out += &(docs(&la.leases)
            + &docs(&la.service_account.iter().collect::<Vec<_>>())
            + &docs(&[&la.role])
            + &docs(&[&la.role_binding]));
    }
    out
}

fn source_docs(c: &SourceChildren) -> String {
    docs(&[serde_json::to_value(&c.config_map).unwrap()])
        + &docs(&[&c.stateful_set])
        + &docs(&[&c.service])
        + &docs(&c.network_policy.iter().collect::<Vec<_>>())
        + &docs(&c.pod_disruption_budget.iter().collect::<Vec<_>>())
}

fn golden(name: &str, actual: &str) {
    crate::crd::tests::assert_golden(
        &format!("crates/operator/src/builders/testdata/{name}.golden.yaml"),
        actual,
    );
}

const EXPORTS: [&str; 4] = [
    "export-oneshot-s3",
    "export-scheduled-tables",
    "export-continuous-s3",
    "export-oneshot-set",
];

fn export_children(name: &str) -> ExportChildren {
    export_children_in(name, &ctx())
}

fn export_children_in(name: &str, ctx: &BuildContext) -> ExportChildren {
    let e = export_fixture(name);
    let run = export::run_id(&e, None);
    children(&e, Some(&run), ctx)
}

/// (fixture, referenced export fixture)
const SOURCES: [(&str, Option<&str>); 4] = [
    ("source-exportref-memory", Some("export-oneshot-s3")),
    ("source-s3-postgres", None),
    ("source-exportref-volume", Some("export-scheduled-tables")),
    ("source-access-networkpolicy", None),
];

fn resolved(name: &str, export: Option<&str>) -> (ArchiveSource, ResolvedArchive) {
    let s = source_fixture(name);
    let e = export.map(export_fixture);
    let r = resolve(&s, e.as_ref()).unwrap();
    (s, r)
}

fn source_children(name: &str, export: Option<&str>) -> SourceChildren {
    source_children_in(name, export, &ctx())
}

fn source_children_in(name: &str, export: Option<&str>, ctx: &BuildContext) -> SourceChildren {
    let (s, r) = resolved(name, export);
    source::children(&s, &r, ctx)
}

#[test]
fn export_children_match_golden() {
    for name in EXPORTS {
        golden(name, &export_docs(&export_children(name)));
    }
}

/// (fixture, referenced export fixture)
const RESTORES: [(&str, Option<&str>); 2] = [
    ("restore-exportref-tables", Some("export-scheduled-tables")),
    ("restore-s3-at-position", None),
];

pub(crate) fn restore_fixture(name: &str) -> ArchiveRestore {
    let path = format!(
        "{}/src/builders/testdata/{name}.input.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn restore_job(name: &str, export: Option<&str>) -> k8s_openapi::api::batch::v1::Job {
    restore_job_in(name, export, &ctx())
}

fn restore_job_in(
    name: &str,
    export: Option<&str>,
    ctx: &BuildContext,
) -> k8s_openapi::api::batch::v1::Job {
    let r = restore_fixture(name);
    let e = export.map(export_fixture);
    let archive = restore::resolve(&r, e.as_ref()).unwrap();
    restore::job(&r, &archive, &restore::run_id(&r, None), ctx)
}

#[test]
fn restore_jobs_match_golden() {
    for (name, export) in RESTORES {
        golden(name, &docs(&[restore_job(name, export)]));
    }
}

/// The run changes with the spec and with the run-requested token, not with metadata.
#[test]
fn a_restore_run_is_the_spec_and_the_token() {
    let r = restore_fixture("restore-s3-at-position");
    let first = restore::run_id(&r, None);
    let mut labelled = r.clone();
    labelled.metadata.labels = Some([("team".to_string(), "a".to_string())].into());
    assert_eq!(restore::run_id(&labelled, None), first);
    assert_ne!(restore::run_id(&r, Some("2026-12-01T10:00:00Z")), first);
    let mut replace = r.clone();
    replace.spec.if_exists = Some(crate::crd::archive_restore::IfExists::Replace);
    assert_ne!(restore::run_id(&replace, None), first);
}

/// A table the export does not write is refused, naming it.
#[test]
fn a_restore_of_a_table_the_export_lacks_is_refused() {
    let mut r = restore_fixture("restore-exportref-tables");
    r.spec.tables = Some(vec![crate::crd::common::TableRef {
        schema: None,
        name: "nope".into(),
    }]);
    let e = export_fixture("export-scheduled-tables");
    let err = restore::resolve(&r, Some(&e)).unwrap_err();
    assert!(err.contains("public.nope"), "{err}");
}

#[test]
fn source_children_match_golden() {
    for (name, export) in SOURCES {
        golden(name, &source_docs(&source_children(name, export)));
    }
}

/// Every pod meets Pod Security "restricted" (plus a read-only root filesystem).
fn assert_restricted(what: &str, spec: &PodSpec) {
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

fn all_pod_specs() -> Vec<(String, PodSpec)> {
    all_pod_specs_in(&ctx())
}

fn all_pod_specs_in(ctx: &BuildContext) -> Vec<(String, PodSpec)> {
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
        // Only a continuous exporter talks to the API (its Lease); no other pod gets a token.
        let continuous = what.contains("continuous");
        assert_eq!(
            spec.automount_service_account_token,
            Some(continuous),
            "{what}"
        );
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
    let cleanup = cleanup::cleanup_job(&export_fixture("export-continuous-s3"), &platform);
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

/// The export request a container's `larch export --request '<json>'` carries.
fn request_of(args: &[String]) -> ExportRequest {
    assert_eq!(args[..2], ["export", "--request"], "{args:?}");
    ExportRequest::from_json(&args[2]).unwrap()
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

fn all_children_json() -> Vec<Value> {
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

/// `spec.access`: the token Secret mounted as a file and named by flag, the TLS Secret's
/// certificate served on 8443 (container and Service port `https`), probes still on `http`.
#[test]
fn engine_access_mounts_the_token_and_the_certificate() {
    let c = source_children("source-access-networkpolicy", None);
    let pod = c.stateful_set.spec.template.spec.unwrap();
    let engine = &pod.containers[0];
    let args = engine.args.clone().unwrap();
    let after = |flag: &str| {
        let i = args
            .iter()
            .position(|a| a == flag)
            .unwrap_or_else(|| panic!("{flag}: {args:?}"));
        args[i + 1].clone()
    };
    assert_eq!(after("--token-file"), "/etc/larch/api-token/token");
    assert!(args.contains(&"--allow-control".to_string()));
    assert!(args.contains(&"--protect-reads".to_string()));
    assert_eq!(after("--tls-listen"), "$(POD_IP):8443");
    assert_eq!(after("--tls-cert"), "/etc/larch/api-tls/tls.crt");
    assert_eq!(after("--tls-key"), "/etc/larch/api-tls/tls.key");
    let volumes = pod.volumes.unwrap();
    let secret = |v: &str| {
        volumes
            .iter()
            .find(|x| x.name == v)
            .unwrap()
            .secret
            .clone()
            .unwrap()
    };
    assert_eq!(
        secret("api-token").secret_name.as_deref(),
        Some("users-api-token")
    );
    assert_eq!(
        secret("api-tls").secret_name.as_deref(),
        Some("users-api-tls")
    );
    // The token is a file, never an environment value or an argument.
    assert!(
        engine
            .env
            .iter()
            .flatten()
            .all(|e| !e.name.contains("TOKEN"))
    );
    let probe = engine
        .readiness_probe
        .as_ref()
        .unwrap()
        .http_get
        .clone()
        .unwrap();
    assert_eq!(probe.path.as_deref(), Some("/health/ready"));
    assert_eq!(probe.port, IntOrString::String("http".into()));
    let ports: Vec<_> = c
        .service
        .spec
        .unwrap()
        .ports
        .unwrap()
        .into_iter()
        .map(|p| (p.name.unwrap(), p.port))
        .collect();
    assert_eq!(
        ports,
        [("http".to_string(), 8080), ("https".to_string(), 8443)]
    );
    // Without spec.access: the generated token (the Secret the source owns) protects reads;
    // no control, plain HTTP only.
    let plain = source_children("source-exportref-memory", Some("export-oneshot-s3"));
    let pod = plain.stateful_set.spec.template.spec.unwrap();
    let args = pod.containers[0].args.clone().unwrap();
    let has = |f: &str| args.iter().any(|a| a == f);
    assert!(has("--token-file") && has("--protect-reads"), "{args:?}");
    assert!(
        !args
            .iter()
            .any(|a| a.starts_with("--tls") || a == "--allow-control"),
        "{args:?}"
    );
    let token = pod
        .volumes
        .unwrap()
        .into_iter()
        .find(|v| v.name == "api-token");
    assert_eq!(
        token.and_then(|v| v.secret).and_then(|s| s.secret_name),
        Some("users-cache-engine-token".to_string())
    );
    // generateToken: false (or an operator that generates none): no token, reads open.
    let (mut s, r) = resolved("source-exportref-memory", Some("export-oneshot-s3"));
    s.spec.access = Some(EngineAccess {
        generate_token: Some(false),
        ..Default::default()
    });
    let off = |s: &ArchiveSource, ctx: &BuildContext| {
        source::children(s, &r, ctx)
            .stateful_set
            .spec
            .template
            .spec
            .unwrap()
            .containers[0]
            .args
            .clone()
            .unwrap()
    };
    let quiet = |args: Vec<String>| {
        !args
            .iter()
            .any(|a| a.starts_with("--token") || a == "--protect-reads")
    };
    assert!(quiet(off(&s, &ctx())));
    s.spec.access = None;
    let no_generation = BuildContext {
        generate_engine_tokens: false,
        ..ctx()
    };
    assert!(quiet(off(&s, &no_generation)));
}

/// The NetworkPolicy selects exactly the engine pods, admits the operator's namespace to the
/// probe port only and the listed clients to every API port; it follows the operator default
/// unless the ArchiveSource says.
#[test]
fn network_policy_admits_the_operator_probe_and_the_listed_clients() {
    let c = source_children("source-access-networkpolicy", None);
    let np = c.network_policy.expect("spec.networkPolicy.enabled");
    let spec = np.spec.unwrap();
    let sts_labels = c.stateful_set.spec.selector.match_labels.clone();
    assert_eq!(spec.pod_selector.unwrap().match_labels, sts_labels);
    assert_eq!(spec.policy_types.unwrap(), ["Ingress"]);
    let ingress = spec.ingress.unwrap();
    assert_eq!(ingress.len(), 2);
    let ns = ingress[0].from.as_ref().unwrap()[0]
        .namespace_selector
        .clone()
        .unwrap();
    assert_eq!(
        ns.match_labels.unwrap()["kubernetes.io/metadata.name"],
        "larch-system"
    );
    let ports =
        |r: &k8s_openapi::api::networking::v1::NetworkPolicyIngressRule| -> Vec<IntOrString> {
            r.ports
                .iter()
                .flatten()
                .filter_map(|p| p.port.clone())
                .collect()
        };
    assert_eq!(ports(&ingress[0]), [IntOrString::Int(8080)]);
    assert_eq!(
        ports(&ingress[1]),
        [IntOrString::Int(8080), IntOrString::Int(8443)]
    );
    assert_eq!(ingress[1].from.as_ref().unwrap().len(), 2);

    // Off by default; the operator's --network-policies turns it on for sources that do not say.
    let (s, r) = resolved("source-exportref-memory", Some("export-oneshot-s3"));
    assert!(source::children(&s, &r, &ctx()).network_policy.is_none());
    let on = BuildContext {
        network_policies: true,
        ..ctx()
    };
    let np = source::children(&s, &r, &on)
        .network_policy
        .expect("operator default");
    assert_eq!(
        np.spec.unwrap().ingress.unwrap().len(),
        1,
        "no clients listed: the probe only"
    );
    let (mut off, r) = resolved("source-access-networkpolicy", None);
    off.spec.network_policy.as_mut().unwrap().enabled = Some(false);
    assert!(source::children(&off, &r, &on).network_policy.is_none());
}

/// Two or more running replicas get a PodDisruptionBudget of one; one replica or a suspended
/// source none.
#[test]
fn pod_disruption_budget_only_with_two_or_more_replicas() {
    let c = source_children("source-access-networkpolicy", None);
    let pdb = c.pod_disruption_budget.expect("3 replicas").spec.unwrap();
    assert_eq!(pdb.max_unavailable, Some(IntOrString::Int(1)));
    assert_eq!(
        pdb.selector.unwrap().match_labels,
        c.stateful_set.spec.selector.match_labels
    );
    let one = source_children("source-exportref-memory", Some("export-oneshot-s3"));
    assert!(one.pod_disruption_budget.is_none());
    let (mut s, r) = resolved("source-access-networkpolicy", None);
    s.spec.suspend = Some(true);
    assert!(
        source::children(&s, &r, &ctx())
            .pod_disruption_budget
            .is_none()
    );
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

/// The deletion's cleanup Job of every export fixture and the slot monitor of the suspended
/// continuous one: pinned, restricted, and the cleanup Job deliberately without an owner.
#[test]
fn cleanup_jobs_and_the_slot_monitor_match_golden() {
    use super::cleanup::{cleanup_job, slot_monitor};
    let mut out = String::new();
    let mut pods = vec![];
    for name in EXPORTS {
        let job = cleanup_job(&export_fixture(name), &ctx());
        let v = serde_json::to_value(&job).unwrap();
        assert!(
            v["metadata"]["ownerReferences"].is_null(),
            "{name}: no owner"
        );
        assert_eq!(job.spec.as_ref().unwrap().backoff_limit, Some(0));
        pods.push((
            format!("{name} cleanup"),
            job.spec.clone().unwrap().template.spec.unwrap(),
        ));
        out += &docs(&[job]);
    }
    let mut suspended = export_fixture("export-continuous-s3");
    assert!(
        slot_monitor(&suspended, &ctx()).is_none(),
        "running: no monitor"
    );
    suspended.spec.suspend = Some(true);
    let children = children(&suspended, None, &ctx());
    let monitor = children.slot_monitor.expect("suspended: a monitor");
    assert_eq!(
        children.deployments[0].spec.replicas,
        Some(0),
        "the writer is scaled to zero"
    );
    pods.push((
        "slot monitor".into(),
        monitor.spec.template.spec.clone().unwrap(),
    ));
    out += &docs(&[monitor]);
    golden("export-lifecycle", &out);
    for (what, spec) in &pods {
        assert_restricted(what, spec);
        assert_eq!(spec.automount_service_account_token, Some(false), "{what}");
    }
    // A temporary slot is not kept: nothing to monitor.
    let mut temporary = suspended.clone();
    temporary.spec.source.slot_mode = Some(crate::crd::archive_export::SlotMode::Temporary);
    assert!(slot_monitor(&temporary, &ctx()).is_none());
    assert_eq!(
        super::cleanup::cleanup_args(&export_fixture("export-oneshot-s3")).join(" "),
        "export cleanup --connection-file /etc/larch/source/dsn --slot larch_users --publication larch_users \
         --owner archiveexport/data/users --wait 60s --summary-file /dev/termination-log"
    );
}

/// The cleanup Job and the slot monitor open sessions on the source too: the export's
/// `sessionLimits` hold for them (the snapshot's age does not: they hold no snapshot).
#[test]
fn session_limits_reach_the_cleanup_and_the_slot_monitor() {
    use super::cleanup::{cleanup_args, slot_monitor};
    let flags = |args: &[String]| -> Vec<String> {
        args.windows(2)
            .filter(|w| w[0].ends_with("-timeout") || w[0] == "--snapshot-max-age")
            .map(|w| w.join("="))
            .collect()
    };
    let mut e = export_fixture("export-continuous-s3");
    e.spec.source.session_limits = None;
    assert!(flags(&cleanup_args(&e)).is_empty(), "unset: the defaults");
    e.spec.source.session_limits = Some(crate::crd::archive_export::SessionLimits {
        statement_timeout: Some("2m".into()),
        lock_timeout: Some("3s".into()),
        idle_in_transaction_timeout: None,
        snapshot_max_age: Some("2d".into()),
    });
    let expected = ["--statement-timeout=2m", "--lock-timeout=3s"];
    assert_eq!(flags(&cleanup_args(&e)), expected);
    e.spec.suspend = Some(true);
    let monitor = slot_monitor(&e, &ctx()).expect("suspended: a monitor");
    let pod = monitor.spec.template.spec.unwrap();
    let args = pod.containers[0].args.clone().unwrap();
    assert_eq!(flags(&args), expected);
}

#[test]
fn retention_applies_to_every_mode() {
    let mut e = export_fixture("export-oneshot-s3");
    e.spec.retention = Some(crate::crd::archive_export::Retention {
        keep_epochs: Some(2),
        max_age: Some("7d".into()),
    });
    let t = e.spec.source.all_tables()[0].clone();
    let r = export::export_request(&e, &t);
    assert_eq!((r.keep_epochs, r.max_age.as_deref()), (2, Some("7d")));
    // The deprecated continuous.keepEpochs still works, and retention wins over it.
    let mut c = export_fixture("export-continuous-s3");
    let t = c.spec.source.all_tables()[0].clone();
    assert_eq!(export::export_request(&c, &t).keep_epochs, 3);
    c.spec.retention = Some(crate::crd::archive_export::Retention {
        keep_epochs: Some(5),
        max_age: None,
    });
    assert_eq!(export::export_request(&c, &t).keep_epochs, 5);
}

#[test]
fn session_limits_reach_the_request() {
    let limits = crate::crd::archive_export::SessionLimits {
        statement_timeout: Some("2m".into()),
        lock_timeout: Some("3s".into()),
        idle_in_transaction_timeout: Some("45s".into()),
        snapshot_max_age: Some("2d".into()),
    };
    let request = |e: &ArchiveExport| match export::exports_as_one_set(e) {
        true => export::set_export_request(e),
        false => export::export_request(e, &e.spec.source.all_tables()[0]),
    };
    for fixture in [
        "export-oneshot-s3",
        "export-continuous-s3",
        "export-oneshot-set",
    ] {
        let mut e = export_fixture(fixture);
        // Unset: the request leaves them to `larch export`'s defaults.
        e.spec.source.session_limits = None;
        let r = request(&e);
        assert_eq!((r.statement_timeout, r.snapshot_max_age), (None, None));
        e.spec.source.session_limits = Some(limits.clone());
        let r = request(&e);
        assert_eq!(
            [
                r.statement_timeout.as_deref(),
                r.lock_timeout.as_deref(),
                r.idle_in_transaction_timeout.as_deref(),
                r.snapshot_max_age.as_deref(),
            ],
            [Some("2m"), Some("3s"), Some("45s"), Some("2d")],
            "{fixture}"
        );
    }
}

#[test]
fn export_requests_follow_the_cli_contract() {
    let e = export_fixture("export-oneshot-s3");
    let t = e.spec.source.all_tables()[0].clone();
    let r = export::export_request(&e, &t);
    assert_eq!(
        export::export_args(&r),
        ["export", "--request", r.to_json().as_str()],
        "one argument: the request"
    );
    assert_eq!(
        serde_json::to_value(&r).unwrap(),
        serde_json::json!({
            "connectionFile": "/etc/larch/source/dsn",
            "schema": "public",
            "tables": ["users"],
            "store": {"type": "s3", "bucket": "seeds", "prefix": "team-a",
                      "endpoint": "https://s3.internal:8333", "region": "eu-west-1", "path_style": true},
            "formats": ["jsonl"],
            "keyFields": ["id", "tenant"],
            "summaryFile": "/dev/termination-log",
            "slot": "larch_users",
            "owner": "archiveexport/data/users",
            "publication": "larch_users",
            "listen": "$(POD_IP):8080",
        })
    );
    let c = export_fixture("export-continuous-s3");
    let t = c.spec.source.all_tables()[0].clone();
    let r = export::export_request(&c, &t);
    assert!(r.follow);
    assert_eq!(r.keep_epochs, 3);
    assert_eq!(
        (
            r.diff_interval.as_deref(),
            r.min_interval.as_deref(),
            r.max_interval.as_deref()
        ),
        (Some("15s"), Some("5s"), Some("5m"))
    );
    assert_eq!(
        (r.max_diff_bytes, r.max_diff_fraction.as_deref()),
        (Some(67108864), Some("0.25"))
    );
    assert_eq!(
        (r.max_churn_records, r.max_churn_fraction.as_deref()),
        (Some(100000), Some("0.5"))
    );
    assert_eq!(
        (r.buffer_memory, r.spill_dir.as_deref(), r.spill_limit),
        (
            Some(67108864),
            Some(std::path::Path::new("/var/lib/larch/spill")),
            Some(7730941131)
        )
    );
    assert_eq!(
        (r.listen.as_deref(), r.lease.as_deref()),
        (Some("$(POD_IP):8080"), Some("events"))
    );
    // tables: one export per table, each under <keyPrefix><schema>.<table>/
    let s = export_fixture("export-scheduled-tables");
    let per_table: Vec<ExportRequest> = s
        .spec
        .source
        .all_tables()
        .iter()
        .map(|t| export::export_request(&s, t))
        .collect();
    assert_eq!(
        (per_table[0].schema.as_deref(), &per_table[0].tables[..]),
        (Some("public"), &["orders".to_string()][..])
    );
    assert_eq!(
        per_table[0].store,
        larch_archive::store::spec::StoreSpec::local("/var/lib/larch/archive")
    );
    assert_eq!(
        per_table[0].key_prefix.as_deref(),
        Some("nightly/public.orders/")
    );
    assert_eq!(
        (per_table[1].schema.as_deref(), &per_table[1].tables[..]),
        (Some("sales"), &["invoices".to_string()][..])
    );
    assert_eq!(
        per_table[1].key_prefix.as_deref(),
        Some("nightly/sales.invoices/")
    );
}

#[test]
fn spill_settings_derive_from_the_memory_limit_and_size_the_spill_volume() {
    use crate::crd::common_pod::Resources;
    let mut c = export_fixture("export-continuous-s3");
    let settings = export::spill_settings(&c);
    assert_eq!(
        (settings.buffer_memory, settings.size.as_str()),
        (64 << 20, "8Gi"),
        "no memory limit: 64Mi"
    );
    c.spec.resources = Some(Resources {
        requests: None,
        limits: Some([("memory".to_string(), "1Gi".to_string())].into()),
    });
    assert_eq!(export::spill_settings(&c).buffer_memory, 256 << 20);
    c.spec.resources.as_mut().unwrap().limits =
        Some([("memory".to_string(), "32Mi".into())].into());
    assert_eq!(
        export::spill_settings(&c).buffer_memory,
        16 << 20,
        "at least 16Mi"
    );
    let policy = c.spec.continuous.as_mut().unwrap();
    policy.buffer_memory = Some("100Mi".into());
    policy.spill_size = Some("20Gi".into());
    let settings = export::spill_settings(&c);
    assert_eq!(settings.buffer_memory, 100 << 20, "explicit wins");
    assert_eq!(settings.limit, (20u64 << 30) / 10 * 9);
    let t = c.spec.source.all_tables()[0].clone();
    let pod = export::pod_template(&c, &t, &ctx(), None).spec.unwrap();
    let spill = pod
        .volumes
        .unwrap()
        .into_iter()
        .find(|v| v.name == "spill")
        .unwrap();
    assert_eq!(
        spill.empty_dir.unwrap().size_limit.unwrap().0,
        "20Gi",
        "the emptyDir is sized for spilling"
    );
    let mounts = pod.containers[0].volume_mounts.clone().unwrap();
    assert!(mounts.iter().any(|m| m.name == "spill"
        && m.mount_path == export::SPILL_DIR
        && m.read_only != Some(true)));
    // OneShot exports never spill: no volume, no settings.
    let o = export_fixture("export-oneshot-s3");
    let t = o.spec.source.all_tables()[0].clone();
    let r = export::export_request(&o, &t);
    assert_eq!(
        (r.spill_dir, r.spill_limit, r.buffer_memory),
        (None, None, None)
    );
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
fn run_id_changes_with_spec_and_token_only() {
    let e = export_fixture("export-oneshot-s3");
    let base = export::run_id(&e, None);
    assert_eq!(base.len(), 8);
    let mut labelled = e.clone();
    labelled
        .metadata
        .labels
        .get_or_insert_default()
        .insert("x".into(), "y".into());
    assert_eq!(export::run_id(&labelled, None), base);
    assert_ne!(export::run_id(&e, Some("again")), base);
    let mut changed = e.clone();
    changed.spec.backoff_limit = Some(5);
    assert_ne!(export::run_id(&changed, None), base);
}

#[test]
fn modes_produce_the_right_kinds() {
    let one = export_children("export-oneshot-s3");
    assert_eq!(
        (one.jobs.len(), one.cron_jobs.len(), one.deployments.len()),
        (1, 0, 0)
    );
    assert!(one.pvc.is_none());
    let sched = export_children("export-scheduled-tables");
    assert_eq!(
        (
            sched.jobs.len(),
            sched.cron_jobs.len(),
            sched.deployments.len()
        ),
        (2, 2, 0)
    );
    assert!(sched.pvc.is_some());
    assert_eq!(
        sched.cron_jobs[0].spec.concurrency_policy.as_deref(),
        Some("Forbid")
    );
    assert_eq!(
        sched.cron_jobs[0].spec.time_zone.as_deref(),
        Some("Europe/Berlin")
    );
    let no_run = children(&export_fixture("export-scheduled-tables"), None, &ctx());
    assert!(no_run.jobs.is_empty(), "a schedule alone creates no Job");
    let cont = export_children("export-continuous-s3");
    assert_eq!(
        (
            cont.jobs.len(),
            cont.cron_jobs.len(),
            cont.deployments.len()
        ),
        (0, 0, 1)
    );
    let d = &cont.deployments[0].spec;
    assert_eq!(d.replicas, Some(1));
    assert_eq!(
        d.strategy.as_ref().unwrap().type_.as_deref(),
        Some("Recreate")
    );
}

#[test]
fn engine_config_from_export_ref() {
    let (s, r) = resolved("source-exportref-memory", Some("export-oneshot-s3"));
    // The key prefix reported by the export's last run wins over the default.
    assert_eq!(r.key_prefix, "team-a/public.users/");
    let yaml = engine_config::engine_yaml(&engine_config::engine_config(&s, &r));
    let v: Value = serde_yaml_ng::from_str(&yaml).unwrap();
    let src = &v["sources"]["users-cache"];
    assert_eq!(src["type"], "archive");
    assert_eq!(src["store"]["type"], "s3");
    assert_eq!(src["store"]["bucket"], "seeds");
    assert_eq!(src["store"]["path_style"], true);
    assert_eq!(src["format"], serde_json::json!(["jsonl"]));
    assert_eq!(src["key_fields"], serde_json::json!(["id", "tenant"]));
    assert_eq!(src["state_path"], "/var/lib/larch/state/users-cache.pos");
    assert_eq!(src["group"], false);
    assert_eq!(v["tables"][0]["schema"], "public");
    assert_eq!(v["tables"][0]["targets"][0]["type"], "memory");
    assert_eq!(
        v["tables"][0]["targets"][0]["index_fields"],
        serde_json::json!(["tenant"])
    );
    // A missing export is a clear error.
    assert!(resolve(&s, None).unwrap_err().contains("not found"));
}

#[test]
fn engine_config_group_and_postgres_target() {
    let (s, r) = resolved("source-s3-postgres", None);
    assert!(r.group);
    let v: Value = serde_yaml_ng::from_str(&engine_config::engine_yaml(
        &engine_config::engine_config(&s, &r),
    ))
    .unwrap();
    let src = &v["sources"]["warehouse"];
    assert_eq!(src["state_path"], "/var/lib/larch/state/warehouse");
    // A group has no key_prefix: its prefix moves into the store.
    assert!(src.get("key_prefix").is_none());
    assert_eq!(src["store"]["prefix"], "nightly/");
    assert_eq!(src["format"], serde_json::json!(["protobuf", "jsonl"]));
    assert_eq!(v["tables"].as_array().unwrap().len(), 2);
    let t = &v["tables"][1]["targets"][0];
    assert_eq!(t["type"], "postgres");
    assert_eq!(t["connection_file"], "/etc/larch/target/dsn");
    assert_eq!(t["schema"], "replica");
    // Volume archives of an export: the export's created claim, mounted read-only.
    let c = source_children("source-exportref-volume", Some("export-scheduled-tables"));
    let pod = c.stateful_set.spec.template.spec.unwrap();
    let vol = pod
        .volumes
        .unwrap()
        .into_iter()
        .find(|v| v.name == "archive")
        .unwrap();
    let pvc = vol.persistent_volume_claim.unwrap();
    assert_eq!(
        (pvc.claim_name.as_str(), pvc.read_only),
        ("nightly-archive", Some(true))
    );
    let cfg = c.config_map.data.unwrap()["engine.yaml"].clone();
    assert!(
        cfg.contains("path: /var/lib/larch/archive/nightly\n"),
        "{cfg}"
    );
}

#[test]
fn config_changes_roll_the_engine_pods() {
    let (mut s, r) = resolved("source-exportref-memory", Some("export-oneshot-s3"));
    let hash = |s: &ArchiveSource| {
        source::children(s, &r, &ctx())
            .stateful_set
            .spec
            .template
            .metadata
            .unwrap()
            .annotations
            .unwrap()[ANNOTATION_CONFIG_HASH]
            .clone()
    };
    let before = hash(&s);
    s.spec.poll_interval = Some("1m".into());
    assert_ne!(hash(&s), before);
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

/// Engines with two or more replicas spread over nodes unless the spec says how (or `[]`).
#[test]
fn engine_replicas_spread_over_nodes_unless_told_otherwise() {
    let spread = |name: &str, edit: &dyn Fn(&mut ArchiveSource)| {
        let mut s = source_fixture(name);
        edit(&mut s);
        let r = resolve(&s, None).unwrap();
        source::children(&s, &r, &ctx())
            .stateful_set
            .spec
            .template
            .spec
            .unwrap()
            .topology_spread_constraints
    };
    let name = "source-s3-postgres";
    let default = spread(name, &|_| {}).expect("replicas: 2 spreads by default");
    assert_eq!(default.len(), 1);
    let c = &default[0];
    assert_eq!(
        (
            c.max_skew,
            c.topology_key.as_str(),
            c.when_unsatisfiable.as_str()
        ),
        (1, "kubernetes.io/hostname", "ScheduleAnyway")
    );
    let sel = c
        .label_selector
        .as_ref()
        .unwrap()
        .match_labels
        .clone()
        .unwrap();
    assert_eq!(sel, source::selector_labels(&source_fixture(name)));

    assert_eq!(spread(name, &|s| s.spec.replicas = Some(1)), None);
    let zones = serde_json::json!({"maxSkew": 2, "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "x"}}});
    let own = spread(name, &|s| {
        s.spec
            .pod
            .get_or_insert_with(Default::default)
            .topology_spread_constraints = Some(vec![zones.clone()])
    })
    .unwrap();
    assert_eq!(
        serde_json::to_value(&own).unwrap(),
        serde_json::json!([zones])
    );
    let off = spread(name, &|s| {
        s.spec
            .pod
            .get_or_insert_with(Default::default)
            .topology_spread_constraints = Some(vec![])
    });
    assert_eq!(off, Some(vec![]));
}

#[test]
fn spec_transform_reaches_the_exporter_with_its_key_mounted_from_the_secret() {
    let mut e = export_fixture("export-oneshot-s3");
    e.spec.transform = serde_yaml_ng::from_str(
        "tables:\n  public.users:\n    undeclared: null\n    columns: {id: hash, email: {redact: x}}\nkeySecretRef: {name: seed-key, key: hmac}",
    )
    .unwrap();
    let t = e.spec.source.all_tables()[0].clone();
    let args = export::export_args(&export::export_request(&e, &t));
    // What the pod gets parses back into the same rules, as the exporter reads them.
    let r = request_of(&args);
    assert_eq!(
        r.transform,
        Some(e.spec.transform.as_ref().unwrap().rules())
    );
    assert!(
        !args[2].contains("seed-key"),
        "the Secret is not in the args"
    );
    assert_eq!(
        r.transform_key_file.as_deref(),
        Some(std::path::Path::new("/etc/larch/transform-key/key"))
    );
    let (mounts, volumes) = export::source_mounts(&e);
    let m = mounts.iter().find(|m| m.name == "transform-key").unwrap();
    assert_eq!(m.mount_path, "/etc/larch/transform-key");
    assert_eq!(m.read_only, Some(true));
    let v = volumes.iter().find(|v| v.name == "transform-key").unwrap();
    let secret = v.secret.as_ref().unwrap();
    assert_eq!(secret.secret_name.as_deref(), Some("seed-key"));
    assert_eq!(secret.items.as_ref().unwrap()[0].key, "hmac");
    // Without a transform, nothing of it.
    let plain = export_fixture("export-oneshot-s3");
    let r = export::export_request(&plain, &t);
    assert_eq!((r.transform, r.transform_key_file), (None, None));
}

#[test]
fn require_transformed_reaches_the_engine_config_the_engine_reads() {
    let (mut s, r) = resolved("source-s3-postgres", None);
    let yaml = |s: &ArchiveSource| engine_config::engine_yaml(&engine_config::engine_config(s, &r));
    assert!(!yaml(&s).contains("require_transformed"));
    s.spec.require_transformed = Some(true);
    let text = yaml(&s);
    let v: Value = serde_yaml_ng::from_str(&text).unwrap();
    assert_eq!(v["sources"]["warehouse"]["require_transformed"], true);
    // The type the engine parses takes it (its validation: tests/it/operator_contract.rs).
    let file: larch_contract::engine_file::EngineFile = serde_yaml_ng::from_str(&text).unwrap();
    assert!(file.sources.values().all(|s| s.require_transformed));
}

#[test]
fn a_oneshot_export_of_tables_with_parallel_is_one_job_at_one_position() {
    let e = export_fixture("export-oneshot-set");
    let run = export::run_id(&e, None);
    let c = children(&e, Some(&run), &ctx());
    assert_eq!(c.jobs.len(), 1, "one Job for the whole set");
    assert!(c.cron_jobs.is_empty() && c.deployments.is_empty());
    let job = &c.jobs[0];
    assert_eq!(
        job.metadata.name.as_deref(),
        Some(format!("ledger-{run}").as_str())
    );
    let r = export::set_export_request(&e);
    assert_eq!(
        (r.tables.join(" "), r.parallel),
        (
            "public.accounts public.transfers audit.ledger".to_string(),
            Some(3)
        )
    );
    // The prefix the exporter puts each table under, as per-table Jobs are given it.
    assert_eq!(r.key_prefix.as_deref(), Some("ledger/"));
    let slot = export::set_slot_name(&e);
    assert!(slot.starts_with("larch_data_ledger_"), "{slot}");
    assert_eq!(r.slot.as_deref(), Some(slot.as_str()));
    assert_eq!(r.schema, None);
    // Without parallel: one Job per table, as before.
    let mut per_table = e.clone();
    per_table.spec.parallel = None;
    let c = children(&per_table, Some(&run), &ctx());
    assert_eq!(c.jobs.len(), 3);
    // Scheduled: one CronJob `<name>` for the set.
    let mut scheduled = e;
    scheduled.spec.schedule = export_fixture("export-scheduled-tables").spec.schedule;
    let c = children(&scheduled, None, &ctx());
    assert_eq!(c.cron_jobs.len(), 1);
    assert_eq!(c.cron_jobs[0].metadata.name.as_deref(), Some("ledger"));
    assert!(c.jobs.is_empty());
}

/// Issue 35, finding 4: names that mapped alike (`team-a`/`b-users`, `team-a-b`/`users`) get
/// distinct slots; every name is a valid identifier of at most 63 bytes and never changes.
#[test]
fn derived_slot_names_are_distinct_across_namespaces_short_and_stable() {
    use super::export::export_slot_name;
    let valid = |s: &str| {
        s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    };
    let a = export_slot_name("team-a", "b-users", None);
    let b = export_slot_name("team-a-b", "users", None);
    assert_ne!(a, b);
    assert!(a.starts_with("larch_team_a_b_users_") && valid(&a), "{a}");
    assert!(b.starts_with("larch_team_a_b_users_") && valid(&b), "{b}");
    // Pinned: a changed derivation would orphan every existing slot.
    assert_eq!(a, "larch_team_a_b_users_0950b5f63001");
    assert_eq!(a, export_slot_name("team-a", "b-users", None));
    // Per table of a several-table export, and names that differ only past the cut.
    let t1 = export_slot_name("ns", "x", Some("public.a"));
    let t2 = export_slot_name("ns", "x", Some("public.b"));
    assert!(t1 != t2 && t1 != export_slot_name("ns", "x", None));
    let long = |last: char| {
        export_slot_name(
            &"n".repeat(63),
            &format!("{}{last}", "x".repeat(252)),
            Some("s.t"),
        )
    };
    assert!(long('a') != long('b') && valid(&long('a')), "{}", long('a'));
}

/// An upgraded operator keeps the slot an older one derived while the status records a writer
/// on it; anything else in status does not move the name.
#[test]
fn a_slot_recorded_in_status_under_the_old_name_is_kept() {
    use super::slot_names::slot_and_publication;
    use crate::crd::archive_export::{ArchiveExportStatus, WriterStatus};
    let mut e = export_fixture("export-continuous-s3");
    let table = e.spec.source.all_tables()[0].clone();
    let new = export::derived_slot_name(&e, &table);
    assert_eq!(slot_and_publication(&e, &table), (new.clone(), new.clone()));
    let writer = |slot: &str| WriterStatus {
        table: table.qualified(),
        slot: Some(slot.into()),
        ..Default::default()
    };
    e.status = Some(ArchiveExportStatus {
        writers: vec![writer("larch_data_events")],
        ..Default::default()
    });
    assert_eq!(export::legacy_slot_name(&e, &table), "larch_data_events");
    assert_eq!(
        slot_and_publication(&e, &table),
        ("larch_data_events".into(), "larch_data_events".into())
    );
    e.status.as_mut().unwrap().writers = vec![writer("someone_elses_slot")];
    assert_eq!(slot_and_publication(&e, &table).0, new);
}
