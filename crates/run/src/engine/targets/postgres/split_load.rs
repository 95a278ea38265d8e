//! A baseline over several COPY streams (`split: N` of a postgres target): the staging table is
//! created and committed first so that N connections of their own can each COPY a share of the
//! rows into it (PostgreSQL parses and writes them in N backends at once); the engine encodes
//! the rows once and deals them in chunks. The swap then happens in the baseline's transaction
//! as for one stream, so readers still see the old table or the new one. A staging table left
//! by a failed or killed baseline is dropped by the next one.

use anyhow::Context;
use bytes::Bytes;
use futures::SinkExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::{PostgresTarget, qualified, quote_ident};
use crate::engine::targets::postgres_copy::{ChunkPool, CopyColumn};
use larch_archive::model::TableId;

/// Bytes of encoded rows gathered before they go to the next stream.
const CHUNK: usize = 256 * 1024;
/// Chunks queued per stream: the baseline waits when the slowest stream is this far behind.
const CHUNKS_IN_FLIGHT: usize = 2;

/// The N streams of one baseline.
pub(super) struct SplitCopy {
    streams: Vec<mpsc::Sender<Bytes>>,
    tasks: Vec<JoinHandle<anyhow::Result<u64>>>,
    next: usize,
    gathered: Vec<u8>,
    pool: ChunkPool,
}

impl SplitCopy {
    /// Opens `n` connections, each with a `COPY staging (columns) FROM STDIN` of its own.
    pub(super) async fn start(
        target: &PostgresTarget,
        staging: &TableId,
        columns: &[CopyColumn],
        n: usize,
    ) -> anyhow::Result<SplitCopy> {
        let names: Vec<String> = columns.iter().map(|c| quote_ident(&c.name)).collect();
        let sql = format!(
            "COPY {} ({}) FROM STDIN",
            qualified(staging),
            names.join(", ")
        );
        // Per stream: one chunk being sent and the ones queued; one being gathered.
        let pool = ChunkPool::new(CHUNK + CHUNK / 4, n * (CHUNKS_IN_FLIGHT + 1) + 1);
        let mut split = SplitCopy {
            streams: Vec::with_capacity(n),
            tasks: Vec::with_capacity(n),
            next: 0,
            gathered: pool.take(),
            pool,
        };
        for stream in 0..n {
            let client = target.connect().await?;
            let sink = client.copy_in::<_, Bytes>(&sql).await.with_context(|| {
                format!("postgres target {}: COPY stream {stream}", target.table)
            })?;
            let (tx, mut rx) = mpsc::channel::<Bytes>(CHUNKS_IN_FLIGHT);
            let table = target.table.clone();
            split.streams.push(tx);
            split.tasks.push(tokio::spawn(async move {
                // The client lives as long as its COPY.
                let _client = client;
                let mut sink = Box::pin(sink);
                while let Some(chunk) = rx.recv().await {
                    sink.send(chunk).await.with_context(|| {
                        format!("postgres target {table}: COPY stream {stream}")
                    })?;
                }
                sink.as_mut()
                    .finish()
                    .await
                    .with_context(|| format!("postgres target {table}: COPY stream {stream}"))
            }));
        }
        Ok(split)
    }

    /// Queues encoded rows (whole COPY lines); a full chunk goes to the next stream.
    pub(super) async fn send(&mut self, encoded: &[u8]) -> anyhow::Result<()> {
        self.gathered.extend_from_slice(encoded);
        if self.gathered.len() >= CHUNK {
            self.flush().await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> anyhow::Result<()> {
        if self.gathered.is_empty() {
            return Ok(());
        }
        let chunk = self
            .pool
            .freeze(std::mem::replace(&mut self.gathered, self.pool.take()));
        let stream = self.next % self.streams.len();
        self.next += 1;
        if self.streams[stream].send(chunk).await.is_err() {
            // The stream's task ended early: its error says why.
            let task = self.tasks.swap_remove(stream);
            return Err(match task.await {
                Ok(Err(e)) => e,
                Ok(Ok(_)) => anyhow::anyhow!("a COPY stream ended before the baseline's rows"),
                Err(e) => anyhow::anyhow!("a COPY stream panicked: {e}"),
            });
        }
        Ok(())
    }

    /// Ends every stream (each commits its COPY); the rows they loaded.
    pub(super) async fn finish(mut self) -> anyhow::Result<u64> {
        self.flush().await?;
        self.streams.clear();
        let mut rows = 0;
        for task in std::mem::take(&mut self.tasks) {
            rows += task
                .await
                .map_err(|e| anyhow::anyhow!("a COPY stream panicked: {e}"))??;
        }
        Ok(rows)
    }
}

impl Drop for SplitCopy {
    fn drop(&mut self) {
        // An abandoned baseline: each stream's COPY fails when its task ends mid-copy.
        for task in &self.tasks {
            task.abort();
        }
    }
}
