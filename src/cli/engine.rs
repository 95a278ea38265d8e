//! `larch engine --config FILE [--listen ADDR]`.

use std::path::PathBuf;

use clap::Args;

use crate::engine::config::EngineConfig;

#[derive(Args, Debug)]
#[command(after_help = super::env_section(&[
    super::env_help::S3,
    "  (a postgres target's connection_env: the variable the configuration names)",
    super::env_help::LOG,
    super::env_help::CRASH,
]))]
pub struct EngineArgs {
    /// Engine configuration (YAML; see docs/engine.md).
    #[arg(long)]
    pub config: PathBuf,
    /// Address of the HTTP listener (health, status, metrics, tables). Loopback by default: pass
    /// an address such as 0.0.0.0:8080 to serve other machines.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// Validate the configuration and exit.
    #[arg(long)]
    pub check: bool,
    /// On a fatal error, write `{"reason": …, "error": …}` here (on Kubernetes:
    /// /dev/termination-log, which the operator reads).
    #[arg(long)]
    pub termination_log: Option<PathBuf>,
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
