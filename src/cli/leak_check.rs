//! `larch archive leak-check`: raw values of the masked columns looked for in an archive's
//! current epoch (crate::leak_check), the result recorded in the manifest.

use clap::Args;

use super::ConnectionArgs;
use super::archive::ArchiveArgs;
use crate::leak_check::{self, LeakReport};

#[derive(Args, Debug)]
pub struct LeakCheckArgs {
    #[command(flatten)]
    pub archive: ArchiveArgs,
    #[command(flatten)]
    pub connection: ConnectionArgs,
    /// The transform rules whose masked columns to check (default: the columns the manifest's
    /// `transform` records as masked).
    #[arg(long, value_name = "FILE")]
    pub transform: Option<std::path::PathBuf>,
    /// Raw values (each spelling) shorter than this many characters are not looked for: short
    /// values (`Bob`, `42`) occur by chance in masked data.
    #[arg(long, default_value_t = leak_check::DEFAULT_MIN_LENGTH)]
    pub min_length: usize,
    #[command(flatten)]
    pub output: super::output::OutputArgs,
    /// Do not record the result in the manifest (`transform.leak_check`).
    #[arg(long)]
    pub no_record: bool,
}

/// Exit 0 when no raw value was found, 1 when some were, 2 on bad input or a failure.
pub async fn run(args: LeakCheckArgs) -> anyhow::Result<i32> {
    // on stderr, apart from the report: --log-level debug times each pass
    super::init_tracing();
    match check(&args).await {
        Ok(report) => {
            super::output::print(&report, args.output.format(), || {
                leak_check::table_text(&report)
            })?;
            Ok(if report.found > 0 { 1 } else { 0 })
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            Ok(2)
        }
    }
}

async fn check(args: &LeakCheckArgs) -> anyhow::Result<LeakReport> {
    let reader = args.archive.reader().await?;
    let columns = match &args.transform {
        Some(path) => {
            let manifest = reader.load_manifest().await?;
            let table: crate::archive::model::TableId = manifest
                .table
                .parse()
                .map_err(|e| anyhow::anyhow!("the manifest's table {:?}: {e}", manifest.table))?;
            let rules = crate::contract::transform_rules::TransformRules::from_file(path)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            Some(leak_check::masked_by_rules(
                &rules,
                &table,
                &path.display().to_string(),
            )?)
        }
        None => None,
    };
    leak_check::check_archive(
        args.connection.dsn()?,
        &reader,
        columns,
        args.min_length,
        !args.no_record,
    )
    .await
}
