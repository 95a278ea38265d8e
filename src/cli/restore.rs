//! `larch restore`: tables of an archive into a PostgreSQL database, once (docs/restore.md).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use super::ConnectionArgs;
use super::{StoreArgs, parse_formats, parse_table_arg};
use crate::archive::model::TableId;
use crate::failure::{self, Reason};
use crate::restore::{IfExists, RestoreRequest};

#[derive(Args, Debug)]
pub struct RestoreArgs {
    /// The whole restore as one JSON request, no other flag (what the operator's Jobs pass;
    /// docs/architecture.md). The connection: its `connectionFile`, else LARCH_PG_DSN.
    #[arg(long, value_name = "JSON", exclusive = true)]
    pub request: Option<String>,
    #[command(flatten)]
    pub store: StoreArgs,
    /// The table(s) to restore, `[schema.]name` (schema `public` when omitted), comma-separated
    /// or repeated: each is read from `<key-prefix-root><schema>.<table>/`, where `larch export`
    /// writes it. Several tables restore at one point, in one transaction.
    #[arg(long, required_unless_present = "request", value_name = "[SCHEMA.]NAME", value_delimiter = ',', value_parser = parse_table_arg)]
    pub table: Vec<TableId>,
    /// A prefix before each table's `<schema>.<table>/` (the `keyPrefix` of an ArchiveExport
    /// of several tables).
    #[arg(long, default_value = "", conflicts_with = "key_prefix")]
    pub key_prefix_root: String,
    /// One table only: its archive's exact key prefix (an export's --key-prefix).
    #[arg(long)]
    pub key_prefix: Option<String>,
    /// The point to restore at, as every `--at` takes it: a position or an RFC 3339 time.
    /// Default: the head; with several tables, the greatest position every table reaches.
    #[arg(long)]
    pub at: Option<String>,
    /// When a destination table exists: fail (an error naming it, nothing restored) or
    /// replace (its rows, in the same transaction; its definition is kept).
    #[arg(long, value_enum, default_value_t = IfExists::Fail)]
    pub if_exists: IfExists,
    /// COPY streams per table the restore creates, each over its own connection into a
    /// staging table renamed in the restore's transaction (1 to 16; a table that exists
    /// loads over one stream). Its key's index is built after the rows either way.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=crate::restore::MAX_SPLIT as i64))]
    pub split: u16,
    /// The target database: LARCH_PG_DSN, --connection-file or --connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
    /// Formats to read, in preference order.
    #[arg(long, default_value = "jsonl,protobuf,jsonl+zstd")]
    pub format: String,
    /// Bytes of folded changes held in memory per table; past it they spill to --spill-dir.
    #[arg(long, default_value = "64Mi", value_parser = crate::archive::spill::parse_size)]
    pub buffer_memory: u64,
    /// Directory for spilled changes (default: $TMPDIR/larch-spill).
    #[arg(long)]
    pub spill_dir: Option<PathBuf>,
    /// Also write the summary JSON to this file; on a failure, `{"reason": …, "error": …}`
    /// instead (Kubernetes: /dev/termination-log, which the operator reads).
    #[arg(long, alias = "termination-log")]
    pub summary_file: Option<PathBuf>,
    #[command(flatten)]
    pub output: super::output::DocumentOutputArgs,
    /// HTTP listener for /status (each table's progress), /metrics and /health/* while the
    /// restore runs, e.g. 127.0.0.1:8080 (port 0: any free port).
    #[arg(long)]
    pub listen: Option<String>,
}

impl RestoreArgs {
    /// The flags as the request `larch_run::restore::run` takes (the operator's Jobs pass one
    /// with `--request`).
    pub fn request(&self) -> anyhow::Result<RestoreRequest> {
        if let Some(text) = &self.request {
            return RestoreRequest::from_json(text).map_err(|e| {
                failure::tag(Reason::InvalidConfig, anyhow::anyhow!("--request: {e}"))
            });
        }
        let formats = parse_formats(&self.format).map_err(|e| anyhow::anyhow!("--format: {e}"))?;
        Ok(RestoreRequest {
            store: self.store.spec(),
            tables: self.table.iter().map(|t| t.to_string()).collect(),
            key_prefix_root: self.key_prefix_root.clone(),
            key_prefix: self.key_prefix.clone(),
            formats,
            at: self.at.clone(),
            if_exists: self.if_exists,
            split: (self.split > 1).then_some(self.split),
            connection_file: self.connection.connection_file.clone(),
            buffer_memory: Some(self.buffer_memory),
            spill_dir: self.spill_dir.clone(),
            summary_file: self.summary_file.clone(),
            listen: self.listen.clone(),
        })
    }
}

pub async fn run(args: RestoreArgs) -> anyhow::Result<i32> {
    super::init_tracing();
    let request = args.request()?;
    // Checked before the connection is read, as the flags always were.
    crate::restore::tables_of(&request)?;
    let connection = ConnectionArgs {
        connection: args.connection.connection.clone(),
        connection_file: request.connection_file.clone(),
    };
    let dsn = connection.dsn()?;
    let summary = crate::restore::run(&request, dsn).await?;
    if let Some(path) = &request.summary_file {
        // Compact: a Kubernetes termination message holds 4096 bytes.
        std::fs::write(path, format!("{}\n", serde_json::to_string(&summary)?))
            .with_context(|| format!("writing --summary-file {}", path.display()))?;
    }
    super::output::print(&summary, args.output.format(), String::new)?;
    Ok(0)
}
