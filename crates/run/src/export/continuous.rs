//! Continuous export (laredo's `archive export --follow` and `laredo-snapshotter`): a base
//! snapshot, then the source's changes collapsed into diffs every `diff_interval`, a new epoch
//! started when the new-epoch policy says so, acknowledged to PostgreSQL only once the diff holding them is committed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, watch};

use larch_archive::error::ArchiveError;
use larch_archive::manifest::format_time;
use larch_archive::model::ColumnDefinition;
use larch_archive::model::TableId;
use larch_archive::plan::plan_head;
use larch_archive::policy::EpochTrigger;
use larch_archive::position::{compare, same};
use larch_archive::source::{SourceError, SourceEvent, SyncSource};
use larch_archive::writer::{ArchiveWriter, FlushOutcome};
use larch_core::locks::MutexExt;
use larch_postgres::{PostgresSource, SchemaChange, schema_change};

// The HTTP side moved to `export::status` (the one-shot serves it too); its old paths stay.
pub use super::status::{BASELINE, COMPACTION, ExportMetrics, ExportStatus, Shared, router, serve};

/// A continuous export of one table.
pub struct ContinuousExport {
    pub source: Arc<PostgresSource>,
    pub table: TableId,
    pub writer: ArchiveWriter,
    pub diff_interval: Duration,
    pub shared: Arc<Shared>,
    /// Column transforms applied to every row before it is buffered (masked exports).
    pub masking: Option<Arc<super::transform::Masking>>,
}

impl ContinuousExport {
    fn publish(&self, state: &str) {
        let table = self.table.to_string();
        let m = &self.shared.metrics;
        m.epoch
            .with_label_values(&[&table])
            .set(self.writer.epoch());
        m.buffer_depth
            .with_label_values(&[&table])
            .set(self.writer.buffer_depth() as i64);
        m.churn
            .with_label_values(&[&table])
            .set(self.writer.churn() as i64);
        if let Some(usage) = self.source.slot_usage() {
            let report = super::slot::SlotReport::new(&usage.slot, Some(&usage));
            m.slot.set(&report);
            self.shared.status.locked().slot = Some(report);
        }
        let unreviewed = self
            .masking
            .as_ref()
            .map(|m| m.unreviewed())
            .unwrap_or_default();
        let mut s = self.shared.status.locked();
        s.unreviewed_columns = unreviewed;
        s.state = state.to_string();
        s.epoch = self.writer.epoch();
        s.head_position = self.writer.head().to_string();
        s.buffer_depth = self.writer.buffer_depth();
        s.churn_records = self.writer.churn();
        s.open_transaction_changes = self.writer.pending_changes();
        s.restorable = larch_archive::point_in_time::window(self.writer.manifest());
    }

    fn note_snapshot(&self, reason: &str) {
        let table = self.table.to_string();
        self.shared
            .metrics
            .artifacts
            .with_label_values(&[&table, "snapshot", reason])
            .inc();
        *self.shared.last_snapshot.locked() = Some(Instant::now());
        let mut s = self.shared.status.locked();
        s.snapshots += 1;
        s.last_snapshot_at = Some(format_time(&Utc::now().fixed_offset()));
    }

    /// A new baseline from PostgreSQL written as a snapshot at a new epoch (with the table's
    /// columns as the baseline found them); returns its position. `reason` labels the metric.
    async fn baseline(&mut self, reason: &str) -> anyhow::Result<String> {
        let progress = self.shared.start_progress(BASELINE, &self.table);
        let artifact = super::snapshot_from_source(
            self.source.clone(),
            &self.table,
            &mut self.writer,
            &progress,
            self.masking.as_deref(),
            None,
        )
        .await?;
        let position = artifact.to_position.clone();
        tracing::info!(epoch = artifact.epoch, position = %position, rows = artifact.row_count, reason, "baseline snapshot committed");
        self.note_snapshot(reason);
        Ok(position)
    }

    /// The current epoch's transform, when the export masks.
    fn transform(&self) -> Option<Arc<super::transform::TableTransform>> {
        self.masking.as_ref().and_then(|m| m.current())
    }

    /// How the table's columns now differ from those the archive is written with. A metadata
    /// change (a default, NOT NULL added) is recorded with the next commit; a shape change is
    /// returned (see [`Self::schema_epoch`]). A failed look-up is retried at the next interval.
    async fn schema_shape_change(&mut self) -> Option<String> {
        let recorded = self.writer.manifest().columns.clone();
        let found = self
            .source
            .schema_change(&self.table, &recorded, self.writer.key_fields())
            .await;
        // Compared as the archive has them: dropped columns are not the archive's.
        let found = found.map(|(change, now)| match self.transform() {
            Some(t) => {
                let columns = t.columns(&now.columns);
                let change = schema_change::classify(
                    &recorded,
                    self.writer.key_fields(),
                    &columns,
                    &now.key_fields,
                );
                (change, columns)
            }
            None => (change, now.columns),
        });
        match found {
            Ok((SchemaChange::Shape(why), _)) => Some(why),
            Ok((SchemaChange::Metadata, columns)) => {
                tracing::info!(table = %self.table, "column metadata changed (no row changes): recorded with the next commit");
                self.writer.set_columns(columns);
                None
            }
            Ok((SchemaChange::None, _)) => None,
            Err(e) => {
                tracing::warn!(
                    error = format!("{e:#}"),
                    "could not read the table's schema; checking again at the next interval"
                );
                None
            }
        }
    }

    /// A shape change (a DDL): the whole transactions received before it go into a last diff
    /// of this epoch, then a new epoch starts from a fresh consistent snapshot with the new
    /// columns (a new slot, like a lost one), so followers re-baseline and rows no change
    /// touched get the new columns too. Returns the new snapshot's position.
    async fn schema_epoch(
        &mut self,
        why: &str,
        last_position: &mut String,
        commit_times: &mut CommitTimes,
    ) -> anyhow::Result<String> {
        let started = Instant::now();
        tracing::warn!(table = %self.table, change = %why, "the table's schema changed: committing what is buffered, then a new epoch from a fresh snapshot");
        // The transaction holding the DDL goes whole into the new epoch (its snapshot).
        self.writer.discard_pending();
        self.flush(last_position, commit_times).await?;
        let position = self.baseline("schema_change").await?;
        last_position.clear();
        tracing::info!(
            epoch = self.writer.epoch(),
            seconds = started.elapsed().as_secs_f64(),
            "schema change: new epoch committed"
        );
        Ok(position)
    }

    /// Runs until `shutdown` flips; then flushes a final diff and returns.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) -> anyhow::Result<()> {
        let _ = self.shared.spill.set(self.writer.spill().clone());
        let schemas = self.source.init(std::slice::from_ref(&self.table)).await?;
        let columns = schemas.get(&self.table).cloned().unwrap_or_default();
        let (columns, transform_changed) = self.check_transform(columns)?;
        if let Some(why) = self.source.take_slot_lost_at_init() {
            self.report_slot_loss(&why).await;
        }
        let (mut from, mut skip_through) = self.start(columns, transform_changed).await?;
        self.shared.ready.send_replace(true);
        self.publish("STREAMING");
        let mut tick = tokio::time::interval(self.diff_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_position = String::new();
        let mut commit_times = CommitTimes::default();
        loop {
            let (tx, mut rx) = mpsc::channel::<SourceEvent>(4096);
            let source = self.source.clone();
            let start = from.clone();
            let mut stream = tokio::spawn(async move { source.stream(&start, tx).await });
            let mut stream_result = None;
            let stop = loop {
                tokio::select! {
                    ev = rx.recv() => match ev {
                        Some(ev) => self.accept(ev, &mut last_position, &mut commit_times, skip_through.as_deref())?,
                        None => {
                            stream_result = Some((&mut stream).await.unwrap_or_else(|e| Err(SourceError::Other(anyhow!("stream task: {e}")))));
                            break false;
                        }
                    },
                    _ = tick.tick() => {
                        // A DDL with no row change after it sends nothing down the stream.
                        if let Some(why) = self.schema_shape_change().await {
                            stream.abort();
                            let _ = (&mut stream).await;
                            stream_result = Some(Err(SourceError::SchemaChanged(why)));
                            break false;
                        }
                        self.flush(&last_position, &mut commit_times).await?;
                        self.publish("STREAMING");
                    }
                    () = stopped(&mut shutdown) => break true,
                }
            };
            if stop {
                let skip = skip_through.as_deref();
                return self
                    .stop(rx, stream, &mut last_position, &mut commit_times, skip)
                    .await;
            }
            // The stream ended by itself.
            let ended = stream_result.unwrap_or(Ok(()));
            from = self
                .restart(ended, &mut last_position, &mut commit_times)
                .await?;
            skip_through = None;
            self.publish("STREAMING");
        }
    }

    /// The rules are checked against the table before anything is exported; a transform
    /// other than the archive's (a new key, other rules) starts a new epoch, so one epoch
    /// never mixes two keys. Returns the columns as archived and why the transform changed.
    fn check_transform(
        &self,
        mut columns: Vec<ColumnDefinition>,
    ) -> anyhow::Result<(Vec<ColumnDefinition>, Option<&'static str>)> {
        let archived = self.writer.manifest().transform.as_ref();
        let Some(m) = &self.masking else {
            let changed = archived
                .is_some_and(|r| r.masks_anything())
                .then_some("the archive is masked and this export has no transform");
            return Ok((columns, changed));
        };
        let schema = self.source.table_schema(&self.table).ok_or_else(|| {
            anyhow!(
                "the columns of {} are unknown: its transform cannot be checked",
                self.table
            )
        })?;
        let t = m
            .compile(&schema)
            .map_err(|e| larch_core::failure::tag(larch_core::failure::Reason::InvalidConfig, e))?;
        columns = t.columns(&columns);
        let changed = match archived {
            Some(r) if r == t.record() => None,
            Some(r) if r.key_id != t.record().key_id => Some("the hash key changed"),
            Some(r) if r.hash != t.record().hash => Some("the hash algorithm changed"),
            Some(r) if r.permute.is_some() && r.permute != t.record().permute => {
                Some("the permute algorithm changed")
            }
            Some(_) => Some("the transform rules changed"),
            None => Some("the archive was not written with this transform"),
        };
        Ok((columns, changed))
    }

    /// Where the stream starts, and the position up to which re-delivered changes are skipped.
    /// Resume only when the slot survived, the archive's chain reaches its head and the
    /// table kept its shape; the stream may then re-deliver changes the archive already
    /// holds (committed, not yet acknowledged): they are skipped by position. Else a new
    /// epoch from a fresh snapshot.
    async fn start(
        &mut self,
        columns: Vec<ColumnDefinition>,
        transform_changed: Option<&'static str>,
    ) -> anyhow::Result<(String, Option<String>)> {
        let acked = self.source.last_acked_position().await?;
        let manifest = self.writer.manifest();
        let chain_ok =
            manifest.epoch > 0 && same(&plan_head(manifest).head_position, &manifest.head_position);
        let ddl = self.shape_changed_while_stopped();
        Ok(match (acked, &ddl) {
            (_, None) if transform_changed.is_some() => {
                let why = transform_changed.unwrap_or_default();
                tracing::warn!(table = %self.table, change = why, "the archive's transform differs: a new epoch from a fresh snapshot");
                (self.baseline("transform_change").await?, None)
            }
            (Some(a), None) if self.source.supports_resume() && chain_ok => {
                tracing::info!(slot_position = %a, head = %self.writer.head(), "resuming from the persistent slot");
                self.writer.set_columns(columns);
                (a, Some(self.writer.head().to_string()))
            }
            (_, Some(why)) => {
                tracing::warn!(table = %self.table, change = %why, "the table's schema changed while the export was stopped: a new epoch from a fresh snapshot");
                (self.baseline("schema_change").await?, None)
            }
            (_, None) => (self.baseline("baseline").await?, None),
        })
    }

    /// A DDL while the export was stopped: the archived rows have the old columns.
    fn shape_changed_while_stopped(&self) -> Option<String> {
        let manifest = self.writer.manifest();
        let now = self.source.table_schema(&self.table)?;
        if manifest.columns.is_empty() {
            return None;
        }
        let columns = match self.transform() {
            Some(t) => t.columns(&now.columns),
            None => now.columns.clone(),
        };
        match schema_change::classify(
            &manifest.columns,
            self.writer.key_fields(),
            &columns,
            &now.key_fields,
        ) {
            SchemaChange::Shape(why) => Some(why),
            SchemaChange::None | SchemaChange::Metadata => None,
        }
    }

    /// On shutdown: takes the events already received, flushes the final diff and closes.
    async fn stop(
        &mut self,
        mut rx: mpsc::Receiver<SourceEvent>,
        stream: tokio::task::JoinHandle<Result<(), SourceError>>,
        last_position: &mut String,
        commit_times: &mut CommitTimes,
        skip_through: Option<&str>,
    ) -> anyhow::Result<()> {
        tracing::info!("stopping: final flush");
        while let Ok(ev) = rx.try_recv() {
            self.accept(ev, last_position, commit_times, skip_through)?;
        }
        // A transaction without its COMMIT is not archived: the slot delivers it again.
        self.writer.discard_pending();
        let result = self.final_flush(last_position, commit_times).await;
        stream.abort();
        self.source.close().await;
        self.publish("STOPPED");
        result
    }

    /// The stream ended by itself: a lost slot re-baselines, a schema change starts a new
    /// epoch (the position to stream from next); anything else ends the export.
    async fn restart(
        &mut self,
        ended: Result<(), SourceError>,
        last_position: &mut String,
        commit_times: &mut CommitTimes,
    ) -> anyhow::Result<String> {
        match ended {
            Err(SourceError::ReBaselineRequired(why)) => {
                tracing::warn!(reason = %why, "the source asks for a re-baseline: writing a new snapshot so no change in the gap is lost");
                self.report_slot_loss(&why).await;
                self.writer.discard_pending();
                self.flush(last_position, commit_times).await?;
                let from = self.baseline("baseline").await?;
                last_position.clear();
                Ok(from)
            }
            Err(SourceError::SchemaChanged(why)) => {
                self.schema_epoch(&why, last_position, commit_times).await
            }
            Err(e) => Err(anyhow!(e).context("replication stream failed")),
            Ok(()) => Err(anyhow!("the replication stream ended unexpectedly")),
        }
    }

    /// Records a lost slot in `/status` (`slot_losses`, `last_slot_loss`) and, on Kubernetes,
    /// waits for the next `/status` read so the operator's Event precedes the re-baseline.
    async fn report_slot_loss(&self, why: &str) {
        let seen = {
            let mut s = self.shared.status.locked();
            s.state = "SLOT_LOST".into();
            s.slot_losses += 1;
            s.last_slot_loss = Some(super::slot::SlotLoss {
                at: super::slot::now_string(),
                reason: why.to_string(),
            });
            *self.shared.status_reads.borrow()
        };
        let wait = *self.shared.loss_report_wait.locked();
        if let Some(wait) = wait {
            tracing::warn!(reason = %why, "replication slot lost: waiting up to {wait:?} for /status to be read before the re-baseline");
            let read =
                super::slot::wait_for_status_read(self.shared.status_reads.clone(), seen, wait)
                    .await;
            if !read {
                tracing::warn!("nobody read /status; re-baselining anyway");
            }
        }
    }

    /// Takes one event. A change joins the open transaction in the writer (spilled to disk past
    /// the memory limit); the transaction joins the next diff only with its checkpoint (its
    /// COMMIT), so a diff never holds part of a transaction (W5). Changes the archive already
    /// holds (re-delivered after a restart) are skipped by their commit position.
    fn accept(
        &mut self,
        ev: SourceEvent,
        last_position: &mut String,
        commit_times: &mut CommitTimes,
        skip_through: Option<&str>,
    ) -> anyhow::Result<()> {
        let already =
            |p: &str| skip_through.is_some_and(|s| compare(p, s) != std::cmp::Ordering::Greater);
        let recorded = match ev {
            SourceEvent::Change(c) => {
                if already(&c.position) {
                    return Ok(());
                }
                commit_times.open = c.commit_time.or(commit_times.open);
                let (old, new) = match self.transform() {
                    Some(t) => (
                        super::mask_row_opt(Some(&t), c.old)?,
                        super::mask_row_opt(Some(&t), c.new)?,
                    ),
                    None => (c.old, c.new),
                };
                self.writer.record_pending(c.action, old, new)
            }
            SourceEvent::Checkpoint { position } => {
                if already(&position) {
                    self.writer.discard_pending();
                    return Ok(());
                }
                let changes = self.writer.pending_changes();
                let commit_time = commit_times.open.take();
                if let Some(t) = commit_time {
                    *commit_times
                        .closed
                        .entry(t.timestamp_millis() / 10)
                        .or_default() += changes;
                }
                if larch_archive::position::is_valid(&position) {
                    *last_position = position;
                }
                let committed = self
                    .writer
                    .commit_pending_at(commit_time.map(|t| t.fixed_offset()));
                // Between flushes too: with a long --diff-interval, /status and the gauge would
                // otherwise show the depth of the last tick for the whole interval.
                let depth = self.writer.buffer_depth();
                self.shared
                    .metrics
                    .buffer_depth
                    .with_label_values(&[&self.table.to_string()])
                    .set(depth as i64);
                self.shared.status.locked().buffer_depth = depth;
                committed
            }
        };
        recorded.map_err(|e| {
            self.shared
                .metrics
                .errors
                .with_label_values(&[&self.table.to_string(), "spill"])
                .inc();
            self.shared.status.locked().last_error = Some(e.to_string());
            anyhow!(e).context("buffering a change")
        })
    }

    /// The flush on stop: unlike an interval's flush, one that leaves changes buffered (a full
    /// disk, an unreachable store) is an error, so the exit status says the export failed. The
    /// changes were not acknowledged: a persistent slot delivers them again on the next start.
    async fn final_flush(
        &mut self,
        last_position: &str,
        commit_times: &mut CommitTimes,
    ) -> anyhow::Result<()> {
        self.flush(last_position, commit_times).await?;
        let left = self.writer.buffer_depth();
        if left == 0 {
            return Ok(());
        }
        let why = self
            .shared
            .status
            .locked()
            .last_error
            .clone()
            .unwrap_or_else(|| "unknown error".into());
        Err(anyhow!(
            "the final diff was not written: {why}; {left} buffered change(s) after {} were not \
             acknowledged to PostgreSQL (a persistent slot delivers them again on the next start)",
            self.writer.head()
        ))
    }

    /// Flushes buffered changes into a diff (acknowledging them to PostgreSQL once committed),
    /// then compacts when the policy asks. A storage error keeps the buffer for the next tick;
    /// losing the manifest compare-and-swap is fatal (another writer owns the prefix).
    async fn flush(
        &mut self,
        last_position: &str,
        commit_times: &mut CommitTimes,
    ) -> anyhow::Result<()> {
        let table = self.table.to_string();
        let to = if last_position.is_empty() {
            self.writer.head().to_string()
        } else {
            last_position.to_string()
        };
        let outcome = match self.writer.flush(&to).await {
            Ok(o) => o,
            Err(e @ ArchiveError::CasConflict { .. }) => return Err(e.into()),
            Err(e) => {
                self.shared
                    .metrics
                    .errors
                    .with_label_values(&[&table, "diff"])
                    .inc();
                self.shared.status.locked().last_error = Some(e.to_string());
                tracing::warn!(error = %e, "flush failed; the changes stay buffered for the next interval");
                return Ok(());
            }
        };
        let new_epoch = match outcome {
            FlushOutcome::Idle => {
                // Transactions without changes to this table still move the slot along.
                if !last_position.is_empty()
                    && let Err(e) = self.source.ack(last_position).await
                {
                    tracing::warn!(error = %e, "could not acknowledge an idle position");
                }
                None
            }
            FlushOutcome::SnapshotNeeded(trigger) => Some(trigger),
            FlushOutcome::Diff {
                artifact,
                new_epoch,
            } => {
                self.note_diff(&table, commit_times);
                if let Err(e) = self.source.ack(&artifact.to_position).await {
                    tracing::warn!(error = %e, "could not acknowledge the committed diff");
                }
                new_epoch
            }
        };
        match new_epoch {
            Some(trigger) => self.compact(trigger, &table).await,
            None => Ok(()),
        }
    }

    /// Counts a committed diff: the commit lag of each change it holds, the artifact, and
    /// `/status`'s diff figures.
    fn note_diff(&self, table: &str, commit_times: &mut CommitTimes) {
        let now = Utc::now();
        let lag_of = self.shared.metrics.commit_lag.with_label_values(&[table]);
        for (at, changes) in std::mem::take(&mut commit_times.closed) {
            let lag = (now.timestamp_millis() - at * 10).max(0) as f64 / 1e3;
            for _ in 0..changes {
                lag_of.observe(lag);
            }
        }
        self.shared
            .metrics
            .artifacts
            .with_label_values(&[table, "diff", "interval"])
            .inc();
        let mut s = self.shared.status.locked();
        s.diffs += 1;
        s.last_diff_at = Some(format_time(&now.fixed_offset()));
        s.last_error = None;
    }

    /// Compacts a snapshot into a new epoch because `trigger` fired; a failure other than a
    /// lost compare-and-swap is retried at a later interval.
    async fn compact(&mut self, trigger: EpochTrigger, table: &str) -> anyhow::Result<()> {
        tracing::info!(
            trigger = %trigger,
            "new-epoch policy fired: compacting a snapshot into a new epoch"
        );
        let progress = self.shared.start_progress(COMPACTION, &self.table);
        let reporter = larch_core::progress::Reporter::start(progress.clone());
        let compacted = self.writer.compact_reporting(Some(progress)).await;
        reporter.finish(compacted.is_ok());
        match compacted {
            Ok(_) => self.note_snapshot(trigger.as_str()),
            Err(e @ ArchiveError::CasConflict { .. }) => return Err(e.into()),
            Err(e) => {
                self.shared
                    .metrics
                    .errors
                    .with_label_values(&[table, "snapshot"])
                    .inc();
                tracing::warn!(error = %e, "compaction failed; retrying at a later interval");
            }
        }
        Ok(())
    }
}

/// Commit times of the changes waiting for the next diff, counted per 10 ms: bounded by the
/// interval's length, not by the number of changes.
#[derive(Default)]
struct CommitTimes {
    /// The commit time of the transaction being received.
    open: Option<DateTime<Utc>>,
    /// Commit time (in units of 10 ms) → changes committed then.
    closed: BTreeMap<i64, u64>,
}

/// Resolves once the shutdown flag is set (no guard is held across awaits).
async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}
