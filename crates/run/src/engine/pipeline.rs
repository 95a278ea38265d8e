//! Pipelines: one runner per source drives that source's pipelines (one per target) through
//! init → baseline (or resume) → stream, re-baselining when the source asks (laredo §9.1–9.4).
//!
//! * Acks (§9.3): the baseline position is confirmed for every pipeline; change positions
//!   only when every pipeline of the source is durable (a memory target loses its state on
//!   restart, so the state file keeps the baseline position).
//! * Resume: only when every target is durable; a target's own checkpoint wins over the state
//!   file (C3). Memory targets always start from a baseline.
//! * Errors never end a runner: a failed baseline or stream marks the pipelines ERROR and is
//!   retried with backoff (C5); only shutdown stops it — and a configuration the archive
//!   cannot serve ([`ColumnMismatch`]: an index or key field that is not one of its columns),
//!   which retrying cannot fix: the runner ends with it and the engine exits.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{DateTime, SecondsFormat, Utc};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::metrics::{Metrics, PipelineState};
use super::targets::{Resume, Target};
use crate::archive_source::ArchiveReplaySource;
use larch_archive::error::ArchiveError;
use larch_archive::manifest::format_time;
use larch_archive::model::{ColumnDefinition, TableId, check_key_fields, effective_key_fields};
use larch_archive::source::{ChangeEvent, SourceError, SourceEvent, SourceState, SyncSource};
use larch_archive::value::Row;
use larch_core::failure::{self, Reason};
use larch_core::locks::MutexExt;
use larch_core::progress::{Progress, Reporter};

const BATCH: usize = 1024;

pub use super::column_mismatch::ColumnMismatch;

/// Whether the pipeline gives up on `err` instead of retrying: fields the archive lacks, an
/// unmasked archive under `require_transformed`, or no archive at all without `follow` (which
/// would wait for it): retrying would only log the refusal; the engine exits with the reason,
/// so the pod's restart reads the archive again.
fn stops_the_pipeline(err: &anyhow::Error) -> bool {
    err.chain().any(|c| {
        c.is::<ColumnMismatch>()
            || matches!(
                c.downcast_ref::<ArchiveError>(),
                Some(ArchiveError::ManifestNotFound { .. })
            )
    }) || failure::classify(err) == Reason::ArchiveNotTransformed
}

/// Refuses configured fields that are not `columns`, when the manifest declares its columns.
/// Without them (laredo archives may have none) the source infers them from the first row of
/// the snapshot, as laredo does: such columns carry no type and may miss a field that is null
/// there, so they are not judged.
fn check_fields(
    source: &str,
    table: &TableId,
    columns: &[ColumnDefinition],
    fields: &[(&str, &[String])],
) -> Result<(), ColumnMismatch> {
    let declared = !columns.is_empty() && columns.iter().any(|c| !c.type_name.is_empty());
    if !declared {
        return Ok(());
    }
    for (what, names) in fields {
        if let Some(bad) = names
            .iter()
            .find(|f| !columns.iter().any(|c| &c.name == *f))
        {
            let mut known: Vec<&str> = columns.iter().take(20).map(|c| c.name.as_str()).collect();
            if columns.len() > 20 {
                known.push("…");
            }
            return Err(ColumnMismatch(format!(
                "source {source}: {what} {bad:?} is not a column of table {table} in the archive (its columns: {})",
                known.join(", ")
            )));
        }
    }
    Ok(())
}

/// One source → one target.
pub struct Pipeline {
    pub id: String,
    pub target: Arc<dyn Target>,
    state: Mutex<PipelineState>,
    position: Mutex<Option<String>>,
    baseline_rows: AtomicU64,
    last_rebaseline: Mutex<Option<DateTime<Utc>>>,
}

impl Pipeline {
    pub fn new(id: String, target: Arc<dyn Target>) -> Pipeline {
        Pipeline {
            id,
            target,
            state: Mutex::new(PipelineState::Initializing),
            position: Mutex::new(None),
            baseline_rows: AtomicU64::new(0),
            last_rebaseline: Mutex::new(None),
        }
    }

    pub fn state(&self) -> PipelineState {
        *self.state.locked()
    }

    pub fn position(&self) -> Option<String> {
        self.position.locked().clone()
    }
}

enum StreamEnd {
    /// A one-shot replay reached the head.
    Done,
    Stopped,
    Rebaseline(String),
    Failed(anyhow::Error),
}

pub struct SourceRunner {
    pub id: String,
    pub table: TableId,
    /// Explicitly configured key fields.
    pub key_fields: Vec<String>,
    pub source: Arc<dyn SyncSource>,
    /// The same source, for archive-specific status (head, epoch).
    pub archive: Option<Arc<ArchiveReplaySource>>,
    pub pipelines: Vec<Arc<Pipeline>>,
    metrics: Metrics,
    rebaselines: AtomicU64,
    ready: AtomicBool,
    /// The error of the last failed baseline or stream, until one succeeds: (when, message).
    last_error: Mutex<Option<(String, String)>>,
    /// The baseline being loaded, else the last one.
    baseline_progress: Mutex<Option<Arc<Progress>>>,
    /// A reload asked for over the API (laredo's ReloadTable/ReloadAll): the stream ends and
    /// a new baseline is loaded from the archive.
    reload: tokio::sync::Notify,
}

impl SourceRunner {
    pub fn new(
        id: String,
        table: TableId,
        key_fields: Vec<String>,
        source: Arc<dyn SyncSource>,
        archive: Option<Arc<ArchiveReplaySource>>,
        pipelines: Vec<Arc<Pipeline>>,
        metrics: Metrics,
    ) -> SourceRunner {
        for p in &pipelines {
            metrics.set_state(&p.id, PipelineState::Initializing);
            // Zero until the first one: rate() and dashboards see the pipeline at once.
            metrics.change_errors_total.with_label_values(&[&p.id]);
            metrics
                .baseline_rows_loaded_total
                .with_label_values(&[&p.id]);
        }
        metrics.source_rebaseline_total.with_label_values(&[&id]);
        SourceRunner {
            id,
            table,
            key_fields,
            source,
            archive,
            pipelines,
            metrics,
            rebaselines: AtomicU64::new(0),
            ready: AtomicBool::new(false),
            last_error: Mutex::new(None),
            baseline_progress: Mutex::new(None),
            reload: tokio::sync::Notify::new(),
        }
    }

    /// Asks for a new baseline from the archive: the stream stops after the change being
    /// applied and the targets load the archive again (counted as a re-baseline). Asked for
    /// while a baseline loads, it takes effect once that baseline is done.
    pub fn request_reload(&self) {
        self.reload.notify_one();
    }

    /// Keeps `e` for `/status`, reduced like a termination message: a target's data error
    /// (a duplicate key in a PostgreSQL target) names its table and constraint, never values.
    fn note_error(&self, e: Option<&anyhow::Error>) {
        *self.last_error.locked() = e.map(|e| {
            (
                Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true),
                crate::reasons::render(e),
            )
        });
    }

    /// Ready latch: every pipeline has had its first baseline (or resumed).
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    pub fn rebaselines(&self) -> u64 {
        self.rebaselines.load(Ordering::SeqCst)
    }

    fn set_state(&self, state: PipelineState) {
        for p in &self.pipelines {
            *p.state.locked() = state;
            self.metrics.set_state(&p.id, state);
        }
    }

    fn set_position(&self, position: &str) {
        for p in &self.pipelines {
            *p.position.locked() = Some(position.to_string());
        }
    }

    /// Refreshes the lag and baseline gauges and the PAUSED state.
    pub fn refresh(&self) {
        let lag = self.source.lag();
        if let Some(time) = lag.time {
            self.metrics
                .source_data_age_seconds
                .with_label_values(&[&self.id])
                .set(time.as_secs_f64());
        }
        if let Some(a) = &self.archive {
            let behind = a.info().behind;
            let m = &self.metrics;
            m.source_behind_diffs
                .with_label_values(&[&self.id])
                .set(behind.diffs as i64);
            m.source_behind_bytes
                .with_label_values(&[&self.id])
                .set(behind.bytes as i64);
            // How long the engine is behind, not how old the data is: 0 when caught up.
            m.source_lag_seconds
                .with_label_values(&[&self.id])
                .set(behind.seconds());
        }
        if let Some(r) = self.baseline_report() {
            for p in &self.pipelines {
                self.metrics
                    .baseline_expected_rows
                    .with_label_values(&[&p.id])
                    .set(r.total_rows.map_or(-1, |n| n as i64));
            }
        }
        let paused = self.source.state() == SourceState::Paused;
        for p in &self.pipelines {
            let mut s = p.state.locked();
            let next = match (*s, paused) {
                (PipelineState::Streaming, true) => PipelineState::Paused,
                (PipelineState::Paused, false) => PipelineState::Streaming,
                (s, _) => s,
            };
            if next != *s {
                *s = next;
                self.metrics.set_state(&p.id, next);
            }
        }
    }

    fn baseline_report(&self) -> Option<larch_core::progress::ProgressReport> {
        let p = self.baseline_progress.locked().clone();
        p.map(|p| p.report())
    }

    /// `/status` entries: (source JSON, [(pipeline id, pipeline JSON)]).
    pub fn status(&self) -> (serde_json::Value, Vec<(String, serde_json::Value)>) {
        let info = self.archive.as_ref().map(|a| a.info()).unwrap_or_default();
        let lag = self.source.lag().time.map(|d| d.as_secs_f64());
        let baseline = self.baseline_report();
        let source = serde_json::json!({
            "state": self.source.state().as_str(),
            "table": self.table.to_string(),
            "position": info.position,
            "head": info.head,
            "epoch": info.epoch,
            "lag_seconds": lag,
            // The age of the head's data, whether or not we are caught up with it.
            "data_age_seconds": lag,
            // Distance behind the head: 0 when caught up.
            "behind": {
                "diffs": info.behind.diffs,
                "bytes": info.behind.bytes,
                "seconds": info.behind.seconds(),
            },
            "head_time": info.head_time,
            "rebaselines": self.rebaselines(),
            "acked": info.acked,
            // The chain stops before the head: the state served is older than the archive's.
            "short_chain": info.short_chain.map(|s| serde_json::json!({
                "reached": s.reached, "head": s.head, "reason": s.reason,
            })),
            // Pinned at a point in time: what was asked for and what is served.
            "at": self.archive.as_ref().and_then(|a| a.options().at).map(|at| {
                let r = info.restored.as_ref();
                serde_json::json!({
                    "requested": at.value(),
                    "position": r.map(|r| r.position.clone()),
                    "time": r.and_then(|r| r.time).map(|t| format_time(&t)),
                    "precision": r.map(|r| r.precision.as_str()),
                    "notice": r.and_then(|r| r.notice.clone()),
                })
            }),
            // Why it is not STREAMING: the storage error being retried, else the last failed
            // baseline or stream.
            "last_error": info.last_error.or_else(|| self.last_error.locked().clone())
                .map(|(at, message)| serde_json::json!({"at": at, "message": message})),
        });
        let pipelines = self
            .pipelines
            .iter()
            .map(|p| {
                (
                    p.id.clone(),
                    serde_json::json!({
                        "source": self.id,
                        "table": self.table.to_string(),
                        "target": p.target.kind(),
                        "state": p.state().as_str(),
                        "position": p.position(),
                        "row_count": p.target.row_count(),
                        "baseline_rows": p.baseline_rows.load(Ordering::SeqCst),
                        // The baseline loading now (else the last): rows of the manifest's.
                        "baseline_progress": baseline,
                        "last_rebaseline": p.last_rebaseline.locked()
                            .map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true)),
                    }),
                )
            })
            .collect();
        (source, pipelines)
    }

    /// Runs until `shutdown`; returns early only with an error retrying cannot clear
    /// ([`stops_the_pipeline`]).
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) -> anyhow::Result<()> {
        let mut position: Option<String> = None;
        let mut need_baseline = true;
        let mut first = true;
        let mut backoff =
            larch_core::retry::Backoff::new(Duration::from_millis(200), Duration::from_secs(30));
        loop {
            if shutdown.is_cancelled() {
                break;
            }
            if need_baseline {
                let step = self.init_or_resume(first);
                let result = tokio::select! {
                    r = step => r,
                    _ = shutdown.cancelled() => break,
                };
                match result {
                    Ok(pos) => {
                        self.note_error(None);
                        position = Some(pos);
                        need_baseline = false;
                        first = false;
                        backoff.reset();
                    }
                    Err(e)
                        if e.downcast_ref::<SourceError>()
                            .is_some_and(SourceError::is_rebaseline) =>
                    {
                        // The archive moved on between init and baseline (a new schema): again.
                        tracing::info!(source = %self.id, reason = format!("{e:#}"), "baseline superseded; initialising again");
                        continue;
                    }
                    Err(e) if stops_the_pipeline(&e) => {
                        tracing::error!(source = %self.id, error = crate::reasons::render(&e), "the archive cannot be served as configured");
                        self.set_state(PipelineState::Error);
                        self.source.close().await;
                        return Err(e);
                    }
                    Err(e) => {
                        self.note_error(Some(&e));
                        let delay = backoff.next_delay();
                        tracing::error!(source = %self.id, error = crate::reasons::render(&e), "baseline failed; retrying in {delay:?}");
                        self.set_state(PipelineState::Error);
                        if sleep_or_shutdown(delay, &shutdown).await {
                            break;
                        }
                        continue;
                    }
                }
            }
            let from = position.clone().unwrap_or_default();
            match self.stream(from, &shutdown, &mut position).await {
                StreamEnd::Done => {
                    tracing::info!(source = %self.id, "replay reached the head (not following)");
                    shutdown.cancelled().await;
                    break;
                }
                StreamEnd::Stopped => break,
                StreamEnd::Rebaseline(why) => {
                    self.note_rebaseline(&why);
                    need_baseline = true;
                }
                StreamEnd::Failed(e) => {
                    self.note_error(Some(&e));
                    let delay = backoff.next_delay();
                    tracing::error!(source = %self.id, error = crate::reasons::render(&e), "stream failed; retrying in {delay:?}");
                    self.set_state(PipelineState::Error);
                    for p in &self.pipelines {
                        p.target.discard_pending().await;
                    }
                    if sleep_or_shutdown(delay, &shutdown).await {
                        break;
                    }
                    self.set_state(PipelineState::Streaming);
                }
            }
        }
        self.source.close().await;
        self.set_state(PipelineState::Stopped);
        Ok(())
    }

    /// The position to stream from: on the first start, the one the targets and the source
    /// agree on when they can resume; else that of a new baseline.
    async fn init_or_resume(&self, first: bool) -> anyhow::Result<String> {
        self.init_targets().await?;
        if first && let Some(pos) = self.resume_position().await? {
            tracing::info!(source = %self.id, position = %pos, "resuming from the stored position");
            self.set_position(&pos);
            self.set_state(PipelineState::Streaming);
            self.ready.store(true, Ordering::SeqCst);
            return Ok(pos);
        }
        self.baseline().await
    }

    fn note_rebaseline(&self, why: &str) {
        tracing::warn!(source = %self.id, reason = %why, "re-baseline");
        self.rebaselines.fetch_add(1, Ordering::SeqCst);
        self.metrics
            .source_rebaseline_total
            .with_label_values(&[&self.id])
            .inc();
    }

    async fn init_targets(&self) -> anyhow::Result<()> {
        let mut all = self
            .source
            .init(std::slice::from_ref(&self.table))
            .await
            .with_context(|| format!("source {}: init", self.id))?;
        let columns = all.remove(&self.table).unwrap_or_default();
        check_fields(
            &self.id,
            &self.table,
            &columns,
            &[("key field", &self.key_fields)],
        )?;
        // A field that is no column was refused just above when the manifest declares its
        // columns (inferred ones are not judged); left: the warning for key fields other than
        // the archive's primary key.
        if let Ok(Some(warning)) = check_key_fields(&self.key_fields, &columns) {
            tracing::warn!(source = %self.id, "key_fields: {warning}");
        }
        for p in &self.pipelines {
            check_fields(
                &self.id,
                &self.table,
                &columns,
                &[("index field", p.target.index_fields())],
            )?;
        }
        let key_fields = effective_key_fields(&self.key_fields, &columns);
        for p in &self.pipelines {
            p.target
                .init(&columns, &key_fields)
                .await
                .with_context(|| format!("pipeline {}: init", p.id))?;
        }
        Ok(())
    }

    async fn resume_position(&self) -> anyhow::Result<Option<String>> {
        if !self.source.supports_resume() {
            return Ok(None);
        }
        if let Some(p) = self.pipelines.iter().find(|p| !p.target.is_durable()) {
            tracing::info!(source = %self.id, pipeline = %p.id, "a non-durable target holds nothing after a restart: taking a baseline");
            return Ok(None);
        }
        if let Some(p) = self.pipelines.iter().find(|p| p.target.needs_baseline()) {
            tracing::info!(source = %self.id, pipeline = %p.id, "the target's table differs from the archive's columns: taking a baseline that alters it");
            return Ok(None);
        }
        let mut recorded = Vec::new();
        for p in &self.pipelines {
            match p.target.resume_position().await? {
                Resume::Unrecorded => {}
                // Checked before the state file: a target that cannot vouch for its rows is
                // rebuilt even when the state file has a position.
                Resume::Baseline(why) => {
                    tracing::warn!(source = %self.id, pipeline = %p.id, reason = %why, "not resuming: taking a baseline");
                    return Ok(None);
                }
                Resume::At(position) => recorded.push(position),
            }
        }
        if recorded.is_empty() {
            return self.source.last_acked_position().await;
        }
        // C3: the targets' own checkpoints win over the state file.
        if recorded.len() == self.pipelines.len() && recorded.iter().all(|r| *r == recorded[0]) {
            return Ok(recorded.pop());
        }
        tracing::warn!(source = %self.id, ?recorded, "targets hold different positions: taking a baseline");
        Ok(None)
    }

    async fn baseline(&self) -> anyhow::Result<String> {
        self.set_state(PipelineState::Baselining);
        let started = Instant::now();
        for p in &self.pipelines {
            p.target.begin_baseline().await?;
        }
        let (tx, mut rx) = mpsc::channel::<(TableId, Row)>(4 * BATCH);
        let source = self.source.clone();
        let table = self.table.clone();
        let task = tokio::spawn(async move { source.baseline(&[table], tx).await });
        let progress = Progress::new("baseline", self.id.clone());
        *self.baseline_progress.locked() = Some(progress.clone());
        let reporter = Reporter::start(progress.clone());
        let mut rows = 0u64;
        let loaded = self.load_baseline(&mut rx, &progress, &mut rows).await;
        drop(rx);
        let produced = task.await;
        reporter.finish(loaded.is_ok() && matches!(produced, Ok(Ok(_))));
        let position = match (loaded, produced) {
            (Ok(()), Ok(Ok(pos))) => pos,
            (Err(e), _) => {
                self.abort_baseline().await;
                return Err(e);
            }
            (_, Ok(Err(e))) => {
                self.abort_baseline().await;
                return Err(anyhow::Error::from(e).context(format!("source {}: baseline", self.id)));
            }
            (_, Err(e)) => {
                self.abort_baseline().await;
                return Err(anyhow::anyhow!("source {}: baseline task: {e}", self.id));
            }
        };
        for p in &self.pipelines {
            p.target
                .commit_baseline(&position)
                .await
                .with_context(|| format!("pipeline {}: committing the baseline", p.id))?;
        }
        let elapsed = started.elapsed();
        self.note_baseline_done(rows, elapsed);
        tracing::info!(source = %self.id, rows, position = %position, seconds = elapsed.as_secs_f64(), "baseline complete");
        self.set_position(&position);
        // The baseline position is confirmed for every pipeline.
        if let Err(e) = self.source.ack(&position).await {
            tracing::warn!(source = %self.id, error = crate::reasons::render(&e), "ack failed");
        }
        self.set_state(PipelineState::Streaming);
        self.ready.store(true, Ordering::SeqCst);
        Ok(position)
    }

    /// Hands the baseline's rows to the targets in batches of [`BATCH`] (the last target
    /// takes each batch itself, the others a copy), counting them in `rows`.
    async fn load_baseline(
        &self,
        rx: &mut mpsc::Receiver<(TableId, Row)>,
        progress: &Progress,
        rows: &mut u64,
    ) -> anyhow::Result<()> {
        let mut batch = Vec::with_capacity(BATCH);
        loop {
            let done = match rx.recv().await {
                Some((_, row)) => {
                    batch.push(row);
                    false
                }
                None => true,
            };
            if batch.len() >= BATCH || (done && !batch.is_empty()) {
                *rows += batch.len() as u64;
                self.note_loaded(progress, &batch);
                let last = self.pipelines.len().saturating_sub(1);
                for (i, p) in self.pipelines.iter().enumerate() {
                    // The last target takes the batch itself, the others a copy.
                    let rows = if i == last {
                        std::mem::replace(&mut batch, Vec::with_capacity(BATCH))
                    } else {
                        batch.clone()
                    };
                    p.target
                        .baseline_rows(rows)
                        .await
                        .with_context(|| format!("pipeline {}: baseline", p.id))?;
                }
                batch.clear();
            }
            if done {
                return Ok(());
            }
        }
    }

    /// A committed baseline of `rows` rows: each pipeline's counters and metrics.
    fn note_baseline_done(&self, rows: u64, elapsed: Duration) {
        let rebaseline = self.ready();
        for p in &self.pipelines {
            p.baseline_rows.store(rows, Ordering::SeqCst);
            if rebaseline {
                *p.last_rebaseline.locked() = Some(Utc::now());
            }
            self.metrics
                .baseline_duration_seconds
                .with_label_values(&[&p.id])
                .observe(elapsed.as_secs_f64());
            for gauge in [
                &self.metrics.baseline_rows_total,
                &self.metrics.baseline_rows,
            ] {
                gauge.with_label_values(&[&p.id]).set(rows as i64);
            }
        }
    }

    /// A batch of the baseline handed to the targets: progress and laredo's row counter. The
    /// total is the snapshot's `row_count`, known once the source read the manifest.
    fn note_loaded(&self, progress: &Progress, batch: &[Row]) {
        let bytes = batch.iter().map(|r| r.as_str().len() as u64).sum();
        progress.add(batch.len() as u64, bytes);
        if progress.total().is_none()
            && let Some(expected) = self
                .archive
                .as_ref()
                .and_then(|a| a.info().baseline_rows_expected)
        {
            progress.set_total(Some(expected));
        }
        for p in &self.pipelines {
            self.metrics
                .baseline_rows_loaded_total
                .with_label_values(&[&p.id])
                .inc_by(batch.len() as u64);
        }
    }

    async fn abort_baseline(&self) {
        for p in &self.pipelines {
            p.target.abort_baseline().await;
        }
    }

    async fn stream(
        &self,
        from: String,
        shutdown: &CancellationToken,
        position: &mut Option<String>,
    ) -> StreamEnd {
        let (tx, mut rx) = mpsc::channel(BATCH);
        let source = self.source.clone();
        let task = tokio::spawn(async move { source.stream(&from, tx).await });
        let durable = self.pipelines.iter().all(|p| p.target.is_durable());
        let mut failed: Option<anyhow::Error> = None;
        loop {
            let ev = tokio::select! {
                ev = rx.recv() => ev,
                _ = shutdown.cancelled() => {
                    self.source.close().await;
                    drop(rx);
                    let _ = task.await;
                    return StreamEnd::Stopped;
                }
                _ = self.reload.notified() => {
                    // The source's stream ends when its channel closes.
                    drop(rx);
                    let _ = task.await;
                    for p in &self.pipelines {
                        p.target.discard_pending().await;
                    }
                    return StreamEnd::Rebaseline("a reload was requested over the API".into());
                }
            };
            match ev {
                None => break,
                Some(SourceEvent::Change(c)) => self.apply_change(&c, &mut failed).await,
                Some(SourceEvent::Checkpoint { position: pos }) => {
                    if !self.checkpoint_all(&pos, shutdown).await {
                        self.source.close().await;
                        drop(rx);
                        let _ = task.await;
                        return StreamEnd::Stopped;
                    }
                    *position = Some(pos.clone());
                    self.set_position(&pos);
                    self.note_error(None);
                    // Targets committed `pos`; the source's state file does not have it yet.
                    larch_archive::crashpoint::crash_point(
                        larch_archive::crashpoint::ENGINE_AFTER_CHECKPOINT,
                    );
                    if durable && let Err(e) = self.source.ack(&pos).await {
                        tracing::warn!(source = %self.id, error = crate::reasons::render(&e), "ack failed");
                    }
                }
            }
            if failed.is_some() {
                break;
            }
        }
        drop(rx);
        let result = task.await;
        if let Some(e) = failed {
            return StreamEnd::Failed(e);
        }
        match result {
            Ok(Ok(())) => StreamEnd::Done,
            Ok(Err(SourceError::ReBaselineRequired(why))) => StreamEnd::Rebaseline(why),
            Ok(Err(SourceError::Stopped)) if shutdown.is_cancelled() => StreamEnd::Stopped,
            Ok(Err(e)) => StreamEnd::Failed(anyhow::Error::from(e)),
            Err(e) => StreamEnd::Failed(anyhow::anyhow!("stream task: {e}")),
        }
    }

    /// Applies one change to every pipeline, timing it; an error is kept in `failed` (the
    /// stream stops after this change).
    async fn apply_change(&self, c: &ChangeEvent, failed: &mut Option<anyhow::Error>) {
        for p in &self.pipelines {
            let labels = [p.id.as_str(), c.action.as_str()];
            self.metrics
                .changes_received_total
                .with_label_values(&labels)
                .inc();
            let t = Instant::now();
            match p.target.apply(c).await {
                Ok(()) => {
                    self.metrics
                        .changes_applied_total
                        .with_label_values(&labels)
                        .inc();
                    self.metrics
                        .change_apply_duration_seconds
                        .with_label_values(&labels)
                        .observe(t.elapsed().as_secs_f64());
                }
                Err(e) => {
                    self.metrics
                        .change_errors_total
                        .with_label_values(&[&p.id])
                        .inc();
                    *failed = Some(e.context(format!("pipeline {}: apply", p.id)));
                }
            }
        }
    }

    /// Checkpoints `pos` in every pipeline, retrying each with backoff; false when shutdown
    /// came first.
    async fn checkpoint_all(&self, pos: &str, shutdown: &CancellationToken) -> bool {
        for p in &self.pipelines {
            let mut backoff = larch_core::retry::Backoff::new(
                Duration::from_millis(200),
                Duration::from_secs(30),
            );
            loop {
                match p.target.checkpoint(pos).await {
                    Ok(()) => break,
                    Err(e) => {
                        let delay = backoff.next_delay();
                        tracing::error!(pipeline = %p.id, error = crate::reasons::render(&e), "checkpoint failed; retrying in {delay:?}");
                        self.metrics
                            .change_errors_total
                            .with_label_values(&[&p.id])
                            .inc();
                        if sleep_or_shutdown(delay, shutdown).await {
                            return false;
                        }
                    }
                }
            }
        }
        true
    }

    /// Final ack of what durable targets hold (on shutdown).
    pub async fn final_ack(&self) {
        if self.pipelines.iter().all(|p| p.target.is_durable())
            && let Some(pos) = self.pipelines.first().and_then(|p| p.position())
            && let Err(e) = self.source.ack(&pos).await
        {
            tracing::warn!(source = %self.id, error = crate::reasons::render(&e), "final ack failed");
        }
    }
}

/// Sleeps; true when shutdown came first.
async fn sleep_or_shutdown(d: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => false,
        _ = shutdown.cancelled() => true,
    }
}
