//! One object written as parts by concurrent writers (a split export: one part per range of
//! the table, each encoded by its own worker), joined when the upload finishes. Nothing is
//! visible under the key before [`PartedUpload::finish`]; an abort (or a drop) leaves nothing
//! behind.
//!
//! A store joins parts natively when it can ([`Store::create_parted_native`]: S3's multipart
//! upload, each part writer its own range of part numbers, parts in order). Otherwise the parts
//! are spilled to files in [`Store::part_dir`], in one of two [`Layout`]s:
//! - [`Layout::AsWritten`] (chunks of records that stand alone): every part writes straight into
//!   ONE spill file, each chunk where the file ends, hashed as it lands. The local store adopts
//!   that file as the object ([`Store::adopt_part_file`]): no byte is copied or read again.
//!   A part written again drops its first attempt's chunks, and only then are the kept bytes
//!   copied into a `create`.
//! - [`Layout::PartsInOrder`] (a compressed stream, whose chunks stand alone only as a whole
//!   part): each part has a file of its own; the first is adopted (hashed as it is written) and
//!   the others are appended to it in order.
//!
//! Either way the SHA-256 of the whole object is taken in one pass over its bytes in order: a
//! digest cannot be combined from the parts' digests.

use std::any::Any;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use sha2::{Digest, Sha256};

use super::{ObjectWriter, PutResult, Store};
use crate::error::{ArchiveError, Result};

mod shared_spill;

/// How the spilled parts of an upload make up its object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Each part whole, the parts in order.
    PartsInOrder,
    /// The parts' writes in the order they came: every write is whole records that stand alone
    /// (see [`crate::format::Format::chunks_stand_alone`]).
    AsWritten,
}

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
    layout: Layout,
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
    if layout == Layout::AsWritten {
        return shared_spill::create(store, key, &dir, &name, parts);
    }
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

/// A part file, removed when dropped (joined, aborted or abandoned alike) unless a store
/// adopted it as its object.
struct PartFile(PathBuf);

impl PartFile {
    /// A new file named after `label` in `dir`, open for writing.
    fn create(dir: &Path, label: &str) -> Result<(File, PartFile)> {
        let suffix: u64 = rand::random();
        // The temp prefix: the local store's listing skips it, like any write in flight.
        let path = dir.join(format!(
            "{}{label}-{suffix:016x}",
            super::atomic_file::TEMP_PREFIX
        ));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| ArchiveError::io(format!("creating part file {}", path.display()), e))?;
        Ok((file, PartFile(path)))
    }

    /// Leaves the file to its new owner: no longer removed on drop.
    fn hand_over(mut self) {
        self.0 = PathBuf::new();
    }
}

impl Drop for PartFile {
    fn drop(&mut self) {
        if !self.0.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

struct SpilledPart {
    file: BufWriter<File>,
    path: PartFile,
    size: u64,
    /// The first part's digest, taken as it is written: the object starts with its bytes.
    hasher: Option<Sha256>,
}

/// A finished spilled part: its file, and the digest of its bytes when it is the first.
struct SpilledFile {
    path: PartFile,
    hasher: Option<Sha256>,
}

impl SpilledPart {
    fn create(dir: &Path, name: &str, index: usize) -> Result<SpilledPart> {
        let (file, path) = PartFile::create(dir, &format!("{name}-part{index}"))?;
        Ok(SpilledPart {
            file: BufWriter::with_capacity(1 << 20, file),
            path,
            size: 0,
            hasher: (index == 0).then(Sha256::new),
        })
    }
}

#[async_trait]
impl PartWriter for SpilledPart {
    async fn write(&mut self, data: &[u8]) -> Result<()> {
        self.file
            .write_all(data)
            .map_err(|e| ArchiveError::io(format!("writing {}", self.path.0.display()), e))?;
        if let Some(h) = self.hasher.as_mut() {
            h.update(data);
        }
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
        if let Some(h) = self.hasher.as_mut() {
            h.reset();
        }
        Ok(())
    }

    async fn finish(mut self: Box<Self>) -> Result<FinishedPart> {
        self.file
            .flush()
            .map_err(|e| ArchiveError::io(format!("writing {}", self.path.0.display()), e))?;
        let SpilledPart {
            path, size, hasher, ..
        } = *self;
        Ok(FinishedPart {
            size,
            state: Box::new(SpilledFile { path, hasher }),
        })
    }
}

/// Frees the memory (page cache) and blocks of bytes of a part file already appended to the
/// object, so the object's new pages take their place instead of as much memory again; false
/// when the file system cannot (nothing is lost: the file goes once joined).
#[cfg(target_os = "linux")]
fn release_copied(file: &File, offset: u64, len: u64) -> bool {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return false;
    };
    // SAFETY: fallocate on an open descriptor we own; no memory is passed.
    let done = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        )
    };
    done == 0
}

#[cfg(not(target_os = "linux"))]
fn release_copied(_file: &File, _offset: u64, _len: u64) -> bool {
    false
}

struct SpilledUpload {
    store: Arc<dyn Store>,
    key: String,
    writers: Vec<Box<dyn PartWriter>>,
}

/// Bytes read from a part file at once while joining.
const JOIN_CHUNK: usize = 1 << 20;

impl SpilledUpload {
    async fn join(files: &[SpilledFile], out: &mut Box<dyn ObjectWriter>) -> Result<()> {
        let mut buf = vec![0u8; JOIN_CHUNK];
        let mut release = true;
        for SpilledFile {
            path: PartFile(path),
            ..
        } in files
        {
            let mut f = OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .map_err(|e| ArchiveError::io(format!("opening {}", path.display()), e))?;
            let mut offset = 0u64;
            loop {
                let n = f
                    .read(&mut buf)
                    .map_err(|e| ArchiveError::io(format!("reading {}", path.display()), e))?;
                if n == 0 {
                    break;
                }
                out.write(&buf[..n]).await?;
                if release {
                    release = release_copied(&f, offset, n as u64);
                }
                offset += n as u64;
            }
        }
        Ok(())
    }

    /// The object's writer, holding the first part already when the store adopts its file;
    /// returns the parts left to append.
    async fn start_object(
        store: &dyn Store,
        key: &str,
        mut files: Vec<(u64, SpilledFile)>,
    ) -> Result<(Box<dyn ObjectWriter>, Vec<SpilledFile>)> {
        let (size, first) = files.remove(0);
        let rest = files.into_iter().map(|(_, f)| f);
        if let Some(hashed) = first.hasher.clone() {
            let path = &first.path.0;
            if let Some(out) = store.adopt_part_file(key, path, hashed, size).await? {
                first.path.hand_over();
                return Ok((out, rest.collect()));
            }
        }
        let out = store.create(key).await?;
        Ok((out, std::iter::once(first).chain(rest).collect()))
    }
}

#[async_trait]
impl PartedUpload for SpilledUpload {
    fn take_writers(&mut self) -> Vec<Box<dyn PartWriter>> {
        std::mem::take(&mut self.writers)
    }

    async fn finish(self: Box<Self>, parts: Vec<FinishedPart>) -> Result<PutResult> {
        if parts.is_empty() {
            return Err(ArchiveError::Invalid(
                "an upload in parts was finished without its parts".into(),
            ));
        }
        let files = parts
            .into_iter()
            .map(|p| {
                let size = p.size;
                p.state
                    .downcast::<SpilledFile>()
                    .map(|f| (size, *f))
                    .map_err(|_| {
                        ArchiveError::Invalid(
                            "a part of another upload was handed to finish".into(),
                        )
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        // The store's writer hashes the bytes as they stream through, in order.
        let (mut out, rest) = Self::start_object(self.store.as_ref(), &self.key, files).await?;
        if let Err(e) = Self::join(&rest, &mut out).await {
            out.abort().await;
            return Err(e);
        }
        out.finish().await
    }

    async fn abort(self: Box<Self>) {
        // Dropping the writers and parts removes their files.
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::local::LocalStore;
    use crate::store::memory::MemoryStore;

    /// Writes `parts` through an upload of `key` (part 0 written, emptied and written again:
    /// a range copied again), returns what the store reports.
    async fn upload(store: Arc<dyn Store>, key: &str, parts: &[&[u8]]) -> PutResult {
        let mut up = create(store, key, parts.len(), Layout::PartsInOrder)
            .await
            .unwrap();
        let writers = up.take_writers();
        let mut finished = Vec::new();
        for (i, (mut w, bytes)) in writers.into_iter().zip(parts).enumerate() {
            if i == 0 {
                w.write(b"a first attempt, dropped").await.unwrap();
                w.restart().await.unwrap();
            }
            for chunk in bytes.chunks(7) {
                w.write(chunk).await.unwrap();
            }
            finished.push(w.finish().await.unwrap());
        }
        up.finish(finished).await.unwrap()
    }

    async fn read(store: &dyn Store, key: &str) -> Vec<u8> {
        use tokio::io::AsyncReadExt;
        let mut r = store.open(key).await.unwrap().expect("the object");
        let mut out = Vec::new();
        r.read_to_end(&mut out).await.unwrap();
        out
    }

    const PARTS: [&[u8]; 3] = [
        b"{\"a\":1}\n{\"a\":2}\n",
        b"{\"a\":3}\n",
        b"{\"a\":4}\n{\"a\":5}\n",
    ];

    #[tokio::test]
    async fn the_local_store_adopts_the_first_part_and_appends_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()).unwrap());
        let key = "public.t/snapshot.jsonl";
        let put = upload(store.clone(), key, &PARTS).await;
        let whole = PARTS.concat();
        assert_eq!(read(store.as_ref(), key).await, whole);
        assert_eq!(put.size, whole.len() as u64);
        assert_eq!(put.sha256, hex::encode(Sha256::digest(&whole)));
        let names: Vec<String> = std::fs::read_dir(dir.path().join("public.t"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        assert_eq!(names, ["snapshot.jsonl"], "no part file is left");
    }

    #[tokio::test]
    async fn a_store_that_cannot_adopt_a_file_gets_every_part_copied() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let key = "public.t/snapshot.jsonl";
        let put = upload(store.clone(), key, &PARTS).await;
        let whole = PARTS.concat();
        assert_eq!(read(store.as_ref(), key).await, whole);
        assert_eq!(put.sha256, hex::encode(Sha256::digest(&whole)));
    }

    #[tokio::test]
    async fn an_aborted_upload_leaves_no_file() {
        for layout in [Layout::PartsInOrder, Layout::AsWritten] {
            an_aborted_upload_leaves_no_file_in(layout).await;
        }
    }

    async fn an_aborted_upload_leaves_no_file_in(layout: Layout) {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()).unwrap());
        let mut up = create(store.clone(), "public.t/snapshot.jsonl", 2, layout)
            .await
            .unwrap();
        let mut writers = up.take_writers();
        writers[0].write(b"{\"a\":1}\n").await.unwrap();
        let first = writers.remove(0).finish().await.unwrap();
        drop(first);
        up.abort().await;
        drop(writers);
        let left: Vec<_> = std::fs::read_dir(dir.path().join("public.t"))
            .unwrap()
            .collect();
        assert!(left.is_empty(), "{layout:?}: {left:?}");
        assert!(
            store
                .open("public.t/snapshot.jsonl")
                .await
                .unwrap()
                .is_none()
        );
    }

    fn names_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        names.sort();
        names
    }

    /// An upload of `key` in two parts laid out as written, and its part writers.
    async fn as_written(
        store: &Arc<dyn Store>,
        key: &str,
    ) -> (Box<dyn PartedUpload>, Vec<Box<dyn PartWriter>>) {
        let mut up = create(store.clone(), key, 2, Layout::AsWritten)
            .await
            .unwrap();
        let writers = up.take_writers();
        (up, writers)
    }

    /// Finishes both parts (the second first), then the upload: the parts' sizes and what
    /// the store reports.
    async fn finish_both(
        up: Box<dyn PartedUpload>,
        mut w: Vec<Box<dyn PartWriter>>,
    ) -> ((u64, u64), PutResult) {
        let second = w.pop().unwrap().finish().await.unwrap();
        let first = w.pop().unwrap().finish().await.unwrap();
        let sizes = (first.size, second.size);
        (sizes, up.finish(vec![first, second]).await.unwrap())
    }

    #[tokio::test]
    async fn written_as_they_come_the_chunks_land_in_one_file_that_becomes_the_object() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()).unwrap());
        let key = "public.t/snapshot.jsonl";
        let (up, mut w) = as_written(&store, key).await;
        // The later part writes first: the object is the chunks in the order they came.
        w[1].write(b"{\"a\":3}\n").await.unwrap();
        w[0].write(b"{\"a\":1}\n").await.unwrap();
        w[1].write(b"{\"a\":4}\n").await.unwrap();
        let folder = dir.path().join("public.t");
        let spilled = names_in(&folder);
        assert_eq!(
            spilled.len(),
            1,
            "one spill file for every part: {spilled:?}"
        );
        let spill_inode = std::fs::metadata(folder.join(&spilled[0])).unwrap().ino();
        let (sizes, put) = finish_both(up, w).await;
        assert_eq!(sizes, (8, 16));
        let whole = b"{\"a\":3}\n{\"a\":1}\n{\"a\":4}\n";
        assert_eq!(read(store.as_ref(), key).await, whole);
        assert_eq!(put.size, whole.len() as u64);
        assert_eq!(put.sha256, hex::encode(Sha256::digest(whole)));
        assert_eq!(names_in(&folder), ["snapshot.jsonl"]);
        let object_inode = std::fs::metadata(folder.join("snapshot.jsonl"))
            .unwrap()
            .ino();
        assert_eq!(
            object_inode, spill_inode,
            "the spill file itself became the object"
        );
    }

    #[tokio::test]
    async fn a_part_written_again_leaves_none_of_its_first_attempt() {
        for local in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let store: Arc<dyn Store> = if local {
                Arc::new(LocalStore::new(dir.path()).unwrap())
            } else {
                Arc::new(MemoryStore::new())
            };
            let key = "public.t/snapshot.jsonl";
            let (up, mut w) = as_written(&store, key).await;
            w[0].write(b"{\"a\":1}\n").await.unwrap();
            w[1].write(b"{\"a\":3}\n").await.unwrap();
            w[0].write(b"{\"a\":2}\n").await.unwrap();
            w[1].write(b"{\"a\":4}\n").await.unwrap();
            // Part 1's connection was lost: its range is copied again from its start.
            w[1].restart().await.unwrap();
            w[1].write(b"{\"a\":3}\n{\"a\":4}\n").await.unwrap();
            w[0].write(b"{\"a\":5}\n").await.unwrap();
            let (sizes, put) = finish_both(up, w).await;
            assert_eq!(sizes, (24, 16));
            let whole = b"{\"a\":1}\n{\"a\":2}\n{\"a\":3}\n{\"a\":4}\n{\"a\":5}\n";
            assert_eq!(read(store.as_ref(), key).await, whole, "local: {local}");
            assert_eq!(put.sha256, hex::encode(Sha256::digest(whole)));
            if local {
                assert_eq!(names_in(&dir.path().join("public.t")), ["snapshot.jsonl"]);
            }
        }
    }

    #[tokio::test]
    async fn parts_handed_back_out_of_order_are_refused() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let (up, mut w) = as_written(&store, "public.t/snapshot.jsonl").await;
        let second = w.pop().unwrap().finish().await.unwrap();
        let first = w.pop().unwrap().finish().await.unwrap();
        let e = up.finish(vec![second, first]).await.unwrap_err();
        assert!(e.to_string().contains("out of order"), "{e}");
        assert!(
            store
                .open("public.t/snapshot.jsonl")
                .await
                .unwrap()
                .is_none()
        );
    }
}
