//! Local filesystem store: atomic writes (`atomic_file`: temp file + fsync + rename + directory
//! fsync); manifest CAS under an exclusive file lock, with the SHA-256 of the content as
//! revision.
//!
//! Keys never leave the root: not by their text (`..`, absolute paths: `check_key`), and not
//! through a symbolic link inside the root that points outside it (a linked snapshot, a linked
//! prefix directory): every key's path is resolved component by component and refused — for
//! reads and writes alike — when a link leads out. Links that stay inside the root work.

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

use super::{
    GetResult, ObjectInfo, ObjectReader, ObjectWriter, PutResult, Store, atomic_file, check_key,
    sha256_hex,
};
use crate::error::{ArchiveError, Result};

#[derive(Debug, Clone)]
pub struct LocalStore {
    root: PathBuf,
}

impl LocalStore {
    /// A store rooted at `root` (created when missing; relative roots are made absolute).
    pub fn new(root: impl AsRef<Path>) -> Result<LocalStore> {
        let root = root.as_ref();
        fs::create_dir_all(root)
            .map_err(|e| ArchiveError::io(format!("creating store root {}", root.display()), e))?;
        let root = fs::canonicalize(root)
            .map_err(|e| ArchiveError::io(format!("resolving {}", root.display()), e))?;
        Ok(LocalStore { root })
    }

    /// A store for reading only: `root` is never created. A missing root reads as an empty
    /// store (a following engine waits for the archive to appear).
    pub fn for_reading(root: impl AsRef<Path>) -> Result<LocalStore> {
        let root = root.as_ref();
        let root = match fs::canonicalize(root) {
            Ok(r) => r,
            Err(e) if e.kind() == ErrorKind::NotFound => std::path::absolute(root)
                .map_err(|e| ArchiveError::io(format!("resolving {}", root.display()), e))?,
            Err(e) => return Err(ArchiveError::io(format!("resolving {}", root.display()), e)),
        };
        Ok(LocalStore { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, key: &str) -> Result<PathBuf> {
        check_key(key)?;
        let path = self.root.join(key);
        self.refuse_links_out(key, &path)?;
        Ok(path)
    }

    /// Refuses a path whose existing components include a symbolic link resolving outside the
    /// root (or nowhere).
    fn refuse_links_out(&self, key: &str, path: &Path) -> Result<()> {
        let mut at = self.root.clone();
        let rest = path.strip_prefix(&self.root).expect("joined to the root");
        for part in rest.components() {
            at.push(part);
            let meta = match fs::symlink_metadata(&at) {
                Ok(m) => m,
                Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(ArchiveError::storage(key, e)),
            };
            if !meta.file_type().is_symlink() {
                continue;
            }
            let escapes = |target: String| ArchiveError::LinkEscapesRoot {
                key: key.to_string(),
                link: at.display().to_string(),
                target,
            };
            match fs::canonicalize(&at) {
                Ok(real) if real.starts_with(&self.root) => {}
                Ok(real) => return Err(escapes(real.display().to_string())),
                Err(_) => {
                    let target = fs::read_link(&at)
                        .map(|t| format!("{} (which does not exist)", t.display()))
                        .unwrap_or_else(|e| format!("? ({e})"));
                    return Err(escapes(target));
                }
            }
        }
        Ok(())
    }
}

struct LocalWriter {
    target: PathBuf,
    tmp: PathBuf,
    file: Option<std::io::BufWriter<File>>,
    hasher: Sha256,
    size: u64,
    uri: String,
}

impl Drop for LocalWriter {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

#[async_trait]
impl ObjectWriter for LocalWriter {
    async fn write(&mut self, data: &[u8]) -> Result<()> {
        let f = self.file.as_mut().expect("writer used after finish");
        f.write_all(data)
            .map_err(|e| ArchiveError::io(format!("writing {}", self.tmp.display()), e))?;
        self.hasher.update(data);
        self.size += data.len() as u64;
        Ok(())
    }

    async fn finish(mut self: Box<Self>) -> Result<PutResult> {
        let file = self.file.take().expect("finish called once");
        let target = self.target.clone();
        let tmp = self.tmp.clone();
        let done = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            let f = file.into_inner().map_err(|e| e.into_error())?;
            atomic_file::commit(f, &tmp, &target)
        })
        .await
        .expect("blocking task");
        if let Err(e) = done {
            let _ = fs::remove_file(&self.tmp);
            return Err(ArchiveError::io(
                format!("committing {}", self.target.display()),
                e,
            ));
        }
        let hasher = std::mem::take(&mut self.hasher);
        Ok(PutResult {
            uri: self.uri.clone(),
            size: self.size,
            sha256: hex::encode(hasher.finalize()),
        })
    }

    async fn abort(mut self: Box<Self>) {
        self.file.take();
        let _ = fs::remove_file(&self.tmp);
    }
}

#[async_trait]
impl Store for LocalStore {
    fn name(&self) -> String {
        format!("local:{}", self.root.display())
    }

    fn uri(&self, key: &str) -> String {
        format!("file://{}", self.root.join(key).display())
    }

    async fn get(&self, key: &str) -> Result<Option<GetResult>> {
        use tokio::io::AsyncReadExt;
        let path = self.path(key)?;
        let file = match tokio::fs::File::open(&path).await {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(ArchiveError::storage(key, e)),
        };
        let limit = super::max_get_bytes();
        let size = file
            .metadata()
            .await
            .map_err(|e| ArchiveError::storage(key, e))?
            .len();
        super::check_get_size(key, size, limit)?;
        // Read at most one byte past the cap: a file that grew since is refused too.
        let mut bytes = Vec::with_capacity(size as usize);
        file.take(limit + 1)
            .read_to_end(&mut bytes)
            .await
            .map_err(|e| ArchiveError::storage(key, e))?;
        super::check_get_size(key, bytes.len() as u64, limit)?;
        let revision = sha256_hex(&bytes);
        Ok(Some(GetResult {
            bytes: Bytes::from(bytes),
            revision,
        }))
    }

    async fn open(&self, key: &str) -> Result<Option<ObjectReader>> {
        let path = self.path(key)?;
        match tokio::fs::File::open(&path).await {
            Ok(f) => Ok(Some(Box::pin(f))),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ArchiveError::storage(key, e)),
        }
    }

    fn open_file(&self, key: &str) -> Option<Result<Option<File>>> {
        Some(self.path(key).and_then(|path| match File::open(path) {
            Ok(f) => Ok(Some(f)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ArchiveError::storage(key, e)),
        }))
    }

    async fn create(&self, key: &str) -> Result<Box<dyn ObjectWriter>> {
        let target = self.path(key)?;
        let (file, tmp) = atomic_file::create_temp(&target).map_err(|e| {
            ArchiveError::io(format!("creating a temp file for {}", target.display()), e)
        })?;
        Ok(Box::new(LocalWriter {
            uri: self.uri(key),
            target,
            tmp,
            file: Some(std::io::BufWriter::with_capacity(1 << 20, file)),
            hasher: Sha256::new(),
            size: 0,
        }))
    }

    async fn adopt_part_file(
        &self,
        key: &str,
        file: &Path,
        hashed: Sha256,
        size: u64,
    ) -> Result<Option<Box<dyn ObjectWriter>>> {
        let target = self.path(key)?;
        // A rename works within the object's directory only.
        if file.parent() != target.parent() {
            return Ok(None);
        }
        let opened = OpenOptions::new()
            .append(true)
            .open(file)
            .map_err(|e| ArchiveError::io(format!("opening {}", file.display()), e))?;
        Ok(Some(Box::new(LocalWriter {
            uri: self.uri(key),
            target,
            tmp: file.to_path_buf(),
            file: Some(std::io::BufWriter::with_capacity(1 << 20, opened)),
            hasher: hashed,
            size,
        })))
    }

    /// Part files go next to the object (same file system, skipped by listings as temp files).
    fn part_dir(&self, key: &str) -> Result<PathBuf> {
        let target = self.path(key)?;
        Ok(match target.parent() {
            Some(d) => d.to_path_buf(),
            None => self.root.clone(),
        })
    }

    async fn put_cas(&self, key: &str, bytes: Bytes, expected: &str) -> Result<String> {
        let target = self.path(key)?;
        let key = key.to_string();
        let expected = expected.to_string();
        tokio::task::spawn_blocking(move || {
            let dir = target.parent().expect("parent");
            fs::create_dir_all(dir)
                .map_err(|e| ArchiveError::io(format!("creating {}", dir.display()), e))?;
            // One lock file per manifest serialises check-and-rename across processes.
            let lock_path = target.with_file_name(format!(
                ".{}.lock",
                target.file_name().expect("file name").to_string_lossy()
            ));
            let lock = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&lock_path)
                .map_err(|e| ArchiveError::io(format!("opening {}", lock_path.display()), e))?;
            lock.lock()
                .map_err(|e| ArchiveError::io(format!("locking {}", lock_path.display()), e))?;
            let current = match fs::read(&target) {
                Ok(b) => sha256_hex(&b),
                Err(e) if e.kind() == ErrorKind::NotFound => String::new(),
                Err(e) => return Err(ArchiveError::storage(&key, e)),
            };
            if current != expected {
                return Err(ArchiveError::CasConflict { key: key.clone() });
            }
            atomic_file::write(&target, &bytes).map_err(|e| ArchiveError::storage(&key, e))?;
            Ok(sha256_hex(&bytes))
        })
        .await
        .expect("blocking task")
    }

    async fn clear_unfinished(&self, prefix: &str) -> Result<()> {
        let dir = self.path(prefix.trim_end_matches('/'))?;
        tokio::task::spawn_blocking(move || clear_unfinished_in(&dir))
            .await
            .map_err(|e| ArchiveError::Invalid(format!("clearing unfinished writes: {e}")))
    }

    async fn delete(&self, key: &str) -> Result<()> {
        let path = self.path(key)?;
        match tokio::fs::remove_file(&path).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(ArchiveError::storage(key, e)),
        }
    }

    async fn head(&self, key: &str) -> Result<Option<ObjectInfo>> {
        let path = self.path(key)?;
        match tokio::fs::metadata(&path).await {
            Ok(m) if m.is_file() => Ok(Some(ObjectInfo {
                key: key.to_string(),
                size: m.len(),
                modified: m.modified().ok().map(DateTime::<Utc>::from),
            })),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ArchiveError::storage(key, e)),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        let root = self.root.clone();
        let prefix = prefix.to_string();
        tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            let mut stack = vec![root.clone()];
            while let Some(dir) = stack.pop() {
                let entries = match fs::read_dir(&dir) {
                    Ok(e) => e,
                    Err(e) if e.kind() == ErrorKind::NotFound => continue,
                    Err(e) => {
                        return Err(ArchiveError::io(format!("listing {}", dir.display()), e));
                    }
                };
                for entry in entries {
                    let entry = entry
                        .map_err(|e| ArchiveError::io(format!("listing {}", dir.display()), e))?;
                    let path = entry.path();
                    let rel = path
                        .strip_prefix(&root)
                        .expect("under root")
                        .to_string_lossy()
                        .replace('\\', "/");
                    let name = entry.file_name().to_string_lossy().to_string();
                    if name.starts_with(atomic_file::TEMP_PREFIX)
                        || name.ends_with(".lock") && name.starts_with('.')
                    {
                        continue; // in-flight writes and CAS locks, not objects
                    }
                    let meta = match entry.metadata() {
                        Ok(m) => m,
                        // Deleted between the directory read and the stat: not there any more.
                        Err(e) if e.kind() == ErrorKind::NotFound => continue,
                        Err(e) => {
                            return Err(ArchiveError::io(format!("stat {}", path.display()), e));
                        }
                    };
                    // A link is an object only when it resolves to a file inside the root;
                    // linked directories are not descended (no loops, nothing outside).
                    let meta = if meta.file_type().is_symlink() {
                        match fs::canonicalize(&path)
                            .and_then(|real| Ok((real.starts_with(&root), fs::metadata(&real)?)))
                        {
                            Ok((true, m)) if m.is_file() => m,
                            _ => continue,
                        }
                    } else {
                        meta
                    };
                    if meta.is_dir() {
                        if prefix.starts_with(&format!("{rel}/"))
                            || rel.starts_with(&prefix)
                            || prefix.is_empty()
                        {
                            stack.push(path);
                        }
                    } else if rel.starts_with(&prefix) {
                        out.push(ObjectInfo {
                            key: rel,
                            size: meta.len(),
                            modified: meta.modified().ok().map(DateTime::<Utc>::from),
                        });
                    }
                }
            }
            out.sort_by(|a, b| a.key.cmp(&b.key));
            Ok(out)
        })
        .await
        .expect("blocking task")
    }
}

/// Removes the temp files under `dir` and the folders left empty (`dir` included).
fn clear_unfinished_in(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            clear_unfinished_in(&path);
        } else if entry
            .file_name()
            .to_string_lossy()
            .starts_with(atomic_file::TEMP_PREFIX)
        {
            let _ = fs::remove_file(&path);
        }
    }
    // Only an empty folder goes.
    let _ = fs::remove_dir(dir);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The file a reader opens holds the object's bytes; an absent key is `None`, a bad key an
    /// error; a store without files says so.
    #[tokio::test]
    async fn objects_open_as_files() {
        use std::io::Read;
        let tmp = tempfile::tempdir().unwrap();
        let store = LocalStore::new(tmp.path()).unwrap();
        store.put("t/a.jsonl", b"{\"id\":1}\n").await.unwrap();
        let mut text = String::new();
        let file = store.open_file("t/a.jsonl").unwrap().unwrap().unwrap();
        std::io::BufReader::new(file)
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "{\"id\":1}\n");
        assert!(
            store
                .open_file("t/absent.jsonl")
                .unwrap()
                .unwrap()
                .is_none()
        );
        assert!(store.open_file("../outside").unwrap().is_err());
        let memory = crate::store::memory::MemoryStore::new();
        assert!(memory.open_file("t/a.jsonl").is_none());
    }

    #[tokio::test]
    async fn a_store_for_reading_creates_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("not/yet");
        let store = LocalStore::for_reading(&root).unwrap();
        assert!(store.get("t/manifest.json").await.unwrap().is_none());
        assert!(store.open("t/manifest.json").await.unwrap().is_none());
        assert!(store.list("").await.unwrap().is_empty());
        assert!(!tmp.path().join("not").exists(), "the root was created");
        // Once the archive appears, the same store reads it.
        LocalStore::new(&root)
            .unwrap()
            .put("t/manifest.json", b"{}")
            .await
            .unwrap();
        assert!(store.get("t/manifest.json").await.unwrap().is_some());
    }
}
