//! `larch engine --config FILE [--listen ADDR]`.

use std::path::PathBuf;

use clap::Args;

use crate::engine::config::EngineConfig;

#[derive(Args, Debug)]
pub struct EngineArgs {
    /// Engine configuration (YAML; see docs/engine.md).
    #[arg(long)]
    pub config: PathBuf,
    /// Address of the HTTP listener (health, status, metrics, tables).
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub listen: String,
    /// Validate the configuration and exit.
    #[arg(long)]
    pub check: bool,
}

pub async fn run(args: EngineArgs) -> anyhow::Result<i32> {
    super::init_tracing();
    let config = EngineConfig::load(&args.config)?;
    if args.check {
        println!(
            "{}: ok ({} source(s))",
            args.config.display(),
            config.sources.len()
        );
        return Ok(0);
    }
    crate::engine::run(&config, &args.listen).await?;
    Ok(0)
}
