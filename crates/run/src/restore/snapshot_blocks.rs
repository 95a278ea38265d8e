//! A table whose archive is a JSONL snapshot, its diffs' net effect (the overlay) held in
//! memory, loads without rows in between: one thread reads the snapshot and cuts it into
//! blocks of whole lines into one queue, and each COPY stream's own thread takes the next block
//! whenever its stream has room (a stream whose backend is slower takes fewer) and parses its
//! lines straight into COPY text ([`CopyEncoder`]), skipping a row the overlay replaces or deletes; the
//! overlay's rows follow. Parsing runs on as many threads as there are streams; memory stays
//! bounded (the overlay's budget, a few blocks and chunks per stream).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use bytes::Bytes;
use tokio::sync::mpsc;

use super::{COPY_CHUNK, PAUSE_AFTER_ROWS, Planned};
use crate::engine::targets::postgres_copy::{ChunkPool, CopyColumn, CopyEncoder};
use larch_archive::error::ArchiveError;
use larch_archive::fold::live_rows;
use larch_archive::format::Format;
use larch_archive::format::line_blocks::LineBlock;
use larch_archive::identity::{KeyCapture, identity_of};
use larch_archive::manifest::Artifact;
use larch_archive::spill::ChangeBuffer;
use larch_core::progress::Progress;

/// Bytes of archive text per block taken by a stream's thread.
const BLOCK: usize = 128 << 10;

/// Blocks queued per stream.
const BLOCKS_IN_FLIGHT: usize = 2;

/// The queue of blocks every stream's thread takes from.
type BlockQueue = Arc<Mutex<std::sync::mpsc::Receiver<LineBlock>>>;

/// The snapshot `planned` loads from, when it is JSONL (the format read as blocks).
pub(super) fn jsonl_snapshot(planned: &Planned) -> Option<&Artifact> {
    let snapshot = planned.plan.snapshot.as_ref()?;
    let (format, _) = planned.reader.choose_format(snapshot).ok()?;
    matches!(format, Format::Jsonl | Format::JsonlZstd).then_some(snapshot)
}

/// What each stream's thread shares: the table's name for errors, the progress counters, the
/// rows encoded so far by all of them (for the pause point), and the overlay to skip rows by.
struct Shared {
    table: String,
    key: String,
    counted: [Arc<Progress>; 2],
    rows: AtomicU64,
    overlay: ChangeBuffer,
    key_fields: Vec<String>,
    /// A stream's thread failed: the others stop taking blocks, so the reader sees the queue
    /// close.
    failed: AtomicBool,
}

/// Loads `snapshot` past `overlay` (held in memory) into `streams`, then the overlay's rows;
/// returns the rows produced. A stream thread's error comes first (the reader then only saw
/// it stop), then the reader's.
pub(super) async fn produce(
    planned: &Planned,
    snapshot: &Artifact,
    overlay: ChangeBuffer,
    columns: &[CopyColumn],
    counted: &[Arc<Progress>; 2],
    streams: Vec<mpsc::Sender<Bytes>>,
) -> anyhow::Result<u64> {
    let (format, _) = planned.reader.choose_format(snapshot)?;
    let shared = Arc::new(Shared {
        table: planned.table.to_string(),
        key: planned.reader.artifact_key(snapshot, format),
        counted: counted.clone(),
        rows: AtomicU64::new(0),
        overlay,
        key_fields: planned.key_fields.clone(),
        failed: AtomicBool::new(false),
    });
    let mut rows = 0u64;
    if !shared.overlay.truncated() {
        rows += read_snapshot(planned, snapshot, &shared, columns, &streams).await?;
    }
    rows += send_overlay(&shared, columns, &streams).await?;
    Ok(rows)
}

/// The snapshot's rows the overlay leaves, over one thread per stream.
async fn read_snapshot(
    planned: &Planned,
    snapshot: &Artifact,
    shared: &Arc<Shared>,
    columns: &[CopyColumn],
    streams: &[mpsc::Sender<Bytes>],
) -> anyhow::Result<u64> {
    let runtime = tokio::runtime::Handle::current();
    let pool = super::streams::chunk_pool(streams.len());
    let (blocks, queue) =
        std::sync::mpsc::sync_channel::<LineBlock>(BLOCKS_IN_FLIGHT * streams.len());
    let queue: BlockQueue = Arc::new(Mutex::new(queue));
    let mut threads = Vec::with_capacity(streams.len());
    for stream in streams {
        let encoder = CopyEncoder::new(columns);
        let (shared, runtime, stream) = (shared.clone(), runtime.clone(), stream.clone());
        let (pool, queue) = (pool.clone(), queue.clone());
        threads.push(tokio::task::spawn_blocking(move || {
            let encoded = encode_blocks(&queue, (&stream, &pool), encoder, &shared, &runtime);
            if encoded.is_err() {
                shared.failed.store(true, Ordering::Relaxed);
            }
            encoded
        }));
    }
    drop(queue);
    let read = planned
        .reader
        .fold_line_blocks(snapshot, BLOCK, (), move |(), block| {
            blocks
                .send(block)
                .map_err(|_| ArchiveError::Invalid("a COPY stream's encoder stopped".into()))
        })
        .await;
    let mut rows = 0u64;
    for t in threads {
        rows += t.await.context("a COPY stream's encoder panicked")??;
    }
    read.with_context(|| format!("table {}", planned.table))?;
    Ok(rows)
}

/// The overlay's inserted and updated rows, dealt to the streams in chunks.
async fn send_overlay(
    shared: &Shared,
    columns: &[CopyColumn],
    streams: &[mpsc::Sender<Bytes>],
) -> anyhow::Result<u64> {
    let table = &shared.table;
    let mut encoder = CopyEncoder::new(columns);
    let pool = super::streams::chunk_pool(streams.len());
    let (mut buf, mut rows, mut next) = (pool.take(), 0u64, 0usize);
    for row in live_rows(&shared.overlay) {
        let before = buf.len();
        encoder
            .encode(row.as_str(), &mut buf)
            .with_context(|| format!("table {table}: a row of its diffs"))?;
        rows += 1;
        for p in &shared.counted {
            p.add(1, (buf.len() - before) as u64);
        }
        if buf.len() >= COPY_CHUNK {
            let chunk = pool.freeze(std::mem::replace(&mut buf, pool.take()));
            deal(streams, &mut next, chunk, table).await?;
        }
    }
    if !buf.is_empty() {
        deal(streams, &mut next, pool.freeze(buf), table).await?;
    }
    Ok(rows)
}

/// Sends `chunk` to the next of `streams`, round-robin.
async fn deal(
    streams: &[mpsc::Sender<Bytes>],
    next: &mut usize,
    chunk: Bytes,
    table: &str,
) -> anyhow::Result<()> {
    let stream = &streams[*next % streams.len()];
    *next += 1;
    stream
        .send(chunk)
        .await
        .map_err(|_| anyhow::anyhow!("restore: a COPY stream into {table} stopped"))
}

/// Whether the overlay replaces or deletes the row `text` (by its identity, as the fold
/// computes it).
fn shadowed(shared: &Shared, text: &str) -> anyhow::Result<bool> {
    if shared.overlay.is_empty() {
        return Ok(false);
    }
    let values =
        KeyCapture::scan(&shared.key_fields, text).context("a row is not a JSON object")?;
    Ok(match identity_of(&values) {
        Some(id) => shared.overlay.contains_in_memory(&id),
        None => shared.overlay.contains_in_memory(text),
    })
}

/// One stream's thread: encodes the lines of the blocks it receives into COPY chunks (buffers
/// from `pool`) sent to `stream`; returns the rows sent.
fn encode_blocks(
    queue: &BlockQueue,
    (stream, pool): (&mpsc::Sender<Bytes>, &ChunkPool),
    mut encoder: CopyEncoder,
    shared: &Shared,
    runtime: &tokio::runtime::Handle,
) -> anyhow::Result<u64> {
    let table = &shared.table;
    let mut buf = pool.take();
    let mut rows = 0u64;
    let send = |chunk: Vec<u8>| {
        stream
            .blocking_send(pool.freeze(chunk))
            .map_err(|_| anyhow::anyhow!("restore: a COPY stream into {table} stopped"))
    };
    loop {
        if shared.failed.load(Ordering::Relaxed) {
            break;
        }
        // The lock is held only while waiting for the next block.
        let next = queue
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .recv();
        let Ok(block) = next else { break };
        let (mut block_rows, mut bytes) = (0u64, 0usize);
        // Progress is counted per block; the pause point (tests) still comes at its exact row.
        let base = shared.rows.load(Ordering::Relaxed);
        let (mut counted_rows, mut counted_bytes) = (0u64, 0usize);
        for line in block.lines(&shared.key) {
            let (line_no, text) = line.with_context(|| format!("table {table}"))?;
            let at = || format!("table {table}: the row at line {line_no} of {}", shared.key);
            if shadowed(shared, text).with_context(at)? {
                continue;
            }
            let before = buf.len();
            encoder.encode(text, &mut buf).with_context(at)?;
            bytes += buf.len() - before;
            block_rows += 1;
            if base + block_rows == PAUSE_AFTER_ROWS {
                for p in &shared.counted {
                    p.add(block_rows - counted_rows, (bytes - counted_bytes) as u64);
                }
                (counted_rows, counted_bytes) = (block_rows, bytes);
                runtime.block_on(larch_archive::crashpoint::pause_point(
                    larch_archive::crashpoint::RESTORE_ROWS,
                ));
            }
            if buf.len() >= COPY_CHUNK {
                send(std::mem::replace(&mut buf, pool.take()))?;
            }
        }
        rows += block_rows;
        for p in &shared.counted {
            p.add(block_rows - counted_rows, (bytes - counted_bytes) as u64);
        }
        shared.rows.fetch_add(block_rows, Ordering::Relaxed);
    }
    if !buf.is_empty() {
        send(buf)?;
    }
    Ok(rows)
}
