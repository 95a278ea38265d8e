//! The COPY streams a table's rows go through: one producer folds the archive and encodes rows
//! into COPY chunks, dealt round-robin to one stream (inside the restore's transaction) or to
//! `--split N` streams, each over its own connection into a staging table the restore then
//! renames in its transaction. Memory is bounded: each stream holds at most
//! [`CHUNKS_IN_FLIGHT`] chunks.

use anyhow::{Context, bail};
use bytes::Bytes;
use futures::SinkExt;
use tokio::sync::mpsc;
use tokio_postgres::{Client, CopyInSink};

use super::{COPY_CHUNK, PAUSE_AFTER_ROWS, Planned, qualified};
use crate::engine::targets::postgres_copy::{ChunkPool, CopyColumn, CopyEncoder};
use larch_archive::fold::{HeadRows, fold_diffs, head_rows, head_rows_past};
use larch_archive::manifest::Artifact;
use larch_archive::model::TableId;
use larch_archive::spill::{ChangeBuffer, Spill, SpillConfig, tag};
use larch_core::progress::Progress;
use larch_postgres::connection::PgDsn;
use sha2::Digest;
use std::sync::Arc;

/// Chunks queued per stream: the producer waits when the slowest stream is this far behind.
pub(super) const CHUNKS_IN_FLIGHT: usize = 2;

/// Streams one restore may open for a table at most.
pub const MAX_SPLIT: u16 = 16;

/// Connects to the restore's target database; the connection's task ends with the client.
pub(crate) async fn connect(dsn: &PgDsn) -> anyhow::Result<(Client, tokio::task::JoinHandle<()>)> {
    let (client, connection) = dsn
        .config
        .connect(dsn.tls()?)
        .await
        .context("restore: connecting to the target database")?;
    let task = tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(error = %e, "restore: the target connection ended");
        }
    });
    Ok((client, task))
}

/// The staging table a split load of `table` fills: in the table's schema (a rename cannot
/// move it), named after the table's hash so a restore killed mid-load leaves a table the
/// next restore of that table finds and drops.
pub fn staging_table(table: &TableId) -> TableId {
    let digest = sha2::Sha256::digest(format!("{}\n{}", table.schema, table.table));
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    TableId::new(table.schema.clone(), format!("larch_restore_staging_{hex}"))
}

/// The `COPY … FROM STDIN` of `columns` into `table`, `FREEZE` when the table was created or
/// emptied in the loading transaction.
pub(crate) fn copy_sql(table: &TableId, columns: &[CopyColumn], freeze: bool) -> String {
    let list: Vec<String> = columns
        .iter()
        .map(|c| crate::engine::targets::postgres::quote_ident(&c.name))
        .collect();
    let freeze = if freeze { " (FREEZE)" } else { "" };
    format!(
        "COPY {} ({}) FROM STDIN{freeze}",
        qualified(table),
        list.join(", ")
    )
}

/// Folds `planned`'s archive to its head and deals its rows, encoded, to `streams` in chunks;
/// returns the rows produced. Ends (dropping the senders) on the first error. A JSONL
/// snapshot whose diffs' net effect fits in memory is read as blocks parsed on each stream's
/// thread ([`super::snapshot_blocks`]); anything else is folded row by row here.
pub(super) async fn produce(
    planned: &Planned,
    columns: &[CopyColumn],
    spill: &SpillConfig,
    counted: &[Arc<Progress>; 2],
    streams: Vec<mpsc::Sender<Bytes>>,
) -> anyhow::Result<u64> {
    let table = &planned.table;
    let mut head = match rows_of(planned, spill).await? {
        Rows::Blocks(snapshot, overlay) => {
            return super::snapshot_blocks::produce(
                planned, snapshot, overlay, columns, counted, streams,
            )
            .await;
        }
        Rows::Folded(head) => head,
    };
    let mut encoder = CopyEncoder::new(columns);
    let pool = chunk_pool(streams.len());
    let mut buf = pool.take();
    let mut rows = 0u64;
    let mut next = 0usize;
    let send = |chunk: Vec<u8>, next: &mut usize| {
        let stream = &streams[*next % streams.len()];
        *next += 1;
        let chunk = pool.freeze(chunk);
        async move {
            stream
                .send(chunk)
                .await
                .map_err(|_| anyhow::anyhow!("restore: a COPY stream into {table} stopped"))
        }
    };
    while let Some(row) = head.rows.recv().await {
        let before = buf.len();
        encoder
            .encode(row.as_str(), &mut buf)
            .with_context(|| format!("table {table}: row {}", rows + 1))?;
        rows += 1;
        for p in counted {
            p.add(1, (buf.len() - before) as u64);
        }
        if rows == PAUSE_AFTER_ROWS {
            larch_archive::crashpoint::pause_point(larch_archive::crashpoint::RESTORE_ROWS).await;
        }
        if buf.len() >= COPY_CHUNK {
            send(std::mem::replace(&mut buf, pool.take()), &mut next).await?;
        }
    }
    match head.verdict.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(anyhow::Error::new(e).context(format!("table {table}"))),
        Err(_) => bail!("table {table}: the archive reader stopped"),
    }
    if !buf.is_empty() {
        send(buf, &mut next).await?;
    }
    Ok(rows)
}

/// Where a table's rows come from.
enum Rows<'a> {
    /// Its JSONL snapshot, read in blocks, past its diffs' net effect held in memory.
    Blocks(&'a Artifact, ChangeBuffer),
    /// Folded row by row.
    Folded(HeadRows),
}

async fn rows_of<'a>(planned: &'a Planned, spill: &SpillConfig) -> anyhow::Result<Rows<'a>> {
    let spill_dir = Spill::open(
        spill.clone(),
        &tag("restore", &[&planned.table.to_string()]),
    );
    let (reader, plan, keys) = (&planned.reader, &planned.plan, &planned.key_fields);
    let Some(snapshot) = super::snapshot_blocks::jsonl_snapshot(planned) else {
        let head = head_rows(
            reader.clone(),
            plan.clone(),
            keys.clone(),
            spill_dir,
            spill.memory_limit,
        );
        return Ok(Rows::Folded(head));
    };
    let overlay = fold_diffs(reader, plan, keys, spill_dir, spill.memory_limit)
        .await
        .with_context(|| format!("table {}", planned.table))?;
    if !overlay.has_runs() {
        return Ok(Rows::Blocks(snapshot, overlay));
    }
    let head = head_rows_past(
        reader.clone(),
        plan.clone(),
        keys.clone(),
        overlay,
        spill.memory_limit,
    );
    Ok(Rows::Folded(head))
}

/// Writes the chunks `rx` receives into `sink` and finishes the COPY; returns the rows
/// PostgreSQL copied.
pub(super) async fn consume(
    sink: CopyInSink<Bytes>,
    mut rx: mpsc::Receiver<Bytes>,
    table: &TableId,
) -> anyhow::Result<u64> {
    futures::pin_mut!(sink);
    while let Some(chunk) = rx.recv().await {
        sink.send(chunk)
            .await
            .with_context(|| format!("restore: COPY into {table}"))?;
    }
    sink.finish()
        .await
        .with_context(|| format!("restore: COPY into {table}"))
}

/// Buffers for the chunks of `streams` streams: per stream one being filled, one being sent
/// and the ones queued. A row longer than the slack grows its chunk.
pub(super) fn chunk_pool(streams: usize) -> ChunkPool {
    ChunkPool::new(COPY_CHUNK + (64 << 10), streams * (CHUNKS_IN_FLIGHT + 2))
}

/// A stream's channel.
pub(super) fn channel() -> (mpsc::Sender<Bytes>, mpsc::Receiver<Bytes>) {
    mpsc::channel(CHUNKS_IN_FLIGHT)
}

/// The rows copied when producing and every stream succeeded and they agree; a stream's own
/// error first (the producer then only saw the stream stop).
pub(super) fn outcome(
    table: &TableId,
    produced: anyhow::Result<u64>,
    copied: Vec<anyhow::Result<u64>>,
) -> anyhow::Result<u64> {
    let mut total = 0u64;
    for c in copied {
        total += c?;
    }
    let rows = produced?;
    if total != rows {
        bail!("table {table}: sent {rows} rows, PostgreSQL copied {total}");
    }
    Ok(rows)
}

/// Loads `planned` into its staging table over `split` connections, each COPY committed on
/// its own; the caller renames the staging table in its transaction, or drops it.
pub(super) async fn load_split(
    dsn: &PgDsn,
    planned: &Planned,
    columns: &[CopyColumn],
    spill: &SpillConfig,
    counted: &[Arc<Progress>; 2],
    split: usize,
) -> anyhow::Result<u64> {
    let staging = staging_table(&planned.table);
    let sql = copy_sql(&staging, columns, false);
    let mut senders = Vec::with_capacity(split);
    let mut tasks = Vec::with_capacity(split);
    for _ in 0..split {
        let (client, connection) = connect(dsn).await?;
        let sink = client
            .copy_in::<_, Bytes>(&sql)
            .await
            .with_context(|| format!("restore: COPY into {} (staging)", planned.table))?;
        let (tx, rx) = channel();
        senders.push(tx);
        let table = planned.table.clone();
        tasks.push(tokio::spawn(async move {
            let copied = consume(sink, rx, &table).await;
            drop(client);
            let _ = connection.await;
            copied
        }));
    }
    let produced = produce(planned, columns, spill, counted, senders).await;
    let mut copied = Vec::with_capacity(split);
    for t in tasks {
        copied.push(
            t.await
                .unwrap_or_else(|e| Err(anyhow::anyhow!("a COPY stream panicked: {e}"))),
        );
    }
    outcome(&planned.table, produced, copied)
}
