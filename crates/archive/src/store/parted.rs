//! One object written as consecutive parts by concurrent writers (a split export: one part per
//! range of the table, each encoded by its own worker), joined in part order when the upload
//! finishes. Nothing is visible under the key before [`PartedUpload::finish`]; an abort (or a
//! drop) leaves nothing behind.
//!
//! A store joins parts natively when it can ([`Store::create_parted_native`]: S3's multipart
//! upload, each part writer its own range of part numbers); otherwise each part is spilled to
//! a file in [`Store::part_dir`] and the files are streamed in order into one `create` when
//! the upload finishes (the local store: part files next to the object, concatenated on
//! commit). Either way the SHA-256 of the whole object is computed in one streaming pass over
//! its bytes in order: a digest cannot be combined from the parts' digests.

use std::any::Any;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;

use super::{ObjectWriter, PutResult, Store};
use crate::error::{ArchiveError, Result};

/// Writes one part of a [`PartedUpload`].
#[async_trait]
pub trait PartWriter: Send {
    async fn write(&mut self, data: &[u8]) -> Result<()>;
    /// Drops what was written to the part, to write it again from its start (a range copied
    /// again after its connection was lost).
    async fn restart(&mut self) -> Result<()>;
    /// Ends the part: what the upload needs to join it.
    async fn finish(self: Box<Self>) -> Result<FinishedPart>;
}

/// A finished part, handed back to its upload's [`PartedUpload::finish`].
pub struct FinishedPart {
    /// Bytes written to the part.
    pub size: u64,
    pub(crate) state: Box<dyn Any + Send>,
}

/// An object being written as consecutive parts by concurrent [`PartWriter`]s.
#[async_trait]
pub trait PartedUpload: Send {
    /// The part writers, in object order (once: later calls return none).
    fn take_writers(&mut self) -> Vec<Box<dyn PartWriter>>;
    /// Joins the finished parts (in object order) into the object.
    async fn finish(self: Box<Self>, parts: Vec<FinishedPart>) -> Result<PutResult>;
    /// Drops every part written; nothing stays under the key.
    async fn abort(self: Box<Self>);
}

/// Starts an upload of `key` in `parts` parts on `store`: native when the store joins parts
/// itself, else spilled to part files joined on finish.
pub async fn create(
    store: Arc<dyn Store>,
    key: &str,
    parts: usize,
) -> Result<Box<dyn PartedUpload>> {
    if parts == 0 {
        return Err(ArchiveError::Invalid(
            "an upload in parts needs at least one part".into(),
        ));
    }
    if let Some(native) = store.create_parted_native(key, parts).await? {
        return Ok(native);
    }
    let dir = store.part_dir(key)?;
    std::fs::create_dir_all(&dir)
        .map_err(|e| ArchiveError::io(format!("creating {}", dir.display()), e))?;
    let name = key.rsplit('/').next().unwrap_or(key).to_string();
    let mut writers: Vec<Box<dyn PartWriter>> = Vec::with_capacity(parts);
    for index in 0..parts {
        writers.push(Box::new(SpilledPart::create(&dir, &name, index)?));
    }
    Ok(Box::new(SpilledUpload {
        store,
        key: key.to_string(),
        writers,
    }))
}

/// A part file, removed when dropped (joined, aborted or abandoned alike).
struct PartFile(PathBuf);

impl Drop for PartFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

struct SpilledPart {
    file: BufWriter<File>,
    path: PartFile,
    size: u64,
}

impl SpilledPart {
    fn create(dir: &Path, name: &str, index: usize) -> Result<SpilledPart> {
        let suffix: u64 = rand::random();
        // The temp prefix: the local store's listing skips it, like any write in flight.
        let path = dir.join(format!(
            "{}{name}-part{index}-{suffix:016x}",
            super::atomic_file::TEMP_PREFIX
        ));
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| ArchiveError::io(format!("creating part file {}", path.display()), e))?;
        Ok(SpilledPart {
            file: BufWriter::with_capacity(1 << 20, file),
            path: PartFile(path),
            size: 0,
        })
    }
}

#[async_trait]
impl PartWriter for SpilledPart {
    async fn write(&mut self, data: &[u8]) -> Result<()> {
        self.file
            .write_all(data)
            .map_err(|e| ArchiveError::io(format!("writing {}", self.path.0.display()), e))?;
        self.size += data.len() as u64;
        Ok(())
    }

    async fn restart(&mut self) -> Result<()> {
        use std::io::Seek;
        let path = self.path.0.display().to_string();
        self.file
            .flush()
            .and_then(|()| self.file.get_mut().set_len(0))
            .and_then(|()| self.file.get_mut().rewind())
            .map_err(|e| ArchiveError::io(format!("emptying {path}"), e))?;
        self.size = 0;
        Ok(())
    }

    async fn finish(mut self: Box<Self>) -> Result<FinishedPart> {
        self.file
            .flush()
            .map_err(|e| ArchiveError::io(format!("writing {}", self.path.0.display()), e))?;
        let SpilledPart { path, size, .. } = *self;
        Ok(FinishedPart {
            size,
            state: Box::new(path),
        })
    }
}

struct SpilledUpload {
    store: Arc<dyn Store>,
    key: String,
    writers: Vec<Box<dyn PartWriter>>,
}

/// Bytes read from a part file at once while joining.
const JOIN_CHUNK: usize = 1 << 20;

impl SpilledUpload {
    async fn join(files: &[PartFile], out: &mut Box<dyn ObjectWriter>) -> Result<()> {
        let mut buf = vec![0u8; JOIN_CHUNK];
        for PartFile(path) in files {
            let mut f = File::open(path)
                .map_err(|e| ArchiveError::io(format!("opening {}", path.display()), e))?;
            loop {
                let n = f
                    .read(&mut buf)
                    .map_err(|e| ArchiveError::io(format!("reading {}", path.display()), e))?;
                if n == 0 {
                    break;
                }
                out.write(&buf[..n]).await?;
            }
        }
        Ok(())
    }
}

#[async_trait]
impl PartedUpload for SpilledUpload {
    fn take_writers(&mut self) -> Vec<Box<dyn PartWriter>> {
        std::mem::take(&mut self.writers)
    }

    async fn finish(self: Box<Self>, parts: Vec<FinishedPart>) -> Result<PutResult> {
        let files = parts
            .into_iter()
            .map(|p| {
                p.state.downcast::<PartFile>().map(|f| *f).map_err(|_| {
                    ArchiveError::Invalid("a part of another upload was handed to finish".into())
                })
            })
            .collect::<Result<Vec<_>>>()?;
        // The store's writer hashes the bytes as they stream through, in order.
        let mut out = self.store.create(&self.key).await?;
        if let Err(e) = Self::join(&files, &mut out).await {
            out.abort().await;
            return Err(e);
        }
        out.finish().await
    }

    async fn abort(self: Box<Self>) {
        // Dropping the writers and parts removes their files.
    }
}
