//! The table at a plan's head, streamed row by row in bounded memory: what a compaction writes
//! as the new snapshot and what an engine's baseline loads.
//!
//! The chain's diffs are folded first into their net effect per identity (an *overlay*: the new
//! row, or a deletion; a TRUNCATE drops the snapshot). When the overlay fits its memory budget,
//! the snapshot is streamed past it, skipping the rows it shadows, and its live rows follow — the
//! snapshot is never held. When it does not fit (a diff as large as the table, after a backfill),
//! the overlay is spilled to sorted runs, the snapshot's rows are spilled the same way, and the
//! rows come out of a merge of the two by identity (newest wins): memory stays within the budget
//! whatever the size of the diffs.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use super::error::{ArchiveError, Result};
use super::identity::{change_identity, row_identity};
use super::model::{Action, Change};
use super::plan::Plan;
use super::reader::ArchiveReader;
use super::spill::{ChangeBuffer, Entry, Merged, Spill};
use super::value::Row;

/// Rows are sent to `rows`; `verdict` says whether every row was sent (`Err` otherwise).
pub struct HeadRows {
    pub rows: mpsc::Receiver<Row>,
    pub verdict: oneshot::Receiver<Result<()>>,
}

const STOPPED: &str = "the consumer of the folded rows stopped";

/// Whether an error only says that the consumer went away.
pub fn is_stopped(e: &ArchiveError) -> bool {
    matches!(e, ArchiveError::Invalid(m) if m == STOPPED)
}

fn stopped() -> ArchiveError {
    ArchiveError::Invalid(STOPPED.into())
}

/// Streams the rows of `plan` folded at its head (R4, R5), keeping at most `budget` bytes of
/// collapsed changes in memory and the rest in `spill`.
pub fn head_rows(
    reader: ArchiveReader,
    plan: Plan,
    key_fields: Vec<String>,
    spill: Arc<Spill>,
    budget: u64,
) -> HeadRows {
    let (tx, rows) = mpsc::channel::<Row>(1024);
    let (verdict_tx, verdict) = oneshot::channel();
    tokio::spawn(async move {
        let result = async {
            let overlay = fold_diffs(&reader, &plan, &key_fields, spill, budget).await?;
            fold_past(reader, plan, key_fields, overlay, budget, tx).await
        }
        .await;
        let _ = verdict_tx.send(result);
    });
    HeadRows { rows, verdict }
}

/// [`head_rows`] of a plan whose diffs are folded into `overlay` already ([`fold_diffs`]).
pub fn head_rows_past(
    reader: ArchiveReader,
    plan: Plan,
    key_fields: Vec<String>,
    overlay: ChangeBuffer,
    budget: u64,
) -> HeadRows {
    let (tx, rows) = mpsc::channel::<Row>(1024);
    let (verdict_tx, verdict) = oneshot::channel();
    tokio::spawn(async move {
        let result = fold_past(reader, plan, key_fields, overlay, budget, tx).await;
        let _ = verdict_tx.send(result);
    });
    HeadRows { rows, verdict }
}

/// The net effect of `plan`'s diffs per identity (the *overlay*: the newest row, or a
/// deletion; a TRUNCATE drops the snapshot), at most `budget` bytes of it in memory.
pub async fn fold_diffs(
    reader: &ArchiveReader,
    plan: &Plan,
    key_fields: &[String],
    spill: Arc<Spill>,
    budget: u64,
) -> Result<ChangeBuffer> {
    let mut overlay = ChangeBuffer::new(spill);
    for diff in &plan.diffs {
        let keys = key_fields.to_vec();
        overlay = reader
            .fold_diff_in_order(diff, overlay, move |ov, c| {
                overlay_change(ov, c, &keys, budget)
            })
            .await?;
    }
    Ok(overlay)
}

/// The rows an overlay held in memory adds after the snapshot's (its inserts and updates).
pub fn live_rows(overlay: &ChangeBuffer) -> impl Iterator<Item = &Row> {
    overlay
        .memory_entries()
        .filter_map(|(_, e)| match e.action {
            Action::Delete | Action::Truncate => None,
            Action::Insert | Action::Update => e.new.as_ref(),
        })
}

/// Applies one archived change to the overlay (R5): a TRUNCATE clears it, an UPDATE whose old
/// identity differs also deletes the old one.
fn overlay_change(
    overlay: &mut ChangeBuffer,
    c: Change,
    keys: &[String],
    budget: u64,
) -> Result<()> {
    let deleted = || Entry {
        action: Action::Delete,
        old: None,
        new: None,
    };
    match c.action {
        Action::Truncate => {
            overlay.truncate();
            Ok(())
        }
        Action::Delete => overlay.insert_within(change_identity(&c, keys), deleted(), budget),
        Action::Insert | Action::Update => {
            let id = change_identity(&c, keys);
            if c.action == Action::Update
                && let Some(old) = &c.old
                && let Some(old_id) = row_identity(old, keys)
                && old_id != id
            {
                overlay.insert_within(old_id, deleted(), budget)?;
            }
            let Some(new) = c.new else { return Ok(()) };
            let entry = Entry {
                action: c.action,
                old: None,
                new: Some(new),
            };
            overlay.insert_within(id, entry, budget)
        }
    }
}

fn live_row(e: Entry) -> Option<Row> {
    match e.action {
        Action::Delete | Action::Truncate => None,
        Action::Insert | Action::Update => e.new,
    }
}

async fn fold_past(
    reader: ArchiveReader,
    plan: Plan,
    key_fields: Vec<String>,
    mut overlay: ChangeBuffer,
    budget: u64,
    tx: mpsc::Sender<Row>,
) -> Result<()> {
    let spill = overlay.spill_handle();
    let base = plan.snapshot.clone().filter(|_| !overlay.truncated());
    if !overlay.has_runs() {
        // The overlay fits in memory: stream the snapshot past it.
        if let Some(snapshot) = base {
            let feed = tx.clone();
            overlay = reader
                .fold_rows(&snapshot, key_fields, overlay, move |ov, d| {
                    let id = d.identity.unwrap_or_else(|| d.row.as_str().into());
                    if ov.contains_in_memory(&id) {
                        return Ok(());
                    }
                    feed.blocking_send(d.row).map_err(|_| stopped())
                })
                .await?;
        }
        for (_, e) in overlay.memory_entries() {
            if let Some(row) = live_row(e.clone()) {
                tx.send(row).await.map_err(|_| stopped())?;
            }
        }
        return Ok(());
    }
    // The overlay spilled: spill the snapshot's rows too and merge both by identity.
    overlay.spill()?;
    let mut rows = ChangeBuffer::new(spill);
    if let Some(snapshot) = base {
        rows = reader
            .fold_rows(&snapshot, key_fields, rows, move |rows, d| {
                let id = d.identity.unwrap_or_else(|| d.row.as_str().into());
                let entry = Entry {
                    action: Action::Insert,
                    old: None,
                    new: Some(d.row),
                };
                rows.insert_within(id, entry, budget)
            })
            .await?;
    }
    tokio::task::spawn_blocking(move || {
        for item in Merged::of(&[&rows, &overlay])? {
            let (_, e) = item?;
            if let Some(row) = live_row(e) {
                tx.blocking_send(row).map_err(|_| stopped())?;
            }
        }
        Ok(())
    })
    .await
    .expect("merge thread")
}
