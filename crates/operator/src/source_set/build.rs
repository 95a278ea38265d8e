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
pub(crate) mod tests {
    use super::*;
    use crate::crd::archive_source_set::SelectorRequirement;

    fn creds(digest: &str) -> SharedDigests {
        SharedDigests {
            credentials: Some(digest.into()),
            ca: None,
        }
    }

    pub(crate) fn set_fixture(share: bool) -> ArchiveSourceSet {
        let mut v: serde_json::Value = serde_yaml_ng::from_str(
            r#"
apiVersion: larch.dev/v1alpha1
kind: ArchiveSourceSet
metadata: {name: dev-seed, uid: 5e7-uid, generation: 2}
spec:
  namespaceSelector: {matchLabels: {larch.dev/seed: events}}
  template:
    spec:
      archive:
        s3:
          bucket: seeds
          credentials: {secretRef: {name: s3-credentials, accessKeyIdKey: id}}
      table: {name: events}
      target: {memory: {}}
      pod: {annotations: {team: platform}}
  credentials:
    secretRef: {namespace: platform, name: seed-reader}
    shareToNamespaces: true
"#,
        )
        .unwrap();
        if !share {
            v["spec"].as_object_mut().unwrap().remove("credentials");
        }
        serde_json::from_value(v).unwrap()
    }

    use k8s_openapi::api::core::v1::Namespace;

    fn ns(name: &str, labels: &[(&str, &str)], terminating: bool) -> Namespace {
        let mut n = Namespace::default();
        n.metadata.name = Some(name.into());
        n.metadata.labels = Some(crate::builders::labels(labels));
        if terminating {
            n.metadata.deletion_timestamp = Some(
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH),
            );
        }
        n
    }

    #[test]
    fn selects_matching_live_namespaces_sorted() {
        let set = set_fixture(true);
        let all = vec![
            ns("dev-b", &[("larch.dev/seed", "events")], false),
            ns("dev-a", &[("larch.dev/seed", "events"), ("x", "y")], false),
            ns("dev-c", &[("larch.dev/seed", "other")], false),
            ns("kube-system", &[], false),
            ns("dev-gone", &[("larch.dev/seed", "events")], true),
        ];
        assert_eq!(selected_namespaces(&set, &all), ["dev-a", "dev-b"]);
    }

    #[test]
    fn selector_expressions_follow_metav1() {
        let l = crate::builders::labels(&[("env", "dev"), ("team", "a")]);
        let req = |key: &str, operator, values: &[&str]| SelectorRequirement {
            key: key.into(),
            operator,
            values: (!values.is_empty()).then(|| values.iter().map(|s| s.to_string()).collect()),
        };
        let sel = |reqs: Vec<SelectorRequirement>| NamespaceSelector {
            match_labels: None,
            match_expressions: Some(reqs),
        };
        use SelectorOperator::*;
        assert!(selector_matches(
            &sel(vec![req("env", In, &["dev", "qa"])]),
            &l
        ));
        assert!(!selector_matches(&sel(vec![req("env", In, &["qa"])]), &l));
        assert!(selector_matches(
            &sel(vec![req("env", NotIn, &["prod"])]),
            &l
        ));
        assert!(selector_matches(&sel(vec![req("x", NotIn, &["prod"])]), &l));
        assert!(!selector_matches(
            &sel(vec![req("team", NotIn, &["a"])]),
            &l
        ));
        assert!(selector_matches(&sel(vec![req("team", Exists, &[])]), &l));
        assert!(!selector_matches(
            &sel(vec![req("team", DoesNotExist, &[])]),
            &l
        ));
        assert!(selector_matches(
            &sel(vec![req("team", Exists, &[]), req("x", DoesNotExist, &[])]),
            &l
        ));
        // Both parts must hold.
        let both = NamespaceSelector {
            match_labels: Some(crate::builders::labels(&[("env", "prod")])),
            match_expressions: Some(vec![req("team", Exists, &[])]),
        };
        assert!(!selector_matches(&both, &l));
        // Empty selects nothing, never everything.
        assert!(!selector_matches(&NamespaceSelector::default(), &l));
        assert!(!selector_matches(&sel(vec![]), &l));
    }

    #[test]
    fn shared_credentials_point_the_child_at_the_copy() {
        let set = set_fixture(true);
        let child = child_source(&set, "dev-a", &creds("abc123"));
        assert_eq!(child.metadata.name.as_deref(), Some("dev-seed"));
        assert_eq!(child.metadata.namespace.as_deref(), Some("dev-a"));
        assert_eq!(child.labels()[LABEL_SOURCE_SET], "dev-seed");
        assert_eq!(child.labels()[LABEL_MANAGED_BY], MANAGED_BY);
        let owner = &child.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("ArchiveSourceSet", "5e7-uid")
        );
        assert_eq!(owner.controller, Some(true));
        assert!(owned_by(&child, &set));
        let s3 = child.spec.archive.s3.as_ref().unwrap();
        let r = &s3.credentials.as_ref().unwrap().secret_ref;
        assert_eq!(r.name, "dev-seed-credentials");
        // The template's key names are kept.
        assert_eq!(r.access_key_id_key.as_deref(), Some("id"));
        let ann = child
            .spec
            .pod
            .as_ref()
            .unwrap()
            .annotations
            .as_ref()
            .unwrap();
        assert_eq!(ann[ANNOTATION_CREDENTIALS_DIGEST], "abc123");
        assert_eq!(ann["team"], "platform");
        // Everything else is the template.
        let mut expected = set.spec.template.clone().unwrap().spec;
        expected.archive.s3 = child.spec.archive.s3.clone();
        expected.pod = child.spec.pod.clone();
        assert_eq!(child.spec, expected);
    }

    /// The fixture with a CA bundle shared: the template names `pg-ca` for the archive (S3) and
    /// the target, and `other-ca` nowhere shared.
    pub(crate) fn set_with_ca() -> ArchiveSourceSet {
        let mut v = serde_json::to_value(set_fixture(true)).unwrap();
        v["spec"]["caBundle"] = serde_json::json!({
            "configMapRef": {"namespace": "platform", "name": "pg-ca"},
            "shareToNamespaces": true
        });
        v["spec"]["template"]["spec"]["archive"]["s3"]["caBundle"] =
            serde_json::json!({"configMap": {"name": "pg-ca", "key": "ca.crt"}});
        v["spec"]["template"]["spec"]["target"] = serde_json::json!({"postgres": {
            "connectionSecretRef": {"name": "dev-db", "key": "uri"},
            "caBundle": {"configMap": {"name": "pg-ca", "key": "root.pem"}}
        }});
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_shared_ca_bundle_points_every_reference_of_its_name_at_the_copy() {
        let set = set_with_ca();
        assert_eq!(shared_ca_name(&set), Some("pg-ca"));
        assert!(template_uses_shared_ca(&set));
        let shared = SharedDigests {
            credentials: Some("c0ffee".into()),
            ca: Some("ca0001".into()),
        };
        let child = child_source(&set, "dev-a", &shared);
        let s3 = child.spec.archive.s3.as_ref().unwrap();
        let s3_ca = s3.ca_bundle.as_ref().unwrap().config_map.as_ref().unwrap();
        assert_eq!(
            (s3_ca.name.as_str(), s3_ca.key.as_str()),
            ("dev-seed-ca", "ca.crt")
        );
        let pg = child.spec.target.postgres.as_ref().unwrap();
        let pg_ca = pg.ca_bundle.as_ref().unwrap().config_map.as_ref().unwrap();
        assert_eq!(
            (pg_ca.name.as_str(), pg_ca.key.as_str()),
            ("dev-seed-ca", "root.pem")
        );
        let ann = child
            .spec
            .pod
            .as_ref()
            .unwrap()
            .annotations
            .as_ref()
            .unwrap();
        assert_eq!(ann[ANNOTATION_CA_DIGEST], "ca0001");
        assert_eq!(ann[ANNOTATION_CREDENTIALS_DIGEST], "c0ffee");

        // Not shared (no opt-in, or no digest yet): the template's references are kept.
        let mut off = set.clone();
        off.spec.ca_bundle.as_mut().unwrap().share_to_namespaces = false;
        assert_eq!(shared_ca_name(&off), None);
        let child = child_source(&off, "dev-a", &shared);
        let s3 = child.spec.archive.s3.as_ref().unwrap();
        assert_eq!(
            s3.ca_bundle
                .as_ref()
                .unwrap()
                .config_map
                .as_ref()
                .unwrap()
                .name,
            "pg-ca"
        );
        // A template naming another ConfigMap does not use the shared one.
        let mut other = set_with_ca();
        other.spec.ca_bundle.as_mut().unwrap().config_map_ref.name = "other-ca".into();
        assert!(!template_uses_shared_ca(&other));
    }

    #[test]
    fn the_ca_copy_carries_data_only_and_its_digest_follows_the_data() {
        let set = set_with_ca();
        let mut src = ConfigMap::default();
        src.metadata.name = Some("pg-ca".into());
        src.metadata.namespace = Some("platform".into());
        src.metadata.labels = Some(crate::builders::labels(&[("team", "platform")]));
        src.data = Some(BTreeMap::from([(
            "ca.crt".into(),
            "-----BEGIN CERT-----".into(),
        )]));
        let copy = ca_copy(&set, "dev-a", &src);
        assert_eq!(copy.metadata.name.as_deref(), Some("dev-seed-ca"));
        assert_eq!(copy.metadata.namespace.as_deref(), Some("dev-a"));
        assert_eq!(copy.data, src.data);
        assert!(!copy.labels().contains_key("team"));
        assert_eq!(copy.labels()[LABEL_SOURCE_SET], "dev-seed");
        assert_eq!(copy.annotations()[ANNOTATION_COPIED_FROM], "platform/pg-ca");
        assert!(owned_by(&copy, &set));
        let before = config_map_digest(&set, &src);
        assert_eq!(before, config_map_digest(&set, &src.clone()));
        src.data
            .as_mut()
            .unwrap()
            .insert("ca.crt".into(), "rotated".into());
        assert_ne!(before, config_map_digest(&set, &src));
    }

    #[test]
    fn without_opt_in_the_template_is_used_as_is() {
        let set = set_fixture(false);
        let child = child_source(&set, "dev-a", &creds("ignored"));
        assert_eq!(child.spec, set.spec.template.clone().unwrap().spec);
        assert_eq!(
            per_namespace_secret(&set).as_deref(),
            Some("s3-credentials")
        );
        assert_eq!(per_namespace_secret(&set_fixture(true)), None);
        assert!(!shares_credentials(&set));
    }

    #[test]
    fn the_copy_carries_data_and_type_only() {
        let set = set_fixture(true);
        let mut src = Secret::default();
        src.metadata.name = Some("seed-reader".into());
        src.metadata.namespace = Some("platform".into());
        src.metadata.labels = Some(crate::builders::labels(&[(
            "argocd.argoproj.io/instance",
            "x",
        )]));
        src.metadata.annotations = Some(crate::builders::labels(&[("note", "y")]));
        src.data = Some(BTreeMap::from([(
            "id".to_string(),
            ByteString(b"AKIA".to_vec()),
        )]));
        src.type_ = Some("Opaque".into());
        src.immutable = Some(true);
        let copy = secret_copy(&set, "dev-a", &src);
        assert_eq!(copy.metadata.name.as_deref(), Some("dev-seed-credentials"));
        assert_eq!(copy.metadata.namespace.as_deref(), Some("dev-a"));
        assert_eq!(copy.data, src.data);
        assert_eq!(copy.type_.as_deref(), Some("Opaque"));
        assert_eq!(copy.immutable, None, "copies must stay updatable");
        assert_eq!(
            copy.metadata
                .labels
                .as_ref()
                .unwrap()
                .keys()
                .collect::<Vec<_>>(),
            [LABEL_MANAGED_BY, LABEL_SOURCE_SET]
        );
        assert_eq!(
            copy.metadata.annotations.as_ref().unwrap()[ANNOTATION_COPIED_FROM],
            "platform/seed-reader"
        );
        assert!(owned_by(&copy, &set));
    }

    #[test]
    fn digest_follows_the_data_and_not_the_metadata() {
        let set = set_fixture(true);
        let d = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect::<BTreeMap<_, _>>()
        };
        let a = credentials_digest(&set, &d(&[("id", "one"), ("secret", "two")]));
        assert_eq!(a.len(), 16);
        assert_eq!(
            a,
            credentials_digest(&set, &d(&[("id", "one"), ("secret", "two")]))
        );
        assert_ne!(
            a,
            credentials_digest(&set, &d(&[("id", "one"), ("secret", "three")]))
        );
        // No ambiguity between keys and values.
        assert_ne!(
            credentials_digest(&set, &d(&[("ab", "c")])),
            credentials_digest(&set, &d(&[("a", "bc")]))
        );
        // Keyed by the set: the same data in another set gives another digest.
        let mut other = set.clone();
        other.metadata.uid = Some("other".into());
        assert_ne!(
            a,
            credentials_digest(&other, &d(&[("id", "one"), ("secret", "two")]))
        );
    }

    /// The children of one namespace, pinned (regenerate with `LARCH_UPDATE_GOLDEN=1`).
    #[test]
    fn children_match_golden() {
        let set = set_fixture(true);
        let mut src = Secret::default();
        src.metadata.name = Some("seed-reader".into());
        src.metadata.namespace = Some("platform".into());
        src.data = Some(BTreeMap::from([
            ("id".to_string(), ByteString(b"reader".to_vec())),
            (
                "AWS_SECRET_ACCESS_KEY".to_string(),
                ByteString(b"s".to_vec()),
            ),
        ]));
        src.type_ = Some("Opaque".into());
        let digest = credentials_digest(&set, src.data.as_ref().unwrap());
        let docs = [
            serde_yaml_ng::to_string(&child_source(&set, "dev-a", &creds(&digest))).unwrap(),
            serde_yaml_ng::to_string(&secret_copy(&set, "dev-a", &src)).unwrap(),
            serde_yaml_ng::to_string(&child_source(
                &set_fixture(false),
                "dev-a",
                &SharedDigests::default(),
            ))
            .unwrap(),
        ];
        let text: String = docs.iter().map(|d| format!("---\n{d}")).collect();
        crate::crd::tests::assert_golden(
            "crates/operator/src/builders/testdata/sourceset-dev-seed.golden.yaml",
            &text,
        );
    }

    /// A set stamping restores: CloudNativePG's `<cluster>-app` Secret per namespace, the
    /// archive's keys and CA shared.
    pub(crate) fn restore_set_fixture(refresh: &str) -> ArchiveSourceSet {
        serde_yaml_ng::from_str(&format!(
            r#"
apiVersion: larch.dev/v1alpha1
kind: ArchiveSourceSet
metadata: {{name: dev-seed, uid: 5e7-uid, generation: 1}}
spec:
  namespaceSelector: {{matchLabels: {{larch.dev/seed: events}}}}
  restoreTemplate:
    refresh: {refresh}
    spec:
      archive:
        s3:
          bucket: seeds
          endpoint: https://s3.platform:9000
          credentials: {{secretRef: {{name: s3-credentials, accessKeyIdKey: id}}}}
          caBundle: {{configMap: {{name: pg-ca, key: ca.crt}}}}
        keyPrefix: nightly/
      tables: [{{name: events}}, {{schema: app, name: users}}]
      target:
        postgres:
          connectionSecretRef: {{name: app-db-app, key: uri}}
      ifExists: Fail
  credentials:
    secretRef: {{namespace: platform, name: seed-reader}}
    shareToNamespaces: true
  caBundle:
    configMapRef: {{namespace: platform, name: pg-ca}}
    shareToNamespaces: true
"#
        ))
        .unwrap()
    }

    fn restore_child(set: &ArchiveSourceSet, annotations: &[(&str, &str)]) -> ArchiveRestore {
        let mut r = child_restore(set, "dev-a", &SharedDigests::default(), "initial");
        r.metadata.annotations = Some(crate::builders::labels(annotations));
        r
    }

    #[test]
    fn a_stamped_restore_replaces_reads_the_copies_and_carries_its_token() {
        let set = restore_set_fixture("OnCreate");
        assert!(stamps_restores(&set));
        assert!(template_uses_shared_ca(&set));
        assert_eq!(per_namespace_secret(&set), None);
        let shared = SharedDigests {
            credentials: Some("c0ffee".into()),
            ca: Some("ca0001".into()),
        };
        let r = child_restore(&set, "dev-a", &shared, "epoch-3");
        assert_eq!(r.metadata.name.as_deref(), Some("dev-seed"));
        assert_eq!(r.metadata.namespace.as_deref(), Some("dev-a"));
        assert_eq!(r.labels()[LABEL_SOURCE_SET], "dev-seed");
        assert!(owned_by(&r, &set));
        assert_eq!(r.annotations()[RUN_REQUESTED_ANNOTATION], "epoch-3");
        // A refresh replaces the seeded tables, whatever the template says.
        assert_eq!(r.spec.if_exists, Some(IfExists::Replace));
        let s3 = r.spec.archive.s3.as_ref().unwrap();
        let creds = &s3.credentials.as_ref().unwrap().secret_ref;
        assert_eq!(creds.name, "dev-seed-credentials");
        assert_eq!(creds.access_key_id_key.as_deref(), Some("id"));
        let ca = s3.ca_bundle.as_ref().unwrap().config_map.as_ref().unwrap();
        assert_eq!(ca.name, "dev-seed-ca");
        // The target Secret is the same name in every namespace; no digest in the spec (a
        // rotation must not restore again).
        assert_eq!(
            r.spec.target.postgres.connection_secret_ref.name,
            "app-db-app"
        );
        assert_eq!(r.spec.pod, None);
        let other = child_restore(
            &set,
            "dev-a",
            &SharedDigests {
                credentials: Some("rotated".into()),
                ca: Some("rotated".into()),
            },
            "epoch-3",
        );
        assert_eq!(r.spec, other.spec);
    }

    #[test]
    fn refresh_tokens_follow_the_policy() {
        let on_create = restore_set_fixture("OnCreate");
        assert_eq!(refresh_token(&on_create, Some(7), None), "initial");
        let epoch = restore_set_fixture("OnNewEpoch");
        assert_eq!(refresh_token(&epoch, Some(7), None), "epoch-7");
        assert_eq!(refresh_token(&epoch, Some(8), None), "epoch-8");
        // An unreadable head keeps the token the restore has: nothing re-runs.
        let existing = restore_child(&epoch, &[(RUN_REQUESTED_ANNOTATION, "epoch-7")]);
        assert_eq!(refresh_token(&epoch, None, Some(&existing)), "epoch-7");
        assert_eq!(refresh_token(&epoch, None, None), "initial");
        let manual = restore_set_fixture("Manual");
        assert_eq!(refresh_token(&manual, Some(9), None), "initial");
        let asked = restore_child(
            &manual,
            &[
                (RUN_REQUESTED_ANNOTATION, "initial"),
                (REFRESH_REQUESTED_ANNOTATION, "2026-12-01T10:00"),
            ],
        );
        assert_eq!(
            refresh_token(&manual, Some(9), Some(&asked)),
            "initial+manual-2026-12-01T10:00"
        );
        // The manual request works with every policy, and survives a new epoch.
        let asked_epoch = restore_child(
            &epoch,
            &[
                (RUN_REQUESTED_ANNOTATION, "epoch-7+manual-a"),
                (REFRESH_REQUESTED_ANNOTATION, "a"),
            ],
        );
        assert_eq!(
            refresh_token(&epoch, None, Some(&asked_epoch)),
            "epoch-7+manual-a"
        );
        assert_eq!(
            refresh_token(&epoch, Some(8), Some(&asked_epoch)),
            "epoch-8+manual-a"
        );
        assert_eq!(token_epoch("epoch-8+manual-a"), Some(8));
        assert_eq!(token_epoch("epoch-12"), Some(12));
        assert_eq!(token_epoch("initial+manual-x"), None);
        // A long value is cut (the token stays bounded).
        let long = "x".repeat(500);
        let asked = restore_child(&manual, &[(REFRESH_REQUESTED_ANNOTATION, &long)]);
        assert_eq!(
            refresh_token(&manual, None, Some(&asked)).len(),
            "initial+manual-".len() + 64
        );
    }

    /// The stamped ArchiveRestore, pinned (regenerate with `LARCH_UPDATE_GOLDEN=1`).
    #[test]
    fn stamped_restore_matches_golden() {
        let set = restore_set_fixture("OnNewEpoch");
        let shared = SharedDigests {
            credentials: Some("c0ffee".into()),
            ca: Some("ca0001".into()),
        };
        let text = format!(
            "---\n{}",
            serde_yaml_ng::to_string(&child_restore(&set, "dev-a", &shared, "epoch-3")).unwrap()
        );
        crate::crd::tests::assert_golden(
            "crates/operator/src/builders/testdata/sourceset-restore.golden.yaml",
            &text,
        );
    }

    #[test]
    fn objects_of_others_are_not_owned() {
        let set = set_fixture(true);
        let mut s = Secret::default();
        assert!(!owned_by(&s, &set));
        let mut r = owner_ref(&set);
        r.uid = "someone-else".into();
        s.metadata.owner_references = Some(vec![r]);
        assert!(!owned_by(&s, &set));
    }
}
