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

use std::collections::{BTreeMap, BinaryHeap};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use larch_core::locks::MutexExt;

use super::error::{ArchiveError, Result};
use super::identity::Identity;
use super::model::Action;
use super::value::Row;

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
                "{s:?}: unknown size unit {other:?} (use bytes, Ki/KiB ... Ei/EiB, or k/kB ... E/EB)"
            ));
        }
    };
    let value: f64 = num
        .parse()
        .map_err(|_| format!("{s:?}: expected a size such as 64Mi or 2Gi"))?;
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

/// A run file on disk; deleted when dropped.
#[derive(Debug)]
struct Run {
    path: PathBuf,
    bytes: u64,
    entries: u64,
    level: u32,
    spill: Arc<Spill>,
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let s = &self.spill.stats;
        s.disk_bytes.fetch_sub(self.bytes, Ordering::Relaxed);
        s.runs.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Counts the compressed bytes leaving the encoder.
struct Counting<W> {
    inner: W,
    bytes: u64,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

type RunEncoder = BufWriter<zstd::stream::write::Encoder<'static, Counting<BufWriter<File>>>>;

/// Writes one run: entries in strictly increasing identity order.
struct RunWriter {
    spill: Arc<Spill>,
    path: PathBuf,
    out: Option<RunEncoder>,
    entries: u64,
}

const NONE_LEN: u32 = u32::MAX;

fn action_code(a: Action) -> u8 {
    match a {
        Action::Insert => b'I',
        Action::Update => b'U',
        Action::Delete => b'D',
        Action::Truncate => b'T',
    }
}

impl RunWriter {
    fn create(spill: &Arc<Spill>) -> Result<RunWriter> {
        let path = spill.new_run_path()?;
        let file = File::create(&path)
            .map_err(|e| ArchiveError::io(format!("creating spill run {}", path.display()), e))?;
        let counting = Counting {
            inner: BufWriter::with_capacity(IO_BUFFER, file),
            bytes: 0,
        };
        let setup = (|| {
            let mut enc = zstd::stream::write::Encoder::new(counting, 1)?;
            enc.window_log(WINDOW_LOG)?;
            enc.include_checksum(true)?;
            Ok(enc)
        })();
        let enc =
            setup.map_err(|e| ArchiveError::io(format!("spill run {}", path.display()), e))?;
        Ok(RunWriter {
            spill: spill.clone(),
            path,
            out: Some(BufWriter::with_capacity(IO_BUFFER, enc)),
            entries: 0,
        })
    }

    fn compressed_bytes(&self) -> u64 {
        self.out.as_ref().map_or(0, |o| o.get_ref().get_ref().bytes)
    }

    fn write(&mut self, id: &str, e: &Entry) -> Result<()> {
        let out = self.out.as_mut().expect("open");
        let io = (|| {
            put(out, Some(id))?;
            out.write_all(&[action_code(e.action)])?;
            put(out, e.old.as_ref().map(Row::as_str))?;
            put(out, e.new.as_ref().map(Row::as_str))
        })();
        io.map_err(|e| ArchiveError::io(format!("writing spill run {}", self.path.display()), e))?;
        self.entries += 1;
        let limit = self.spill.config.disk_limit;
        if limit > 0 && self.entries.is_multiple_of(256) {
            let used =
                self.spill.stats.disk_bytes.load(Ordering::Relaxed) + self.compressed_bytes();
            if used > limit {
                return Err(self.spill.limit_error(used));
            }
        }
        Ok(())
    }

    fn finish(mut self, level: u32) -> Result<Run> {
        let out = self.out.take().expect("open");
        let path = self.path.clone();
        let io = (|| {
            let enc = out.into_inner().map_err(|e| e.into_error())?;
            let mut counting = enc.finish()?;
            counting.flush()?;
            Ok::<_, std::io::Error>(counting.bytes)
        })();
        let bytes =
            io.map_err(|e| ArchiveError::io(format!("writing spill run {}", path.display()), e))?;
        let stats = &self.spill.stats;
        let limit = self.spill.config.disk_limit;
        let used = stats.disk_bytes.load(Ordering::Relaxed) + bytes;
        if limit > 0 && used > limit {
            return Err(self.spill.limit_error(used));
        }
        stats.disk_bytes.fetch_add(bytes, Ordering::Relaxed);
        stats.runs.fetch_add(1, Ordering::Relaxed);
        stats.runs_written.fetch_add(1, Ordering::Relaxed);
        super::crashpoint::crash_point(super::crashpoint::SPILL_AFTER_RUN);
        Ok(Run {
            path: std::mem::take(&mut self.path),
            bytes,
            entries: self.entries,
            level,
            spill: self.spill.clone(),
        })
    }
}

impl Drop for RunWriter {
    fn drop(&mut self) {
        // Unfinished (an error, or the limit): nothing of it stays on disk.
        self.out.take();
        if !self.path.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn put(out: &mut impl Write, text: Option<&str>) -> std::io::Result<()> {
    match text {
        None => out.write_all(&NONE_LEN.to_le_bytes()),
        Some(t) => {
            let len = u32::try_from(t.len())
                .ok()
                .filter(|l| *l != NONE_LEN)
                .ok_or_else(|| std::io::Error::other("a value over 4 GiB"))?;
            out.write_all(&len.to_le_bytes())?;
            out.write_all(t.as_bytes())
        }
    }
}

/// Reads one run back, entry by entry.
struct RunReader {
    path: PathBuf,
    input: BufReader<zstd::stream::read::Decoder<'static, BufReader<File>>>,
    remaining: u64,
}

impl RunReader {
    fn open(run: &Run) -> Result<RunReader> {
        let path = run.path.clone();
        let opened = (|| {
            let file = File::open(&path)?;
            let mut dec = zstd::stream::read::Decoder::with_buffer(BufReader::with_capacity(
                IO_BUFFER, file,
            ))?;
            dec.window_log_max(WINDOW_LOG)?;
            Ok::<_, std::io::Error>(dec)
        })();
        let dec = opened
            .map_err(|e| ArchiveError::io(format!("opening spill run {}", path.display()), e))?;
        Ok(RunReader {
            path,
            input: BufReader::with_capacity(IO_BUFFER, dec),
            remaining: run.entries,
        })
    }

    fn next(&mut self) -> Result<Option<(Identity, Entry)>> {
        let read = (|| {
            if self.remaining == 0 {
                // Reading to the end checks the frame's checksum.
                let mut rest = [0u8; 1];
                if self.input.read(&mut rest)? != 0 {
                    return Err(std::io::Error::other("data after the last entry"));
                }
                return Ok(None);
            }
            let id = get(&mut self.input)?.ok_or_else(|| std::io::Error::other("no identity"))?;
            let mut action = [0u8; 1];
            self.input.read_exact(&mut action)?;
            let action = match action[0] {
                b'I' => Action::Insert,
                b'U' => Action::Update,
                b'D' => Action::Delete,
                other => return Err(std::io::Error::other(format!("bad action byte {other}"))),
            };
            let old = get(&mut self.input)?.map(|t| Row::from_validated(&t));
            let new = get(&mut self.input)?.map(|t| Row::from_validated(&t));
            self.remaining -= 1;
            Ok(Some((id.into_boxed_str(), Entry { action, old, new })))
        })();
        read.map_err(|e| ArchiveError::io(format!("reading spill run {}", self.path.display()), e))
    }
}

fn get(input: &mut impl Read) -> std::io::Result<Option<String>> {
    let mut len = [0u8; 4];
    input.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len);
    if len == NONE_LEN {
        return Ok(None);
    }
    let mut buf = vec![0u8; len as usize];
    input.read_exact(&mut buf)?;
    String::from_utf8(buf)
        .map(Some)
        .map_err(|_| std::io::Error::other("a text that is not UTF-8"))
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

enum Source<'a> {
    Memory(std::collections::btree_map::Iter<'a, Identity, Entry>),
    Run(RunReader),
}

impl Source<'_> {
    fn next(&mut self) -> Result<Option<(Identity, Entry)>> {
        match self {
            Source::Memory(it) => Ok(it.next().map(|(id, e)| (id.clone(), e.clone()))),
            Source::Run(r) => r.next(),
        }
    }
}

/// The head entry of one source in the merge heap: smallest identity first, then the newest
/// source (highest index).
struct Head {
    id: Identity,
    source: usize,
    entry: Entry,
}

impl PartialEq for Head {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id && self.source == other.source
    }
}
impl Eq for Head {}
impl PartialOrd for Head {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Head {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.id.cmp(&self.id).then(self.source.cmp(&other.source))
    }
}

/// A k-way merge of sorted sources (oldest first) yielding the newest entry per identity.
pub struct Merged<'a> {
    sources: Vec<Source<'a>>,
    heap: BinaryHeap<Head>,
}

impl<'a> Merged<'a> {
    /// The merge of several buffers, oldest first (a snapshot's rows, then the changes since).
    pub fn of(buffers: &[&'a ChangeBuffer]) -> Result<Merged<'a>> {
        let mut sources = Vec::new();
        for b in buffers {
            for r in &b.runs {
                sources.push(Source::Run(RunReader::open(r)?));
            }
            sources.push(Source::Memory(b.memory.iter()));
        }
        Merged::new(sources)
    }

    fn new(mut sources: Vec<Source<'a>>) -> Result<Merged<'a>> {
        let mut heap = BinaryHeap::with_capacity(sources.len());
        for (i, s) in sources.iter_mut().enumerate() {
            if let Some((id, entry)) = s.next()? {
                heap.push(Head {
                    id,
                    source: i,
                    entry,
                });
            }
        }
        Ok(Merged { sources, heap })
    }

    fn refill(&mut self, source: usize) -> Result<()> {
        if let Some((id, entry)) = self.sources[source].next()? {
            self.heap.push(Head { id, source, entry });
        }
        Ok(())
    }
}

impl Iterator for Merged<'_> {
    type Item = Result<(Identity, Entry)>;

    fn next(&mut self) -> Option<Self::Item> {
        let newest = self.heap.pop()?;
        let step = (|| {
            self.refill(newest.source)?;
            // Older entries of the same identity lose.
            while self.heap.peek().is_some_and(|h| h.id == newest.id) {
                let older = self.heap.pop().expect("peeked");
                self.refill(older.source)?;
            }
            Ok(())
        })();
        Some(step.map(|()| (newest.id, newest.entry)))
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
mod tests {
    use super::*;

    fn spill(dir: &Path, memory: u64) -> Arc<Spill> {
        Spill::open(
            SpillConfig {
                dir: dir.to_path_buf(),
                memory_limit: memory,
                disk_limit: 0,
            },
            "t",
        )
    }

    fn upsert(id: i64, v: &str) -> Entry {
        Entry {
            action: Action::Update,
            old: None,
            new: Some(Row::parse(&format!(r#"{{"id":{id},"v":"{v}"}}"#)).unwrap()),
        }
    }

    fn collect(b: &ChangeBuffer) -> Vec<(String, Entry)> {
        b.merged()
            .unwrap()
            .map(|r| r.map(|(id, e)| (id.to_string(), e)))
            .collect::<Result<_>>()
            .unwrap()
    }

    #[test]
    fn sizes_parse_like_kubernetes_quantities() {
        assert_eq!(parse_size("64Mi").unwrap(), 64 << 20);
        assert_eq!(parse_size("1.5Gi").unwrap(), 3 << 29);
        assert_eq!(parse_size("500M").unwrap(), 500_000_000);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        // the SI spellings people write (64MB was refused while 64M passed)
        assert_eq!(parse_size("64MB").unwrap(), 64_000_000);
        assert_eq!(parse_size("1.5 GB").unwrap(), 1_500_000_000);
        assert_eq!(parse_size("512kB").unwrap(), 512_000);
        assert_eq!(parse_size("100B").unwrap(), 100);
        assert!(
            parse_size("12 parsecs")
                .unwrap_err()
                .contains("unknown size unit")
        );
        assert!(parse_size("Mi").is_err());
    }

    /// The merge of spilled runs equals collapsing everything in memory, whatever the budget.
    #[test]
    fn spilled_runs_merge_to_the_newest_entry_per_identity() {
        let dir = tempfile::tempdir().unwrap();
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(7);
        let mut expected: BTreeMap<String, Entry> = BTreeMap::new();
        let s = spill(dir.path(), 0);
        let mut b = ChangeBuffer::new(s.clone());
        for i in 0..20_000u32 {
            let id = rand::Rng::random_range(&mut rng, 0..3_000i64);
            let e = if i % 7 == 0 {
                Entry {
                    action: Action::Delete,
                    old: Some(Row::parse(&format!(r#"{{"id":{id}}}"#)).unwrap()),
                    new: None,
                }
            } else {
                upsert(id, &format!("v{i}"))
            };
            expected.insert(id.to_string(), e.clone());
            b.insert_within(id.to_string().into(), e, 16 * 1024)
                .unwrap();
        }
        assert!(b.has_runs());
        assert!(
            b.runs.len() < 4 * FAN_IN,
            "runs are merged ahead: {}",
            b.runs.len()
        );
        assert!(s.stats().runs_written.load(Ordering::Relaxed) > FAN_IN as u64);
        let got = collect(&b);
        assert_eq!(got.len(), expected.len());
        assert_eq!(got, expected.into_iter().collect::<Vec<_>>());
        // Dropping the buffer deletes its runs; the spill's directory stays until the spill goes.
        let live = s.live_dir().unwrap();
        assert!(!run_files(&live).is_empty());
        drop(b);
        assert!(run_files(&live).is_empty());
        assert_eq!(s.stats().disk_bytes.load(Ordering::Relaxed), 0);
        assert_eq!(s.stats().memory_bytes.load(Ordering::Relaxed), 0);
        drop(s);
        assert!(!live.exists());
    }

    #[test]
    fn append_keeps_age_order_and_truncate_resets() {
        let dir = tempfile::tempdir().unwrap();
        let s = spill(dir.path(), 0);
        let mut committed = ChangeBuffer::new(s.clone());
        committed.insert("1".into(), upsert(1, "old"));
        committed.insert("2".into(), upsert(2, "old"));
        committed.spill().unwrap();
        committed.insert("3".into(), upsert(3, "memory"));
        let mut txn = ChangeBuffer::new(s.clone());
        txn.insert("1".into(), upsert(1, "txn-run"));
        txn.spill().unwrap();
        txn.insert("3".into(), upsert(3, "txn-memory"));
        committed.append(txn).unwrap();
        let got: Vec<String> = collect(&committed)
            .into_iter()
            .map(|(_, e)| e.new.unwrap().as_str().to_string())
            .collect();
        assert_eq!(
            got,
            [
                r#"{"id":1,"v":"txn-run"}"#,
                r#"{"id":2,"v":"old"}"#,
                r#"{"id":3,"v":"txn-memory"}"#
            ]
        );
        let mut txn = ChangeBuffer::new(s.clone());
        txn.truncate();
        txn.insert("9".into(), upsert(9, "after"));
        committed.append(txn).unwrap();
        assert!(committed.truncated());
        assert_eq!(collect(&committed).len(), 1);
        assert!(
            run_files(dir.path()).is_empty(),
            "the truncate deleted the runs"
        );
    }

    #[test]
    fn the_disk_limit_is_a_clear_error_and_leaves_no_partial_run() {
        let dir = tempfile::tempdir().unwrap();
        let s = Spill::open(
            SpillConfig {
                dir: dir.path().to_path_buf(),
                memory_limit: 0,
                disk_limit: 4096,
            },
            "t",
        );
        let mut b = ChangeBuffer::new(s.clone());
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(1);
        for i in 0..5_000i64 {
            // Random text does not compress: the limit is reached for sure.
            let noise: String = (0..40)
                .map(|_| rand::Rng::random_range(&mut rng, b'a'..=b'z') as char)
                .collect();
            b.insert(i.to_string().into(), upsert(i, &noise));
        }
        let e = b.spill().unwrap_err();
        let text = e.to_string();
        assert!(text.contains("spill limit of 4096 bytes"), "{text}");
        assert!(text.contains(&dir.path().display().to_string()), "{text}");
        assert!(run_files(dir.path()).is_empty());
        assert_eq!(s.stats().disk_bytes.load(Ordering::Relaxed), 0);
        // Nothing was lost: memory still holds every entry.
        assert_eq!(b.depth(), 5_000);
    }

    #[test]
    fn a_dead_process_directory_is_swept_and_a_live_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        // Left behind by a process that died: a directory with a free lock and a run.
        let stale = dir.path().join("t-00000000000000aa");
        std::fs::create_dir_all(&stale).unwrap();
        std::fs::write(stale.join("lock"), "").unwrap();
        std::fs::write(stale.join("run-000000.zst"), "x").unwrap();
        // Another archive's directory: never touched.
        let other = dir.path().join("u-00000000000000bb");
        std::fs::create_dir_all(&other).unwrap();
        let live = spill(dir.path(), 0);
        let mut b = ChangeBuffer::new(live.clone());
        b.insert("1".into(), upsert(1, "x"));
        b.spill().unwrap();
        assert!(!stale.exists());
        assert!(other.exists());
        // A second spill of the same archive (same process) sees the lock held.
        let _second = spill(dir.path(), 0);
        assert!(live.live_dir().unwrap().exists());
        assert_eq!(collect(&b).len(), 1);
    }
}
