//! `larch export`: a one-shot export of one PostgreSQL table into an archive (a base snapshot
//! at the replication slot's consistent point), like `laredo archive export` without
//! `--follow`, but streamed (bounded memory), committed by compare-and-swap as a new epoch
//! (W6), with a temporary slot that vanishes with its session and no publication. `--follow`
//! keeps exporting from a persistent slot and publication, which it leaves for a restart and
//! `larch export cleanup` removes.

use std::path::PathBuf;

use anyhow::{Context, anyhow, bail};
use clap::Args;

use super::env_help::{CRASH, KUBE, LEASE, LOG, PG, S3};
use super::{ConnectionArgs, StoreArgs, parse_duration_arg, parse_formats, parse_list};
use crate::archive::model::TableId;
use crate::archive::writer::{ArchiveWriter, WriterConfig};
use crate::export::lease::LeaderElector;
use crate::export::subset::{SampleRule, Subset};
use crate::export::transform::{Masking, TransformKey, TransformRules};
use crate::failure::{self, Reason};
use crate::locks::MutexExt;
use crate::source::SyncSource;
use crate::source::postgres::{PostgresConfig, PostgresSource, SessionLimits, SlotMode};
use k8s_openapi::api::coordination::v1::Lease;

fn export_env() -> String {
    super::env_section(&[PG, S3, KUBE, LEASE, LOG, CRASH])
}

/// What each mode leaves on the source database, for `larch export --help`.
const SLOTS_HELP: &str = "Replication slots and publications on the source database:
  one-shot (no --follow)   a temporary slot, dropped by PostgreSQL when the export's session
                           ends (also when it is killed); no publication.
  --follow                 a persistent slot (--slot-mode persistent, the default) and a
                           publication, both kept on exit so a restart resumes where it stopped;
                           the slot keeps WAL on the server until it is dropped: remove them with
                           `larch export cleanup --slot S --publication P`. With --slot-mode
                           temporary the slot vanishes on exit and the publication is dropped.
A publication larch creates is marked with the comment `larch: created for replication slot S
by OWNER` (--owner): that is the record cleanup goes by; it never drops a slot or publication
whose record does not name that slot and the same owner.";

#[derive(Args, Debug)]
#[command(
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    after_help = export_env(),
    after_long_help = format!("{SLOTS_HELP}\n\n{}", export_env())
)]
pub struct ExportArgs {
    #[command(subcommand)]
    pub command: Option<super::slot::ExportCommand>,
    #[command(flatten)]
    pub connection: ConnectionArgs,
    /// Schema of the table [default: public, or the SCHEMA of `--table SCHEMA.NAME`]. With
    /// --schema, --table is the table's name as it is, dots included.
    #[arg(long)]
    pub schema: Option<String>,
    /// The table to export, `[schema.]name`. Repeat it to export several tables at one
    /// position (one snapshot they all share; one-shot only), each into its own archive at
    /// `<key prefix><schema>.<table>/`.
    #[arg(long, required = true, value_name = "[SCHEMA.]NAME")]
    pub table: Vec<String>,
    /// With several --table: how many tables are copied at once, each over its own connection
    /// importing the shared snapshot [default: the number of tables, at most 4].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub parallel: Option<u16>,
    #[command(flatten)]
    pub store: StoreArgs,
    /// Archive key prefix (default `<schema>.<table>/`, as laredo's export). With several
    /// --table, the prefix each table's `<schema>.<table>/` goes under (default: none).
    #[arg(long)]
    pub key_prefix: Option<String>,
    /// Artifact format(s): jsonl, protobuf, jsonl+zstd (comma-separated).
    #[arg(long, default_value = "jsonl")]
    pub format: String,
    /// Key fields for a table without a primary key (comma-separated).
    #[arg(long)]
    pub key_fields: Option<String>,
    /// Also write the summary JSON to this file; on a failure, `{"reason": …, "error": …}`
    /// instead (Kubernetes: /dev/termination-log, which the operator reads).
    #[arg(long)]
    pub summary_file: Option<PathBuf>,
    /// Replication slot name (default `larch_<schema>_<table>`; with several --table,
    /// `larch_set_<hash of the tables>`).
    #[arg(long)]
    pub slot: Option<String>,
    /// Publication name (default: the slot name), --follow: created when absent; an existing
    /// publication must publish exactly this table. A one-shot export needs none (it only
    /// drops one an earlier, killed export created for its slot).
    #[arg(long)]
    pub publication: Option<String>,
    /// Who this export runs for, recorded with the publication it creates (`larch: created
    /// for replication slot S by OWNER`): a new baseline, `larch export cleanup` and the end of
    /// a temporary slot's export drop a slot or publication only when its record names this
    /// owner. The operator passes `archiveexport/<namespace>/<name>`.
    #[arg(long, default_value = crate::source::postgres::ownership::DEFAULT_OWNER, value_parser = super::parse_owner)]
    pub owner: String,
    /// Slot mode with --follow: `persistent` (the default: survives restarts, kept on exit) or
    /// `temporary` (dropped with the connection). A one-shot export always uses a temporary
    /// slot.
    #[arg(long, value_enum)]
    pub slot_mode: Option<SlotMode>,
    /// Keep exporting: a snapshot, then diffs every --diff-interval until SIGTERM/SIGINT.
    #[arg(long)]
    pub follow: bool,
    /// How often buffered changes are written as a diff (--follow).
    #[arg(long, default_value = "30s", value_parser = parse_duration_arg)]
    pub diff_interval: std::time::Duration,
    /// Never start a new epoch sooner than this after the last snapshot.
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
    /// Keep this many newest epochs; objects of older ones are deleted after the commit that
    /// drops them (0: keep all). One-shot and --follow alike.
    #[arg(long, default_value_t = 0)]
    pub keep_epochs: u32,
    /// Also delete epochs that ended longer ago than this (e.g. `7d`, `36h`, `90m`): what any
    /// position of the last MAX_AGE needs is kept, and so is the current epoch. One-shot and
    /// --follow alike.
    #[arg(long, value_parser = parse_age)]
    pub max_age: Option<std::time::Duration>,
    /// HTTP listener for /health/live, /health/ready, /metrics and /status: with --follow always
    /// (default 127.0.0.1:8080), a one-shot export only when given (its baseline's progress while
    /// it copies). Port 0 picks a free port (printed on stderr).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// --follow: when the replication slot is lost (invalidated by max_slot_wal_keep_size, or
    /// dropped), wait up to this long for a /status read before the re-baseline, so whoever
    /// watches /status (the operator) reports the loss first. Default: 60s with --lease, else
    /// no wait.
    #[arg(long, value_parser = parse_duration_arg)]
    pub slot_loss_report_wait: Option<std::time::Duration>,
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
    /// Memory for buffered changes (--follow: the transaction being received and those waiting
    /// for the next diff); past it they spill to --spill-dir. Bytes or 64Mi, 1Gi, ...
    #[arg(long, default_value = "64Mi", value_parser = crate::archive::spill::parse_size)]
    pub buffer_memory: u64,
    /// Directory for spilled changes (default: $TMPDIR/larch-spill).
    #[arg(long)]
    pub spill_dir: Option<PathBuf>,
    /// Most bytes of spilled changes on disk at once; past it the export stops with an error
    /// naming the limit (0: no limit).
    #[arg(long, default_value = "0", value_parser = crate::archive::spill::parse_size)]
    pub spill_limit: u64,
    /// Column transforms (YAML, see docs/masking.md): every row goes through them before it is
    /// written; the rules are checked against the table first (an error exports nothing).
    #[arg(long, value_name = "FILE", conflicts_with = "transform_rules")]
    pub transform: Option<PathBuf>,
    /// The rules of --transform as text (YAML or JSON), e.g. from the operator.
    #[arg(long, value_name = "RULES")]
    pub transform_rules: Option<String>,
    /// The hash key for --transform (at least 16 bytes; surrounding whitespace ignored).
    /// Default: $LARCH_TRANSFORM_KEY.
    #[arg(long, value_name = "FILE")]
    pub transform_key_file: Option<PathBuf>,
    /// Subsetting (one-shot only): export only the rows this SQL predicate keeps, e.g.
    /// `created_at > CURRENT_TIMESTAMP - interval '90 days'` (parsed: columns, constants,
    /// operators, casts and immutable functions only; then checked with EXPLAIN).
    /// Also `where:` of the table in --transform.
    #[arg(long = "where", value_name = "PREDICATE")]
    pub row_filter: Option<String>,
    /// `statement_timeout` of larch's catalog sessions on the source database (schema
    /// discovery, slots, the publication, TOAST look-ups): none of them should take long.
    #[arg(long, default_value = "1m", value_parser = parse_duration_arg)]
    pub statement_timeout: std::time::Duration,
    /// `lock_timeout` of every session larch opens on the source database: a lock it waits for
    /// longer fails instead of queueing the primary's writers behind it.
    #[arg(long, default_value = "10s", value_parser = parse_duration_arg)]
    pub lock_timeout: std::time::Duration,
    /// `idle_in_transaction_session_timeout` of larch's catalog sessions.
    #[arg(long, default_value = "1m", value_parser = parse_duration_arg)]
    pub idle_in_transaction_timeout: std::time::Duration,
    /// The longest a baseline's snapshot (and with it the primary's xmin horizon) stays open,
    /// from the slot's creation to the end of the last table's COPY: each COPY's
    /// `statement_timeout` is what is left of it.
    #[arg(long, default_value = "24h", value_parser = parse_age)]
    pub snapshot_max_age: std::time::Duration,
    /// Subsetting (one-shot only): keep this percentage of the rows, chosen by a keyed hash
    /// of --sample-by (default: the key fields). Also `sample:` in --transform.
    #[arg(long, value_name = "PERCENT")]
    pub sample: Option<f64>,
    /// The column whose value decides --sample (a foreign key samples alike the key it
    /// references).
    #[arg(long, value_name = "COLUMN", requires = "sample")]
    pub sample_by: Option<String>,
}

/// The subset of `table` from --where/--sample and the table's `where:`/`sample:` in the
/// transform rules (one place each); refused with --follow, whose diffs would not respect it.
fn subset(
    args: &ExportArgs,
    table: &TableId,
    masking: Option<&Masking>,
) -> anyhow::Result<Option<Subset>> {
    let from_rules = masking
        .and_then(|m| m.rules().tables.get(&table.to_string()))
        .map(|t| t.subset())
        .unwrap_or_default();
    let mut subset = from_rules.clone();
    if let Some(p) = &args.row_filter {
        if from_rules.row_filter.is_some() {
            failure::bail!(
                Reason::InvalidConfig,
                "--where and the transform rules' `where:` of table {table} both filter rows: give one"
            );
        }
        subset.row_filter = Some(p.clone());
    }
    if let Some(percent) = args.sample {
        if from_rules.sample.is_some() {
            failure::bail!(
                Reason::InvalidConfig,
                "--sample and the transform rules' `sample:` of table {table} both sample rows: give one"
            );
        }
        subset.sample = Some(SampleRule {
            percent,
            by: args.sample_by.clone(),
        });
    }
    if subset.is_empty() {
        return Ok(None);
    }
    if args.follow {
        failure::bail!(
            Reason::InvalidConfig,
            "a row filter or sample (--where, --sample, `where:`/`sample:` of table {table}) \
             applies to a one-shot export only: the diffs of --follow would not respect it"
        );
    }
    subset
        .check(table)
        .map_err(|e| failure::tag(Reason::InvalidConfig, anyhow!(e)))?;
    Ok(Some(subset))
}

/// The timeouts of the sessions on the source (`--statement-timeout`, …).
fn session_limits(args: &ExportArgs) -> SessionLimits {
    SessionLimits {
        statement_timeout: args.statement_timeout,
        lock_timeout: args.lock_timeout,
        idle_in_transaction_timeout: args.idle_in_transaction_timeout,
        snapshot_max_age: args.snapshot_max_age,
    }
}

/// `--transform` and its key, read and checked before the export connects.
fn masking(args: &ExportArgs) -> anyhow::Result<Option<std::sync::Arc<Masking>>> {
    if args.transform.is_none() && args.transform_rules.is_none() {
        if args.transform_key_file.is_some() {
            failure::bail!(
                Reason::InvalidConfig,
                "--transform-key-file needs --transform FILE (or --transform-rules)"
            );
        }
        return Ok(None);
    }
    let load = || -> Result<Masking, crate::export::transform::TransformError> {
        let rules = match (&args.transform, &args.transform_rules) {
            (Some(path), _) => TransformRules::from_file(path)?,
            (None, Some(text)) => TransformRules::parse(text, "--transform-rules")?,
            (None, None) => unreachable!("checked above"),
        };
        let key = TransformKey::load(args.transform_key_file.as_deref())?;
        Masking::new(rules, key)
    };
    load()
        .map(|m| Some(std::sync::Arc::new(m)))
        .map_err(|e| failure::tag(Reason::InvalidConfig, e))
}

/// Where `--follow` serves its HTTP endpoints without `--listen`.
const DEFAULT_FOLLOW_LISTEN: &str = "127.0.0.1:8080";

/// Exit status of a continuous export that lost its Lease (W9): it stopped writing at once.
pub const EXIT_LEASE_LOST: i32 = failure::EXIT_LEASE_LOST;

/// The export's Lease holder, from `--lease*`.
async fn lease_elector(args: &ExportArgs, name: &str) -> anyhow::Result<LeaderElector> {
    let client = kube::Client::try_default().await.map_err(|e| {
        failure::tag(
            Reason::InvalidConfig,
            anyhow::Error::from(e)
                .context("--lease: no Kubernetes client configuration (in-cluster or KUBECONFIG)"),
        )
    })?;
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
        failure::bail!(
            Reason::InvalidConfig,
            "--lease-duration must be at least 3s"
        );
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

/// A retention age: the durations of --diff-interval, plus whole days (`7d`).
fn parse_age(s: &str) -> Result<std::time::Duration, String> {
    crate::duration::parse_age(s)
}

/// `--schema S --table T`, or `--table [S.]T`, for each `--table`; a table named twice is an
/// error.
fn table_ids(args: &ExportArgs) -> anyhow::Result<Vec<TableId>> {
    let mut ids: Vec<TableId> = Vec::with_capacity(args.table.len());
    for table in &args.table {
        let id = match &args.schema {
            Some(schema) if !table.is_empty() => TableId::new(schema.clone(), table),
            _ => super::parse_table_arg(table).map_err(|e| anyhow!("--table {table}: {e}"))?,
        };
        if ids.contains(&id) {
            bail!("--table {id} is given twice");
        }
        ids.push(id);
    }
    Ok(ids)
}

/// `--format` and `--key-fields`, checked.
fn formats_and_key_fields(
    args: &ExportArgs,
) -> anyhow::Result<(Vec<crate::archive::format::Format>, Vec<String>)> {
    let formats = parse_formats(&args.format)
        .map_err(|e| failure::tag(Reason::InvalidConfig, anyhow!("--format: {e}")))?;
    let key_fields = args
        .key_fields
        .as_deref()
        .map(parse_list)
        .unwrap_or_default();
    Ok((formats, key_fields))
}

/// The temporary slot of a several-table export: one name per set of tables (in any order).
fn default_set_slot(tables: &[TableId]) -> String {
    use sha2::Digest;
    let mut names: Vec<String> = tables
        .iter()
        .map(|t| format!("{}.{}", t.schema, t.table))
        .collect();
    names.sort();
    let digest = sha2::Sha256::digest(names.join("\n"));
    let hex: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    format!("larch_set_{hex}")
}

pub async fn run(args: ExportArgs) -> anyhow::Result<i32> {
    if let Some(command) = args.command {
        return super::slot::run(command).await;
    }
    let dsn = args.connection.dsn()?;
    let mut tables = table_ids(&args).map_err(|e| failure::tag(Reason::InvalidConfig, e))?;
    if tables.len() > 1 {
        return export_set(args, dsn, tables).await;
    }
    let table = tables.remove(0);
    // Read and checked before the export connects.
    let masking = masking(&args)?;
    let subset = subset(&args, &table, masking.as_deref())?;
    let (formats, key_fields) = formats_and_key_fields(&args)?;
    let key_prefix = args
        .key_prefix
        .clone()
        .unwrap_or_else(|| format!("{table}/"));
    // The same rule the readers and the operator apply: no `..`, no leading `/`.
    crate::archive::store::check_key_prefix(&key_prefix)
        .map_err(|e| anyhow::Error::from(e).context("--key-prefix"))?;
    let slot = args
        .slot
        .clone()
        .unwrap_or_else(|| PostgresConfig::default_name(&table));
    let publication = args.publication.clone().unwrap_or_else(|| slot.clone());
    let store = args.store.spec().open().await?;

    let mut config = PostgresConfig::new(dsn, vec![table.clone()], slot, publication);
    config.owner = args.owner.clone();
    config.limits = session_limits(&args);
    config.slot_mode = match args.slot_mode {
        Some(SlotMode::Persistent) if !args.follow => failure::bail!(
            Reason::InvalidConfig,
            "--slot-mode persistent needs --follow: a one-shot export always uses a temporary slot \
             (a persistent one would keep WAL on the server after the export)"
        ),
        Some(mode) => mode,
        None if args.follow => SlotMode::Persistent,
        None => SlotMode::Temporary,
    };
    config.snapshot_only = !args.follow;
    config.key_fields = key_fields.clone();
    if let Some(p) = subset.as_ref().and_then(|s| s.row_filter.clone()) {
        config.row_filters.insert(table.clone(), p);
    }
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
    let mut wc = WriterConfig::new(table.to_string(), &key_prefix);
    wc.key_fields = key_fields;
    wc.snapshot_formats = formats.clone();
    wc.diff_formats = formats;
    // Pruned after this run's own commit (W7, W10).
    wc.keep_epochs = args.keep_epochs;
    wc.max_age = args.max_age;
    // The baseline's progress in the log (and a bar on a terminal), and with --listen on
    // /status and /metrics until the export ends.
    super::init_tracing();
    let shared = crate::export::continuous::Shared::new(&table);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    if let Some(listen) = &args.listen {
        let addr = crate::export::continuous::serve(listen, shared.clone(), stop_rx).await?;
        eprintln!("larch export: exporting {table} (status on http://{addr})");
        shared.ready.send_replace(true);
    }
    shared.status.locked().state = "BASELINE".into();
    let progress = shared.start_progress(crate::export::continuous::BASELINE, &table);
    let result = export(
        source.clone(),
        &table,
        store,
        wc,
        &progress,
        masking.as_deref(),
        subset.as_ref(),
    )
    .await;
    stop_tx.send_replace(true);
    source.close().await;
    // Nothing of ours may stay: a publication an earlier, killed export made for this slot.
    match source.drop_publication_if_unused().await {
        Ok(true) => eprintln!(
            "larch export: dropped publication {}, left behind for slot {} by an earlier export",
            source.config().publication_name,
            source.config().slot_name
        ),
        Ok(false) => {}
        Err(e) if result.is_ok() => {
            tracing::warn!(error = %format!("{e:#}"), "could not check for a stale publication")
        }
        Err(_) => {}
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

/// Several `--table`s: one-shot, every table at one position (one shared snapshot), up to
/// `--parallel` copying at once, each into its own archive at `<key prefix><schema>.<table>/`.
async fn export_set(args: ExportArgs, dsn: String, tables: Vec<TableId>) -> anyhow::Result<i32> {
    use crate::export::set::{DEFAULT_PARALLEL, TableExport, export_at_one_position};
    if args.follow {
        failure::bail!(
            Reason::InvalidConfig,
            "--follow exports one table per process: run one `larch export --follow` per table \
             (several --table are for a one-shot export at one position)"
        );
    }
    if args.slot_mode == Some(SlotMode::Persistent) {
        failure::bail!(
            Reason::InvalidConfig,
            "--slot-mode persistent needs --follow: a one-shot export always uses a temporary slot"
        );
    }
    if args.row_filter.is_some() || args.sample.is_some() {
        failure::bail!(
            Reason::InvalidConfig,
            "--where and --sample name no table: with several --table, give each table's \
             `where:`/`sample:` in the transform rules"
        );
    }
    let masking = masking(&args)?;
    let (formats, key_fields) = formats_and_key_fields(&args)?;
    let parent = args.key_prefix.clone().unwrap_or_default();
    let mut set = Vec::with_capacity(tables.len());
    for table in &tables {
        // As the operator names each table's archive under spec.keyPrefix.
        let key_prefix = format!("{parent}{table}/");
        crate::archive::store::check_key_prefix(&key_prefix)
            .map_err(|e| anyhow::Error::from(e).context(format!("--key-prefix for {table}")))?;
        let mut wc = WriterConfig::new(table.to_string(), &key_prefix);
        wc.key_fields = key_fields.clone();
        wc.snapshot_formats = formats.clone();
        wc.diff_formats = formats.clone();
        wc.keep_epochs = args.keep_epochs;
        wc.max_age = args.max_age;
        set.push(TableExport {
            table: table.clone(),
            writer: wc,
            subset: subset(&args, table, masking.as_deref())?,
        });
    }
    let parallel = args
        .parallel
        .map(usize::from)
        .unwrap_or(DEFAULT_PARALLEL)
        .min(tables.len());
    let slot = args
        .slot
        .clone()
        .unwrap_or_else(|| default_set_slot(&tables));
    let publication = args.publication.clone().unwrap_or_else(|| slot.clone());
    let store = args.store.spec().open().await?;
    let mut config = PostgresConfig::new(dsn, tables.clone(), slot, publication);
    config.owner = args.owner.clone();
    config.limits = session_limits(&args);
    config.slot_mode = SlotMode::Temporary;
    config.snapshot_only = true;
    config.key_fields = key_fields;
    for t in &set {
        if let Some(p) = t.subset.as_ref().and_then(|s| s.row_filter.clone()) {
            config.row_filters.insert(t.table.clone(), p);
        }
    }
    super::init_tracing();
    let names: Vec<String> = tables.iter().map(|t| t.to_string()).collect();
    let shared = crate::export::continuous::Shared::new(&tables[0]);
    shared.status.locked().table = names.join(",");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    if let Some(listen) = &args.listen {
        let addr = crate::export::continuous::serve(listen, shared.clone(), stop_rx).await?;
        eprintln!(
            "larch export: exporting {} at one position, {parallel} at a time (status on http://{addr})",
            names.join(", ")
        );
        shared.ready.send_replace(true);
    }
    shared.status.locked().state = "BASELINE".into();
    let source = std::sync::Arc::new(PostgresSource::new(config));
    // /status shows the table that started last.
    let progress = |t: &TableId| shared.start_progress(crate::export::continuous::BASELINE, t);
    let result = export_at_one_position(
        source.clone(),
        set,
        store,
        parallel,
        masking.as_deref(),
        &progress,
    )
    .await;
    stop_tx.send_replace(true);
    source.close().await;
    if let Err(e) = source.drop_publication_if_unused().await
        && result.is_ok()
    {
        tracing::warn!(error = %format!("{e:#}"), "could not check for a stale publication");
    }
    let exported = result?;
    let position = exported
        .first()
        .map(|e| e.artifact.to_position.clone())
        .unwrap_or_default();
    let per_table: Vec<serde_json::Value> = exported
        .iter()
        .map(|e| {
            serde_json::json!({
                "epoch": e.artifact.epoch,
                "key_prefix": e.key_prefix,
                "position": e.artifact.to_position,
                "row_count": e.artifact.row_count,
                "table": e.table.to_string(),
            })
        })
        .collect();
    let summary = serde_json::json!({ "position": position, "tables": per_table });
    if let Some(path) = &args.summary_file {
        // On one line: a termination message keeps 4 KiB, some 25 tables' entries.
        std::fs::write(path, format!("{summary}\n"))
            .with_context(|| format!("writing --summary-file {}", path.display()))?;
    }
    println!("{}", serde_json::to_string_pretty(&summary)?);
    Ok(0)
}

async fn export(
    source: std::sync::Arc<PostgresSource>,
    table: &TableId,
    store: std::sync::Arc<dyn crate::archive::store::Store>,
    wc: WriterConfig,
    progress: &std::sync::Arc<crate::progress::Progress>,
    masking: Option<&Masking>,
    subset: Option<&Subset>,
) -> anyhow::Result<(String, i64, i64)> {
    // Checks the row filter too (EXPLAIN): an invalid predicate exports nothing.
    let schemas = source.init(std::slice::from_ref(table)).await?;
    // Checked before the archive is opened: a rule that does not fit exports nothing.
    if let (Some(m), Some(schema)) = (masking, source.table_schema(table)) {
        m.compile(&schema)
            .map_err(|e| failure::tag(Reason::InvalidConfig, e))?;
    }
    if let (Some(s), Some(schema)) = (subset, source.table_schema(table)) {
        s.sampler(&schema, masking.and_then(Masking::key))
            .map_err(|e| failure::tag(Reason::InvalidConfig, anyhow!(e)))?;
    }
    let mut writer = ArchiveWriter::open(vec![store], wc).await?;
    writer.set_columns(schemas.get(table).cloned().unwrap_or_default());

    let artifact =
        crate::export::snapshot_from_source(source, table, &mut writer, progress, masking, subset)
            .await?;
    Ok((
        artifact.to_position.clone(),
        artifact.row_count,
        artifact.epoch,
    ))
}

/// `--follow`: a continuous export until SIGTERM/SIGINT, then a final diff and exit 0 (an error
/// when the final diff cannot be written).
async fn follow(
    args: &ExportArgs,
    config: PostgresConfig,
    table: TableId,
    store: std::sync::Arc<dyn crate::archive::store::Store>,
    key_prefix: &str,
    formats: Vec<crate::archive::format::Format>,
    key_fields: Vec<String>,
) -> anyhow::Result<i32> {
    let masking = masking(args)?;
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
    policy
        .validate()
        .map_err(|e| failure::tag(Reason::InvalidConfig, anyhow!("policy: {e}")))?;
    let mut wc = WriterConfig::new(table.to_string(), key_prefix);
    wc.key_fields = key_fields;
    wc.snapshot_formats = formats.clone();
    wc.diff_formats = formats;
    wc.policy = policy;
    wc.keep_epochs = args.keep_epochs;
    wc.max_age = args.max_age;
    wc.spill.memory_limit = args.buffer_memory;
    wc.spill.disk_limit = args.spill_limit;
    if let Some(dir) = &args.spill_dir {
        wc.spill.dir = dir.clone();
    }
    let lease = match &args.lease {
        Some(name) => Some(lease_elector(args, name).await?),
        None => None,
    };
    let shared = Shared::new(&table);
    shared.set_slot(&config.slot_name);
    // On Kubernetes the operator turns a lost slot into an Event: give its next /status read
    // the chance to see the loss before the re-baseline replaces the epoch.
    let report_wait = args.slot_loss_report_wait.or(args
        .lease
        .is_some()
        .then(|| std::time::Duration::from_secs(60)));
    if let Some(wait) = report_wait {
        shared.set_loss_report_wait(wait);
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let listen = args.listen.as_deref().unwrap_or(DEFAULT_FOLLOW_LISTEN);
    let addr = serve(listen, shared.clone(), stop_rx.clone()).await?;
    eprintln!(
        "larch export: following {table} into {key_prefix} every {:?} (status on http://{addr}); SIGTERM or Ctrl-C stops after a final diff",
        args.diff_interval
    );
    if let Some(e) = &lease {
        shared.status.locked().state = "WAITING_FOR_LEASE".into();
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
        masking,
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
            let failed = r
                .map_err(|e| anyhow!("export task: {e}"))
                .and_then(|r| r)
                .err()
                .unwrap_or_else(|| anyhow!("the continuous export stopped by itself"));
            left_behind(&args.connection, &source).await;
            return Err(failed);
        }
        () = &mut kept => return Ok(lease_lost(args.summary_file.as_deref())),
        () = crate::engine::wait_for_signal() => {}
    }
    // Stop: the export flushes a final diff and acknowledges it before we exit — still only
    // while the lease holds.
    stop_tx.send_replace(true);
    let stopped = tokio::select! {
        r = &mut run => r.map_err(|e| anyhow!("export task: {e}")).and_then(|r| r),
        () = &mut kept => return Ok(lease_lost(args.summary_file.as_deref())),
    };
    left_behind(&args.connection, &source).await;
    stopped?;
    if let Some(e) = &lease
        && let Err(err) = e.release().await
    {
        tracing::warn!(lease = %e.name, error = %err, "releasing the export lease");
    }
    Ok(0)
}

/// Says what the export leaves on the source database and how to drop it. A temporary slot
/// vanished with its session, so its publication goes too.
async fn left_behind(connection: &ConnectionArgs, source: &PostgresSource) {
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
                "larch export: the temporary slot {} ended with the session; publication {} may be left on {server} ({e:#}); drop it with: larch export cleanup {} --slot {} --publication {}",
                c.slot_name,
                c.publication_name,
                connection.hint(),
                c.slot_name,
                c.publication_name
            ),
        }
        return;
    }
    let held = match source.refresh_lag().await {
        Ok(_) => match source.slot_usage() {
            Some(u) => format!(
                "; it holds {} of WAL on the server (restart_lsn {})",
                crate::units::format_bytes(u.retained_bytes.unwrap_or(0)),
                u.restart_lsn.as_deref().unwrap_or("?")
            ),
            None => "; it does not exist (any more)".into(),
        },
        Err(e) => format!("; its WAL could not be read ({e:#})"),
    };
    eprintln!(
        "larch export: left on {server}: replication slot {} (persistent: a restart resumes from it{held}) and publication {}. \
         PostgreSQL keeps WAL for the slot until it is dropped; when this export is not coming back, drop both with:\n  \
         larch export cleanup {} --slot {} --publication {}",
        c.slot_name,
        c.publication_name,
        connection.hint(),
        c.slot_name,
        c.publication_name
    );
}

/// Lease lost: stop writing now — no final diff, no further request from any task — by
/// exiting the process with [`EXIT_LEASE_LOST`] (W9), the reason in the termination message.
fn lease_lost(termination_file: Option<&std::path::Path>) -> i32 {
    let why =
        "lost the export lease: stopped writing; exiting so the Lease holder is the only writer";
    tracing::error!("{why}");
    let code = failure::report(
        termination_file,
        &failure::tag(Reason::LeaseLost, anyhow!(why)),
    );
    std::process::exit(code)
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
