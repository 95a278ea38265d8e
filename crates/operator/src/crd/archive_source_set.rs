//! `ArchiveSourceSet` (cluster-scoped): one ArchiveSource, from a template, in every namespace a
//! `namespaceSelector` matches ("seed every dev namespace"). Credentials are shared only on an
//! explicit opt-in: the named Secret is copied into each selected namespace. With a
//! `restoreTemplate` instead, each selected namespace gets an ArchiveRestore that seeds its own
//! PostgreSQL database, refreshed as `refresh` says (docs/dev-seeds-postgres.md).

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::archive_restore::ArchiveRestoreSpec;
use super::archive_source::ArchiveSourceSpec;
use super::common::{Condition, StringMap, conditions_schema, string_map_schema};

/// Desired state of an ArchiveSourceSet.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "larch.dev",
    version = "v1alpha1",
    kind = "ArchiveSourceSet",
    status = "ArchiveSourceSetStatus",
    shortname = "asrcset",
    category = "archives",
    doc = "Keeps one ArchiveSource (template) or ArchiveRestore (restoreTemplate) in every namespace a selector matches.",
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Desired", type_ = "integer", json_path = ".status.desiredNamespaces"),
    printcolumn(name = "Ready Namespaces", type_ = "integer", json_path = ".status.readyNamespaces"),
    printcolumn(name = "Failing", type_ = "string", json_path = ".status.failingNamespaces[*].namespace"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("size(self.metadata.name) <= 40").message("name must be at most 40 characters (the ArchiveSource in each namespace carries it)"),
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.template) != has(self.restoreTemplate)").message("set exactly one of template (an ArchiveSource per namespace) or restoreTemplate (an ArchiveRestore per namespace)"),
    validation = Rule::new("!has(self.credentials) || (has(self.template) && has(self.template.spec.archive.s3)) || (has(self.restoreTemplate) && has(self.restoreTemplate.spec.archive.s3))").message("credentials apply to an s3 archive (template.spec.archive.s3 or restoreTemplate.spec.archive.s3)"),
    validation = Rule::new("!has(self.restoreTemplate) || !has(self.restoreTemplate.refresh) || self.restoreTemplate.refresh != 'OnNewEpoch' || has(self.restoreTemplate.spec.archive.s3)").message("refresh: OnNewEpoch needs an s3 archive (the operator reads its head epoch from the store)"),
    validation = Rule::new("!has(self.restoreTemplate) || !has(self.restoreTemplate.spec.archive.exportRef)").message("restoreTemplate.spec.archive must name the archive's location (s3 or volume) and tables: an exportRef names an ArchiveExport of the restore's own namespace, which the dev namespaces do not have"),
)]
pub struct ArchiveSourceSetSpec {
    /// Namespaces that get an ArchiveSource. Must not be empty (that would select every
    /// namespace, kube-system included).
    pub namespace_selector: NamespaceSelector,
    /// The ArchiveSource created in each selected namespace (named after the set). Exactly one
    /// of `template` and `restoreTemplate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<ArchiveSourceTemplate>,
    /// The ArchiveRestore created in each selected namespace (named after the set): seeds that
    /// namespace's own PostgreSQL database, and refreshes it as `refresh` says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_template: Option<ArchiveRestoreTemplate>,
    /// A read-only S3 credentials Secret shared with every selected namespace. Without it, the
    /// template's `archive.s3.credentials` must name a Secret that exists in each namespace, or
    /// the engines use workload identity (`serviceAccountName`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<SharedCredentials>,
    /// A CA bundle ConfigMap shared with every selected namespace. The template's `caBundle`
    /// references of that ConfigMap's name (`archive.s3.caBundle.configMap`,
    /// `target.postgres.caBundle.configMap`) then point at the copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<SharedCaBundle>,
}

/// A label selector over namespaces (the shape of `metav1.LabelSelector`, bounded).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("(has(self.matchLabels) && size(self.matchLabels) > 0) || (has(self.matchExpressions) && size(self.matchExpressions) > 0)").message("namespaceSelector must not be empty (an empty selector selects every namespace)"),
)]
pub struct NamespaceSelector {
    /// Labels a namespace must carry, all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "string_map_schema")]
    pub match_labels: Option<StringMap>,
    /// Requirements a namespace's labels must meet, all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub match_expressions: Option<Vec<SelectorRequirement>>,
}

/// One label requirement.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("(self.operator == 'In' || self.operator == 'NotIn') == (has(self.values) && size(self.values) > 0)").message("In and NotIn need values; Exists and DoesNotExist take none"),
)]
pub struct SelectorRequirement {
    /// Label key.
    #[schemars(length(min = 1, max = 316))]
    pub key: String,
    pub operator: SelectorOperator,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), inner(length(max = 63)))]
    pub values: Option<Vec<String>>,
}

/// Operator of a label requirement.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum SelectorOperator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

/// The ArchiveSource of every selected namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ArchiveSourceTemplate {
    /// The ArchiveSource spec. With `credentials` shared, `archive.s3.credentials.secretRef.name`
    /// is replaced by the name of the copy.
    pub spec: ArchiveSourceSpec,
}

/// The ArchiveRestore of every selected namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ArchiveRestoreTemplate {
    /// When a namespace's database is restored again (default `OnCreate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh: Option<RefreshPolicy>,
    /// The ArchiveRestore spec; `target.postgres.connectionSecretRef` names a Secret that exists
    /// in every namespace (CloudNativePG's `<cluster>-app`, key `uri`). `ifExists` is always
    /// `Replace`: a refresh replaces the seeded tables (and only those). With `credentials`
    /// shared, `archive.s3.credentials.secretRef.name` is replaced by the name of the copy.
    pub spec: ArchiveRestoreSpec,
}

/// When a set's restores run again.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RefreshPolicy {
    /// Once, when the namespace first matches (and again when the template changes).
    #[default]
    OnCreate,
    /// Also whenever the archive's head epoch changes (a new snapshot: the nightly seed).
    OnNewEpoch,
    /// Also whenever a developer sets a new value of the `larch.dev/refresh-requested`
    /// annotation on the namespace's ArchiveRestore.
    Manual,
}

/// A Secret in one namespace, copied into every selected namespace on opt-in.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.shareToNamespaces == true").message("credentials are copied into the selected namespaces only with shareToNamespaces: true; without sharing, omit credentials and name a Secret that exists in each namespace in template.spec.archive.s3.credentials"),
)]
pub struct SharedCredentials {
    /// The Secret holding a read-only S3 access key pair (keys as in the template's
    /// `archive.s3.credentials.secretRef`, default `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`).
    pub secret_ref: NamespacedSecretRef,
    /// Explicit opt-in: copy the Secret into every selected namespace (as
    /// `<set name>-credentials`, owned by the set, kept in sync on rotation).
    pub share_to_namespaces: bool,
}

/// A ConfigMap in one namespace (a CA bundle), copied into every selected namespace on opt-in.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.shareToNamespaces == true").message("the CA bundle is copied into the selected namespaces only with shareToNamespaces: true; without sharing, omit caBundle and create the ConfigMap the template names in each namespace"),
)]
pub struct SharedCaBundle {
    /// The ConfigMap holding the bundle; the template names it (by `name`) in its `caBundle`
    /// references, with the key to read.
    pub config_map_ref: NamespacedConfigMapRef,
    /// Explicit opt-in: copy the ConfigMap into every selected namespace (as `<set name>-ca`,
    /// owned by the set, kept in sync on rotation).
    pub share_to_namespaces: bool,
}

/// A ConfigMap by namespace and name.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespacedConfigMapRef {
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// A Secret by namespace and name.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespacedSecretRef {
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Observed state of an ArchiveSourceSet.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ArchiveSourceSetStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`, `Reconciling`, `Stalled`.
    #[serde(default)]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
    /// Namespaces the selector matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_namespaces: Option<i32>,
    /// Selected namespaces whose ArchiveSource is Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_namespaces: Option<i32>,
    /// Selected namespaces that cannot get a working ArchiveSource, with the reason (the first
    /// 64, by namespace name).
    #[serde(default)]
    #[schemars(length(max = 64))]
    pub failing_namespaces: Vec<FailingNamespace>,
    /// With a restoreTemplate: the head epoch of the archive, as last read (`OnNewEpoch`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_epoch: Option<i64>,
    /// When the operator last read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub head_epoch_read_time: Option<String>,
    /// With a restoreTemplate: the last refresh of each namespace (at most 100 namespaces:
    /// failing ones first, then by name; every namespace's full record is its ArchiveRestore's
    /// status).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100))]
    pub restores: Vec<NamespaceRestore>,
}

/// The seed of one namespace: its last refresh.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceRestore {
    #[schemars(length(max = 63))]
    pub namespace: String,
    /// What asked for the current run: `initial`, `epoch-<n>` or `manual-<value>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub refresh: Option<String>,
    /// When the last successful refresh completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub last_refresh_time: Option<String>,
    /// The epoch it restored (the archive's head epoch when it ran, with `OnNewEpoch`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<i64>,
    /// Rows it restored, over every table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_seconds: Option<f64>,
    /// Why the current run does not succeed (e.g. `DatabaseUnavailable`), if it does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub failure_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub failure_message: Option<String>,
}

/// A namespace the set cannot serve, and why.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailingNamespace {
    #[schemars(length(max = 63))]
    pub namespace: String,
    /// PascalCase reason (the ArchiveSource's `Stalled` reason, or the set's own).
    #[schemars(length(max = 1024))]
    pub reason: String,
    #[schemars(length(max = 4096))]
    pub message: String,
}
