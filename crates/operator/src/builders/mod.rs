//! Pure builders: custom resource (+ observed facts) → every child object. No I/O here; the
//! controllers apply what these return, and golden tests pin their output.

pub mod engine_config;
pub mod pod;

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;
use sha2::{Digest, Sha256};

/// Labels the operator puts on children (never copied from the custom resource).
pub const LABEL_NAME: &str = "app.kubernetes.io/name";
pub const LABEL_COMPONENT: &str = "app.kubernetes.io/component";
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const LABEL_EXPORT: &str = "larch.dev/archive-export";
pub const LABEL_SOURCE: &str = "larch.dev/archive-source";
pub const LABEL_TABLE: &str = "larch.dev/table";
pub const LABEL_RUN: &str = "larch.dev/run";
pub const MANAGED_BY: &str = "larch-operator";
/// Pod-template annotation carrying the hash of the engine config, so config changes roll pods.
pub const ANNOTATION_CONFIG_HASH: &str = "larch.dev/config-hash";
/// Annotation on export pods naming the table they export (`schema.table`).
pub const ANNOTATION_TABLE: &str = "larch.dev/table";

/// Inputs that are not part of a custom resource.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BuildContext {
    /// Image of the generated pods (`--image` / `LARCH_IMAGE`).
    pub image: String,
    /// The operator's namespace: engines' NetworkPolicies admit its probes.
    pub operator_namespace: String,
    /// Generate engine NetworkPolicies for ArchiveSources that do not say
    /// (`--network-policies`).
    pub network_policies: bool,
    /// Generate an engine API token for ArchiveSources that name none (on unless
    /// `--no-generated-engine-tokens`).
    pub generate_engine_tokens: bool,
    /// The UID of generated pods (`--pod-run-as-user`).
    pub pod_user: pod::PodUser,
}

/// First `n` hex characters of SHA-256 of `data`.
pub fn short_hash(data: &[u8], n: usize) -> String {
    let digest = Sha256::digest(data);
    hex::encode(digest)[..n].to_string()
}

/// A stable 8-character id of a table (`schema.table`), used in child names and labels.
pub fn table_id(qualified: &str) -> String {
    short_hash(qualified.as_bytes(), 8)
}

/// Metadata of a child: name, namespace, labels, and a controller owner reference to `owner`.
pub fn child_meta<K>(owner: &K, name: String, labels: BTreeMap<String, String>) -> ObjectMeta
where
    K: Resource<DynamicType = ()>,
{
    ObjectMeta {
        name: Some(name),
        namespace: owner.meta().namespace.clone(),
        labels: Some(labels),
        owner_references: Some(vec![owner_ref(owner)]),
        ..Default::default()
    }
}

/// `controller: true, blockOwnerDeletion: true` reference to `owner`.
pub fn owner_ref<K>(owner: &K) -> OwnerReference
where
    K: Resource<DynamicType = ()>,
{
    let mut r = owner
        .controller_owner_ref(&())
        .expect("custom resources handed to builders have a name and uid");
    r.block_owner_deletion = Some(true);
    r
}

pub(crate) fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[cfg(test)]
pub(crate) mod tests;
