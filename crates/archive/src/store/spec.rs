//! Where an archive lives, as users write it (CLI flags, engine config): a store type and its
//! options. Credentials are never part of it: S3 uses the ambient chain (environment, web
//! identity) or key files.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::Store;
use super::local::LocalStore;
use super::s3::{S3Config, S3Credentials, S3Store};
use crate::error::{ArchiveError, Result};

/// The store types: `type: local` or `type: s3` in a config, `--store local|s3` on a command
/// line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase", try_from = "String")]
pub enum StoreKind {
    #[default]
    Local,
    S3,
}

impl StoreKind {
    pub fn as_str(self) -> &'static str {
        match self {
            StoreKind::Local => "local",
            StoreKind::S3 => "s3",
        }
    }
}

impl TryFrom<String> for StoreKind {
    type Error = String;

    /// Keeps the message users have seen: the bad value and the valid ones.
    fn try_from(value: String) -> std::result::Result<StoreKind, String> {
        use clap::ValueEnum;
        StoreKind::value_variants()
            .iter()
            .copied()
            .find(|k| k.as_str() == value)
            .ok_or_else(|| format!("unknown type {value:?} (expected local or s3)"))
    }
}

/// What a validated spec opens.
enum Location<'a> {
    Local(&'a Path),
    S3(S3Config),
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSpec {
    #[serde(rename = "type")]
    pub kind: StoreKind,
    /// Local root directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<String>,
    /// S3 destination prefix, prepended verbatim to every key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub path_style: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_key_id_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_access_key_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_token_file: Option<PathBuf>,
    /// PEM CA bundle trusted for an `https` endpoint (default: `AWS_CA_BUNDLE`, else the
    /// system roots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
}

impl StoreSpec {
    pub fn local(path: impl Into<PathBuf>) -> StoreSpec {
        StoreSpec {
            kind: StoreKind::Local,
            path: Some(path.into()),
            ..Default::default()
        }
    }

    /// Checks the options without touching the store; errors name the field.
    pub fn validate(&self) -> Result<()> {
        self.location().map(drop)
    }

    /// The local root or the S3 options of the spec; errors name the field.
    fn location(&self) -> Result<Location<'_>> {
        match self.kind {
            StoreKind::Local => match &self.path {
                Some(root) if !root.as_os_str().is_empty() => Ok(Location::Local(root)),
                _ => Err(ArchiveError::Invalid(
                    "store: type local requires `path`".into(),
                )),
            },
            StoreKind::S3 => {
                if self.bucket.as_ref().is_none_or(|b| b.is_empty()) {
                    return Err(ArchiveError::Invalid(
                        "store: type s3 requires `bucket`".into(),
                    ));
                }
                self.s3_config().map(Location::S3)
            }
        }
    }

    /// The S3 options of the spec; errors name the field.
    pub fn s3_config(&self) -> Result<S3Config> {
        let spec = self;
        let credentials = match (
            &spec.access_key_id_file,
            &spec.secret_access_key_file,
            &spec.session_token_file,
        ) {
            (Some(id), Some(secret), token) => S3Credentials::Files {
                access_key_id_file: id.clone(),
                secret_access_key_file: secret.clone(),
                session_token_file: token.clone(),
            },
            (None, None, None) => S3Credentials::Ambient,
            (None, None, Some(_)) => {
                return Err(ArchiveError::Invalid(
                    "store: `session_token_file` needs `access_key_id_file` and `secret_access_key_file`"
                        .into(),
                ));
            }
            _ => {
                return Err(ArchiveError::Invalid(
                    "store: `access_key_id_file` and `secret_access_key_file` go together".into(),
                ));
            }
        };
        Ok(S3Config {
            bucket: spec.bucket.clone().unwrap_or_default(),
            prefix: spec.prefix.clone().unwrap_or_default(),
            region: spec.region.clone(),
            endpoint: spec.endpoint.clone(),
            path_style: spec.path_style,
            credentials,
            ca_file: spec.ca_file.clone(),
        })
    }

    /// Opens the store for writing (a local root is created when missing).
    pub async fn open(&self) -> Result<Arc<dyn Store>> {
        self.open_as(true).await
    }

    /// Opens the store for readers: creates nothing (a missing local root reads as empty).
    pub async fn open_for_reading(&self) -> Result<Arc<dyn Store>> {
        self.open_as(false).await
    }

    async fn open_as(&self, writer: bool) -> Result<Arc<dyn Store>> {
        Ok(match self.location()? {
            Location::Local(root) if writer => Arc::new(LocalStore::new(root)?),
            Location::Local(root) => Arc::new(LocalStore::for_reading(root)?),
            Location::S3(config) => Arc::new(S3Store::new(config).await?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn specs_map_to_configs() {
        let mut spec = StoreSpec {
            kind: StoreKind::S3,
            bucket: Some("b".into()),
            prefix: Some("p/".into()),
            endpoint: Some("http://127.0.0.1:9".into()),
            path_style: true,
            ..Default::default()
        };
        let cfg = spec.s3_config().unwrap();
        assert_eq!(cfg.credentials, S3Credentials::Ambient);
        assert_eq!((cfg.bucket.as_str(), cfg.prefix.as_str()), ("b", "p/"));
        assert!(cfg.path_style);
        let s = S3Store::new(spec.s3_config().unwrap()).await.unwrap();
        assert_eq!(s.name(), "s3://b/p/");

        spec.session_token_file = Some("/t".into());
        let err = spec.s3_config().unwrap_err();
        assert!(err.to_string().contains("session_token_file"), "{err}");
        spec.access_key_id_file = Some("/id".into());
        spec.secret_access_key_file = Some("/secret".into());
        assert_eq!(
            spec.s3_config().unwrap().credentials,
            S3Credentials::Files {
                access_key_id_file: "/id".into(),
                secret_access_key_file: "/secret".into(),
                session_token_file: Some("/t".into()),
            }
        );
    }
}
