//! Status fields both ArchiveExport and ArchiveSource carry: `progress` (a long operation of
//! their pods, read from `/status`) and, for an ArchiveSource, `lag` (distance behind the
//! archive's head).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `status.progress`: the long operation of the pods (an export's baseline or compaction, an
/// engine's baseline load), as their `/status` reports it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OperationProgress {
    /// `Copying` (an export's baseline from PostgreSQL), `Compacting` (an export folding its
    /// archive into a new epoch), `Loading` (an engine's baseline), `Restoring` (an
    /// ArchiveRestore's tables into PostgreSQL), then `Complete` or `Failed` once the operation
    /// ended.
    #[schemars(length(max = 16))]
    pub phase: String,
    /// Rows copied (or loaded) so far.
    pub rows: i64,
    /// Rows expected in all: the catalog's estimate (`pg_class.reltuples`) for an export's
    /// baseline, the manifest's `row_count` for an engine, a compaction or a restore. Absent
    /// when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_rows: Option<i64>,
    /// Bytes read so far (the rows' JSON text), where the operation counts them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<i64>,
    /// Rows a second over the operation so far (rounded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows_per_second: Option<i64>,
    /// Seconds left at that rate (rounded); absent without an expected total.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_seconds: Option<i64>,
    /// `rows / expectedRows` as text for the `Progress` printer column (`42%`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 8))]
    pub percent: Option<String>,
    /// How many pods' operations the figures add up (export: one per table being copied) or
    /// stand for (ArchiveSource: the engine furthest behind of this many).
    pub pods: i32,
    /// When the figures last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub updated_time: Option<String>,
}

/// `status.lag` of an ArchiveSource: how far its engines are behind the archive's head, from
/// their `/status` `behind` (the engine furthest behind); all 0 when caught up. The age of the
/// data served is `status.headTime`, not a lag.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SourceLag {
    /// Diffs between the engine's position and the head not yet applied.
    pub diffs: i64,
    /// Their bytes.
    pub bytes: i64,
    /// How long the oldest of them has waited, whole seconds.
    pub seconds: i64,
    /// The three as text for the `Lag` printer column: `0` when caught up, else e.g.
    /// `2 diffs, 4.0 KiB, 12s`.
    #[schemars(length(max = 64))]
    pub summary: String,
}
