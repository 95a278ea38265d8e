//! [`SharedUploads`] on S3: multipart uploads named by their id, so a split export's worker
//! processes upload parts of the one snapshot object its coordinator started and completes.

use async_trait::async_trait;
use aws_sdk_s3::types::CompletedPart;
use bytes::Bytes;

use super::S3Store;
use super::multipart::Multipart;
use crate::error::Result;
use crate::store::{SharedUploads, UploadInProgress, check_key_prefix};

impl S3Store {
    fn multipart(&self, key: &str, upload_id: &str) -> Result<Multipart> {
        Ok(Multipart {
            store: self.clone(),
            key: key.to_string(),
            full_key: self.full_key(key)?,
            upload_id: upload_id.to_string(),
        })
    }
}

#[async_trait]
impl SharedUploads for S3Store {
    async fn start(&self, key: &str) -> Result<String> {
        let full = self.full_key(key)?;
        Ok(Multipart::start(self, key, full).await?.upload_id)
    }

    async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        number: i32,
        body: Bytes,
    ) -> Result<String> {
        let part = self
            .multipart(key, upload_id)?
            .upload_part(number, body)
            .await?;
        Ok(part.e_tag().unwrap_or_default().to_string())
    }

    async fn complete(&self, key: &str, upload_id: &str, parts: &[(i32, String)]) -> Result<()> {
        let parts = parts
            .iter()
            .map(|(n, etag)| CompletedPart::builder().part_number(*n).e_tag(etag).build())
            .collect();
        self.multipart(key, upload_id)?.complete(parts).await
    }

    async fn abort(&self, key: &str, upload_id: &str) {
        match self.multipart(key, upload_id) {
            Ok(m) => m.abort().await,
            Err(e) => tracing::warn!(key, error = %e, "not aborting an upload of a bad key"),
        }
    }

    async fn in_progress(&self, prefix: &str) -> Result<Vec<UploadInProgress>> {
        check_key_prefix(prefix)?;
        let full_prefix = format!("{}{}", self.prefix, prefix);
        let mut out = Vec::new();
        let (mut key_marker, mut id_marker) = (None::<String>, None::<String>);
        loop {
            let page = self
                .client
                .list_multipart_uploads()
                .bucket(&self.bucket)
                .prefix(&full_prefix)
                .set_key_marker(key_marker.take())
                .set_upload_id_marker(id_marker.take())
                .send()
                .await
                .map_err(|e| self.storage_error(prefix, "ListMultipartUploads", e))?;
            for u in page.uploads() {
                let (Some(full), Some(id)) = (u.key(), u.upload_id()) else {
                    continue;
                };
                if let Some(rel) = full.strip_prefix(&self.prefix) {
                    out.push(UploadInProgress {
                        key: rel.to_string(),
                        upload_id: id.to_string(),
                        initiated: u.initiated().and_then(super::to_chrono),
                    });
                }
            }
            if page.is_truncated() != Some(true) {
                break;
            }
            key_marker = page.next_key_marker().map(str::to_string);
            id_marker = page.next_upload_id_marker().map(str::to_string);
            if key_marker.is_none() && id_marker.is_none() {
                break;
            }
        }
        Ok(out)
    }
}
