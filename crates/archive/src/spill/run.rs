//! Run files: the sorted, zstd-compressed files a [`ChangeBuffer`](super::ChangeBuffer) spills
//! its entries to, written and read back entry by entry.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{Entry, IO_BUFFER, Spill, WINDOW_LOG};
use crate::error::{ArchiveError, Result};
use crate::identity::Identity;
use crate::model::Action;
use crate::value::Row;

/// A run file on disk; deleted when dropped.
#[derive(Debug)]
pub(super) struct Run {
    pub(super) path: PathBuf,
    pub(super) bytes: u64,
    pub(super) entries: u64,
    pub(super) level: u32,
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
pub(super) struct RunWriter {
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
    pub(super) fn create(spill: &Arc<Spill>) -> Result<RunWriter> {
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

    #[inline]
    pub(super) fn write(&mut self, id: &str, e: &Entry) -> Result<()> {
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

    pub(super) fn finish(mut self, level: u32) -> Result<Run> {
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
        crate::crashpoint::crash_point(crate::crashpoint::SPILL_AFTER_RUN);
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
pub(super) struct RunReader {
    path: PathBuf,
    input: BufReader<zstd::stream::read::Decoder<'static, BufReader<File>>>,
    remaining: u64,
}

impl RunReader {
    pub(super) fn open(run: &Run) -> Result<RunReader> {
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

    #[inline]
    pub(super) fn next(&mut self) -> Result<Option<(Identity, Entry)>> {
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
