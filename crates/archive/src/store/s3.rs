//! S3 store (aws-sdk-s3), laredo's `type = s3` destination (spec §4.3) under larch's rules:
//!
//! * full object key = destination `prefix` + key (verbatim concatenation), URI
//!   `s3://<bucket>/<full key>`; keys are checked like every other store's (`check_key`);
//! * revision = the ETag as returned, including its quotes;
//! * `put_cas`: `If-None-Match: *` (must not exist) or `If-Match: <etag>`; 412 / `PreconditionFailed`
//!   and a 404 on `If-Match` are conflicts, 409 `ConditionalRequestConflict` is retried (rule W5);
//! * uploads stream: one `PutObject` below [`PART_SIZE`], a multipart upload in `PART_SIZE` parts
//!   above it, so a writer holds at most one part in memory;
//! * reads stream (`open`) without buffering the object (rule R8);
//! * checksums only "when required": the SDK's default CRC32 trailers with aws-chunked encoding are
//!   mishandled by many S3-compatible servers;
//! * construction is network-free: credentials resolve lazily at the first request, the region
//!   comes from the config, the environment or the shared config files (never from IMDS).

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use aws_config::BehaviorVersion;
use aws_config::environment::EnvironmentVariableRegionProvider;
use aws_config::meta::region::RegionProviderChain;
use aws_config::profile::ProfileFileRegionProvider;
use aws_sdk_s3::Client;
use aws_sdk_s3::config::{
    Credentials, Region, RequestChecksumCalculation, ResponseChecksumValidation,
};
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use bytes::Bytes;
use chrono::{DateTime, Utc};

use super::{
    GetResult, ObjectInfo, ObjectReader, ObjectWriter, Store, check_key, check_key_prefix,
};
use crate::error::{ArchiveError, Result};

mod multipart;
mod parted;
mod shared;
mod upload;

use upload::S3Writer;

/// Size of one multipart part, and the largest object written with a single `PutObject`.
pub const PART_SIZE: usize = 8 * 1024 * 1024;

/// How often a `put_cas` answered 409 `ConditionalRequestConflict` is retried before it is
/// reported as a conflict.
const CONFLICT_RETRIES: u32 = 4;

/// Region used when neither the config, the environment nor the shared config names one
/// (S3-compatible servers ignore it, but SigV4 needs one).
const FALLBACK_REGION: &str = "us-east-1";

/// Where the S3 credentials come from. Secrets never appear in configuration literally.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum S3Credentials {
    /// The SDK's default chain: `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`, web identity (IRSA),
    /// profiles, SSO, container and instance roles.
    #[default]
    Ambient,
    /// Static credentials read from files (for example a mounted Kubernetes Secret), once, when
    /// the store is built.
    Files {
        access_key_id_file: PathBuf,
        secret_access_key_file: PathBuf,
        session_token_file: Option<PathBuf>,
    },
    /// Static credentials already read (the operator's, from a Secret it was given).
    Static {
        access_key_id: SecretText,
        secret_access_key: SecretText,
    },
}

/// A credential in memory: its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretText(pub String);

impl fmt::Debug for SecretText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Config {
    pub bucket: String,
    /// Destination prefix, concatenated verbatim before every key (`archives/` or empty).
    pub prefix: String,
    /// `None`: `AWS_REGION`/`AWS_DEFAULT_REGION`, then the shared config, then `us-east-1`.
    pub region: Option<String>,
    /// Endpoint of an S3-compatible server (`http://127.0.0.1:8333`); `None`: AWS.
    pub endpoint: Option<String>,
    /// Path-style addressing (`endpoint/bucket/key`), which most S3-compatible servers need.
    pub path_style: bool,
    pub credentials: S3Credentials,
    /// PEM CA bundle the client trusts for an `https` endpoint instead of the system roots (a
    /// private CA). `None`: the file `AWS_CA_BUNDLE` names, if set, else the system roots.
    pub ca_file: Option<PathBuf>,
}

impl S3Config {
    /// Ambient credentials, default region, AWS endpoint.
    pub fn new(bucket: impl Into<String>, prefix: impl Into<String>) -> S3Config {
        S3Config {
            bucket: bucket.into(),
            prefix: prefix.into(),
            region: None,
            endpoint: None,
            path_style: false,
            credentials: S3Credentials::Ambient,
            ca_file: None,
        }
    }
}

#[derive(Clone)]
pub struct S3Store {
    client: Client,
    bucket: String,
    prefix: String,
    /// The configured endpoint (an S3-compatible server), named in errors of calls that got
    /// no answer.
    endpoint: Option<String>,
}

impl fmt::Debug for S3Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The client's config holds credentials: never print it.
        f.debug_struct("S3Store")
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

fn read_secret_file(what: &str, path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ArchiveError::io(format!("reading S3 {what} from {}", path.display()), e))?;
    let value = text.trim();
    if value.is_empty() {
        return Err(ArchiveError::Invalid(format!(
            "S3 {what} file {} is empty",
            path.display()
        )));
    }
    refuse_control_characters(&format!("S3 {what} file {}", path.display()), value)?;
    Ok(value.to_string())
}

/// A credential with a line break or another control character makes the SDK panic while it
/// signs a request (`InvalidHeaderValue`): refused up front instead, naming where it came
/// from and never what it is.
/// The variable other AWS SDKs and the AWS CLI read for a CA bundle (aws-sdk-rust does not).
pub const CA_BUNDLE_ENV: &str = "AWS_CA_BUNDLE";

/// An HTTPS client trusting exactly the certificates of the PEM file at `path`. The file is
/// checked here (the connector would panic on a bad one later): unreadable, not PEM, or no
/// usable certificate is an error naming the file.
fn https_client_trusting(path: &Path) -> Result<aws_sdk_s3::config::SharedHttpClient> {
    use aws_smithy_http_client::tls::{self, TlsContext, TrustStore};
    let bundle = larch_core::tls::read_ca_bundle("S3 CA bundle", path)
        .map_err(|e| ArchiveError::Invalid(e.to_string()))?;
    let what = format!("S3 CA bundle {}", path.display());
    if bundle.unusable > 0 {
        // the connector would panic on it later
        return Err(ArchiveError::Invalid(format!(
            "{what}: {} usable CA certificate(s), {} unusable; it needs no unusable one",
            bundle.roots.len(),
            bundle.unusable
        )));
    }
    let context = TlsContext::builder()
        .with_trust_store(TrustStore::empty().with_pem_certificate(bundle.pem))
        .build()
        .map_err(|e| ArchiveError::Invalid(format!("{what}: {e}")))?;
    Ok(aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::Ring,
        ))
        .tls_context(context)
        .build_https())
}

fn refuse_control_characters(source: &str, value: &str) -> Result<()> {
    if value.chars().any(|c| c.is_control()) {
        return Err(ArchiveError::Invalid(format!(
            "{source} holds a line break or another control character (a trailing newline from \
             a file or a Secret?); credentials are one line of printable text"
        )));
    }
    Ok(())
}

/// The environment's static credentials, when set, checked as the SDK's default chain would
/// read them.
fn check_ambient_credentials() -> Result<()> {
    for var in [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
    ] {
        if let Some(value) = std::env::var_os(var) {
            refuse_control_characters(var, &value.to_string_lossy())?;
        }
    }
    Ok(())
}

/// Refuses a destination without a bucket or with a prefix outside the key rules.
fn check_destination(bucket: &str, prefix: &str) -> Result<()> {
    if bucket.is_empty() {
        return Err(ArchiveError::Invalid(
            "S3 destination: bucket is required".into(),
        ));
    }
    check_key_prefix(prefix).map_err(|_| {
        ArchiveError::Invalid(format!(
            "S3 destination s3://{bucket}: prefix {prefix:?} must not start with '/' or contain '.', '..' or empty segments"
        ))
    })
}

/// `loader` with the credentials of `credentials`: static ones read now, ambient ones checked.
fn with_credentials(
    mut loader: aws_config::ConfigLoader,
    credentials: &S3Credentials,
) -> Result<aws_config::ConfigLoader> {
    match credentials {
        S3Credentials::Ambient => check_ambient_credentials()?,
        S3Credentials::Files {
            access_key_id_file,
            secret_access_key_file,
            session_token_file,
        } => {
            let id = read_secret_file("access key id", access_key_id_file)?;
            let secret = read_secret_file("secret access key", secret_access_key_file)?;
            let token = session_token_file
                .as_deref()
                .map(|p| read_secret_file("session token", p))
                .transpose()?;
            loader = loader.credentials_provider(Credentials::new(
                id,
                secret,
                token,
                None,
                "larch-files",
            ));
        }
        S3Credentials::Static {
            access_key_id,
            secret_access_key,
        } => {
            loader = loader.credentials_provider(Credentials::new(
                access_key_id.0.clone(),
                secret_access_key.0.clone(),
                None,
                None,
                "larch-static",
            ));
        }
    }
    Ok(loader)
}

impl S3Store {
    /// Builds the client without touching the network.
    pub async fn new(config: S3Config) -> Result<S3Store> {
        let S3Config {
            bucket,
            prefix,
            region,
            endpoint,
            path_style,
            credentials,
            ca_file,
        } = config;
        check_destination(&bucket, &prefix)?;
        let mut loader = aws_config::defaults(BehaviorVersion::latest());
        loader = match region {
            Some(r) if !r.is_empty() => loader.region(Region::new(r)),
            _ => loader.region(
                RegionProviderChain::first_try(EnvironmentVariableRegionProvider::new())
                    .or_else(ProfileFileRegionProvider::new())
                    .or_else(Region::from_static(FALLBACK_REGION)),
            ),
        };
        loader = with_credentials(loader, &credentials)?;
        let ca_file = ca_file.or_else(|| {
            std::env::var_os(CA_BUNDLE_ENV)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        });
        if let Some(path) = &ca_file {
            loader = loader.http_client(https_client_trusting(path)?);
        }
        let sdk = loader.load().await;

        let mut s3 = aws_sdk_s3::config::Builder::from(&sdk)
            .force_path_style(path_style)
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired);
        let endpoint = endpoint.filter(|e| !e.is_empty());
        if let Some(ep) = &endpoint {
            s3 = s3.endpoint_url(ep);
        }
        Ok(S3Store {
            client: Client::from_conf(s3.build()),
            bucket,
            prefix,
            endpoint,
        })
    }

    /// The underlying SDK client (tests and tools that need bucket-level calls).
    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn full_key(&self, key: &str) -> Result<String> {
        check_key(key)?;
        Ok(format!("{}{}", self.prefix, key))
    }

    /// The error of a failed call: the operation, HTTP status, code and message (or what kept
    /// the request from an answer), short enough for a log line or `/status`; the SDK's whole
    /// error structure goes to the debug log only.
    fn storage_error<E>(
        &self,
        key: &str,
        op: &str,
        err: SdkError<E, aws_sdk_s3::config::http::HttpResponse>,
    ) -> ArchiveError
    where
        E: std::error::Error + ProvideErrorMetadata + Send + Sync + 'static,
    {
        tracing::debug!(key = %self.uri(key), op, error = %DisplayErrorContext(&err), "S3 call failed");
        // The URI names the bucket; a request that got no answer also names where it went.
        let at = match (&err, &self.endpoint) {
            (SdkError::ServiceError(_), _) | (_, None) => String::new(),
            (_, Some(ep)) => format!(" (endpoint {})", without_userinfo(ep)),
        };
        ArchiveError::storage(self.uri(key), format!("S3 {op}{at}: {}", summary(&err)))
    }
}

/// An endpoint URL without any `user:password@` (never printed).
fn without_userinfo(endpoint: &str) -> String {
    match endpoint.split_once("://") {
        Some((scheme, rest)) => {
            let host_start = rest.find('/').unwrap_or(rest.len());
            match rest[..host_start].rfind('@') {
                Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
                None => endpoint.to_string(),
            }
        }
        None => endpoint.to_string(),
    }
}

/// A failed call in a line: `HTTP 404 NoSuchBucket: The specified bucket does not exist`, or for
/// a request that got no answer the chain of causes (`dispatch failure: io error: … Connection
/// refused (os error 111)`), each cause once and cut to a sane length.
fn summary<E>(err: &SdkError<E, aws_sdk_s3::config::http::HttpResponse>) -> String
where
    E: std::error::Error + ProvideErrorMetadata + 'static,
{
    if let SdkError::ServiceError(service) = err {
        let http = format!("HTTP {}", service.raw().status().as_u16());
        let e = service.err();
        return match (e.code(), e.message()) {
            (Some(code), Some(msg)) => format!("{http} {code}: {msg}"),
            (Some(code), None) => format!("{http} {code}"),
            (None, Some(msg)) => format!("{http}: {msg}"),
            (None, None) => http,
        };
    }
    let mut parts: Vec<String> = Vec::new();
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(c) = cause {
        let text: String = c.to_string().chars().take(200).collect();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        cause = c.source();
    }
    if let Some(code) = status(err) {
        parts.push(format!("HTTP {code}"));
    }
    parts.join(": ")
}

/// HTTP status of a failed call, when the server answered.
fn status<E>(err: &SdkError<E, aws_sdk_s3::config::http::HttpResponse>) -> Option<u16> {
    err.raw_response().map(|r| r.status().as_u16())
}

fn code_is<E: ProvideErrorMetadata>(err: &E, code: &str) -> bool {
    err.code().is_some_and(|c| c.eq_ignore_ascii_case(code))
}

/// The object is absent: `NoSuchKey`, `NotFound` (HEAD-style answers without a body), or a bare
/// 404. A 404 with another code (`NoSuchBucket`) is a hard error: a missing bucket is not an
/// empty archive.
fn is_not_found<E: ProvideErrorMetadata>(
    err: &SdkError<E, aws_sdk_s3::config::http::HttpResponse>,
) -> bool {
    match err.code() {
        Some(c) => c.eq_ignore_ascii_case("NoSuchKey") || c.eq_ignore_ascii_case("NotFound"),
        None => status(err) == Some(404),
    }
}

fn to_chrono(t: &aws_smithy_types::DateTime) -> Option<DateTime<Utc>> {
    DateTime::<Utc>::from_timestamp(t.secs(), t.subsec_nanos())
}

fn etag_of(store: &S3Store, key: &str, op: &str, etag: Option<String>) -> Result<String> {
    match etag {
        Some(e) if !e.is_empty() => Ok(e),
        _ => Err(ArchiveError::storage(
            store.uri(key),
            format!("S3 {op}: the response carries no ETag"),
        )),
    }
}

#[async_trait]
impl Store for S3Store {
    fn name(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.prefix)
    }

    fn uri(&self, key: &str) -> String {
        format!("s3://{}/{}{}", self.bucket, self.prefix, key)
    }

    async fn get(&self, key: &str) -> Result<Option<GetResult>> {
        let full = self.full_key(key)?;
        let out = match self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(&full)
            .send()
            .await
        {
            Ok(out) => out,
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(self.storage_error(key, "GetObject", e)),
        };
        let revision = etag_of(self, key, "GetObject", out.e_tag)?;
        let limit = super::max_get_bytes();
        if let Some(size) = out.content_length {
            super::check_get_size(key, size.max(0) as u64, limit)?;
        }
        // Chunk by chunk, so a body longer than its announced length is cut at the cap too.
        let mut body = out.body;
        let mut bytes = bytes::BytesMut::new();
        while let Some(chunk) = body
            .try_next()
            .await
            .map_err(|e| ArchiveError::storage(self.uri(key), e))?
        {
            bytes.extend_from_slice(&chunk);
            super::check_get_size(key, bytes.len() as u64, limit)?;
        }
        Ok(Some(GetResult {
            bytes: bytes.freeze(),
            revision,
        }))
    }

    async fn open(&self, key: &str) -> Result<Option<ObjectReader>> {
        let full = self.full_key(key)?;
        match self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(&full)
            .send()
            .await
        {
            Ok(out) => Ok(Some(Box::pin(out.body.into_async_read()))),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(self.storage_error(key, "GetObject", e)),
        }
    }

    async fn create(&self, key: &str) -> Result<Box<dyn ObjectWriter>> {
        let full_key = self.full_key(key)?;
        Ok(Box::new(S3Writer::new(self.clone(), key, full_key)))
    }

    fn shared_uploads(&self) -> Option<&dyn super::SharedUploads> {
        Some(self)
    }

    async fn create_parted_native(
        &self,
        key: &str,
        parts: usize,
    ) -> Result<Option<Box<dyn super::parted::PartedUpload>>> {
        parted::create(self, key, parts).await.map(Some)
    }

    async fn put_cas(&self, key: &str, bytes: Bytes, expected: &str) -> Result<String> {
        let full = self.full_key(key)?;
        let mut attempt = 0;
        loop {
            let mut req = self
                .client
                .put_object()
                .bucket(&self.bucket)
                .key(&full)
                .body(ByteStream::from(bytes.clone()));
            req = if expected.is_empty() {
                req.if_none_match("*")
            } else {
                req.if_match(expected)
            };
            let err = match req.send().await {
                Ok(out) => return etag_of(self, key, "PutObject", out.e_tag),
                Err(e) => e,
            };
            let conflict = || ArchiveError::CasConflict { key: self.uri(key) };
            let code = status(&err);
            if code == Some(412) || code_is(&err, "PreconditionFailed") {
                return Err(conflict());
            }
            // AWS answers 404 NoSuchKey to If-Match on a missing key (SeaweedFS answers 412).
            if !expected.is_empty() && is_not_found(&err) {
                return Err(conflict());
            }
            if code == Some(409) || code_is(&err, "ConditionalRequestConflict") {
                if attempt >= CONFLICT_RETRIES {
                    return Err(conflict());
                }
                let backoff = 50u64 << attempt;
                let jitter = rand::random::<u64>() % backoff;
                tokio::time::sleep(Duration::from_millis(backoff + jitter)).await;
                attempt += 1;
                continue;
            }
            return Err(self.storage_error(key, "conditional PutObject", err));
        }
    }

    async fn delete(&self, key: &str) -> Result<()> {
        let full = self.full_key(key)?;
        match self
            .client
            .delete_object()
            .bucket(&self.bucket)
            .key(&full)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(self.storage_error(key, "DeleteObject", e)),
        }
    }

    async fn head(&self, key: &str) -> Result<Option<ObjectInfo>> {
        let full = self.full_key(key)?;
        match self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(&full)
            .send()
            .await
        {
            Ok(out) => Ok(Some(ObjectInfo {
                key: key.to_string(),
                size: out.content_length().unwrap_or(0).max(0) as u64,
                modified: out.last_modified().and_then(to_chrono),
            })),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(self.storage_error(key, "HeadObject", e)),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        check_key_prefix(prefix)?;
        let full_prefix = format!("{}{}", self.prefix, prefix);
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let page = self
                .client
                .list_objects_v2()
                .bucket(&self.bucket)
                .prefix(&full_prefix)
                .set_continuation_token(token.take())
                .send()
                .await
                .map_err(|e| self.storage_error(prefix, "ListObjectsV2", e))?;
            for obj in page.contents() {
                let Some(full) = obj.key() else { continue };
                let Some(rel) = full.strip_prefix(&self.prefix) else {
                    continue;
                };
                out.push(ObjectInfo {
                    key: rel.to_string(),
                    size: obj.size().unwrap_or(0).max(0) as u64,
                    modified: obj.last_modified().and_then(to_chrono),
                });
            }
            match page.next_continuation_token() {
                Some(t) if page.is_truncated() == Some(true) => token = Some(t.to_string()),
                _ => break,
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
