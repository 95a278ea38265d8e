//! `larch export split-worker`: one worker process of a split export whose coordinator is
//! `larch export --split N --split-workers M` (on Kubernetes: a pod of an Indexed Job). It
//! copies the ranges `r % M == I` of the coordinator's plan, read from the archive's store.

use std::path::PathBuf;

use anyhow::{Context, anyhow};
use clap::Args;
use larch_contract::export_request::ExportRequest;

use super::{
    ConnectionArgs, SessionLimitArgs, StoreArgs, duration_text, parse_formats, parse_list,
};
use crate::export::split_worker::WorkerOptions;
use crate::export::transform::TransformRules;
use crate::failure::{self, Reason};

#[derive(Args, Debug)]
pub struct SplitWorkerArgs {
    /// The coordinator's request (`larch export --request`), as JSON or a file holding it:
    /// the other flags but --index and --plan-wait are not read.
    #[arg(long, value_name = "JSON|FILE", conflicts_with = "table")]
    pub request: Option<String>,
    /// This worker's index I (0 <= I < M, the coordinator's --split-workers): it copies the
    /// ranges r with r % M == I. Default: $JOB_COMPLETION_INDEX (set by Kubernetes in the
    /// pods of an Indexed Job).
    #[arg(long, env = "JOB_COMPLETION_INDEX", value_name = "I")]
    pub index: u16,
    /// How long to wait for the coordinator's plan to appear in the store (also for a new
    /// one after the coordinator restarted) before failing (exit 1).
    #[arg(long, default_value = "10m", value_parser = duration_text)]
    pub plan_wait: String,
    #[command(flatten)]
    pub connection: ConnectionArgs,
    /// Schema of the table (as `larch export --schema`).
    #[arg(long)]
    pub schema: Option<String>,
    /// The table the coordinator exports, `[schema.]name`.
    #[arg(
        long,
        required_unless_present = "request",
        value_name = "[SCHEMA.]NAME"
    )]
    pub table: Option<String>,
    #[command(flatten)]
    pub store: StoreArgs,
    /// Archive key prefix (as the coordinator's; default `<schema>.<table>/`).
    #[arg(long)]
    pub key_prefix: Option<String>,
    /// Artifact format(s), as the coordinator's.
    #[arg(long, default_value = "jsonl")]
    pub format: String,
    /// Key fields for a table without a primary key (comma-separated), as the coordinator's.
    #[arg(long)]
    pub key_fields: Option<String>,
    /// Column transforms (YAML), as the coordinator's.
    #[arg(long, value_name = "FILE", conflicts_with = "transform_rules")]
    pub transform: Option<PathBuf>,
    /// The rules of --transform as text.
    #[arg(long, value_name = "RULES")]
    pub transform_rules: Option<String>,
    /// The hash key for --transform (default: $LARCH_TRANSFORM_KEY).
    #[arg(long, value_name = "FILE")]
    pub transform_key_file: Option<PathBuf>,
    /// The coordinator's row filter.
    #[arg(long = "where", value_name = "PREDICATE")]
    pub row_filter: Option<String>,
    /// Row filters may use subqueries (as the coordinator's).
    #[arg(long)]
    pub where_subqueries: bool,
    /// The coordinator's sample percentage.
    #[arg(long, value_name = "PERCENT")]
    pub sample: Option<f64>,
    /// The coordinator's --sample-by.
    #[arg(long, value_name = "COLUMN", requires = "sample")]
    pub sample_by: Option<String>,
    #[command(flatten)]
    pub session: SessionLimitArgs,
    /// Also write the summary JSON (or the failure) to this file.
    #[arg(long, alias = "termination-log")]
    pub summary_file: Option<PathBuf>,
    #[command(flatten)]
    pub output: super::output::DocumentOutputArgs,
}

/// `--request`: the JSON itself, or a file holding it.
fn request_text(value: &str) -> anyhow::Result<String> {
    if value.trim_start().starts_with('{') {
        return Ok(value.to_string());
    }
    std::fs::read_to_string(value).with_context(|| format!("reading --request file {value}"))
}

impl SplitWorkerArgs {
    /// The request the worker runs (the coordinator's, or the flags as one).
    pub fn request(&self) -> anyhow::Result<ExportRequest> {
        let invalid = |e: anyhow::Error| failure::tag(Reason::InvalidConfig, e);
        if let Some(value) = &self.request {
            let text = request_text(value).map_err(invalid)?;
            return ExportRequest::from_json(&text).map_err(|e| invalid(anyhow!("--request: {e}")));
        }
        let transform = match (&self.transform, &self.transform_rules) {
            (Some(path), _) => Some(TransformRules::from_file(path)),
            (None, Some(text)) => Some(TransformRules::parse(text, "--transform-rules")),
            (None, None) => None,
        }
        .transpose()
        .map_err(|e| invalid(e.into()))?;
        let formats = parse_formats(&self.format).map_err(|e| invalid(anyhow!("--format: {e}")))?;
        Ok(ExportRequest {
            connection_file: self.connection.connection_file.clone(),
            schema: self.schema.clone(),
            tables: self.table.iter().cloned().collect(),
            store: self.store.spec(),
            key_prefix: self.key_prefix.clone(),
            formats,
            key_fields: self
                .key_fields
                .as_deref()
                .map(parse_list)
                .unwrap_or_default(),
            summary_file: self.summary_file.clone(),
            transform,
            transform_key_file: self.transform_key_file.clone(),
            row_filter: self.row_filter.clone(),
            where_subqueries: self.where_subqueries,
            sample: self.sample,
            sample_by: self.sample_by.clone(),
            statement_timeout: Some(self.session.statement_timeout.clone()),
            lock_timeout: Some(self.session.lock_timeout.clone()),
            idle_in_transaction_timeout: Some(self.session.idle_in_transaction_timeout.clone()),
            ..Default::default()
        })
    }

    /// Where a failure is reported (the request's summary file, as the coordinator's).
    pub fn termination_file(&self) -> Option<PathBuf> {
        self.summary_file.clone().or_else(|| {
            let text = request_text(self.request.as_deref()?).ok()?;
            ExportRequest::from_json(&text).ok()?.summary_file
        })
    }
}

pub async fn run(args: SplitWorkerArgs) -> anyhow::Result<i32> {
    let request = args.request()?;
    let connection = ConnectionArgs {
        connection: args.connection.connection.clone(),
        connection_file: request.connection_file.clone(),
    };
    let dsn = connection.dsn()?;
    super::init_tracing();
    let plan_wait = crate::duration::parse_positive(&args.plan_wait)
        .map_err(|e| failure::tag(Reason::InvalidConfig, anyhow!("--plan-wait: {e}")))?;
    let options = WorkerOptions {
        index: args.index,
        plan_wait,
    };
    let summary = crate::export::split_worker::run(request, options, dsn).await?;
    super::output::print(&summary, args.output.format(), String::new)?;
    Ok(0)
}
