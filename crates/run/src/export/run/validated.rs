//! The constraint preflight every export with a transform runs at start (one catalog session
//! and a sample per CHECK, [`crate::export::preflight`]): its findings go into the summary
//! (one-shot) or `/status` (continuous), where the operator reads them into the
//! ArchiveExport's `Validated` condition. `--require-validated` refuses the export when a
//! constraint can break (reason `ConstraintsAtRisk`), before anything is written.

use larch_archive::model::TableId;
use larch_contract::export_request::ExportRequest;
use larch_contract::preflight::PreflightSummary;
use larch_core::failure::{self, Reason};
use larch_postgres::{PostgresConfig, Session};

use crate::export::preflight;
use crate::export::transform::Masking;

/// The preflight of `tables` under the request's transform; None without one. A preflight
/// that cannot run is reported in the summary and the export goes on, unless the request
/// requires it: then that error, or the constraints at risk, fail the export.
pub(super) async fn preflight(
    request: &ExportRequest,
    dsn: &str,
    tables: &[TableId],
    masking: Option<&Masking>,
) -> anyhow::Result<Option<PreflightSummary>> {
    let Some(masking) = masking else {
        if request.require_validated {
            failure::bail!(
                Reason::InvalidConfig,
                "--require-validated needs --transform (or --transform-rules): it checks which \
                 constraints the masking rules can break"
            );
        }
        return Ok(None);
    };
    let mut config = PostgresConfig::new(dsn.to_string(), tables.to_vec(), "", "");
    config.limits = super::session_limits(request)?;
    let checked = async {
        let client = larch_postgres::connect(&config, Session::Catalog).await?;
        preflight::check(
            &client,
            masking.rules(),
            tables,
            &request.key_fields,
            masking.key(),
        )
        .await
    }
    .await;
    let report = match checked {
        Ok(report) => report,
        Err(e) if request.require_validated => {
            return Err(e.context("the constraint preflight (--require-validated)"));
        }
        Err(e) => {
            let why = crate::reasons::render(&e);
            tracing::warn!(error = %why, "the constraint preflight could not run; exporting anyway");
            return Ok(Some(PreflightSummary::failed(&why)));
        }
    };
    let lines: Vec<String> = report
        .problems
        .iter()
        .map(preflight::Problem::line)
        .collect();
    let summary = PreflightSummary::of(report.constraints_checked, lines);
    if summary.at_risk == 0 {
        tracing::info!(
            constraints = summary.constraints_checked,
            "constraint preflight: the transform can break none"
        );
        return Ok(Some(summary));
    }
    eprint!("{}", preflight::table_text(&report));
    if request.require_validated {
        failure::bail!(
            Reason::ConstraintsAtRisk,
            // The names last: a long message is cut from its head on the custom resource.
            "the transform can break {} of the {} constraints checked, so a restore of the masked \
             archive would fail; nothing was exported (--require-validated, \
             spec.transform.requireValidated): change the rules (`larch export --check` lists \
             every one): {}",
            summary.at_risk,
            summary.constraints_checked,
            summary.listed()
        );
    }
    tracing::warn!(
        at_risk = summary.at_risk,
        constraints = summary.constraints_checked,
        "constraint preflight: the transform can break constraints; exporting anyway"
    );
    Ok(Some(summary))
}

/// Bytes a termination message keeps (the summary is one): a preflight's listed constraints
/// are dropped (still counted in `at_risk`) until the summary fits.
const TERMINATION_BYTES: usize = 4096;

/// Puts `preflight` into `summary` as `preflight`, listing as many constraints as still let the
/// summary (as written, `pretty` or on one line) fit a termination message.
pub(super) fn attach(
    summary: &mut serde_json::Value,
    preflight: Option<PreflightSummary>,
    pretty: bool,
) -> anyhow::Result<()> {
    let Some(mut preflight) = preflight else {
        return Ok(());
    };
    loop {
        summary["preflight"] = serde_json::to_value(&preflight)?;
        let len = match pretty {
            true => serde_json::to_string_pretty(summary)?.len(),
            false => summary.to_string().len(),
        };
        if len < TERMINATION_BYTES || preflight.problems.pop().is_none() {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listed_constraints_give_way_to_the_termination_message_limit() {
        let lines: Vec<String> = (0..5)
            .map(|i| format!("public.t.c{i} (UNIQUE): {}", "x".repeat(200)))
            .collect();
        let mut small = serde_json::json!({"table": "public.t"});
        attach(
            &mut small,
            Some(PreflightSummary::of(9, lines.clone())),
            true,
        )
        .unwrap();
        assert_eq!(small["preflight"]["problems"].as_array().unwrap().len(), 5);
        // A set of many tables: its entries come first.
        let tables: Vec<serde_json::Value> = (0..30)
            .map(|i| serde_json::json!({"table": format!("public.table_{i:03}"), "key_prefix": format!("seed/public.table_{i:03}/"), "position": "0/16B3748", "epoch": 1, "row_count": 1000}))
            .collect();
        let mut set = serde_json::json!({"position": "0/16B3748", "tables": tables});
        attach(&mut set, Some(PreflightSummary::of(9, lines)), false).unwrap();
        let listed = set["preflight"]["problems"].as_array().map_or(0, Vec::len);
        assert!(listed < 5, "{listed}");
        assert!(set.to_string().len() < TERMINATION_BYTES);
        assert_eq!(set["preflight"]["at_risk"], 5, "still counted");
        let mut none = serde_json::json!({});
        attach(&mut none, None, true).unwrap();
        assert!(none.get("preflight").is_none());
    }
}
