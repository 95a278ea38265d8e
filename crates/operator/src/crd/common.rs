//! Types shared by both CRDs: Secret references, archive locations (S3 or a volume), table
//! references, conditions. Every string and list carries a bound so the apiserver's CEL cost
//! estimator accepts the rules (checked by a test over the generated schemas).

use std::collections::BTreeMap;

use kube::KubeSchema;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

/// A key in a Secret of the same namespace (a DSN, an access key...).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key inside the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// A key in a ConfigMap or a Secret of the same namespace holding a PEM CA bundle.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.configMap) != has(self.secret)").message("set exactly one of configMap or secret"))]
pub struct CaBundleRef {
    /// A ConfigMap key holding the bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<KeyRef>,
    /// A Secret key holding the bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<KeyRef>,
}

/// A `{name, key}` pair (ConfigMap or Secret).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeyRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// S3 credentials from a Secret. Without them the pod's own identity (its service account, e.g.
/// IRSA / Pod Identity / Workload Identity) is used.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct S3Credentials {
    /// Secret holding the access key pair.
    pub secret_ref: S3SecretRef,
}

/// A Secret with an S3 access key pair.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct S3SecretRef {
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key holding the access key id (default `AWS_ACCESS_KEY_ID`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub access_key_id_key: Option<String>,
    /// Key holding the secret access key (default `AWS_SECRET_ACCESS_KEY`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub secret_access_key_key: Option<String>,
}

impl S3SecretRef {
    pub fn access_key_id_key(&self) -> &str {
        self.access_key_id_key
            .as_deref()
            .unwrap_or("AWS_ACCESS_KEY_ID")
    }
    pub fn secret_access_key_key(&self) -> &str {
        self.secret_access_key_key
            .as_deref()
            .unwrap_or("AWS_SECRET_ACCESS_KEY")
    }
}

/// An S3 (or S3-compatible) bucket.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.bucket == oldSelf.bucket").message("bucket is immutable: create a new object to move an archive"))]
pub struct S3Location {
    /// Bucket name.
    #[schemars(length(min = 3, max = 63), pattern(r"^[a-z0-9][a-z0-9.\-]*[a-z0-9]$"))]
    pub bucket: String,
    /// Object key prefix of the store inside the bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub prefix: Option<String>,
    /// Region (e.g. `us-east-1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub region: Option<String>,
    /// Endpoint URL of an S3-compatible store (`https://minio.minio:9000`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    #[x_kube(validation = Rule::new("self.startsWith('http://') || self.startsWith('https://')").message("endpoint must be an http:// or https:// URL"))]
    pub endpoint: Option<String>,
    /// Path-style addressing (`endpoint/bucket/key`), needed by most S3-compatible stores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_style: Option<bool>,
    /// Access keys from a Secret; omit to use the pod's service account identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<S3Credentials>,
    /// CA bundle to trust for the endpoint (private CAs, self-signed test stores).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<CaBundleRef>,
}

/// Access mode of a volume the operator creates.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum VolumeAccessMode {
    ReadWriteOnce,
    ReadWriteMany,
}

/// A volume holding a local-store archive: an existing claim, or one the operator creates.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.claimName) != has(self.size)").message("set exactly one of claimName (an existing claim) or size (a claim the operator creates)"),
    validation = Rule::new("!has(self.storageClassName) && !has(self.accessMode) || has(self.size)").message("storageClassName and accessMode apply only with size"),
    validation = Rule::new("has(self.claimName) == has(oldSelf.claimName) && (!has(self.claimName) || self.claimName == oldSelf.claimName)").message("claimName is immutable"),
)]
pub struct VolumeLocation {
    /// An existing PersistentVolumeClaim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub claim_name: Option<String>,
    /// Size of a claim the operator creates (e.g. `10Gi`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 32),
        pattern(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
    )]
    pub size: Option<String>,
    /// Storage class of a claim the operator creates (cluster default when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub storage_class_name: Option<String>,
    /// Access mode of a claim the operator creates (default ReadWriteOnce; ReadWriteMany lets an
    /// ArchiveSource on other nodes read it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_mode: Option<VolumeAccessMode>,
    /// Directory inside the volume (default: its root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        pattern(r"^[A-Za-z0-9._\-]+(/[A-Za-z0-9._\-]+)*$")
    )]
    pub sub_path: Option<String>,
}

/// Where an archive lives: exactly one of `s3` or `volume`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.s3) != has(self.volume)").message("set exactly one of s3 or volume"),
    validation = Rule::new("has(self.s3) == has(oldSelf.s3)").message("the kind of location (s3 or volume) is immutable"),
)]
pub struct Location {
    /// An S3 bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Location>,
    /// A PersistentVolumeClaim (local store).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<VolumeLocation>,
}

pub use larch_archive::format::Format;

/// A PostgreSQL table. Any name PostgreSQL allows (larch quotes it) except `/` and `..`: the
/// archive's key prefix is `<schema>.<table>/`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TableRef {
    /// Schema (default `public`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new("!self.contains('/') && !self.contains('..')").message("schema must not contain '/' or '..' (it names the archive's key prefix)"))]
    pub schema: Option<String>,
    /// Table name.
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new("!self.contains('/') && !self.contains('..')").message("table name must not contain '/' or '..' (it names the archive's key prefix)"))]
    pub name: String,
}

impl TableRef {
    pub fn schema(&self) -> &str {
        self.schema.as_deref().unwrap_or("public")
    }
    /// `schema.table`
    pub fn qualified(&self) -> String {
        format!("{}.{}", self.schema(), self.name)
    }
}

/// A condition's status, spelled as Kubernetes spells it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ConditionStatus {
    True,
    False,
    #[default]
    Unknown,
}

impl ConditionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
            ConditionStatus::Unknown => "Unknown",
        }
    }
}

/// A status condition (the shape of `metav1.Condition`, with bounds).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Condition type (`Ready`, `Reconciling`, `Stalled`...).
    #[serde(rename = "type")]
    #[schemars(length(min = 1, max = 316))]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    // A string in the schema, as in metav1.Condition (served CRDs stay as they were).
    #[schemars(with = "String", length(min = 1, max = 16))]
    pub status: ConditionStatus,
    /// Machine-readable reason (PascalCase).
    #[schemars(length(min = 1, max = 1024))]
    pub reason: String,
    /// Human-readable message.
    #[serde(default)]
    #[schemars(length(max = 32768))]
    pub message: String,
    /// When the status last changed (RFC 3339).
    #[schemars(length(max = 64))]
    pub last_transition_time: String,
    /// The `metadata.generation` this condition was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Schema of a condition list: a map keyed by `type`, so server-side apply merges per type.
pub fn conditions_schema(generator: &mut SchemaGenerator) -> Schema {
    let item = generator.subschema_for::<Condition>();
    json_schema!({
        "type": "array",
        "maxItems": 16,
        "items": item,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
    })
}

/// Schema of a small `string → string` map (node selectors, annotations, resources).
pub fn string_map_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "maxProperties": 64,
        "additionalProperties": {"type": "string", "maxLength": 4096},
    })
}

/// Schema of an opaque object passed through to Kubernetes as-is (affinity).
pub fn raw_object_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// A bounded list of objects passed through unchecked (the API server validates them in the
/// pod template).
pub fn raw_object_list_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "maxItems": 8,
        "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
    })
}

/// `BTreeMap<String, String>` alias used with [`string_map_schema`].
pub type StringMap = BTreeMap<String, String>;
