//! ArchiveSource → ConfigMap (engine config), StatefulSet (the engines, state PVCs from
//! volumeClaimTemplates) and Service (HTTP API and metrics on port 8080 named `http`).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PodSpec, PodTemplateSpec, Service, ServicePort, ServiceSpec,
    TopologySpreadConstraint, Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use crate::builders::engine_config::{ResolvedArchive, engine_config, engine_yaml};
use crate::builders::pod::{self, HTTP_PORT, HTTPS_PORT, STATE_DIR};
use crate::builders::{ANNOTATION_CONFIG_HASH, BuildContext, child_meta, labels, short_hash};
use crate::crd::archive_source::ArchiveSource;
use crate::export::build::TERMINATION_LOG;
use crate::source::engine_token;

pub const CONTAINER: &str = "engine";
pub const CONFIG_FILE: &str = "/etc/larch/engine.yaml";
pub const CONFIG_KEY: &str = "engine.yaml";
/// Where the API token (`spec.access.tokenSecretRef`, or the generated one) is mounted.
pub const TOKEN_DIR: &str = "/etc/larch/api-token";
pub const TOKEN_FILE: &str = "/etc/larch/api-token/token";
/// Where the `spec.access.tls` Secret is mounted.
pub const API_TLS_DIR: &str = "/etc/larch/api-tls";

/// Every child of an ArchiveSource.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceChildren {
    pub config_map: ConfigMap,
    pub stateful_set: StatefulSet,
    pub service: Service,
    /// With `spec.networkPolicy` (or the operator's default).
    pub network_policy: Option<NetworkPolicy>,
    /// With two or more replicas: at most one engine down at a time by eviction.
    pub pod_disruption_budget: Option<PodDisruptionBudget>,
}

pub fn config_map_name(source: &ArchiveSource) -> String {
    format!("{}-engine", source.name_any())
}

pub use crate::source::labels::selector_labels;

pub fn children(
    source: &ArchiveSource,
    archive: &ResolvedArchive,
    ctx: &BuildContext,
) -> SourceChildren {
    let yaml = engine_yaml(&engine_config(source, archive));
    let config_map = ConfigMap {
        metadata: child_meta(source, config_map_name(source), selector_labels(source)),
        data: Some(BTreeMap::from([(CONFIG_KEY.into(), yaml.clone())])),
        ..Default::default()
    };
    let parts = with_api_access(engine_parts(source, archive), source, ctx);
    let ports = parts.ports.clone();
    let replicas = if source.spec.suspend == Some(true) {
        0
    } else {
        source.spec.replicas.unwrap_or(1)
    };
    SourceChildren {
        config_map,
        stateful_set: stateful_set(source, engine_pod(source, parts, ctx), &yaml, replicas),
        service: service(source, &ports),
        network_policy: network_policy(source, &ports, ctx),
        pod_disruption_budget: pod_disruption_budget(source, replicas),
    }
}

/// What the engine container is made of, gathered before it is built.
struct EngineParts {
    args: Vec<String>,
    volumes: Vec<Volume>,
    mounts: Vec<VolumeMount>,
    ports: Vec<ContainerPort>,
    env: Vec<EnvVar>,
}

/// The engine's config, state, scratch, target and archive store: its volumes, mounts and
/// environment, its base arguments and its HTTP port.
fn engine_parts(source: &ArchiveSource, archive: &ResolvedArchive) -> EngineParts {
    let spec = &source.spec;
    let claim = archive.claim_name.clone().unwrap_or_default();
    let access = pod::store_access(&archive.location, &claim, true);
    let mut mounts = vec![
        {
            let mut m = pod::mount("config", CONFIG_FILE, true);
            m.sub_path = Some(CONFIG_KEY.into());
            m
        },
        pod::mount("state", STATE_DIR, false),
        pod::mount("tmp", "/tmp", false),
    ];
    let mut volumes = vec![
        Volume {
            name: "config".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: config_map_name(source),
                ..Default::default()
            }),
            ..Default::default()
        },
        pod::empty_dir("tmp"),
    ];
    if spec.state.is_none() {
        volumes.push(pod::empty_dir("state"));
    }
    if let Some(pg) = &spec.target.postgres {
        let (v, m) = pod::target_dsn(&pg.connection_secret_ref, pg.ca_bundle.as_ref());
        volumes.extend(v);
        mounts.extend(m);
    }
    mounts.extend(access.mounts);
    volumes.extend(access.volumes);
    let args = vec![
        "engine".into(),
        "--config".into(),
        CONFIG_FILE.into(),
        "--listen".into(),
        pod::listen_arg(),
        "--termination-log".into(),
        TERMINATION_LOG.into(),
    ];
    let ports = vec![ContainerPort {
        name: Some("http".into()),
        container_port: HTTP_PORT,
        protocol: Some("TCP".into()),
        ..Default::default()
    }];
    // POD_IP first: `--listen $(POD_IP):8080` refers to it.
    let mut env = vec![pod::pod_ip_env()];
    env.extend(access.env);
    EngineParts {
        args,
        volumes,
        mounts,
        ports,
        env,
    }
}

/// `parts` with the engine API's token, control, read protection and TLS (`spec.access`).
fn with_api_access(
    mut parts: EngineParts,
    source: &ArchiveSource,
    ctx: &BuildContext,
) -> EngineParts {
    let EngineParts {
        args,
        volumes,
        mounts,
        ports,
        ..
    } = &mut parts;
    let api = source.spec.access.clone().unwrap_or_default();
    let generated = engine_token::generates_token(source, ctx);
    if let Some(token) = &engine_token::token_ref(source, ctx) {
        volumes.push(pod::secret_file_volume(
            "api-token",
            &token.name,
            &token.key,
            "token",
        ));
        mounts.push(pod::mount("api-token", TOKEN_DIR, true));
        args.extend(["--token-file".into(), TOKEN_FILE.into()]);
    }
    if api.control == Some(true) {
        args.push("--allow-control".into());
    }
    if api.protect_reads.unwrap_or(generated) {
        args.push("--protect-reads".into());
    }
    // `/status` and `/metrics` behind the token only with the user's own token: a generated
    // one is in a Secret neither the operator (its /status read) nor Prometheus can read.
    if protects_status(&api) {
        args.push("--protect-status".into());
    }
    if let Some(tls) = &api.tls {
        volumes.push(pod::tls_secret_volume("api-tls", &tls.secret_name));
        mounts.push(pod::mount("api-tls", API_TLS_DIR, true));
        args.extend([
            "--tls-listen".into(),
            format!("$(POD_IP):{HTTPS_PORT}"),
            "--tls-cert".into(),
            format!("{API_TLS_DIR}/tls.crt"),
            "--tls-key".into(),
            format!("{API_TLS_DIR}/tls.key"),
        ]);
        ports.push(ContainerPort {
            name: Some("https".into()),
            container_port: HTTPS_PORT,
            protocol: Some("TCP".into()),
            ..Default::default()
        });
    }
    parts
}

/// The engine's pod spec: its one container from `parts`, with the pod overrides and spreading.
fn engine_pod(
    source: &ArchiveSource,
    parts: EngineParts,
    ctx: &BuildContext,
) -> (PodSpec, BTreeMap<String, String>) {
    let spec = &source.spec;
    let container = Container {
        name: CONTAINER.into(),
        image: Some(ctx.image.clone()),
        command: Some(vec!["larch".into()]),
        args: Some(parts.args),
        env: Some(parts.env),
        ports: Some(parts.ports),
        readiness_probe: Some(pod::http_probe("/health/ready", 10, 3)),
        liveness_probe: Some(pod::http_probe("/health/live", 20, 6)),
        volume_mounts: Some(parts.mounts),
        resources: pod::resources(spec.resources.as_ref()),
        security_context: Some(pod::container_security()),
        // The engine writes why it stopped there; a crash leaves the log's end.
        termination_message_path: Some(TERMINATION_LOG.into()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    };
    let mut pod_spec = pod::base_pod_spec(
        container,
        parts.volumes,
        spec.service_account_name.as_ref(),
        ctx.pod_user,
    );
    let annotations = pod::apply_overrides(&mut pod_spec, spec.pod.as_ref()).unwrap_or_default();
    if spec.replicas.unwrap_or(1) >= 2 && pod_spec.topology_spread_constraints.is_none() {
        pod_spec.topology_spread_constraints =
            Some(vec![spread_over_nodes(&selector_labels(source))]);
    }
    (pod_spec, annotations)
}

/// The engines' StatefulSet: `replicas` pods from `pod` (its annotations plus the config hash,
/// so a config change rolls them), state volumes from `spec.state`.
fn stateful_set(
    source: &ArchiveSource,
    pod: (PodSpec, BTreeMap<String, String>),
    yaml: &str,
    replicas: i32,
) -> StatefulSet {
    let (pod_spec, mut annotations) = pod;
    let name = source.name_any();
    let sel = selector_labels(source);
    annotations.insert(
        ANNOTATION_CONFIG_HASH.into(),
        short_hash(yaml.as_bytes(), 16),
    );
    let claim_templates = source.spec.state.as_ref().map(|st| {
        vec![PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("state".into()),
                labels: Some(sel.clone()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(vec!["ReadWriteOnce".into()]),
                storage_class_name: st.storage_class_name.clone(),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([(
                        "storage".into(),
                        Quantity(st.size.clone()),
                    )])),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }]
    });
    StatefulSet {
        metadata: child_meta(source, name.clone(), sel.clone()),
        spec: StatefulSetSpec {
            replicas: Some(replicas),
            service_name: Some(name),
            pod_management_policy: Some("Parallel".into()),
            selector: LabelSelector {
                match_labels: Some(sel.clone()),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(sel),
                    annotations: Some(annotations),
                    ..Default::default()
                }),
                spec: Some(pod_spec),
            },
            volume_claim_templates: claim_templates,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The engines' Service: every port of the engine container, by name.
fn service(source: &ArchiveSource, ports: &[ContainerPort]) -> Service {
    let sel = selector_labels(source);
    Service {
        metadata: child_meta(source, source.name_any(), sel.clone()),
        spec: Some(ServiceSpec {
            selector: Some(sel),
            ports: Some(
                ports
                    .iter()
                    .map(|p| ServicePort {
                        name: p.name.clone(),
                        port: p.container_port,
                        target_port: p.name.clone().map(IntOrString::String),
                        protocol: Some("TCP".into()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The engines' NetworkPolicy, when asked for (`spec.networkPolicy.enabled`, else the
/// operator's default): ingress from the operator's namespace to port 8080 (its probes read
/// `/status`) and from `spec.networkPolicy.from` to every API port. Ingress only: egress to
/// the archive store and a target database depends on where they are, and is the namespace's.
pub fn network_policy(
    source: &ArchiveSource,
    ports: &[ContainerPort],
    ctx: &BuildContext,
) -> Option<NetworkPolicy> {
    let np = source.spec.network_policy.clone().unwrap_or_default();
    if !np.enabled.unwrap_or(ctx.network_policies) {
        return None;
    }
    let port = |p: &ContainerPort| NetworkPolicyPort {
        port: Some(IntOrString::Int(p.container_port)),
        protocol: Some("TCP".into()),
        ..Default::default()
    };
    let probe = NetworkPolicyIngressRule {
        from: Some(vec![NetworkPolicyPeer {
            namespace_selector: Some(LabelSelector {
                match_labels: Some(labels(&[(
                    "kubernetes.io/metadata.name",
                    &ctx.operator_namespace,
                )])),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        ports: Some(
            ports
                .iter()
                .filter(|p| p.container_port == HTTP_PORT)
                .map(port)
                .collect(),
        ),
    };
    let mut ingress = vec![probe];
    // validate::source refused a spec whose peers do not parse.
    let clients = np.peers().unwrap_or_default();
    if !clients.is_empty() {
        ingress.push(NetworkPolicyIngressRule {
            from: Some(clients),
            ports: Some(ports.iter().map(port).collect()),
        });
    }
    Some(NetworkPolicy {
        metadata: child_meta(source, source.name_any(), selector_labels(source)),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(selector_labels(source)),
                ..Default::default()
            }),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(ingress),
            ..Default::default()
        }),
    })
}

/// Replicas of one engine on different nodes where the scheduler can (a node failure takes one).
fn spread_over_nodes(sel: &BTreeMap<String, String>) -> TopologySpreadConstraint {
    TopologySpreadConstraint {
        max_skew: 1,
        topology_key: "kubernetes.io/hostname".into(),
        when_unsatisfiable: "ScheduleAnyway".into(),
        label_selector: Some(LabelSelector {
            match_labels: Some(sel.clone()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// With two or more (running) replicas, evictions (node drains) take one engine at a time so
/// the Service keeps serving.
pub fn pod_disruption_budget(source: &ArchiveSource, replicas: i32) -> Option<PodDisruptionBudget> {
    (replicas >= 2).then(|| PodDisruptionBudget {
        metadata: child_meta(source, source.name_any(), selector_labels(source)),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels(source)),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// Whether the engines' `/status` and `/metrics` need the token: with `tokenSecretRef` and
/// `protectReads: true` (the operator then reads that Secret for its `/status` read).
pub fn protects_status(access: &crate::crd::archive_source::EngineAccess) -> bool {
    access.protect_reads == Some(true) && access.token_secret_ref.is_some()
}
