//! Buffers of collapsed changes, bounded in memory and spilled to local disk (issue 22).
//!
//! A [`ChangeBuffer`] keeps the newest change per row identity. It collapses in an ordered map
//! until the map uses its memory budget; the map is then written out as a *run* (a file of entries
//! sorted by identity, zstd-compressed) and memory starts over. Reading the buffer back is a k-way
//! merge of its runs and its map that keeps the newest entry per identity — an external merge
//! sort: memory holds one entry per open run, whatever the number of rows. Runs are merged ahead,
//! [`FAN_IN`] of a level into one of the next, so a read never opens more than a few dozen.
//!
//! Runs live in a directory of their own under the spill directory, named after the archive
//! (`<tag>-<nonce>/`) and holding a `lock` file the writer keeps locked (`flock`). A run is
//! deleted as soon as its buffer no longer needs it (the diff committed, the transaction was
//! discarded, the buffer was dropped) and the directory when its [`Spill`] is dropped; a process
//! that died leaves its directory behind with the lock free, and the next [`Spill::open`] for the
//! same archive deletes it.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use larch_core::locks::MutexExt;

use super::error::{ArchiveError, Result};
use super::identity::Identity;
use super::model::Action;
use super::value::Row;

mod merge;
mod run;

pub use merge::Merged;
use merge::Source;
use run::{Run, RunReader, RunWriter};

/// Runs of one level merged into one run of the next level.
pub const FAN_IN: usize = 8;
/// zstd window of run files: small, so each open run costs little memory when merging.
const WINDOW_LOG: u32 = 17;
const IO_BUFFER: usize = 64 * 1024;
/// Estimated bytes of bookkeeping per buffered entry besides its texts (map node share,
/// allocation headers).
const ENTRY_OVERHEAD: u64 = 112;

/// Where and how much a writer may spill.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpillConfig {
    /// Parent directory of the spill directories (created when missing).
    pub dir: PathBuf,
    /// Bytes of collapsed changes kept in memory before they are written to a run.
    pub memory_limit: u64,
    /// Bytes of runs allowed on disk at once (0: no limit).
    pub disk_limit: u64,
}

pub const DEFAULT_MEMORY_LIMIT: u64 = 64 << 20;

impl Default for SpillConfig {
    fn default() -> SpillConfig {
        SpillConfig {
            dir: std::env::temp_dir().join("larch-spill"),
            memory_limit: DEFAULT_MEMORY_LIMIT,
            disk_limit: 0,
        }
    }
}

/// Live figures of a spill directory (for `/status` and metrics).
#[derive(Debug, Default)]
pub struct SpillStats {
    /// Bytes of collapsed changes held in memory by every buffer.
    pub memory_bytes: AtomicU64,
    /// Bytes of runs on disk now.
    pub disk_bytes: AtomicU64,
    /// Runs on disk now.
    pub runs: AtomicU64,
    /// Runs written since start (including merges).
    pub runs_written: AtomicU64,
}

/// One archive's spill directory and its accounting.
#[derive(Debug)]
pub struct Spill {
    config: SpillConfig,
    tag: String,
    live: Mutex<Option<LiveDir>>,
    next_run: AtomicU64,
    stats: SpillStats,
}

#[derive(Debug)]
struct LiveDir {
    path: PathBuf,
    _lock: File,
}

impl Drop for LiveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Takes the lock of a spill directory; `false` when a live process holds it.
fn try_lock(file: &File) -> bool {
    // SAFETY: flock on an open descriptor owned by `file`.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

impl Spill {
    /// The spill of the archive named `tag` (a file-name-safe string) under `config.dir`.
    /// Deletes directories of the same archive that a dead process left behind. The directory
    /// itself is created at the first run.
    pub fn open(config: SpillConfig, tag: &str) -> Arc<Spill> {
        let spill = Spill {
            config,
            tag: tag.to_string(),
            live: Mutex::new(None),
            next_run: AtomicU64::new(0),
            stats: SpillStats::default(),
        };
        match spill.sweep() {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(dir = %spill.config.dir.display(), count = n, "removed spill directories a stopped process left behind")
            }
            Err(e) => {
                tracing::warn!(dir = %spill.config.dir.display(), error = %e, "could not sweep the spill directory")
            }
        }
        Arc::new(spill)
    }

    pub fn config(&self) -> &SpillConfig {
        &self.config
    }

    pub fn stats(&self) -> &SpillStats {
        &self.stats
    }

    pub fn memory_used(&self) -> u64 {
        self.stats.memory_bytes.load(Ordering::Relaxed)
    }

    /// Removes `<tag>-*` directories whose lock is free (their process is gone).
    fn sweep(&self) -> std::io::Result<usize> {
        let entries = match std::fs::read_dir(&self.config.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e),
        };
        let prefix = format!("{}-", self.tag);
        let mut removed = 0;
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name();
            if !name.to_string_lossy().starts_with(&prefix) || !entry.path().is_dir() {
                continue;
            }
            let stale = match File::open(entry.path().join("lock")) {
                Ok(f) => try_lock(&f),
                Err(_) => true,
            };
            if stale {
                std::fs::remove_dir_all(entry.path())?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// The path of a new run file, creating (and locking) this process's directory first.
    fn new_run_path(&self) -> Result<PathBuf> {
        let mut live = self.live.locked();
        if live.is_none() {
            let path = self
                .config
                .dir
                .join(format!("{}-{:016x}", self.tag, rand::random::<u64>()));
            let created = (|| {
                std::fs::create_dir_all(&path)?;
                let lock = File::create(path.join("lock"))?;
                if !try_lock(&lock) {
                    return Err(std::io::Error::other("its lock is held by another process"));
                }
                Ok(lock)
            })();
            let lock = created.map_err(|e| {
                ArchiveError::io(
                    format!(
                        "creating the spill directory {} (--spill-dir)",
                        path.display()
                    ),
                    e,
                )
            })?;
            *live = Some(LiveDir { path, _lock: lock });
        }
        let n = self.next_run.fetch_add(1, Ordering::Relaxed);
        Ok(live
            .as_ref()
            .expect("created")
            .path
            .join(format!("run-{n:06}.zst")))
    }

    /// This process's spill directory, once created.
    pub fn live_dir(&self) -> Option<PathBuf> {
        self.live.locked().as_ref().map(|l| l.path.clone())
    }

    fn add_memory(&self, delta: i64) {
        if delta >= 0 {
            self.stats
                .memory_bytes
                .fetch_add(delta as u64, Ordering::Relaxed);
        } else {
            self.stats
                .memory_bytes
                .fetch_sub(delta.unsigned_abs(), Ordering::Relaxed);
        }
    }

    fn limit_error(&self, needed: u64) -> ArchiveError {
        ArchiveError::SpillLimit {
            dir: self.config.dir.display().to_string(),
            limit: self.config.disk_limit,
            needed,
        }
    }
}

/// A spill tag: `kind` and a hash of `parts` (what identifies one archive's spill, such as its
/// stores and key prefix), safe in a file name.
pub fn tag(kind: &str, parts: &[&str]) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    format!("{kind}-{}", hex::encode(&h.finalize()[..8]))
}

/// The spellings [`parse_size`] accepts, for its errors.
pub const SIZE_SPELLINGS: &str = "use a number of bytes (1048576), decimal kB/MB/GB/TB \
    (64MB = 64,000,000 bytes; also k, M, G, T) or binary KiB/MiB/GiB/TiB (64MiB = 64 × 2^20 \
    bytes; also Ki, Mi, Gi, Ti)";

/// Parses a byte size: a plain number of bytes (`B` optional), or with a Kubernetes quantity
/// suffix (`Ki` ... `Ei`, `k` ... `E`), `KiB` ... `EiB`, or the SI `kB`/`KB` ... `EB`.
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let factor: u64 = match unit.trim() {
        "" | "B" => 1,
        "k" | "K" | "kB" | "KB" => 1_000,
        "M" | "MB" => 1_000_000,
        "G" | "GB" => 1_000_000_000,
        "T" | "TB" => 1_000_000_000_000,
        "P" | "PB" => 1_000_000_000_000_000,
        "E" | "EB" => 1_000_000_000_000_000_000,
        "Ki" | "KiB" => 1 << 10,
        "Mi" | "MiB" => 1 << 20,
        "Gi" | "GiB" => 1 << 30,
        "Ti" | "TiB" => 1 << 40,
        "Pi" | "PiB" => 1 << 50,
        "Ei" | "EiB" => 1 << 60,
        other => {
            return Err(format!(
                "{s:?}: unknown size unit {other:?}; {SIZE_SPELLINGS}"
            ));
        }
    };
    let value: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size; {SIZE_SPELLINGS}"))?;
    let bytes = value * factor as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("{s:?}: size out of range"));
    }
    Ok(bytes as u64)
}

/// One buffered change of a row (never a TRUNCATE: that resets the buffer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub action: Action,
    pub old: Option<Row>,
    pub new: Option<Row>,
}

fn weight(id: &str, e: &Entry) -> u64 {
    let text = id.len()
        + e.old.as_ref().map_or(0, |r| r.as_str().len())
        + e.new.as_ref().map_or(0, |r| r.as_str().len());
    text as u64 * 9 / 8 + ENTRY_OVERHEAD
}

/// Changes collapsed per identity, newest wins, with a TRUNCATE remembered apart (it resets
/// everything recorded before it).
#[derive(Debug)]
pub struct ChangeBuffer {
    spill: Arc<Spill>,
    memory: BTreeMap<Identity, Entry>,
    memory_bytes: u64,
    /// Oldest first: every entry of a run is older than every entry of the runs after it and
    /// of `memory`.
    runs: Vec<Run>,
    truncated: bool,
}

impl ChangeBuffer {
    pub fn new(spill: Arc<Spill>) -> ChangeBuffer {
        ChangeBuffer {
            spill,
            memory: BTreeMap::new(),
            memory_bytes: 0,
            runs: Vec::new(),
            truncated: false,
        }
    }

    /// Records the newest change of `id` (replacing what memory holds for it).
    pub fn insert(&mut self, id: Identity, entry: Entry) {
        let added = weight(&id, &entry) as i64;
        let removed = match self.memory.insert(id, entry) {
            Some(old) => weight("", &old) as i64,
            None => 0,
        };
        self.memory_bytes = (self.memory_bytes as i64 + added - removed) as u64;
        self.spill.add_memory(added - removed);
    }

    /// [`insert`](Self::insert), then spills when memory holds more than `budget` bytes.
    pub fn insert_within(&mut self, id: Identity, entry: Entry, budget: u64) -> Result<()> {
        self.insert(id, entry);
        if self.memory_bytes > budget {
            self.spill()?;
        }
        Ok(())
    }

    /// A TRUNCATE: everything recorded so far is gone.
    pub fn truncate(&mut self) {
        self.clear();
        self.truncated = true;
    }

    /// Empties the buffer (runs deleted).
    pub fn clear(&mut self) {
        self.spill.add_memory(-(self.memory_bytes as i64));
        self.memory = BTreeMap::new();
        self.memory_bytes = 0;
        self.runs.clear();
        self.truncated = false;
    }

    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// Nothing recorded, no TRUNCATE.
    pub fn is_empty(&self) -> bool {
        !self.truncated && self.memory.is_empty() && self.runs.is_empty()
    }

    pub fn memory_bytes(&self) -> u64 {
        self.memory_bytes
    }

    pub fn has_runs(&self) -> bool {
        !self.runs.is_empty()
    }

    /// The spill directory the buffer's runs go to.
    pub fn spill_handle(&self) -> Arc<Spill> {
        self.spill.clone()
    }

    /// Whether memory holds an entry for `id` (meaningful without runs only).
    pub fn contains_in_memory(&self, id: &str) -> bool {
        self.memory.contains_key(id)
    }

    /// The entries held in memory (all of them, without runs).
    pub fn memory_entries(&self) -> impl Iterator<Item = (&Identity, &Entry)> {
        self.memory.iter()
    }

    /// Distinct identities in memory plus entries in runs (an upper bound of the identities).
    pub fn depth(&self) -> usize {
        self.memory.len() + self.runs.iter().map(|r| r.entries as usize).sum::<usize>()
    }

    /// Writes what memory holds to a new run, then merges runs ahead when a level is full.
    pub fn spill(&mut self) -> Result<()> {
        if self.memory.is_empty() {
            return Ok(());
        }
        let mut w = RunWriter::create(&self.spill)?;
        for (id, e) in &self.memory {
            w.write(id, e)?;
        }
        let run = w.finish(0)?;
        tracing::debug!(path = %run.path.display(), entries = run.entries, bytes = run.bytes, "spilled buffered changes");
        self.runs.push(run);
        self.spill.add_memory(-(self.memory_bytes as i64));
        self.memory = BTreeMap::new();
        self.memory_bytes = 0;
        self.merge_full_levels()
    }

    fn merge_full_levels(&mut self) -> Result<()> {
        loop {
            let Some(level) = self.runs.last().map(|r| r.level) else {
                return Ok(());
            };
            let same = self
                .runs
                .iter()
                .rev()
                .take_while(|r| r.level == level)
                .count();
            if same < FAN_IN {
                // Runs appended from another buffer can break the level order: bound the count.
                if self.runs.len() > 4 * FAN_IN {
                    self.merge_range(0, FAN_IN, level + 1)?;
                    continue;
                }
                return Ok(());
            }
            let start = self.runs.len() - same;
            self.merge_range(start, self.runs.len(), level + 1)?;
        }
    }

    /// Replaces `runs[start..end]` by one run of `level` holding their newest entries.
    fn merge_range(&mut self, start: usize, end: usize, level: u32) -> Result<()> {
        let mut w = RunWriter::create(&self.spill)?;
        {
            let merged = Merged::new(
                self.runs[start..end]
                    .iter()
                    .map(|r| RunReader::open(r).map(Source::Run))
                    .collect::<Result<Vec<_>>>()?,
            )?;
            for item in merged {
                let (id, e) = item?;
                w.write(&id, &e)?;
            }
        }
        let run = w.finish(level)?;
        self.runs.splice(start..end, [run]);
        Ok(())
    }

    /// Appends the changes of `newer`, which all happened after ours (a transaction's COMMIT).
    pub fn append(&mut self, newer: ChangeBuffer) -> Result<()> {
        let mut newer = newer;
        if newer.truncated {
            self.truncate();
        }
        if !newer.runs.is_empty() {
            self.spill()?;
            self.runs.append(&mut newer.runs);
            self.merge_full_levels()?;
        }
        let memory = std::mem::take(&mut newer.memory);
        self.spill.add_memory(-(newer.memory_bytes as i64));
        newer.memory_bytes = 0;
        if self.memory.is_empty() {
            self.spill.add_memory(
                memory
                    .iter()
                    .map(|(id, e)| weight(id, e) as i64)
                    .sum::<i64>(),
            );
            self.memory_bytes = memory.iter().map(|(id, e)| weight(id, e)).sum();
            self.memory = memory;
        } else {
            for (id, e) in memory {
                self.insert(id, e);
            }
        }
        Ok(())
    }

    /// The newest entry of every identity, in identity order.
    pub fn merged(&self) -> Result<Merged<'_>> {
        Merged::of(&[self])
    }
}

impl Drop for ChangeBuffer {
    fn drop(&mut self) {
        self.spill.add_memory(-(self.memory_bytes as i64));
    }
}

/// Lists the run files under `dir` (tests and diagnostics).
pub fn run_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "zst") {
                out.push(p);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
