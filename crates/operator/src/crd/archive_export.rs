//! `ArchiveExport`: PostgreSQL table(s) → an archive, as a Job (OneShot), a CronJob (OneShot with
//! a schedule) or a Deployment (Continuous).

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{
    CaBundleRef, Condition, Format, Location, SecretKeyRef, TableRef, conditions_schema,
};
use super::progress::OperationProgress;

/// Annotation requesting a new OneShot run: set it to a new value (any token, e.g. a timestamp).
pub const RUN_REQUESTED_ANNOTATION: &str = "larch.dev/run-requested";

/// Finalizer of an ArchiveExport whose `source.deletionPolicy` is `Delete` (the default): the
/// operator drops the replication slot(s) and publication(s) larch created before the object
/// goes.
pub const CLEANUP_FINALIZER: &str = "larch.dev/cleanup";

/// Set to `"true"` on an ArchiveExport being deleted to give up the cleanup: the finalizer is
/// removed and the slot(s) and publication(s) stay on the source database.
pub const SKIP_CLEANUP_ANNOTATION: &str = "larch.dev/skip-cleanup";

/// Set to `"true"` to let the cleanup drop a slot and publication an older larch created for
/// this export without recording an owner (`larch export cleanup --adopt-legacy`): only when
/// they are this export's.
pub const ADOPT_LEGACY_SLOT_ANNOTATION: &str = "larch.dev/adopt-legacy-slot";

/// Desired state of an ArchiveExport.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "larch.dev",
    version = "v1alpha1",
    kind = "ArchiveExport",
    namespaced,
    status = "ArchiveExportStatus",
    shortname = "aexp",
    category = "archives",
    doc = "Exports PostgreSQL tables into a laredo-compatible archive (S3 or a volume).",
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Mode", type_ = "string", json_path = ".spec.mode"),
    printcolumn(name = "Last Export", type_ = "date", json_path = ".status.lastExport.time"),
    printcolumn(name = "Position", type_ = "string", json_path = ".status.lastExport.position"),
    printcolumn(name = "Progress", type_ = "string", json_path = ".status.progress.percent"),
    printcolumn(name = "Rows", type_ = "integer", json_path = ".status.lastExport.rowCount", priority = 1),
    printcolumn(name = "WAL Held", type_ = "integer", json_path = ".status.writers[0].retainedWalBytes", priority = 1),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("size(self.metadata.name) <= 40").message("name must be at most 40 characters (child names append a suffix)"),
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.schedule) || self.mode == 'OneShot'").message("schedule applies only to mode OneShot"),
    validation = Rule::new("!has(self.continuous) || self.mode == 'Continuous'").message("continuous applies only to mode Continuous"),
    validation = Rule::new("self.mode == 'OneShot' || !has(self.transform) || !has(self.transform.tables) || self.transform.tables.all(t, !has(self.transform.tables[t].where) && !has(self.transform.tables[t].sample))").message("transform.tables[*].where and sample (subsetting) apply only to mode OneShot: the diffs of a continuous export would not respect them"),
    validation = Rule::new("self.mode == 'OneShot' || !has(self.transform) || !has(self.transform.leakCheck) || !self.transform.leakCheck").message("transform.leakCheck applies only to mode OneShot (and schedules): a continuous archive's head moves with every diff; check it with `larch archive leak-check --no-record`"),
    validation = Rule::new("!has(self.retention) || !has(self.retention.keepEpochs) || !has(self.continuous) || !has(self.continuous.keepEpochs)").message("set keepEpochs in retention only (continuous.keepEpochs is deprecated)"),
    validation = Rule::new("!has(self.subset) || (self.mode == 'OneShot' && has(self.parallel) && has(self.source.tables))").message("subset (following foreign keys) applies to mode OneShot with source.tables and parallel: one Job computes the closure and exports every table at one position"),
    validation = Rule::new("!has(self.parallel) || (self.mode == 'OneShot' && has(self.source.tables))").message("parallel applies to mode OneShot with source.tables (one Job exporting every table at one position); a Continuous export runs one Deployment per table"),
    validation = Rule::new("!has(self.split) || (self.mode == 'OneShot' && has(self.source.table) && !has(self.parallel) && !has(self.subset))").message("split applies to mode OneShot (a schedule too) of exactly one table (source.table), without parallel or subset"),
    validation = Rule::new("!has(self.split) || !has(self.split.workers) || !has(self.schedule)").message("split.workers does not apply with a schedule (a CronJob starts one Job, not its workers); a scheduled split export copies its ranges in the export pod (split without workers)"),
    validation = Rule::new("!has(self.split) || !has(self.split.workers) || has(self.destination.s3)").message("split.workers (ranges copied by worker pods) needs an S3 destination: pods share no volume; without workers the export pod copies the ranges itself"),
)]
pub struct ArchiveExportSpec {
    /// The PostgreSQL table(s) to export.
    pub source: ExportSource,
    /// Where the archive is written.
    pub destination: Location,
    /// Key prefix of the archive inside the store (default: `<schema>.<table>/`). With `tables`,
    /// each table is written under `<keyPrefix><schema>.<table>/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    #[x_kube(
        validation = Rule::new("self == '' || self.endsWith('/')").message("keyPrefix must end with '/'"),
        validation = Rule::new("!self.startsWith('/') && !self.contains('\\\\') && !self.matches('(^|/)[.][.]?(/|$)')").message("keyPrefix must not start with '/' nor hold a '.' or '..' segment or a backslash (the archive would leave the store's root)"),
    )]
    pub key_prefix: Option<String>,
    /// Archive format written (default: the exporter's, jsonl).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<Format>,
    /// `OneShot` (a Job, or a CronJob with `schedule`) or `Continuous` (a Deployment).
    pub mode: ExportMode,
    /// OneShot with `source.tables`: ONE Job (or CronJob) exports every table at one position
    /// (one snapshot they all share), copying up to this many tables at once. Unset: one Job
    /// per table, each at its own position.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub parallel: Option<u16>,
    /// Run OneShot exports on a schedule (a CronJob).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<Schedule>,
    /// Policy of the Continuous writer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continuous: Option<ContinuousPolicy>,
    /// Which epochs the archive keeps, in every mode: each run (or commit) prunes older epochs
    /// after its own manifest commit and deletes their objects. Default: keep everything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<Retention>,
    /// Stop creating runs (OneShot), suspend the CronJob, or scale the writer to zero (Continuous).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,
    /// Service account of the export pods (for workload identity to S3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub service_account_name: Option<String>,
    /// Resources of the export container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<super::common_pod::Resources>,
    /// Pod placement and metadata overrides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<super::common_pod::PodOverrides>,
    /// Seconds a finished OneShot Job is kept before Kubernetes removes it (default 86400).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 31536000))]
    pub ttl_seconds_after_finished: Option<i32>,
    /// Retries of a failed export pod (Job backoffLimit, default 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 20))]
    pub backoff_limit: Option<i32>,
    /// Column transforms applied by the exporter to every row before it is written (masked dev
    /// seeds, docs/masking.md): the rules of a `--transform` file, and the hash key from a
    /// Secret (never in the spec).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transform: Option<ExportTransform>,
    /// A subset that follows foreign keys (dev seeds, docs/subsetting.md): the roots, the
    /// relationships followed downward, virtual foreign keys, the nullable-key policy; the
    /// exporter computes the closure at the export's snapshot, and every table it reaches is
    /// exported with the rows kept. OneShot with `source.tables` and `parallel` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subset: Option<larch_contract::subset_spec::SubsetSpec>,
    /// One table's OneShot export cut into `ranges` ctid ranges copied at once from one
    /// snapshot into the epoch's one snapshot object: inside the export pod, or with
    /// `workers` by an Indexed Job of that many worker pods while the export pod (the
    /// coordinator) holds the snapshot and commits (docs/operator.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<ExportSplit>,
}

/// `spec.split`: how one table's OneShot export is cut and who copies its ranges.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.workers) || self.workers <= self.ranges").message("split.workers must not exceed split.ranges: each worker copies at least one range"))]
pub struct ExportSplit {
    /// Ranges the table is cut into (by its pages), each read over a connection of its own
    /// (`larch export --split`). Fewer when the table has fewer pages.
    #[schemars(range(min = 2, max = 64))]
    pub ranges: u16,
    /// Worker pods copying the ranges (an Indexed Job `<name>-<run>-workers`; worker `i`
    /// copies the ranges `r` with `r % workers == i`). Unset: the export pod copies every
    /// range itself. Needs an S3 destination.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub workers: Option<u16>,
}

/// `spec.transform`: per table (`schema.table`), `undeclared` and `columns` as in a
/// `--transform` file.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExportTransform {
    /// `schema.table` → `{undeclared: TRANSFORM, columns: {COLUMN: TRANSFORM}}`; a transform
    /// is keep, null, drop, hash or {redact: VALUE}.
    #[schemars(extend("maxProperties" = 256))]
    pub tables: std::collections::BTreeMap<String, larch_contract::transform_rules::TableRules>,
    /// The hash key (at least 16 bytes), needed when a rule hashes; mounted as a file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_secret_ref: Option<SecretKeyRef>,
    /// The tables' `where:` may use `EXISTS (SELECT …)` and `x IN (SELECT …)` into tables this
    /// export also exports (schema-qualified), reading only the columns those export unmasked
    /// (default false: no subquery).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub subqueries: bool,
    /// After each run (OneShot), look for every raw value of the masked columns in the archives
    /// written and record the result in their manifests (`transform.leak_check`, what
    /// `requireLeakCheck` asks for); raw values found fail the run with reason `LeakFound`
    /// (default false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub leak_check: bool,
    /// Refuse to export when the constraint preflight the export pods run at start finds a
    /// UNIQUE, CHECK, NOT NULL or FOREIGN KEY constraint the rules can break: the pod exits
    /// with reason `ConstraintsAtRisk` and writes nothing (default false: the export goes on
    /// and condition `Validated` names the constraints).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub require_validated: bool,
}

impl ExportTransform {
    /// The rules as the exporter reads them (`--transform-rules`).
    pub fn rules(&self) -> larch_contract::transform_rules::TransformRules {
        larch_contract::transform_rules::TransformRules {
            tables: self.tables.clone(),
            subqueries: self.subqueries,
        }
    }
}

/// How the export runs.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ExportMode {
    OneShot,
    Continuous,
}

/// Replication slot lifetime.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum SlotMode {
    Persistent,
    Temporary,
}

impl SlotMode {
    pub fn as_arg(self) -> &'static str {
        match self {
            SlotMode::Persistent => "persistent",
            SlotMode::Temporary => "temporary",
        }
    }
}

/// The PostgreSQL side of an export.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.table) != has(self.tables)").message("set exactly one of table or tables"),
    validation = Rule::new("!has(self.tables) || (!has(self.slotName) && !has(self.publicationName))").message("slotName and publicationName apply to a single table; with tables each export derives its own"),
    validation = Rule::new("has(self.table) == has(oldSelf.table) && (!has(self.table) || self.table == oldSelf.table) && has(self.tables) == has(oldSelf.tables) && (!has(self.tables) || self.tables == oldSelf.tables)").message("the exported table(s) are immutable: create a new ArchiveExport"),
)]
pub struct ExportSource {
    /// Secret key holding the PostgreSQL connection string (DSN). Mounted as a file, never logged.
    pub connection_secret_ref: SecretKeyRef,
    /// CA certificates for TLS to PostgreSQL, mounted at `/etc/larch/source-ca/ca.crt`: name
    /// that file in the connection string (`sslmode=verify-full
    /// sslrootcert=/etc/larch/source-ca/ca.crt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<CaBundleRef>,
    /// The table to export.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<TableRef>,
    /// Several tables: one Job (or CronJob, or Deployment) per table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 32))]
    #[x_kube(validation = Rule::new("self.all(t, self.exists_one(u, u == t))").message("tables must be distinct"))]
    pub tables: Option<Vec<TableRef>>,
    /// Key fields identifying a row (default: the primary key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 63)))]
    #[x_kube(validation = Rule::new("self.all(k, !k.contains(',') && !k.startsWith(' ') && !k.endsWith(' '))").message("key fields must not contain ',' nor start or end with a space (the exporter takes them as a comma-separated list)"))]
    pub key_fields: Option<Vec<String>>,
    /// Name of the logical replication slot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), pattern(r"^[a-z0-9_]+$"))]
    pub slot_name: Option<String>,
    /// Slot lifetime (`Persistent` or `Temporary`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot_mode: Option<SlotMode>,
    /// Name of the publication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub publication_name: Option<String>,
    /// What happens to the replication slot(s) and publication(s) larch created when the
    /// ArchiveExport is deleted: `Delete` (the default; a cleanup Job drops them before the
    /// object goes) or `Retain` (they stay on the source database).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_policy: Option<DeletionPolicy>,
    /// Timeouts of every session the export opens on the source database (default: 1m, 10s,
    /// 1m and 24h), so a stuck export cannot hold locks or a snapshot on a shared database.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_limits: Option<SessionLimits>,
}

/// Session timeouts on the source (passed to `larch export --statement-timeout`,
/// `--lock-timeout`, `--idle-in-transaction-timeout`, `--snapshot-max-age`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionLimits {
    /// `statement_timeout` of the catalog sessions (schema reads, slot and publication
    /// management; default `1m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), pattern(DURATION))]
    #[x_kube(validation = Rule::new(larch_core::duration::CRD_POSITIVE_RULE).message("statementTimeout must be a positive duration such as 30s, 1m30s or 1.5h"))]
    pub statement_timeout: Option<String>,
    /// `lock_timeout` of every session: a lock waited for longer fails the export instead of
    /// queueing the tenant's writes behind it (default `10s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), pattern(DURATION))]
    #[x_kube(validation = Rule::new(larch_core::duration::CRD_POSITIVE_RULE).message("lockTimeout must be a positive duration such as 5s, 500ms or 1m"))]
    pub lock_timeout: Option<String>,
    /// `idle_in_transaction_session_timeout` of the catalog sessions (default `1m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), pattern(DURATION))]
    #[x_kube(validation = Rule::new(larch_core::duration::CRD_POSITIVE_RULE).message("idleInTransactionTimeout must be a positive duration such as 30s, 1m30s or 1.5h"))]
    pub idle_in_transaction_timeout: Option<String>,
    /// The longest a baseline's snapshot may stay open, from its export to the last COPY's end
    /// (`24h`, `2d`; default `24h`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), pattern(larch_core::duration::CRD_AGE_PATTERN))]
    #[x_kube(validation = Rule::new(larch_core::duration::CRD_AGE_RULE).message("snapshotMaxAge must be whole days (2d, at most 106751d) or a positive duration such as 36h or 90m"))]
    pub snapshot_max_age: Option<String>,
}

/// The fate of the source-side objects on delete.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum DeletionPolicy {
    Delete,
    Retain,
}

/// Retention of archive epochs (passed to `larch export --keep-epochs/--max-age`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Retention {
    /// Keep this many newest epochs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub keep_epochs: Option<i32>,
    /// Delete epochs that ended longer ago than this (`7d`, `36h`, `90m`): every position of
    /// the last maxAge stays reconstructable; the current epoch is always kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), pattern(larch_core::duration::CRD_AGE_PATTERN))]
    #[x_kube(validation = Rule::new(larch_core::duration::CRD_AGE_RULE).message("maxAge must be whole days (7d, at most 106751d) or a positive duration such as 36h or 90m"))]
    pub max_age: Option<String>,
}

impl ExportSource {
    /// The exported tables, in spec order.
    pub fn all_tables(&self) -> Vec<TableRef> {
        match (&self.table, &self.tables) {
            (Some(t), _) => vec![t.clone()],
            (None, Some(ts)) => ts.clone(),
            (None, None) => vec![],
        }
    }
}

/// Concurrency of scheduled runs.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ConcurrencyPolicy {
    Forbid,
    Replace,
}

/// A schedule of OneShot exports (a CronJob).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Schedule {
    /// Standard 5-field cron expression (`0 2 * * *`) or a macro (`@daily`).
    #[schemars(length(min = 1, max = 128))]
    #[x_kube(
        validation = Rule::new("self.matches('^(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|[^ ]+( +[^ ]+){4})$')").message("cron must have 5 fields (minute hour day-of-month month day-of-week) or be a macro such as @daily"),
        validation = Rule::new("!self.contains('TZ=')").message("set the time zone with timeZone, not in cron"),
    )]
    pub cron: String,
    /// IANA time zone of the schedule (e.g. `Europe/Berlin`; default: the controller manager's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub time_zone: Option<String>,
    /// Suspend the schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,
    /// `Forbid` (default) skips a run while the previous one is still going; `Replace` stops it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_policy: Option<ConcurrencyPolicy>,
    /// Finished Jobs kept (default 3 successful, 3 failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub successful_jobs_history_limit: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub failed_jobs_history_limit: Option<i32>,
}

/// Durations: Go's grammar, as the CEL rules' `duration()` reads it (see `larch_core::duration`).
const DURATION: &str = larch_core::duration::CRD_PATTERN;
const FRACTION: &str = r"^(0(\.[0-9]{1,6})?|1(\.0{1,6})?)$";
const QUANTITY: &str = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$";

/// Policy knobs of a Continuous export (passed to `larch export --follow`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.minInterval) || !has(self.maxInterval) || duration(self.minInterval) <= duration(self.maxInterval)").message("minInterval must not exceed maxInterval"))]
pub struct ContinuousPolicy {
    /// How often buffered changes are written as a diff (default `30s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), pattern(DURATION))]
    #[x_kube(validation = Rule::new(larch_core::duration::CRD_POSITIVE_RULE).message("diffInterval must be a positive duration such as 30s, 1m30s or 1.5h"))]
    pub diff_interval: Option<String>,
    /// Never write diffs more often than this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), pattern(DURATION))]
    #[x_kube(validation = Rule::new(larch_core::duration::CRD_POSITIVE_RULE).message("minInterval must be a positive duration such as 30s, 1m30s or 1.5h"))]
    pub min_interval: Option<String>,
    /// Write a diff at least this often, even if small.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), pattern(DURATION))]
    #[x_kube(validation = Rule::new(larch_core::duration::CRD_POSITIVE_RULE).message("maxInterval must be a positive duration such as 30s, 1m30s or 1.5h"))]
    pub max_interval: Option<String>,
    /// Write a diff once the buffer reaches this many bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_diff_bytes: Option<i64>,
    /// Start a new epoch (a fresh snapshot) once diffs reach this fraction of the snapshot (0..1, as a string).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 8), pattern(FRACTION))]
    pub max_diff_fraction: Option<String>,
    /// Start a new epoch after this many changed records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_churn_records: Option<i64>,
    /// Start a new epoch once changed records reach this fraction of the table (0..1, as a string).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 8), pattern(FRACTION))]
    pub max_churn_fraction: Option<String>,
    /// Deprecated: use `retention.keepEpochs` (same meaning, every mode). Still honoured
    /// when `retention.keepEpochs` is not set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub keep_epochs: Option<i32>,
    /// Memory for buffered changes (the transaction being received and those waiting for the
    /// next diff) before they spill to the spill volume, e.g. `256Mi`. Default: a quarter of
    /// the container's memory limit (16Mi to 1Gi), else 64Mi.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 32), pattern(QUANTITY))]
    pub buffer_memory: Option<String>,
    /// Size of the spill volume (an emptyDir with this `sizeLimit`), default `8Gi`. The exporter
    /// stops with an error naming the limit at 90% of it, before the kubelet would evict the
    /// pod; a transaction needs about a quarter of its size as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 32), pattern(QUANTITY))]
    pub spill_size: Option<String>,
}

/// Observed state of an ArchiveExport.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ArchiveExportStatus {
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`, `Reconciling`, `Stalled`, `LastExportSucceeded`.
    #[serde(default)]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
    /// The current (or last) OneShot run; recorded when its Jobs are created, so a Job removed by
    /// its TTL is never run again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<RunStatus>,
    /// The most recent successful export (any table).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_export: Option<ExportSummary>,
    /// The last successful export of each table.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub tables: Vec<ExportSummary>,
    /// Continuous writers as reported by their `/status` endpoint (while suspended: the last
    /// report, with the slot's WAL from the slot monitor).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub writers: Vec<WriterStatus>,
    /// The cleanup of the source database on delete (`deletionPolicy: Delete`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleanup: Option<CleanupStatus>,
    /// The baseline (or compaction) the export's pods are writing, from their `/status`, summed
    /// over the tables of the run; `Complete` or `Failed` once the run ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<OperationProgress>,
    /// The current (or last) run's split across worker pods (`spec.split.workers`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<SplitStatus>,
}

/// `status.split`: the worker pods of a split run, from its workers Job.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SplitStatus {
    /// Ranges the table is cut into.
    pub ranges: i32,
    /// Worker pods (indexes) of the run.
    pub workers: i32,
    /// Workers (indexes) that finished their ranges.
    pub workers_succeeded: i32,
    /// Worker indexes that failed for good (their retries exhausted), as the Job lists them
    /// (`1,3`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub failed_indexes: Option<String>,
}

/// Progress of the cleanup Job run when the ArchiveExport is deleted.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CleanupStatus {
    /// Cleanup Jobs started so far.
    #[serde(default)]
    pub attempts: i32,
    /// When the current (or last) attempt started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub last_attempt_time: Option<String>,
    /// The error of the last failed attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    pub last_error: Option<String>,
    /// No new attempt before this time (backoff after a failure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub next_attempt_time: Option<String>,
}

/// A OneShot run.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunStatus {
    /// Identity of the run: a hash of the spec and the run-requested token.
    #[schemars(length(max = 16))]
    pub id: String,
    /// The `larch.dev/run-requested` token that requested it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub token: Option<String>,
    /// When the run's Jobs were created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub start_time: Option<String>,
    /// When every Job of the run finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub completion_time: Option<String>,
    /// Whether every Job succeeded (set once finished).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub succeeded: Option<bool>,
}

/// The summary a OneShot export writes to its termination message.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExportSummary {
    /// `schema.table`
    #[schemars(length(max = 128))]
    pub table: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub key_prefix: Option<String>,
    /// Source position (LSN) the export is consistent at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub position: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub row_count: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<i64>,
    /// When the export finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub time: Option<String>,
    /// The pod that reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub pod: Option<String>,
}

/// A Continuous writer's `/status`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WriterStatus {
    #[schemars(length(max = 128))]
    pub table: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub head_position: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffer_depth: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub last_snapshot_at: Option<String>,
    /// The writer's replication slot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub slot: Option<String>,
    /// WAL the source keeps for the slot (`pg_current_wal_lsn() - restart_lsn`), bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retained_wal_bytes: Option<i64>,
    /// WAL the writer has not confirmed (`pg_current_wal_lsn() - confirmed_flush_lsn`), bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_bytes: Option<i64>,
    /// `pg_replication_slots.wal_status`: reserved, extended, unreserved (at risk) or lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub wal_status: Option<String>,
    /// Times the writer found its slot lost (invalidated or dropped) and took a new baseline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot_losses: Option<i64>,
    /// Why the slot was last lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub last_slot_loss: Option<String>,
    /// Suspended: the WAL the slot held when the writer stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retained_wal_bytes_at_suspension: Option<i64>,
    /// When the slot figures were read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub slot_observed_at: Option<String>,
    /// What can be restored from the table's archive: its oldest snapshot to its head.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restorable: Option<RestorableWindow>,
}

/// The restorable window of one table's archive (CloudNativePG's first recoverability point to
/// the head): positions, and commit times where the archive records them.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestorableWindow {
    #[schemars(length(max = 64))]
    pub earliest_position: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub earliest_time: Option<String>,
    #[schemars(length(max = 64))]
    pub latest_position: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub latest_time: Option<String>,
}
