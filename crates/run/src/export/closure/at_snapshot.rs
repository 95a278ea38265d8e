//! The closure of an export: resolved before the snapshot (its tables join the set), computed
//! in a session of the export's snapshot, and the COPY of each table run over that session.
//!
//! Why the copies share the closure's session: the kept rows live in temporary tables, which
//! only their session sees. Writing them to ordinary tables instead would need write access to
//! the source and leave tables behind after a crash; so a subset's tables copy one at a time
//! (a subset is small by design) while every archive still uploads concurrently.

use std::collections::BTreeMap;

use anyhow::Context;
use larch_archive::masking::{ClosureRecord, ClosureRelationship};
use larch_archive::model::TableId;
use larch_contract::subset_spec::SubsetSpec;
use larch_postgres::{PostgresSource, SharedSnapshot};

use super::rounds::{self, ClosureReport};
use super::{ClosurePlan, resolve};
use crate::export::transform::Masking;

/// A subset to compute at the export's snapshot.
pub struct ClosureExport {
    pub spec: SubsetSpec,
    pub plan: ClosurePlan,
}

/// A catalog session on `dsn` (its TLS as it says; read only).
pub async fn connect(dsn: &str) -> anyhow::Result<tokio_postgres::Client> {
    let config = larch_postgres::PostgresConfig::new(dsn.to_string(), vec![], "", "");
    larch_postgres::connect(&config, larch_postgres::Session::Catalog)
        .await
        .context("connecting to read the subset's foreign keys")
}

/// Resolves `spec` on the source at `dsn`: the plan, whose tables the export must cover.
pub async fn plan(dsn: &str, spec: SubsetSpec, named: &[TableId]) -> anyhow::Result<ClosureExport> {
    let client = connect(dsn).await?;
    let plan = resolve(&client, &spec, named).await?;
    Ok(ClosureExport { spec, plan })
}

/// The seed of the closure's samples: from the transform key when there is one (who lacks it
/// cannot tell which rows were kept), else fixed (still deterministic).
fn seed(masking: Option<&Masking>) -> i64 {
    match masking.and_then(Masking::key) {
        Some(key) => {
            let tag = key.sample_tag(b"larch subset closure sample");
            i64::from_be_bytes(tag[..8].try_into().expect("8 bytes"))
        }
        None => 0,
    }
}

/// Computes the closure in a new session of `shared`'s snapshot and makes `shared` copy the
/// plan's tables through it; returns what each manifest records.
pub async fn compute_on(
    shared: &mut SharedSnapshot,
    source: &PostgresSource,
    closure: &ClosureExport,
    masking: Option<&Masking>,
) -> anyhow::Result<ClosureRecord> {
    let plan = &closure.plan;
    let client = shared
        .subset_session(&rounds::prepare_sql(plan))
        .await
        .context("the subset's closure")?;
    let report = rounds::compute(&client, plan, seed(masking), shared.deadline()).await?;
    let columns: BTreeMap<TableId, Vec<String>> = plan
        .tables
        .iter()
        .filter_map(|t| {
            let schema = source.table_schema(t)?;
            Some((
                t.clone(),
                schema.columns.into_iter().map(|c| c.name).collect(),
            ))
        })
        .collect();
    let queries = rounds::copy_queries(plan, &columns);
    shared.copy_subset_through(client, queries);
    tracing::info!(
        rounds = report.rounds,
        tables = plan.tables.len(),
        "subset closure computed"
    );
    Ok(record(closure, &report, shared.position()))
}

/// The manifest's `subset.closure`.
pub fn record(closure: &ClosureExport, report: &ClosureReport, position: &str) -> ClosureRecord {
    let plan = &closure.plan;
    let relationships = plan
        .relationships
        .iter()
        .enumerate()
        .filter(|(_, r)| plan.tables.contains(&r.parent))
        .map(|(i, r)| {
            let down = plan.downward.iter().any(|d| d.relationship == i);
            let followed = match (plan.upward.contains(&i), down) {
                (true, true) => "upward+downward",
                (true, false) => "upward",
                (false, true) => "set-null+downward",
                (false, false) => "set-null",
            };
            ClosureRelationship {
                name: r.name.clone(),
                relationship: r.describe(),
                followed: followed.into(),
            }
        })
        .collect();
    ClosureRecord {
        spec: serde_json::to_value(&closure.spec).unwrap_or_default(),
        position: position.to_string(),
        rounds: report.rounds,
        tables: report
            .kept
            .iter()
            .map(|(t, n)| (t.to_string(), *n))
            .collect(),
        relationships,
    }
}
