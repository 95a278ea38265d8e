//! Writing archives (laredo spec §6, rules W1–W7): streamed base snapshots, collapsed diffs, the
//! new-epoch policy, commit order and compare-and-swap, retention that deletes what it prunes.
//!
//! Memory is bounded by configuration, not by the data ([`SpillConfig`]): the changes of the
//! transaction being received and those waiting for the next diff collapse in memory up to
//! `memory_limit` and spill to sorted runs on local disk past it; a diff is streamed from the
//! merge of those runs straight into its uploads, and a compaction folds the archive the same way
//! ([`super::fold`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, FixedOffset};

use super::error::{ArchiveError, Result};
use super::format::Format;
use super::identity::{laredo_row_key, row_identity};
use super::manifest::{Artifact, ArtifactKind, Manifest, manifest_key, now_utc};
use super::masking::TransformRecord;
use super::model::{Action, Change, ColumnDefinition, effective_key_fields};
use super::policy::{EpochTrigger, Policy, PolicyInputs};
use super::position::{self, compare};
use super::spill::{ChangeBuffer, Entry, Spill, SpillConfig};
use super::store::{Store, check_key_prefix};
use super::value::Row;

mod by_workers;
mod commit;
mod snapshot;
mod split;
mod uploads;

pub use by_workers::WorkersRun;
pub use snapshot::SnapshotRows;
pub use split::{Attempt, SnapshotPart};
use uploads::{Upload, send_chunks};

/// Where a writer reads the time it records (`created_at`, `updated_at`): the system clock, or a
/// test's clock that runs ahead or behind.
#[derive(Clone)]
pub struct Clock(Arc<dyn Fn() -> DateTime<FixedOffset> + Send + Sync>);

impl Clock {
    pub fn system() -> Clock {
        Clock(Arc::new(now_utc))
    }

    /// The system clock shifted by `offset` (a machine whose clock is off).
    pub fn offset(offset: chrono::Duration) -> Clock {
        Clock(Arc::new(move || now_utc() + offset))
    }

    pub fn now(&self) -> DateTime<FixedOffset> {
        (self.0)()
    }
}

impl Default for Clock {
    fn default() -> Clock {
        Clock::system()
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Clock({})", self.now())
    }
}

#[derive(Clone, Debug)]
pub struct WriterConfig {
    /// `schema.table`, recorded in the manifest.
    pub table: String,
    pub key_prefix: String,
    /// Configured key fields; empty means the columns' primary key, else `id`.
    pub key_fields: Vec<String>,
    pub snapshot_formats: Vec<Format>,
    pub diff_formats: Vec<Format>,
    pub policy: Policy,
    /// Keep this many newest epochs (0: keep everything).
    pub keep_epochs: u32,
    /// Prune epochs that ended longer ago than this (see [`super::retention::Retention`]).
    pub max_age: Option<Duration>,
    /// The clock of the times the writer records.
    pub clock: Clock,
    /// Memory for buffered changes and where they spill past it.
    pub spill: SpillConfig,
}

impl WriterConfig {
    pub fn new(table: impl Into<String>, key_prefix: impl Into<String>) -> WriterConfig {
        WriterConfig {
            table: table.into(),
            key_prefix: key_prefix.into(),
            key_fields: Vec::new(),
            snapshot_formats: vec![Format::Jsonl],
            diff_formats: vec![Format::Jsonl],
            policy: Policy::default(),
            keep_epochs: 0,
            max_age: None,
            clock: Clock::system(),
            spill: SpillConfig::default(),
        }
    }
}

/// What a flush did.
#[derive(Debug, PartialEq)]
pub enum FlushOutcome {
    /// Nothing buffered and no trigger due.
    Idle,
    /// A diff was committed; `new_epoch` names the policy trigger that asks for a new epoch
    /// (a snapshot) now (see [`ArchiveWriter::compact`]).
    Diff {
        artifact: Artifact,
        new_epoch: Option<EpochTrigger>,
    },
    /// Nothing buffered, but the policy asks for a new snapshot (`max_interval` on an idle
    /// table).
    SnapshotNeeded(EpochTrigger),
}

/// What the open transaction did so far, applied to the writer's counters at its commit.
#[derive(Default, Debug)]
struct PendingCounts {
    changes: u64,
    /// Rows inserted minus rows deleted (since its TRUNCATE, if any).
    rows: i64,
}

pub struct ArchiveWriter {
    stores: Vec<Arc<dyn Store>>,
    config: WriterConfig,
    manifest: Manifest,
    revisions: Vec<String>,
    key_fields: Vec<String>,
    spill: Arc<Spill>,
    /// Changes of the transaction being received (not committed in PostgreSQL yet as far as
    /// we know): they join `buffer` at its COMMIT, so a diff never holds part of one (W5).
    pending: ChangeBuffer,
    pending_counts: PendingCounts,
    /// Committed changes collapsed per identity (laredo §6.4), waiting for the next diff; a
    /// TRUNCATE is kept apart so it is written first (W3).
    buffer: ChangeBuffer,
    churn: u64,
    rows_estimate: u64,
    last_snapshot_at: Option<Instant>,
    last_snapshot_bytes: u64,
    /// Sweep orphans after the first commit made a store time resolution after opening (W10):
    /// the manifest is then stored after every upload of a writer that died before us, by the
    /// store's clock. Commits that change the epoch or prune sweep too.
    sweep_after_commit: bool,
    opened_at: Instant,
    /// Counts the rows of the snapshot being written (a compaction's progress).
    row_progress: Option<Arc<larch_core::progress::Progress>>,
    /// Commit times of the first and last transaction in `buffer` (the next diff's).
    buffer_commit_times: Option<(DateTime<FixedOffset>, DateTime<FixedOffset>)>,
    /// The time of the state the next snapshot holds ([`Self::set_snapshot_time`]).
    next_snapshot_time: Option<DateTime<FixedOffset>>,
}

impl ArchiveWriter {
    /// Opens the archive at the key prefix on every store: adopts the primary store's manifest
    /// (refusing a newer version or another table's archive) and remembers each revision.
    pub async fn open(stores: Vec<Arc<dyn Store>>, config: WriterConfig) -> Result<ArchiveWriter> {
        if stores.is_empty() {
            return Err(ArchiveError::Invalid(
                "a writer needs at least one store".into(),
            ));
        }
        if config.snapshot_formats.is_empty() || config.diff_formats.is_empty() {
            return Err(ArchiveError::Invalid(
                "a writer needs at least one snapshot and one diff format".into(),
            ));
        }
        config.policy.validate().map_err(ArchiveError::Invalid)?;
        check_key_prefix(&config.key_prefix)?;
        let key = manifest_key(&config.key_prefix);
        let mut revisions = Vec::with_capacity(stores.len());
        let mut manifest = None;
        for (i, store) in stores.iter().enumerate() {
            match store.get(&key).await? {
                Some(got) => {
                    if i == 0 {
                        let m = Manifest::from_slice(&key, &got.bytes)?;
                        if !m.table.is_empty() && m.table != config.table {
                            return Err(ArchiveError::Invalid(format!(
                                "{} on {} holds table {:?}, not {:?}: choose another key prefix",
                                key,
                                store.name(),
                                m.table,
                                config.table
                            )));
                        }
                        manifest = Some(m);
                    }
                    revisions.push(got.revision);
                }
                None => revisions.push(String::new()),
            }
        }
        let manifest = manifest.unwrap_or_else(|| Manifest::new(config.table.clone()));
        let key_fields = effective_key_fields(&config.key_fields, &manifest.columns);
        let rows_estimate = super::plan::newest_snapshot(&manifest)
            .map(|s| s.row_count.max(0) as u64)
            .unwrap_or(0);
        let spill = Spill::open(
            config.spill.clone(),
            &spill_tag(&stores, &config.key_prefix),
        );
        let writer = ArchiveWriter {
            stores,
            key_fields,
            manifest,
            revisions,
            pending: ChangeBuffer::new(spill.clone()),
            pending_counts: PendingCounts::default(),
            buffer: ChangeBuffer::new(spill.clone()),
            spill,
            churn: 0,
            rows_estimate,
            last_snapshot_at: None,
            last_snapshot_bytes: 0,
            sweep_after_commit: true,
            opened_at: Instant::now(),
            row_progress: None,
            buffer_commit_times: None,
            next_snapshot_time: None,
            config,
        };
        writer.sweep_orphans().await;
        Ok(writer)
    }

    /// Deletes orphans (W10) on every store, each judged against that store's own committed
    /// manifest. Best effort: a failure is logged and the objects wait for the next sweep.
    async fn sweep_orphans(&self) {
        let key = manifest_key(&self.config.key_prefix);
        for store in &self.stores {
            let result = async {
                let Some(got) = store.get(&key).await? else {
                    return Ok(Vec::new());
                };
                let manifest = Manifest::from_slice(&key, &got.bytes)?;
                super::orphans::sweep(store.as_ref(), &self.config.key_prefix, &manifest).await
            }
            .await;
            match result {
                Ok(deleted) if deleted.is_empty() => {}
                Ok(deleted) => tracing::info!(
                    store = %store.name(),
                    count = deleted.len(),
                    keys = ?deleted,
                    "swept orphaned objects of epochs the manifest no longer lists"
                ),
                Err(e) => {
                    tracing::warn!(store = %store.name(), error = %e, "orphan sweep failed; the next one retries")
                }
            }
        }
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The position the archive reaches (the next diff's `from`).
    pub fn head(&self) -> &str {
        &self.manifest.head_position
    }

    pub fn epoch(&self) -> i64 {
        self.manifest.epoch
    }

    /// Changes waiting for the next diff (an upper bound of the identities once spilled).
    pub fn buffer_depth(&self) -> usize {
        self.buffer.depth() + usize::from(self.buffer.truncated())
    }

    /// Changes of the open transaction received so far.
    pub fn pending_changes(&self) -> u64 {
        self.pending_counts.changes
    }

    /// The spill directory and its live figures.
    pub fn spill(&self) -> &Arc<Spill> {
        &self.spill
    }

    pub fn churn(&self) -> u64 {
        self.churn
    }

    pub fn key_fields(&self) -> &[String] {
        &self.key_fields
    }

    /// Sets the columns recorded in the manifest (and the key fields they imply).
    pub fn set_columns(&mut self, columns: Vec<ColumnDefinition>) {
        self.key_fields = effective_key_fields(&self.config.key_fields, &columns);
        self.manifest.columns = columns;
    }

    /// Sets how the source table is partitioned (recorded with the next commit).
    pub fn set_partitioning(&mut self, record: Option<crate::partitioning::PartitioningRecord>) {
        self.manifest.partitioning = record;
    }

    /// Sets the transform record of the manifest (with the columns, before a new epoch's
    /// snapshot: it describes that epoch's rows).
    pub fn set_transform(&mut self, record: Option<TransformRecord>) {
        self.manifest.transform = record;
    }

    /// Sets the subset record of the manifest (before a one-shot export's snapshot).
    pub fn set_subset(&mut self, record: Option<crate::masking::SubsetRecord>) {
        self.manifest.subset = record;
    }

    /// Buffers one change as a transaction of its own (see [`record_pending`] and
    /// [`commit_pending`]; not while a transaction is open).
    ///
    /// [`record_pending`]: ArchiveWriter::record_pending
    /// [`commit_pending`]: ArchiveWriter::commit_pending
    pub fn record(&mut self, action: Action, old: Option<Row>, new: Option<Row>) -> Result<()> {
        debug_assert!(
            self.pending.is_empty(),
            "record() inside an open transaction"
        );
        self.record_pending(action, old, new)?;
        self.commit_pending()
    }

    /// Buffers one change of the transaction being received, collapsing it with what the
    /// transaction holds for the same identity (last write wins). A TRUNCATE resets it; an
    /// UPDATE that changes the key becomes a DELETE of the old identity and an INSERT of the new
    /// one (W4). Past the memory limit, buffered changes spill to disk; an error here (the spill
    /// limit, a disk error) loses nothing committed.
    pub fn record_pending(
        &mut self,
        action: Action,
        old: Option<Row>,
        new: Option<Row>,
    ) -> Result<()> {
        self.pending_counts.changes += 1;
        let entry = |action, old, new| Entry { action, old, new };
        match action {
            Action::Truncate => {
                self.pending.truncate();
                self.pending_counts.rows = 0;
            }
            Action::Delete => {
                let Some(old) = old else { return Ok(()) };
                let id =
                    row_identity(&old, &self.key_fields).unwrap_or_else(|| old.as_str().into());
                self.pending_counts.rows -= 1;
                self.pending
                    .insert(id, entry(Action::Delete, Some(old), None));
            }
            Action::Insert | Action::Update => {
                let Some(new) = new else { return Ok(()) };
                let id =
                    row_identity(&new, &self.key_fields).unwrap_or_else(|| new.as_str().into());
                let old_id = old
                    .as_ref()
                    .and_then(|o| row_identity(o, &self.key_fields))
                    .filter(|old_id| *old_id != id);
                if let Some(old_id) = old_id {
                    self.pending
                        .insert(old_id, entry(Action::Delete, old, None));
                    self.pending
                        .insert(id, entry(Action::Insert, None, Some(new)));
                } else {
                    if action == Action::Insert {
                        self.pending_counts.rows += 1;
                    }
                    self.pending.insert(id, entry(action, old, Some(new)));
                }
            }
        }
        self.within_memory_limit()
    }

    /// The open transaction's COMMIT arrived, committed at `commit_time` (when the source
    /// knows it): its changes join the next diff, whose commit time range it widens.
    pub fn commit_pending_at(&mut self, commit_time: Option<DateTime<FixedOffset>>) -> Result<()> {
        if let Some(t) = commit_time
            && self.pending_counts.changes > 0
        {
            self.buffer_commit_times = Some(match self.buffer_commit_times {
                Some((first, last)) => (first.min(t), last.max(t)),
                None => (t, t),
            });
        }
        self.commit_pending()
    }

    /// The time of the state the next [`Self::write_snapshot`] holds (recorded as its
    /// `snapshot_time`); a compaction sets it itself.
    pub fn set_snapshot_time(&mut self, at: DateTime<FixedOffset>) {
        self.next_snapshot_time = Some(at);
    }

    /// The open transaction's COMMIT arrived: its changes join the next diff.
    pub fn commit_pending(&mut self) -> Result<()> {
        let txn = std::mem::replace(&mut self.pending, ChangeBuffer::new(self.spill.clone()));
        let counts = std::mem::take(&mut self.pending_counts);
        if txn.truncated() {
            self.rows_estimate = 0;
        }
        self.rows_estimate = self.rows_estimate.saturating_add_signed(counts.rows);
        self.churn += counts.changes;
        off_the_runtime(|| self.buffer.append(txn))?;
        self.within_memory_limit()
    }

    /// Drops the open transaction's changes (it will be delivered again, or never committed).
    pub fn discard_pending(&mut self) {
        self.pending.clear();
        self.pending_counts = PendingCounts::default();
    }

    /// Spills the larger of the two buffers while memory holds more than the limit.
    fn within_memory_limit(&mut self) -> Result<()> {
        let limit = self.config.spill.memory_limit;
        if self.pending.memory_bytes() + self.buffer.memory_bytes() <= limit {
            return Ok(());
        }
        let larger = if self.pending.memory_bytes() >= self.buffer.memory_bytes() {
            &mut self.pending
        } else {
            &mut self.buffer
        };
        off_the_runtime(|| larger.spill())
    }

    fn change(&self, action: Action, old: Option<Row>, new: Option<Row>) -> Change {
        let key = laredo_row_key(new.as_ref().or(old.as_ref()), &self.key_fields);
        Change {
            action,
            key,
            old,
            new,
        }
    }

    fn change_truncate(&self) -> Change {
        Change {
            action: Action::Truncate,
            key: laredo_row_key(None, &self.key_fields),
            old: None,
            new: None,
        }
    }

    /// Flushes buffered changes as a diff ending at `to` (the position of the last change
    /// recorded), unless the policy asks for a snapshot.
    pub async fn flush(&mut self, to: &str) -> Result<FlushOutcome> {
        let since = self
            .last_snapshot_at
            .map(|t| t.elapsed())
            .unwrap_or(Duration::MAX);
        if self.buffer.is_empty() {
            return Ok(self.idle_outcome(since));
        }
        let mut artifact = self.diff_artifact(to)?;
        // Streamed from the merge of the buffer's runs and memory straight into the uploads.
        let mut uploads = self
            .start_uploads(&artifact, &self.config.diff_formats)
            .await?;
        let streamed = self.stream_diff(&mut uploads).await;
        let (count, written, primary_bytes) =
            self.end_uploads(uploads, streamed, &mut artifact).await?;
        artifact.change_count = count;
        let inputs = PolicyInputs {
            since_snapshot: since,
            diff_bytes: primary_bytes,
            last_snapshot_bytes: self.last_snapshot_bytes,
            churn: self.churn,
            row_count: self.rows_estimate,
        };
        // laredo writes a snapshot *instead of* the diff, so every follower must re-baseline.
        // larch commits the diff first and then compacts: followers walk the diff to the head
        // and continue into the new epoch without a re-baseline.
        let new_epoch = self.config.policy.evaluate(&inputs);
        if let Err(e) = self.commit(artifact.clone(), None).await {
            self.cleanup(&written).await;
            return Err(e);
        }
        self.buffer.clear();
        self.buffer_commit_times = None;
        Ok(FlushOutcome::Diff {
            artifact,
            new_epoch,
        })
    }

    /// What a flush without buffered changes does: a snapshot when `max_interval` has passed.
    fn idle_outcome(&self, since: Duration) -> FlushOutcome {
        // laredo never fires max_interval on an idle table; larch does (its only trigger
        // that makes sense without changes).
        let p = &self.config.policy;
        if !p.max_interval.is_zero()
            && since >= p.max_interval
            && (p.min_interval.is_zero() || since >= p.min_interval)
            && self.manifest.epoch > 0
        {
            return FlushOutcome::SnapshotNeeded(EpochTrigger::MaxInterval);
        }
        FlushOutcome::Idle
    }

    /// The diff artifact from the head to `to`, before its uploads (W1).
    fn diff_artifact(&self, to: &str) -> Result<Artifact> {
        let from = self.manifest.head_position.clone();
        if !position::is_valid(to) || compare(to, &from) != std::cmp::Ordering::Greater {
            return Err(ArchiveError::Invalid(format!(
                "a diff must end at a valid position after {from:?}; got {to:?} (W1)"
            )));
        }
        Ok(Artifact {
            kind: ArtifactKind::Diff,
            epoch: self.manifest.epoch,
            from_position: Some(from),
            to_position: to.to_string(),
            created_at: self.config.clock.now(),
            row_count: 0,
            change_count: 0,
            formats: BTreeMap::new(),
            first_commit_time: self.buffer_commit_times.map(|(first, _)| first),
            last_commit_time: self.buffer_commit_times.map(|(_, last)| last),
            snapshot_time: None,
        })
    }

    /// A record refused by its format (over laredo's size limit), naming the table and the
    /// row's key; other errors as they are.
    pub(crate) fn naming_the_row(&self, e: ArchiveError, row: Option<&Row>) -> ArchiveError {
        self.naming_the_key(e, &laredo_row_key(row, &self.key_fields))
    }

    /// [`Self::naming_the_row`] for a record whose key is known.
    pub(crate) fn naming_the_key(&self, e: ArchiveError, key: &str) -> ArchiveError {
        match e {
            ArchiveError::Invalid(text) if text.contains(crate::format::RECORD_LIMIT) => {
                ArchiveError::Invalid(format!(
                    "table {}, row with key {}: {text}",
                    self.config.table,
                    shortened(key)
                ))
            }
            other => other,
        }
    }

    /// Encodes the buffered changes (a TRUNCATE first) into `uploads`; returns their count.
    async fn stream_diff(&self, uploads: &mut [Upload]) -> Result<i64> {
        let mut count = 0;
        if self.buffer.truncated() {
            let truncate = self.change_truncate();
            for (_, enc, _) in uploads.iter_mut() {
                enc.change(&truncate)?;
            }
            count += 1;
        }
        for item in self.buffer.merged()? {
            let (_, e) = item?;
            let change = self.change(e.action, e.old, e.new);
            for (_, enc, _) in uploads.iter_mut() {
                enc.change(&change)
                    .map_err(|e| self.naming_the_key(e, &change.key))?;
            }
            count += 1;
            send_chunks(uploads).await?;
        }
        Ok(count)
    }

    /// Re-reads the primary manifest after a conflict: `true` when someone else changed it.
    pub async fn manifest_changed_elsewhere(&self) -> Result<bool> {
        let key = manifest_key(&self.config.key_prefix);
        let now = self.stores[0]
            .get(&key)
            .await?
            .map(|g| g.revision)
            .unwrap_or_default();
        Ok(now != self.revisions[0])
    }
}

/// Runs file I/O and compression that takes a while (a spill of up to the memory limit) without
/// holding up the other tasks of a multi-threaded runtime (the Lease renewal, `/status`).
fn off_the_runtime<T>(f: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// The prefix of the spill directories of one archive: a hash of its stores and key prefix.
fn spill_tag(stores: &[Arc<dyn Store>], key_prefix: &str) -> String {
    let mut parts: Vec<String> = stores.iter().map(|s| s.name()).collect();
    parts.push(key_prefix.to_string());
    super::spill::tag(
        "archive",
        &parts.iter().map(String::as_str).collect::<Vec<_>>(),
    )
}

/// A key value cut to a length an error line can carry.
fn shortened(key: &str) -> String {
    const SHOWN: usize = 64;
    if key.chars().count() <= SHOWN {
        return format!("{key:?}");
    }
    let head: String = key.chars().take(SHOWN).collect();
    format!("{head:?}… ({} bytes)", key.len())
}
