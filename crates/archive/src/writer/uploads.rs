//! The streaming uploads of one artifact: one encoder per format feeding one upload per store,
//! finished or aborted together so an artifact is stored everywhere or nowhere.

use std::sync::Arc;

use super::ArchiveWriter;
use crate::error::{ArchiveError, Result};
use crate::format::{Encoder, Format};
use crate::manifest::{Artifact, FormatRef, artifact_key, referenced_keys};
use crate::store::{ObjectWriter, Store};

/// One format of a snapshot being uploaded: its encoder and one streaming upload per store.
pub(super) type Upload = (
    Format,
    Encoder,
    Vec<(Arc<dyn Store>, String, Box<dyn ObjectWriter>)>,
);

/// Bytes buffered per format before they go to the upload.
const UPLOAD_CHUNK: usize = 1 << 20;

impl ArchiveWriter {
    /// One streaming upload per format and store for `artifact`.
    pub(super) async fn start_uploads(
        &self,
        artifact: &Artifact,
        formats: &[Format],
    ) -> Result<Vec<Upload>> {
        let mut uploads: Vec<Upload> = Vec::new();
        for format in formats {
            let key = artifact_key(&self.config.key_prefix, artifact, format.extension());
            let mut writers = Vec::new();
            for store in &self.stores {
                match store.create(&key).await {
                    Ok(w) => writers.push((store.clone(), key.clone(), w)),
                    Err(e) => {
                        abort_all(uploads).await;
                        for (_, _, w) in writers {
                            w.abort().await;
                        }
                        return Err(e);
                    }
                }
            }
            uploads.push((*format, Encoder::new(*format)?, writers));
        }
        Ok(uploads)
    }

    /// Ends a streamed artifact's uploads: aborts them when streaming failed, else finishes them
    /// (a failed finish deletes what was written). Returns what streaming returned, the objects
    /// written and the primary format's size.
    pub(super) async fn end_uploads<T>(
        &self,
        uploads: Vec<Upload>,
        streamed: Result<T>,
        artifact: &mut Artifact,
    ) -> Result<(T, Written, u64)> {
        let value = match streamed {
            Ok(v) => v,
            Err(e) => {
                abort_all(uploads).await;
                return Err(e);
            }
        };
        match finish_uploads(uploads, artifact).await {
            Ok((written, bytes)) => Ok((value, written, bytes)),
            Err((e, written)) => {
                self.cleanup(&written).await;
                Err(e)
            }
        }
    }

    /// Removes objects uploaded for an artifact that was not committed.
    pub(super) async fn cleanup(&self, written: &Written) {
        let live = referenced_keys(&self.config.key_prefix, &self.manifest.artifacts);
        for (store, key) in written {
            if live.contains(key) {
                continue; // the key of a committed artifact (a repeated position): leave it
            }
            let _ = store.delete(key).await;
        }
    }
}

/// Sends each format's encoded bytes to its uploads once a chunk is ready.
#[inline]
pub(super) async fn send_chunks(uploads: &mut [Upload]) -> Result<()> {
    for (_, enc, writers) in uploads.iter_mut() {
        if enc.pending() >= UPLOAD_CHUNK {
            let chunk = enc.take();
            for (_, _, w) in writers.iter_mut() {
                w.write(&chunk).await?;
            }
        }
    }
    Ok(())
}

/// Objects stored by an artifact's uploads (to delete if the artifact is not committed).
pub(super) type Written = Vec<(Arc<dyn Store>, String)>;

/// Finishes every upload and records each format in `artifact`; returns what was stored and
/// the size of the first format. On failure the rest are aborted and the error comes with what
/// was already stored.
async fn finish_uploads(
    uploads: Vec<Upload>,
    artifact: &mut Artifact,
) -> std::result::Result<(Written, u64), (ArchiveError, Written)> {
    let mut written = Vec::new();
    let mut failure = None;
    let mut first_bytes = None;
    for (format, enc, writers) in uploads {
        let tail = match enc.finish() {
            Ok(t) => t,
            Err(e) => {
                failure.get_or_insert(e);
                Vec::new()
            }
        };
        let mut first = None;
        for (store, key, mut w) in writers {
            if failure.is_some() {
                w.abort().await;
                continue;
            }
            if let Err(e) = w.write(&tail).await {
                w.abort().await;
                failure = Some(e);
                continue;
            }
            match w.finish().await {
                Ok(r) => {
                    written.push((store, key));
                    first.get_or_insert(r);
                }
                Err(e) => failure = Some(e),
            }
        }
        if let Some(r) = first {
            first_bytes.get_or_insert(r.size);
            artifact.formats.insert(
                format.id().to_string(),
                FormatRef {
                    uri: r.uri,
                    size_bytes: r.size as i64,
                    sha256: Some(r.sha256),
                },
            );
        }
    }
    match failure {
        Some(e) => Err((e, written)),
        None => Ok((written, first_bytes.unwrap_or(0))),
    }
}

async fn abort_all(uploads: Vec<Upload>) {
    for (_, _, writers) in uploads {
        for (_, _, w) in writers {
            w.abort().await;
        }
    }
}
