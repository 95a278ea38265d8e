//! ArchiveSourceSet → which namespaces are selected, and per namespace the ArchiveSource and (on
//! opt-in) the copy of the credentials Secret. Pure: the controller lists and applies.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, ResourceExt};

use super::{LABEL_MANAGED_BY, MANAGED_BY, labels, owner_ref, short_hash};
use crate::operator::crd::archive_source::{ArchiveSource, ArchiveSourceSpec};
use crate::operator::crd::archive_source_set::{
    ArchiveSourceSet, NamespaceSelector, SelectorOperator,
};
use crate::operator::crd::common::{CaBundleRef, S3Credentials, S3SecretRef};
use crate::operator::crd::common_pod::PodOverrides;

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

/// The template's CA bundle references, with the field each sits in.
fn template_ca_refs(spec: &mut ArchiveSourceSpec) -> Vec<(&'static str, &mut CaBundleRef)> {
    let mut out = Vec::new();
    if let Some(ca) = spec.archive.s3.as_mut().and_then(|s| s.ca_bundle.as_mut()) {
        out.push(("archive.s3.caBundle", ca));
    }
    if let Some(ca) = spec
        .target
        .postgres
        .as_mut()
        .and_then(|p| p.ca_bundle.as_mut())
    {
        out.push(("target.postgres.caBundle", ca));
    }
    out
}

/// The template's CA bundle references, read-only (the same fields as `template_ca_refs`).
fn template_ca_bundles(spec: &ArchiveSourceSpec) -> impl Iterator<Item = &CaBundleRef> {
    let s3 = spec.archive.s3.as_ref().and_then(|s| s.ca_bundle.as_ref());
    let postgres = spec
        .target
        .postgres
        .as_ref()
        .and_then(|p| p.ca_bundle.as_ref());
    s3.into_iter().chain(postgres)
}

/// Whether the template names the shared CA ConfigMap somewhere (else sharing it is a mistake).
pub fn template_uses_shared_ca(set: &ArchiveSourceSet) -> bool {
    let Some(name) = shared_ca_name(set) else {
        return false;
    };
    template_ca_bundles(&set.spec.template.spec)
        .any(|ca| ca.config_map.as_ref().is_some_and(|k| k.name == name))
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
    set.spec
        .template
        .spec
        .archive
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
    let mut spec = set.spec.template.spec.clone();
    if let (Some(name), Some(digest)) = (shared_ca_name(set), shared.ca.as_deref()) {
        let copy = ca_copy_name(set);
        for (_, ca) in template_ca_refs(&mut spec) {
            if let Some(k) = ca.config_map.as_mut().filter(|k| k.name == name) {
                k.name = copy.clone();
            }
        }
        spec.pod
            .get_or_insert_with(PodOverrides::default)
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(ANNOTATION_CA_DIGEST.into(), digest.into());
    }
    let digest = shared.credentials.as_deref();
    if let (true, Some(digest), Some(s3)) =
        (shares_credentials(set), digest, spec.archive.s3.as_mut())
    {
        let keys = s3.credentials.take().map(|c| c.secret_ref);
        s3.credentials = Some(S3Credentials {
            secret_ref: S3SecretRef {
                name: copy_name(set),
                access_key_id_key: keys.as_ref().and_then(|k| k.access_key_id_key.clone()),
                secret_access_key_key: keys.and_then(|k| k.secret_access_key_key),
            },
        });
        spec.pod
            .get_or_insert_with(PodOverrides::default)
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(ANNOTATION_CREDENTIALS_DIGEST.into(), digest.into());
    }
    let mut source = ArchiveSource::new(&set.name_any(), spec);
    source.metadata = meta(set, namespace, set.name_any());
    source
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
    use crate::operator::crd::archive_source_set::SelectorRequirement;

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
        n.metadata.labels = Some(super::labels(labels));
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
        let l = super::labels(&[("env", "dev"), ("team", "a")]);
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
            match_labels: Some(super::labels(&[("env", "prod")])),
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
        let mut expected = set.spec.template.spec.clone();
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
        src.metadata.labels = Some(super::labels(&[("team", "platform")]));
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
        assert_eq!(child.spec, set.spec.template.spec);
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
        src.metadata.labels = Some(super::labels(&[("argocd.argoproj.io/instance", "x")]));
        src.metadata.annotations = Some(super::labels(&[("note", "y")]));
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
        crate::operator::crd::tests::assert_golden(
            "src/operator/builders/testdata/sourceset-dev-seed.golden.yaml",
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
