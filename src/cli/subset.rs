//! `larch subset plan`: the closure a subset spec spans and its estimated rows, read from the
//! catalog and `EXPLAIN` without exporting (docs/subsetting.md).

use anyhow::anyhow;
use clap::{Args, Subcommand};

use super::ConnectionArgs;
use crate::archive::model::TableId;
use crate::contract::subset_spec::SubsetSpec;
use crate::export::closure::{at_snapshot, estimate, resolve};

#[derive(Subcommand, Debug)]
pub enum SubsetCommand {
    /// Print the tables a --subset spec spans (in the order a restore loads them), the
    /// relationships it follows and the rows it would keep, estimated with EXPLAIN. Reads the
    /// catalog only: nothing is exported.
    #[command(after_help = super::env_section(&[super::env_help::PG]))]
    Plan(PlanArgs),
}

#[derive(Args, Debug)]
pub struct PlanArgs {
    #[command(flatten)]
    pub connection: ConnectionArgs,
    /// The subset spec (`larch export --subset`).
    #[arg(long, value_name = "FILE")]
    pub subset: std::path::PathBuf,
    /// More tables to export with the subset, `[schema.]name` (as `larch export --table`).
    #[arg(long, value_parser = super::parse_table_arg)]
    pub table: Vec<TableId>,
}

pub async fn run(command: SubsetCommand) -> anyhow::Result<i32> {
    match command {
        SubsetCommand::Plan(args) => plan(args).await,
    }
}

async fn plan(args: PlanArgs) -> anyhow::Result<i32> {
    let invalid =
        |e: String| crate::failure::tag(crate::failure::Reason::InvalidConfig, anyhow!(e));
    let spec = SubsetSpec::load(&args.subset).map_err(invalid)?;
    let client = at_snapshot::connect(&args.connection.dsn()?).await?;
    let plan = resolve(&client, &spec, &args.table).await?;
    let estimates = estimate::estimate(&client, &plan).await?;
    print!("{}", estimate::plan_text(&plan, &estimates));
    Ok(0)
}
