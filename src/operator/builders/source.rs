//! ArchiveSource → ConfigMap (engine config), StatefulSet (the engines, state PVCs from
//! volumeClaimTemplates) and Service (HTTP API and metrics on port 8080 named `http`).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PodTemplateSpec, Service, ServicePort, ServiceSpec, Volume,
    VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use super::engine_config::{ResolvedArchive, TARGET_DSN_DIR, engine_config, engine_yaml};
use super::export::TERMINATION_LOG;
use super::pod::{self, HTTP_PORT, STATE_DIR};
use super::{
    ANNOTATION_CONFIG_HASH, BuildContext, LABEL_COMPONENT, LABEL_MANAGED_BY, LABEL_NAME,
    LABEL_SOURCE, MANAGED_BY, child_meta, labels, short_hash,
};
use crate::operator::crd::archive_source::ArchiveSource;

pub const CONTAINER: &str = "engine";
pub const CONFIG_FILE: &str = "/etc/larch/engine.yaml";
pub const CONFIG_KEY: &str = "engine.yaml";

/// Every child of an ArchiveSource.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceChildren {
    pub config_map: ConfigMap,
    pub stateful_set: StatefulSet,
    pub service: Service,
}

pub fn config_map_name(source: &ArchiveSource) -> String {
    format!("{}-engine", source.name_any())
}

pub fn selector_labels(source: &ArchiveSource) -> BTreeMap<String, String> {
    labels(&[
        (LABEL_NAME, "larch"),
        (LABEL_COMPONENT, "engine"),
        (LABEL_MANAGED_BY, MANAGED_BY),
        (LABEL_SOURCE, &source.name_any()),
    ])
}

pub fn children(
    source: &ArchiveSource,
    archive: &ResolvedArchive,
    ctx: &BuildContext,
) -> SourceChildren {
    let spec = &source.spec;
    let name = source.name_any();
    let sel = selector_labels(source);
    let yaml = engine_yaml(&engine_config(source, archive));
    let config_map = ConfigMap {
        metadata: child_meta(source, config_map_name(source), sel.clone()),
        data: Some(BTreeMap::from([(CONFIG_KEY.into(), yaml.clone())])),
        ..Default::default()
    };

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
        volumes.push(pod::secret_file_volume(
            "target",
            &pg.connection_secret_ref.name,
            &pg.connection_secret_ref.key,
            "dsn",
        ));
        mounts.push(pod::mount("target", TARGET_DSN_DIR, true));
        if let Some(ca) = &pg.ca_bundle {
            let (v, m) = pod::ca_bundle("target-ca", pod::TARGET_CA_DIR, ca);
            volumes.push(v);
            mounts.push(m);
        }
    }
    mounts.extend(access.mounts);
    volumes.extend(access.volumes);

    let container = Container {
        name: CONTAINER.into(),
        image: Some(ctx.image.clone()),
        command: Some(vec!["larch".into()]),
        args: Some(vec![
            "engine".into(),
            "--config".into(),
            CONFIG_FILE.into(),
            "--listen".into(),
            pod::listen_arg(),
            "--termination-log".into(),
            TERMINATION_LOG.into(),
        ]),
        env: {
            // POD_IP first: `--listen $(POD_IP):8080` refers to it.
            let mut env = vec![pod::pod_ip_env()];
            env.extend(access.env);
            Some(env)
        },
        ports: Some(vec![ContainerPort {
            name: Some("http".into()),
            container_port: HTTP_PORT,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        readiness_probe: Some(pod::http_probe("/health/ready", 10, 3)),
        liveness_probe: Some(pod::http_probe("/health/live", 20, 6)),
        volume_mounts: Some(mounts),
        resources: pod::resources(spec.resources.as_ref()),
        security_context: Some(pod::container_security()),
        // The engine writes why it stopped there; a crash leaves the log's end.
        termination_message_path: Some(TERMINATION_LOG.into()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    };
    let mut pod_spec = pod::base_pod_spec(container, volumes, spec.service_account_name.as_ref());
    let mut annotations =
        pod::apply_overrides(&mut pod_spec, spec.pod.as_ref()).unwrap_or_default();
    annotations.insert(
        ANNOTATION_CONFIG_HASH.into(),
        short_hash(yaml.as_bytes(), 16),
    );

    let claim_templates = spec.state.as_ref().map(|st| {
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
    let replicas = if spec.suspend == Some(true) {
        0
    } else {
        spec.replicas.unwrap_or(1)
    };
    let stateful_set = StatefulSet {
        metadata: child_meta(source, name.clone(), sel.clone()),
        spec: StatefulSetSpec {
            replicas: Some(replicas),
            service_name: Some(name.clone()),
            pod_management_policy: Some("Parallel".into()),
            selector: LabelSelector {
                match_labels: Some(sel.clone()),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(sel.clone()),
                    annotations: Some(annotations),
                    ..Default::default()
                }),
                spec: Some(pod_spec),
            },
            volume_claim_templates: claim_templates,
            ..Default::default()
        },
        ..Default::default()
    };
    let service = Service {
        metadata: child_meta(source, name, sel.clone()),
        spec: Some(ServiceSpec {
            selector: Some(sel),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: HTTP_PORT,
                target_port: Some(IntOrString::String("http".into())),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    SourceChildren {
        config_map,
        stateful_set,
        service,
    }
}
