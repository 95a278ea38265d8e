//! Writing archives (laredo spec §6, rules W1–W7): streamed base snapshots, collapsed diffs, the
//! re-base policy, commit order and compare-and-swap, retention that deletes what it prunes.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use chrono::{DateTime, FixedOffset};
use tokio::sync::{mpsc, oneshot};

use super::error::{ArchiveError, Result};
use super::format::{Encoder, Format};
use super::identity::{Identity, change_identity, laredo_row_key, row_identity};
use super::manifest::{
    Artifact, ArtifactKind, FormatRef, Manifest, artifact_key, manifest_key, now_utc, object_keys,
    referenced_keys,
};
use super::model::{Action, Change, ColumnDefinition, effective_key_fields};
use super::policy::{Policy, PolicyInputs};
use super::position::{self, compare};
use super::store::{ObjectWriter, Store, check_key_prefix};
use super::value::Row;

/// One format of a snapshot being uploaded: its encoder and one streaming upload per store.
type Upload = (
    Format,
    Encoder,
    Vec<(Arc<dyn Store>, String, Box<dyn ObjectWriter>)>,
);

/// Bytes buffered per format before they go to the upload.
const UPLOAD_CHUNK: usize = 1 << 20;

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
        }
    }
}

/// What a flush did.
#[derive(Debug, PartialEq)]
pub enum FlushOutcome {
    /// Nothing buffered and no trigger due.
    Idle,
    /// A diff was committed; `rebase` names the policy trigger that asks for a new snapshot
    /// now (see [`ArchiveWriter::compact`]).
    Diff {
        artifact: Artifact,
        rebase: Option<&'static str>,
    },
    /// Nothing buffered, but the policy asks for a new snapshot (`max_interval` on an idle
    /// table).
    SnapshotNeeded(&'static str),
}

/// Buffered changes, collapsed per identity (laredo §6.4), with a TRUNCATE kept apart so it is
/// written first (W3).
#[derive(Default, Debug)]
struct DiffBuffer {
    truncated: bool,
    changes: BTreeMap<Identity, Change>,
}

pub struct ArchiveWriter {
    stores: Vec<Arc<dyn Store>>,
    config: WriterConfig,
    manifest: Manifest,
    revisions: Vec<String>,
    key_fields: Vec<String>,
    buffer: DiffBuffer,
    churn: u64,
    rows_estimate: u64,
    last_snapshot_at: Option<Instant>,
    last_snapshot_bytes: u64,
    /// Sweep orphans after the first commit made a store time resolution after opening (W10):
    /// the manifest is then stored after every upload of a writer that died before us, by the
    /// store's clock. Commits that change the epoch or prune sweep too.
    sweep_after_commit: bool,
    opened_at: Instant,
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
        let writer = ArchiveWriter {
            stores,
            key_fields,
            manifest,
            revisions,
            buffer: DiffBuffer::default(),
            churn: 0,
            rows_estimate,
            last_snapshot_at: None,
            last_snapshot_bytes: 0,
            sweep_after_commit: true,
            opened_at: Instant::now(),
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

    pub fn buffer_depth(&self) -> usize {
        self.buffer.changes.len() + usize::from(self.buffer.truncated)
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

    /// Buffers one change, collapsing it with what is buffered for the same identity (last
    /// write wins). A TRUNCATE resets the buffer; an UPDATE that changes the key becomes a
    /// DELETE of the old identity and an INSERT of the new one (W4).
    pub fn record(&mut self, action: Action, old: Option<Row>, new: Option<Row>) {
        self.churn += 1;
        match action {
            Action::Truncate => {
                self.buffer.changes.clear();
                self.buffer.truncated = true;
                self.rows_estimate = 0;
            }
            Action::Delete => {
                let Some(old) = old else { return };
                let id =
                    row_identity(&old, &self.key_fields).unwrap_or_else(|| old.as_str().into());
                self.rows_estimate = self.rows_estimate.saturating_sub(1);
                self.buffer
                    .changes
                    .insert(id, self.change(Action::Delete, Some(old), None));
            }
            Action::Insert | Action::Update => {
                let Some(new) = new else { return };
                let id =
                    row_identity(&new, &self.key_fields).unwrap_or_else(|| new.as_str().into());
                if let Some(old_row) = &old
                    && let Some(old_id) = row_identity(old_row, &self.key_fields)
                    && old_id != id
                {
                    self.buffer
                        .changes
                        .insert(old_id, self.change(Action::Delete, old.clone(), None));
                    self.buffer
                        .changes
                        .insert(id, self.change(Action::Insert, None, Some(new)));
                    return;
                }
                if action == Action::Insert {
                    self.rows_estimate += 1;
                }
                self.buffer
                    .changes
                    .insert(id, self.change(action, old, Some(new)));
            }
        }
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
        if self.buffer_depth() == 0 {
            // laredo never fires max_interval on an idle table; larch does (its only trigger
            // that makes sense without changes).
            let p = &self.config.policy;
            if !p.max_interval.is_zero()
                && since >= p.max_interval
                && (p.min_interval.is_zero() || since >= p.min_interval)
                && self.manifest.epoch > 0
            {
                return Ok(FlushOutcome::SnapshotNeeded("max_interval"));
            }
            return Ok(FlushOutcome::Idle);
        }
        let from = self.manifest.head_position.clone();
        if !position::is_valid(to) || compare(to, &from) != std::cmp::Ordering::Greater {
            return Err(ArchiveError::Invalid(format!(
                "a diff must end at a valid position after {from:?}; got {to:?} (W1)"
            )));
        }
        // Encode the primary format in memory first: its size feeds the policy.
        let mut encoded = Vec::with_capacity(self.config.diff_formats.len());
        for format in &self.config.diff_formats {
            let mut enc = Encoder::new(*format)?;
            let truncate = self.buffer.truncated.then(|| self.change_truncate());
            for c in truncate.iter().chain(self.buffer.changes.values()) {
                enc.change(c)?;
            }
            encoded.push((*format, enc.finish()?));
        }
        let inputs = PolicyInputs {
            since_snapshot: since,
            diff_bytes: encoded[0].1.len() as u64,
            last_snapshot_bytes: self.last_snapshot_bytes,
            churn: self.churn,
            row_count: self.rows_estimate,
        };
        // laredo writes a snapshot *instead of* the diff, so every follower must re-baseline.
        // larch commits the diff first and then compacts: followers walk the diff to the head
        // and continue into the new epoch without a re-baseline.
        let rebase = self.config.policy.evaluate(&inputs);
        let mut artifact = Artifact {
            kind: ArtifactKind::Diff,
            epoch: self.manifest.epoch,
            from_position: Some(from),
            to_position: to.to_string(),
            created_at: self.config.clock.now(),
            row_count: 0,
            change_count: self.buffer_depth() as i64,
            formats: BTreeMap::new(),
        };
        let mut written = Vec::new();
        for (format, bytes) in &encoded {
            let key = artifact_key(&self.config.key_prefix, &artifact, format.extension());
            let mut first = None;
            for store in &self.stores {
                let put = store.put(&key, bytes).await;
                match put {
                    Ok(r) => {
                        written.push((store.clone(), key.clone()));
                        first.get_or_insert(r);
                    }
                    Err(e) => {
                        self.cleanup(&written).await;
                        return Err(e);
                    }
                }
            }
            let r = first.expect("at least one store");
            artifact.formats.insert(
                format.id().to_string(),
                FormatRef {
                    uri: r.uri,
                    size_bytes: r.size as i64,
                    sha256: Some(r.sha256),
                },
            );
        }
        if let Err(e) = self.commit(artifact.clone(), None).await {
            self.cleanup(&written).await;
            return Err(e);
        }
        self.buffer = DiffBuffer::default();
        Ok(FlushOutcome::Diff { artifact, rebase })
    }

    /// Writes a base snapshot at a new epoch from a stream of rows (every row of the table at
    /// `position`), then commits it (W5, W6). Buffered changes are dropped: the snapshot covers
    /// them. Memory stays bounded: rows go straight to streaming uploads.
    pub async fn write_snapshot(
        &mut self,
        position: &str,
        rows: mpsc::Receiver<Row>,
    ) -> Result<Artifact> {
        self.write_snapshot_verified(position, rows, None).await
    }

    /// `write_snapshot` for a row stream whose producer reports success or failure once it
    /// ends: the snapshot commits only on success, so a producer that fails half-way never
    /// leaves a partial snapshot in the manifest.
    pub async fn write_snapshot_verified(
        &mut self,
        position: &str,
        mut rows: mpsc::Receiver<Row>,
        verdict: Option<oneshot::Receiver<Result<()>>>,
    ) -> Result<Artifact> {
        let epoch = self.manifest.epoch + 1;
        let mut artifact = Artifact {
            kind: ArtifactKind::Snapshot,
            epoch,
            from_position: None,
            to_position: position.to_string(),
            created_at: self.config.clock.now(),
            row_count: 0,
            change_count: 0,
            formats: BTreeMap::new(),
        };
        let mut uploads: Vec<Upload> = Vec::new();
        for format in &self.config.snapshot_formats {
            let key = artifact_key(&self.config.key_prefix, &artifact, format.extension());
            let mut writers = Vec::new();
            for store in &self.stores {
                match store.create(&key).await {
                    Ok(w) => writers.push((store.clone(), key.clone(), w)),
                    Err(e) => {
                        abort_all(uploads).await;
                        for (_, _, w) in writers {
                            w.abort().await;
                        }
                        return Err(e);
                    }
                }
            }
            uploads.push((*format, Encoder::new(*format)?, writers));
        }
        let mut count: i64 = 0;
        let streamed: Result<()> = async {
            while let Some(row) = rows.recv().await {
                count += 1;
                for (_, enc, writers) in uploads.iter_mut() {
                    enc.row(&row)?;
                    if enc.pending() >= UPLOAD_CHUNK {
                        let chunk = enc.take();
                        for (_, _, w) in writers.iter_mut() {
                            w.write(&chunk).await?;
                        }
                    }
                }
            }
            match verdict {
                None => Ok(()),
                Some(v) => v.await.unwrap_or_else(|_| {
                    Err(ArchiveError::Invalid(
                        "the row producer vanished before finishing".into(),
                    ))
                }),
            }
        }
        .await;
        if let Err(e) = streamed {
            abort_all(uploads).await;
            return Err(e);
        }
        let mut written = Vec::new();
        let mut failure = None;
        let mut first_bytes = None;
        for (format, enc, writers) in uploads {
            let tail = match enc.finish() {
                Ok(t) => t,
                Err(e) => {
                    failure.get_or_insert(e);
                    Vec::new()
                }
            };
            let mut first = None;
            for (store, key, mut w) in writers {
                if failure.is_some() {
                    w.abort().await;
                    continue;
                }
                if let Err(e) = w.write(&tail).await {
                    w.abort().await;
                    failure = Some(e);
                    continue;
                }
                match w.finish().await {
                    Ok(r) => {
                        written.push((store, key));
                        first.get_or_insert(r);
                    }
                    Err(e) => failure = Some(e),
                }
            }
            if let Some(r) = first {
                first_bytes.get_or_insert(r.size);
                artifact.formats.insert(
                    format.id().to_string(),
                    FormatRef {
                        uri: r.uri,
                        size_bytes: r.size as i64,
                        sha256: Some(r.sha256),
                    },
                );
            }
        }
        if let Some(e) = failure {
            self.cleanup(&written).await;
            return Err(e);
        }
        artifact.row_count = count;
        if let Err(e) = self.commit(artifact.clone(), Some(epoch)).await {
            self.cleanup(&written).await;
            return Err(e);
        }
        self.buffer = DiffBuffer::default();
        self.churn = 0;
        self.rows_estimate = count as u64;
        self.last_snapshot_at = Some(Instant::now());
        self.last_snapshot_bytes = first_bytes.unwrap_or(0);
        Ok(artifact)
    }

    /// Writes a new base snapshot at the head from the archive itself (the newest snapshot
    /// folded with its diff chain), without asking the source for a new baseline. Memory holds
    /// the net changes since the last snapshot, not the table. Buffered changes must have been
    /// flushed first.
    pub async fn compact(&mut self) -> Result<Artifact> {
        if self.buffer_depth() > 0 {
            return Err(ArchiveError::Invalid(
                "flush buffered changes before compacting".into(),
            ));
        }
        let plan = super::plan::plan_head(&self.manifest);
        if !position::same(&plan.head_position, &self.manifest.head_position) {
            return Err(ArchiveError::Invalid(format!(
                "cannot compact: the chain from the newest snapshot reaches {:?}, not the head {:?}",
                plan.head_position, self.manifest.head_position
            )));
        }
        let mut formats = self.config.snapshot_formats.clone();
        formats.extend(self.config.diff_formats.iter().copied());
        formats.extend(Format::ALL);
        formats.dedup();
        let reader = super::reader::ArchiveReader::new(
            self.stores[0].clone(),
            &self.config.key_prefix,
            formats,
        )?;
        // The net effect of the chain: identity -> final row (None: deleted).
        let mut overlay: HashMap<Identity, Option<Row>> = HashMap::new();
        let mut truncated = false;
        for diff in &plan.diffs {
            for c in reader.read_diff(diff).await? {
                match c.action {
                    Action::Truncate => {
                        overlay.clear();
                        truncated = true;
                    }
                    Action::Delete => {
                        overlay.insert(change_identity(&c, &self.key_fields), None);
                    }
                    Action::Insert | Action::Update => {
                        let id = change_identity(&c, &self.key_fields);
                        if let Some(old) = &c.old
                            && let Some(old_id) = row_identity(old, &self.key_fields)
                            && old_id != id
                        {
                            overlay.insert(old_id, None);
                        }
                        overlay.insert(id, c.new.clone());
                    }
                }
            }
        }
        let (tx, rx) = mpsc::channel::<Row>(1024);
        let base = plan.snapshot.clone().filter(|_| !truncated);
        let key_fields = self.key_fields.clone();
        let (verdict_tx, verdict_rx) = oneshot::channel();
        tokio::spawn(async move {
            let result = async {
                let mut overlay = overlay;
                if let Some(snapshot) = base {
                    let state = (overlay, tx.clone());
                    let (o, _) = reader
                        .fold_rows(&snapshot, key_fields, state, |(overlay, tx), d| {
                            let id = d.identity.unwrap_or_else(|| d.row.as_str().into());
                            if overlay.contains_key(&id) {
                                return Ok(());
                            }
                            tx.blocking_send(d.row).map_err(|_| {
                                ArchiveError::Invalid("snapshot writer stopped".into())
                            })
                        })
                        .await?;
                    overlay = o;
                }
                for row in overlay.into_values().flatten() {
                    if tx.send(row).await.is_err() {
                        break;
                    }
                }
                Ok::<(), ArchiveError>(())
            }
            .await;
            let _ = verdict_tx.send(result);
        });
        let head = self.manifest.head_position.clone();
        self.write_snapshot_verified(&head, rx, Some(verdict_rx))
            .await
    }

    /// Appends the artifact to a copy of the manifest, prunes, and compare-and-swaps it onto
    /// every store in order; adopts it only when every store took it. Then deletes the objects
    /// of pruned artifacts (W7).
    async fn commit(&mut self, artifact: Artifact, new_epoch: Option<i64>) -> Result<()> {
        let mut next = self.manifest.clone();
        next.manifest_version = super::manifest::MANIFEST_VERSION;
        next.table = self.config.table.clone();
        if let Some(e) = new_epoch {
            next.epoch = e;
        }
        next.updated_at = self.config.clock.now();
        next.head_position = artifact.to_position.clone();
        next.artifacts.push(artifact);
        let retention = super::retention::Retention {
            keep_epochs: self.config.keep_epochs,
            max_age: self.config.max_age,
        };
        let (kept, pruned) = super::retention::prune(
            std::mem::take(&mut next.artifacts),
            next.epoch,
            &retention,
            next.updated_at,
        );
        next.artifacts = kept;
        let bytes = Bytes::from(next.to_json());
        let key = manifest_key(&self.config.key_prefix);
        crate::crashpoint::crash_point("writer.after-upload");
        self.check_uploads(next.artifacts.last().expect("just pushed"))
            .await?;
        for (i, store) in self.stores.iter().enumerate() {
            match store.put_cas(&key, bytes.clone(), &self.revisions[i]).await {
                Ok(rev) => self.revisions[i] = rev,
                Err(ArchiveError::CasConflict { .. }) => {
                    return Err(ArchiveError::CasConflict {
                        key: format!("{key} on {}", store.name()),
                    });
                }
                Err(e) => return Err(e),
            }
        }
        self.manifest = next;
        crate::crashpoint::crash_point("writer.after-commit");
        self.delete_artifacts(&pruned).await;
        let first_due = self.sweep_after_commit
            && self.opened_at.elapsed() > super::orphans::STORE_TIME_RESOLUTION;
        if first_due || new_epoch.is_some() || !pruned.is_empty() {
            if first_due {
                self.sweep_after_commit = false;
            }
            self.sweep_orphans().await;
        }
        Ok(())
    }

    /// Right before the manifest swap: every object of `artifact` is on every store with the
    /// size uploaded. Whatever removed one in between (a `gc --delete` judging by a skewed clock,
    /// an operator's `rm`) would otherwise make the commit point at nothing.
    async fn check_uploads(&self, artifact: &Artifact) -> Result<()> {
        for (format, entry) in &artifact.formats {
            let ext = Format::parse(format)?.extension();
            let key = artifact_key(&self.config.key_prefix, artifact, ext);
            for store in &self.stores {
                match store.head(&key).await? {
                    Some(o) if o.size as i64 == entry.size_bytes => {}
                    found => {
                        return Err(ArchiveError::Invalid(format!(
                            "{key} on {}: {} before the manifest commit (uploaded {} B); not \
                             committing (was it deleted by `larch archive gc` or by hand?)",
                            store.name(),
                            match found {
                                Some(o) => format!("{} B", o.size),
                                None => "gone".into(),
                            },
                            entry.size_bytes
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    async fn delete_artifacts(&self, artifacts: &[Artifact]) {
        let live = referenced_keys(&self.config.key_prefix, &self.manifest.artifacts);
        for a in artifacts {
            for key in object_keys(&self.config.key_prefix, a) {
                if live.contains(&key) {
                    continue; // sanitised keys can collide (laredo §2.1): never delete a live object
                }
                for store in &self.stores {
                    if let Err(e) = store.delete(&key).await {
                        tracing::warn!(key = %key, store = %store.name(), error = %e, "retention could not delete a pruned object; it stays as an orphan");
                    }
                }
            }
        }
    }

    /// Removes objects uploaded for an artifact that was not committed.
    async fn cleanup(&self, written: &[(Arc<dyn Store>, String)]) {
        let live = referenced_keys(&self.config.key_prefix, &self.manifest.artifacts);
        for (store, key) in written {
            if live.contains(key) {
                continue; // the key of a committed artifact (a repeated position): leave it
            }
            let _ = store.delete(key).await;
        }
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

async fn abort_all(uploads: Vec<Upload>) {
    for (_, _, writers) in uploads {
        for (_, _, w) in writers {
            w.abort().await;
        }
    }
}
