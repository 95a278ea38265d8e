//! [`Layout::AsWritten`](super::Layout::AsWritten): every part of an upload writes into one
//! spill file, each chunk where the file ends, hashed as it lands. The file holds the object
//! as it will be stored unless a part was written again: that part's earlier chunks are then
//! cut out when the object is made (a copy, on that rare path only).

use std::fs::File;
use std::io::Write;
use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use sha2::{Digest, Sha256};

use super::{FinishedPart, PartFile, PartWriter, PartedUpload};
use crate::error::{ArchiveError, Result};
use crate::store::{ObjectWriter, PutResult, Store};

/// Bytes read at once while copying the kept bytes out of the spill file.
const COPY_CHUNK: usize = 1 << 20;

struct Spill {
    file: File,
    path: PartFile,
    size: u64,
    hasher: Sha256,
    /// Per part, where its current attempt's chunks are (adjacent chunks merged): their sum is
    /// the part's size. Emptied when the part finishes, as a finished part is never written
    /// again.
    attempts: Vec<Vec<Range<u64>>>,
    /// Chunks of attempts given up: not part of the object.
    dropped: Vec<Range<u64>>,
    /// A write failed part-way: the file holds bytes no part owns.
    broken: bool,
}

/// The spill, shared by the upload and its part writers; `None` once finished or aborted.
type Shared = Arc<Mutex<Option<Spill>>>;

fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, Option<Spill>> {
    shared.lock().unwrap_or_else(|poisoned| {
        // A writer panicked while holding it: what it left in the file is nobody's.
        let mut guard = poisoned.into_inner();
        if let Some(spill) = guard.as_mut() {
            spill.broken = true;
        }
        guard
    })
}

fn ended() -> ArchiveError {
    ArchiveError::Invalid("a part was written after its upload ended".into())
}

pub(super) fn create(
    store: Arc<dyn Store>,
    key: &str,
    dir: &Path,
    name: &str,
    parts: usize,
) -> Result<Box<dyn PartedUpload>> {
    let (file, path) = PartFile::create(dir, &format!("{name}-parts"))?;
    let shared: Shared = Arc::new(Mutex::new(Some(Spill {
        file,
        path,
        size: 0,
        hasher: Sha256::new(),
        attempts: vec![Vec::new(); parts],
        dropped: Vec::new(),
        broken: false,
    })));
    let writers = (0..parts)
        .map(|index| {
            Box::new(SharedPart {
                shared: shared.clone(),
                index,
            }) as Box<dyn PartWriter>
        })
        .collect();
    Ok(Box::new(SharedSpillUpload {
        store,
        key: key.to_string(),
        parts,
        shared,
        writers,
    }))
}

struct SharedPart {
    shared: Shared,
    index: usize,
}

/// A finished part of a shared spill: which part it was.
struct FinishedIndex(usize);

#[async_trait]
impl PartWriter for SharedPart {
    async fn write(&mut self, data: &[u8]) -> Result<()> {
        let mut guard = lock(&self.shared);
        let spill = guard.as_mut().ok_or_else(ended)?;
        if spill.broken {
            return Err(ArchiveError::Invalid(format!(
                "an earlier write to {} failed",
                spill.path.0.display()
            )));
        }
        let start = spill.size;
        if let Err(e) = spill.file.write_all(data) {
            spill.broken = true;
            return Err(ArchiveError::io(
                format!("writing {}", spill.path.0.display()),
                e,
            ));
        }
        spill.hasher.update(data);
        let end = start + data.len() as u64;
        spill.size = end;
        let chunks = &mut spill.attempts[self.index];
        match chunks.last_mut() {
            Some(last) if last.end == start => last.end = end,
            _ => chunks.push(start..end),
        }
        Ok(())
    }

    async fn restart(&mut self) -> Result<()> {
        let mut guard = lock(&self.shared);
        let spill = guard.as_mut().ok_or_else(ended)?;
        let given_up = std::mem::take(&mut spill.attempts[self.index]);
        spill.dropped.extend(given_up);
        Ok(())
    }

    async fn finish(self: Box<Self>) -> Result<FinishedPart> {
        let mut guard = lock(&self.shared);
        let spill = guard.as_mut().ok_or_else(ended)?;
        let chunks = std::mem::take(&mut spill.attempts[self.index]);
        Ok(FinishedPart {
            size: chunks.iter().map(|r| r.end - r.start).sum(),
            state: Box::new(FinishedIndex(self.index)),
        })
    }
}

struct SharedSpillUpload {
    store: Arc<dyn Store>,
    key: String,
    parts: usize,
    shared: Shared,
    writers: Vec<Box<dyn PartWriter>>,
}

#[async_trait]
impl PartedUpload for SharedSpillUpload {
    fn take_writers(&mut self) -> Vec<Box<dyn PartWriter>> {
        std::mem::take(&mut self.writers)
    }

    async fn finish(self: Box<Self>, parts: Vec<FinishedPart>) -> Result<PutResult> {
        let in_order = parts.len() == self.parts
            && parts.iter().enumerate().all(|(i, p)| {
                p.state
                    .downcast_ref::<FinishedIndex>()
                    .is_some_and(|f| f.0 == i)
            });
        if !in_order {
            return Err(ArchiveError::Invalid(format!(
                "an upload in {} parts was finished with {} parts not its own, or out of order",
                self.parts,
                parts.len()
            )));
        }
        let spill = lock(&self.shared).take().ok_or_else(ended)?;
        if spill.broken {
            return Err(ArchiveError::Invalid(format!(
                "a write to {} failed",
                spill.path.0.display()
            )));
        }
        if spill.dropped.is_empty() {
            let adopted = self
                .store
                .adopt_part_file(&self.key, &spill.path.0, spill.hasher.clone(), spill.size)
                .await?;
            if let Some(out) = adopted {
                spill.path.hand_over();
                return out.finish().await;
            }
        }
        copy_into_store(&self.store, &self.key, &spill).await
    }

    async fn abort(self: Box<Self>) {
        // The spill file goes with the spill.
        lock(&self.shared).take();
    }
}

/// The object made by a streaming `create` of the spill's bytes but the dropped ones, in file
/// order (the store's writer hashes them as they go).
async fn copy_into_store(store: &Arc<dyn Store>, key: &str, spill: &Spill) -> Result<PutResult> {
    let mut out = store.create(key).await?;
    if let Err(e) = copy_kept(spill, &mut out).await {
        out.abort().await;
        return Err(e);
    }
    out.finish().await
}

async fn copy_kept(spill: &Spill, out: &mut Box<dyn ObjectWriter>) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let mut dropped = spill.dropped.clone();
    dropped.sort_by_key(|r| r.start);
    let mut kept = Vec::with_capacity(dropped.len() + 1);
    let mut at = 0;
    for r in dropped {
        if r.start > at {
            kept.push(at..r.start);
        }
        at = at.max(r.end);
    }
    kept.push(at..spill.size);
    let path = spill.path.0.display();
    let mut buf = vec![0u8; COPY_CHUNK];
    for range in kept {
        let mut offset = range.start;
        while offset < range.end {
            let n = (range.end - offset).min(COPY_CHUNK as u64) as usize;
            spill
                .file
                .read_exact_at(&mut buf[..n], offset)
                .map_err(|e| ArchiveError::io(format!("reading {path}"), e))?;
            out.write(&buf[..n]).await?;
            offset += n as u64;
        }
    }
    Ok(())
}
