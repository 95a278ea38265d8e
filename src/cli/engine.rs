//! `larch engine --config FILE [--listen ADDR]`.

use std::path::PathBuf;

use clap::Args;

use crate::engine::Serving;
use crate::engine::access::{self, ApiAccess};
use crate::engine::config::EngineConfig;
use crate::engine::tls::TlsFiles;

#[derive(Args, Debug)]
#[command(subcommand_negates_reqs = true, args_conflicts_with_subcommands = true)]
#[command(after_help = super::env_section(&[
    super::env_help::S3_CONFIG,
    "  (a postgres target's connection_env: the variable the configuration names)",
    "  LARCH_ENGINE_TOKEN: the API token when no --token-file is given",
    "  LAREDO_ADDRESS: the engine the client verbs (status, ready, tables, query, ...) talk to
                      when no --addr is given",
    super::env_help::LOG,
    super::env_help::CRASH,
]))]
pub struct EngineArgs {
    /// A client of a running engine's gRPC API (laredo's CLI verbs) instead of an engine.
    #[command(subcommand)]
    pub client: Option<super::engine_client::EngineClient>,
    /// Engine configuration (YAML, or laredo's HOCON; see docs/engine.md).
    #[arg(long, required = true)]
    pub config: Option<PathBuf>,
    /// Refuse the laredo HOCON keys larch ignores with a warning (laredo-server's own blocks such
    /// as `fanout`, `health`, `observability`, `snapshot`; see docs/laredo.md) instead.
    #[arg(long)]
    pub strict_config: bool,
    /// Address of the HTTP listener (health, status, metrics, tables). Loopback by default: pass
    /// an address such as 0.0.0.0:8080 to serve other machines.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// Serve POST /sources/{id}/pause and /resume, behind the API token (refused otherwise).
    #[arg(long)]
    pub allow_control: bool,
    /// Require the API token for the tables API (/tables…, row data).
    #[arg(long)]
    pub protect_reads: bool,
    /// Require the API token for /status and /metrics too (no row data in them, but table
    /// names, positions and errors); /health/* stays open.
    #[arg(long)]
    pub protect_status: bool,
    /// File holding the API bearer token (a mounted Secret key; at least 16 characters).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Serve the whole API over TLS on this address (e.g. 0.0.0.0:8443); --listen then serves
    /// only /health/*, /status and /metrics. Needs --tls-cert and --tls-key.
    #[arg(long, value_name = "ADDR", requires_all = ["tls_cert", "tls_key"])]
    pub tls_listen: Option<String>,
    /// PEM certificate chain of the TLS listener (tls.crt of a kubernetes.io/tls Secret).
    #[arg(long, value_name = "FILE", requires = "tls_listen")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of the TLS listener (tls.key).
    #[arg(long, value_name = "FILE", requires = "tls_listen")]
    pub tls_key: Option<PathBuf>,
    /// Serve laredo's gRPC API (Connect, gRPC, gRPC-Web; docs/laredo.md) on this address, e.g.
    /// 0.0.0.0:4001, with the HTTP API's token rules. Overrides the configuration's grpc
    /// listener (its TLS files, if any, still apply).
    #[arg(long, value_name = "ADDR")]
    pub grpc_listen: Option<String>,
    /// Validate the configuration, check that each table's archive exists, and exit.
    #[arg(long)]
    pub check: bool,
    /// On a fatal error, write `{"reason": …, "error": …}` here (on Kubernetes:
    /// /dev/termination-log, which the operator reads; the older name of this flag is accepted
    /// too).
    #[arg(long, alias = "termination-log")]
    pub summary_file: Option<PathBuf>,
}

pub async fn run(args: EngineArgs) -> anyhow::Result<i32> {
    if let Some(client) = args.client {
        return super::engine_client::run(client).await;
    }
    super::init_tracing();
    let path = args.config.clone().expect("clap requires --config");
    let mut config = EngineConfig::load_with(&path, args.strict_config)?;
    if let Some(listen) = &args.grpc_listen {
        config.grpc = Some(crate::engine::config::GrpcConfig {
            listen: listen.clone(),
            tls: config.grpc.and_then(|g| g.tls),
        });
    }
    let serving = serving(&args)?;
    if args.check {
        if let Some((_, files)) = &serving.tls {
            files.server_config()?;
        }
        crate::engine::check_archives(&config).await?;
        println!(
            "{}: ok ({} source(s))",
            path.display(),
            config.sources.len()
        );
        return Ok(0);
    }
    crate::engine::run(&config, &serving).await?;
    Ok(0)
}

fn serving(args: &EngineArgs) -> anyhow::Result<Serving> {
    let access = ApiAccess::from_flags(
        args.allow_control,
        args.protect_reads,
        args.protect_status,
        args.token_file.as_ref(),
        std::env::var(access::TOKEN_ENV).ok(),
    )?;
    let tls = match (&args.tls_listen, &args.tls_cert, &args.tls_key) {
        (Some(listen), Some(cert), Some(key)) => {
            let files = TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
            };
            Some((listen.clone(), files))
        }
        _ => None,
    };
    Ok(Serving {
        listen: args.listen.clone(),
        access,
        tls,
        grpc: None,
    })
}
