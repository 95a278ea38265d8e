//! A worker process of a split export (`larch export split-worker`): copies its share of the
//! ranges of the coordinator's plan (read from the archive's store) from the coordinator's
//! exported snapshot into the plan's uploads, and checkpoints each range it finishes
//! ([`larch_archive::split_run`]). It exits once the coordinator committed the epoch.
//!
//! A plan whose snapshot is gone (its coordinator died) is no failure: the worker waits for
//! the plan of the coordinator's next run (a new run id), at most `plan_wait`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use tokio::sync::{mpsc, oneshot};

use super::split_coordinator::settings_digest;
use super::subset::Sampler;
use super::transform::TableTransform;
use super::{BATCHES_IN_FLIGHT, BaselineSink, baseline_verdict, compile_epoch, forward_rows};
use larch_archive::manifest::{ArtifactKind, Manifest, manifest_key};
use larch_archive::model::TableId;
use larch_archive::split_run::{self, Plan};
use larch_archive::store::Store;
use larch_archive::value::Row;
use larch_contract::export_request::ExportRequest;
use larch_core::failure::{self, Reason};
use larch_core::progress::Progress;
use larch_postgres::{ImportedSnapshot, PostgresSource, split::Range};

/// How often a worker looks at the plan while it waits.
const POLL: Duration = Duration::from_secs(1);
/// How often a worker whose ranges are done checks that the coordinator's snapshot lives.
const LIVENESS: Duration = Duration::from_secs(10);

/// Which worker this is, and how long it waits for a plan.
#[derive(Clone, Debug)]
pub struct WorkerOptions {
    /// I: the worker copies the ranges r with r % M == I.
    pub index: u16,
    /// How long to wait for the coordinator's plan (also a new one after it restarted).
    pub plan_wait: Duration,
}

/// What a worker needs to copy ranges, read from its request.
struct Worker {
    source: PostgresSource,
    table: TableId,
    store: Arc<dyn Store>,
    key_prefix: String,
    masking: Option<Arc<super::transform::Masking>>,
    subset: Option<super::subset::Subset>,
    request: ExportRequest,
    index: u16,
}

/// Runs worker `options.index` of the split export `request` describes; returns its summary.
pub async fn run(
    request: ExportRequest,
    options: WorkerOptions,
    dsn: String,
) -> anyhow::Result<serde_json::Value> {
    let worker = Worker::new(request, options.index, dsn).await?;
    let mut dead: HashSet<String> = HashSet::new();
    let (mut rows, mut ranges) = (0u64, Vec::new());
    loop {
        let plan = worker.wait_for_plan(&dead, options.plan_wait).await?;
        let copied = match worker.copy_share(&plan).await {
            Ok(copied) => copied,
            // The coordinator ended the run under us (its restart discarded it).
            Err(e) if worker.plan_ended(&plan).await => {
                tracing::warn!(run = %plan.run_id, error = %format!("{e:#}"), "the run was discarded while this worker copied: waiting for a new plan");
                dead.insert(plan.run_id.clone());
                continue;
            }
            Err(e) => return Err(e),
        };
        match copied {
            Some(copied) => {
                for (range, n) in copied {
                    ranges.push(range);
                    rows += n;
                }
            }
            None => {
                tracing::warn!(run = %plan.run_id, "the plan's snapshot is gone (its coordinator ended): waiting for a new plan");
                dead.insert(plan.run_id.clone());
                continue;
            }
        }
        if worker.committed_or_dead(&plan).await? {
            let summary = serde_json::json!({
                "table": worker.table.to_string(),
                "worker": worker.index,
                "run": plan.run_id,
                "epoch": plan.epoch,
                "ranges_copied": ranges,
                "row_count": rows,
            });
            if let Some(path) = &worker.request.summary_file {
                std::fs::write(path, format!("{summary}\n"))
                    .map_err(|e| anyhow!("writing the summary file {}: {e}", path.display()))?;
            }
            return Ok(summary);
        }
        tracing::warn!(run = %plan.run_id, "the run ended without a commit (its coordinator failed or restarted): waiting for a new plan");
        dead.insert(plan.run_id.clone());
    }
}

impl Worker {
    async fn new(request: ExportRequest, index: u16, dsn: String) -> anyhow::Result<Worker> {
        let invalid = |e: anyhow::Error| failure::tag(Reason::InvalidConfig, e);
        let mut tables = super::run::table_ids(&request).map_err(invalid)?;
        if tables.len() != 1 {
            return Err(invalid(anyhow!(
                "a split worker copies ranges of one table"
            )));
        }
        let table = tables.remove(0);
        let masking = super::run::masking(&request)?;
        let subqueries =
            super::run::subquery_tables(&request, std::slice::from_ref(&table), masking.as_deref());
        let subset = super::run::subset(&request, &table, masking.as_deref(), subqueries.as_ref())?;
        let key_prefix = request
            .key_prefix
            .clone()
            .unwrap_or_else(|| format!("{table}/"));
        larch_archive::store::check_key_prefix(&key_prefix)
            .map_err(|e| invalid(anyhow::Error::from(e).context("--key-prefix")))?;
        let mut config = super::run::source_config(&request, dsn, &table, subset.as_ref())?;
        config.row_filter_subqueries = subqueries;
        let store = request.store.open().await?;
        Ok(Worker {
            source: PostgresSource::new(config),
            table,
            store,
            key_prefix,
            masking,
            subset,
            request,
            index,
        })
    }

    /// The newest plan not in `dead`, waiting up to `wait` for one.
    async fn wait_for_plan(&self, dead: &HashSet<String>, wait: Duration) -> anyhow::Result<Plan> {
        let deadline = Instant::now() + wait;
        loop {
            let found = split_run::read_plan(self.store.as_ref(), &self.key_prefix).await?;
            if let Some((plan, _)) = found.filter(|(p, _)| !dead.contains(&p.run_id)) {
                self.check_plan(&plan)?;
                return Ok(plan);
            }
            if Instant::now() >= deadline {
                return Err(anyhow!(
                    "no split plan at {} within {wait:?} (--plan-wait): is the coordinator \
                     (`larch export --split N --split-workers M`) running?",
                    split_run::plan_key(&self.key_prefix)
                ));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    fn check_plan(&self, plan: &Plan) -> anyhow::Result<()> {
        if plan.table != self.table.to_string() {
            failure::bail!(
                Reason::InvalidConfig,
                "the split plan at {} is for table {}, not {}",
                split_run::plan_key(&self.key_prefix),
                plan.table,
                self.table
            );
        }
        if self.index >= plan.workers {
            failure::bail!(
                Reason::InvalidConfig,
                "worker index {} is out of range: the coordinator has {} workers (0..{})",
                self.index,
                plan.workers,
                plan.workers
            );
        }
        Ok(())
    }

    /// Copies the ranges of this worker that have no checkpoint; returns (range, rows) of
    /// each, or `None` when the plan's snapshot is gone.
    async fn copy_share(&self, plan: &Plan) -> anyhow::Result<Option<Vec<(usize, u64)>>> {
        let done = split_run::checkpointed(self.store.as_ref(), &self.key_prefix, plan).await?;
        let todo: Vec<usize> = plan
            .ranges_of(self.index)
            .into_iter()
            .filter(|r| !done.contains(r))
            .collect();
        if todo.is_empty() {
            tracing::info!(run = %plan.run_id, worker = self.index, "every range of this worker is checkpointed");
            return Ok(Some(Vec::new()));
        }
        let Some(imported) = self
            .source
            .import_snapshot(&self.table, &plan.snapshot)
            .await?
        else {
            return Ok(None);
        };
        let shape = compile_epoch(
            &self.source,
            &self.table,
            self.masking.as_deref(),
            self.subset.as_ref(),
        )?;
        let formats = super::run::formats(&self.request);
        let ours = settings_digest(&self.table, &formats, &self.request.key_fields, &shape);
        if ours != plan.settings {
            failure::bail!(
                Reason::InvalidConfig,
                "this worker's settings (table, formats, key fields, transform and its key, \
                 row filter, sample) differ from its coordinator's: give it the same request"
            );
        }
        // The coordinator gives a worker only so long to come (--split-workers-start-timeout).
        split_run::mark_started(self.store.as_ref(), &self.key_prefix, plan, self.index).await?;
        let mut copied = Vec::with_capacity(todo.len());
        for range in todo {
            let rows = self
                .copy_range(
                    &imported,
                    plan,
                    range,
                    (shape.transform.clone(), shape.sampler.clone()),
                )
                .await?;
            tracing::info!(run = %plan.run_id, range, rows, "range checkpointed");
            copied.push((range, rows));
        }
        imported.finish().await?;
        Ok(Some(copied))
    }

    /// Copies range `range` into its part of the plan's uploads and checkpoints it.
    async fn copy_range(
        &self,
        imported: &ImportedSnapshot,
        plan: &Plan,
        range: usize,
        (transform, sampler): (Option<Arc<TableTransform>>, Option<Sampler>),
    ) -> anyhow::Result<u64> {
        let bounds = &plan.ranges[range];
        let predicate = Range::Pages {
            first: bounds.first,
            end: bounds.end,
        }
        .predicate();
        let (src_tx, src_rx) = mpsc::channel::<(TableId, Vec<Row>)>(BATCHES_IN_FLIGHT);
        let (mask_tx, mask_rx) = oneshot::channel();
        let sink = BaselineSink {
            rows: src_tx,
            mask: std::sync::Mutex::new(Some(mask_rx)),
        };
        let (transform_tx, transform_rx) = oneshot::channel();
        let _ = transform_tx.send((transform, sampler));
        let (row_tx, row_rx) = mpsc::channel::<Vec<Row>>(BATCHES_IN_FLIGHT);
        let (verdict_tx, verdict_rx) = oneshot::channel();
        let reason = Arc::new(std::sync::OnceLock::new());
        let copy = async {
            let copied = imported
                .copy_range(&self.source, predicate.as_deref(), &sink)
                .await;
            drop(sink);
            copied.map(|n| n.to_string())
        };
        let progress = Progress::new("split-range", self.table.to_string());
        let forward = forward_rows(src_rx, transform_rx, mask_tx, row_tx, progress);
        let produce = baseline_verdict(copy, forward, verdict_tx, reason.clone());
        let write = split_run::worker::write_range(
            &self.store,
            &self.key_prefix,
            plan,
            (range, self.index),
            row_rx,
            Some(verdict_rx),
        );
        let ((), written) = tokio::join!(produce, write);
        written
            .map(|c| c.rows)
            .map_err(|e| failure::tag_opt(reason.get().copied(), anyhow::Error::from(e)))
    }

    /// Waits until the run of `plan` ends: `true` once the coordinator committed its epoch,
    /// `false` when it ended without a commit (its plan replaced or removed, or its snapshot
    /// gone while the plan stays: the coordinator died).
    async fn committed_or_dead(&self, plan: &Plan) -> anyhow::Result<bool> {
        let mut checked = Instant::now();
        loop {
            let now = split_run::read_plan(self.store.as_ref(), &self.key_prefix).await?;
            if now.is_none_or(|(p, _)| p.run_id != plan.run_id) {
                return self.committed(plan).await;
            }
            if checked.elapsed() >= LIVENESS {
                checked = Instant::now();
                match self
                    .source
                    .import_snapshot(&self.table, &plan.snapshot)
                    .await?
                {
                    Some(alive) => alive.finish().await?,
                    // The coordinator may have just committed and ended its snapshot.
                    None => {
                        let now =
                            split_run::read_plan(self.store.as_ref(), &self.key_prefix).await?;
                        if now.is_some_and(|(p, _)| p.run_id == plan.run_id) {
                            return Ok(false);
                        }
                        return self.committed(plan).await;
                    }
                }
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Whether the plan in the store is no longer `plan` (replaced or removed).
    async fn plan_ended(&self, plan: &Plan) -> bool {
        match split_run::read_plan(self.store.as_ref(), &self.key_prefix).await {
            Ok(now) => now.is_none_or(|(p, _)| p.run_id != plan.run_id),
            Err(_) => false,
        }
    }

    /// Whether the manifest holds the snapshot of `plan`'s epoch.
    async fn committed(&self, plan: &Plan) -> anyhow::Result<bool> {
        let key = manifest_key(&self.key_prefix);
        let Some(got) = self.store.get(&key).await? else {
            return Ok(false);
        };
        let manifest = Manifest::from_slice(&key, &got.bytes)?;
        Ok(manifest.artifacts.iter().any(|a| {
            a.kind == ArtifactKind::Snapshot
                && a.epoch == plan.epoch
                && a.to_position == plan.position
        }))
    }
}
