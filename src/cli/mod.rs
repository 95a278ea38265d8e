//! The `larch` command line: argument parsing, wiring, exit codes.

pub mod archive;
pub mod engine;
pub mod export;
pub mod slot;

use clap::{Args, Parser, Subcommand};

use crate::archive::format::Format;
use crate::archive::store::spec::StoreSpec;

#[derive(Parser, Debug)]
#[command(
    name = "larch",
    version,
    about = "PostgreSQL tables into laredo-compatible archives, archives into live engines"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Inspect, verify and reconstruct archives.
    #[command(subcommand)]
    Archive(archive::ArchiveCommand),
    /// Export a PostgreSQL table into an archive (one base snapshot, a new epoch).
    Export(Box<export::ExportArgs>),
    /// Replay archives into live targets (memory tables over HTTP, PostgreSQL).
    Engine(engine::EngineArgs),
    /// Print the operator's CustomResourceDefinitions (multi-document YAML).
    Crd,
    /// Run the Kubernetes operator (ArchiveExport and ArchiveSource controllers).
    Operator(crate::operator::cli::OperatorArgs),
}

/// Where an archive lives: `--store local --path DIR` or `--store s3 --bucket B ...`.
#[derive(Args, Debug, Clone)]
pub struct StoreArgs {
    /// Store type: local or s3.
    #[arg(long, default_value = "local")]
    pub store: String,
    /// Local store root directory.
    #[arg(long)]
    pub path: Option<std::path::PathBuf>,
    /// S3 bucket.
    #[arg(long)]
    pub bucket: Option<String>,
    /// S3 destination prefix (prepended verbatim to every key).
    #[arg(long)]
    pub prefix: Option<String>,
    /// S3 endpoint URL (S3-compatible stores).
    #[arg(long)]
    pub endpoint: Option<String>,
    /// S3 region.
    #[arg(long)]
    pub region: Option<String>,
    /// Path-style S3 addressing (most S3-compatible stores need it).
    #[arg(long)]
    pub path_style: bool,
}

impl StoreArgs {
    pub fn spec(&self) -> StoreSpec {
        StoreSpec {
            kind: self.store.clone(),
            path: self.path.clone(),
            bucket: self.bucket.clone(),
            prefix: self.prefix.clone(),
            region: self.region.clone(),
            endpoint: self.endpoint.clone(),
            path_style: self.path_style || self.endpoint.is_some(),
            ..Default::default()
        }
    }
}

/// Parses `--format a,b` lists.
pub fn parse_formats(s: &str) -> Result<Vec<Format>, String> {
    Format::parse_list(s).map_err(|e| e.to_string())
}

/// Parses `--table [schema.]name`: `public` when the schema is omitted.
pub fn parse_table_arg(s: &str) -> Result<crate::archive::model::TableId, String> {
    use crate::archive::model::TableId;
    match s.split_once('.') {
        None if !s.is_empty() => Ok(TableId::new("public", s)),
        Some((schema, table)) if !schema.is_empty() && !table.is_empty() => {
            Ok(TableId::new(schema, table))
        }
        _ => Err(format!("{s:?} is not a table name: expected [schema.]name")),
    }
}

/// Parses `--key-fields a,b`.
pub fn parse_list(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

pub fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("LARCH_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .json()
        .try_init();
}

/// Runs the CLI and returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    // Both ring (kube) and aws-lc-rs (the S3 SDK) are linked, so rustls cannot pick a process
    // default by itself: install ring for every Kubernetes client (the operator's, and the
    // Lease of a continuous export).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Archive(c) => archive::run(c).await,
            Command::Export(a) => export::run(*a).await,
            Command::Engine(a) => engine::run(a).await,
            Command::Crd => Ok(crate::operator::cli::crd()),
            Command::Operator(args) => {
                init_tracing();
                crate::operator::cli::operator(args).await
            }
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    }
}
