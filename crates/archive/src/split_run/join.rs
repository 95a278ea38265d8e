//! The coordinator's side of a split run: each format's snapshot object joined from its
//! ranges' checkpoints, in range order, and its SHA-256 computed in one streaming pass over
//! the whole object (digests of parts do not combine).

use std::sync::Arc;

use bytes::Bytes;
use tokio::io::AsyncReadExt;

use super::{Checkpoint, LAST_PART_NUMBER, Plan, RangeOutput, StoredPiece};
use crate::error::{ArchiveError, Result};
use crate::store::s3::PART_SIZE;
use crate::store::{PutResult, Store};

/// Joins upload `index` of `plan` from `checkpoints` (one per range, in range order).
pub async fn complete(
    store: &Arc<dyn Store>,
    plan: &Plan,
    index: usize,
    checkpoints: &[Checkpoint],
) -> Result<PutResult> {
    let upload = &plan.uploads[index];
    let outputs: Vec<&RangeOutput> = checkpoints.iter().map(|c| &c.outputs[index]).collect();
    let expected: u64 = outputs.iter().map(|o| o.size).sum();
    let put = match &upload.upload_id {
        Some(id) => complete_multipart(store, plan, &upload.key, id, &outputs).await?,
        None => concatenate(store, &upload.key, &outputs).await?,
    };
    if put.size != expected {
        let _ = store.delete(&upload.key).await;
        return Err(ArchiveError::storage(
            store.uri(&upload.key),
            format!(
                "the joined object has {} bytes, its ranges {expected}",
                put.size
            ),
        ));
    }
    Ok(put)
}

/// One of a range's stored pieces, read whole (at most a part), checked against its size.
async fn piece(store: &Arc<dyn Store>, p: &StoredPiece) -> Result<Bytes> {
    let got = store.get(&p.key).await?.ok_or_else(|| {
        ArchiveError::storage(store.uri(&p.key), "a checkpointed range's object is gone")
    })?;
    if got.bytes.len() as u64 != p.size {
        return Err(ArchiveError::storage(
            store.uri(&p.key),
            format!("{} bytes, its checkpoint says {}", got.bytes.len(), p.size),
        ));
    }
    Ok(got.bytes)
}

/// The ranges' heads and tails uploaded between their own parts, then the upload completed;
/// a snapshot too small for parts is put as one object and the upload aborted.
async fn complete_multipart(
    store: &Arc<dyn Store>,
    plan: &Plan,
    key: &str,
    upload_id: &str,
    outputs: &[&RangeOutput],
) -> Result<PutResult> {
    let shared = store.shared_uploads().ok_or_else(|| {
        ArchiveError::Invalid(format!("{} has no multipart uploads", store.name()))
    })?;
    let mut carry: Vec<u8> = Vec::new();
    let mut completed: Vec<(i32, String)> = Vec::new();
    for (range, out) in outputs.iter().enumerate() {
        if let Some(head) = &out.head {
            carry.extend_from_slice(&piece(store, head).await?);
        }
        // A range uploaded parts only once its head was full: the carry is a full part.
        if !out.parts.is_empty() || carry.len() >= PART_SIZE {
            let number = plan.first_part(range);
            let body = Bytes::from(std::mem::take(&mut carry));
            completed.push((
                number,
                shared.upload_part(key, upload_id, number, body).await?,
            ));
        }
        completed.extend(out.parts.iter().map(|p| (p.number, p.etag.clone())));
        if let Some(tail) = &out.tail {
            carry.extend_from_slice(&piece(store, tail).await?);
        }
    }
    if completed.is_empty() {
        shared.abort(key, upload_id).await;
        return store.put(key, &carry).await;
    }
    if !carry.is_empty() {
        let body = Bytes::from(std::mem::take(&mut carry));
        completed.push((
            LAST_PART_NUMBER,
            shared
                .upload_part(key, upload_id, LAST_PART_NUMBER, body)
                .await?,
        ));
    }
    shared.complete(key, upload_id, &completed).await?;
    match crate::store::read_back::digest_object(store.clone(), key).await {
        Ok((sha256, size)) => Ok(PutResult {
            uri: store.uri(key),
            size,
            sha256,
        }),
        Err(e) => {
            let _ = store.delete(key).await;
            Err(e)
        }
    }
}

/// The ranges' objects streamed in order into one new object (hashed as it is written).
async fn concatenate(
    store: &Arc<dyn Store>,
    key: &str,
    outputs: &[&RangeOutput],
) -> Result<PutResult> {
    let mut out = store.create(key).await?;
    let mut buf = vec![0u8; 1 << 20];
    for o in outputs {
        let Some(whole) = &o.whole else {
            out.abort().await;
            return Err(ArchiveError::Invalid(format!(
                "a checkpoint of {key} names no object"
            )));
        };
        let copied = async {
            let mut reader = store.open(&whole.key).await?.ok_or_else(|| {
                ArchiveError::storage(
                    store.uri(&whole.key),
                    "a checkpointed range's object is gone",
                )
            })?;
            loop {
                let n = reader
                    .read(&mut buf)
                    .await
                    .map_err(|e| ArchiveError::storage(store.uri(&whole.key), e))?;
                if n == 0 {
                    return Ok(());
                }
                out.write(&buf[..n]).await?;
            }
        }
        .await;
        if let Err(e) = copied {
            out.abort().await;
            return Err(e);
        }
    }
    out.finish().await
}
