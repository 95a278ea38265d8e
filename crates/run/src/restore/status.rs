//! The restore's progress and its HTTP side, as the export's (`/status`, the health probes,
//! `/metrics`): each table's rows and bytes copied against its snapshot's `row_count`, and the
//! whole restore's, which the operator reads into ArchiveRestore `status.progress`.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};
use serde::Serialize;
use tokio::sync::watch;

use larch_core::locks::MutexExt;
use larch_core::progress::{Progress, ProgressReport};

/// The operation a restore's progress names (`restore of public.t`).
pub const RESTORE: &str = "restore";

/// What `/status` shows.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RestoreStatus {
    /// `PLANNING` (reading the manifests), `RESTORING`, `DONE` or `FAILED`.
    pub state: String,
    /// The whole restore: every table's rows against the sum of their snapshots' row counts.
    pub progress: Option<ProgressReport>,
    /// Each table, in the order they restore (the ones not started yet at 0 rows).
    pub tables: Vec<ProgressReport>,
}

/// The restore's counters, shared by the loading loop, the listener and the log.
pub struct RestoreProgress {
    state: Mutex<&'static str>,
    overall: Mutex<Option<Arc<Progress>>>,
    tables: Mutex<Vec<Arc<Progress>>>,
    metrics: RestoreMetrics,
}

struct RestoreMetrics {
    registry: Registry,
    rows: IntCounterVec,
    bytes: IntCounterVec,
    expected: IntGaugeVec,
}

impl RestoreMetrics {
    fn new() -> RestoreMetrics {
        let registry = Registry::new();
        let rows = IntCounterVec::new(
            Opts::new(
                "larch_restore_rows_total",
                "Rows copied into the target, by table.",
            ),
            &["table"],
        )
        .expect("metric");
        let bytes = IntCounterVec::new(
            Opts::new(
                "larch_restore_bytes_total",
                "Bytes of COPY text sent to the target, by table.",
            ),
            &["table"],
        )
        .expect("metric");
        let expected = IntGaugeVec::new(
            Opts::new(
                "larch_restore_expected_rows",
                "Rows expected: the row_count of the snapshot a table restores from; -1: unknown.",
            ),
            &["table"],
        )
        .expect("metric");
        for m in [&rows, &bytes] {
            registry.register(Box::new(m.clone())).expect("register");
        }
        registry
            .register(Box::new(expected.clone()))
            .expect("register");
        larch_core::telemetry::register_process_and_build_info(&registry, "restore");
        RestoreMetrics {
            registry,
            rows,
            bytes,
            expected,
        }
    }
}

impl RestoreProgress {
    pub fn new() -> Arc<RestoreProgress> {
        Arc::new(RestoreProgress {
            state: Mutex::new("PLANNING"),
            overall: Mutex::new(None),
            tables: Mutex::new(Vec::new()),
            metrics: RestoreMetrics::new(),
        })
    }

    /// The tables planned, each with the rows expected: counters for each and for the whole.
    pub fn plan(&self, tables: &[(String, Option<u64>)]) -> Vec<Arc<Progress>> {
        let counters: Vec<Arc<Progress>> = tables
            .iter()
            .map(|(table, total)| {
                let p = Progress::new(RESTORE, table.clone());
                p.set_total(*total);
                p
            })
            .collect();
        let subject = match tables {
            [(one, _)] => one.clone(),
            _ => format!("{} tables", tables.len()),
        };
        let overall = Progress::new(RESTORE, subject);
        overall.set_total(tables.iter().map(|(_, t)| *t).sum());
        *self.overall.locked() = Some(overall);
        *self.tables.locked() = counters.clone();
        *self.state.locked() = "RESTORING";
        counters
    }

    /// The whole restore's counter (bumped with each table's); `None` before [`Self::plan`].
    pub fn overall(&self) -> Option<Arc<Progress>> {
        self.overall.locked().clone()
    }

    /// The restore ended: the figures stop moving.
    pub fn finish(&self, succeeded: bool) {
        *self.state.locked() = if succeeded { "DONE" } else { "FAILED" };
        if let Some(p) = self.overall() {
            p.finish();
        }
        for p in self.tables.locked().iter() {
            p.finish();
        }
    }

    pub fn status(&self) -> RestoreStatus {
        RestoreStatus {
            state: self.state.locked().to_string(),
            progress: self.overall().map(|p| p.report()),
            tables: self.tables.locked().iter().map(|p| p.report()).collect(),
        }
    }

    /// The counters caught up with the tables' figures (they only grow), then the text format.
    fn render_metrics(&self) -> String {
        use prometheus::Encoder;
        let m = &self.metrics;
        for r in self.status().tables {
            let l = [r.subject.as_str()];
            let rows = m.rows.with_label_values(&l);
            rows.inc_by(r.rows.saturating_sub(rows.get()));
            let bytes = m.bytes.with_label_values(&l);
            bytes.inc_by(r.bytes.saturating_sub(bytes.get()));
            m.expected
                .with_label_values(&l)
                .set(r.total_rows.map_or(-1, |n| n as i64));
        }
        let mut out = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&m.registry.gather(), &mut out)
            .expect("text encoding");
        String::from_utf8(out).expect("utf-8")
    }
}

fn router(progress: Arc<RestoreProgress>) -> Router {
    let ok = || async { axum::Json(serde_json::json!({"status": "ok"})) };
    Router::new()
        .route("/health/live", get(ok))
        .route("/health/ready", get(ok))
        .route("/status", get(status))
        .route("/metrics", get(metrics))
        .with_state(progress)
}

async fn status(State(p): State<Arc<RestoreProgress>>) -> Response {
    axum::Json(p.status()).into_response()
}

async fn metrics(State(p): State<Arc<RestoreProgress>>) -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        p.render_metrics(),
    )
        .into_response()
}

/// Serves `/status`, `/metrics` and the health probes on `listen` until `shutdown` flips.
pub async fn serve(
    listen: &str,
    progress: Arc<RestoreProgress>,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<SocketAddr> {
    larch_core::serve::spawn_until(listen, router(progress), shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_whole_restore_sums_its_tables_and_the_metrics_count_each() {
        let p = RestoreProgress::new();
        assert_eq!(p.status().state, "PLANNING");
        assert!(p.status().progress.is_none());
        let tables = p.plan(&[
            ("public.a".into(), Some(100)),
            ("public.b".into(), Some(50)),
        ]);
        let overall = p.overall().unwrap();
        tables[0].add(100, 4_000);
        overall.add(100, 4_000);
        tables[1].add(10, 300);
        overall.add(10, 300);
        let s = p.status();
        assert_eq!(s.state, "RESTORING");
        let whole = s.progress.unwrap();
        assert_eq!((whole.subject.as_str(), whole.rows), ("2 tables", 110));
        assert_eq!(whole.total_rows, Some(150));
        assert_eq!(s.tables[1].rows, 10);
        let text = p.render_metrics();
        assert!(
            text.contains(r#"larch_restore_rows_total{table="public.a"} 100"#),
            "{text}"
        );
        assert!(text.contains(r#"larch_restore_bytes_total{table="public.b"} 300"#));
        assert!(text.contains(r#"larch_restore_expected_rows{table="public.b"} 50"#));
        p.finish(true);
        let done = p.status();
        assert_eq!(done.state, "DONE");
        assert!(done.progress.unwrap().done);
    }
}
