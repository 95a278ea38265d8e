//! Pod pieces shared by export and engine pods: the restricted security context, store access
//! (S3 environment, CA bundle, archive volume), Secret-file mounts, placement overrides.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, EnvVar,
    EnvVarSource, HTTPGetAction, KeyToPath, ObjectFieldSelector, PersistentVolumeClaimVolumeSource,
    PodSecurityContext, PodSpec, Probe, ResourceRequirements, SeccompProfile, SecretKeySelector,
    SecretVolumeSource, SecurityContext, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use k8s_openapi::api::batch::v1::{
    PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement, PodFailurePolicyRule,
};

use crate::crd::common::{CaBundleRef, Location, SecretKeyRef};
use crate::crd::common_pod::{PodOverrides, Resources};
use larch_archive::store::spec::{StoreKind, StoreSpec};

/// UID/GID of generated pods by default (the image's non-root user).
pub const RUN_AS: i64 = 65532;

/// Who picks the UID of generated pods: a fixed non-root UID (also their GID and fsGroup), or
/// the platform (OpenShift's restricted SCC assigns one per namespace; the pods then carry only
/// `runAsNonRoot`). `--pod-run-as-user <UID|platform>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodUser {
    Fixed(i64),
    Platform,
}

impl Default for PodUser {
    fn default() -> Self {
        Self::Fixed(RUN_AS)
    }
}

impl std::str::FromStr for PodUser {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "platform" {
            return Ok(Self::Platform);
        }
        match s.parse::<i64>() {
            Ok(0) => Err("0 is root: Pod Security \"restricted\" forbids it (give a non-root UID, or `platform`)".into()),
            Ok(uid) if uid > 0 && uid <= i64::from(u32::MAX) => Ok(Self::Fixed(uid)),
            _ => Err(format!("{s:?} is neither a UID (1..=4294967295) nor `platform`")),
        }
    }
}

impl std::fmt::Display for PodUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Fixed(uid) => write!(f, "{uid}"),
            Self::Platform => f.write_str("platform"),
        }
    }
}
pub const ARCHIVE_DIR: &str = "/var/lib/larch/archive";
pub const STATE_DIR: &str = "/var/lib/larch/state";
pub const CA_DIR: &str = "/etc/larch/ca";
pub const CA_FILE: &str = "/etc/larch/ca/ca.crt";
pub const HTTP_PORT: i32 = 8080;
/// The engine's TLS listener (`spec.access.tls`), port name `https`.
pub const HTTPS_PORT: i32 = 8443;

/// Pod-level security context meeting Pod Security "restricted".
pub fn pod_security(user: PodUser) -> PodSecurityContext {
    let uid = match user {
        PodUser::Fixed(uid) => Some(uid),
        PodUser::Platform => None,
    };
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: uid,
        run_as_group: uid,
        fs_group: uid,
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Container security context meeting Pod Security "restricted", read-only root filesystem.
pub fn container_security() -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(true),
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Default::default()
        }),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A volume with one key of a Secret as file `file`.
pub fn secret_file_volume(volume: &str, secret: &str, key: &str, file: &str) -> Volume {
    Volume {
        name: volume.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.into()),
            items: Some(vec![KeyToPath {
                key: key.into(),
                path: file.into(),
                ..Default::default()
            }]),
            default_mode: Some(0o440),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A `kubernetes.io/tls` Secret's `tls.crt` and `tls.key` as files.
pub fn tls_secret_volume(volume: &str, secret: &str) -> Volume {
    let item = |key: &str| KeyToPath {
        key: key.into(),
        path: key.into(),
        ..Default::default()
    };
    Volume {
        name: volume.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.into()),
            items: Some(vec![item("tls.crt"), item("tls.key")]),
            default_mode: Some(0o440),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn mount(volume: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: volume.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

pub fn empty_dir(volume: &str) -> Volume {
    Volume {
        name: volume.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    }
}

/// An HTTP probe on the container port named `http`.
pub fn http_probe(path: &str, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("http".into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Default::default()
    }
}

/// A container serving HTTP on port 8080 `http`, probed on `/health/ready` and `/health/live`.
pub fn serving_http(c: Container) -> Container {
    Container {
        ports: Some(vec![http_port()]),
        readiness_probe: Some(http_probe("/health/ready", 10, 3)),
        liveness_probe: Some(http_probe("/health/live", 20, 6)),
        ..c
    }
}

/// Port 8080, named `http`.
pub fn http_port() -> ContainerPort {
    ContainerPort {
        name: Some("http".into()),
        container_port: HTTP_PORT,
        protocol: Some("TCP".into()),
        ..Default::default()
    }
}

/// `POD_IP` from the downward API, for `--listen`.
pub fn pod_ip_env() -> EnvVar {
    field_env("POD_IP", "status.podIP")
}

/// An environment variable from a pod field (downward API).
pub fn field_env(name: &str, field_path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: field_path.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The `--listen` address of a pod serving HTTP: its pod IP (from `POD_IP`), not `0.0.0.0`, so
/// that pods sharing one network namespace (the e2e fake kubelet runs pods as local processes)
/// never collide on the port. Probes and the operator's readers use the pod IP anyway.
pub fn listen_arg() -> String {
    format!("$(POD_IP):{HTTP_PORT}")
}

fn secret_env(name: &str, secret: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.into(),
                key: key.into(),
                optional: Some(false),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Store access for a location: environment (S3 credentials from the Secret, the CA bundle
/// path), volumes and mounts (CA bundle, archive claim). The claim of a volume location the
/// operator creates is named `created_claim`.
#[derive(Default, Debug)]
pub struct StoreAccess {
    pub env: Vec<EnvVar>,
    pub volumes: Vec<Volume>,
    pub mounts: Vec<VolumeMount>,
}

pub fn store_access(location: &Location, created_claim: &str, read_only: bool) -> StoreAccess {
    let mut access = StoreAccess::default();
    if let Some(s3) = &location.s3 {
        if let Some(creds) = &s3.credentials {
            let r = &creds.secret_ref;
            access.env.push(secret_env(
                "AWS_ACCESS_KEY_ID",
                &r.name,
                r.access_key_id_key(),
            ));
            access.env.push(secret_env(
                "AWS_SECRET_ACCESS_KEY",
                &r.name,
                r.secret_access_key_key(),
            ));
        }
        if let Some(ca) = &s3.ca_bundle {
            access.volumes.push(ca_volume("ca", ca));
            access.mounts.push(mount("ca", CA_DIR, true));
            access.env.push(EnvVar {
                name: "AWS_CA_BUNDLE".into(),
                value: Some(CA_FILE.into()),
                ..Default::default()
            });
        }
    }
    if let Some(vol) = &location.volume {
        let claim = vol
            .claim_name
            .clone()
            .unwrap_or_else(|| created_claim.into());
        access.volumes.push(Volume {
            name: "archive".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim,
                read_only: read_only.then_some(true),
            }),
            ..Default::default()
        });
        let mut m = mount("archive", ARCHIVE_DIR, read_only);
        m.sub_path = vol.sub_path.clone();
        access.mounts.push(m);
    }
    access
}

/// Where a PostgreSQL target's DSN is mounted (its Secret key as `dsn`).
pub const TARGET_DSN_DIR: &str = "/etc/larch/target";
pub const TARGET_DSN_FILE: &str = "/etc/larch/target/dsn";
/// Where a PostgreSQL source's and target's CA bundles are mounted (`ca.crt` inside).
pub const SOURCE_CA_DIR: &str = "/etc/larch/source-ca";
pub const TARGET_CA_DIR: &str = "/etc/larch/target-ca";

/// A PostgreSQL target's DSN (its Secret key as `/etc/larch/target/dsn`) and CA bundle
/// (`/etc/larch/target-ca/ca.crt`): volumes and read-only mounts.
pub fn target_dsn(
    secret: &SecretKeyRef,
    ca: Option<&CaBundleRef>,
) -> (Vec<Volume>, Vec<VolumeMount>) {
    let mut volumes = vec![secret_file_volume(
        "target",
        &secret.name,
        &secret.key,
        "dsn",
    )];
    let mut mounts = vec![mount("target", TARGET_DSN_DIR, true)];
    if let Some(ca) = ca {
        let (v, m) = ca_bundle("target-ca", TARGET_CA_DIR, ca);
        volumes.push(v);
        mounts.push(m);
    }
    (volumes, mounts)
}

/// A Job's pod failure policy: exit status 2 of `container` is a failure no retry fixes (a
/// missing table, a wrong password, a bad configuration: see larch_core::failure), so the Job fails
/// at once instead of retrying.
pub fn fail_fast(container: &str) -> PodFailurePolicy {
    PodFailurePolicy {
        rules: vec![PodFailurePolicyRule {
            action: "FailJob".into(),
            on_exit_codes: Some(PodFailurePolicyOnExitCodesRequirement {
                container_name: Some(container.into()),
                operator: "In".into(),
                values: vec![larch_core::failure::EXIT_PERMANENT],
            }),
            on_pod_conditions: None,
        }],
    }
}

/// The volume and read-only mount of a CA bundle as `<dir>/ca.crt`.
pub fn ca_bundle(volume: &str, dir: &str, ca: &CaBundleRef) -> (Volume, VolumeMount) {
    (ca_volume(volume, ca), mount(volume, dir, true))
}

fn ca_volume(name: &str, ca: &CaBundleRef) -> Volume {
    let items = |key: &str| {
        Some(vec![KeyToPath {
            key: key.into(),
            path: "ca.crt".into(),
            ..Default::default()
        }])
    };
    match (&ca.config_map, &ca.secret) {
        (Some(cm), _) => Volume {
            name: name.into(),
            config_map: Some(ConfigMapVolumeSource {
                name: cm.name.clone(),
                items: items(&cm.key),
                ..Default::default()
            }),
            ..Default::default()
        },
        (None, Some(s)) => Volume {
            name: name.into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(s.name.clone()),
                items: items(&s.key),
                default_mode: Some(0o444),
                ..Default::default()
            }),
            ..Default::default()
        },
        (None, None) => empty_dir(name),
    }
}

/// Where a pod's archive lives, for its request: the S3 bucket of a location, else the archive
/// volume's mount.
pub fn store_spec(location: &Location) -> StoreSpec {
    match &location.s3 {
        Some(s3) => StoreSpec {
            kind: StoreKind::S3,
            bucket: Some(s3.bucket.clone()),
            prefix: s3.prefix.clone(),
            endpoint: s3.endpoint.clone(),
            region: s3.region.clone(),
            // As `--endpoint` implies `--path-style`: S3-compatible stores need it.
            path_style: s3.path_style == Some(true) || s3.endpoint.is_some(),
            ..Default::default()
        },
        None => StoreSpec::local(ARCHIVE_DIR),
    }
}

pub fn resources(r: Option<&Resources>) -> Option<ResourceRequirements> {
    let r = r?;
    let q = |m: &Option<BTreeMap<String, String>>| {
        m.as_ref().map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), Quantity(v.clone())))
                .collect::<BTreeMap<_, _>>()
        })
    };
    Some(ResourceRequirements {
        requests: q(&r.requests),
        limits: q(&r.limits),
        ..Default::default()
    })
}

/// Applies placement overrides; returns the extra pod annotations.
pub fn apply_overrides(
    spec: &mut PodSpec,
    o: Option<&PodOverrides>,
) -> Option<BTreeMap<String, String>> {
    let o = o?;
    spec.node_selector = o.node_selector.clone();
    spec.tolerations = o.tolerations.as_ref().map(|ts| {
        ts.iter()
            .map(|t| Toleration {
                key: t.key.clone(),
                operator: t.operator.clone(),
                value: t.value.clone(),
                effect: t.effect.clone(),
                toleration_seconds: t.toleration_seconds,
            })
            .collect()
    });
    spec.affinity = o
        .affinity
        .as_ref()
        .and_then(|a| serde_json::from_value(a.clone()).ok());
    spec.priority_class_name = o.priority_class_name.clone();
    spec.topology_spread_constraints = o.topology_spread_constraints.as_ref().map(|cs| {
        cs.iter()
            .filter_map(|c| serde_json::from_value(c.clone()).ok())
            .collect()
    });
    o.annotations.clone()
}

/// A pod spec around one container, with the restricted defaults every generated pod gets.
pub fn base_pod_spec(
    container: Container,
    volumes: Vec<Volume>,
    service_account: Option<&String>,
    user: PodUser,
) -> PodSpec {
    PodSpec {
        containers: vec![container],
        volumes: Some(volumes),
        security_context: Some(pod_security(user)),
        service_account_name: service_account.cloned(),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        ..Default::default()
    }
}
