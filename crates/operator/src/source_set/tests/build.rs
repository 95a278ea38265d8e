//! What the ArchiveSourceSet builds: its ArchiveSources, ArchiveRestores and Secret copies;
//! fixtures the controller tests use.

use super::*;
use crate::crd::archive_source_set::SelectorRequirement;

fn creds(digest: &str) -> SharedDigests {
    SharedDigests {
        credentials: Some(digest.into()),
        ca: None,
    }
}

pub(crate) fn set_fixture(share: bool) -> ArchiveSourceSet {
    let mut v: serde_json::Value = serde_saphyr::from_str(
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
        n.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::UNIX_EPOCH,
        ));
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
        serde_saphyr::to_string(&child_source(&set, "dev-a", &creds(&digest))).unwrap(),
        serde_saphyr::to_string(&secret_copy(&set, "dev-a", &src)).unwrap(),
        serde_saphyr::to_string(&child_source(
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
    serde_saphyr::from_str(&format!(
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
        serde_saphyr::to_string(&child_restore(&set, "dev-a", &shared, "epoch-3")).unwrap()
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
