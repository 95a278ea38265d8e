//! `larch export --check`: the constraints of the tables that the masking rules can break,
//! read from the source's catalog before anything is exported (crate::export::preflight).

use std::sync::Arc;

use anyhow::{Context, anyhow};

use super::export::ExportArgs;
use crate::export::preflight::{self, PreflightReport};
use crate::export::transform::TransformKey;
use crate::source::postgres::PostgresConfig;

/// Exit 0 when no constraint can break, 1 when some can, 2 on bad input or a failure.
pub async fn run(args: &ExportArgs) -> anyhow::Result<i32> {
    match check(args).await {
        Ok(report) => {
            eprint!("{}", preflight::table_text(&report));
            super::output::print(&report, args.output.format(), String::new)?;
            Ok(if report.problems.is_empty() { 0 } else { 1 })
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            Ok(2)
        }
    }
}

async fn check(args: &ExportArgs) -> anyhow::Result<PreflightReport> {
    let request = args.request()?;
    let rules = request
        .transform
        .as_ref()
        .ok_or_else(|| anyhow!("--check checks a transform: give --transform FILE"))?;
    let tables = crate::export::run::table_ids(&request)?;
    let key = TransformKey::load(request.transform_key_file.as_deref())?.map(Arc::new);
    if rules.hashes() && key.is_none() {
        return Err(anyhow!(
            "the transform rules hash columns but no key was given: --transform-key-file FILE \
             or ${}",
            crate::export::transform::KEY_ENV
        ));
    }
    let connection = super::ConnectionArgs {
        connection: args.connection.connection.clone(),
        connection_file: request.connection_file.clone(),
    };
    let config = PostgresConfig::new(connection.dsn()?, tables.clone(), "", "");
    let client =
        crate::source::postgres::connect(&config, crate::source::postgres::Session::Catalog)
            .await
            .context("connecting to the source database")?;
    preflight::check(&client, rules, &tables, &request.key_fields, key).await
}
