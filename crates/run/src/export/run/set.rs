//! Several tables: one-shot, every table at one position (one shared snapshot), up to
//! `parallel` copying at once, each into its own archive at `<key prefix><schema>.<table>/`.

use std::sync::Arc;

use anyhow::Context;
use larch_archive::model::TableId;
use larch_archive::source::SyncSource;
use larch_contract::export_request::{self, ExportRequest};
use larch_core::failure::{self, Reason};
use larch_core::locks::MutexExt;
use larch_postgres::{PostgresConfig, PostgresSource, SlotMode, SubqueryTables};

use super::{default_set_slot, masking, session_limits, subquery_tables, subset, writer_config};
use crate::export::closure::{self, at_snapshot::ClosureExport};
use crate::export::set::{DEFAULT_PARALLEL, TableExport, export_at_one_position};
use crate::export::status::{BASELINE, Shared, serve};
use crate::export::transform::Masking;

/// Exports the set; returns (and writes to the summary file) the position and each table's
/// epoch.
pub(super) async fn export_set(
    request: &ExportRequest,
    dsn: String,
    tables: Vec<TableId>,
) -> anyhow::Result<serde_json::Value> {
    refuse_single_table_options(request)?;
    let masking = masking(request)?;
    let closure = match &request.subset {
        Some(spec) => Some(subset_closure(request, &dsn, spec.clone(), &tables).await?),
        None => None,
    };
    let tables = match &closure {
        Some(c) => c.plan.tables.clone(),
        None => tables,
    };
    let subqueries = subquery_tables(request, &tables, masking.as_deref());
    let set = match closure {
        // The closure decides every table's rows.
        Some(_) => table_exports_whole(request, &tables)?,
        None => table_exports(request, &tables, masking.as_deref(), subqueries.as_ref())?,
    };
    // Before anything is written: `--require-validated` refuses here.
    let preflight = super::validated::preflight(request, &dsn, &tables, masking.as_deref()).await?;
    let parallel = request
        .parallel
        .map(usize::from)
        .unwrap_or(DEFAULT_PARALLEL)
        .min(tables.len());
    let slot = request
        .slot
        .clone()
        .unwrap_or_else(|| default_set_slot(&tables));
    let publication = request.publication.clone().unwrap_or_else(|| slot.clone());
    let store = request.store.open().await?;
    let mut config = PostgresConfig::new(dsn, tables.clone(), slot, publication);
    if let Some(owner) = &request.owner {
        config.owner = owner.clone();
    }
    config.limits = session_limits(request)?;
    config.slot_mode = SlotMode::Temporary;
    config.snapshot_only = true;
    config.key_fields = request.key_fields.clone();
    for t in &set {
        if let Some(p) = t.subset.as_ref().and_then(|s| s.row_filter.clone()) {
            config.row_filters.insert(t.table.clone(), p);
        }
    }
    config.row_filter_subqueries = subqueries;
    let names: Vec<String> = tables.iter().map(|t| t.to_string()).collect();
    let shared = Shared::new(&tables[0]);
    shared.status.locked().table = names.join(",");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    if let Some(listen) = &request.listen {
        let addr = serve(listen, shared.clone(), stop_rx).await?;
        eprintln!(
            "larch export: exporting {} at one position, {parallel} at a time (status on http://{addr})",
            names.join(", ")
        );
        shared.ready.send_replace(true);
    }
    shared.status.locked().state = "BASELINE".into();
    let source = Arc::new(PostgresSource::new(config));
    // /status shows the table that started last.
    let progress = |t: &TableId| shared.start_progress(BASELINE, t);
    let result = export_at_one_position(
        source.clone(),
        set,
        store.clone(),
        parallel,
        masking.as_deref(),
        closure.as_ref(),
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
    let mut summary = summary(&exported);
    if request.leak_check {
        let written: Vec<(TableId, String)> = exported
            .iter()
            .map(|e| (e.table.clone(), e.key_prefix.clone()))
            .collect();
        let dsn = &source.config().dsn;
        let checked = super::leak_check::check_written(request, dsn, store, &written).await?;
        for (entry, (_, figures)) in summary["tables"]
            .as_array_mut()
            .into_iter()
            .flatten()
            .zip(checked)
        {
            entry["leak_check"] = figures;
        }
    }
    super::validated::attach(&mut summary, preflight, false)?;
    if let Some(path) = &request.summary_file {
        // On one line: a termination message keeps 4 KiB, some 25 tables' entries.
        std::fs::write(path, format!("{summary}\n"))
            .with_context(|| format!("writing --summary-file {}", path.display()))?;
    }
    Ok(summary)
}

/// What names one table only, or needs one process per table, refused for a set.
fn refuse_single_table_options(request: &ExportRequest) -> anyhow::Result<()> {
    if request.follow {
        failure::bail!(
            Reason::InvalidConfig,
            "--follow exports one table per process: run one `larch export --follow` per table \
             (several --table are for a one-shot export at one position)"
        );
    }
    if request.slot_mode == Some(export_request::SlotMode::Persistent) {
        failure::bail!(
            Reason::InvalidConfig,
            "--slot-mode persistent needs --follow: a one-shot export always uses a temporary slot"
        );
    }
    if request.row_filter.is_some() || request.sample.is_some() {
        failure::bail!(
            Reason::InvalidConfig,
            "--where and --sample name no table: with several --table, give each table's \
             `where:`/`sample:` in the transform rules"
        );
    }
    Ok(())
}

/// Each table's writer (under the key prefix, as the operator names each table's archive
/// under spec.keyPrefix) and subset.
fn table_exports(
    request: &ExportRequest,
    tables: &[TableId],
    masking: Option<&Masking>,
    subqueries: Option<&SubqueryTables>,
) -> anyhow::Result<Vec<TableExport>> {
    let parent = request.key_prefix.clone().unwrap_or_default();
    let mut set = Vec::with_capacity(tables.len());
    for table in tables {
        let key_prefix = format!("{parent}{table}/");
        larch_archive::store::check_key_prefix(&key_prefix)
            .map_err(|e| anyhow::Error::from(e).context(format!("--key-prefix for {table}")))?;
        set.push(TableExport {
            table: table.clone(),
            writer: writer_config(request, table, &key_prefix)?,
            subset: subset(request, table, masking, subqueries)?,
        });
    }
    Ok(set)
}

/// The closure of `--subset`, resolved on the source; refused with the transform rules'
/// own `where:`/`sample:` (the roots say which rows start the subset).
async fn subset_closure(
    request: &ExportRequest,
    dsn: &str,
    spec: larch_contract::subset_spec::SubsetSpec,
    tables: &[TableId],
) -> anyhow::Result<ClosureExport> {
    if let Some(rules) = &request.transform
        && let Some((t, _)) = rules
            .tables
            .iter()
            .find(|(_, r)| r.row_filter.is_some() || r.sample.is_some())
    {
        failure::bail!(
            Reason::InvalidConfig,
            "--subset and the transform rules' `where:`/`sample:` of table {t} both choose \
             rows: give the rows in the subset's roots"
        );
    }
    closure::at_snapshot::plan(dsn, spec, tables).await
}

/// Each table's writer, without a subset of its own.
fn table_exports_whole(
    request: &ExportRequest,
    tables: &[TableId],
) -> anyhow::Result<Vec<TableExport>> {
    let parent = request.key_prefix.clone().unwrap_or_default();
    tables
        .iter()
        .map(|table| {
            let key_prefix = format!("{parent}{table}/");
            larch_archive::store::check_key_prefix(&key_prefix)
                .map_err(|e| anyhow::Error::from(e).context(format!("--key-prefix for {table}")))?;
            Ok(TableExport {
                table: table.clone(),
                writer: writer_config(request, table, &key_prefix)?,
                subset: None,
            })
        })
        .collect()
}

fn summary(exported: &[crate::export::set::Exported]) -> serde_json::Value {
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
    serde_json::json!({ "position": position, "tables": per_table })
}
