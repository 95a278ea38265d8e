//! `larch export cleanup` (drop what a continuous export left on the source database) and
//! `larch export slot-status` (how much WAL replication slots hold; served while an
//! ArchiveExport is suspended).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use clap::{Args, Subcommand};
use prometheus::Registry;
use serde::Serialize;

use super::{ConnectionArgs, SessionLimitArgs, parse_duration_arg};
use crate::export::slot::{SlotMetrics, SlotReport, now_string};
use crate::locks::MutexExt;
use crate::source::postgres::{PostgresConfig, SlotWatcher, cleanup};
use crate::units::format_bytes;

#[derive(Subcommand, Debug)]
pub enum ExportCommand {
    /// Drop the replication slot(s) and publication(s) `larch export --follow` left on the
    /// source database. Only what larch recorded as --owner's is dropped: a publication whose
    /// comment is `larch: created for replication slot S by OWNER`, and that slot S; anything
    /// else is reported as kept, with the reason (naming the recorded owner). Prints a JSON report; exits 1 on an error (nothing
    /// else is dropped then).
    Cleanup(CleanupArgs),
    /// Report how much WAL replication slots hold (JSON once, or served on --listen as
    /// /status and /metrics, refreshed every --interval).
    SlotStatus(SlotStatusArgs),
    /// One worker process of a split export (`larch export --split N --split-workers M`, the
    /// coordinator): copies the ranges r with r % M == I of the coordinator's plan, read from
    /// the archive's store (on Kubernetes: a pod of an Indexed Job). Exit 0: its ranges are
    /// done; 1: transient (retry it); 2: bad input.
    SplitWorker(Box<super::split_worker::SplitWorkerArgs>),
}

#[derive(Args, Debug)]
pub struct CleanupArgs {
    #[command(flatten)]
    pub connection: ConnectionArgs,
    #[command(flatten)]
    pub session: SessionLimitArgs,
    /// Replication slot to drop (repeat for several).
    #[arg(long = "slot", required = true)]
    pub slots: Vec<String>,
    /// Publication to drop with the slot (default: the slot's name, as `larch export`
    /// names it). Only with a single --slot.
    #[arg(long)]
    pub publication: Option<String>,
    /// Whose slots and publications these are (as `larch export --owner` recorded it).
    #[arg(long, default_value = crate::source::postgres::ownership::DEFAULT_OWNER, value_parser = super::parse_owner)]
    pub owner: String,
    /// Also drop a slot and publication whose record an older larch wrote without an owner
    /// (`larch: created for replication slot S`), when it names this very slot: say so only
    /// for objects you know are this export's.
    #[arg(long)]
    pub adopt_legacy: bool,
    /// How long a slot in use may take to be released (an exporter that is stopping) before
    /// cleanup fails.
    #[arg(long, default_value = "30s", value_parser = parse_duration_arg)]
    pub wait: Duration,
    /// Also write the JSON report to this file (compact, one line).
    #[arg(long, alias = "termination-log")]
    pub summary_file: Option<PathBuf>,
    #[command(flatten)]
    pub output: super::output::DocumentOutputArgs,
}

#[derive(Args, Debug)]
pub struct SlotStatusArgs {
    #[command(flatten)]
    pub connection: ConnectionArgs,
    #[command(flatten)]
    pub session: SessionLimitArgs,
    /// Replication slot to report (repeat for several).
    #[arg(long = "slot", required = true)]
    pub slots: Vec<String>,
    /// Serve /health/live, /health/ready, /status and /metrics here instead of printing once.
    #[arg(long)]
    pub listen: Option<String>,
    /// How often the served figures are refreshed.
    #[arg(long, default_value = "10s", value_parser = parse_duration_arg)]
    pub interval: Duration,
    // Without --listen: the format of the report on stdout.
    #[command(flatten)]
    pub output: super::output::DocumentOutputArgs,
}

pub async fn run(command: ExportCommand) -> anyhow::Result<i32> {
    match command {
        ExportCommand::Cleanup(a) => run_cleanup(a).await,
        ExportCommand::SlotStatus(a) => slot_status(a).await,
        ExportCommand::SplitWorker(a) => super::split_worker::run(*a).await,
    }
}

fn config(
    connection: &ConnectionArgs,
    session: &SessionLimitArgs,
) -> anyhow::Result<PostgresConfig> {
    let mut config = PostgresConfig::new(connection.dsn()?, vec![], "", "");
    config.limits = session.limits();
    Ok(config)
}

async fn run_cleanup(args: CleanupArgs) -> anyhow::Result<i32> {
    if args.publication.is_some() && args.slots.len() > 1 {
        crate::failure::bail!(
            crate::failure::Reason::InvalidConfig,
            "--publication applies to a single --slot; with several, each slot's publication is named like the slot"
        );
    }
    let pairs: Vec<(String, String)> = args
        .slots
        .iter()
        .map(|s| {
            (
                s.clone(),
                args.publication.clone().unwrap_or_else(|| s.clone()),
            )
        })
        .collect();
    let mut config = config(&args.connection, &args.session)?;
    config.owner = args.owner.clone();
    // An error goes to --summary-file as the termination message (cli::main).
    let report = cleanup(&config, &pairs, args.wait, args.adopt_legacy).await?;
    for o in &report.objects {
        let kind = if o.kind == "slot" {
            "replication slot"
        } else {
            "publication"
        };
        match o.outcome {
            "dropped" => eprintln!(
                "larch export cleanup: dropped {kind} {} on {}",
                o.name, report.server
            ),
            "absent" => eprintln!(
                "larch export cleanup: {kind} {} does not exist on {}",
                o.name, report.server
            ),
            _ => eprintln!(
                "larch export cleanup: kept {kind} {}: {}",
                o.name,
                o.reason.as_deref().unwrap_or("")
            ),
        }
    }
    let text = serde_json::to_string(&report)?;
    if let Some(path) = &args.summary_file {
        std::fs::write(path, format!("{text}\n"))
            .with_context(|| format!("writing --summary-file {}", path.display()))?;
    }
    // JSON stays one line, as cleanup always printed it.
    match args.output.format() {
        super::output::Output::Yaml => {
            super::output::print(&report, super::output::Output::Yaml, String::new)?
        }
        _ => println!("{text}"),
    }
    Ok(0)
}

/// What `slot-status` prints, and serves at `/status` without `server`: an unauthenticated
/// answer names no database host or user.
#[derive(Clone, Debug, Default, Serialize)]
struct SlotsStatus {
    #[serde(skip_serializing_if = "String::is_empty")]
    server: String,
    observed_at: Option<String>,
    slots: Vec<SlotReport>,
    last_error: Option<String>,
}

struct Served {
    status: Mutex<SlotsStatus>,
    registry: Registry,
    metrics: SlotMetrics,
}

async fn slot_status(args: SlotStatusArgs) -> anyhow::Result<i32> {
    let mut watcher = SlotWatcher::new(config(&args.connection, &args.session)?);
    let Some(listen) = &args.listen else {
        let slots = watcher.read(&args.slots).await?;
        let reports: Vec<SlotReport> = slots
            .iter()
            .map(|(name, u)| SlotReport::new(name, u.as_ref()))
            .collect();
        for r in &reports {
            match r.retained_wal_bytes {
                Some(b) if r.exists => eprintln!(
                    "{}: holds {} of WAL ({}, {})",
                    r.name,
                    format_bytes(b),
                    r.wal_status.as_deref().unwrap_or("?"),
                    if r.active { "in use" } else { "not in use" }
                ),
                _ => eprintln!("{}: does not exist", r.name),
            }
        }
        let status = SlotsStatus {
            server: watcher.server(),
            observed_at: Some(now_string()),
            slots: reports,
            last_error: None,
        };
        super::output::print(&status, args.output.format(), String::new)?;
        return Ok(0);
    };
    super::init_tracing();
    let registry = Registry::new();
    let served = Arc::new(Served {
        metrics: SlotMetrics::register(&registry),
        registry,
        status: Mutex::new(SlotsStatus {
            slots: args
                .slots
                .iter()
                .map(|s| SlotReport::new(s, None))
                .collect(),
            ..Default::default()
        }),
    });
    let server = watcher.server();
    let addr = serve(listen, served.clone()).await?;
    tracing::info!(%addr, slots = ?args.slots, "serving replication slot status");
    let mut tick = tokio::time::interval(args.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = crate::engine::wait_for_signal() => return Ok(0),
        }
        match watcher.read(&args.slots).await {
            Ok(slots) => {
                let reports: Vec<SlotReport> = slots
                    .iter()
                    .map(|(name, u)| SlotReport::new(name, u.as_ref()))
                    .collect();
                for r in &reports {
                    served.metrics.set(r);
                }
                let mut s = served.status.locked();
                s.slots = reports;
                s.observed_at = Some(now_string());
                s.last_error = None;
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "reading the replication slots");
                // The server's address and user stay in the log, out of the open /status.
                let text = format!("{e:#}").replace(&server, "the source database");
                served.status.locked().last_error = Some(text);
            }
        }
    }
}

async fn serve(listen: &str, served: Arc<Served>) -> anyhow::Result<SocketAddr> {
    let app = Router::new()
        .route(
            "/health/live",
            get(|| async { axum::Json(serde_json::json!({"status": "ok"})) }),
        )
        .route(
            "/health/ready",
            get(|| async { axum::Json(serde_json::json!({"ready": true})) }),
        )
        .route("/status", get(status))
        .route("/metrics", get(metrics))
        .with_state(served);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("--listen {listen}"))?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = larch_core::serve::serve(listener, app, std::future::pending()).await;
    });
    Ok(addr)
}

async fn status(State(s): State<Arc<Served>>) -> Response {
    axum::Json(s.status.locked().clone()).into_response()
}

async fn metrics(State(s): State<Arc<Served>>) -> Response {
    use prometheus::Encoder;
    let mut out = Vec::new();
    prometheus::TextEncoder::new()
        .encode(&s.registry.gather(), &mut out)
        .expect("text encoding");
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        out,
    )
        .into_response()
}
