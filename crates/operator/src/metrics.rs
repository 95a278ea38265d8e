//! The operator's own metrics: reconciles, errors and durations per controller, plus per-object
//! freshness gauges the chart's PrometheusRule alerts on.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use larch_core::locks::MutexExt;

use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry, TextEncoder,
};

pub struct Metrics {
    pub registry: Registry,
    pub reconciles: IntCounterVec,
    pub errors: IntCounterVec,
    pub duration: HistogramVec,
    /// Write requests sent to the API server, by controller, kind and verb.
    pub api_writes: IntCounterVec,
    /// Applies skipped because the child already carried the desired hash.
    pub applies_unchanged: IntCounterVec,
    /// Unix time of each export table's last successful export.
    pub export_last_success: GaugeVec,
    /// 1 while an export's last run (or last scheduled run) failed.
    pub export_failing: GaugeVec,
    /// Replay lag of a source (highest across engines), seconds.
    pub source_lag: GaugeVec,
    /// Re-baselines seen in the last hour per source.
    pub source_rebaselines_last_hour: GaugeVec,
    /// 1 while a source is Degraded.
    pub source_degraded: GaugeVec,
    /// WAL bytes each export's replication slot holds on the source (restart_lsn based).
    pub export_retained_wal: GaugeVec,
    /// Tables with a freshness gauge, per export, so a deleted export's gauges can be removed.
    export_tables: Mutex<BTreeMap<(String, String), BTreeSet<String>>>,
    /// Slots with a retained-WAL gauge, per export.
    export_slots: Mutex<BTreeMap<(String, String), BTreeSet<String>>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let registry = Registry::new();
        larch_core::telemetry::register_process_and_build_info(&registry, "operator");
        let reconciles = counter(
            "larch_operator_reconciles_total",
            "Reconciles started.",
            &["controller"],
        );
        let errors = counter(
            "larch_operator_reconcile_errors_total",
            "Reconciles that failed.",
            &["controller", "error"],
        );
        let duration = reconcile_duration();
        let api_writes = counter(
            "larch_operator_api_writes_total",
            "Write requests the operator sent to the API server (apply, apply-status, delete, Event create).",
            &["controller", "kind", "verb"],
        );
        let applies_unchanged = counter(
            "larch_operator_applies_unchanged_total",
            "Applies not sent: the child already carried the hash of the desired object.",
            &["controller", "kind"],
        );
        let export_last_success = gauge(
            "larch_archive_export_last_success_timestamp_seconds",
            "Unix time of the last successful export of a table.",
            &["namespace", "name", "table"],
        );
        let export_failing = gauge(
            "larch_archive_export_failing",
            "1 while the last export run failed.",
            &["namespace", "name"],
        );
        let source_lag = gauge(
            "larch_archive_source_lag_seconds",
            "Replay lag of an ArchiveSource.",
            &["namespace", "name"],
        );
        let source_rebaselines_last_hour = gauge(
            "larch_archive_source_rebaselines_last_hour",
            "Re-baselines observed in the last hour.",
            &["namespace", "name"],
        );
        let source_degraded = gauge(
            "larch_archive_source_degraded",
            "1 while an ArchiveSource is Degraded.",
            &["namespace", "name"],
        );
        let export_retained_wal = gauge(
            "larch_archive_export_retained_wal_bytes",
            "WAL bytes the source keeps for an export's replication slot (pg_current_wal_lsn - restart_lsn), also while suspended.",
            &["namespace", "name", "slot"],
        );
        let metrics = Self {
            registry,
            reconciles,
            errors,
            duration,
            api_writes,
            applies_unchanged,
            export_last_success,
            export_failing,
            source_lag,
            source_rebaselines_last_hour,
            source_degraded,
            export_retained_wal,
            export_tables: Mutex::default(),
            export_slots: Mutex::default(),
        };
        metrics.zero_and_register();
        metrics
    }
}

impl Metrics {
    /// Every series starts at zero and every metric is in the registry.
    fn zero_and_register(&self) {
        // Zero from the start, so dashboards and rate() see every controller before its first
        // reconcile or error (the error labels of `reconcile::error::Error::label`).
        for controller in ["export", "source", "source-set", "restore"] {
            self.reconciles.with_label_values(&[controller]);
            for error in crate::reconcile::error::Error::LABELS {
                self.errors.with_label_values(&[controller, error]);
            }
        }
        for c in [
            Box::new(self.reconciles.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(self.export_retained_wal.clone()),
            Box::new(self.errors.clone()),
            Box::new(self.duration.clone()),
            Box::new(self.api_writes.clone()),
            Box::new(self.applies_unchanged.clone()),
            Box::new(self.export_last_success.clone()),
            Box::new(self.export_failing.clone()),
            Box::new(self.source_lag.clone()),
            Box::new(self.source_rebaselines_last_hour.clone()),
            Box::new(self.source_degraded.clone()),
        ] {
            self.registry.register(c).unwrap();
        }
    }
}

fn reconcile_duration() -> HistogramVec {
    let opts = HistogramOpts::new(
        "larch_operator_reconcile_duration_seconds",
        "Duration of reconciles.",
    )
    .buckets(vec![0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]);
    HistogramVec::new(opts, &["controller"]).unwrap()
}

fn counter(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), labels).unwrap()
}

fn gauge(name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    GaugeVec::new(Opts::new(name, help), labels).unwrap()
}

impl Metrics {
    /// Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = vec![];
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding cannot fail");
        String::from_utf8(buf).expect("prometheus text is UTF-8")
    }

    /// Sets the freshness gauge of one exported table.
    pub fn set_export_success(&self, namespace: &str, name: &str, table: &str, unix: f64) {
        self.export_last_success
            .with_label_values(&[namespace, name, table])
            .set(unix);
        self.export_tables
            .locked()
            .entry((namespace.into(), name.into()))
            .or_default()
            .insert(table.into());
    }

    /// Sets the retained-WAL gauges of an export's slots; slots no longer reported go.
    pub fn set_retained_wal(
        &self,
        namespace: &str,
        name: &str,
        slots: impl Iterator<Item = (String, i64)>,
    ) {
        let mut known = self.export_slots.locked();
        let entry = known.entry((namespace.into(), name.into())).or_default();
        let mut now = BTreeSet::new();
        for (slot, bytes) in slots {
            self.export_retained_wal
                .with_label_values(&[namespace, name, &slot])
                .set(bytes as f64);
            now.insert(slot);
        }
        for gone in entry.difference(&now) {
            let _ = self
                .export_retained_wal
                .remove_label_values(&[namespace, name, gone]);
        }
        *entry = now;
    }

    /// Objects that have per-object gauges: `(namespace, name)`.
    pub fn tracked(&self) -> Vec<(String, String)> {
        let mut out: BTreeSet<(String, String)> =
            self.export_tables.locked().keys().cloned().collect();
        out.extend(self.export_slots.locked().keys().cloned());
        for vec in [
            &self.export_failing,
            &self.source_lag,
            &self.source_degraded,
        ] {
            for mf in prometheus::core::Collector::collect(vec) {
                for m in mf.get_metric() {
                    let get = |n: &str| {
                        m.get_label()
                            .iter()
                            .find(|l| l.name() == n)
                            .map(|l| l.value().to_string())
                    };
                    if let (Some(ns), Some(name)) = (get("namespace"), get("name")) {
                        out.insert((ns, name));
                    }
                }
            }
        }
        out.into_iter().collect()
    }

    /// Forgets the gauges of a deleted object (so no stale-archive alert fires for it).
    pub fn forget(&self, namespace: &str, name: &str) {
        if let Some(tables) = self
            .export_tables
            .locked()
            .remove(&(namespace.to_string(), name.to_string()))
        {
            for t in tables {
                let _ = self
                    .export_last_success
                    .remove_label_values(&[namespace, name, &t]);
            }
        }
        if let Some(slots) = self
            .export_slots
            .locked()
            .remove(&(namespace.to_string(), name.to_string()))
        {
            for s in slots {
                let _ = self
                    .export_retained_wal
                    .remove_label_values(&[namespace, name, &s]);
            }
        }
        let labels = [namespace, name];
        let _ = self.export_failing.remove_label_values(&labels);
        let _ = self.source_lag.remove_label_values(&labels);
        let _ = self
            .source_rebaselines_last_hour
            .remove_label_values(&labels);
        let _ = self.source_degraded.remove_label_values(&labels);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_reconcile_metrics() {
        let m = Metrics::default();
        m.reconciles.with_label_values(&["export"]).inc();
        m.errors.with_label_values(&["source", "Apply"]).inc();
        m.duration.with_label_values(&["export"]).observe(0.2);
        m.api_writes
            .with_label_values(&["source", "StatefulSet", "apply"])
            .inc();
        m.applies_unchanged
            .with_label_values(&["source", "Service"])
            .inc();
        m.source_degraded.with_label_values(&["ns", "a"]).set(1.0);
        let text = m.render();
        assert!(
            text.contains("larch_operator_reconciles_total{controller=\"export\"} 1"),
            "{text}"
        );
        assert!(text.contains(
            "larch_operator_reconcile_errors_total{controller=\"source\",error=\"Apply\"} 1"
        ));
        assert!(
            text.contains(
                "larch_operator_reconcile_duration_seconds_count{controller=\"export\"} 1"
            )
        );
        assert!(text.contains("larch_archive_source_degraded{name=\"a\",namespace=\"ns\"} 1"));
        assert!(text.contains(
            "larch_operator_api_writes_total{controller=\"source\",kind=\"StatefulSet\",verb=\"apply\"} 1"
        ));
        assert!(text.contains(
            "larch_operator_applies_unchanged_total{controller=\"source\",kind=\"Service\"} 1"
        ));
        m.set_export_success("ns", "e", "public.t", 1.8e9);
        m.set_retained_wal("ns", "e", [("larch_s".to_string(), 4096)].into_iter());
        assert!(
            m.render().contains(
                "larch_archive_export_retained_wal_bytes{name=\"e\",namespace=\"ns\",slot=\"larch_s\"} 4096"
            ),
            "{}",
            m.render()
        );
        assert_eq!(
            m.tracked(),
            [
                ("ns".to_string(), "a".to_string()),
                ("ns".into(), "e".into())
            ]
        );
        m.forget("ns", "a");
        m.forget("ns", "e");
        let text = m.render();
        assert!(!text.contains("larch_archive_source_degraded{"), "{text}");
        assert!(
            !text.contains("larch_archive_export_last_success_timestamp_seconds{"),
            "{text}"
        );
        assert!(
            !text.contains("larch_archive_export_retained_wal_bytes{"),
            "{text}"
        );
        assert!(m.tracked().is_empty());
    }
}
