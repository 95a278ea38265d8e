//! The replication slot as exporters report it: retained WAL in `/status` and metrics, and a
//! lost slot (invalidated by `max_slot_wal_keep_size`, or dropped) reported before the
//! re-baseline that replaces the epoch.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use prometheus::{IntGaugeVec, Opts, Registry};
use serde::Serialize;

use larch_archive::manifest::format_time;
use larch_postgres::SlotUsage;

/// One slot in `/status` (exporter and `larch export slot-status`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SlotReport {
    pub name: String,
    pub exists: bool,
    /// A session streams from it.
    pub active: bool,
    pub wal_status: Option<String>,
    /// `pg_current_wal_lsn() - restart_lsn`: WAL the server keeps for the slot.
    pub retained_wal_bytes: Option<u64>,
    /// `pg_current_wal_lsn() - confirmed_flush_lsn`: what the export has not confirmed.
    pub lag_bytes: Option<u64>,
    /// Bytes before `max_slot_wal_keep_size` invalidates it (`None`: unlimited).
    pub safe_wal_size: Option<i64>,
    pub restart_lsn: Option<String>,
    pub confirmed_flush_lsn: Option<String>,
}

impl SlotReport {
    pub fn new(name: &str, usage: Option<&SlotUsage>) -> SlotReport {
        match usage {
            None => SlotReport {
                name: name.to_string(),
                ..Default::default()
            },
            Some(u) => SlotReport {
                name: name.to_string(),
                exists: true,
                active: u.active_pid.is_some(),
                wal_status: u.wal_status.clone(),
                retained_wal_bytes: u.retained_bytes,
                lag_bytes: u.lag_bytes,
                safe_wal_size: u.safe_wal_size,
                restart_lsn: u.restart_lsn.clone(),
                confirmed_flush_lsn: u.confirmed_flush_lsn.clone(),
            },
        }
    }
}

/// A lost slot, as `/status` reports it (`last_slot_loss`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SlotLoss {
    pub at: String,
    pub reason: String,
}

/// `laredo_source_lag_bytes{source}` (laredo's name; the source is the slot) and
/// `larch_export_slot_retained_bytes{slot}`.
pub struct SlotMetrics {
    lag: IntGaugeVec,
    retained: IntGaugeVec,
}

impl SlotMetrics {
    pub fn register(registry: &Registry) -> SlotMetrics {
        let gauge = |name: &str, help: &str, label: &str| {
            let g = IntGaugeVec::new(Opts::new(name, help), &[label]).expect("metric");
            registry.register(Box::new(g.clone())).expect("register");
            g
        };
        SlotMetrics {
            lag: gauge(
                "laredo_source_lag_bytes",
                "WAL bytes the replication slot's consumer has not confirmed (pg_current_wal_lsn - confirmed_flush_lsn).",
                "source",
            ),
            retained: gauge(
                "larch_export_slot_retained_bytes",
                "WAL bytes PostgreSQL keeps for the replication slot (pg_current_wal_lsn - restart_lsn).",
                "slot",
            ),
        }
    }

    pub fn set(&self, report: &SlotReport) {
        let v = |b: Option<u64>| b.map(|b| b.min(i64::MAX as u64) as i64).unwrap_or(0);
        self.lag
            .with_label_values(&[&report.name])
            .set(v(report.lag_bytes));
        self.retained
            .with_label_values(&[&report.name])
            .set(v(report.retained_wal_bytes));
    }
}

/// Waits until `status_reads` moves past `seen` (someone read `/status` after the loss was
/// recorded) or `wait` has passed.
pub async fn wait_for_status_read(
    reads: Arc<tokio::sync::watch::Sender<u64>>,
    seen: u64,
    wait: Duration,
) -> bool {
    let mut rx = reads.subscribe();
    tokio::time::timeout(wait, rx.wait_for(|n| *n > seen))
        .await
        .is_ok_and(|r| r.is_ok())
}

/// Now, in the archive's time format.
pub fn now_string() -> String {
    format_time(&Utc::now().fixed_offset())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_slot_reports_nothing_held() {
        let r = SlotReport::new("s", None);
        assert!(!r.exists && r.retained_wal_bytes.is_none());
        let u = SlotUsage {
            slot: "s".into(),
            active_pid: Some(7),
            wal_status: Some("extended".into()),
            retained_bytes: Some(4096),
            lag_bytes: Some(100),
            ..Default::default()
        };
        let r = SlotReport::new("s", Some(&u));
        assert!(r.exists && r.active);
        assert_eq!((r.retained_wal_bytes, r.lag_bytes), (Some(4096), Some(100)));
        let registry = Registry::new();
        let m = SlotMetrics::register(&registry);
        m.set(&r);
        let mut text = Vec::new();
        prometheus::Encoder::encode(
            &prometheus::TextEncoder::new(),
            &registry.gather(),
            &mut text,
        )
        .unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(
            text.contains("laredo_source_lag_bytes{source=\"s\"} 100"),
            "{text}"
        );
        assert!(
            text.contains("larch_export_slot_retained_bytes{slot=\"s\"} 4096"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn the_loss_report_waits_for_a_status_read() {
        let reads = Arc::new(tokio::sync::watch::Sender::new(3u64));
        let r = reads.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            r.send_modify(|n| *n += 1);
        });
        assert!(wait_for_status_read(reads.clone(), 3, Duration::from_secs(5)).await);
        assert!(!wait_for_status_read(reads, 4, Duration::from_millis(50)).await);
    }
}
