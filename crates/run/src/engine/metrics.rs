//! Prometheus metrics with laredo's names and labels (spec §9.6), in a per-engine registry so
//! several engines can run in one process (tests).

use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

/// laredo's pipeline state gauge values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PipelineState {
    Initializing = 0,
    Baselining = 1,
    Streaming = 2,
    Paused = 3,
    Error = 4,
    Stopped = 5,
}

impl PipelineState {
    pub fn as_str(self) -> &'static str {
        match self {
            PipelineState::Initializing => "INITIALIZING",
            PipelineState::Baselining => "BASELINING",
            PipelineState::Streaming => "STREAMING",
            PipelineState::Paused => "PAUSED",
            PipelineState::Error => "ERROR",
            PipelineState::Stopped => "STOPPED",
        }
    }
}

#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    pub source_rebaseline_total: IntCounterVec,
    pub source_lag_seconds: GaugeVec,
    pub source_behind_bytes: IntGaugeVec,
    pub pipeline_state: IntGaugeVec,
    pub changes_received_total: IntCounterVec,
    pub changes_applied_total: IntCounterVec,
    pub change_errors_total: IntCounterVec,
    pub change_apply_duration_seconds: HistogramVec,
    pub baseline_duration_seconds: HistogramVec,
    pub baseline_rows_total: IntGaugeVec,
    pub baseline_rows: IntGaugeVec,
    pub baseline_rows_loaded_total: IntCounterVec,
    pub baseline_expected_rows: IntGaugeVec,
    pub source_behind_diffs: IntGaugeVec,
    pub source_data_age_seconds: GaugeVec,
    pub http_requests_total: IntCounterVec,
    pub http_request_duration_seconds: HistogramVec,
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let r = Register(&registry);
        larch_core::telemetry::register_process_and_build_info(&registry, "engine");
        Metrics {
            source_rebaseline_total: r.counter(
                "laredo_source_rebaseline_total",
                "Re-baselines a source asked for (replacement archives).",
                &["source"],
            ),
            source_lag_seconds: r.gauge(
                "laredo_source_lag_seconds",
                "Seconds the oldest diff not yet applied has waited since it was written (0 when caught up).",
                &["source"],
            ),
            source_behind_bytes: r.int_gauge(
                "larch_source_behind_bytes",
                "Bytes of the archive's diffs not yet applied (0 when caught up with the head).",
                &["source"],
            ),
            pipeline_state: r.int_gauge(
                "laredo_pipeline_state",
                "0 INITIALIZING, 1 BASELINING, 2 STREAMING, 3 PAUSED, 4 ERROR, 5 STOPPED.",
                &["pipeline"],
            ),
            changes_received_total: r.counter(
                "laredo_changes_received_total",
                "Change events received.",
                &["pipeline", "action"],
            ),
            changes_applied_total: r.counter(
                "laredo_changes_applied_total",
                "Change events applied.",
                &["pipeline", "action"],
            ),
            change_errors_total: r.counter(
                "laredo_change_errors_total",
                "Change events that failed.",
                &["pipeline"],
            ),
            change_apply_duration_seconds: r.histogram(
                HistogramOpts::new(
                    "laredo_change_apply_duration_seconds",
                    "Time to apply one change.",
                ),
                &["pipeline", "action"],
            ),
            baseline_duration_seconds: r.histogram(
                HistogramOpts::new("laredo_baseline_duration_seconds", "Baseline duration.")
                    .buckets(vec![0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0]),
                &["pipeline"],
            ),
            baseline_rows_total: r.int_gauge(
                "laredo_baseline_rows_total",
                "Deprecated (a gauge, though named _total; laredo's name): larch_engine_baseline_rows.",
                &["pipeline"],
            ),
            baseline_rows: r.int_gauge(
                "larch_engine_baseline_rows",
                "Rows of the last completed baseline.",
                &["pipeline"],
            ),
            baseline_rows_loaded_total: r.counter(
                "laredo_baseline_rows_loaded_total",
                "Baseline rows loaded, over every baseline.",
                &["pipeline"],
            ),
            baseline_expected_rows: r.int_gauge(
                "larch_engine_baseline_expected_rows",
                "Rows of the snapshot the baseline in progress (else the last one) loads: its manifest row_count; -1: unknown.",
                &["pipeline"],
            ),
            source_behind_diffs: r.int_gauge(
                "larch_source_behind_diffs",
                "Diffs between the source's position and the archive's head (0 when caught up).",
                &["source"],
            ),
            source_data_age_seconds: r.gauge(
                "larch_source_data_age_seconds",
                "Seconds since the archive's head was written (manifest updated_at): the age of the data, not a lag.",
                &["source"],
            ),
            http_requests_total: r.counter(
                "larch_engine_http_requests_total",
                "HTTP requests answered, by route template (not the raw path), method and status code.",
                &["route", "method", "code"],
            ),
            http_request_duration_seconds: r.histogram(
                HistogramOpts::new(
                    "larch_engine_http_request_duration_seconds",
                    "Time to answer an HTTP request, by route template and method.",
                )
                .buckets(vec![0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0]),
                &["route", "method"],
            ),
            registry,
        }
    }

    pub fn set_state(&self, pipeline: &str, state: PipelineState) {
        self.pipeline_state
            .with_label_values(&[pipeline])
            .set(state as i64);
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding");
        String::from_utf8(buf).expect("UTF-8 exposition")
    }
}

/// Makes metrics, each registered in the registry (names are fixed: a failure is a bug).
struct Register<'a>(&'a Registry);

impl Register<'_> {
    fn counter(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.registered(IntCounterVec::new(Opts::new(name, help), labels))
    }

    fn int_gauge(&self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        self.registered(IntGaugeVec::new(Opts::new(name, help), labels))
    }

    fn gauge(&self, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
        self.registered(GaugeVec::new(Opts::new(name, help), labels))
    }

    fn histogram(&self, opts: HistogramOpts, labels: &[&str]) -> HistogramVec {
        self.registered(HistogramVec::new(opts, labels))
    }

    fn registered<M>(&self, metric: prometheus::Result<M>) -> M
    where
        M: prometheus::core::Collector + Clone + 'static,
    {
        let metric = metric.expect("valid metric");
        self.0
            .register(Box::new(metric.clone()))
            .expect("metric registered once");
        metric
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
