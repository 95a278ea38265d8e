//! `follow`: a continuous export of one table until SIGTERM/SIGINT, holding its Lease when it
//! has one (W9).

use std::sync::Arc;
use std::time::Duration;

use anyhow::anyhow;
use larch_archive::model::TableId;
use larch_archive::policy::Policy;
use larch_archive::store::Store;
use larch_archive::writer::{ArchiveWriter, WriterConfig};
use larch_contract::export_request::ExportRequest;
use larch_core::failure::{self, Reason};
use larch_core::locks::MutexExt;
use larch_postgres::{PostgresConfig, PostgresSource, SlotMode};

use super::{
    DEFAULT_FOLLOW_LISTEN, duration, fraction, lease_elector, lease_lost, optional_duration,
    writer_config,
};
use crate::export::continuous::ContinuousExport;
use crate::export::lease::LeaderElector;
use crate::export::status::{Shared, serve};
use crate::export::transform::Masking;

/// The writer of a continuous export: [`writer_config`] with the new-epoch policy and the
/// spill's bounds.
pub(super) fn follow_writer(
    request: &ExportRequest,
    table: &TableId,
    key_prefix: &str,
) -> anyhow::Result<WriterConfig> {
    let policy = Policy {
        diff_interval: diff_interval(request)?,
        min_interval: optional_duration(request.min_interval.as_deref(), "--min-interval")?
            .unwrap_or_default(),
        max_interval: optional_duration(request.max_interval.as_deref(), "--max-interval")?
            .unwrap_or_default(),
        max_diff_bytes: request.max_diff_bytes.unwrap_or(0),
        max_diff_fraction: fraction(request.max_diff_fraction.as_deref(), "--max-diff-fraction")?,
        max_churn_records: request.max_churn_records.unwrap_or(0),
        max_churn_fraction: fraction(
            request.max_churn_fraction.as_deref(),
            "--max-churn-fraction",
        )?,
    };
    policy
        .validate()
        .map_err(|e| failure::tag(Reason::InvalidConfig, anyhow!("policy: {e}")))?;
    let mut wc = writer_config(request, table, key_prefix)?;
    wc.policy = policy;
    if let Some(bytes) = request.buffer_memory {
        wc.spill.memory_limit = bytes;
    }
    if let Some(bytes) = request.spill_limit {
        wc.spill.disk_limit = bytes;
    }
    if let Some(dir) = &request.spill_dir {
        wc.spill.dir = dir.clone();
    }
    Ok(wc)
}

fn diff_interval(request: &ExportRequest) -> anyhow::Result<Duration> {
    duration(
        request.diff_interval.as_deref(),
        "--diff-interval",
        "30s",
        larch_core::duration::parse_positive,
    )
}

/// The transform of a continuous export and what its preflight found (shown on `/status`).
pub(super) struct Masked {
    pub masking: Option<Arc<Masking>>,
    pub preflight: Option<larch_contract::preflight::PreflightSummary>,
}

/// A continuous export until SIGTERM/SIGINT, then a final diff (an error when the final diff
/// cannot be written).
pub(super) async fn follow(
    request: &ExportRequest,
    hint: &super::CleanupCommand,
    config: PostgresConfig,
    table: TableId,
    store: Arc<dyn Store>,
    wc: WriterConfig,
    masked: Masked,
) -> anyhow::Result<()> {
    let Masked { masking, preflight } = masked;
    let diff_interval = diff_interval(request)?;
    let lease = match &request.lease {
        Some(name) => Some(lease_elector(request, name).await?),
        None => None,
    };
    let shared = Shared::new(&table);
    shared.set_slot(&config.slot_name);
    shared.status.locked().preflight = preflight;
    // On Kubernetes the operator turns a lost slot into an Event: give its next /status read
    // the chance to see the loss before the re-baseline replaces the epoch.
    let report_wait = optional_duration(
        request.slot_loss_report_wait.as_deref(),
        "--slot-loss-report-wait",
    )?
    .or(request.lease.is_some().then(|| Duration::from_secs(60)));
    if let Some(wait) = report_wait {
        shared.set_loss_report_wait(wait);
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let listen = request.listen.as_deref().unwrap_or(DEFAULT_FOLLOW_LISTEN);
    let addr = serve(listen, shared.clone(), stop_rx.clone()).await?;
    eprintln!(
        "larch export: following {table} into {} every {diff_interval:?} (status on http://{addr}); SIGTERM or Ctrl-C stops after a final diff",
        wc.key_prefix
    );
    if let Some(e) = &lease {
        shared.status.locked().state = "WAITING_FOR_LEASE".into();
        tokio::select! {
            () = acquire_logging_holder(e) => {}
            () = crate::engine::wait_for_signal() => return Ok(()),
        }
    }
    // Opened only now: the writer sweeps orphans (W10), which only the lease holder may do.
    let writer = ArchiveWriter::open(vec![store], wc).await?;
    let source = Arc::new(PostgresSource::new(config));
    let export = ContinuousExport {
        source: source.clone(),
        table,
        writer,
        diff_interval,
        shared,
        masking,
    };
    let run = tokio::spawn(export.run(stop_rx));
    let summary_file = request.summary_file.as_deref();
    until_stopped(run, stop_tx, lease.as_ref(), summary_file, hint, &source).await?;
    if let Some(e) = &lease
        && let Err(err) = e.release().await
    {
        tracing::warn!(lease = %e.name, error = %err, "releasing the export lease");
    }
    Ok(())
}

/// Runs the export until it fails, the Lease is lost (the process exits) or a signal asks it
/// to stop: then it flushes a final diff and acknowledges it — still only while the Lease
/// holds.
async fn until_stopped(
    mut run: tokio::task::JoinHandle<anyhow::Result<()>>,
    stop_tx: tokio::sync::watch::Sender<bool>,
    lease: Option<&LeaderElector>,
    summary_file: Option<&std::path::Path>,
    hint: &super::CleanupCommand,
    source: &PostgresSource,
) -> anyhow::Result<()> {
    let kept = async {
        match lease {
            Some(e) => e.keep().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(kept);
    tokio::select! {
        r = &mut run => {
            stop_tx.send_replace(true);
            let failed = r
                .map_err(|e| anyhow!("export task: {e}"))
                .and_then(|r| r)
                .err()
                .unwrap_or_else(|| anyhow!("the continuous export stopped by itself"));
            left_behind(hint, source).await;
            return Err(failed);
        }
        () = &mut kept => lease_lost(summary_file),
        () = crate::engine::wait_for_signal() => {}
    }
    stop_tx.send_replace(true);
    let stopped = tokio::select! {
        r = &mut run => r.map_err(|e| anyhow!("export task: {e}")).and_then(|r| r),
        () = &mut kept => lease_lost(summary_file),
    };
    left_behind(hint, source).await;
    stopped
}

/// Says what the export leaves on the source database and how to drop it. A temporary slot
/// vanished with its session, so its publication goes too. A publication that is not this
/// export's (another slot's or owner's, or not larch's) is never offered for dropping.
async fn left_behind(hint: &super::CleanupCommand, source: &PostgresSource) {
    let c = source.config();
    let server = c.describe();
    if c.slot_mode == SlotMode::Temporary {
        match source.drop_publication_if_unused().await {
            Ok(dropped) => eprintln!(
                "larch export: nothing left on {server}: the temporary slot {} ended with the session{}",
                c.slot_name,
                if dropped {
                    format!(" and publication {} was dropped", c.publication_name)
                } else {
                    String::new()
                }
            ),
            Err(e) => eprintln!(
                "larch export: the temporary slot {} ended with the session; publication {} may be left on {server} ({e:#}); drop it with: {}",
                c.slot_name,
                c.publication_name,
                hint.line(&c.slot_name, &c.publication_name)
            ),
        }
        return;
    }
    let held = match source.refresh_lag().await {
        Ok(_) => match source.slot_usage() {
            Some(u) => format!(
                "; it holds {} of WAL on the server (restart_lsn {})",
                larch_core::units::format_bytes(u.retained_bytes.unwrap_or(0)),
                u.restart_lsn.as_deref().unwrap_or("?")
            ),
            None => "; it does not exist (any more)".into(),
        },
        Err(e) => format!("; its WAL could not be read ({e:#})"),
    };
    if let Some(why) = foreign_publication(source).await {
        eprintln!(
            "larch export: publication {} on {server} is not this export's: {why}. larch neither \
             created nor changed it and will not drop it; give this export another publication \
             (--publication) or slot (--slot) name. Replication slot {}{held}.",
            c.publication_name, c.slot_name
        );
        return;
    }
    eprintln!(
        "larch export: left on {server}: replication slot {} (persistent: a restart resumes from it{held}) and publication {}. \
         PostgreSQL keeps WAL for the slot until it is dropped; when this export is not coming back, drop both with:\n  {}",
        c.slot_name,
        c.publication_name,
        hint.line(&c.slot_name, &c.publication_name)
    );
}

/// Why the publication is not this export's to drop (by its larch record), or `None` when it
/// is, or does not exist, or cannot be read.
async fn foreign_publication(source: &PostgresSource) -> Option<String> {
    let c = source.config();
    let record = source.publication_record().await.ok()??;
    larch_postgres::ownership::check(
        Some(&record),
        &c.publication_name,
        &c.slot_name,
        &c.owner,
        false,
    )
    .err()
}

/// Waits until `e` is held, logging the wait, each holder met on the way, and the hold.
pub(super) async fn acquire_logging_holder(e: &LeaderElector) {
    tracing::info!(lease = %e.name, identity = %e.identity, "waiting for the export lease before writing");
    let mut logged: Option<String> = None;
    loop {
        match e.try_acquire_or_renew().await {
            Ok(true) => {
                tracing::info!(lease = %e.name, identity = %e.identity, "holding the export lease");
                return;
            }
            Ok(false) => {
                let holder = e.holder().await;
                if holder != logged {
                    tracing::info!(lease = %e.name, holder = ?holder, "the export lease is held by another writer; waiting");
                    logged = holder;
                }
            }
            Err(err) => tracing::warn!(lease = %e.name, error = %err, "acquiring the export lease"),
        }
        tokio::time::sleep(e.retry).await;
    }
}
