//! `larch transform preview|suggest`: help for the person writing masking rules
//! (crate::review, docs/masking.md "Reviewing the rules"). Both read the source database in a
//! READ ONLY transaction and write nothing anywhere; only `preview` prints values.

use anyhow::{Context, anyhow};
use clap::{Args, Subcommand};

use super::ConnectionArgs;
use crate::archive::model::TableId;
use crate::contract::transform_rules::TransformRules;
use crate::export::transform::TransformKey;
use crate::review::{preview, suggest};
use crate::source::postgres::{PostgresConfig, Session, connect};

#[derive(Subcommand, Debug)]
pub enum TransformCommand {
    /// Print N rows of a table raw beside masked by the rules, through the exporter's own
    /// masking (what an export of the table would write). Printed only: nothing is stored.
    #[command(after_help = super::env_section(&[super::env_help::PG, KEY_ENV_HELP]))]
    Preview(PreviewArgs),
    /// Propose masking rules for the columns that look sensitive, by their names and a
    /// sample of their values (emails, phones, IBANs, card numbers, IPs, JWTs), as a rules
    /// file for `larch export --transform` with a comment on each rule saying why. No value
    /// is printed.
    #[command(after_help = super::env_section(&[super::env_help::PG]))]
    Suggest(SuggestArgs),
}

const KEY_ENV_HELP: &str =
    "  LARCH_TRANSFORM_KEY the masking hash key when no --transform-key-file is given";

#[derive(Args, Debug)]
pub struct PreviewArgs {
    #[command(flatten)]
    pub connection: ConnectionArgs,
    /// The rules file (`larch export --transform`).
    #[arg(long, value_name = "FILE")]
    pub transform: std::path::PathBuf,
    /// The hash key (default: $LARCH_TRANSFORM_KEY); needed when a rule hashes or fakes.
    #[arg(long, value_name = "FILE")]
    pub transform_key_file: Option<std::path::PathBuf>,
    /// The table, `[schema.]name` (default schema public).
    #[arg(long, value_parser = super::parse_table_arg)]
    pub table: TableId,
    /// Rows to show: the first ones by key, or a TABLESAMPLE of a big table (at most 10000).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub rows: u64,
    #[command(flatten)]
    pub output: super::output::OutputArgs,
}

#[derive(Args, Debug)]
pub struct SuggestArgs {
    #[command(flatten)]
    pub connection: ConnectionArgs,
    /// The tables to review, `[schema.]name,...` (default: every table of the database).
    #[arg(long, value_delimiter = ',', value_parser = super::parse_table_arg)]
    pub tables: Vec<TableId>,
    /// Rows of each table whose values are looked at (0: names only; at most 10000).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub sample: u64,
    /// Rules already written: the columns they name are kept as they are, and the output is
    /// this file with the other columns added.
    #[arg(long, value_name = "FILE")]
    pub transform: Option<std::path::PathBuf>,
}

pub async fn run(command: TransformCommand) -> anyhow::Result<i32> {
    match command {
        TransformCommand::Preview(a) => run_preview(a).await,
        TransformCommand::Suggest(a) => run_suggest(a).await,
    }
}

/// The source database's settings (the DSN from the flag, the file or LARCH_PG_DSN; never
/// printed).
fn source(connection: &ConnectionArgs) -> anyhow::Result<PostgresConfig> {
    Ok(PostgresConfig::new(connection.dsn()?, vec![], "", ""))
}

fn invalid(e: impl std::fmt::Display) -> anyhow::Error {
    crate::failure::tag(crate::failure::Reason::InvalidConfig, anyhow!("{e}"))
}

async fn run_preview(args: PreviewArgs) -> anyhow::Result<i32> {
    let rules = TransformRules::from_file(&args.transform).map_err(invalid)?;
    let key = TransformKey::load(args.transform_key_file.as_deref()).map_err(invalid)?;
    let client = connect(&source(&args.connection)?, Session::Catalog)
        .await
        .context("connecting to the source database")?;
    let p = preview::preview(&client, &args.table, rules, key, args.rows).await?;
    super::output::print(&p, args.output.format(), || preview::table_text(&p))?;
    Ok(0)
}

async fn run_suggest(args: SuggestArgs) -> anyhow::Result<i32> {
    let existing = match &args.transform {
        Some(path) => Some((
            TransformRules::from_file(path).map_err(invalid)?,
            path.display().to_string(),
        )),
        None => None,
    };
    let client = connect(&source(&args.connection)?, Session::Catalog)
        .await
        .context("connecting to the source database")?;
    let reviews = suggest::review(
        &client,
        &args.tables,
        args.sample,
        existing.as_ref().map(|(r, _)| r),
    )
    .await?;
    let text = suggest::render(
        &reviews,
        existing.as_ref().map(|(r, o)| (r, o.as_str())),
        args.sample,
        env!("LARCH_VERSION"),
    );
    print!("{text}");
    Ok(0)
}
