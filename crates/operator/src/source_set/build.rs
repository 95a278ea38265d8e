//! ArchiveSourceSet → which namespaces are selected, and per namespace the ArchiveSource and (on
//! opt-in) the copy of the credentials Secret. Pure: the controller lists and applies.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, ResourceExt};

use crate::builders::{LABEL_MANAGED_BY, MANAGED_BY, labels, owner_ref, short_hash};
use crate::crd::archive_restore::{
    ArchiveRestore, IfExists, REFRESH_REQUESTED_ANNOTATION, RUN_REQUESTED_ANNOTATION,
};
use crate::crd::archive_source::{ArchiveRef, ArchiveSource};
use crate::crd::archive_source_set::{
    ArchiveSourceSet, NamespaceSelector, RefreshPolicy, SelectorOperator,
};
use crate::crd::common::{CaBundleRef, S3Credentials, S3SecretRef};
use crate::crd::common_pod::PodOverrides;

/// Label on every object a set manages (its ArchiveSources and Secret copies): the set's name.
pub const LABEL_SOURCE_SET: &str = "larch.dev/source-set";
/// Annotation on a Secret copy naming its source (`namespace/name`).
pub const ANNOTATION_COPIED_FROM: &str = "larch.dev/copied-from";
/// Pod annotation on the engines: a digest of the shared credentials, so a rotation restarts
/// them with the new keys (they read the keys from the environment at start).
pub const ANNOTATION_CREDENTIALS_DIGEST: &str = "larch.dev/credentials-digest";
/// Pod annotation on the engines: a digest of the shared CA bundle (a new CA restarts them;
/// they load it at start).
pub const ANNOTATION_CA_DIGEST: &str = "larch.dev/ca-digest";

/// Whether labels meet a selector (matchLabels and every matchExpression, as `metav1`).
pub fn selector_matches(sel: &NamespaceSelector, labels: &BTreeMap<String, String>) -> bool {
    // An empty selector matches nothing here (CEL rejects it; never select every namespace).
    let empty = sel.match_labels.as_ref().is_none_or(|m| m.is_empty())
        && sel.match_expressions.as_ref().is_none_or(|e| e.is_empty());
    if empty {
        return false;
    }
    let labels_ok = sel
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let exprs_ok = sel.match_expressions.iter().flatten().all(|r| {
        let values = r.values.as_deref().unwrap_or_default();
        let value = labels.get(&r.key);
        match r.operator {
            SelectorOperator::In => value.is_some_and(|v| values.contains(v)),
            SelectorOperator::NotIn => value.is_none_or(|v| !values.contains(v)),
            SelectorOperator::Exists => value.is_some(),
            SelectorOperator::DoesNotExist => value.is_none(),
        }
    });
    labels_ok && exprs_ok
}

/// Namespaces the set selects, sorted; terminating namespaces are left out (nothing can be
/// created there). Only metadata is read: full Namespaces or their metadata alone.
pub fn selected_namespaces<'a, N: Resource + 'a>(
    set: &ArchiveSourceSet,
    namespaces: impl IntoIterator<Item = &'a N>,
) -> Vec<String> {
    let mut out: Vec<String> = namespaces
        .into_iter()
        .filter(|ns| ns.meta().deletion_timestamp.is_none())
        .filter(|ns| selector_matches(&set.spec.namespace_selector, ns.labels()))
        .map(|ns| ns.name_any())
        .collect();
    out.sort();
    out
}

/// Name of the Secret copy in each namespace.
pub fn copy_name(set: &ArchiveSourceSet) -> String {
    format!("{}-credentials", set.name_any())
}

/// Name of the CA bundle ConfigMap copy in each namespace.
pub fn ca_copy_name(set: &ArchiveSourceSet) -> String {
    format!("{}-ca", set.name_any())
}

/// The name of the CA bundle ConfigMap the set copies (the explicit opt-in), if it does.
pub fn shared_ca_name(set: &ArchiveSourceSet) -> Option<&str> {
    set.spec
        .ca_bundle
        .as_ref()
        .filter(|c| c.share_to_namespaces)
        .map(|c| c.config_map_ref.name.as_str())
}

/// The archive of the set's template (the ArchiveSource's or the ArchiveRestore's).
pub fn template_archive(set: &ArchiveSourceSet) -> Option<&ArchiveRef> {
    match (&set.spec.template, &set.spec.restore_template) {
        (Some(t), _) => Some(&t.spec.archive),
        (None, Some(r)) => Some(&r.spec.archive),
        (None, None) => None,
    }
}

/// Whether the set stamps ArchiveRestores (a `restoreTemplate`) rather than ArchiveSources.
pub fn stamps_restores(set: &ArchiveSourceSet) -> bool {
    set.spec.template.is_none() && set.spec.restore_template.is_some()
}

/// A template's CA bundle references (the archive's, the target's), with the field each sits in.
fn ca_refs<'a>(
    archive: &'a mut ArchiveRef,
    target: Option<&'a mut CaBundleRef>,
) -> Vec<(&'static str, &'a mut CaBundleRef)> {
    let mut out = Vec::new();
    if let Some(ca) = archive.s3.as_mut().and_then(|s| s.ca_bundle.as_mut()) {
        out.push(("archive.s3.caBundle", ca));
    }
    if let Some(ca) = target {
        out.push(("target.postgres.caBundle", ca));
    }
    out
}

/// The CA bundle references of an archive and a target, read-only (the fields `ca_refs` walks).
fn ca_bundles<'a>(
    archive: &'a ArchiveRef,
    target: Option<&'a CaBundleRef>,
) -> impl Iterator<Item = &'a CaBundleRef> {
    let s3 = archive.s3.as_ref().and_then(|s| s.ca_bundle.as_ref());
    s3.into_iter().chain(target)
}

/// Whether the template names the shared CA ConfigMap somewhere (else sharing it is a mistake).
pub fn template_uses_shared_ca(set: &ArchiveSourceSet) -> bool {
    let Some(name) = shared_ca_name(set) else {
        return false;
    };
    let names = |ca: &CaBundleRef| ca.config_map.as_ref().is_some_and(|k| k.name == name);
    if let Some(t) = &set.spec.template {
        let target = t
            .spec
            .target
            .postgres
            .as_ref()
            .and_then(|p| p.ca_bundle.as_ref());
        return ca_bundles(&t.spec.archive, target).any(names);
    }
    if let Some(r) = &set.spec.restore_template {
        let target = r.spec.target.postgres.ca_bundle.as_ref();
        return ca_bundles(&r.spec.archive, target).any(names);
    }
    false
}

/// Whether the set copies its credentials Secret (the explicit opt-in).
pub fn shares_credentials(set: &ArchiveSourceSet) -> bool {
    set.spec
        .credentials
        .as_ref()
        .is_some_and(|c| c.share_to_namespaces)
}

/// The Secret the ArchiveSource of each namespace references when nothing is shared: it must
/// exist in that namespace.
pub fn per_namespace_secret(set: &ArchiveSourceSet) -> Option<String> {
    if shares_credentials(set) {
        return None;
    }
    template_archive(set)?
        .s3
        .as_ref()?
        .credentials
        .as_ref()
        .map(|c| c.secret_ref.name.clone())
}

/// A digest of Secret data, keyed by the set's uid: changes with the data, reveals nothing
/// usable about it.
pub fn credentials_digest(set: &ArchiveSourceSet, data: &BTreeMap<String, ByteString>) -> String {
    let mut buf = set.uid().unwrap_or_default().into_bytes();
    for (k, v) in data {
        buf.extend_from_slice(&(k.len() as u64).to_be_bytes());
        buf.extend_from_slice(k.as_bytes());
        buf.extend_from_slice(&(v.0.len() as u64).to_be_bytes());
        buf.extend_from_slice(&v.0);
    }
    short_hash(&buf, 16)
}

fn managed_labels(set: &ArchiveSourceSet) -> BTreeMap<String, String> {
    labels(&[
        (LABEL_MANAGED_BY, MANAGED_BY),
        (LABEL_SOURCE_SET, &set.name_any()),
    ])
}

fn meta(set: &ArchiveSourceSet, namespace: &str, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(namespace.into()),
        labels: Some(managed_labels(set)),
        // A cluster-scoped owner may own namespaced objects: deleting the set collects them.
        owner_references: Some(vec![owner_ref(set)]),
        ..Default::default()
    }
}

/// A digest of a ConfigMap's data, keyed by the set's uid (as [`credentials_digest`]).
pub fn config_map_digest(set: &ArchiveSourceSet, cm: &ConfigMap) -> String {
    let data: BTreeMap<String, ByteString> = cm
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), ByteString(v.clone().into_bytes())))
        .chain(
            cm.binary_data
                .iter()
                .flatten()
                .map(|(k, v)| (format!("binary:{k}"), v.clone())),
        )
        .collect();
    credentials_digest(set, &data)
}

/// What the set shares with every namespace, by digest of the copied data.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SharedDigests {
    /// Of the credentials Secret (when shared).
    pub credentials: Option<String>,
    /// Of the CA bundle ConfigMap (when shared).
    pub ca: Option<String>,
}

/// The ArchiveSource of `namespace`. With shared credentials (their digest in `shared`), the
/// template's S3 credentials point at the copy; with a shared CA bundle, every `caBundle`
/// reference of its name points at the CA copy; the engines carry the digests (a rotation
/// restarts them).
pub fn child_source(
    set: &ArchiveSourceSet,
    namespace: &str,
    shared: &SharedDigests,
) -> ArchiveSource {
    let mut spec = set
        .spec
        .template
        .as_ref()
        .expect("child_source: the set has a template")
        .spec
        .clone();
    let target = spec
        .target
        .postgres
        .as_mut()
        .and_then(|p| p.ca_bundle.as_mut());
    let retargeted = retarget_shared(set, &mut spec.archive, target, shared);
    // The engines read keys and CA at start: the digests on their pods roll them on a rotation.
    for (key, digest) in retargeted {
        spec.pod
            .get_or_insert_with(PodOverrides::default)
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), digest);
    }
    let mut source = ArchiveSource::new(&set.name_any(), spec);
    source.metadata = meta(set, namespace, set.name_any());
    source
}

/// Points the template's references of what the set shares at the copies: every `caBundle`
/// naming the shared CA ConfigMap, and the S3 credentials. Returns the pod annotation and
/// digest of each thing shared (only once its digest is known).
fn retarget_shared(
    set: &ArchiveSourceSet,
    archive: &mut ArchiveRef,
    target_ca: Option<&mut CaBundleRef>,
    shared: &SharedDigests,
) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if let (Some(name), Some(digest)) = (shared_ca_name(set), shared.ca.as_deref()) {
        let copy = ca_copy_name(set);
        for (_, ca) in ca_refs(archive, target_ca) {
            if let Some(k) = ca.config_map.as_mut().filter(|k| k.name == name) {
                k.name = copy.clone();
            }
        }
        out.push((ANNOTATION_CA_DIGEST, digest.to_string()));
    }
    let digest = shared.credentials.as_deref();
    if let (true, Some(digest), Some(s3)) = (shares_credentials(set), digest, archive.s3.as_mut()) {
        let keys = s3.credentials.take().map(|c| c.secret_ref);
        s3.credentials = Some(S3Credentials {
            secret_ref: S3SecretRef {
                name: copy_name(set),
                access_key_id_key: keys.as_ref().and_then(|k| k.access_key_id_key.clone()),
                secret_access_key_key: keys.and_then(|k| k.secret_access_key_key),
            },
        });
        out.push((ANNOTATION_CREDENTIALS_DIGEST, digest.to_string()));
    }
    out
}

/// Longest part of a developer's `larch.dev/refresh-requested` value kept in the token.
const MAX_REFRESH_VALUE: usize = 64;

/// The `larch.dev/run-requested` token of a namespace's ArchiveRestore: the refresh it asks
/// for. `initial` (OnCreate, Manual), or `epoch-<n>` with OnNewEpoch once the head epoch is
/// known (else the token the restore has, so an unreadable head re-runs nothing); a
/// developer's `larch.dev/refresh-requested` value adds `+manual-<value>` (in every policy).
/// A new token is a new run of the restore; the same token never runs again.
pub fn refresh_token(
    set: &ArchiveSourceSet,
    head_epoch: Option<i64>,
    existing: Option<&ArchiveRestore>,
) -> String {
    let policy = set
        .spec
        .restore_template
        .as_ref()
        .and_then(|r| r.refresh)
        .unwrap_or_default();
    let current = existing.and_then(|r| r.annotations().get(RUN_REQUESTED_ANNOTATION));
    let base = match (policy, head_epoch) {
        (RefreshPolicy::OnNewEpoch, Some(epoch)) => format!("epoch-{epoch}"),
        (RefreshPolicy::OnNewEpoch, None) => current
            .map(|t| t.split('+').next().unwrap_or_default().to_string())
            .filter(|t| !t.is_empty())
            .unwrap_or_else(|| "initial".into()),
        _ => "initial".into(),
    };
    match existing
        .and_then(|r| r.annotations().get(REFRESH_REQUESTED_ANNOTATION))
        .filter(|v| !v.is_empty())
    {
        Some(v) => format!(
            "{base}+manual-{}",
            v.chars().take(MAX_REFRESH_VALUE).collect::<String>()
        ),
        None => base,
    }
}

/// The epoch a token asked for (`epoch-<n>`, with or without a manual part).
pub fn token_epoch(token: &str) -> Option<i64> {
    token
        .split('+')
        .next()?
        .strip_prefix("epoch-")?
        .parse()
        .ok()
}

/// The ArchiveRestore of `namespace`: the restore template, `ifExists: Replace` (a refresh
/// replaces the seeded tables, and touches no other), the shared credentials and CA pointed at
/// the copies, and `token` as its `larch.dev/run-requested` annotation. No digest goes into
/// its spec: a credentials rotation must not restore again.
pub fn child_restore(
    set: &ArchiveSourceSet,
    namespace: &str,
    shared: &SharedDigests,
    token: &str,
) -> ArchiveRestore {
    let mut spec = set
        .spec
        .restore_template
        .as_ref()
        .expect("child_restore: the set has a restoreTemplate")
        .spec
        .clone();
    spec.if_exists = Some(IfExists::Replace);
    retarget_shared(
        set,
        &mut spec.archive,
        spec.target.postgres.ca_bundle.as_mut(),
        shared,
    );
    let mut restore = ArchiveRestore::new(&set.name_any(), spec);
    restore.metadata = meta(set, namespace, set.name_any());
    restore.metadata.annotations = Some(BTreeMap::from([(
        RUN_REQUESTED_ANNOTATION.into(),
        token.into(),
    )]));
    restore
}

/// The copy of the credentials Secret in `namespace`: its data and type only (never the
/// source's labels or annotations), labelled and owned by the set.
pub fn secret_copy(set: &ArchiveSourceSet, namespace: &str, source: &Secret) -> Secret {
    let mut metadata = meta(set, namespace, copy_name(set));
    metadata.annotations = Some(BTreeMap::from([(
        ANNOTATION_COPIED_FROM.into(),
        format!(
            "{}/{}",
            source.namespace().unwrap_or_default(),
            source.name_any()
        ),
    )]));
    Secret {
        metadata,
        data: Some(source.data.clone().unwrap_or_default()),
        type_: source.type_.clone(),
        ..Default::default()
    }
}

/// The copy of the CA bundle ConfigMap in `namespace`: its data only, labelled and owned by
/// the set.
pub fn ca_copy(set: &ArchiveSourceSet, namespace: &str, source: &ConfigMap) -> ConfigMap {
    let mut metadata = meta(set, namespace, ca_copy_name(set));
    metadata.annotations = Some(BTreeMap::from([(
        ANNOTATION_COPIED_FROM.into(),
        format!(
            "{}/{}",
            source.namespace().unwrap_or_default(),
            source.name_any()
        ),
    )]));
    ConfigMap {
        metadata,
        data: source.data.clone(),
        binary_data: source.binary_data.clone(),
        ..Default::default()
    }
}

/// Whether `obj` is owned by `set` (same uid): only those are updated or deleted; an object of
/// the same name that someone else made is a conflict.
pub fn owned_by<K: Resource>(obj: &K, set: &ArchiveSourceSet) -> bool {
    owns(obj.meta(), set)
}

/// [`owned_by`] over metadata alone.
pub fn owns(meta: &ObjectMeta, set: &ArchiveSourceSet) -> bool {
    let uid = set.uid();
    meta.owner_references
        .iter()
        .flatten()
        .any(|r| Some(&r.uid) == uid.as_ref() && r.kind == "ArchiveSourceSet")
}

#[cfg(test)]
#[path = "tests/build.rs"]
pub(crate) mod tests;
