//! `ArchiveSource`: an archive replayed into a live engine (`larch engine`) running as a
//! StatefulSet, with a ConfigMap (the engine config) and a Service.

use k8s_openapi::api::networking::v1::NetworkPolicyPeer;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{
    CaBundleRef, Condition, Format, Location, SecretKeyRef, TableRef, conditions_schema,
};
use super::common_pod::{PodOverrides, Resources};
use super::progress::{OperationProgress, SourceLag};

/// Desired state of an ArchiveSource.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "larch.dev",
    version = "v1alpha1",
    kind = "ArchiveSource",
    namespaced,
    status = "ArchiveSourceStatus",
    shortname = "asrc",
    category = "archives",
    doc = "Replays a laredo-compatible archive into a live engine (in-memory tables or PostgreSQL).",
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Position", type_ = "string", json_path = ".status.position"),
    printcolumn(name = "Lag", type_ = "string", json_path = ".status.lag.summary"),
    printcolumn(name = "Data Age", type_ = "date", json_path = ".status.headTime"),
    printcolumn(name = "Progress", type_ = "string", json_path = ".status.progress.percent"),
    printcolumn(name = "Rebaselines", type_ = "integer", json_path = ".status.rebaselines.total"),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".status.readyReplicas", priority = 1),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    selectable = ".spec.archive.exportRef.name",
    validation = Rule::new("size(self.metadata.name) <= 40").message("name must be at most 40 characters (child names append a suffix)"),
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.table) || !has(self.tables)").message("set at most one of table or tables"),
    validation = Rule::new("has(self.archive.exportRef) || has(self.table) || has(self.tables)").message("with an explicit location, set table or tables"),
    validation = Rule::new("has(self.state) == has(oldSelf.state) && (!has(self.state) || self.state == oldSelf.state)").message("state is immutable (StatefulSet volumeClaimTemplates)"),
    validation = Rule::new("!has(self.at) || !has(self.follow) || !self.follow").message("at serves the table as it was at a point in time and never follows the archive: remove follow: true (or at)"),
)]
pub struct ArchiveSourceSpec {
    /// The archive to replay.
    pub archive: ArchiveRef,
    /// The table (default with exportRef: the export's table).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<TableRef>,
    /// Several tables read as one group from the archive's key prefix (default with exportRef: the
    /// export's tables).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 32))]
    pub tables: Option<Vec<TableRef>>,
    /// Key fields identifying a row (default with exportRef: the export's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 63)))]
    pub key_fields: Option<Vec<String>>,
    /// Keep polling the archive for new diffs (default true; false with `at`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follow: Option<bool>,
    /// Serve the table as it was at a point in time (a position, or the last transaction
    /// committed at or before a time) instead of following the archive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<PointInTimeSpec>,
    /// Refuse an archive whose manifest does not record a masking transform covering every
    /// column it serves (each named in the rules or masked by `undeclared`), checked again at
    /// each new epoch (a dev seed must never load raw production rows; docs/masking.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_transformed: Option<bool>,
    /// With `requireTransformed`: also refuse an archive whose manifest records no passed
    /// `larch archive leak-check` at its epoch and head (docs/masking.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_leak_check: Option<bool>,
    /// How often the archive is polled when following (e.g. `5s`, `1m30s`; Go duration syntax).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), pattern(larch_core::duration::CRD_PATTERN))]
    #[x_kube(validation = Rule::new(larch_core::duration::CRD_POSITIVE_RULE).message("pollInterval must be a positive duration such as 5s, 500ms or 1m30s"))]
    pub poll_interval: Option<String>,
    /// Where rows go.
    pub target: Target,
    /// Resume state on a PersistentVolumeClaim per replica; without it, replicas start from the
    /// latest snapshot after every restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<StateVolume>,
    /// Engine replicas (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub replicas: Option<i32>,
    /// Re-baseline alerting thresholds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebaseline: Option<RebaselinePolicy>,
    /// Scale the engine to zero.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,
    /// Service account of the engine pods (for workload identity to S3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub service_account_name: Option<String>,
    /// Resources of the engine container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    /// Pod placement and metadata overrides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodOverrides>,
    /// Who may use the engine's HTTP API (default: reads open, pause/resume refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<EngineAccess>,
    /// A NetworkPolicy admitting only the operator's probes and the listed clients to the
    /// engines (default: the operator's `--network-policies` setting, the chart's
    /// `networkPolicy.enabled`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<EngineNetworkPolicy>,
}

/// A point in time: exactly one of `position` or `time`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.position) != has(self.time)").message("set exactly one of position or time"))]
pub struct PointInTimeSpec {
    /// A WAL position (LSN), e.g. `16/B374D848`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 3, max = 17),
        pattern(r"^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$")
    )]
    pub position: Option<String>,
    /// An RFC 3339 time, e.g. `2026-11-30T14:00:00Z`: the state after the last transaction
    /// committed at or before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 20, max = 64))]
    #[x_kube(validation = Rule::new("self.matches('^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}([.][0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})$')").message("time must be an RFC 3339 time such as 2026-11-30T14:00:00Z"))]
    pub time: Option<String>,
}

impl PointInTimeSpec {
    /// The point as the engine's `at` option spells it.
    pub fn value(&self) -> Option<&str> {
        self.position.as_deref().or(self.time.as_deref())
    }
}

/// Access control of the engine's HTTP API. `/health/*` (probes) is always open; `/status`
/// and `/metrics` (no row data) need the token when reads are protected (the operator sends
/// it).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.tokenSecretRef) || !has(self.generateToken) || self.generateToken || !((has(self.control) && self.control) || (has(self.protectReads) && self.protectReads))").message("control and protectReads need a token: tokenSecretRef, or generateToken not false"))]
pub struct EngineAccess {
    /// Secret key holding the API bearer token (at least 16 printable characters), mounted as
    /// a file; clients send `Authorization: Bearer <token>`. A new token takes effect when the
    /// engine pods restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_secret_ref: Option<SecretKeyRef>,
    /// Without `tokenSecretRef`: the operator generates a random token into the Secret
    /// `<source>-engine-token` (key `token`, owned by the source) and, unless `protectReads`
    /// says false, the tables API needs it (default true; false: no token, reads open).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generate_token: Option<bool>,
    /// Serve `POST /sources/{id}/pause` and `/resume`, behind the token (default false: refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control: Option<bool>,
    /// Require the token for the tables API (`/tables…`, row data), `/status` and `/metrics`
    /// too (default: true with a generated token, false with `tokenSecretRef`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protect_reads: Option<bool>,
    /// Serve the API over TLS on port 8443 (`https`) with the certificate of this
    /// `kubernetes.io/tls` Secret (`tls.crt`, `tls.key`); port 8080 then serves only
    /// `/health/*`, `/status` and `/metrics`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<EngineTls>,
}

/// The TLS listener's certificate.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EngineTls {
    /// A `kubernetes.io/tls` Secret of this namespace (keys `tls.crt` and `tls.key`), e.g.
    /// one cert-manager issues.
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
}

/// Up to 32 NetworkPolicyPeers, free-form (as `spec.pod.affinity`; validated by the operator).
fn peers_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "maxItems": 32,
        "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
    })
}

impl EngineNetworkPolicy {
    /// `from` as NetworkPolicy peers (free-form in the schema, checked by
    /// [`crate::validate`]: an entry that is no peer names itself there).
    pub fn peers(&self) -> Result<Vec<NetworkPolicyPeer>, String> {
        self.from
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, v)| {
                let field = format!("spec.networkPolicy.from[{i}]");
                let peer: NetworkPolicyPeer = serde_json::from_value(v.clone())
                    .map_err(|e| format!("{field} is not a NetworkPolicyPeer: {e}"))?;
                if peer.pod_selector.is_none()
                    && peer.namespace_selector.is_none()
                    && peer.ip_block.is_none()
                {
                    return Err(format!(
                        "{field} names no peer: set podSelector, namespaceSelector or ipBlock"
                    ));
                }
                Ok(peer)
            })
            .collect()
    }
}

/// The engines' NetworkPolicy (ingress only: egress to the archive store and a target
/// database is left to the namespace's own policies; see docs/operator.md).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EngineNetworkPolicy {
    /// Generate the policy (default: the operator's setting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Who else may reach the API ports (8080, and 8443 with TLS): NetworkPolicy peers
    /// (`podSelector`, `namespaceSelector`, `ipBlock`). The operator's namespace is always
    /// admitted to port 8080 (its probes read `/status`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "peers_schema")]
    pub from: Option<Vec<serde_json::Value>>,
}

/// The archive: an ArchiveExport of this namespace, or an explicit location.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.exportRef) != (has(self.s3) || has(self.volume))").message("set exactly one of exportRef or a location (s3 or volume)"),
    validation = Rule::new("!(has(self.s3) && has(self.volume))").message("set at most one of s3 or volume"),
    validation = Rule::new("!has(self.volume) || has(self.volume.claimName)").message("an archive volume must name an existing claim (claimName)"),
    validation = Rule::new("!has(self.exportRef) || (!has(self.keyPrefix) && !has(self.formats))").message("with exportRef, keyPrefix and formats come from the ArchiveExport"),
)]
pub struct ArchiveRef {
    /// An ArchiveExport in the same namespace: location, key prefix and format are taken from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub export_ref: Option<ExportRef>,
    /// An S3 bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<super::common::S3Location>,
    /// An existing PersistentVolumeClaim (local store), mounted read-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<super::common::VolumeLocation>,
    /// Key prefix of the archive (with `tables`: the prefix holding `<schema>.<table>/` archives).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    #[x_kube(
        validation = Rule::new("self == '' || self.endsWith('/')").message("keyPrefix must end with '/'"),
        validation = Rule::new("!self.startsWith('/') && !self.contains('\\\\') && !self.matches('(^|/)[.][.]?(/|$)')").message("keyPrefix must not start with '/' nor hold a '.' or '..' segment or a backslash (the archive would leave the store's root)"),
    )]
    pub key_prefix: Option<String>,
    /// Formats to read, tried in order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 3))]
    pub formats: Option<Vec<Format>>,
}

impl ArchiveRef {
    /// The explicit location, if any.
    pub fn location(&self) -> Option<Location> {
        if self.s3.is_none() && self.volume.is_none() {
            return None;
        }
        Some(Location {
            s3: self.s3.clone(),
            volume: self.volume.clone(),
        })
    }
}

/// A reference to an ArchiveExport in the same namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExportRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Where the engine writes rows: exactly one of memory or postgres.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.memory) != has(self.postgres)").message("set exactly one of memory or postgres"))]
pub struct Target {
    /// In-memory tables served over HTTP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryTarget>,
    /// A PostgreSQL database.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgres: Option<PostgresTarget>,
}

/// In-memory target.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemoryTarget {
    /// Secondary index fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 63)))]
    pub index_fields: Option<Vec<String>>,
}

/// PostgreSQL target.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PostgresTarget {
    /// Secret key holding the target's connection string (DSN), mounted as a file.
    pub connection_secret_ref: SecretKeyRef,
    /// CA certificates for TLS to the target, mounted at `/etc/larch/target-ca/ca.crt`: name
    /// that file in the connection string (`sslmode=verify-full
    /// sslrootcert=/etc/larch/target-ca/ca.crt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<CaBundleRef>,
    /// Destination schema (default: the source table's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub schema: Option<String>,
    /// Destination table (default: the source table's; single table only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub table: Option<String>,
    /// COPY streams a baseline loads over, each its own connection to the target (default 1).
    /// Count them against the target's `max_connections`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 16))]
    pub split: Option<u16>,
}

/// Per-replica state volume (StatefulSet volumeClaimTemplates).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StateVolume {
    /// Size of each replica's claim (e.g. `1Gi`).
    #[schemars(
        length(min = 1, max = 32),
        pattern(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
    )]
    pub size: String,
    /// Storage class (cluster default when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub storage_class_name: Option<String>,
}

/// Re-baseline thresholds.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RebaselinePolicy {
    /// More re-baselines than this within an hour sets `Degraded=True` (reason FrequentRebaselines). Default 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub max_per_hour: Option<i32>,
}

/// Observed state of an ArchiveSource.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ArchiveSourceStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`, `Reconciling`, `Stalled`, `CaughtUp`, `Rebaselining`, `Degraded`.
    #[serde(default)]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// Position applied by the engine (lowest across replicas).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub position: Option<String>,
    /// Head of the archive as seen by the engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub head: Option<String>,
    /// When the archive's head was last written (its manifest's `updated_at`, the newest any
    /// engine has read), RFC 3339. A time, not an age, so status changes only when the head
    /// does; `kubectl get` shows its age as DATA AGE (it grows on an archive nobody writes: the
    /// age of the data, not a lag; see `lag`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub head_time: Option<String>,
    /// Rows held by the engine, where reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<i64>,
    /// Re-baselines observed from the engines' `/status` (`rebaselines`, the counter behind
    /// `laredo_source_rebaseline_total`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebaselines: Option<RebaselineStatus>,
    /// Distance behind the archive's head (the engine furthest behind): 0 when caught up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag: Option<SourceLag>,
    /// The engines' baseline load (the engine furthest behind), from their `/status`;
    /// `Complete` once every engine loaded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<OperationProgress>,
    /// With `spec.at`: the point the engines actually serve (from their `/status`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored: Option<RestoredPoint>,
}

/// The point in time an engine serves.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoredPoint {
    /// The position of the state served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub position: Option<String>,
    /// The commit time of that state (RFC 3339), when the archive records it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub time: Option<String>,
    /// `transaction` (exactly the state at the point asked for) or `diff` (the end of the last
    /// diff before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub precision: Option<String>,
    /// Set when the point asked for is past the archive's head (the head is served).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub notice: Option<String>,
}

/// Re-baseline counters.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RebaselineStatus {
    /// Re-baselines seen since the source was created (sum of increases over all pods).
    pub total: i64,
    /// When the last one was observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub last_time: Option<String>,
}
