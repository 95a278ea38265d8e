//! `larch export`: a one-shot export of one PostgreSQL table into an archive (a base snapshot
//! at the replication slot's consistent point), like `laredo archive export` without
//! `--follow`, but streamed (bounded memory), committed by compare-and-swap as a new epoch
//! (W6), with a slot and publication of its own that it removes afterwards.

use std::path::PathBuf;

use anyhow::{Context, anyhow, bail};
use clap::Args;

use super::{StoreArgs, parse_formats, parse_list};
use crate::archive::model::TableId;
use crate::archive::writer::{ArchiveWriter, WriterConfig};
use crate::lease::LeaderElector;
use crate::source::SyncSource;
use crate::source::postgres::{PostgresConfig, PostgresSource, SlotMode};
use k8s_openapi::api::coordination::v1::Lease;

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// PostgreSQL connection string (key=value or postgres:// URL). Prefer --connection-file or
    /// LARCH_PG_DSN: a command line is visible to other users of the machine.
    #[arg(long, conflicts_with = "connection_file")]
    pub connection: Option<String>,
    /// File holding the connection string (surrounding whitespace ignored).
    #[arg(long)]
    pub connection_file: Option<PathBuf>,
    #[arg(long, default_value = "public")]
    pub schema: String,
    #[arg(long)]
    pub table: String,
    #[command(flatten)]
    pub store: StoreArgs,
    /// Archive key prefix (default `<schema>.<table>/`, as laredo's export).
    #[arg(long)]
    pub key_prefix: Option<String>,
    /// Artifact format(s): jsonl, protobuf, jsonl+zstd (comma-separated).
    #[arg(long, default_value = "jsonl")]
    pub format: String,
    /// Key fields for a table without a primary key (comma-separated).
    #[arg(long)]
    pub key_fields: Option<String>,
    /// Also write the summary JSON to this file.
    #[arg(long)]
    pub summary_file: Option<PathBuf>,
    /// Replication slot name (default `larch_<schema>_<table>`); a temporary slot, dropped at
    /// the end.
    #[arg(long)]
    pub slot: Option<String>,
    /// Publication name (default: the slot name). Created when absent and then dropped; an
    /// existing publication must publish exactly this table.
    #[arg(long)]
    pub publication: Option<String>,
    /// Slot mode: `persistent` (survives restarts; the default with --follow) or `temporary`
    /// (dropped with the connection; the default for a one-shot export).
    #[arg(long, value_parser = ["persistent", "temporary"])]
    pub slot_mode: Option<String>,
    /// Keep exporting: a snapshot, then diffs every --diff-interval until SIGTERM/SIGINT.
    #[arg(long)]
    pub follow: bool,
    /// How often buffered changes are written as a diff (--follow).
    #[arg(long, default_value = "30s", value_parser = parse_duration_arg)]
    pub diff_interval: std::time::Duration,
    /// Never re-base sooner than this after the last snapshot.
    #[arg(long, value_parser = parse_duration_arg)]
    pub min_interval: Option<std::time::Duration>,
    /// Re-base when the last snapshot is older than this (also on an idle table).
    #[arg(long, value_parser = parse_duration_arg)]
    pub max_interval: Option<std::time::Duration>,
    /// Re-base when a diff reaches this many bytes.
    #[arg(long)]
    pub max_diff_bytes: Option<u64>,
    /// Re-base when a diff reaches this fraction of the last snapshot's size.
    #[arg(long)]
    pub max_diff_fraction: Option<f64>,
    /// Re-base after this many changes since the last snapshot.
    #[arg(long)]
    pub max_churn_records: Option<u64>,
    /// Re-base after changes amounting to this fraction of the table's rows.
    #[arg(long)]
    pub max_churn_fraction: Option<f64>,
    /// Keep this many newest epochs; objects of older ones are deleted (0: keep all).
    #[arg(long, default_value_t = 0)]
    pub keep_epochs: u32,
    /// HTTP listener for /health/live, /health/ready, /metrics and /status (--follow).
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub listen: String,
    /// Hold this coordination.k8s.io Lease while writing (--follow on Kubernetes): wait for it
    /// before opening the archive, renew it, and exit with status 3 as soon as it cannot be
    /// renewed. Without it the manifest compare-and-swap alone decides who writes.
    #[arg(long, env = "LARCH_EXPORT_LEASE")]
    pub lease: Option<String>,
    /// Namespace of the Lease.
    #[arg(long, env = "POD_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// Holder identity written into the Lease (default: the pod name, else the host name).
    #[arg(long, env = "POD_NAME")]
    pub lease_identity: Option<String>,
    /// How long the Lease stays valid without renewal; the holder gives up after two thirds.
    #[arg(long, default_value = "15s", value_parser = parse_duration_arg)]
    pub lease_duration: std::time::Duration,
}

/// Exit status of a continuous export that lost its Lease (W9): it stopped writing at once.
pub const EXIT_LEASE_LOST: i32 = 3;

/// The export's Lease holder, from `--lease*`.
async fn lease_elector(args: &ExportArgs, name: &str) -> anyhow::Result<LeaderElector> {
    let client = kube::Client::try_default()
        .await
        .context("--lease: no Kubernetes client configuration (in-cluster or KUBECONFIG)")?;
    let ns = args
        .lease_namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let identity = args
        .lease_identity
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("larch-export-{}", std::process::id()));
    if args.lease_duration < std::time::Duration::from_secs(3) {
        bail!("--lease-duration must be at least 3s");
    }
    Ok(LeaderElector {
        api: kube::Api::<Lease>::namespaced(client, &ns),
        name: name.to_string(),
        identity,
        lease_duration: args.lease_duration,
        renew_deadline: args.lease_duration * 2 / 3,
        retry: args.lease_duration / 5,
    })
}

fn parse_duration_arg(s: &str) -> Result<std::time::Duration, String> {
    crate::engine::config::parse_duration(s)
}

/// The connection string from the flag, the file or `LARCH_PG_DSN`, never echoed.
fn connection(args: &ExportArgs) -> anyhow::Result<String> {
    if let Some(c) = &args.connection {
        return Ok(c.clone());
    }
    if let Some(path) = &args.connection_file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading --connection-file {}", path.display()))?;
        let text = text.trim();
        if text.is_empty() {
            bail!("--connection-file {} is empty", path.display());
        }
        return Ok(text.to_string());
    }
    match std::env::var("LARCH_PG_DSN") {
        Ok(v) if !v.trim().is_empty() => Ok(v.trim().to_string()),
        _ => bail!(
            "no PostgreSQL connection: pass --connection, --connection-file or set LARCH_PG_DSN"
        ),
    }
}

pub async fn run(args: ExportArgs) -> anyhow::Result<i32> {
    let dsn = connection(&args)?;
    let table = TableId::new(args.schema.clone(), args.table.clone());
    let formats = parse_formats(&args.format).map_err(|e| anyhow!("--format: {e}"))?;
    let key_fields = args
        .key_fields
        .as_deref()
        .map(parse_list)
        .unwrap_or_default();
    let key_prefix = args
        .key_prefix
        .clone()
        .unwrap_or_else(|| format!("{table}/"));
    let slot = args
        .slot
        .clone()
        .unwrap_or_else(|| PostgresConfig::default_name(&table));
    let publication = args.publication.clone().unwrap_or_else(|| slot.clone());
    let store = args.store.spec().open().await?;

    let mut config = PostgresConfig::new(dsn, vec![table.clone()], slot, publication);
    config.slot_mode = match args.slot_mode.as_deref() {
        Some("persistent") => SlotMode::Persistent,
        Some(_) => SlotMode::Temporary,
        None if args.follow => SlotMode::Persistent,
        None => SlotMode::Temporary,
    };
    config.key_fields = key_fields.clone();
    if args.follow {
        return follow(
            &args,
            config,
            table,
            store,
            &key_prefix,
            formats,
            key_fields,
        )
        .await;
    }
    let source = std::sync::Arc::new(PostgresSource::new(config));
    let result = export(
        source.clone(),
        &table,
        store,
        &key_prefix,
        formats,
        key_fields,
    )
    .await;
    source.close().await;
    if let Err(e) = source.drop_created_publication().await {
        tracing::warn!(error = %format!("{e:#}"), "could not drop the export's publication");
    }
    let (position, rows, epoch) = result?;

    let summary = serde_json::json!({
        "epoch": epoch,
        "key_prefix": key_prefix,
        "position": position,
        "row_count": rows,
        "table": table.to_string(),
    });
    let text = serde_json::to_string_pretty(&summary)?;
    if let Some(path) = &args.summary_file {
        std::fs::write(path, format!("{text}\n"))
            .with_context(|| format!("writing --summary-file {}", path.display()))?;
    }
    println!("{text}");
    Ok(0)
}

async fn export(
    source: std::sync::Arc<PostgresSource>,
    table: &TableId,
    store: std::sync::Arc<dyn crate::archive::store::Store>,
    key_prefix: &str,
    formats: Vec<crate::archive::format::Format>,
    key_fields: Vec<String>,
) -> anyhow::Result<(String, i64, i64)> {
    let schemas = source.init(std::slice::from_ref(table)).await?;
    let mut wc = WriterConfig::new(table.to_string(), key_prefix);
    wc.key_fields = key_fields;
    wc.snapshot_formats = formats.clone();
    wc.diff_formats = formats;
    let mut writer = ArchiveWriter::open(vec![store], wc).await?;
    writer.set_columns(schemas.get(table).cloned().unwrap_or_default());

    let artifact = crate::export::snapshot_from_source(source, table, &mut writer).await?;
    Ok((
        artifact.to_position.clone(),
        artifact.row_count,
        artifact.epoch,
    ))
}

/// `--follow`: a continuous export until SIGTERM/SIGINT, then a final diff and exit 0.
async fn follow(
    args: &ExportArgs,
    config: PostgresConfig,
    table: TableId,
    store: std::sync::Arc<dyn crate::archive::store::Store>,
    key_prefix: &str,
    formats: Vec<crate::archive::format::Format>,
    key_fields: Vec<String>,
) -> anyhow::Result<i32> {
    use crate::archive::policy::Policy;
    use crate::export::continuous::{ContinuousExport, Shared, serve};
    super::init_tracing();
    let policy = Policy {
        diff_interval: args.diff_interval,
        min_interval: args.min_interval.unwrap_or_default(),
        max_interval: args.max_interval.unwrap_or_default(),
        max_diff_bytes: args.max_diff_bytes.unwrap_or(0),
        max_diff_fraction: args.max_diff_fraction.unwrap_or(0.0),
        max_churn_records: args.max_churn_records.unwrap_or(0),
        max_churn_fraction: args.max_churn_fraction.unwrap_or(0.0),
    };
    policy.validate().map_err(|e| anyhow!("policy: {e}"))?;
    let mut wc = WriterConfig::new(table.to_string(), key_prefix);
    wc.key_fields = key_fields;
    wc.snapshot_formats = formats.clone();
    wc.diff_formats = formats;
    wc.policy = policy;
    wc.keep_epochs = args.keep_epochs;
    let lease = match &args.lease {
        Some(name) => Some(lease_elector(args, name).await?),
        None => None,
    };
    let shared = Shared::new(&table);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let addr = serve(&args.listen, shared.clone(), stop_rx.clone()).await?;
    eprintln!(
        "larch export: following {table} into {key_prefix} every {:?} (status on http://{addr}); SIGTERM or Ctrl-C stops after a final diff",
        args.diff_interval
    );
    if let Some(e) = &lease {
        shared.status.lock().expect("lock").state = "WAITING_FOR_LEASE".into();
        tracing::info!(lease = %e.name, identity = %e.identity, "waiting for the export lease before writing");
        tokio::select! {
            () = acquire_logging_holder(e) => {}
            () = crate::engine::wait_for_signal() => return Ok(0),
        }
        tracing::info!(lease = %e.name, identity = %e.identity, "holding the export lease");
    }
    // Opened only now: the writer sweeps orphans (W10), which only the lease holder may do.
    let writer = ArchiveWriter::open(vec![store], wc).await?;
    let source = std::sync::Arc::new(PostgresSource::new(config));
    let export = ContinuousExport {
        source: source.clone(),
        table,
        writer,
        diff_interval: args.diff_interval,
        shared,
    };
    let mut run = tokio::spawn(export.run(stop_rx));
    let kept = async {
        match &lease {
            Some(e) => e.keep().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(kept);
    tokio::select! {
        r = &mut run => {
            stop_tx.send_replace(true);
            r.map_err(|e| anyhow!("export task: {e}"))??;
            return Err(anyhow!("the continuous export stopped by itself"));
        }
        () = &mut kept => return Ok(lease_lost()),
        () = crate::engine::wait_for_signal() => {}
    }
    // Stop: the export flushes a final diff and acknowledges it before we exit — still only
    // while the lease holds.
    stop_tx.send_replace(true);
    tokio::select! {
        r = &mut run => r.map_err(|e| anyhow!("export task: {e}"))??,
        () = &mut kept => return Ok(lease_lost()),
    }
    if let Some(e) = &lease
        && let Err(err) = e.release().await
    {
        tracing::warn!(lease = %e.name, error = %err, "releasing the export lease");
    }
    Ok(0)
}

/// Lease lost: stop writing now — no final diff, no further request from any task — by
/// exiting the process with [`EXIT_LEASE_LOST`] (W9).
fn lease_lost() -> i32 {
    tracing::error!(
        "lost the export lease: stopped writing; exiting so the Lease holder is the only writer"
    );
    std::process::exit(EXIT_LEASE_LOST)
}

async fn acquire_logging_holder(e: &LeaderElector) {
    let mut logged: Option<String> = None;
    loop {
        match e.try_acquire_or_renew().await {
            Ok(true) => return,
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
