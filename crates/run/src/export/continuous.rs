//! Continuous export (laredo's `archive export --follow` and `laredo-snapshotter`): a base
//! snapshot, then the source's changes collapsed into diffs every `diff_interval`, a new epoch
//! started when the new-epoch policy says so, acknowledged to PostgreSQL only once the diff holding them is committed.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use chrono::{DateTime, Utc};
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};
use serde::Serialize;
use tokio::sync::{mpsc, watch};

use larch_archive::error::ArchiveError;
use larch_archive::manifest::format_time;
use larch_archive::model::TableId;
use larch_archive::plan::plan_head;
use larch_archive::position::{compare, same};
use larch_archive::source::{SourceError, SourceEvent, SyncSource};
use larch_archive::spill::Spill;
use larch_archive::writer::{ArchiveWriter, FlushOutcome};
use larch_core::locks::MutexExt;
use larch_postgres::{PostgresSource, SchemaChange, schema_change};

/// The operations of [`ExportStatus::progress`].
pub const BASELINE: &str = "baseline";
pub const COMPACTION: &str = "compaction";

/// What `/status` shows.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ExportStatus {
    pub table: String,
    pub state: String,
    pub epoch: i64,
    pub head_position: String,
    pub buffer_depth: usize,
    pub churn_records: u64,
    pub last_snapshot_at: Option<String>,
    pub last_diff_at: Option<String>,
    pub snapshots: u64,
    pub diffs: u64,
    pub last_error: Option<String>,
    /// The replication slot and the WAL it holds on the server (refreshed every 5 s).
    pub slot: Option<super::slot::SlotReport>,
    /// Times the slot was lost (invalidated or dropped) and the export re-baselined.
    pub slot_losses: u64,
    pub last_slot_loss: Option<super::slot::SlotLoss>,
    /// Changes of the transaction being received (they join the buffer at its COMMIT).
    pub open_transaction_changes: u64,
    /// Bytes of buffered changes in memory (bounded by `--buffer-memory`).
    pub buffer_memory_bytes: u64,
    /// Bytes of spilled runs on disk now, and their limit (`--spill-limit`, 0: none).
    pub spill_bytes: u64,
    pub spill_runs: u64,
    pub spill_limit_bytes: u64,
    /// Runs written since start (merges included).
    pub spilled_runs_total: u64,
    /// The snapshot being written (a baseline copied from PostgreSQL or a compaction of the
    /// archive), else the last one: rows and bytes so far, the expected total, rate and ETA.
    pub progress: Option<larch_core::progress::ProgressReport>,
    /// The restorable window: the oldest snapshot to the head, positions and commit times.
    pub restorable: Option<larch_archive::point_in_time::Window>,
}

/// Metrics with laredo-snapshotter's names where it has them.
pub struct ExportMetrics {
    pub registry: Registry,
    epoch: IntGaugeVec,
    buffer_depth: IntGaugeVec,
    churn: IntGaugeVec,
    snapshot_age: prometheus::GaugeVec,
    artifacts: IntCounterVec,
    errors: IntCounterVec,
    commit_lag: HistogramVec,
    slot: super::slot::SlotMetrics,
    buffer_memory: IntGaugeVec,
    spill_bytes: IntGaugeVec,
    spill_runs: IntGaugeVec,
    spill_limit: IntGaugeVec,
    progress_rows: IntGaugeVec,
    progress_bytes: IntGaugeVec,
    progress_expected_rows: IntGaugeVec,
}

impl ExportMetrics {
    fn new() -> ExportMetrics {
        let registry = Registry::new();
        let gauge = |name: &str, help: &str| {
            let g = IntGaugeVec::new(Opts::new(name, help), &["table"]).expect("metric");
            registry.register(Box::new(g.clone())).expect("register");
            g
        };
        let epoch = gauge("snapshotter_epoch", "Current archive epoch.");
        let buffer_depth = gauge(
            "snapshotter_buffer_depth",
            "Collapsed changes waiting for the next diff.",
        );
        let churn = gauge(
            "snapshotter_churn_records",
            "Changes received since the last snapshot.",
        );
        let buffer_memory = gauge(
            "larch_export_buffer_memory_bytes",
            "Bytes of buffered changes held in memory (bounded by --buffer-memory).",
        );
        let spill_bytes = gauge(
            "larch_export_spill_bytes",
            "Bytes of buffered changes spilled to disk now.",
        );
        let spill_runs = gauge("larch_export_spill_runs", "Spilled runs on disk now.");
        let spill_limit = gauge(
            "larch_export_spill_limit_bytes",
            "The spill limit (--spill-limit; 0: none).",
        );
        let progress_gauge = |name: &str, help: &str| {
            let g =
                IntGaugeVec::new(Opts::new(name, help), &["table", "operation"]).expect("metric");
            registry.register(Box::new(g.clone())).expect("register");
            g
        };
        let progress_rows = progress_gauge(
            "larch_export_progress_rows",
            "Rows written by the snapshot in progress (operation baseline or compaction), else by the last one.",
        );
        let progress_bytes = progress_gauge(
            "larch_export_progress_bytes",
            "Bytes (rows as JSON text) written by that snapshot.",
        );
        let progress_expected_rows = progress_gauge(
            "larch_export_progress_expected_rows",
            "Rows expected: the catalog's estimate (pg_class.reltuples) for a baseline, the snapshot's row_count for a compaction; -1: unknown.",
        );
        let snapshot_age = prometheus::GaugeVec::new(
            Opts::new(
                "snapshotter_snapshot_age_seconds",
                "Seconds since the last snapshot.",
            ),
            &["table"],
        )
        .expect("metric");
        registry
            .register(Box::new(snapshot_age.clone()))
            .expect("register");
        let artifacts = IntCounterVec::new(
            Opts::new(
                "larch_export_artifacts_total",
                "Artifacts committed, by kind and reason.",
            ),
            &["table", "kind", "reason"],
        )
        .expect("metric");
        registry
            .register(Box::new(artifacts.clone()))
            .expect("register");
        let errors = IntCounterVec::new(
            Opts::new(
                "larch_export_errors_total",
                "Failed flushes and snapshots, by stage.",
            ),
            &["table", "stage"],
        )
        .expect("metric");
        registry
            .register(Box::new(errors.clone()))
            .expect("register");
        let commit_lag = HistogramVec::new(
            HistogramOpts::new("larch_export_commit_lag_seconds", "From a transaction's commit in PostgreSQL to the archive commit of the diff holding it.")
                .buckets(vec![0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0]),
            &["table"],
        )
        .expect("metric");
        registry
            .register(Box::new(commit_lag.clone()))
            .expect("register");
        larch_core::telemetry::register_process_and_build_info(&registry, "export");
        ExportMetrics {
            slot: super::slot::SlotMetrics::register(&registry),
            registry,
            epoch,
            buffer_depth,
            churn,
            snapshot_age,
            artifacts,
            errors,
            commit_lag,
            buffer_memory,
            spill_bytes,
            spill_runs,
            spill_limit,
            progress_rows,
            progress_bytes,
            progress_expected_rows,
        }
    }

    pub fn render(&self) -> String {
        use prometheus::Encoder;
        let mut out = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding");
        String::from_utf8(out).expect("utf-8")
    }
}

/// State shared with the HTTP listener.
pub struct Shared {
    pub status: Mutex<ExportStatus>,
    pub ready: watch::Sender<bool>,
    pub metrics: ExportMetrics,
    last_snapshot: Mutex<Option<Instant>>,
    /// Counts `/status` reads (taken under the status lock), so a lost slot's report can wait
    /// for a reader.
    status_reads: Arc<watch::Sender<u64>>,
    /// How long a lost slot's report waits for a `/status` read before the re-baseline.
    loss_report_wait: Mutex<Option<Duration>>,
    /// The writer's spill, for live figures.
    spill: OnceLock<Arc<Spill>>,
    /// The snapshot being written, else the last one.
    progress: Mutex<Option<Arc<larch_core::progress::Progress>>>,
}

impl Shared {
    pub fn new(table: &TableId) -> Arc<Shared> {
        let (ready, _) = watch::channel(false);
        Arc::new(Shared {
            status: Mutex::new(ExportStatus {
                table: table.to_string(),
                state: "STARTING".into(),
                ..Default::default()
            }),
            ready,
            metrics: ExportMetrics::new(),
            last_snapshot: Mutex::new(None),
            status_reads: Arc::new(watch::Sender::new(0)),
            loss_report_wait: Mutex::new(None),
            spill: OnceLock::new(),
            progress: Mutex::new(None),
        })
    }

    /// Counters for a new snapshot of `table` (`operation`: [`BASELINE`] or [`COMPACTION`]),
    /// shown by `/status` and `/metrics` from now on.
    pub fn start_progress(
        &self,
        operation: &'static str,
        table: &TableId,
    ) -> Arc<larch_core::progress::Progress> {
        let p = larch_core::progress::Progress::new(operation, table.to_string());
        *self.progress.locked() = Some(p.clone());
        p
    }

    fn progress_report(&self) -> Option<larch_core::progress::ProgressReport> {
        let p = self.progress.locked().clone();
        p.map(|p| p.report())
    }

    /// Names the replication slot in `/status` before the source reports on it.
    pub fn set_slot(&self, slot: &str) {
        self.status.locked().slot = Some(super::slot::SlotReport {
            name: slot.to_string(),
            ..Default::default()
        });
    }

    /// Makes a lost slot's report wait up to `wait` for a `/status` read (the operator's
    /// poll) before the re-baseline.
    pub fn set_loss_report_wait(&self, wait: Duration) {
        *self.loss_report_wait.locked() = Some(wait);
    }

    /// The status, with the spill's figures as of now.
    pub fn status(&self) -> ExportStatus {
        let mut s = self.status.locked().clone();
        self.add_spill_figures(&mut s);
        s
    }

    fn add_spill_figures(&self, s: &mut ExportStatus) {
        s.progress = self.progress_report();
        if let Some(spill) = self.spill.get() {
            let stats = spill.stats();
            s.buffer_memory_bytes = stats.memory_bytes.load(Ordering::Relaxed);
            s.spill_bytes = stats.disk_bytes.load(Ordering::Relaxed);
            s.spill_runs = stats.runs.load(Ordering::Relaxed);
            s.spill_limit_bytes = spill.config().disk_limit;
            s.spilled_runs_total = stats.runs_written.load(Ordering::Relaxed);
        }
    }

    fn refresh_spill_metrics(&self) {
        let s = self.status();
        let m = &self.metrics;
        let t = [s.table.as_str()];
        m.buffer_memory
            .with_label_values(&t)
            .set(s.buffer_memory_bytes as i64);
        m.spill_bytes
            .with_label_values(&t)
            .set(s.spill_bytes as i64);
        m.spill_runs.with_label_values(&t).set(s.spill_runs as i64);
        m.spill_limit
            .with_label_values(&t)
            .set(s.spill_limit_bytes as i64);
        if let Some(p) = &s.progress {
            let l = [s.table.as_str(), p.operation.as_str()];
            m.progress_rows.with_label_values(&l).set(p.rows as i64);
            m.progress_bytes.with_label_values(&l).set(p.bytes as i64);
            m.progress_expected_rows
                .with_label_values(&l)
                .set(p.total_rows.map_or(-1, |n| n as i64));
        }
    }
}

pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route(
            "/health/live",
            get(|| async { axum::Json(serde_json::json!({"status": "ok"})) }),
        )
        .route("/health/ready", get(ready))
        .route("/status", get(status))
        .route("/metrics", get(metrics))
        .with_state(shared)
}

async fn ready(State(s): State<Arc<Shared>>) -> Response {
    if *s.ready.borrow() {
        axum::Json(serde_json::json!({"ready": true})).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(serde_json::json!({"ready": false})),
        )
            .into_response()
    }
}

async fn status(State(s): State<Arc<Shared>>) -> Response {
    let mut body = {
        let status = s.status.locked();
        s.status_reads.send_modify(|n| *n += 1);
        status.clone()
    };
    s.add_spill_figures(&mut body);
    axum::Json(body).into_response()
}

async fn metrics(State(s): State<Arc<Shared>>) -> Response {
    s.refresh_spill_metrics();
    if let Some(t) = *s.last_snapshot.locked() {
        let table = s.status.locked().table.clone();
        s.metrics
            .snapshot_age
            .with_label_values(&[&table])
            .set(t.elapsed().as_secs_f64());
    }
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        s.metrics.render(),
    )
        .into_response()
}

/// Serves the HTTP endpoints on `listen` until `shutdown` flips.
pub async fn serve(
    listen: &str,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("--listen {listen}"))?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let stop = async move { stopped(&mut shutdown).await };
        let _ = larch_core::serve::serve(listener, router(shared), stop).await;
    });
    Ok(addr)
}

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
        let mut s = self.shared.status.locked();
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
        let mut columns = schemas.get(&self.table).cloned().unwrap_or_default();
        // The rules are checked against the table before anything is exported; a transform
        // other than the archive's (a new key, other rules) starts a new epoch, so one epoch
        // never mixes two keys.
        let mut transform_changed = None;
        if let Some(m) = &self.masking {
            let schema = self.source.table_schema(&self.table).ok_or_else(|| {
                anyhow!(
                    "the columns of {} are unknown: its transform cannot be checked",
                    self.table
                )
            })?;
            let t = m.compile(&schema).map_err(|e| {
                larch_core::failure::tag(larch_core::failure::Reason::InvalidConfig, e)
            })?;
            columns = t.columns(&columns);
            if self.writer.manifest().transform.as_ref() != Some(t.record()) {
                transform_changed = Some(match self.writer.manifest().transform.as_ref() {
                    Some(r) if r.key_id != t.record().key_id => "the hash key changed",
                    Some(r) if r.hash != t.record().hash => "the hash algorithm changed",
                    Some(_) => "the transform rules changed",
                    None => "the archive was not written with this transform",
                });
            }
        } else if self
            .writer
            .manifest()
            .transform
            .as_ref()
            .is_some_and(|r| r.masks_anything())
        {
            transform_changed = Some("the archive is masked and this export has no transform");
        }
        if let Some(why) = self.source.take_slot_lost_at_init() {
            self.report_slot_loss(&why).await;
        }
        let acked = self.source.last_acked_position().await?;
        let manifest = self.writer.manifest();
        let chain_ok =
            manifest.epoch > 0 && same(&plan_head(manifest).head_position, &manifest.head_position);
        // A DDL while the export was stopped: the archived rows have the old columns.
        let ddl = match self.source.table_schema(&self.table) {
            Some(now) if !manifest.columns.is_empty() => match schema_change::classify(
                &manifest.columns,
                self.writer.key_fields(),
                &match self.transform() {
                    Some(t) => t.columns(&now.columns),
                    None => now.columns.clone(),
                },
                &now.key_fields,
            ) {
                SchemaChange::Shape(why) => Some(why),
                SchemaChange::None | SchemaChange::Metadata => None,
            },
            _ => None,
        };
        // Resume only when the slot survived, the archive's chain reaches its head and the
        // table kept its shape; the stream may then re-deliver changes the archive already
        // holds (committed, not yet acknowledged): they are skipped by position.
        let (mut from, mut skip_through) = match (acked, &ddl) {
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
        };
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
                tracing::info!("stopping: final flush");
                while let Ok(ev) = rx.try_recv() {
                    self.accept(
                        ev,
                        &mut last_position,
                        &mut commit_times,
                        skip_through.as_deref(),
                    )?;
                }
                // A transaction without its COMMIT is not archived: the slot delivers it again.
                self.writer.discard_pending();
                let result = self.final_flush(&last_position, &mut commit_times).await;
                stream.abort();
                self.source.close().await;
                self.publish("STOPPED");
                return result;
            }
            // The stream ended by itself.
            match stream_result.unwrap_or(Ok(())) {
                Err(SourceError::ReBaselineRequired(why)) => {
                    tracing::warn!(reason = %why, "the source asks for a re-baseline: writing a new snapshot so no change in the gap is lost");
                    self.report_slot_loss(&why).await;
                    self.writer.discard_pending();
                    self.flush(&last_position, &mut commit_times).await?;
                    from = self.baseline("baseline").await?;
                    last_position.clear();
                    skip_through = None;
                    self.publish("STREAMING");
                }
                Err(SourceError::SchemaChanged(why)) => {
                    from = self
                        .schema_epoch(&why, &mut last_position, &mut commit_times)
                        .await?;
                    skip_through = None;
                    self.publish("STREAMING");
                }
                Err(e) => return Err(anyhow!(e).context("replication stream failed")),
                Ok(()) => return Err(anyhow!("the replication stream ended unexpectedly")),
            }
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
                let now = Utc::now();
                let lag_of = self.shared.metrics.commit_lag.with_label_values(&[&table]);
                for (at, changes) in std::mem::take(&mut commit_times.closed) {
                    let lag = (now.timestamp_millis() - at * 10).max(0) as f64 / 1e3;
                    for _ in 0..changes {
                        lag_of.observe(lag);
                    }
                }
                self.shared
                    .metrics
                    .artifacts
                    .with_label_values(&[&table, "diff", "interval"])
                    .inc();
                {
                    let mut s = self.shared.status.locked();
                    s.diffs += 1;
                    s.last_diff_at = Some(format_time(&now.fixed_offset()));
                    s.last_error = None;
                }
                if let Err(e) = self.source.ack(&artifact.to_position).await {
                    tracing::warn!(error = %e, "could not acknowledge the committed diff");
                }
                new_epoch
            }
        };
        if let Some(trigger) = new_epoch {
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
                        .with_label_values(&[&table, "snapshot"])
                        .inc();
                    tracing::warn!(error = %e, "compaction failed; retrying at a later interval");
                }
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
