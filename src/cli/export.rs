//! `larch export`: a one-shot export of one PostgreSQL table into an archive (a base snapshot
//! at the replication slot's consistent point), like `laredo archive export` without
//! `--follow`, but streamed (bounded memory), committed by compare-and-swap as a new epoch
//! (W6), with a temporary slot that vanishes with its session and no publication. `--follow`
//! keeps exporting from a persistent slot and publication, which it leaves for a restart and
//! `larch export cleanup` removes.

use std::path::PathBuf;

use anyhow::anyhow;
use clap::Args;
use larch_contract::export_request::{ExportRequest, SlotMode as RequestSlotMode};

use super::env_help::{CRASH, KUBE, LEASE, LOG, PG, S3, SPLIT_WORKER};
use super::{
    ConnectionArgs, SessionLimitArgs, StoreArgs, duration_text, parse_formats, parse_list,
};
use crate::contract::subset_spec::SubsetSpec;
use crate::export::run::SourceConnection;
use crate::export::transform::TransformRules;
use crate::failure::{self, Reason};
use crate::source::postgres::SlotMode;

fn export_env() -> String {
    super::env_section(&[PG, S3, KUBE, LEASE, SPLIT_WORKER, LOG, CRASH])
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
    /// The whole export as one JSON request (what the operator's pods run;
    /// docs/architecture.md): the other flags are not read, except that the Lease's namespace
    /// and holder default from POD_NAMESPACE and POD_NAME.
    #[arg(long, value_name = "JSON", conflicts_with = "table")]
    pub request: Option<String>,
    #[command(flatten)]
    pub connection: ConnectionArgs,
    /// Schema of the table [default: public, or the SCHEMA of `--table SCHEMA.NAME`]. With
    /// --schema, --table is the table's name as it is, dots included.
    #[arg(long)]
    pub schema: Option<String>,
    /// The table to export, `[schema.]name`. Repeat it to export several tables at one
    /// position (one snapshot they all share; one-shot only), each into its own archive at
    /// `<key prefix><schema>.<table>/`.
    #[arg(
        long,
        required_unless_present_any = ["request", "subset"],
        value_name = "[SCHEMA.]NAME"
    )]
    pub table: Vec<String>,
    /// With several --table: how many tables are copied at once, each over its own connection
    /// importing the shared snapshot [default: the number of tables, at most 4].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub parallel: Option<u16>,
    /// One table's one-shot export read in N ctid ranges at once (by pages), each over its own
    /// connection importing the one exported snapshot and encoded by its own worker; the
    /// epoch still has one snapshot object (the parts joined in order).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=64))]
    pub split: Option<u16>,
    /// With --split: the ranges are copied by M separate worker processes (`larch export
    /// split-worker`, e.g. the pods of an Indexed Job) instead of this one, which coordinates:
    /// it holds the exported snapshot, writes the plan into the store, waits for every range
    /// and commits the epoch (docs/postgres-source.md).
    #[arg(long, value_name = "M", requires = "split", value_parser = clap::value_parser!(u16).range(1..=64))]
    pub split_workers: Option<u16>,
    /// With --split-workers: how long to wait for each worker to start (to import the snapshot
    /// and say so in the store) before the run fails and the snapshot is released, rather than
    /// held on the primary for workers that never come (default 10m).
    #[arg(long, value_name = "DURATION", requires = "split_workers")]
    pub split_workers_start_timeout: Option<String>,
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
    #[arg(long, alias = "termination-log")]
    pub summary_file: Option<PathBuf>,
    #[command(flatten)]
    pub output: super::output::DocumentOutputArgs,
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
    #[arg(long, default_value = "30s", value_parser = duration_text)]
    pub diff_interval: String,
    /// Never start a new epoch sooner than this after the last snapshot.
    #[arg(long, value_parser = duration_text)]
    pub min_interval: Option<String>,
    /// Re-base when the last snapshot is older than this (also on an idle table).
    #[arg(long, value_parser = duration_text)]
    pub max_interval: Option<String>,
    /// Re-base when a diff reaches this size (bytes, or 64MB, 64MiB, 1Gi, ...).
    #[arg(long, value_parser = crate::archive::spill::parse_size)]
    pub max_diff_bytes: Option<u64>,
    /// Re-base when a diff reaches this fraction of the last snapshot's size.
    #[arg(long, value_parser = fraction_text)]
    pub max_diff_fraction: Option<String>,
    /// Re-base after this many changes since the last snapshot.
    #[arg(long)]
    pub max_churn_records: Option<u64>,
    /// Re-base after changes amounting to this fraction of the table's rows.
    #[arg(long, value_parser = fraction_text)]
    pub max_churn_fraction: Option<String>,
    /// Keep this many newest epochs; objects of older ones are deleted after the commit that
    /// drops them (0: keep all). One-shot and --follow alike.
    #[arg(long, default_value_t = 0)]
    pub keep_epochs: u32,
    /// Also delete epochs that ended longer ago than this (e.g. `7d`, `36h`, `90m`): what any
    /// position of the last MAX_AGE needs is kept, and so is the current epoch. One-shot and
    /// --follow alike.
    #[arg(long, value_parser = age_text)]
    pub max_age: Option<String>,
    /// HTTP listener for /health/live, /health/ready, /metrics and /status: with --follow always
    /// (default 127.0.0.1:8080), a one-shot export only when given (its baseline's progress while
    /// it copies). Port 0 picks a free port (printed on stderr).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// --follow: when the replication slot is lost (invalidated by max_slot_wal_keep_size, or
    /// dropped), wait up to this long for a /status read before the re-baseline, so whoever
    /// watches /status (the operator) reports the loss first. Default: 60s with --lease, else
    /// no wait.
    #[arg(long, value_parser = duration_text)]
    pub slot_loss_report_wait: Option<String>,
    /// Hold this coordination.k8s.io Lease while writing (--follow, or a split run's
    /// coordinator, on Kubernetes): wait for it before writing, renew it, and exit with status
    /// 3 as soon as it cannot be renewed. Without it the manifest compare-and-swap alone decides
    /// who writes.
    #[arg(long, env = "LARCH_EXPORT_LEASE")]
    pub lease: Option<String>,
    /// Namespace of the Lease.
    #[arg(long, env = "POD_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// Holder identity written into the Lease (default: the pod name, else the host name).
    #[arg(long, env = "POD_NAME")]
    pub lease_identity: Option<String>,
    /// How long the Lease stays valid without renewal; the holder gives up after two thirds.
    #[arg(long, default_value = "15s", value_parser = duration_text)]
    pub lease_duration: String,
    /// Memory for buffered changes (--follow: the transaction being received and those waiting
    /// for the next diff); past it they spill to --spill-dir. Bytes, or decimal 64MB, 1GB, or
    /// binary 64MiB (64Mi), 1GiB (1Gi).
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
    /// Export nothing: read the tables' constraints (PRIMARY KEY, UNIQUE, NOT NULL, CHECK,
    /// FOREIGN KEY) from the source and report those the --transform can break (a table on
    /// stderr, the report as -o on stdout). Exit 0: none; 1: some; 2: bad input.
    #[arg(long)]
    pub check: bool,
    /// The rules of --transform as text (YAML or JSON), e.g. from the operator.
    #[arg(long, value_name = "RULES")]
    pub transform_rules: Option<String>,
    /// The hash key for --transform (at least 16 bytes; surrounding whitespace ignored).
    /// Default: $LARCH_TRANSFORM_KEY.
    #[arg(long, value_name = "FILE")]
    pub transform_key_file: Option<PathBuf>,
    /// After a one-shot export with --transform: look for every raw value of the masked
    /// columns in each archive written (`larch archive leak-check`) and record the result in
    /// its manifest; raw values found fail the export (exit 2, reason LeakFound).
    #[arg(long)]
    pub leak_check: bool,
    /// With --transform: refuse to export (exit 2, reason ConstraintsAtRisk, nothing written)
    /// when the constraint preflight every masked export runs at start (what --check prints)
    /// finds a UNIQUE, CHECK, NOT NULL or FOREIGN KEY constraint the rules can break.
    #[arg(long)]
    pub require_validated: bool,
    /// Subsetting (one-shot only): export only the rows this SQL predicate keeps, e.g.
    /// `created_at > CURRENT_TIMESTAMP - interval '90 days'` (parsed: columns, constants,
    /// operators, casts and immutable functions only; then checked with EXPLAIN).
    /// Also `where:` of the table in --transform.
    #[arg(long = "where", value_name = "PREDICATE")]
    pub row_filter: Option<String>,
    /// A subset that follows foreign keys (YAML, docs/subsetting.md): roots, downward rules,
    /// virtual foreign keys. Exports the closure of every table it spans (and each --table)
    /// at one position; each manifest records the closure.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["row_filter", "sample", "follow"])]
    pub subset: Option<PathBuf>,
    /// Row filters (--where, `where:` in --transform) may use `EXISTS (SELECT …)` and
    /// `x IN (SELECT …)` into tables this export also exports (schema-qualified; reading only
    /// columns they export unmasked). Also `subqueries: true` in --transform.
    #[arg(long)]
    pub where_subqueries: bool,
    #[command(flatten)]
    pub session: SessionLimitArgs,
    /// The longest a baseline's snapshot (and with it the primary's xmin horizon) stays open,
    /// from the slot's creation to the end of the last table's COPY: each COPY's
    /// `statement_timeout` is what is left of it.
    #[arg(long, default_value = "24h", value_parser = age_text)]
    pub snapshot_max_age: String,
    /// Subsetting (one-shot only): keep this percentage of the rows, chosen by a keyed hash
    /// of --sample-by (default: the key fields). Also `sample:` in --transform.
    #[arg(long, value_name = "PERCENT")]
    pub sample: Option<f64>,
    /// The column whose value decides --sample (a foreign key samples alike the key it
    /// references).
    #[arg(long, value_name = "COLUMN", requires = "sample")]
    pub sample_by: Option<String>,
}

/// A retention age (the durations of --diff-interval, plus whole days: `7d`), kept as written.
fn age_text(s: &str) -> Result<String, String> {
    crate::duration::parse_age(s).map(|_| s.to_string())
}

/// A fraction (`0.5`), kept as written.
fn fraction_text(s: &str) -> Result<String, String> {
    s.parse::<f64>()
        .map(|_| s.to_string())
        .map_err(|e| e.to_string())
}

impl ExportArgs {
    /// The flags (or `--request`) as the request `larch_run::export::run` takes. With
    /// `--request`, the Lease's namespace and holder come from the environment (POD_NAMESPACE,
    /// POD_NAME) when the request leaves them out.
    pub fn request(&self) -> anyhow::Result<ExportRequest> {
        let invalid = |e: anyhow::Error| failure::tag(Reason::InvalidConfig, e);
        if let Some(text) = &self.request {
            let mut request =
                ExportRequest::from_json(text).map_err(|e| invalid(anyhow!("--request: {e}")))?;
            request.lease = request.lease.or_else(|| self.lease.clone());
            request.lease_namespace = request
                .lease_namespace
                .or_else(|| self.lease_namespace.clone());
            request.lease_identity = request
                .lease_identity
                .or_else(|| self.lease_identity.clone());
            return Ok(request);
        }
        let transform = match (&self.transform, &self.transform_rules) {
            (Some(path), _) => Some(TransformRules::from_file(path)),
            (None, Some(text)) => Some(TransformRules::parse(text, "--transform-rules")),
            (None, None) => None,
        }
        .transpose()
        .map_err(|e| invalid(e.into()))?;
        let subset = self
            .subset
            .as_deref()
            .map(SubsetSpec::load)
            .transpose()
            .map_err(|e| invalid(anyhow!(e)))?;
        let formats = parse_formats(&self.format).map_err(|e| invalid(anyhow!("--format: {e}")))?;
        Ok(ExportRequest {
            connection_file: self.connection.connection_file.clone(),
            schema: self.schema.clone(),
            tables: self.table.clone(),
            parallel: self.parallel,
            split: self.split,
            split_workers: self.split_workers,
            split_workers_start_timeout: self.split_workers_start_timeout.clone(),
            store: self.store.spec(),
            key_prefix: self.key_prefix.clone(),
            formats,
            key_fields: self
                .key_fields
                .as_deref()
                .map(parse_list)
                .unwrap_or_default(),
            summary_file: self.summary_file.clone(),
            slot: self.slot.clone(),
            publication: self.publication.clone(),
            owner: Some(self.owner.clone()),
            slot_mode: self.slot_mode.map(|m| match m {
                SlotMode::Persistent => RequestSlotMode::Persistent,
                SlotMode::Temporary => RequestSlotMode::Temporary,
            }),
            follow: self.follow,
            diff_interval: Some(self.diff_interval.clone()),
            min_interval: self.min_interval.clone(),
            max_interval: self.max_interval.clone(),
            max_diff_bytes: self.max_diff_bytes,
            max_diff_fraction: self.max_diff_fraction.clone(),
            max_churn_records: self.max_churn_records,
            max_churn_fraction: self.max_churn_fraction.clone(),
            keep_epochs: self.keep_epochs,
            max_age: self.max_age.clone(),
            listen: self.listen.clone(),
            slot_loss_report_wait: self.slot_loss_report_wait.clone(),
            lease: self.lease.clone(),
            lease_namespace: self.lease_namespace.clone(),
            lease_identity: self.lease_identity.clone(),
            lease_duration: Some(self.lease_duration.clone()),
            buffer_memory: Some(self.buffer_memory),
            spill_dir: self.spill_dir.clone(),
            spill_limit: Some(self.spill_limit),
            transform,
            transform_key_file: self.transform_key_file.clone(),
            leak_check: self.leak_check,
            require_validated: self.require_validated,
            row_filter: self.row_filter.clone(),
            where_subqueries: self.where_subqueries,
            sample: self.sample,
            sample_by: self.sample_by.clone(),
            subset,
            statement_timeout: Some(self.session.statement_timeout.clone()),
            lock_timeout: Some(self.session.lock_timeout.clone()),
            idle_in_transaction_timeout: Some(self.session.idle_in_transaction_timeout.clone()),
            snapshot_max_age: Some(self.snapshot_max_age.clone()),
        })
    }
}

/// Exit status of a continuous export that lost its Lease (W9): it stopped writing at once.
pub const EXIT_LEASE_LOST: i32 = crate::export::run::EXIT_LEASE_LOST;

pub async fn run(args: ExportArgs) -> anyhow::Result<i32> {
    if let Some(command) = args.command {
        return super::slot::run(command).await;
    }
    if args.check {
        return super::export_check::run(&args).await;
    }
    let request = args.request()?;
    let connection = super::ConnectionArgs {
        connection: args.connection.connection.clone(),
        connection_file: request.connection_file.clone(),
    };
    let dsn = connection.dsn()?;
    // The baseline's progress in the log (and a bar on a terminal), and with --listen on
    // /status and /metrics until the export ends.
    super::init_tracing();
    let source = SourceConnection {
        dsn,
        cleanup: connection.cleanup_command(),
    };
    let format = args.output.format();
    if let Some(summary) = crate::export::run::run(request, source).await? {
        super::output::print(&summary, format, String::new)?;
    }
    Ok(0)
}
