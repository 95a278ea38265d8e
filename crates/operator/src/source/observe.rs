//! Parsers for what the operator reads from the engines: their `/status` and `/metrics`. Pure;
//! the reconcile fetches, these interpret. Malformed input yields `None`, never a panic.

use serde::Deserialize;

use crate::reconcile::progress::{Behind, combine};
use larch_core::progress::ProgressReport;

/// One source in an engine's `/status`.
#[derive(Deserialize, Debug, Clone, Default, PartialEq)]
pub struct EngineSource {
    #[serde(default)]
    pub state: Option<String>,
    #[serde(default)]
    pub position: Option<String>,
    #[serde(default)]
    pub head: Option<String>,
    #[serde(default)]
    pub epoch: Option<i64>,
    #[serde(default)]
    pub lag_seconds: Option<f64>,
    /// When the head was written (RFC 3339 UTC).
    #[serde(default)]
    pub head_time: Option<String>,
    #[serde(default)]
    pub rebaselines: Option<i64>,
    #[serde(default)]
    pub rows: Option<i64>,
    /// Present while the engine sits at the end of a diff chain that stops before the head.
    #[serde(default)]
    pub short_chain: Option<EngineShortChain>,
    /// Present when the source is pinned at a point in time (`at`).
    #[serde(default)]
    pub at: Option<crate::crd::archive_source::RestoredPoint>,
    /// Distance behind the head (0 when caught up); absent from engines before it existed.
    #[serde(default)]
    pub behind: Option<Behind>,
}

/// An engine's report of a diff chain that stops before the archive's head.
#[derive(Deserialize, Debug, Clone, Default, PartialEq)]
pub struct EngineShortChain {
    #[serde(default)]
    pub reached: String,
    #[serde(default)]
    pub head: String,
    #[serde(default)]
    pub reason: String,
}

#[derive(Deserialize, Debug)]
struct EngineStatusJson {
    #[serde(default)]
    sources: std::collections::BTreeMap<String, EngineSource>,
    #[serde(default)]
    pipelines: std::collections::BTreeMap<String, PipelineJson>,
}

#[derive(Deserialize, Debug, Default)]
struct PipelineJson {
    #[serde(default)]
    source: String,
    #[serde(default)]
    row_count: Option<i64>,
    #[serde(default)]
    baseline_progress: Option<ProgressReport>,
}

/// One engine's baseline load for source `id`: its sources' `baseline_progress` (each source's
/// pipelines report the same load, so one per source), combined over a group's members.
pub fn parse_engine_progress(body: &str, id: &str) -> Option<ProgressReport> {
    let s: EngineStatusJson = serde_json::from_str(body).ok()?;
    let mut by_source = std::collections::BTreeMap::new();
    for p in s.pipelines.into_values() {
        if is_member(&p.source, id)
            && let Some(r) = p.baseline_progress
        {
            by_source.entry(p.source).or_insert(r);
        }
    }
    combine(&by_source.into_values().collect::<Vec<_>>())
}

/// Rows held by one engine for source `id`: the sum of its pipelines' `row_count`.
pub fn parse_engine_rows(body: &str, id: &str) -> Option<i64> {
    let s: EngineStatusJson = serde_json::from_str(body).ok()?;
    let rows: Vec<i64> = s
        .pipelines
        .values()
        .filter(|p| is_member(&p.source, id))
        .filter_map(|p| p.row_count)
        .collect();
    (!rows.is_empty()).then(|| rows.iter().sum())
}

/// Whether an engine source id belongs to the ArchiveSource whose source id is `id` (itself, or
/// a member `<id>/<schema>.<table>` of its group).
pub fn is_member(source: &str, id: &str) -> bool {
    source == id
        || source
            .strip_prefix(id)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// Parses an engine's `/status` and returns the entries of source `id` (one, or one per group
/// member). `None` when the body is not a status document.
pub fn parse_engine_status(body: &str, id: &str) -> Option<Vec<EngineSource>> {
    let s: EngineStatusJson = serde_json::from_str(body).ok()?;
    Some(
        s.sources
            .into_iter()
            .filter(|(k, _)| is_member(k, id))
            .map(|(_, v)| v)
            .collect(),
    )
}
