//! `ArchiveRestore`: tables of an archive restored once into a PostgreSQL database by a Job
//! running `larch restore` (docs/restore.md), followed to completion. A kind of its own, not a
//! mode of ArchiveSource: a source is a long-running engine (a StatefulSet, readiness, lag), a
//! restore is a run that ends (a Job, an outcome, a summary) and is re-run by annotation, as a
//! OneShot ArchiveExport is.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::archive_export::RunStatus;
use super::archive_source::ArchiveRef;
use super::common::{CaBundleRef, Condition, SecretKeyRef, TableRef, conditions_schema};
use super::common_pod::{PodOverrides, Resources};
use super::progress::OperationProgress;

/// Set to a new value (a timestamp, say) to run the restore again, as for ArchiveExports.
pub use super::archive_export::RUN_REQUESTED_ANNOTATION;

/// On an ArchiveRestore an ArchiveSourceSet stamped: set to a new value to refresh that
/// namespace's seed once (the set turns it into a new run-requested token).
pub const REFRESH_REQUESTED_ANNOTATION: &str = "larch.dev/refresh-requested";

/// Desired state of an ArchiveRestore.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "larch.dev",
    version = "v1alpha1",
    kind = "ArchiveRestore",
    namespaced,
    status = "ArchiveRestoreStatus",
    shortname = "arst",
    category = "archives",
    doc = "Restores tables of a laredo-compatible archive into a PostgreSQL database, once (a Job running `larch restore`).",
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Position", type_ = "string", json_path = ".status.position"),
    printcolumn(name = "Progress", type_ = "string", json_path = ".status.progress.percent"),
    printcolumn(name = "Completed", type_ = "date", json_path = ".status.run.completionTime"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("size(self.metadata.name) <= 40").message("name must be at most 40 characters (child names append a suffix)"),
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.archive.exportRef) || has(self.tables)").message("with an explicit location, set tables"),
)]
pub struct ArchiveRestoreSpec {
    /// The archive: an ArchiveExport of this namespace (its store and tables), or a location.
    pub archive: ArchiveRef,
    /// The tables to restore, at one point (default with exportRef: every table of the export).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 32))]
    pub tables: Option<Vec<TableRef>>,
    /// The point to restore at (default: the head; several tables: the greatest position every
    /// table reaches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<RestorePoint>,
    /// The PostgreSQL database the tables are restored into.
    pub target: RestoreTarget,
    /// A destination table that exists: `Fail` (the default; nothing is restored) or `Replace`
    /// (its rows, keeping its definition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub if_exists: Option<IfExists>,
    /// COPY streams per table the restore creates, each over its own connection (default 1;
    /// a table that exists loads over one stream). docs/restore.md, "Split restore".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 16))]
    pub split: Option<u16>,
    /// Retries of the Job's pod (default 2); a failure no retry fixes fails at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 10))]
    pub backoff_limit: Option<i32>,
    /// Service account of the restore pod (for workload identity to S3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub service_account_name: Option<String>,
    /// Resources of the restore container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    /// Pod placement and metadata overrides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodOverrides>,
}

/// A point in the archive: exactly one of a position or a time, passed to `larch restore --at`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.position) != has(self.time)").message("set exactly one of position or time"))]
pub struct RestorePoint {
    /// A position (WAL LSN such as `0/16B3748`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub position: Option<String>,
    /// A time (RFC 3339, e.g. `2026-11-30T14:00:00Z`), where larch reads commit times.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub time: Option<String>,
}

impl RestorePoint {
    /// The `--at` value.
    pub fn arg(&self) -> Option<&str> {
        self.position.as_deref().or(self.time.as_deref())
    }
}

/// The destination database.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoreTarget {
    /// PostgreSQL database.
    pub postgres: RestorePostgres,
}

/// The destination PostgreSQL database.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestorePostgres {
    /// Secret key holding the database's connection string (DSN), mounted as a file.
    pub connection_secret_ref: SecretKeyRef,
    /// CA certificates for TLS to the database, mounted at `/etc/larch/target-ca/ca.crt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<CaBundleRef>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum IfExists {
    Fail,
    Replace,
}

impl IfExists {
    pub fn arg(self) -> &'static str {
        match self {
            IfExists::Fail => "fail",
            IfExists::Replace => "replace",
        }
    }
}

/// Observed state of an ArchiveRestore.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ArchiveRestoreStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` (the last run completed), `Reconciling` (a run in progress), `Stalled`.
    #[serde(default)]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
    /// The current (or last) run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<RunStatus>,
    /// The point the last successful run restored at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub position: Option<String>,
    /// `spec.at` of that run, as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub at: Option<String>,
    /// Its duration in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_seconds: Option<f64>,
    /// Its tables.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub tables: Vec<RestoredTable>,
    /// The current run waits for its database (refused connection, no such database or role
    /// yet): it is tried again, with backoff, until the database is up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database_wait: Option<DatabaseWait>,
    /// The run's rows copied so far, from its pod's `/status` (every table's, against their
    /// snapshots' row counts); `Complete` or `Failed` once the run ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<OperationProgress>,
}

/// A run waiting for its database.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseWait {
    /// Attempts that found the database unavailable.
    pub attempts: i32,
    /// When the next attempt's Job is created.
    #[schemars(length(max = 64))]
    pub next_attempt_time: String,
    /// Why the last attempt failed (`ConnectionFailed`, `DatabaseNotFound`, `AuthenticationFailed`).
    #[serde(default)]
    #[schemars(length(max = 64))]
    pub reason: String,
    /// What the last attempt said (credentials masked).
    #[serde(default)]
    #[schemars(length(max = 1024))]
    pub error: String,
}

/// One table of a restore's summary (`larch restore`'s JSON).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoredTable {
    /// `schema.table`
    #[schemars(length(max = 128))]
    pub table: String,
    pub rows: i64,
    /// The position its rows are at.
    #[schemars(length(max = 64))]
    pub position: String,
    /// When the last artifact restored was written to the archive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub archived_at: Option<String>,
    /// `created` or `replaced`.
    #[schemars(length(max = 16))]
    pub action: String,
}
