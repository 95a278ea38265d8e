//! One S3 multipart upload's calls, shared by the streaming writer ([`super::upload`]) and
//! the parted upload of a split export ([`super::parted`]).

use aws_sdk_s3::error::DisplayErrorContext;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use bytes::Bytes;

use super::{S3Store, etag_of};
use crate::error::{ArchiveError, Result};
use crate::store::Store;

/// A started multipart upload: where its parts go.
#[derive(Clone)]
pub(super) struct Multipart {
    pub store: S3Store,
    pub key: String,
    pub full_key: String,
    pub upload_id: String,
}

impl Multipart {
    /// Starts the multipart upload of `key` (stored at `full_key`).
    pub async fn start(store: &S3Store, key: &str, full_key: String) -> Result<Multipart> {
        let out = store
            .client
            .create_multipart_upload()
            .bucket(&store.bucket)
            .key(&full_key)
            .send()
            .await
            .map_err(|e| store.storage_error(key, "CreateMultipartUpload", e))?;
        let upload_id = out.upload_id.ok_or_else(|| {
            ArchiveError::storage(
                store.uri(key),
                "S3 CreateMultipartUpload: the response carries no upload id",
            )
        })?;
        Ok(Multipart {
            store: store.clone(),
            key: key.to_string(),
            full_key,
            upload_id,
        })
    }

    pub async fn upload_part(&self, number: i32, body: Bytes) -> Result<CompletedPart> {
        let out = self
            .store
            .client
            .upload_part()
            .bucket(&self.store.bucket)
            .key(&self.full_key)
            .upload_id(&self.upload_id)
            .part_number(number)
            .body(ByteStream::from(body))
            .send()
            .await
            .map_err(|e| {
                self.store
                    .storage_error(&self.key, &format!("UploadPart {number}"), e)
            })?;
        let etag = etag_of(&self.store, &self.key, "UploadPart", out.e_tag)?;
        Ok(CompletedPart::builder()
            .part_number(number)
            .e_tag(etag)
            .build())
    }

    pub async fn complete(&self, parts: Vec<CompletedPart>) -> Result<()> {
        self.store
            .client
            .complete_multipart_upload()
            .bucket(&self.store.bucket)
            .key(&self.full_key)
            .upload_id(&self.upload_id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(parts))
                    .build(),
            )
            .send()
            .await
            .map_err(|e| {
                self.store
                    .storage_error(&self.key, "CompleteMultipartUpload", e)
            })?;
        Ok(())
    }

    /// Aborts the upload; a failure is logged (a bucket lifecycle rule must clean up).
    pub async fn abort(&self) {
        let result = self
            .store
            .client
            .abort_multipart_upload()
            .bucket(&self.store.bucket)
            .key(&self.full_key)
            .upload_id(&self.upload_id)
            .send()
            .await;
        if let Err(e) = result {
            tracing::warn!(
                uri = %self.store.uri(&self.key),
                error = %DisplayErrorContext(&e),
                "aborting the multipart upload failed; a bucket lifecycle rule must clean it up"
            );
        }
    }
}
