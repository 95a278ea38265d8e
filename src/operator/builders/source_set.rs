//! ArchiveSourceSet → which namespaces are selected, and per namespace the ArchiveSource and (on
//! opt-in) the copy of the credentials Secret. Pure: the controller lists and applies.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, ResourceExt};

use super::{LABEL_MANAGED_BY, MANAGED_BY, labels, owner_ref, short_hash};
use crate::operator::crd::archive_source::ArchiveSource;
use crate::operator::crd::archive_source_set::{
    ArchiveSourceSet, NamespaceSelector, SelectorOperator,
};
use crate::operator::crd::common::{S3Credentials, S3SecretRef};
use crate::operator::crd::common_pod::PodOverrides;

/// Label on every object a set manages (its ArchiveSources and Secret copies): the set's name.
pub const LABEL_SOURCE_SET: &str = "larch.dev/source-set";
/// Annotation on a Secret copy naming its source (`namespace/name`).
pub const ANNOTATION_COPIED_FROM: &str = "larch.dev/copied-from";
/// Pod annotation on the engines: a digest of the shared credentials, so a rotation restarts
/// them with the new keys (they read the keys from the environment at start).
pub const ANNOTATION_CREDENTIALS_DIGEST: &str = "larch.dev/credentials-digest";

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

/// The ArchiveSource of `namespace`. With shared credentials (`digest` of the copied data),
/// the template's S3 credentials point at the copy and the engines carry the digest.
pub fn child_source(
    set: &ArchiveSourceSet,
    namespace: &str,
    digest: Option<&str>,
) -> ArchiveSource {
    let mut spec = set.spec.template.spec.clone();
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

/// Whether `obj` is owned by `set` (same uid): only those are updated or deleted; an object of
/// the same name that someone else made is a conflict.
pub fn owned_by<K: Resource>(obj: &K, set: &ArchiveSourceSet) -> bool {
    let uid = set.uid();
    obj.meta()
        .owner_references
        .iter()
        .flatten()
        .any(|r| Some(&r.uid) == uid.as_ref() && r.kind == "ArchiveSourceSet")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::operator::crd::archive_source_set::SelectorRequirement;

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
        let child = child_source(&set, "dev-a", Some("abc123"));
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

    #[test]
    fn without_opt_in_the_template_is_used_as_is() {
        let set = set_fixture(false);
        let child = child_source(&set, "dev-a", Some("ignored"));
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
            serde_yaml_ng::to_string(&child_source(&set, "dev-a", Some(&digest))).unwrap(),
            serde_yaml_ng::to_string(&secret_copy(&set, "dev-a", &src)).unwrap(),
            serde_yaml_ng::to_string(&child_source(&set_fixture(false), "dev-a", None)).unwrap(),
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
