//! The engine: archive sources feeding targets (memory tables served over HTTP, PostgreSQL
//! tables), with health, status and Prometheus metrics on one listener (laredo §9).

pub mod access;
pub mod column_mismatch;
pub mod config;
pub mod grpc;
pub mod http;
pub mod laredo_config;
pub mod metrics;
pub mod pipeline;
pub mod targets;
pub mod tls;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use self::config::{EngineConfig, SourceConfig, TargetConfig};
use self::metrics::Metrics;
use self::pipeline::{Pipeline, SourceRunner};
use self::targets::Target;
use self::targets::memory::MemoryTarget;
use self::targets::postgres::PostgresTarget;
use crate::archive_source::{ArchiveReplayOptions, ArchiveReplaySource};
use larch_archive::reader::ArchiveReader;
use larch_archive::source::SyncSource;
use larch_core::locks::MutexExt;

/// What the HTTP layer and the runners share.
pub struct Shared {
    pub metrics: Metrics,
    /// Memory tables by `schema.table`.
    pub tables: BTreeMap<String, Arc<MemoryTarget>>,
    pub runners: Vec<Arc<SourceRunner>>,
    ready: AtomicBool,
}

impl Shared {
    /// Readiness latch: once every pipeline had its first baseline, ready for good.
    pub fn ready(&self) -> bool {
        if self.ready.load(Ordering::SeqCst) {
            return true;
        }
        let now = self.runners.iter().all(|r| r.ready());
        if now {
            self.ready.store(true, Ordering::SeqCst);
        }
        now
    }

    pub fn status(&self) -> serde_json::Value {
        let mut sources = serde_json::Map::new();
        let mut pipelines = serde_json::Map::new();
        for r in &self.runners {
            let (s, ps) = r.status();
            sources.insert(r.id.clone(), s);
            for (id, p) in ps {
                pipelines.insert(id, p);
            }
        }
        serde_json::json!({
            "ready": self.ready(),
            "sources": sources,
            "pipelines": pipelines,
        })
    }

    pub fn runner(&self, id: &str) -> Option<&Arc<SourceRunner>> {
        self.runners.iter().find(|r| r.id == id)
    }
}

/// Builds sources, targets and runners (stores are opened here; nothing runs yet).
pub async fn build(config: &EngineConfig) -> anyhow::Result<Arc<Shared>> {
    let metrics = Metrics::new();
    let mut tables = BTreeMap::new();
    let mut runners = Vec::new();
    for sc in &config.sources {
        let (runner, memory) = build_source(sc, &metrics)
            .await
            .with_context(|| format!("{}: sources.{}", config.file, sc.id))?;
        if let Some(m) = memory {
            tables.insert(sc.table.to_string(), m);
        }
        runners.push(Arc::new(runner));
    }
    Ok(Arc::new(Shared {
        metrics,
        tables,
        runners,
        ready: AtomicBool::new(false),
    }))
}

/// `--check`: each source's archive exists, its manifest where the configuration says.
pub async fn check_archives(config: &EngineConfig) -> anyhow::Result<()> {
    for sc in &config.sources {
        let at = || format!("{}: source {}: table {}", config.file, sc.id, sc.table);
        let store = sc.store.open_for_reading().await.with_context(at)?;
        let reader = ArchiveReader::new(store, &sc.key_prefix, sc.formats.clone())?;
        if reader.try_load_manifest().await.with_context(at)?.is_none() {
            anyhow::bail!(
                "{}: no archive at key_prefix {:?} ({} does not exist{})",
                at(),
                sc.key_prefix,
                reader.manifest_key(),
                if sc.follow {
                    "; the engine would wait for it"
                } else {
                    ""
                }
            );
        }
    }
    Ok(())
}

async fn build_source(
    sc: &SourceConfig,
    metrics: &Metrics,
) -> anyhow::Result<(SourceRunner, Option<Arc<MemoryTarget>>)> {
    let store = sc.store.open_for_reading().await.context("store")?;
    let reader = ArchiveReader::new(store, &sc.key_prefix, sc.formats.clone())?;
    let mut opts = ArchiveReplayOptions::new(&sc.id, sc.table.clone());
    opts.key_fields = sc.key_fields.clone();
    opts.follow = sc.follow;
    opts.at = sc.at;
    opts.poll_interval = sc.poll_interval;
    opts.state_path = sc.state_path.clone();
    opts.require_transformed = sc.require_transformed;
    opts.require_leak_check = sc.require_leak_check;
    let archive = Arc::new(ArchiveReplaySource::new(reader, opts));
    let mut memory = None;
    let mut pipelines = Vec::new();
    for (i, tc) in sc.targets.iter().enumerate() {
        let target: Arc<dyn Target> = match tc {
            TargetConfig::Memory { index_fields } => {
                let m = Arc::new(MemoryTarget::new(sc.table.clone(), index_fields.clone()));
                memory = Some(m.clone());
                m
            }
            TargetConfig::Postgres {
                connection,
                table,
                split,
            } => Arc::new(
                PostgresTarget::new(connection.clone(), table.clone(), sc.id.clone())
                    .with_split(*split),
            ),
        };
        // laredo: <source>:<schema>.<table>:<target type>; a second target of one type gets #n.
        let mut id = format!("{}:{}:{}", sc.id, sc.table, tc.kind());
        if sc.targets[..i].iter().any(|t| t.kind() == tc.kind()) {
            id = format!("{id}#{}", i + 1);
        }
        pipelines.push(Arc::new(Pipeline::new(id, target)));
    }
    let runner = SourceRunner::new(
        sc.id.clone(),
        sc.table.clone(),
        sc.key_fields.clone(),
        archive.clone() as Arc<dyn SyncSource>,
        Some(archive),
        pipelines,
        metrics.clone(),
    );
    Ok((runner, memory))
}

/// How the engine serves its HTTP API.
#[derive(Clone, Debug, Default)]
pub struct Serving {
    /// The plain HTTP listener.
    pub listen: String,
    pub access: access::ApiAccess,
    /// Serve the whole API over TLS on this address; the plain listener then serves only
    /// `/health/*`, `/status` and `/metrics` (probes, scrapes).
    pub tls: Option<(String, tls::TlsFiles)>,
    /// laredo's gRPC API (`--grpc-listen`); else the configuration's `grpc`, if any.
    pub grpc: Option<config::GrpcConfig>,
}

impl Serving {
    /// Plain HTTP on `listen`, reads open, control endpoints off.
    pub fn plain(listen: &str) -> Serving {
        Serving {
            listen: listen.to_string(),
            ..Default::default()
        }
    }
}

/// A started engine: its listener addresses and a way to stop it.
pub struct RunningEngine {
    pub addr: SocketAddr,
    /// The TLS listener's address, when there is one.
    pub tls_addr: Option<SocketAddr>,
    /// The gRPC API's address, when it is served.
    pub grpc_addr: Option<SocketAddr>,
    pub shared: Arc<Shared>,
    shutdown: CancellationToken,
    runners: Vec<JoinHandle<()>>,
    /// Cancelled when a runner ended with an error no retry fixes (kept in `fatal`).
    failed: CancellationToken,
    fatal: Arc<std::sync::Mutex<Option<anyhow::Error>>>,
    servers: Vec<JoinHandle<std::io::Result<()>>>,
    ticker: JoinHandle<()>,
}

/// Builds the engine, binds `listen` (plain HTTP, control endpoints off) and starts every
/// pipeline.
pub async fn start(config: &EngineConfig, listen: &str) -> anyhow::Result<RunningEngine> {
    start_serving(config, &Serving::plain(listen)).await
}

/// Builds the engine, binds its listeners and starts every pipeline.
pub async fn start_serving(
    config: &EngineConfig,
    serving: &Serving,
) -> anyhow::Result<RunningEngine> {
    // Certificate errors before anything is opened.
    let tls_config = match &serving.tls {
        Some((_, files)) => Some(files.server_config()?),
        None => None,
    };
    let grpc = grpc_plan(config, serving)?;
    let shared = build(config).await?;
    let listen = &serving.listen;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    let addr = listener.local_addr()?;
    let shutdown = CancellationToken::new();
    let access = Arc::new(serving.access.clone());
    let mut servers = Vec::new();
    let mut tls_addr = None;
    let plain_app = match (&serving.tls, tls_config) {
        (Some((tls_listen, _)), Some(tls_config)) => {
            let tcp = tokio::net::TcpListener::bind(tls_listen)
                .await
                .with_context(|| format!("listening on {tls_listen} (TLS)"))?;
            let tls_listener = tls::TlsListener::new(tcp, tls_config)?;
            tls_addr = Some(axum::serve::Listener::local_addr(&tls_listener)?);
            let (app, stop) = (
                http::router(shared.clone(), access.clone()),
                shutdown.clone(),
            );
            servers.push(tokio::spawn(async move {
                larch_core::serve::serve(tls_listener, app, async move { stop.cancelled().await })
                    .await
            }));
            http::open_router(shared.clone(), access)
        }
        _ => http::router(shared.clone(), access),
    };
    let stop = shutdown.clone();
    servers.push(tokio::spawn(async move {
        larch_core::serve::serve(listener, plain_app, async move { stop.cancelled().await }).await
    }));
    let grpc_addr = start_grpc(grpc, &shared, &serving.access, &shutdown, &mut servers).await?;
    let failed = CancellationToken::new();
    let fatal = Arc::new(std::sync::Mutex::new(None));
    let runners = spawn_runners(&shared, &shutdown, &failed, &fatal);
    let ticker = spawn_ticker(shared.clone(), shutdown.clone());
    tracing::info!(
        %addr,
        tls_addr = tls_addr.map(|a| a.to_string()),
        control = serving.access.control,
        protect_reads = serving.access.protect_reads,
        protect_status = serving.access.protect_status,
        grpc_addr = grpc_addr.map(|a| a.to_string()),
        sources = shared.runners.len(),
        "engine started"
    );
    Ok(RunningEngine {
        addr,
        tls_addr,
        grpc_addr,
        shared,
        shutdown,
        runners,
        failed,
        fatal,
        servers,
        ticker,
    })
}

/// The gRPC API to serve (`Serving::grpc`, else the configuration's), its TLS files read.
struct GrpcPlan {
    listen: String,
    tls: Option<Arc<rustls::ServerConfig>>,
}

/// Reads the gRPC listener's certificate and key (the HTTP API's rules, offering HTTP/2 for
/// gRPC and HTTP/1.1): errors before anything is opened.
fn grpc_plan(config: &EngineConfig, serving: &Serving) -> anyhow::Result<Option<GrpcPlan>> {
    let Some(g) = serving.grpc.as_ref().or(config.grpc.as_ref()) else {
        return Ok(None);
    };
    let tls = match &g.tls {
        Some(files) => {
            let mut c = (*files
                .server_config()
                .context("grpc.tls (the gRPC API's cert_file and key_file)")?)
            .clone();
            c.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
            Some(Arc::new(c))
        }
        None => None,
    };
    Ok(Some(GrpcPlan {
        listen: g.listen.clone(),
        tls,
    }))
}

/// Binds the gRPC API's listener and serves it until `shutdown` (which also ends its streams).
async fn start_grpc(
    plan: Option<GrpcPlan>,
    shared: &Arc<Shared>,
    access: &access::ApiAccess,
    shutdown: &CancellationToken,
    servers: &mut Vec<JoinHandle<std::io::Result<()>>>,
) -> anyhow::Result<Option<SocketAddr>> {
    let Some(plan) = plan else {
        return Ok(None);
    };
    let tcp = tokio::net::TcpListener::bind(&plan.listen)
        .await
        .with_context(|| format!("listening on {} (gRPC API)", plan.listen))?;
    let addr = tcp.local_addr()?;
    let api = grpc::Api::new(shared.clone(), Arc::new(access.clone()), shutdown.clone());
    let app = grpc::router(api);
    let stop = shutdown.clone();
    let until = async move { stop.cancelled().await };
    servers.push(match plan.tls {
        Some(c) => tokio::spawn(grpc::serve(tls::TlsListener::new(tcp, c)?, app, until)),
        None => tokio::spawn(grpc::serve(tcp, app, until)),
    });
    Ok(Some(addr))
}

/// Runs each source's pipelines until `shutdown`; the first error no retry fixes is kept in
/// `fatal` and cancels `failed`.
fn spawn_runners(
    shared: &Shared,
    shutdown: &CancellationToken,
    failed: &CancellationToken,
    fatal: &Arc<std::sync::Mutex<Option<anyhow::Error>>>,
) -> Vec<JoinHandle<()>> {
    shared
        .runners
        .iter()
        .map(|r| {
            let (runner, stop) = (r.clone(), shutdown.clone());
            let (failed, fatal) = (failed.clone(), fatal.clone());
            tokio::spawn(async move {
                if let Err(e) = runner.run(stop).await {
                    fatal.locked().get_or_insert(e);
                    failed.cancel();
                }
            })
        })
        .collect()
}

/// Refreshes every runner's figures once a second until `stop`.
fn spawn_ticker(shared: Arc<Shared>, stop: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = every.tick() => shared.runners.iter().for_each(|r| r.refresh()),
                _ = stop.cancelled() => return,
            }
        }
    })
}

impl RunningEngine {
    /// Resolves with the error of the first source that cannot go on (a configuration its
    /// archive cannot serve); pending while every source runs or retries.
    pub async fn failure(&self) -> anyhow::Error {
        self.failed.cancelled().await;
        self.fatal
            .locked()
            .take()
            .unwrap_or_else(|| anyhow::anyhow!("a source stopped"))
    }

    /// Stops sources, waits for the runners, sends final acks, closes the listener.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        for r in self.runners {
            let _ = r.await;
        }
        for r in &self.shared.runners {
            r.final_ack().await;
        }
        let _ = self.ticker.await;
        for server in self.servers {
            server.await.context("http server task")??;
        }
        Ok(())
    }
}

/// The message of the event that gives a listener's address (its `addr` field).
pub const LISTENING: &str = "larch engine listening";
/// The message of the event that gives the gRPC API's address (its `addr` field).
pub const GRPC_LISTENING: &str = "larch engine gRPC API listening";

/// `larch engine`: runs until SIGTERM or SIGINT, then stops cleanly; or until a source cannot
/// go on, then stops and fails with its error.
pub async fn run(config: &EngineConfig, serving: &Serving) -> anyhow::Result<()> {
    let engine = start_serving(config, serving).await?;
    // A log event like any other (scripts read `addr`, the port `--listen :0` picked).
    tracing::info!(addr = %engine.addr, tls = false, "{LISTENING}");
    if let Some(a) = engine.tls_addr {
        tracing::info!(addr = %a, tls = true, "{LISTENING}");
    }
    if let Some(a) = engine.grpc_addr {
        tracing::info!(addr = %a, "{GRPC_LISTENING}");
    }
    let failure = tokio::select! {
        () = wait_for_signal() => {
            tracing::info!("signal received: stopping");
            None
        }
        e = engine.failure() => Some(e),
    };
    let stopped = engine.stop().await;
    match failure {
        Some(e) => Err(e),
        None => stopped,
    }
}

/// Resolves on SIGTERM or SIGINT.
pub async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
