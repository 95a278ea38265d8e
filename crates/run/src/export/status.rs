//! The export's HTTP side, shared by the one-shot and the continuous export: `/status`, the
//! health probes and `/metrics`, and the state ([`Shared`]) the export updates for them.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};
use serde::Serialize;
use tokio::sync::watch;

use larch_archive::model::TableId;
use larch_archive::spill::Spill;
use larch_core::locks::MutexExt;

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
    /// A masked export: the columns its rules do not name, each with the rule it goes through
    /// (`undeclared`) and the one suggested (names and rules only, never values).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unreviewed_columns: Vec<crate::review::UnreviewedColumn>,
    /// A masked export: which constraints its transform can break, as the preflight at start
    /// found (names only), for the operator's `Validated` condition.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preflight: Option<larch_contract::preflight::PreflightSummary>,
}

/// Metrics with laredo-snapshotter's names where it has them.
pub struct ExportMetrics {
    pub registry: Registry,
    pub(super) epoch: IntGaugeVec,
    pub(super) buffer_depth: IntGaugeVec,
    pub(super) churn: IntGaugeVec,
    pub(super) snapshot_age: prometheus::GaugeVec,
    pub(super) artifacts: IntCounterVec,
    pub(super) errors: IntCounterVec,
    pub(super) commit_lag: HistogramVec,
    pub(super) slot: super::slot::SlotMetrics,
    pub(super) buffer_memory: IntGaugeVec,
    pub(super) spill_bytes: IntGaugeVec,
    pub(super) spill_runs: IntGaugeVec,
    pub(super) spill_limit: IntGaugeVec,
    pub(super) progress_rows: IntGaugeVec,
    pub(super) progress_bytes: IntGaugeVec,
    pub(super) progress_expected_rows: IntGaugeVec,
}

impl ExportMetrics {
    fn new() -> ExportMetrics {
        let registry = Registry::new();
        let gauge = |name: &str, help: &str| int_gauges(&registry, name, help, &["table"]);
        let progress_gauge =
            |name: &str, help: &str| int_gauges(&registry, name, help, &["table", "operation"]);
        let counters = |name: &str, help: &str, labels: &[&str]| {
            registered(&registry, IntCounterVec::new(Opts::new(name, help), labels))
        };
        let metrics = ExportMetrics {
            epoch: gauge("snapshotter_epoch", "Current archive epoch."),
            buffer_depth: gauge(
                "snapshotter_buffer_depth",
                "Collapsed changes waiting for the next diff.",
            ),
            churn: gauge(
                "snapshotter_churn_records",
                "Changes received since the last snapshot.",
            ),
            buffer_memory: gauge(
                "larch_export_buffer_memory_bytes",
                "Bytes of buffered changes held in memory (bounded by --buffer-memory).",
            ),
            spill_bytes: gauge(
                "larch_export_spill_bytes",
                "Bytes of buffered changes spilled to disk now.",
            ),
            spill_runs: gauge("larch_export_spill_runs", "Spilled runs on disk now."),
            spill_limit: gauge(
                "larch_export_spill_limit_bytes",
                "The spill limit (--spill-limit; 0: none).",
            ),
            progress_rows: progress_gauge(
                "larch_export_progress_rows",
                "Rows written by the snapshot in progress (operation baseline or compaction), else by the last one.",
            ),
            progress_bytes: progress_gauge(
                "larch_export_progress_bytes",
                "Bytes (rows as JSON text) written by that snapshot.",
            ),
            progress_expected_rows: progress_gauge(
                "larch_export_progress_expected_rows",
                "Rows expected: the catalog's estimate (pg_class.reltuples) for a baseline, the snapshot's row_count for a compaction; -1: unknown.",
            ),
            snapshot_age: registered(
                &registry,
                prometheus::GaugeVec::new(
                    Opts::new(
                        "snapshotter_snapshot_age_seconds",
                        "Seconds since the last snapshot.",
                    ),
                    &["table"],
                ),
            ),
            artifacts: counters(
                "larch_export_artifacts_total",
                "Artifacts committed, by kind and reason.",
                &["table", "kind", "reason"],
            ),
            errors: counters(
                "larch_export_errors_total",
                "Failed flushes and snapshots, by stage.",
                &["table", "stage"],
            ),
            commit_lag: registered(
                &registry,
                HistogramVec::new(
                    HistogramOpts::new("larch_export_commit_lag_seconds", "From a transaction's commit in PostgreSQL to the archive commit of the diff holding it.")
                        .buckets(vec![0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0]),
                    &["table"],
                ),
            ),
            slot: super::slot::SlotMetrics::register(&registry),
            registry,
        };
        larch_core::telemetry::register_process_and_build_info(&metrics.registry, "export");
        metrics
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

/// A gauge family labelled by `labels`, registered in `registry`.
fn int_gauges(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    registered(registry, IntGaugeVec::new(Opts::new(name, help), labels))
}

/// `metric`, registered in `registry` (names are fixed: a failure is a bug).
fn registered<M>(registry: &Registry, metric: prometheus::Result<M>) -> M
where
    M: prometheus::core::Collector + Clone + 'static,
{
    let metric = metric.expect("metric");
    registry
        .register(Box::new(metric.clone()))
        .expect("register");
    metric
}

/// State shared with the HTTP listener.
pub struct Shared {
    pub status: Mutex<ExportStatus>,
    pub ready: watch::Sender<bool>,
    pub metrics: ExportMetrics,
    pub(super) last_snapshot: Mutex<Option<Instant>>,
    /// Counts `/status` reads (taken under the status lock), so a lost slot's report can wait
    /// for a reader.
    pub(super) status_reads: Arc<watch::Sender<u64>>,
    /// How long a lost slot's report waits for a `/status` read before the re-baseline.
    pub(super) loss_report_wait: Mutex<Option<Duration>>,
    /// The writer's spill, for live figures.
    pub(super) spill: OnceLock<Arc<Spill>>,
    /// The snapshot being written, else the last one.
    pub(super) progress: Mutex<Option<Arc<larch_core::progress::Progress>>>,
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
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<SocketAddr> {
    larch_core::serve::spawn_until(listen, router(shared), shutdown).await
}
