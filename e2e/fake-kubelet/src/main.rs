//! larch-fake-kubelet: registers one Ready Node with a real kube-apiserver and runs the pods the
//! scheduler binds to it as local processes ("real work" mode). See README.md.

mod env;
mod expand;
mod image;
mod node;
mod pod;
mod probe;
mod process;
mod pvc;
mod server;
mod status;
mod volumes;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use base64::Engine;
use clap::Parser;
use kube::api::PatchParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

/// A fake kubelet for larch's end-to-end tests: one Node whose pods run as local processes.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Admin kubeconfig of the cluster.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: PathBuf,
    /// Name of the Node to register.
    #[arg(long, default_value = "larch-node")]
    node_name: String,
    /// Logs (<ns>/<pod>/<container>.log), volumes and PersistentVolumes live here.
    #[arg(long, default_value = "/tmp/larch-fake-kubelet")]
    data_dir: PathBuf,
    /// IMAGE=PATH: run containers whose image repository is IMAGE (or ends in /IMAGE) with the
    /// local binary PATH. Repeatable.
    #[arg(long = "binary", value_name = "IMAGE=PATH")]
    binaries: Vec<String>,
    /// Pass this variable of the kubelet's own environment to every container (repeatable),
    /// e.g. RUST_BACKTRACE or LLVM_PROFILE_FILE.
    #[arg(long = "pass-env", value_name = "NAME")]
    pass_env: Vec<String>,
    /// Upper bound of terminationGracePeriodSeconds when a pod is deleted.
    #[arg(long, default_value_t = 10)]
    max_grace_seconds: u64,
    /// First restart back-off (doubled on each restart).
    #[arg(long, default_value_t = 1)]
    restart_backoff_seconds: u64,
    /// Largest restart back-off (the real kubelet: 300 s).
    #[arg(long, default_value_t = 30)]
    restart_backoff_max_seconds: u64,
    /// Second octet N of the pod addresses 127.N.X.Y (1-254). Default: the first N no other
    /// fake kubelet on this machine holds (a lock under /tmp/larch-fake-kubelet-ranges).
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=254))]
    pod_ip_range: Option<u8>,
    /// Do not bind pending PersistentVolumeClaims.
    #[arg(long)]
    no_provisioner: bool,
}

/// What every part of the fake kubelet shares.
pub struct Ctx {
    pub client: Client,
    pub node: String,
    pub data_dir: PathBuf,
    pub images: image::ImageMap,
    pub api_host: String,
    pub api_port: u16,
    pub ca_pem: String,
    pub max_grace: Duration,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    pub pass_env: Vec<(String, String)>,
    pub ips: Mutex<pod::IpAlloc>,
    pub groups: process::GroupRegistry,
    /// Log files of running containers (`kubectl logs -f` stops when its file leaves the set).
    pub live_logs: Mutex<std::collections::HashSet<PathBuf>>,
    /// The HTTPS port for `kubectl logs` (0 = none).
    pub kubelet_port: std::sync::atomic::AtomicU16,
    pub shutdown: watch::Receiver<bool>,
}

impl Ctx {
    pub fn patch_params(&self) -> PatchParams {
        node::patch_params()
    }
}

/// An exclusive, non-blocking flock on `path` (created), held while the file stays open.
fn try_lock(path: &std::path::Path) -> anyhow::Result<Option<std::fs::File>> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    // SAFETY: plain syscall on an open descriptor
    let locked = unsafe {
        libc::flock(
            std::os::fd::AsRawFd::as_raw_fd(&f),
            libc::LOCK_EX | libc::LOCK_NB,
        )
    } == 0;
    Ok(locked.then_some(f))
}

/// Whether a TCP/UDP socket of this machine is bound to an address in 127.N.0.0/16 (someone
/// without our lock, e.g. an older fake kubelet, uses the range).
fn range_has_sockets(n: u8) -> bool {
    ["/proc/net/tcp", "/proc/net/udp"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let local = l.split_whitespace().nth(1).unwrap_or("");
                let ip = local.split(':').next().unwrap_or("");
                // little-endian hex: 127.N.X.Y is YYXXNN7F
                u32::from_str_radix(ip, 16)
                    .is_ok_and(|v| v & 0xff == 127 && (v >> 8) & 0xff == u32::from(n))
            })
        })
    })
}

/// Claims range N for this process with an exclusive flock on RANGES_DIR/N.lock (released when
/// the process exits, however it exits). Returns N and the open lock file (keep it).
fn claim_range(wanted: Option<u8>) -> anyhow::Result<(u8, std::fs::File)> {
    const RANGES_DIR: &str = "/tmp/larch-fake-kubelet-ranges";
    std::fs::create_dir_all(RANGES_DIR)?;
    let candidates: Vec<u8> = match wanted {
        Some(n) => vec![n],
        None => (1..=254).collect(),
    };
    for n in candidates {
        if wanted.is_none() && range_has_sockets(n) {
            continue;
        }
        if let Some(f) = try_lock(std::path::Path::new(&format!("{RANGES_DIR}/{n}.lock")))? {
            return Ok((n, f));
        }
    }
    anyhow::bail!(
        "pod address range {} is held by another fake kubelet on this machine",
        wanted.map_or("127.1-254.*.*".to_string(), |n| format!("127.{n}.*.*"))
    )
}

fn pem(der: &[u8]) -> String {
    let b = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for chunk in b.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).expect("base64"));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn,hyper=warn,tower=warn,rustls=warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    let images = image::ImageMap::parse(&args.binaries)?;
    for name in images.names() {
        if let Some(m) = images.lookup(&name)
            && !m.path.exists()
        {
            tracing::warn!(image = %name, path = %m.path.display(), "mapped binary does not exist (yet)");
        }
    }
    let kc = Kubeconfig::read_from(&args.kubeconfig)
        .with_context(|| format!("reading {}", args.kubeconfig.display()))?;
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    let api_host = config
        .cluster_url
        .host()
        .unwrap_or("127.0.0.1")
        .trim_matches(['[', ']'])
        .to_string();
    let api_port = config.cluster_url.port_u16().unwrap_or(443);
    let ca_pem = config
        .root_cert
        .iter()
        .flatten()
        .map(|c| pem(c))
        .collect::<String>();
    let client = Client::try_from(config)?;
    std::fs::create_dir_all(&args.data_dir)?;
    let data_dir = std::fs::canonicalize(&args.data_dir)?;
    // one kubelet per data dir: the other's process groups and volumes live there
    let _data_lock = try_lock(&data_dir.join(".lock"))?
        .with_context(|| format!("{} is in use by another fake kubelet", data_dir.display()))?;
    let groups = process::GroupRegistry::new(data_dir.join(".process-groups"))?;
    let killed = groups.kill_leftovers();
    if killed > 0 {
        tracing::warn!(
            killed,
            "killed process groups left behind by a previous fake kubelet"
        );
    }
    let (range, _range_lock) = claim_range(args.pod_ip_range)?;
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let pass_env = args
        .pass_env
        .iter()
        .filter_map(|n| std::env::var(n).ok().map(|v| (n.clone(), v)))
        .collect();
    let ctx = Arc::new(Ctx {
        client,
        node: args.node_name.clone(),
        data_dir,
        images,
        api_host,
        api_port,
        ca_pem,
        max_grace: Duration::from_secs(args.max_grace_seconds),
        backoff_initial: Duration::from_secs(args.restart_backoff_seconds.max(1)),
        backoff_max: Duration::from_secs(args.restart_backoff_max_seconds.max(1)),
        pass_env,
        ips: Mutex::new(pod::IpAlloc::new(range)),
        groups,
        live_logs: Mutex::new(Default::default()),
        kubelet_port: Default::default(),
        shutdown: shutdown_rx,
    });

    match server::start(ctx.clone()).await {
        Ok(port) => tracing::info!(port, "kubectl logs served on 127.0.0.1"),
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "no kubelet port: kubectl logs will not work")
        }
    }
    let node = node::register(&ctx).await?;
    let node_uid = node.metadata.uid.clone().unwrap_or_default();
    tracing::info!(node = %ctx.node, pod_ips = %format!("127.{range}.0.0/16"), data_dir = %ctx.data_dir.display(), apiserver = %format!("{}:{}", ctx.api_host, ctx.api_port), "ready");
    let heartbeat = tokio::spawn(node::heartbeat(ctx.clone(), node_uid));
    let provisioner = (!args.no_provisioner).then(|| tokio::spawn(pvc::run(ctx.clone())));
    let pods = tokio::spawn(pod::run(ctx.clone()));

    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM"),
        _ = int.recv() => tracing::info!("SIGINT"),
    }
    heartbeat.abort();
    if let Some(p) = provisioner {
        p.abort();
    }
    let _ = shutdown_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(20), pods).await;
    tracing::info!("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockets_in_a_range_are_seen() {
        let l = std::net::TcpListener::bind("127.77.3.4:0").unwrap();
        assert!(range_has_sockets(77));
        drop(l);
        let u = std::net::UdpSocket::bind("127.78.0.1:0").unwrap();
        assert!(range_has_sockets(78));
        drop(u);
    }

    #[test]
    fn locks_are_exclusive() {
        let p = std::env::temp_dir().join(format!("larch-fk-lock-{}", std::process::id()));
        let a = try_lock(&p).unwrap();
        assert!(a.is_some());
        assert!(try_lock(&p).unwrap().is_none());
        drop(a);
        assert!(try_lock(&p).unwrap().is_some());
        std::fs::remove_file(&p).unwrap();
    }
}
