//! A base snapshot whose ranges separate worker processes write ([`crate::split_run`]): the
//! writer plans the run in the store, waits for every range's checkpoint, joins each format's
//! object from them and commits (the manifest swap stays the single commit point). On any
//! failure the run's uploads are aborted and its plan and objects deleted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::ArchiveWriter;
use super::uploads::Written;
use crate::error::{ArchiveError, Result};
use crate::manifest::{Artifact, FormatRef, artifact_key};
use crate::split_run::{self, Checkpoint, PLAN_VERSION, PageRange, Plan, PlannedUpload};
use crate::store::Store;

/// How often the coordinator looks for new checkpoints.
const POLL: Duration = Duration::from_millis(500);

/// A split run the coordinator plans: where the rows come from and who copies them.
pub struct WorkersRun {
    /// The exported snapshot the workers import.
    pub snapshot: String,
    pub ranges: Vec<PageRange>,
    pub workers: u16,
    /// The digest of the settings that shape the rows ([`Plan::settings`]).
    pub settings: String,
    /// Who coordinates (a pod's or host's name).
    pub coordinator: String,
    /// When waiting for the workers ends in failure (the snapshot's end).
    pub deadline: Instant,
    /// How long each worker has to start (its marker or a checkpoint) before the run fails:
    /// a worker that never comes would keep the snapshot, and the primary's vacuum horizon,
    /// until `deadline`.
    pub start_timeout: Duration,
    /// Told the rows of each range as its checkpoint arrives (progress).
    pub on_range: Box<dyn Fn(u64) + Send + Sync>,
}

impl ArchiveWriter {
    /// Writes a base snapshot at a new epoch at `position` from the ranges the workers of
    /// `run` copy, then commits it. A plan an earlier coordinator left (its snapshot gone with
    /// it) is discarded first: its uploads aborted, its objects deleted.
    pub async fn write_snapshot_by_workers(
        &mut self,
        position: &str,
        run: WorkersRun,
    ) -> Result<Artifact> {
        let [store] = self.stores.as_slice() else {
            return Err(ArchiveError::Invalid(
                "a split export with workers writes to one store".into(),
            ));
        };
        let (store, prefix) = (store.clone(), self.config.key_prefix.clone());
        if let Some((old, _)) = split_run::read_plan(store.as_ref(), &prefix).await? {
            tracing::warn!(run = %old.run_id, coordinator = %old.coordinator, "discarding the split plan of an earlier coordinator (its snapshot ended with it): a new run starts");
            split_run::discard(store.as_ref(), &prefix, &old).await;
        }
        let mut artifact = self.next_snapshot_artifact(position);
        let plan = self.start_plan(&store, &artifact, &run).await?;
        crate::crashpoint::crash_point(crate::crashpoint::SPLIT_AFTER_PLAN);
        tracing::info!(run = %plan.run_id, ranges = plan.ranges.len(), workers = plan.workers, "split plan written: waiting for the workers");
        let joined = match wait_for_ranges(&store, &prefix, &plan, &run).await {
            Ok(checkpoints) => join_all(&store, &plan, &checkpoints, &mut artifact).await,
            Err(e) => Err((e, Vec::new())),
        };
        let (rows, written, primary_bytes) = match joined {
            Ok(j) => j,
            Err((e, written)) => {
                split_run::discard(store.as_ref(), &prefix, &plan).await;
                self.cleanup(&written).await;
                return Err(e);
            }
        };
        artifact.row_count = rows as i64;
        if let Err(e) = self.commit(artifact.clone(), Some(artifact.epoch)).await {
            split_run::discard(store.as_ref(), &prefix, &plan).await;
            self.cleanup(&written).await;
            return Err(e);
        }
        // Committed: what the run stored besides the snapshot is no longer needed, nor what
        // a worker of a discarded run wrote late.
        split_run::delete_plan_of(store.as_ref(), &prefix, &plan.run_id).await;
        split_run::delete_dead_runs(store.as_ref(), &prefix).await;
        self.buffer.clear();
        self.buffer_commit_times = None;
        self.churn = 0;
        self.rows_estimate = rows;
        self.last_snapshot_at = Some(Instant::now());
        self.last_snapshot_bytes = primary_bytes;
        Ok(artifact)
    }

    /// Starts each format's upload and writes the plan (nothing stays on failure).
    async fn start_plan(
        &self,
        store: &Arc<dyn Store>,
        artifact: &Artifact,
        run: &WorkersRun,
    ) -> Result<Plan> {
        let prefix = &self.config.key_prefix;
        let mut plan = Plan {
            version: PLAN_VERSION,
            run_id: format!("{:016x}", rand::random::<u64>()),
            table: self.config.table.clone(),
            snapshot: run.snapshot.clone(),
            position: artifact.to_position.clone(),
            epoch: artifact.epoch,
            workers: run.workers,
            ranges: run.ranges.clone(),
            uploads: Vec::new(),
            settings: run.settings.clone(),
            coordinator: run.coordinator.clone(),
            created_at: self.config.clock.now().to_rfc3339(),
        };
        for format in &self.config.snapshot_formats {
            let key = artifact_key(prefix, artifact, format.extension());
            let upload_id = match store.shared_uploads() {
                Some(shared) => match shared.start(&key).await {
                    Ok(id) => Some(id),
                    Err(e) => {
                        split_run::discard(store.as_ref(), prefix, &plan).await;
                        return Err(e);
                    }
                },
                None => None,
            };
            plan.uploads.push(PlannedUpload {
                format: *format,
                key,
                upload_id,
            });
        }
        if let Err(e) = split_run::write_plan(store.as_ref(), prefix, &plan).await {
            // Only our uploads: the plan there is another coordinator's.
            let ours = Plan {
                run_id: format!("{}-unwritten", plan.run_id),
                ..plan
            };
            split_run::discard(store.as_ref(), prefix, &ours).await;
            return Err(match e {
                ArchiveError::CasConflict { key } => ArchiveError::Invalid(format!(
                    "{key}: another coordinator wrote a split plan at the same time; not starting"
                )),
                e => e,
            });
        }
        Ok(plan)
    }
}

/// Waits until every range of `plan` has its checkpoint; returns them in range order. The plan
/// replaced by another coordinator, or the deadline, ends the wait in failure; a store that
/// fails to answer is asked again at the next poll.
async fn wait_for_ranges(
    store: &Arc<dyn Store>,
    prefix: &str,
    plan: &Plan,
    run: &WorkersRun,
) -> Result<Vec<Checkpoint>> {
    let mut found: Vec<Option<Checkpoint>> = vec![None; plan.ranges.len()];
    let mut missing = plan.ranges.len();
    let mut start_by = Some(Instant::now() + run.start_timeout);
    while missing > 0 {
        if start_by.is_some_and(|t| Instant::now() >= t) {
            match split_run::started_workers(store.as_ref(), prefix, plan).await {
                Ok(started) => {
                    let absent: Vec<u16> = (0..plan.workers.max(1))
                        .filter(|w| !started.contains(w))
                        .collect();
                    if !absent.is_empty() {
                        return Err(workers_absent(&absent, plan.workers, run.start_timeout));
                    }
                    start_by = None;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reading which split workers started failed; trying again")
                }
            }
        }
        if Instant::now() >= run.deadline {
            return Err(ArchiveError::Invalid(format!(
                "{missing} of {} ranges had no checkpoint before the snapshot's end \
                 (--snapshot-max-age): are the split workers running?",
                plan.ranges.len()
            )));
        }
        match poll(store, prefix, plan, &mut found, run).await {
            Ok(n) => missing = n,
            Err(e @ ArchiveError::Invalid(_)) => return Err(e),
            Err(e) => {
                tracing::warn!(error = %e, "reading the split run's checkpoints failed; trying again")
            }
        }
        if missing > 0 {
            tokio::time::sleep(POLL).await;
        }
    }
    Ok(found
        .into_iter()
        .map(|c| c.expect("every range found"))
        .collect())
}

/// The failure of a run whose workers `absent` did not start within `timeout`.
fn workers_absent(absent: &[u16], workers: u16, timeout: Duration) -> ArchiveError {
    let names: Vec<String> = absent.iter().map(u16::to_string).collect();
    ArchiveError::GaveUpWaiting(format!(
        "split worker{} {} (of {workers}) did not start within {timeout:?} \
         (--split-workers-start-timeout): the snapshot is released rather than held for \
         workers that may never come; are their processes (pods) running?",
        if absent.len() == 1 { "" } else { "s" },
        names.join(", "),
    ))
}

/// Reads the checkpoints that arrived; returns how many ranges still have none.
async fn poll(
    store: &Arc<dyn Store>,
    prefix: &str,
    plan: &Plan,
    found: &mut [Option<Checkpoint>],
    run: &WorkersRun,
) -> Result<usize> {
    match split_run::read_plan(store.as_ref(), prefix).await? {
        Some((p, _)) if p.run_id == plan.run_id => {}
        _ => {
            return Err(ArchiveError::Invalid(format!(
                "the split plan of run {} was replaced or removed (another coordinator?)",
                plan.run_id
            )));
        }
    }
    for range in split_run::checkpointed(store.as_ref(), prefix, plan).await? {
        if found[range].is_none()
            && let Some(c) = split_run::read_checkpoint(store.as_ref(), prefix, plan, range).await?
        {
            (run.on_range)(c.rows);
            found[range] = Some(c);
        }
    }
    Ok(found.iter().filter(|c| c.is_none()).count())
}

/// Joins every format's object; returns the rows, what was stored and the first format's size.
async fn join_all(
    store: &Arc<dyn Store>,
    plan: &Plan,
    checkpoints: &[Checkpoint],
    artifact: &mut Artifact,
) -> std::result::Result<(u64, Written, u64), (ArchiveError, Written)> {
    let mut written: Written = Vec::new();
    let mut first_bytes = None;
    for (index, upload) in plan.uploads.iter().enumerate() {
        match split_run::join::complete(store, plan, index, checkpoints).await {
            Ok(put) => {
                written.push((store.clone(), upload.key.clone()));
                first_bytes.get_or_insert(put.size);
                artifact.formats.insert(
                    upload.format.id().to_string(),
                    FormatRef {
                        uri: put.uri,
                        size_bytes: put.size as i64,
                        sha256: Some(put.sha256),
                    },
                );
            }
            Err(e) => return Err((e, written)),
        }
    }
    let rows = checkpoints.iter().map(|c| c.rows).sum();
    Ok((rows, written, first_bytes.unwrap_or(0)))
}
