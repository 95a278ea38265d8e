//! `--leak-check` (`spec.transform.leakCheck`): after a one-shot export, each archive it wrote
//! is checked for raw values of its masked columns and the result recorded in its manifest.
//! The export has just committed and nothing else writes these archives, so the manifest's
//! head is still the one checked and the record goes in with the manifest's CAS.

use std::sync::Arc;

use larch_archive::model::TableId;
use larch_archive::reader::ArchiveReader;
use larch_archive::store::Store;
use larch_contract::export_request::ExportRequest;
use larch_core::failure::{self, Reason};

use crate::leak_check::{DEFAULT_MIN_LENGTH, LeakReport, check_archive};

/// Refused before anything connects: the check needs masked columns, and a continuous
/// archive's head moves on with every diff.
pub(super) fn refuse_unless_checkable(request: &ExportRequest) -> anyhow::Result<()> {
    if !request.leak_check {
        return Ok(());
    }
    if request.follow {
        failure::bail!(
            Reason::InvalidConfig,
            "--leak-check applies to a one-shot export: a continuous archive's head moves with \
             every diff (check it with `larch archive leak-check --no-record`)"
        );
    }
    if request.transform.is_none() {
        failure::bail!(
            Reason::InvalidConfig,
            "--leak-check needs --transform (or --transform-rules): it looks for the raw values \
             of the masked columns"
        );
    }
    Ok(())
}

/// Checks the archive of each `(table, key prefix)` written and records each result; raw
/// values found anywhere fail with `LeakFound`, counted per table and column, never quoted.
/// Returns each table's figures for the summary.
pub(super) async fn check_written(
    request: &ExportRequest,
    dsn: &str,
    store: Arc<dyn Store>,
    written: &[(TableId, String)],
) -> anyhow::Result<Vec<(TableId, serde_json::Value)>> {
    let mut figures = Vec::with_capacity(written.len());
    let mut leaks = Vec::new();
    for (table, key_prefix) in written {
        let reader = ArchiveReader::new(store.clone(), key_prefix, super::formats(request))?;
        let report = check_archive(dsn.to_string(), &reader, None, DEFAULT_MIN_LENGTH, true)
            .await
            .map_err(|e| e.context(format!("the leak check of {table}")))?;
        tracing::info!(
            table = %table,
            values_checked = report.values_checked,
            found = report.found,
            "leak check"
        );
        if report.found > 0 {
            leaks.push(found_text(&report));
        }
        figures.push((table.clone(), summary(&report)));
    }
    if !leaks.is_empty() {
        failure::bail!(
            Reason::LeakFound,
            "the leak check found raw values of masked columns in the archive just written: {}; \
             its manifest records the failed check, so requireLeakCheck refuses it: fix the \
             transform rules and export again",
            leaks.join("; ")
        );
    }
    Ok(figures)
}

fn found_text(report: &LeakReport) -> String {
    let columns: Vec<String> = report
        .columns
        .iter()
        .filter(|c| c.found > 0)
        .map(|c| format!("{} {} of {}", c.column, c.found, c.values_checked))
        .collect();
    format!("{}: {}", report.table, columns.join(", "))
}

fn summary(report: &LeakReport) -> serde_json::Value {
    serde_json::json!({
        "epoch": report.epoch,
        "position": report.position,
        "values_checked": report.values_checked,
        "found": report.found,
    })
}
