//! A split export whose ranges are copied by separate worker processes, coordinated through
//! the archive's store (docs/postgres-source.md, "The ranges copied by separate processes"):
//!
//! * the coordinator writes a [`Plan`] at `<prefix>split/plan.json` (compare-and-swap: one
//!   plan at a time): its run id, the exported snapshot the workers import, the ranges (page
//!   bounds, never SQL), and per snapshot format the object's upload (S3: a multipart upload
//!   whose part numbers are shared out between the ranges; other stores: one object per range
//!   under `<prefix>split/<run>/`, joined by the coordinator);
//! * a worker writes each range it finishes, then its [`Checkpoint`] at
//!   `<prefix>split/<run>/range-<r>.json`; a worker that starts again skips the ranges that
//!   have one, and a range killed half-way is written again (a part uploaded again under its
//!   number replaces the earlier one; a part no checkpoint names is never completed);
//! * the coordinator completes the uploads from the checkpoints, in range order, commits the
//!   manifest (the single commit point), then deletes the plan and everything under
//!   `<prefix>split/<run>/`. A coordinator that fails, or that finds the plan of a run whose
//!   snapshot is gone, aborts its uploads and deletes it all ([`discard`]).
//!
//! Nothing under `split/` is an artifact: readers (laredo included) never look there, and the
//! writer's orphan sweep leaves it alone; `larch archive gc` removes what a dead run left.

pub mod join;
pub mod worker;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::{ArchiveError, Result};
use crate::format::Format;
use crate::store::{Store, UploadInProgress};

/// What a plan's layout is: bumped when a worker could misread it.
pub const PLAN_VERSION: u32 = 1;

/// S3's highest part number: the last range's tail joined with nothing after it.
pub const LAST_PART_NUMBER: i32 = 10_000;

/// The folder of a split run's objects under the archive's key prefix.
pub fn split_dir(key_prefix: &str) -> String {
    format!("{key_prefix}split/")
}

/// Where the plan of the archive at `key_prefix` lives.
pub fn plan_key(key_prefix: &str) -> String {
    format!("{key_prefix}split/plan.json")
}

/// The folder of run `run_id`'s checkpoints and range objects.
pub fn run_dir(key_prefix: &str, run_id: &str) -> String {
    format!("{key_prefix}split/{run_id}/")
}

/// The checkpoint of range `range` of run `run_id`.
pub fn checkpoint_key(key_prefix: &str, run_id: &str, range: usize) -> String {
    format!("{}range-{range}.json", run_dir(key_prefix, run_id))
}

/// The range whose checkpoint `name` (a key under the run's folder) is.
fn checkpoint_range(name: &str) -> Option<usize> {
    name.strip_prefix("range-")?
        .strip_suffix(".json")?
        .parse()
        .ok()
}

/// The marker worker `worker` of run `run_id` writes when it starts copying.
pub fn started_key(key_prefix: &str, run_id: &str, worker: u16) -> String {
    format!("{}worker-{worker}.started", run_dir(key_prefix, run_id))
}

/// One range of the table, by its pages: `[first, end)`, `end: None` to the end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageRange {
    pub first: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<u64>,
}

/// One snapshot format's object and how its ranges reach it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedUpload {
    pub format: Format,
    /// The snapshot object's key (under the store's root).
    pub key: String,
    /// The multipart upload the ranges' parts go to (S3); `None`: one object per range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload_id: Option<String>,
}

/// A split run, as its coordinator wrote it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub version: u32,
    pub run_id: String,
    pub table: String,
    /// The exported snapshot every range is read from (`SET TRANSACTION SNAPSHOT`).
    pub snapshot: String,
    pub position: String,
    pub epoch: i64,
    pub workers: u16,
    pub ranges: Vec<PageRange>,
    pub uploads: Vec<PlannedUpload>,
    /// A digest of what shapes the rows (table, key fields, formats, transform, row filter,
    /// sample): a worker given other settings than its coordinator refuses to run.
    pub settings: String,
    pub coordinator: String,
    pub created_at: String,
}

impl Plan {
    /// Part numbers each range owns in a multipart upload: its first for the part joining the
    /// previous range's tail and its head, then its own full parts.
    pub fn parts_per_range(&self) -> i32 {
        (LAST_PART_NUMBER - 1) / self.ranges.len().max(1) as i32
    }

    /// The first part number of range `range`.
    pub fn first_part(&self, range: usize) -> i32 {
        1 + range as i32 * self.parts_per_range()
    }

    /// The ranges worker `index` copies.
    pub fn ranges_of(&self, index: u16) -> Vec<usize> {
        (0..self.ranges.len())
            .filter(|r| r % usize::from(self.workers.max(1)) == usize::from(index))
            .collect()
    }
}

/// An object a range stored (its head, tail, or all of it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredPiece {
    pub key: String,
    pub size: u64,
}

/// A part a range uploaded into a multipart upload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadedPart {
    pub number: i32,
    pub etag: String,
    pub size: u64,
}

/// What one range wrote for one format: `head`, then `parts`, then `tail` (multipart), or
/// `whole` (one object).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeOutput {
    /// Bytes of the range in this format.
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub whole: Option<StoredPiece>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head: Option<StoredPiece>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<UploadedPart>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail: Option<StoredPiece>,
}

/// A finished range: written after every byte of it is stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub run_id: String,
    pub range: usize,
    pub rows: u64,
    /// In the order of the plan's uploads.
    pub outputs: Vec<RangeOutput>,
    pub worker: u16,
}

fn parse<T: for<'de> Deserialize<'de>>(key: &str, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| ArchiveError::Invalid(format!("{key}: {e}")))
}

/// The plan at `key_prefix` and its revision, if there is one.
pub async fn read_plan(store: &dyn Store, key_prefix: &str) -> Result<Option<(Plan, String)>> {
    let key = plan_key(key_prefix);
    let Some(got) = store.get(&key).await? else {
        return Ok(None);
    };
    let plan: Plan = parse(&key, &got.bytes)?;
    if plan.version != PLAN_VERSION {
        return Err(ArchiveError::Invalid(format!(
            "{key}: plan version {} (this larch reads {PLAN_VERSION})",
            plan.version
        )));
    }
    Ok(Some((plan, got.revision)))
}

/// Writes `plan` where none is (compare-and-swap: another coordinator's plan is a conflict).
pub async fn write_plan(store: &dyn Store, key_prefix: &str, plan: &Plan) -> Result<()> {
    let bytes = Bytes::from(serde_json::to_vec_pretty(plan).expect("a plan serializes"));
    store.put_cas(&plan_key(key_prefix), bytes, "").await?;
    Ok(())
}

/// The checkpoint of `range`, if it was written.
pub async fn read_checkpoint(
    store: &dyn Store,
    key_prefix: &str,
    plan: &Plan,
    range: usize,
) -> Result<Option<Checkpoint>> {
    let key = checkpoint_key(key_prefix, &plan.run_id, range);
    let Some(got) = store.get(&key).await? else {
        return Ok(None);
    };
    let c: Checkpoint = parse(&key, &got.bytes)?;
    if c.run_id != plan.run_id || c.range != range || c.outputs.len() != plan.uploads.len() {
        return Err(ArchiveError::Invalid(format!(
            "{key} does not describe range {range} of run {}",
            plan.run_id
        )));
    }
    Ok(Some(c))
}

/// Writes a finished range's checkpoint.
pub async fn write_checkpoint(
    store: &dyn Store,
    key_prefix: &str,
    checkpoint: &Checkpoint,
) -> Result<()> {
    let key = checkpoint_key(key_prefix, &checkpoint.run_id, checkpoint.range);
    let bytes = serde_json::to_vec_pretty(checkpoint).expect("a checkpoint serializes");
    store.put(&key, &bytes).await?;
    crate::crashpoint::crash_point(crate::crashpoint::SPLIT_AFTER_CHECKPOINT);
    Ok(())
}

/// Records that worker `worker` started copying `plan`'s ranges (it imported the snapshot and
/// its settings match): the coordinator waits only so long for a worker that never comes.
pub async fn mark_started(
    store: &dyn Store,
    key_prefix: &str,
    plan: &Plan,
    worker: u16,
) -> Result<()> {
    let body = serde_json::json!({ "worker": worker, "run": plan.run_id });
    store
        .put(
            &started_key(key_prefix, &plan.run_id, worker),
            body.to_string().as_bytes(),
        )
        .await?;
    Ok(())
}

/// The workers of `plan` that have started: those with a marker ([`mark_started`]) or a
/// checkpoint of one of their ranges.
pub async fn started_workers(store: &dyn Store, key_prefix: &str, plan: &Plan) -> Result<Vec<u16>> {
    let dir = run_dir(key_prefix, &plan.run_id);
    let workers = plan.workers.max(1);
    let mut started: Vec<u16> = store
        .list(&dir)
        .await?
        .iter()
        .filter_map(|o| {
            let name = o.key.strip_prefix(&dir)?;
            if let Some(w) = name
                .strip_prefix("worker-")
                .and_then(|n| n.strip_suffix(".started"))
            {
                return w.parse().ok();
            }
            let range = checkpoint_range(name).filter(|r| *r < plan.ranges.len())?;
            Some((range % usize::from(workers)) as u16)
        })
        .filter(|w| *w < workers)
        .collect();
    started.sort_unstable();
    started.dedup();
    Ok(started)
}

/// The numbers of the ranges of `plan` that have a checkpoint.
pub async fn checkpointed(store: &dyn Store, key_prefix: &str, plan: &Plan) -> Result<Vec<usize>> {
    let dir = run_dir(key_prefix, &plan.run_id);
    let mut done: Vec<usize> = store
        .list(&dir)
        .await?
        .iter()
        .filter_map(|o| checkpoint_range(o.key.strip_prefix(&dir)?))
        .filter(|r| *r < plan.ranges.len())
        .collect();
    done.sort_unstable();
    Ok(done)
}

/// Ends run `plan`: aborts its multipart uploads, deletes its checkpoints and range objects,
/// then the plan (only if it is still this run's). Best effort: what fails is logged, and
/// `larch archive gc` removes it later.
pub async fn discard(store: &dyn Store, key_prefix: &str, plan: &Plan) {
    if let Some(shared) = store.shared_uploads() {
        for u in &plan.uploads {
            if let Some(id) = &u.upload_id {
                shared.abort(&u.key, id).await;
            }
        }
    }
    delete_run_objects(store, key_prefix, &plan.run_id).await;
    delete_plan_of(store, key_prefix, &plan.run_id).await;
}

/// Deletes everything under run `run_id`'s folder (unfinished writes of killed workers too).
pub async fn delete_run_objects(store: &dyn Store, key_prefix: &str, run_id: &str) {
    delete_folder(store, &run_dir(key_prefix, run_id)).await;
}

async fn delete_folder(store: &dyn Store, dir: &str) {
    match store.list(dir).await {
        Ok(objects) => {
            for o in objects {
                if let Err(e) = store.delete(&o.key).await {
                    tracing::warn!(key = %o.key, error = %e, "could not delete an object of a split run; `larch archive gc` removes it");
                }
            }
        }
        Err(e) => {
            tracing::warn!(dir = %dir, error = %e, "could not list a split run's objects; `larch archive gc` removes them")
        }
    }
    if let Err(e) = store.clear_unfinished(dir).await {
        tracing::warn!(dir = %dir, error = %e, "could not clear unfinished writes of a split run");
    }
}

/// Deletes every run's objects under `split/` when no plan is there (after a commit).
pub async fn delete_dead_runs(store: &dyn Store, key_prefix: &str) {
    if matches!(read_plan(store, key_prefix).await, Ok(None)) {
        delete_folder(store, &split_dir(key_prefix)).await;
    }
}

/// Deletes the plan if it is still run `run_id`'s.
pub async fn delete_plan_of(store: &dyn Store, key_prefix: &str, run_id: &str) {
    match read_plan(store, key_prefix).await {
        Ok(Some((p, _))) if p.run_id == run_id => {
            if let Err(e) = store.delete(&plan_key(key_prefix)).await {
                tracing::warn!(error = %e, "could not delete a split run's plan; `larch archive gc` removes it");
            }
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "could not read the split plan to delete it"),
    }
}

/// What `larch archive gc` found of split runs under a key prefix.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SplitLeftovers {
    /// The live plan's run (kept), if any.
    pub live_run: Option<String>,
    /// Objects under `split/` of no live run.
    pub objects: Vec<String>,
    /// Multipart uploads under the prefix no live plan names, started before the manifest
    /// was stored (by the store's clock: no writer can commit them any more).
    pub uploads: Vec<UploadInProgress>,
}

/// The leftovers of dead split runs at `key_prefix`: objects under `split/` other than the
/// live plan and its run's, and the multipart uploads under the prefix the live plan does not
/// name that were started before `manifest_stored_at`. With `no_writer` (nobody writes the
/// archive now), the plan counts as dead too and every upload under the prefix is a leftover.
pub async fn find_leftovers(
    store: &dyn Store,
    key_prefix: &str,
    manifest_stored_at: Option<DateTime<Utc>>,
    no_writer: bool,
) -> Result<SplitLeftovers> {
    let live = match read_plan(store, key_prefix).await {
        Ok(p) => p.map(|(p, _)| p).filter(|_| !no_writer),
        // An unreadable plan is no live run's.
        Err(_) => None,
    };
    let plan = plan_key(key_prefix);
    let live_dir = live.as_ref().map(|p| run_dir(key_prefix, &p.run_id));
    let objects = store
        .list(&split_dir(key_prefix))
        .await?
        .into_iter()
        .map(|o| o.key)
        .filter(|k| live.is_none() || *k != plan)
        .filter(|k| live_dir.as_ref().is_none_or(|d| !k.starts_with(d.as_str())))
        .collect();
    let named: Vec<&str> = live
        .iter()
        .flat_map(|p| p.uploads.iter().filter_map(|u| u.upload_id.as_deref()))
        .collect();
    let dead = |u: &UploadInProgress| {
        no_writer || matches!((u.initiated, manifest_stored_at), (Some(i), Some(m)) if i < m)
    };
    let uploads = match store.shared_uploads() {
        Some(shared) => shared
            .in_progress(key_prefix)
            .await?
            .into_iter()
            .filter(|u| !named.contains(&u.upload_id.as_str()) && dead(u))
            .collect(),
        None => Vec::new(),
    };
    Ok(SplitLeftovers {
        live_run: live.map(|p| p.run_id),
        objects,
        uploads,
    })
}

/// Removes what [`find_leftovers`] found.
pub async fn remove_leftovers(
    store: &dyn Store,
    key_prefix: &str,
    found: &SplitLeftovers,
) -> Result<()> {
    if let Some(shared) = store.shared_uploads() {
        for u in &found.uploads {
            shared.abort(&u.key, &u.upload_id).await;
        }
    }
    for key in &found.objects {
        store.delete(key).await?;
    }
    if found.live_run.is_none() {
        store.clear_unfinished(&split_dir(key_prefix)).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(ranges: usize, workers: u16) -> Plan {
        Plan {
            version: PLAN_VERSION,
            run_id: "r1".into(),
            table: "public.t".into(),
            snapshot: "00000003-1".into(),
            position: "0/1".into(),
            epoch: 1,
            workers,
            ranges: (0..ranges as u64)
                .map(|i| PageRange {
                    first: i,
                    end: Some(i + 1),
                })
                .collect(),
            uploads: Vec::new(),
            settings: String::new(),
            coordinator: "c".into(),
            created_at: String::new(),
        }
    }

    #[test]
    fn workers_share_the_ranges_and_part_numbers() {
        let p = plan(5, 2);
        assert_eq!(p.ranges_of(0), vec![0, 2, 4]);
        assert_eq!(p.ranges_of(1), vec![1, 3]);
        assert!(p.ranges_of(2).is_empty());
        assert_eq!(p.parts_per_range(), 1999);
        assert_eq!(p.first_part(0), 1);
        assert_eq!(p.first_part(4), 1 + 4 * 1999);
        // Every range's numbers stay below the last range's tail.
        assert!(p.first_part(4) + p.parts_per_range() - 1 < LAST_PART_NUMBER);
    }
}
