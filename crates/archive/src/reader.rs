//! Reading archives: manifests, artifacts as streams, and reconstruction (rules R1–R8).

use std::collections::HashMap;
use std::io::Read;
use std::sync::Arc;

use larch_core::locks::MutexExt;

use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio_util::io::SyncIoBridge;

use super::error::{ArchiveError, Result};
use super::format::{self, DecodedRow, Format};
use super::identity::{Identity, change_identity};
use super::manifest::{Artifact, FormatRef, Manifest, artifact_key, manifest_key};
use super::model::{Action, Change, effective_key_fields};
use super::plan::{Plan, plan_as_of, plan_head};
use super::store::{ObjectReader, Store, check_key_prefix};
use super::value::Row;

/// Reads one archive (a key prefix on a store) with formats in preference order.
#[derive(Clone, Debug)]
pub struct ArchiveReader {
    store: Arc<dyn Store>,
    key_prefix: String,
    formats: Vec<Format>,
}

/// One artifact object opened for streaming, with what the manifest says it should contain.
pub struct OpenArtifact {
    pub key: String,
    pub format: Format,
    expected: FormatRef,
    reader: ObjectSource,
}

/// Where an open artifact's bytes come from: the store's file, read on the decoding thread, or
/// its async reader bridged to that thread.
enum ObjectSource {
    File(std::fs::File),
    Async(ObjectReader),
}

/// The folded state of a table at a position.
#[derive(Debug, Default)]
pub struct Folded {
    pub rows: HashMap<Identity, Row>,
    pub position: String,
}

impl ArchiveReader {
    pub fn new(
        store: Arc<dyn Store>,
        key_prefix: impl Into<String>,
        formats: Vec<Format>,
    ) -> Result<ArchiveReader> {
        let key_prefix = key_prefix.into();
        check_key_prefix(&key_prefix)?;
        if formats.is_empty() {
            return Err(ArchiveError::Invalid(
                "a reader needs at least one format".into(),
            ));
        }
        Ok(ArchiveReader {
            store,
            key_prefix,
            formats,
        })
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn key_prefix(&self) -> &str {
        &self.key_prefix
    }

    pub fn manifest_key(&self) -> String {
        manifest_key(&self.key_prefix)
    }

    /// The manifest and its revision, or `None` when the archive does not exist (yet).
    pub async fn try_load_manifest(&self) -> Result<Option<(Manifest, String)>> {
        let key = self.manifest_key();
        match self.store.get(&key).await? {
            None => Ok(None),
            Some(got) => Ok(Some((
                Manifest::from_slice(&key, &got.bytes)?,
                got.revision,
            ))),
        }
    }

    pub async fn load_manifest(&self) -> Result<Manifest> {
        match self.try_load_manifest().await? {
            Some((m, _)) => Ok(m),
            None => Err(ArchiveError::ManifestNotFound {
                key: self.manifest_key(),
            }),
        }
    }

    /// The first configured format the artifact carries (laredo's rule: no fallback).
    pub fn choose_format<'a>(&self, artifact: &'a Artifact) -> Result<(Format, &'a FormatRef)> {
        for f in &self.formats {
            if let Some(r) = artifact.formats.get(f.id()) {
                return Ok((*f, r));
            }
        }
        Err(ArchiveError::Corrupt {
            key: self.manifest_key(),
            detail: format!(
                "{:?} artifact of epoch {} at {} has none of the formats {:?} (it has {:?})",
                artifact.kind,
                artifact.epoch,
                artifact.to_position,
                self.formats.iter().map(|f| f.id()).collect::<Vec<_>>(),
                artifact.formats.keys().collect::<Vec<_>>()
            ),
        })
    }

    pub fn artifact_key(&self, artifact: &Artifact, format: Format) -> String {
        artifact_key(&self.key_prefix, artifact, format.extension())
    }

    pub async fn open(&self, artifact: &Artifact) -> Result<OpenArtifact> {
        let (format, expected) = self.choose_format(artifact)?;
        let key = self.artifact_key(artifact, format);
        let not_found = || ArchiveError::ObjectNotFound { key: key.clone() };
        let reader = match self.store.open_file(&key) {
            Some(file) => ObjectSource::File(file?.ok_or_else(not_found)?),
            None => ObjectSource::Async(self.store.open(&key).await?.ok_or_else(not_found)?),
        };
        Ok(OpenArtifact {
            key,
            format,
            expected: expected.clone(),
            reader,
        })
    }

    /// Decodes a snapshot on a blocking thread, folding each row into `state` with `f`.
    pub async fn fold_rows<S, F>(
        &self,
        artifact: &Artifact,
        key_fields: Vec<String>,
        mut state: S,
        mut f: F,
    ) -> Result<S>
    where
        S: Send + 'static,
        F: FnMut(&mut S, DecodedRow) -> Result<()> + Send + 'static,
    {
        let open = self.open(artifact).await?;
        tokio::task::spawn_blocking(move || {
            open.decode_rows(&key_fields, |r| f(&mut state, r))?;
            Ok(state)
        })
        .await
        .expect("decoder thread")
    }

    /// Decodes a snapshot on a blocking thread, folding each row's JSON text into `state` with
    /// `f`, *not validated* as a JSON object: for a caller that parses every row itself (the
    /// leak check), sparing the decoder's parse and a copy of each row.
    pub async fn fold_row_texts<S, F>(
        &self,
        artifact: &Artifact,
        mut state: S,
        mut f: F,
    ) -> Result<S>
    where
        S: Send + 'static,
        F: FnMut(&mut S, &str) -> Result<()> + Send + 'static,
    {
        let open = self.open(artifact).await?;
        tokio::task::spawn_blocking(move || {
            open.decode_row_texts(|text| f(&mut state, text))?;
            Ok(state)
        })
        .await
        .expect("decoder thread")
    }

    /// Reads a JSONL snapshot (plain or zstd) on a blocking thread in blocks of whole lines
    /// of about `target` bytes ([`format::line_blocks`]), folding each into `state` with `f`:
    /// for callers that parse the lines on threads of their own. Another format is refused.
    pub async fn fold_line_blocks<S, F>(
        &self,
        artifact: &Artifact,
        target: usize,
        mut state: S,
        mut f: F,
    ) -> Result<S>
    where
        S: Send + 'static,
        F: FnMut(&mut S, format::line_blocks::LineBlock) -> Result<()> + Send + 'static,
    {
        let open = self.open(artifact).await?;
        tokio::task::spawn_blocking(move || {
            open.read_line_blocks(target, |b| f(&mut state, b))?;
            Ok(state)
        })
        .await
        .expect("reader thread")
    }

    /// Decodes a diff on a blocking thread, folding each change into `state` with `f`.
    pub async fn fold_changes<S, F>(&self, artifact: &Artifact, mut state: S, mut f: F) -> Result<S>
    where
        S: Send + 'static,
        F: FnMut(&mut S, Change) -> Result<()> + Send + 'static,
    {
        let open = self.open(artifact).await?;
        tokio::task::spawn_blocking(move || {
            open.decode_changes(|c| f(&mut state, c))?;
            Ok(state)
        })
        .await
        .expect("decoder thread")
    }

    /// Streams a snapshot's rows through a bounded channel (for async consumers).
    pub fn stream_rows(
        &self,
        artifact: &Artifact,
        key_fields: Vec<String>,
    ) -> mpsc::Receiver<Result<DecodedRow>> {
        let (tx, rx) = mpsc::channel(1024);
        let this = self.clone();
        let artifact = artifact.clone();
        tokio::spawn(async move {
            let tx2 = tx.clone();
            let res = this
                .fold_rows(&artifact, key_fields, (), move |_, r| {
                    tx2.blocking_send(Ok(r))
                        .map_err(|_| ArchiveError::Invalid("consumer stopped".into()))
                })
                .await;
            if let Err(e) = res {
                let _ = tx.send(Err(e)).await;
            }
        });
        rx
    }

    /// Folds the changes of one diff in rule R5's order — the TRUNCATE first, then the other
    /// changes in file order — streamed, never holding the whole diff: the first
    /// [`TRUNCATE_LOOKAHEAD`] changes are held back, so a TRUNCATE among them (larch writes it
    /// first, W3) is passed first. A TRUNCATE that comes later (laredo may serialise it anywhere)
    /// is passed when met and once more at the end, followed by every other change of the diff
    /// again from the start: the net effect is the same, so `f` must apply changes by identity
    /// (upsert, delete, clear), as every fold does.
    pub async fn fold_diff_in_order<S, F>(&self, artifact: &Artifact, state: S, f: F) -> Result<S>
    where
        S: Send + 'static,
        F: FnMut(&mut S, Change) -> Result<()> + Send + 'static,
    {
        let pass = InOrder {
            f,
            held: Vec::new(),
            released: false,
            truncated: false,
            late_truncate: None,
        };
        let (state, pass) = self
            .fold_changes(artifact, (state, pass), |(state, pass), c: Change| {
                pass.take(state, c)
            })
            .await?;
        // `f` may block (a channel send): it runs on a blocking thread, like the decoder.
        let (state, pass, late) = tokio::task::spawn_blocking(move || {
            let (mut state, mut pass) = (state, pass);
            for c in std::mem::take(&mut pass.held) {
                (pass.f)(&mut state, c)?;
            }
            let late = pass.late_truncate.take();
            if let Some(truncate) = &late {
                (pass.f)(&mut state, truncate.clone())?;
            }
            Ok::<_, ArchiveError>((state, pass, late.is_some()))
        })
        .await
        .expect("fold thread")?;
        if !late {
            return Ok(state);
        }
        let (state, _) = self
            .fold_changes(artifact, (state, pass), |(state, pass), c: Change| {
                if c.action == Action::Truncate {
                    return Ok(());
                }
                (pass.f)(state, c)
            })
            .await?;
        Ok(state)
    }

    /// Streams one diff's changes in R5 order (see [`fold_diff_in_order`]) through a bounded
    /// channel; a decode or storage error is the last item.
    ///
    /// [`fold_diff_in_order`]: ArchiveReader::fold_diff_in_order
    pub fn stream_diff(&self, artifact: &Artifact) -> mpsc::Receiver<Result<Change>> {
        let (tx, rx) = mpsc::channel(1024);
        let this = self.clone();
        let artifact = artifact.clone();
        tokio::spawn(async move {
            let feed = tx.clone();
            let res = this
                .fold_diff_in_order(&artifact, (), move |_, c| {
                    feed.blocking_send(Ok(c))
                        .map_err(|_| ArchiveError::Invalid("consumer stopped".into()))
                })
                .await;
            if let Err(e) = res {
                let _ = tx.send(Err(e)).await;
            }
        });
        rx
    }

    /// Folds a plan into the table state (R4, R5, R6).
    pub async fn reconstruct(&self, plan: &Plan, key_fields: &[String]) -> Result<Folded> {
        let mut state: HashMap<Identity, Row> = HashMap::new();
        if let Some(snapshot) = &plan.snapshot {
            let snapshot_key = self
                .choose_format(snapshot)
                .map(|(f, _)| self.artifact_key(snapshot, f))?;
            let keys = key_fields.to_vec();
            state.reserve(
                usize::try_from(snapshot.row_count)
                    .unwrap_or(0)
                    .min(1 << 24),
            );
            state = self
                .fold_rows(
                    snapshot,
                    key_fields.to_vec(),
                    state,
                    move |state, d: DecodedRow| {
                        // A row without its key fields keeps its own text as identity: never collapse rows.
                        let keyed = d.identity.is_some();
                        let id = d.identity.unwrap_or_else(|| d.row.as_str().into());
                        if state.insert(id.clone(), d.row).is_some() && keyed {
                            return Err(not_unique(&snapshot_key, &keys));
                        }
                        Ok(())
                    },
                )
                .await?;
        }
        for diff in &plan.diffs {
            state = self.fold_diff(diff, state, key_fields).await?;
        }
        Ok(Folded {
            rows: state,
            position: plan.head_position.clone(),
        })
    }

    async fn fold_diff(
        &self,
        diff: &Artifact,
        rows: HashMap<Identity, Row>,
        key_fields: &[String],
    ) -> Result<HashMap<Identity, Row>> {
        let keys = key_fields.to_vec();
        self.fold_diff_in_order(diff, rows, move |rows, c: Change| {
            apply_change(rows, &c, &keys);
            Ok(())
        })
        .await
    }

    /// Loads the manifest and folds the archive at its head (`at = None`) or as of a position.
    /// Configured key fields that are no column of the archive are refused.
    pub async fn reconstruct_at(
        &self,
        at: Option<&str>,
        configured_key_fields: &[String],
    ) -> Result<(Manifest, Folded)> {
        let manifest = self.load_manifest().await?;
        crate::model::check_key_fields(configured_key_fields, &manifest.columns)
            .map_err(ArchiveError::Invalid)?;
        let key_fields = effective_key_fields(configured_key_fields, &manifest.columns);
        let plan = match at {
            None => plan_head(&manifest),
            Some(p) => plan_as_of(&manifest, p)?,
        };
        let folded = self.reconstruct(&plan, &key_fields).await?;
        Ok((manifest, folded))
    }
}

/// Two rows of one snapshot with the same key values: the key fields do not identify rows.
/// Names only, never the values: the engine shows this error on its `/status`.
fn not_unique(snapshot: &str, key_fields: &[String]) -> ArchiveError {
    ArchiveError::Corrupt {
        key: snapshot.to_string(),
        detail: format!(
            "two rows share a value of the key ({}): the key fields do not identify rows (a \
             wrong --key-fields / key_fields?)",
            key_fields.join(", "),
        ),
    }
}

/// Changes of a diff held back while looking for its TRUNCATE.
pub const TRUNCATE_LOOKAHEAD: usize = 1024;

/// The first pass of [`ArchiveReader::fold_diff_in_order`].
struct InOrder<F> {
    f: F,
    /// Changes not passed yet (no TRUNCATE seen among them so far).
    held: Vec<Change>,
    /// Some change other than a TRUNCATE was passed.
    released: bool,
    /// A TRUNCATE was passed.
    truncated: bool,
    /// A TRUNCATE that came after changes already passed.
    late_truncate: Option<Change>,
}

impl<F> InOrder<F> {
    fn take<S>(&mut self, state: &mut S, c: Change) -> Result<()>
    where
        F: FnMut(&mut S, Change) -> Result<()>,
    {
        if c.action == Action::Truncate {
            if self.released {
                self.late_truncate.get_or_insert(c.clone());
                return (self.f)(state, c);
            }
            if !self.truncated {
                self.truncated = true;
                return (self.f)(state, c);
            }
            return Ok(());
        }
        if self.released {
            return (self.f)(state, c);
        }
        self.held.push(c);
        if self.held.len() >= TRUNCATE_LOOKAHEAD {
            self.released = true;
            for c in std::mem::take(&mut self.held) {
                (self.f)(state, c)?;
            }
        }
        Ok(())
    }
}

/// Applies one change to a folded state (R5): INSERT/UPDATE upsert `new` (an UPDATE whose old
/// identity differs also removes the old one); DELETE of an unknown identity is a no-op.
pub fn apply_change(state: &mut HashMap<Identity, Row>, change: &Change, key_fields: &[String]) {
    match change.action {
        Action::Truncate => state.clear(),
        Action::Delete => {
            state.remove(&change_identity(change, key_fields));
        }
        Action::Insert | Action::Update => {
            let Some(new) = &change.new else { return };
            let id = change_identity(change, key_fields);
            if change.action == Action::Update
                && let Some(old) = &change.old
                && let Some(old_id) = super::identity::row_identity(old, key_fields)
                && old_id != id
            {
                state.remove(&old_id);
            }
            state.insert(id, new.clone());
        }
    }
}

impl OpenArtifact {
    fn sync_reader(
        self,
    ) -> (
        String,
        Format,
        IntegrityReader<Box<dyn Read + Send>>,
        IntegrityOutcome,
    ) {
        let raw: Box<dyn Read + Send> = match self.reader {
            ObjectSource::File(file) => Box::new(file),
            ObjectSource::Async(reader) => Box::new(SyncIoBridge::new(reader)),
        };
        let outcome = IntegrityOutcome::default();
        let reader = IntegrityReader::new(raw, self.expected, outcome.clone());
        (self.key, self.format, reader, outcome)
    }

    /// Decodes every row; the integrity of the object is checked once it is fully read (a
    /// decode error such as a truncated record is reported first, as it says more).
    pub fn decode_rows<F>(self, key_fields: &[String], mut f: F) -> Result<()>
    where
        F: FnMut(DecodedRow) -> Result<()>,
    {
        let (key, fmt, reader, outcome) = self.sync_reader();
        let framed = format::framed_reader(fmt, &key, reader)?;
        for row in format::decode_rows(fmt, &key, framed, key_fields) {
            f(row?)?;
        }
        outcome.check(&key)
    }

    /// Calls `f` with every row's JSON text, not validated (see
    /// [`format::for_each_row_text`]); the integrity of the object is checked at its end.
    pub fn decode_row_texts<F>(self, f: F) -> Result<()>
    where
        F: FnMut(&str) -> Result<()>,
    {
        let (key, fmt, reader, outcome) = self.sync_reader();
        let framed = format::framed_reader(fmt, &key, reader)?;
        format::for_each_row_text(fmt, &key, framed, f)?;
        outcome.check(&key)
    }

    /// Calls `f` with blocks of whole lines of a JSONL object (see
    /// [`ArchiveReader::fold_line_blocks`]); the integrity of the object is checked at its end.
    pub fn read_line_blocks<F>(self, target: usize, f: F) -> Result<()>
    where
        F: FnMut(format::line_blocks::LineBlock) -> Result<()>,
    {
        if !matches!(self.format, Format::Jsonl | Format::JsonlZstd) {
            return Err(ArchiveError::Invalid(format!(
                "{}: read in line blocks, but it is {}, not JSONL",
                self.key, self.format
            )));
        }
        let (key, fmt, reader, outcome) = self.sync_reader();
        let framed = format::framed_reader(fmt, &key, reader)?;
        format::line_blocks::for_each_block(&key, framed, target, f)?;
        outcome.check(&key)
    }

    pub fn decode_changes<F>(self, mut f: F) -> Result<()>
    where
        F: FnMut(Change) -> Result<()>,
    {
        let (key, fmt, reader, outcome) = self.sync_reader();
        let framed = format::framed_reader(fmt, &key, reader)?;
        for change in format::decode_changes(fmt, &key, framed) {
            f(change?)?;
        }
        outcome.check(&key)
    }
}

/// The verdict of an [`IntegrityReader`], available once the object was read to its end.
#[derive(Clone, Default)]
pub struct IntegrityOutcome(Arc<std::sync::Mutex<Option<std::result::Result<(), String>>>>);

impl IntegrityOutcome {
    pub fn check(&self, key: &str) -> Result<()> {
        match self.0.locked().clone() {
            Some(Ok(())) => Ok(()),
            Some(Err(detail)) => Err(ArchiveError::Integrity {
                key: key.to_string(),
                detail,
            }),
            None => Err(ArchiveError::Integrity {
                key: key.to_string(),
                detail: "the object was not read to its end".into(),
            }),
        }
    }
}

/// Counts and hashes the bytes of an object; at its end checks them against the manifest
/// (`size_bytes`, and `sha256` when present).
pub struct IntegrityReader<R> {
    inner: R,
    expected: FormatRef,
    hasher: Option<Sha256>,
    size: u64,
    outcome: IntegrityOutcome,
}

impl<R: Read> IntegrityReader<R> {
    pub fn new(inner: R, expected: FormatRef, outcome: IntegrityOutcome) -> Self {
        let hasher = expected.sha256.as_ref().map(|_| Sha256::new());
        IntegrityReader {
            inner,
            expected,
            hasher,
            size: 0,
            outcome,
        }
    }

    fn verdict(&mut self) -> std::result::Result<(), String> {
        if self.expected.size_bytes > 0 && self.size != self.expected.size_bytes as u64 {
            return Err(format!(
                "size is {} bytes, the manifest says {}",
                self.size, self.expected.size_bytes
            ));
        }
        if let (Some(h), Some(want)) = (self.hasher.take(), &self.expected.sha256) {
            let got = hex::encode(h.finalize());
            if !got.eq_ignore_ascii_case(want) {
                return Err(format!("sha256 is {got}, the manifest says {want}"));
            }
        }
        Ok(())
    }
}

impl<R: Read> Read for IntegrityReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 {
            if self.outcome.0.locked().is_none() {
                let verdict = self.verdict();
                *self.outcome.0.locked() = Some(verdict);
            }
            return Ok(0);
        }
        self.size += n as u64;
        if let Some(h) = &mut self.hasher {
            h.update(&buf[..n]);
        }
        Ok(n)
    }
}
