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
use larch_archive::fold::{head_rows, is_stopped};
use larch_archive::manifest::{Artifact, Manifest};
use larch_archive::model::{Action, ColumnDefinition, TableId, effective_key_fields};
use larch_archive::plan::{
    Plan, ShortChain, chain_from, newest_snapshot, plan, plan_head, short_chain,
};
use larch_archive::point_in_time::{PointInTime, Resolution, resolve};
use larch_archive::position::same;
use larch_archive::reader::ArchiveReader;
use larch_archive::source::{
    ChangeEvent, Lag, SourceError, SourceEvent, SourceState, SyncSource, ValidationError,
};
use larch_archive::spill::{Spill, SpillConfig};
use larch_archive::value::Row;
use larch_core::locks::MutexExt;

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

/// What the manifest says about a consumer at `from`.
#[derive(Debug)]
enum Step {
    UpToDate,
    Diffs(Vec<Artifact>),
    Replaced(String),
    /// At the end of the newest snapshot's chain, which stops before the head: nothing to do
    /// until a writer repairs the chain or writes a new epoch.
    Short(ShortChain),
}

/// Decides how a consumer at `from` (on `epoch`, when known) continues on `manifest` (C1).
fn next_step(manifest: &Manifest, from: &str, epoch: Option<i64>) -> Step {
    let newest = newest_snapshot(manifest);
    if same(from, &manifest.head_position) || (from.is_empty() && newest.is_none()) {
        let Some(snap) = newest else {
            return Step::UpToDate;
        };
        if epoch == Some(snap.epoch) {
            return Step::UpToDate;
        }
        // A new epoch whose head is our position: fine only if its lineage contains us.
        let on_lineage = same(&snap.to_position, from)
            || chain_from(manifest, &snap.to_position, None)
                .iter()
                .any(|d| same(&d.to_position, from));
        return if on_lineage {
            Step::UpToDate
        } else {
            Step::Replaced(format!(
                "epoch {} (snapshot at {:?}) replaced the archive at our position {from:?}",
                snap.epoch, snap.to_position
            ))
        };
    }
    let head_plan = plan_head(manifest);
    if let Some(short) = short_chain(manifest, &head_plan) {
        if same(from, &short.reached) {
            return Step::Short(short);
        }
        // Behind on the short chain: walk it as far as it goes.
        let chain = chain_from(manifest, from, None);
        if chain
            .last()
            .is_some_and(|d| same(&d.to_position, &short.reached))
        {
            return Step::Diffs(chain.into_iter().cloned().collect());
        }
    }
    match plan(manifest, from) {
        Some(p) if p.snapshot.is_none() => Step::Diffs(p.diffs),
        Some(p) => Step::Replaced(format!(
            "head {:?} (epoch {}) does not continue our position {from:?}: the newest snapshot is at {:?}",
            manifest.head_position,
            manifest.epoch,
            p.snapshot.map(|s| s.to_position).unwrap_or_default()
        )),
        None => Step::Replaced(format!(
            "the archive at head {:?} has no snapshot and no chain from our position {from:?}",
            manifest.head_position
        )),
    }
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
        let mut delay = Duration::from_millis(100);
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
                    tracing::warn!(source = %self.opts.id, error = %e, attempt, "{what}: transient storage error, retrying in {delay:?}");
                    let mut rx = self.state.subscribe();
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = async { while rx.changed().await.is_ok() && *rx.borrow() != SourceState::Closed {} } => {}
                    }
                    if self.closed() {
                        return Err(SourceError::Stopped);
                    }
                    delay = (delay * 2).min(Duration::from_secs(10));
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

impl ArchiveReplaySource {
    /// `require_transformed`: the manifest records a transform that masks something and covers
    /// every column it serves (`TransformRecord::uncovered`); else an error tagged
    /// `ArchiveNotTransformed` naming the table and the uncovered columns.
    fn check_transformed(&self, m: &Manifest) -> anyhow::Result<()> {
        if !self.opts.require_transformed {
            return Ok(());
        }
        let (id, key, table) = (&self.opts.id, self.reader.manifest_key(), &self.opts.table);
        let Some(t) = m.transform.as_ref().filter(|t| t.masks_anything()) else {
            larch_core::failure::bail!(
                larch_core::failure::Reason::ArchiveNotTransformed,
                "source {id}: require_transformed: the archive {key} (table {table}) records no \
                 masking transform (it was not exported with --transform / spec.transform): \
                 refusing to load raw rows",
            );
        };
        let uncovered = t.uncovered(m.columns.iter().map(|c| c.name.as_str()));
        if !uncovered.is_empty() {
            larch_core::failure::bail!(
                larch_core::failure::Reason::ArchiveNotTransformed,
                "source {id}: require_transformed: epoch {} of the archive {key} (table {table}) \
                 serves columns its transform does not cover: {} (neither named in the rules \
                 nor masked by `undeclared`, which is {:?}): refusing to load raw rows",
                m.epoch,
                uncovered.join(", "),
                t.undeclared,
            );
        }
        Ok(())
    }

    /// Sends one diff's changes as events, streamed; `false` when the consumer went away.
    async fn send_diff(
        &self,
        diff: &Artifact,
        events: &mpsc::Sender<SourceEvent>,
    ) -> larch_archive::Result<bool> {
        let mut changes = self.reader.stream_diff(diff);
        while let Some(c) = changes.recv().await {
            let ev = change_event(&self.opts.table, &diff.to_position, c?);
            if events.send(SourceEvent::Change(ev)).await.is_err() {
                return Ok(false);
            }
        }
        Ok(true)
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
                .with_context(|| format!("source {}", self.opts.id));
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
        let (head_plan, restored): (Option<Plan>, _) = match &self.opts.at {
            None => (plan(&m, ""), None),
            Some(at) => {
                let r = resolve(&m, at).map_err(|e| {
                    SourceError::Other(
                        anyhow::Error::new(e).context(format!("source {}: at {at}", self.opts.id)),
                    )
                })?;
                if let Some(notice) = &r.notice {
                    tracing::warn!(source = %self.opts.id, "{notice}");
                }
                tracing::info!(source = %self.opts.id, "serving the table at {at}: {}", r.describe());
                (Some(r.plan.clone()), Some(r))
            }
        };
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
            let mut head = head_rows(
                self.reader.clone(),
                p,
                key_fields,
                self.spill.clone(),
                self.opts.spill.memory_limit,
            );
            while let Some(row) = head.rows.recv().await {
                rows.send((self.opts.table.clone(), row))
                    .await
                    .map_err(|_| SourceError::Stopped)?;
            }
            match head.verdict.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) if is_stopped(&e) => return Err(SourceError::Stopped),
                Ok(Err(e)) => {
                    return Err(SourceError::Other(
                        anyhow::Error::new(e).context(format!("source {}: baseline", self.opts.id)),
                    ));
                }
                Err(_) => {
                    return Err(SourceError::Other(anyhow::anyhow!(
                        "source {}: baseline: the fold task vanished",
                        self.opts.id
                    )));
                }
            }
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
                    {
                        let mut inner = self.inner.locked();
                        if inner.short_chain.as_ref() != Some(&short) {
                            tracing::warn!(source = %self.opts.id, "serving an older state than the archive's head: {short}");
                        }
                        inner.short_chain = Some(short);
                        inner.epoch = newest_snapshot(&m).map(|s| s.epoch);
                        // Nothing more can be read until the chain is repaired.
                        inner.behind = Behind::default();
                    }
                    if !self.opts.follow {
                        return Ok(());
                    }
                    self.wait_poll(Some(&events)).await;
                }
                Step::UpToDate => {
                    {
                        let mut inner = self.inner.locked();
                        inner.short_chain = None;
                        inner.epoch = newest_snapshot(&m).map(|s| s.epoch);
                        inner.behind = Behind::default();
                    }
                    if !self.opts.follow {
                        return Ok(());
                    }
                    self.wait_poll(Some(&events)).await;
                }
                Step::Diffs(diffs) => {
                    self.inner.locked().behind = Behind::of(&diffs);
                    for (i, d) in diffs.iter().enumerate() {
                        if self.closed() {
                            return Ok(());
                        }
                        let delivered = self
                            .retry("reading a diff", || self.send_diff(d, &events))
                            .await?;
                        if !delivered {
                            return Err(SourceError::Stopped);
                        }
                        events
                            .send(SourceEvent::Checkpoint {
                                position: d.to_position.clone(),
                            })
                            .await
                            .map_err(|_| SourceError::Stopped)?;
                        from = d.to_position.clone();
                        let mut inner = self.inner.locked();
                        inner.position = Some(from.clone());
                        inner.behind = Behind::of(&diffs[i + 1..]);
                    }
                    // On the newest snapshot's lineage now: that is our epoch.
                    if let Some(snap) = newest_snapshot(&m)
                        && (same(&snap.to_position, &from)
                            || chain_from(&m, &snap.to_position, None)
                                .iter()
                                .any(|d| same(&d.to_position, &from)))
                    {
                        self.inner.locked().epoch = Some(snap.epoch);
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
mod tests {
    use super::*;
    use larch_archive::fixtures::{art, manifest};
    use larch_archive::manifest::{ArtifactKind, now_utc};

    #[test]
    fn behind_counts_the_undelivered_diffs_and_their_bytes() {
        let mut older = art(ArtifactKind::Diff, 1, Some("0/10"), "0/20");
        older.created_at = now_utc() - chrono::Duration::seconds(30);
        let mut newer = art(ArtifactKind::Diff, 1, Some("0/20"), "0/30");
        for (d, size) in [(&mut older, 700), (&mut newer, 300)] {
            for format in ["jsonl", "protobuf"] {
                d.formats.insert(
                    format.into(),
                    larch_archive::manifest::FormatRef {
                        uri: String::new(),
                        size_bytes: size,
                        sha256: None,
                    },
                );
            }
        }
        let b = Behind::of(&[older, newer]);
        // One format's size per diff, the oldest diff's age.
        assert_eq!((b.diffs, b.bytes), (2, 1000));
        assert!((29.0..60.0).contains(&b.seconds()), "{}", b.seconds());
        let caught_up = Behind::of(&[]);
        assert_eq!(
            (caught_up.diffs, caught_up.bytes, caught_up.seconds()),
            (0, 0, 0.0)
        );
    }

    #[test]
    fn steps_detect_replacement_whatever_the_order() {
        let m = manifest(
            vec![
                art(ArtifactKind::Snapshot, 1, None, "0/10"),
                art(ArtifactKind::Diff, 1, Some("0/10"), "0/20"),
            ],
            "0/20",
        );
        assert!(matches!(next_step(&m, "0/10", Some(1)), Step::Diffs(d) if d.len() == 1));
        assert!(matches!(next_step(&m, "0/20", Some(1)), Step::UpToDate));
        // Head lower than ours.
        assert!(matches!(next_step(&m, "0/30", Some(1)), Step::Replaced(_)));
        // A new epoch at a higher position that does not continue us.
        let m2 = manifest(
            vec![
                art(ArtifactKind::Snapshot, 1, None, "0/10"),
                art(ArtifactKind::Diff, 1, Some("0/10"), "0/20"),
                art(ArtifactKind::Snapshot, 2, None, "0/15"),
                art(ArtifactKind::Diff, 2, Some("0/15"), "0/40"),
            ],
            "0/40",
        );
        assert!(matches!(next_step(&m2, "0/20", Some(1)), Step::Replaced(_)));
        // A new epoch at exactly our position but another lineage.
        let m3 = manifest(vec![art(ArtifactKind::Snapshot, 2, None, "0/020")], "0/20");
        assert!(matches!(next_step(&m3, "0/20", Some(2)), Step::UpToDate));
        assert!(matches!(
            next_step(&m3, "0/20", Some(1)),
            Step::UpToDate // the new snapshot sits on our position: same lineage
        ));
        let m4 = manifest(
            vec![
                art(ArtifactKind::Snapshot, 2, None, "0/5"),
                art(ArtifactKind::Diff, 2, Some("0/5"), "0/18"),
            ],
            "0/20",
        );
        assert!(matches!(next_step(&m4, "0/20", Some(1)), Step::Replaced(_)));
        // Nothing yet.
        assert!(matches!(
            next_step(&manifest(vec![], ""), "", None),
            Step::UpToDate
        ));
        assert!(matches!(next_step(&m, "", None), Step::Replaced(_)));
    }

    #[test]
    fn a_short_chain_is_followed_to_its_end_and_then_reported_not_rebaselined() {
        let m = manifest(
            vec![
                art(ArtifactKind::Snapshot, 1, None, "0/10"),
                art(ArtifactKind::Diff, 1, Some("0/10"), "0/20"),
                art(ArtifactKind::Diff, 1, Some("0/30"), "0/40"),
            ],
            "0/40",
        );
        assert!(matches!(next_step(&m, "0/10", Some(1)), Step::Diffs(d) if d.len() == 1));
        match next_step(&m, "0/20", Some(1)) {
            Step::Short(s) => assert_eq!((s.reached.as_str(), s.head.as_str()), ("0/20", "0/40")),
            other => panic!("{other:?}"),
        }
        // A new epoch that reaches its head replaces the short one.
        let mut m2 = m.clone();
        m2.artifacts
            .push(art(ArtifactKind::Snapshot, 2, None, "0/40"));
        m2.epoch = 2;
        assert!(matches!(next_step(&m2, "0/20", Some(1)), Step::Replaced(_)));
    }

    #[test]
    fn inferred_columns_mark_only_explicit_keys() {
        let row = Row::parse(r#"{"b":1,"a":2,"id":3}"#).unwrap();
        let cols = infer_columns(&row, &[]);
        assert_eq!(
            cols.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
            ["a", "b", "id"]
        );
        assert!(cols.iter().all(|c| !c.primary_key && c.nullable));
        assert_eq!(cols[2].ordinal_position, 3);
        let cols = infer_columns(&row, &["b".into(), "a".into()]);
        assert!(cols[1].primary_key && cols[1].primary_key_ordinal == 1);
        assert!(cols[0].primary_key && cols[0].primary_key_ordinal == 2);
        assert!(!cols[2].primary_key);
    }

    #[test]
    fn state_file_is_written_atomically_into_a_new_directory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/seed.pos");
        write_state_file(&path, "0/16B3748").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "0/16B3748");
        write_state_file(&path, "0/2").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "0/2");
        let leftovers: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers.len(), 1, "{leftovers:?}");
    }
}
