//! The first step of a reconcile: what the spec names must exist before anything is built —
//! the Secrets and the keys in them (a PostgreSQL DSN, S3 access keys, CA bundles), CA
//! ConfigMaps, an existing archive claim. A missing one is a [`Missing`]: the custom resource
//! goes `Stalled` with a reason (`SecretNotFound`, `SecretKeyNotFound`, `ConfigMapNotFound`,
//! …) and a message naming the object, the key and the spec field, and the controller looks
//! again after [`RECHECK`].
//!
//! Keys are read from the Secret itself (`get`; a metadata watch does not show them): its
//! data is looked at for the key names only, never kept, logged or copied into status. An
//! operator without `get` on Secrets (RBAC trimmed by hand) skips the Secret checks; the pods
//! then report what is missing (`CreateContainerConfigError`).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Secret};
use kube::api::Api;

use crate::crd::archive_export::ArchiveExport;
use crate::crd::archive_source::ArchiveRef;
use crate::crd::common::{CaBundleRef, Location, SecretKeyRef};

/// How soon a custom resource that names something missing is looked at again.
pub const RECHECK: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ObjectKind {
    Secret,
    ConfigMap,
    PersistentVolumeClaim,
}

/// An object of the custom resource's namespace the spec names, with the keys it must hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reference {
    pub kind: ObjectKind,
    pub name: String,
    pub key: Option<String>,
    /// Where the spec names it (`spec.source.connectionSecretRef`).
    pub field: String,
}

impl Reference {
    pub(crate) fn secret(name: &str, key: &str, field: impl Into<String>) -> Reference {
        Reference {
            kind: ObjectKind::Secret,
            name: name.into(),
            key: Some(key.into()),
            field: field.into(),
        }
    }
}

/// A reference that does not resolve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Missing {
    /// The object does not exist.
    Object(Reference),
    /// The object exists without the key.
    Key(Reference),
    /// `spec.archive.exportRef` names no ArchiveExport of the namespace.
    Export { name: String },
}

impl Missing {
    pub fn reason(&self) -> &'static str {
        match self {
            Missing::Object(r) => match r.kind {
                ObjectKind::Secret => "SecretNotFound",
                ObjectKind::ConfigMap => "ConfigMapNotFound",
                ObjectKind::PersistentVolumeClaim => "ClaimNotFound",
            },
            Missing::Key(r) => match r.kind {
                ObjectKind::Secret => "SecretKeyNotFound",
                _ => "ConfigMapKeyNotFound",
            },
            Missing::Export { .. } => "ExportNotFound",
        }
    }

    pub fn message(&self, namespace: &str) -> String {
        let kind = |r: &Reference| match r.kind {
            ObjectKind::Secret => "Secret",
            ObjectKind::ConfigMap => "ConfigMap",
            ObjectKind::PersistentVolumeClaim => "PersistentVolumeClaim",
        };
        match self {
            Missing::Object(r) => format!(
                "{} {namespace}/{} (named in {}) does not exist; nothing is built until it does (checked again every {}s)",
                kind(r),
                r.name,
                r.field,
                RECHECK.as_secs()
            ),
            Missing::Key(r) => format!(
                "{} {namespace}/{} has no key {:?} (named in {}); nothing is built until it does (checked again every {}s)",
                kind(r),
                r.name,
                r.key.as_deref().unwrap_or_default(),
                r.field,
                RECHECK.as_secs()
            ),
            Missing::Export { name } => format!(
                "ArchiveExport {namespace}/{name} (named in spec.archive.exportRef) does not exist; the engines start once it does"
            ),
        }
    }
}

pub(crate) fn ca_reference(ca: &CaBundleRef, field: &str) -> Option<Reference> {
    match (&ca.config_map, &ca.secret) {
        (Some(cm), _) => Some(Reference {
            kind: ObjectKind::ConfigMap,
            name: cm.name.clone(),
            key: Some(cm.key.clone()),
            field: format!("{field}.configMap"),
        }),
        (None, Some(s)) => Some(Reference::secret(
            &s.name,
            &s.key,
            format!("{field}.secret"),
        )),
        (None, None) => None,
    }
}

/// What a location needs: the S3 credentials and CA bundle, an existing claim. `field` is
/// where the location is in the spec (`spec.destination`).
pub(crate) fn location_references(location: &Location, field: &str) -> Vec<Reference> {
    let mut out = vec![];
    if let Some(s3) = &location.s3 {
        if let Some(c) = &s3.credentials {
            let r = &c.secret_ref;
            let f = format!("{field}.s3.credentials.secretRef");
            out.push(Reference::secret(&r.name, r.access_key_id_key(), &f));
            out.push(Reference::secret(&r.name, r.secret_access_key_key(), &f));
        }
        if let Some(ca) = &s3.ca_bundle {
            out.extend(ca_reference(ca, &format!("{field}.s3.caBundle")));
        }
    }
    if let Some(claim) = location.volume.as_ref().and_then(|v| v.claim_name.as_ref()) {
        out.push(Reference {
            kind: ObjectKind::PersistentVolumeClaim,
            name: claim.clone(),
            key: None,
            field: format!("{field}.volume.claimName"),
        });
    }
    out
}

/// What reading an archive needs: with `exportRef` the export's location (`export`), named as
/// its field.
pub(crate) fn archive_references(
    archive: &ArchiveRef,
    export: Option<&ArchiveExport>,
) -> Vec<Reference> {
    match (&archive.export_ref, export) {
        (Some(r), Some(e)) => location_references(
            &e.spec.destination,
            &format!("spec.destination of ArchiveExport {}", r.name),
        ),
        _ => archive
            .location()
            .map(|l| location_references(&l, "spec.archive"))
            .unwrap_or_default(),
    }
}

/// A PostgreSQL target's DSN Secret key and CA bundle (`spec.target.postgres`).
pub(crate) fn target_references(secret: &SecretKeyRef, ca: Option<&CaBundleRef>) -> Vec<Reference> {
    let mut out = vec![Reference::secret(
        &secret.name,
        &secret.key,
        "spec.target.postgres.connectionSecretRef",
    )];
    if let Some(ca) = ca {
        out.extend(ca_reference(ca, "spec.target.postgres.caBundle"));
    }
    out
}

/// The key names of an object, `None` when it does not exist. A Secret the operator may not
/// read (403) counts as present with every key.
async fn keys_of(
    client: &kube::Client,
    namespace: &str,
    kind: ObjectKind,
    name: &str,
) -> Result<Option<Option<Vec<String>>>, kube::Error> {
    match kind {
        ObjectKind::Secret => {
            match Api::<Secret>::namespaced(client.clone(), namespace)
                .get_opt(name)
                .await
            {
                // Only the key names leave this function; the values are dropped here.
                Ok(s) => Ok(s.map(|s| Some(s.data.unwrap_or_default().into_keys().collect()))),
                Err(kube::Error::Api(e)) if e.code == 403 => {
                    tracing::debug!(namespace, name, "no get on Secrets: not checking it");
                    Ok(Some(None))
                }
                Err(e) => Err(e),
            }
        }
        ObjectKind::ConfigMap => Ok(Api::<ConfigMap>::namespaced(client.clone(), namespace)
            .get_opt(name)
            .await?
            .map(|c| {
                let mut keys: Vec<String> = c.data.unwrap_or_default().into_keys().collect();
                keys.extend(c.binary_data.unwrap_or_default().into_keys());
                Some(keys)
            })),
        ObjectKind::PersistentVolumeClaim => Ok(Api::<PersistentVolumeClaim>::namespaced(
            client.clone(),
            namespace,
        )
        .get_opt(name)
        .await?
        .map(|_| Some(vec![]))),
    }
}

/// Resolves `references` in `namespace` (one read per object), in order: the first that does
/// not resolve, or `None`.
pub async fn check(
    client: &kube::Client,
    namespace: &str,
    references: &[Reference],
) -> Result<Option<Missing>, kube::Error> {
    let mut seen: BTreeMap<(ObjectKind, &str), Option<Option<Vec<String>>>> = BTreeMap::new();
    for r in references {
        let keys = match seen.get(&(r.kind, r.name.as_str())) {
            Some(k) => k.clone(),
            None => {
                let k = keys_of(client, namespace, r.kind, &r.name).await?;
                seen.insert((r.kind, r.name.as_str()), k.clone());
                k
            }
        };
        match (keys, &r.key) {
            (None, _) => return Ok(Some(Missing::Object(r.clone()))),
            (Some(Some(keys)), Some(key)) if !keys.contains(key) => {
                return Ok(Some(Missing::Key(r.clone())));
            }
            _ => {}
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builders::tests::{export_fixture, source_fixture};
    use crate::export::dereference::export_references;
    use crate::source::dereference::source_references;

    #[test]
    fn an_export_names_its_dsn_credentials_and_cas() {
        let e = export_fixture("export-oneshot-s3");
        let refs = export_references(&e);
        let described: Vec<String> = refs
            .iter()
            .map(|r| format!("{:?} {} {:?} {}", r.kind, r.name, r.key, r.field))
            .collect();
        assert!(
            described[0].starts_with("Secret ")
                && described[0].ends_with("spec.source.connectionSecretRef"),
            "{described:?}"
        );
        assert!(
            described
                .iter()
                .any(|d| d.contains("spec.destination.s3.credentials.secretRef")),
            "{described:?}"
        );
    }

    #[test]
    fn messages_name_the_object_the_key_and_the_field() {
        let r = Reference::secret("pg-source", "dsn", "spec.source.connectionSecretRef");
        let m = Missing::Key(r.clone());
        assert_eq!(m.reason(), "SecretKeyNotFound");
        let text = m.message("data");
        assert!(
            text.contains("Secret data/pg-source has no key \"dsn\"")
                && text.contains("spec.source.connectionSecretRef"),
            "{text}"
        );
        let m = Missing::Object(r);
        assert_eq!(m.reason(), "SecretNotFound");
        assert!(m.message("data").starts_with(
            "Secret data/pg-source (named in spec.source.connectionSecretRef) does not exist"
        ));
        let m = Missing::Export {
            name: "users".into(),
        };
        assert_eq!(m.reason(), "ExportNotFound");
    }

    #[test]
    fn a_masked_export_names_its_hash_key() {
        let mut e = crate::builders::tests::export_fixture("export-oneshot-s3");
        let plain = export_references(&e).len();
        e.spec.transform = serde_saphyr::from_str(
            "tables:\n  public.users:\n    columns: {id: hash}\nkeySecretRef: {name: seed-key, key: hmac}",
        )
        .unwrap();
        let refs = export_references(&e);
        assert_eq!(refs.len(), plain + 1);
        let key = refs.last().unwrap();
        assert_eq!(
            (
                key.kind,
                key.name.as_str(),
                key.key.as_deref(),
                key.field.as_str()
            ),
            (
                ObjectKind::Secret,
                "seed-key",
                Some("hmac"),
                "spec.transform.keySecretRef"
            )
        );
        assert!(Missing::Object(key.clone()).message("data").starts_with(
            "Secret data/seed-key (named in spec.transform.keySecretRef) does not exist"
        ));
    }

    #[test]
    fn a_source_names_its_store_and_target_credentials_and_cas() {
        let s = source_fixture("source-s3-postgres");
        let refs: Vec<(ObjectKind, String, Option<String>, String)> = source_references(&s, None)
            .into_iter()
            .map(|r| (r.kind, r.name, r.key, r.field))
            .collect();
        let secret = |n: &str, k: &str, f: &str| {
            (
                ObjectKind::Secret,
                n.to_string(),
                Some(k.to_string()),
                f.to_string(),
            )
        };
        assert_eq!(
            refs,
            [
                secret(
                    "s3-credentials",
                    "id",
                    "spec.archive.s3.credentials.secretRef"
                ),
                secret(
                    "s3-credentials",
                    "secret",
                    "spec.archive.s3.credentials.secretRef"
                ),
                secret("seaweed-ca", "tls.crt", "spec.archive.s3.caBundle.secret"),
                secret(
                    "pg-target",
                    "dsn",
                    "spec.target.postgres.connectionSecretRef"
                ),
                secret(
                    "pg-target-ca",
                    "ca.pem",
                    "spec.target.postgres.caBundle.secret"
                ),
            ]
        );
    }
}
