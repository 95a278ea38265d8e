//! The archive source: replays an archive (laredo spec §8, rules C1–C5).
//!
//! * `baseline` streams the folded state at the head: the newest snapshot plus its diff chain,
//!   through [`larch_archive::fold`]: the rows sent are exactly the rows of
//!   `ArchiveReader::reconstruct(plan_head)`, but no snapshot-sized map is ever built and the
//!   chain's net effect stays within the spill's memory limit (spilled to disk past it).
//! * `stream(from)` delivers the diffs after `from` as change events (position = each diff's
//!   `to_position`), each diff streamed in R5 order (never held whole) and followed by a
//!   [`SourceEvent::Checkpoint`]. A transient error in the middle of a diff delivers that diff
//!   again from its start (replaying changes by identity is idempotent). When the newest
//!   snapshot no longer continues `from` (`plan(manifest, from)` is not diff-only, whatever
//!   the order of the positions, including a head *lower* than ours; or a new epoch at our
//!   very position that does not contain it) it returns [`SourceError::ReBaselineRequired`]
//!   (C1).
//! * Following polls the manifest every `poll_interval`; a manifest that does not exist yet is
//!   waited for; transient storage errors are retried with backoff (C5).
//! * `ack` writes the state file atomically (C3): temp file, fsync, rename, directory fsync;
//!   the directory is created when missing; the contents are the raw position string.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use async_trait::async_trait;
use chrono::{DateTime, FixedOffset, Utc};
use tokio::sync::{mpsc, watch};

use larch_archive::error::ArchiveError;
use larch_archive::manifest::{Artifact, Manifest};
use larch_archive::model::{Action, ColumnDefinition, TableId, effective_key_fields};
use larch_archive::plan::{ShortChain, newest_snapshot, plan, short_chain};
use larch_archive::point_in_time::{PointInTime, Resolution};
use larch_archive::reader::ArchiveReader;
use larch_archive::source::{
    ChangeEvent, Lag, SourceError, SourceEvent, SourceState, SyncSource, ValidationError,
};
use larch_archive::spill::{Spill, SpillConfig};
use larch_archive::value::Row;
use larch_core::locks::MutexExt;

mod delivery;
mod step;

use step::{Step, next_step};

/// Options of one archive source (one table).
#[derive(Clone, Debug)]
pub struct ArchiveReplayOptions {
    /// Source id (for logs and metrics).
    pub id: String,
    /// The table this source serves.
    pub table: TableId,
    /// Explicitly configured key fields (empty: the manifest's primary key, else `id`).
    pub key_fields: Vec<String>,
    pub follow: bool,
    pub poll_interval: Duration,
    /// State file enabling resume.
    pub state_path: Option<PathBuf>,
    /// Memory for the chain's net effect while baselining, and where it spills past it.
    pub spill: SpillConfig,
    /// Serve the table as it was at this point (no following, no resume): the baseline reads
    /// the plan [`resolve`] gives, and the stream delivers nothing after it.
    pub at: Option<PointInTime>,
    /// Refuse an archive whose manifest records no masking transform (`require_transformed`).
    pub require_transformed: bool,
    /// Also require a passed `larch archive leak-check` at the manifest's epoch and head
    /// (`require_leak_check`; implies `require_transformed`).
    pub require_leak_check: bool,
}

impl ArchiveReplayOptions {
    pub fn new(id: impl Into<String>, table: TableId) -> Self {
        ArchiveReplayOptions {
            id: id.into(),
            table,
            key_fields: Vec::new(),
            follow: false,
            poll_interval: Duration::from_secs(5),
            state_path: None,
            spill: SpillConfig::default(),
            at: None,
            require_transformed: false,
            require_leak_check: false,
        }
    }
}

/// What `/status` shows about an archive source.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ArchiveReplayInfo {
    /// The position delivered so far (baseline or last diff).
    pub position: Option<String>,
    /// The head of the last manifest read.
    pub head: Option<String>,
    /// The epoch of the newest snapshot we are on.
    pub epoch: Option<i64>,
    pub lag_seconds: Option<f64>,
    /// When the head was written (the manifest's `updated_at`), RFC 3339 UTC to the second.
    pub head_time: Option<String>,
    pub acked: Option<String>,
    /// Set while our position is the end of a diff chain that stops before the manifest head:
    /// the state served is older than the archive's head.
    pub short_chain: Option<ShortChain>,
    /// The storage error being retried, if the last attempt failed: (when, message).
    pub last_error: Option<(String, String)>,
    /// Rows of the snapshot the baseline in progress reads (its manifest `row_count`).
    pub baseline_rows_expected: Option<u64>,
    /// Distance behind the head: 0 when caught up.
    pub behind: Behind,
    /// With `at`: the point actually served, once the baseline resolved it.
    pub restored: Option<Resolution>,
}

#[derive(Default)]
struct Inner {
    /// The manifest's columns when `init` last handed them to the targets.
    init_columns: Option<Vec<ColumnDefinition>>,
    position: Option<String>,
    head: Option<String>,
    epoch: Option<i64>,
    updated_at: Option<DateTime<FixedOffset>>,
    acked: Option<String>,
    short_chain: Option<ShortChain>,
    last_error: Option<(String, String)>,
    /// Rows of the snapshot the baseline in progress reads (its manifest `row_count`).
    baseline_rows_expected: Option<u64>,
    /// Diffs between our position and the head not yet delivered, and their bytes.
    behind: Behind,
    restored: Option<Resolution>,
}

/// How far a consumer is behind the archive's head: 0 when caught up.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Behind {
    pub diffs: u64,
    /// Bytes of those diffs (their first format's object size).
    pub bytes: u64,
    /// When the oldest of them was written, unset when caught up.
    #[serde(skip)]
    pub since: Option<DateTime<FixedOffset>>,
}

impl Behind {
    fn of(diffs: &[Artifact]) -> Behind {
        Behind {
            diffs: diffs.len() as u64,
            bytes: diffs
                .iter()
                .map(|d| {
                    d.formats
                        .values()
                        .next()
                        .map_or(0, |f| f.size_bytes.max(0) as u64)
                })
                .sum(),
            since: diffs.iter().map(|d| d.created_at).min(),
        }
    }

    /// Seconds the oldest undelivered diff has waited: 0 when caught up.
    pub fn seconds(&self) -> f64 {
        self.since.map_or(0.0, |t| lag_of(t).as_secs_f64())
    }
}

/// A [`SyncSource`] that replays an archive: its folded head as the baseline, its diffs as
/// the stream. (Not the `ArchiveSource` custom resource, which configures an engine.)
pub struct ArchiveReplaySource {
    reader: ArchiveReader,
    opts: ArchiveReplayOptions,
    spill: Arc<Spill>,
    state: watch::Sender<SourceState>,
    inner: Mutex<Inner>,
}

/// Writes the state file durably and atomically (directory created when missing).
pub fn write_state_file(path: &Path, contents: &str) -> std::io::Result<()> {
    larch_archive::store::atomic_file::write(path, contents.as_bytes())
}

impl ArchiveReplaySource {
    pub fn new(reader: ArchiveReader, opts: ArchiveReplayOptions) -> ArchiveReplaySource {
        let (state, _) = watch::channel(SourceState::Connecting);
        let tag = larch_archive::spill::tag(
            "source",
            &[&opts.id, &reader.store().name(), reader.key_prefix()],
        );
        ArchiveReplaySource {
            spill: Spill::open(opts.spill.clone(), &tag),
            reader,
            opts,
            state,
            inner: Mutex::new(Inner::default()),
        }
    }

    pub fn id(&self) -> &str {
        &self.opts.id
    }

    pub fn table(&self) -> &TableId {
        &self.opts.table
    }

    pub fn options(&self) -> &ArchiveReplayOptions {
        &self.opts
    }

    pub fn info(&self) -> ArchiveReplayInfo {
        let inner = self.inner.locked();
        ArchiveReplayInfo {
            position: inner.position.clone(),
            head: inner.head.clone(),
            epoch: inner.epoch,
            lag_seconds: inner.updated_at.map(lag_of).map(|d| d.as_secs_f64()),
            head_time: inner.updated_at.map(|t| {
                t.with_timezone(&Utc)
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            }),
            acked: inner.acked.clone(),
            short_chain: inner.short_chain.clone(),
            last_error: inner.last_error.clone(),
            baseline_rows_expected: inner.baseline_rows_expected,
            behind: inner.behind,
            restored: inner.restored.clone(),
        }
    }

    fn set_state(&self, s: SourceState) {
        self.state.send_if_modified(|cur| {
            // Closed is final; Paused survives until resumed.
            if *cur == SourceState::Closed || *cur == s {
                return false;
            }
            if *cur == SourceState::Paused && s != SourceState::Closed && s != SourceState::Paused {
                return false;
            }
            *cur = s;
            true
        });
    }

    fn remember(&self, m: &Manifest) {
        let mut inner = self.inner.locked();
        inner.head = Some(m.head_position.clone());
        inner.updated_at = Some(m.updated_at);
    }

    fn closed(&self) -> bool {
        *self.state.borrow() == SourceState::Closed
    }

    /// Runs `op`, retrying transient storage errors with backoff (C5): forever while following
    /// (until closed), five attempts otherwise.
    async fn retry<T, F, Fut>(&self, what: &str, mut op: F) -> Result<T, SourceError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = larch_archive::Result<T>>,
    {
        let mut backoff =
            larch_core::retry::Backoff::new(Duration::from_millis(100), Duration::from_secs(10));
        let mut attempt = 0u32;
        loop {
            let result = op().await;
            // What /status shows while a store fails (the state alone says CONNECTING).
            self.inner.locked().last_error = result.as_ref().err().map(|e| {
                (
                    Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                    format!("{what}: {e}"),
                )
            });
            match result {
                Ok(v) => return Ok(v),
                Err(e) if e.is_transient() && (self.opts.follow || attempt < 4) => {
                    attempt += 1;
                    let delay = backoff.next_delay();
                    tracing::warn!(source = %self.opts.id, error = %e, attempt, "{what}: transient storage error, retrying in {delay:?}");
                    let mut rx = self.state.subscribe();
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = async { while rx.changed().await.is_ok() && *rx.borrow() != SourceState::Closed {} } => {}
                    }
                    if self.closed() {
                        return Err(SourceError::Stopped);
                    }
                }
                Err(e) => {
                    return Err(SourceError::Other(
                        anyhow::Error::new(e).context(format!("source {}: {what}", self.opts.id)),
                    ));
                }
            }
        }
    }

    /// Loads the manifest; `None` when it does not exist.
    async fn manifest(&self) -> Result<Option<Manifest>, SourceError> {
        let got = self
            .retry("reading the manifest", || self.reader.try_load_manifest())
            .await?;
        let m = got.map(|(m, _)| m);
        if let Some(m) = &m {
            self.remember(m);
        }
        Ok(m)
    }

    /// Waits for a poll interval, a state change (pause, resume, close) or the channel closing.
    async fn wait_poll(&self, events: Option<&mpsc::Sender<SourceEvent>>) {
        let mut rx = self.state.subscribe();
        rx.borrow_and_update();
        let closed = async {
            match events {
                Some(tx) => tx.closed().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(self.opts.poll_interval) => {}
            _ = rx.changed() => {}
            _ = closed => {}
        }
    }

    /// Blocks while paused; returns false once closed.
    async fn wait_unpaused(&self) -> bool {
        let mut rx = self.state.subscribe();
        loop {
            let s = *rx.borrow_and_update();
            match s {
                SourceState::Closed => return false,
                SourceState::Paused => {
                    if rx.changed().await.is_err() {
                        return false;
                    }
                }
                _ => return true,
            }
        }
    }

    /// The manifest, waiting for it to exist when following.
    async fn manifest_or_wait(&self) -> Result<Option<Manifest>, SourceError> {
        loop {
            if self.closed() {
                return Err(SourceError::Stopped);
            }
            match self.manifest().await? {
                Some(m) => return Ok(Some(m)),
                None if self.opts.follow => {
                    tracing::info!(source = %self.opts.id, key = %self.reader.manifest_key(), "waiting for the archive to exist");
                    self.wait_poll(None).await;
                }
                None => return Ok(None),
            }
        }
    }

    fn key_fields(&self, m: &Manifest) -> Vec<String> {
        effective_key_fields(&self.opts.key_fields, &m.columns)
    }

    /// Columns: the manifest's, else inferred from the first row of the newest snapshot.
    async fn columns(&self, m: &Manifest) -> Result<Vec<ColumnDefinition>, SourceError> {
        if !m.columns.is_empty() {
            return Ok(m.columns.clone());
        }
        let Some(snap) = newest_snapshot(m) else {
            return Ok(Vec::new());
        };
        let mut rx = self.reader.stream_rows(snap, self.key_fields(m));
        let first = match rx.recv().await {
            None => return Ok(Vec::new()),
            Some(Err(e)) => {
                return Err(SourceError::Other(
                    anyhow::Error::new(e).context("inferring columns from the newest snapshot"),
                ));
            }
            Some(Ok(d)) => d.row,
        };
        drop(rx);
        Ok(infer_columns(&first, &self.opts.key_fields))
    }
}

/// laredo's inferred schema: the first row's field names sorted, nullable, ordinal 1..n, no
/// type; primary-key flags from the *explicitly* configured key fields only.
pub fn infer_columns(first: &Row, explicit_key_fields: &[String]) -> Vec<ColumnDefinition> {
    first
        .field_names()
        .into_iter()
        .enumerate()
        .map(|(i, name)| {
            let pk = explicit_key_fields.iter().position(|k| *k == name);
            ColumnDefinition {
                nullable: true,
                ordinal_position: i as i64 + 1,
                primary_key: pk.is_some(),
                primary_key_ordinal: pk.map(|p| p as i64 + 1).unwrap_or(0),
                name,
                ..Default::default()
            }
        })
        .collect()
}

fn lag_of(updated_at: DateTime<FixedOffset>) -> Duration {
    (Utc::now() - updated_at.with_timezone(&Utc))
        .to_std()
        .unwrap_or_default()
}

fn change_event(table: &TableId, position: &str, c: larch_archive::model::Change) -> ChangeEvent {
    let (old, new) = match c.action {
        Action::Insert => (None, c.new),
        Action::Update => (c.old, c.new),
        Action::Delete => (c.old.or(c.new), None),
        Action::Truncate => (None, None),
    };
    ChangeEvent {
        table: table.clone(),
        action: c.action,
        position: position.to_string(),
        old,
        new,
        commit_time: None,
    }
}

#[async_trait]
impl SyncSource for ArchiveReplaySource {
    async fn init(
        &self,
        tables: &[TableId],
    ) -> anyhow::Result<BTreeMap<TableId, Vec<ColumnDefinition>>> {
        if let Some(t) = tables.iter().find(|t| **t != self.opts.table) {
            anyhow::bail!(
                "source {}: serves {} only, not {t}",
                self.opts.id,
                self.opts.table
            );
        }
        // Following, an archive that does not exist yet is waited for (not an error).
        let columns = match self.manifest_or_wait().await? {
            Some(m) => {
                self.check_transformed(&m)?;
                self.inner.locked().init_columns = Some(m.columns.clone());
                self.columns(&m).await?
            }
            None => {
                return Err(ArchiveError::ManifestNotFound {
                    key: self.reader.manifest_key(),
                })
                .with_context(|| {
                    format!(
                        "source {}: table {}: no archive at key_prefix {:?} (follow: false does not wait for one)",
                        self.opts.id,
                        self.opts.table,
                        self.reader.key_prefix()
                    )
                });
            }
        };
        self.set_state(SourceState::Connected);
        Ok(BTreeMap::from([(self.opts.table.clone(), columns)]))
    }

    async fn validate_tables(&self, tables: &[TableId]) -> Vec<ValidationError> {
        tables
            .iter()
            .filter(|t| **t != self.opts.table)
            .map(|t| ValidationError {
                table: t.clone(),
                code: "TABLE_NOT_SERVED".into(),
                message: format!("source {} serves {} only", self.opts.id, self.opts.table),
            })
            .collect()
    }

    async fn baseline(
        &self,
        _tables: &[TableId],
        rows: mpsc::Sender<(TableId, Row)>,
    ) -> Result<String, SourceError> {
        self.set_state(SourceState::Baselining);
        let Some(m) = self.manifest_or_wait().await? else {
            return Err(SourceError::Other(
                anyhow::Error::new(ArchiveError::ManifestNotFound {
                    key: self.reader.manifest_key(),
                })
                .context(format!("source {}", self.opts.id)),
            ));
        };
        // A new epoch with other columns landed since `init`: the targets must be initialised
        // with the columns of the rows they are about to get. One whose transform does not
        // cover its columns is refused there too.
        if self.check_transformed(&m).is_err() {
            return Err(SourceError::ReBaselineRequired(
                "the archive's transform changed since the targets were initialised".into(),
            ));
        }
        let init_columns = self.inner.locked().init_columns.clone();
        if init_columns.is_some_and(|c| c != m.columns) {
            return Err(SourceError::ReBaselineRequired(
                "the archive's columns changed since the targets were initialised".into(),
            ));
        }
        let key_fields = self.key_fields(&m);
        let (head_plan, restored) = self.plan_at(&m)?;
        let (position, epoch) = match &head_plan {
            None => (m.head_position.clone(), None),
            Some(p) => (
                p.head_position.clone(),
                p.snapshot.as_ref().map(|s| s.epoch),
            ),
        };
        self.inner.locked().baseline_rows_expected = head_plan
            .as_ref()
            .and_then(|p| p.snapshot.as_ref())
            .map(|s| s.row_count.max(0) as u64);
        if let Some(p) = head_plan {
            self.send_head_rows(p, key_fields, &rows).await?;
        }
        let short = match &restored {
            None => plan(&m, "").and_then(|p| short_chain(&m, &p)),
            Some(_) => None,
        };
        if let Some(s) = &short {
            tracing::warn!(source = %self.opts.id, "baseline at an older state than the archive's head: {s}");
        }
        let mut inner = self.inner.locked();
        inner.position = Some(position.clone());
        inner.epoch = epoch;
        inner.short_chain = short;
        inner.behind = Behind::default();
        inner.restored = restored;
        Ok(position)
    }

    async fn stream(
        &self,
        from: &str,
        events: mpsc::Sender<SourceEvent>,
    ) -> Result<(), SourceError> {
        let mut from = from.to_string();
        {
            let mut inner = self.inner.locked();
            if inner.position.as_deref() != Some(from.as_str()) {
                // Resuming from a stored position: the epoch is unknown.
                inner.position = Some(from.clone());
                inner.epoch = None;
            }
        }
        self.set_state(SourceState::Streaming);
        if self.opts.at.is_some() {
            // Pinned at a point: nothing after it is delivered.
            return Ok(());
        }
        loop {
            if !self.wait_unpaused().await {
                return Ok(());
            }
            if events.is_closed() {
                return Err(SourceError::Stopped);
            }
            let Some(m) = self.manifest().await? else {
                if self.opts.follow {
                    self.wait_poll(Some(&events)).await;
                    continue;
                }
                return Err(SourceError::Other(
                    anyhow::Error::new(ArchiveError::ManifestNotFound {
                        key: self.reader.manifest_key(),
                    })
                    .context(format!("source {}", self.opts.id)),
                ));
            };
            // Each manifest read (a new epoch included) is held to require_transformed: one
            // that fails is served no further; the baseline it asks for refuses it by name.
            if let Err(e) = self.check_transformed(&m) {
                tracing::error!(source = %self.opts.id, error = %e, "the archive stopped being masked");
                return Err(SourceError::ReBaselineRequired(format!("{e}")));
            }
            let epoch = self.inner.locked().epoch;
            match next_step(&m, &from, epoch) {
                Step::Replaced(why) => {
                    tracing::warn!(source = %self.opts.id, "re-baseline required: {why}");
                    return Err(SourceError::ReBaselineRequired(why));
                }
                Step::Short(short) => {
                    self.note_short_chain(&m, short);
                    if !self.opts.follow {
                        return Ok(());
                    }
                    self.wait_poll(Some(&events)).await;
                }
                Step::UpToDate => {
                    self.note_up_to_date(&m);
                    if !self.opts.follow {
                        return Ok(());
                    }
                    self.wait_poll(Some(&events)).await;
                }
                Step::Diffs(diffs) => {
                    if !self.deliver_diffs(&m, &diffs, &mut from, &events).await? {
                        return Ok(());
                    }
                    if diffs.is_empty() {
                        // A diff-only plan with nothing in it cannot happen; never spin.
                        self.wait_poll(Some(&events)).await;
                    }
                }
            }
        }
    }

    async fn ack(&self, position: &str) -> anyhow::Result<()> {
        if let Some(path) = &self.opts.state_path {
            let (path, pos) = (path.clone(), position.to_string());
            tokio::task::spawn_blocking(move || write_state_file(&path, &pos))
                .await
                .expect("state file writer")
                .with_context(|| {
                    format!(
                        "source {}: writing state file {}",
                        self.opts.id,
                        self.opts.state_path.as_ref().unwrap().display()
                    )
                })?;
        }
        self.inner.locked().acked = Some(position.to_string());
        Ok(())
    }

    async fn last_acked_position(&self) -> anyhow::Result<Option<String>> {
        let Some(path) = &self.opts.state_path else {
            return Ok(None);
        };
        match tokio::fs::read(path).await {
            Ok(b) if b.is_empty() => Ok(None),
            Ok(b) => Ok(Some(String::from_utf8(b).with_context(|| {
                format!("state file {}: not UTF-8", path.display())
            })?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading state file {}", path.display())),
        }
    }

    fn supports_resume(&self) -> bool {
        // Pinned at a point, every start reads that point afresh.
        self.opts.state_path.is_some() && self.opts.at.is_none()
    }

    fn pause(&self) {
        self.set_state(SourceState::Paused);
    }

    fn resume(&self) {
        self.state.send_if_modified(|cur| {
            if *cur == SourceState::Paused {
                *cur = SourceState::Streaming;
                true
            } else {
                false
            }
        });
    }

    fn lag(&self) -> Lag {
        let inner = self.inner.locked();
        Lag {
            bytes: Some(inner.behind.bytes),
            time: inner.updated_at.map(lag_of),
        }
    }

    fn state(&self) -> SourceState {
        *self.state.borrow()
    }

    async fn close(&self) {
        self.set_state(SourceState::Closed);
    }
}

#[cfg(test)]
mod tests;
