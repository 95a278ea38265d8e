//! The head epoch of an ArchiveSourceSet's seed archive, read by the operator itself from the
//! store: one manifest GET per table of the restore template, once per set reconcile (never
//! once per namespace). `refresh: OnNewEpoch` restores every namespace again when it changes.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;

use crate::builders::engine_config::ResolvedArchive;
use crate::crd::common::S3Location;
use larch_archive::manifest::{Manifest, manifest_key};
use larch_archive::store::Store;
use larch_archive::store::s3::{S3Config, S3Credentials, SecretText};

/// The manifest key of every table of the resolved archive.
pub fn manifest_keys(archive: &ResolvedArchive) -> Vec<String> {
    archive
        .tables
        .iter()
        .map(|t| {
            let prefix = if archive.group {
                format!("{}{}/", archive.key_prefix, t.qualified())
            } else {
                archive.key_prefix.clone()
            };
            manifest_key(&prefix)
        })
        .collect()
}

/// Default key names of an S3 credentials Secret.
const ACCESS_KEY_ID: &str = "AWS_ACCESS_KEY_ID";
const SECRET_ACCESS_KEY: &str = "AWS_SECRET_ACCESS_KEY";

/// The store client config for the operator's read: the location's bucket and endpoint, and
/// the keys from `secret` (the data of the Secret the template names, or of the shared one),
/// else the operator's ambient identity. Errors name the missing key.
pub fn s3_config(
    s3: &S3Location,
    secret: Option<&BTreeMap<String, ByteString>>,
) -> Result<S3Config, String> {
    let mut config = S3Config::new(s3.bucket.clone(), s3.prefix.clone().unwrap_or_default());
    config.region = s3.region.clone();
    config.endpoint = s3.endpoint.clone();
    config.path_style = s3.path_style == Some(true);
    if let Some(data) = secret {
        let keys = s3.credentials.as_ref().map(|c| &c.secret_ref);
        let id_key = keys
            .and_then(|k| k.access_key_id_key.as_deref())
            .unwrap_or(ACCESS_KEY_ID);
        let secret_key = keys
            .and_then(|k| k.secret_access_key_key.as_deref())
            .unwrap_or(SECRET_ACCESS_KEY);
        let read = |key: &str| {
            data.get(key)
                .map(|v| SecretText(String::from_utf8_lossy(&v.0).trim().to_string()))
                .ok_or_else(|| format!("the S3 credentials Secret has no key {key}"))
        };
        config.credentials = S3Credentials::Static {
            access_key_id: read(id_key)?,
            secret_access_key: read(secret_key)?,
        };
    }
    Ok(config)
}

/// The greatest epoch of the tables' manifests; `None` while no table has a manifest yet.
pub async fn read_head_epoch(store: &dyn Store, keys: &[String]) -> Result<Option<i64>, String> {
    let mut head = None;
    for key in keys {
        let Some(got) = store
            .get(key)
            .await
            .map_err(|e| format!("reading {key}: {e}"))?
        else {
            continue;
        };
        let manifest = Manifest::from_slice(key, &got.bytes).map_err(|e| e.to_string())?;
        head = head.max(Some(manifest.epoch));
    }
    Ok(head)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::common::TableRef;
    use larch_archive::store::memory::MemoryStore;

    fn resolved(group: bool, tables: &[&str]) -> ResolvedArchive {
        ResolvedArchive {
            location: crate::crd::common::Location {
                s3: None,
                volume: None,
            },
            claim_name: None,
            key_prefix: "seeds/".into(),
            formats: None,
            tables: tables
                .iter()
                .map(|t| TableRef {
                    schema: None,
                    name: t.to_string(),
                })
                .collect(),
            key_fields: None,
            group,
        }
    }

    #[test]
    fn one_manifest_per_table() {
        assert_eq!(
            manifest_keys(&resolved(true, &["a", "b"])),
            [
                "seeds/public.a/manifest.json",
                "seeds/public.b/manifest.json"
            ]
        );
        assert_eq!(
            manifest_keys(&resolved(false, &["a"])),
            ["seeds/manifest.json"]
        );
    }

    #[tokio::test]
    async fn the_head_is_the_greatest_epoch_of_the_tables() {
        let store = MemoryStore::new();
        let keys = manifest_keys(&resolved(true, &["a", "b"]));
        assert_eq!(read_head_epoch(&store, &keys).await.unwrap(), None);
        for (key, epoch) in keys.iter().zip([3, 4]) {
            let mut m = Manifest::new("public.x");
            m.epoch = epoch;
            store.insert_raw(key, m.to_json());
        }
        assert_eq!(read_head_epoch(&store, &keys).await.unwrap(), Some(4));
        store.insert_raw(&keys[0], "not json");
        let err = read_head_epoch(&store, &keys).await.unwrap_err();
        assert!(err.contains("seeds/public.a/manifest.json"), "{err}");
    }

    #[test]
    fn keys_come_from_the_secret_under_the_templates_key_names() {
        let s3: S3Location = serde_json::from_value(serde_json::json!({
            "bucket": "seeds", "endpoint": "http://s3:8333", "pathStyle": true,
            "credentials": {"secretRef": {"name": "x", "accessKeyIdKey": "id"}}
        }))
        .unwrap();
        let data = BTreeMap::from([
            ("id".to_string(), ByteString(b"AKIA\n".to_vec())),
            (
                SECRET_ACCESS_KEY.to_string(),
                ByteString(b"s3cr3t".to_vec()),
            ),
        ]);
        let c = s3_config(&s3, Some(&data)).unwrap();
        assert!(c.path_style);
        assert_eq!(c.endpoint.as_deref(), Some("http://s3:8333"));
        match &c.credentials {
            S3Credentials::Static {
                access_key_id,
                secret_access_key,
            } => {
                assert_eq!(access_key_id.0, "AKIA");
                assert_eq!(secret_access_key.0, "s3cr3t");
            }
            other => panic!("{other:?}"),
        }
        assert!(!format!("{c:?}").contains("s3cr3t"), "Debug shows no key");
        let err = s3_config(&s3, Some(&BTreeMap::new())).unwrap_err();
        assert!(err.contains("no key id"), "{err}");
        assert_eq!(
            s3_config(&s3, None).unwrap().credentials,
            S3Credentials::Ambient
        );
    }
}
