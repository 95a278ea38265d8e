//! Running the pods bound to this node as local processes, and reporting their status.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Pod, PodCondition, PodStatus, Probe, Secret,
};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, Patch, Preconditions};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use serde_json::json;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::Ctx;
use crate::env::{PodFacts, Refs, referenced, resolve_env};
use crate::expand::expand_with;
use crate::image::resolve_command;
use crate::probe::{self, Timing, Tracker};
use crate::process::{self, Launch, Mount};
use crate::status::{CState, PodRt, exit_reason, pod_status};
use crate::volumes::{self, DEFAULT_SA_VOLUME, Owner, Prepared, SA_MOUNT_PATH};

pub const HOST_IP: &str = "127.0.0.1";
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
const TERMINATION_MESSAGE_MAX: usize = 4096;

/// Loopback addresses 127.N.X.Y (the whole 127/8 routes to `lo`), one per running pod; N is
/// this kubelet's own range (see `claim_range`), so kubelets of several clusters on one machine
/// never hand out the same address.
#[derive(Debug)]
pub struct IpAlloc {
    range: u8,
    next: u32,
    used: HashSet<u32>,
}

impl IpAlloc {
    const SIZE: u32 = 256 * 254;

    pub fn new(range: u8) -> Self {
        Self {
            range,
            next: 0,
            used: HashSet::new(),
        }
    }

    pub fn alloc(&mut self) -> String {
        for _ in 0..Self::SIZE {
            let n = self.next % Self::SIZE;
            self.next = self.next.wrapping_add(1);
            if self.used.insert(n) {
                return format!("127.{}.{}.{}", self.range, n / 254, n % 254 + 1);
            }
        }
        panic!("no free pod IP left");
    }

    /// `preferred` if it is a free pod address (a pod keeps its IP across kubelet restarts).
    pub fn alloc_preferred(&mut self, preferred: Option<&str>) -> String {
        if let Some(n) = preferred.and_then(|p| self.index(p))
            && self.used.insert(n)
        {
            return preferred.expect("some").to_string();
        }
        self.alloc()
    }

    fn index(&self, ip: &str) -> Option<u32> {
        let parts: Vec<u32> = ip.split('.').filter_map(|p| p.parse().ok()).collect();
        match parts[..] {
            [127, r, x, y] if r == u32::from(self.range) && x < 256 && (1..=254).contains(&y) => {
                Some(x * 254 + y - 1)
            }
            _ => None,
        }
    }

    pub fn free(&mut self, ip: &str) {
        if let Some(n) = self.index(ip) {
            self.used.remove(&n);
        }
    }
}

/// How a pod's containers are stopped.
#[derive(Clone, Copy, Debug)]
pub struct Stop {
    pub grace: Duration,
    /// deleted through the API: report the final status and finish the deletion
    pub report: bool,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Policy {
    Always,
    OnFailure,
    Never,
}

impl Policy {
    fn of(s: Option<&str>) -> Self {
        match s {
            Some("Never") => Policy::Never,
            Some("OnFailure") => Policy::OnFailure,
            _ => Policy::Always,
        }
    }

    fn restarts(self, exit_code: i32) -> bool {
        match self {
            Policy::Always => true,
            Policy::OnFailure => exit_code != 0,
            Policy::Never => false,
        }
    }
}

struct Worker {
    pod_tx: watch::Sender<Arc<Pod>>,
    gone_tx: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// Watches the pods bound to the node and runs one worker per pod (by uid).
pub async fn run(ctx: Arc<Ctx>) {
    let api: Api<Pod> = Api::all(ctx.client.clone());
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={}", ctx.node));
    let mut stream = watcher(api, cfg).default_backoff().boxed();
    let mut workers: HashMap<String, Worker> = HashMap::new();
    let mut listed: HashSet<String> = HashSet::new();
    let mut shutdown = ctx.shutdown.clone();
    loop {
        let ev = tokio::select! {
            ev = stream.next() => ev,
            _ = shutdown.wait_for(|s| *s) => break,
        };
        match ev {
            Some(Ok(Event::Apply(p) | Event::InitApply(p))) => {
                let uid = p.metadata.uid.clone().unwrap_or_default();
                listed.insert(uid.clone());
                let p = Arc::new(p);
                match workers.get(&uid) {
                    Some(w) => {
                        let _ = w.pod_tx.send(p);
                    }
                    None => {
                        let (pod_tx, pod_rx) = watch::channel(p);
                        let (gone_tx, gone_rx) = watch::channel(false);
                        let task = tokio::spawn(run_pod(ctx.clone(), pod_rx, gone_rx));
                        workers.insert(
                            uid,
                            Worker {
                                pod_tx,
                                gone_tx,
                                task,
                            },
                        );
                    }
                }
            }
            Some(Ok(Event::Delete(p))) => {
                let uid = p.metadata.uid.clone().unwrap_or_default();
                if let Some(w) = workers.remove(&uid) {
                    let _ = w.gone_tx.send(true);
                }
            }
            Some(Ok(Event::Init)) => listed.clear(),
            Some(Ok(Event::InitDone)) => {
                let gone: Vec<String> = workers
                    .keys()
                    .filter(|u| !listed.contains(*u))
                    .cloned()
                    .collect();
                for uid in gone {
                    if let Some(w) = workers.remove(&uid) {
                        let _ = w.gone_tx.send(true);
                    }
                }
            }
            Some(Err(e)) => tracing::warn!(error = %e, "pod watch"),
            None => break,
        }
    }
    tracing::info!(pods = workers.len(), "stopping all pods");
    for (_, w) in workers {
        let _ = tokio::time::timeout(Duration::from_secs(15), w.task).await;
    }
}

/// State shared by a pod's worker, its container supervisors and the status publisher.
struct PodShared {
    ctx: Arc<Ctx>,
    api: Api<Pod>,
    name: String,
    pod_rx: watch::Receiver<Arc<Pod>>,
    rt: Mutex<PodRt>,
    published: tokio::sync::Mutex<(Option<PodStatus>, Vec<PodCondition>)>,
}

impl PodShared {
    fn update<R>(&self, f: impl FnOnce(&mut PodRt) -> R) -> R {
        f(&mut self.rt.lock().expect("pod state lock"))
    }

    /// Patches the pod status if it changed since the last successful patch.
    async fn publish(&self) {
        let mut published = self.published.lock().await;
        if *self.ctx.shutdown.borrow() {
            // a kubelet going away leaves its pods' status as it is
            return;
        }
        let pod = self.pod_rx.borrow().clone();
        let rt = self.rt.lock().expect("pod state lock").clone();
        let Some(spec) = &pod.spec else { return };
        let mut st = pod_status(
            spec,
            &rt,
            pod.status.as_ref(),
            &published.1,
            Timestamp::now(),
        );
        st.observed_generation = pod.metadata.generation;
        if published.0.as_ref() == Some(&st) {
            return;
        }
        let patch = Patch::Merge(json!({"status": st}));
        match self
            .api
            .patch_status(&self.name, &self.ctx.patch_params(), &patch)
            .await
        {
            Ok(_) => {
                tracing::debug!(pod = %self.name, phase = ?st.phase, "status");
                published.1 = st.conditions.clone().unwrap_or_default();
                published.0 = Some(st);
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => tracing::warn!(pod = %self.name, error = %e, "patching pod status"),
        }
    }
}

async fn stopped(rx: &mut watch::Receiver<Option<Stop>>) -> Stop {
    match rx.wait_for(|s| s.is_some()).await {
        Ok(s) => s.expect("some"),
        Err(_) => Stop {
            grace: Duration::ZERO,
            report: false,
        },
    }
}

fn grace_of(pod: &Pod, cap: Duration) -> Duration {
    let secs = pod
        .metadata
        .deletion_grace_period_seconds
        .or(pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds))
        .unwrap_or(30)
        .max(0) as u64;
    Duration::from_secs(secs).min(cap)
}

/// Turns deletion (deletionTimestamp), disappearance and kubelet shutdown into one Stop.
async fn monitor(
    ctx: Arc<Ctx>,
    mut pod_rx: watch::Receiver<Arc<Pod>>,
    mut gone_rx: watch::Receiver<bool>,
    stop_tx: watch::Sender<Option<Stop>>,
) {
    let mut shutdown = ctx.shutdown.clone();
    let stop = loop {
        let pod = pod_rx.borrow_and_update().clone();
        if pod.metadata.deletion_timestamp.is_some() {
            break Stop {
                grace: grace_of(&pod, ctx.max_grace),
                report: true,
            };
        }
        tokio::select! {
            r = pod_rx.changed() => if r.is_err() { break Stop { grace: Duration::ZERO, report: false } },
            _ = gone_rx.wait_for(|g| *g) => break Stop { grace: Duration::ZERO, report: false },
            _ = shutdown.wait_for(|s| *s) => break Stop { grace: Duration::from_secs(2), report: false },
        }
    };
    let _ = stop_tx.send(Some(stop));
    // keep the channel open while anyone listens
    stop_tx.closed().await;
}

/// What a container needs to start.
struct Plan {
    container: Container,
    launch: Launch,
    log_path: PathBuf,
    term_path: PathBuf,
    fallback_to_logs: bool,
    image_id: String,
}

/// Why containers cannot start yet.
struct Blocked {
    /// (init, index) of the container concerned; None = all
    container: Option<(bool, usize)>,
    reason: &'static str,
    message: String,
}

fn owner_of(pod: &Pod) -> Owner {
    let spec = pod.spec.as_ref();
    let psc = spec.and_then(|s| s.security_context.as_ref());
    let first = spec
        .and_then(|s| s.containers.first())
        .and_then(|c| c.security_context.as_ref());
    let uid = first
        .and_then(|s| s.run_as_user)
        .or(psc.and_then(|s| s.run_as_user));
    let gid = psc
        .and_then(|s| s.fs_group)
        .or(first.and_then(|s| s.run_as_group))
        .or(psc.and_then(|s| s.run_as_group));
    Owner {
        uid: uid.map(|u| u as u32),
        gid: gid.map(|g| g as u32),
    }
}

async fn fetch_refs(ctx: &Ctx, pod: &Pod, ns: &str) -> anyhow::Result<Refs> {
    let (cms, secrets) = referenced(pod);
    let mut refs = Refs::default();
    let cm_api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
    for name in cms {
        if let Some(cm) = cm_api.get_opt(&name).await? {
            let mut data = cm.data.unwrap_or_default();
            for (k, v) in cm.binary_data.unwrap_or_default() {
                data.insert(k, String::from_utf8_lossy(&v.0).into_owned());
            }
            refs.config_maps.insert(name, data);
        }
    }
    let s_api: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    for name in secrets {
        if let Some(s) = s_api.get_opt(&name).await? {
            let data = s
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                .collect();
            refs.secrets.insert(name, data);
        }
    }
    Ok(refs)
}

/// Builds the launch plan of one container.
#[allow(clippy::too_many_arguments)]
fn plan_container(
    ctx: &Ctx,
    pod: &Pod,
    c: &Container,
    facts: &PodFacts,
    refs: &Refs,
    prepared: &Prepared,
    root: &Path,
    log_dir: &Path,
) -> Result<Plan, (&'static str, String)> {
    let image = c.image.clone().unwrap_or_default();
    let mapping = ctx.images.lookup(&image).ok_or_else(|| {
        (
            "ErrImagePull",
            format!(
                "larch-fake-kubelet: image {image:?} is not mapped to a local binary (known: {:?}; add --binary NAME=PATH)",
                ctx.images.names()
            ),
        )
    })?;
    let spec = pod.spec.as_ref().expect("spec");
    let psc = spec.security_context.as_ref();
    let csc = c.security_context.as_ref();
    let uid = csc
        .and_then(|s| s.run_as_user)
        .or(psc.and_then(|s| s.run_as_user))
        .map(|u| u as u32);
    let gid = csc
        .and_then(|s| s.run_as_group)
        .or(psc.and_then(|s| s.run_as_group))
        .map(|g| g as u32);
    let mut base = vec![
        ("PATH".to_string(), DEFAULT_PATH.to_string()),
        ("HOSTNAME".to_string(), facts.name.clone()),
        (
            "HOME".to_string(),
            if uid.unwrap_or(0) == 0 {
                "/root".into()
            } else {
                "/".into()
            },
        ),
    ];
    base.extend(ctx.pass_env.iter().cloned());
    let (h, p) = (&ctx.api_host, ctx.api_port);
    base.extend([
        ("KUBERNETES_SERVICE_HOST".to_string(), h.clone()),
        ("KUBERNETES_SERVICE_PORT".to_string(), p.to_string()),
        ("KUBERNETES_SERVICE_PORT_HTTPS".to_string(), p.to_string()),
        ("KUBERNETES_PORT".to_string(), format!("tcp://{h}:{p}")),
        (format!("KUBERNETES_PORT_{p}_TCP"), format!("tcp://{h}:{p}")),
        (format!("KUBERNETES_PORT_{p}_TCP_PROTO"), "tcp".to_string()),
        (format!("KUBERNETES_PORT_{p}_TCP_PORT"), p.to_string()),
        (format!("KUBERNETES_PORT_{p}_TCP_ADDR"), h.clone()),
    ]);
    let env = resolve_env(c, facts, refs, &base).map_err(|m| ("CreateContainerConfigError", m))?;
    let command: Vec<String> = c
        .command
        .iter()
        .flatten()
        .map(|s| expand_with(s, &env))
        .collect();
    let args: Vec<String> = c
        .args
        .iter()
        .flatten()
        .map(|s| expand_with(s, &env))
        .collect();
    let (program, args) = resolve_command(mapping, &command, &args);

    let mut mounts = Vec::new();
    for m in c.volume_mounts.iter().flatten() {
        let Some(src) = prepared.volumes.get(&m.name) else {
            return Err((
                "CreateContainerConfigError",
                format!("volume {:?} not found", m.name),
            ));
        };
        let sub = match (&m.sub_path, &m.sub_path_expr) {
            (Some(s), _) if !s.is_empty() => s.clone(),
            (_, Some(e)) if !e.is_empty() => expand_with(e, &env),
            _ => String::new(),
        };
        let source = if sub.is_empty() {
            src.clone()
        } else {
            if sub.split('/').any(|p| p == "..") || sub.starts_with('/') {
                return Err((
                    "CreateContainerConfigError",
                    format!("invalid subPath {sub:?}"),
                ));
            }
            let s = src.join(&sub);
            if !s.exists() {
                std::fs::create_dir_all(&s)
                    .map_err(|e| ("CreateContainerConfigError", e.to_string()))?;
            }
            s
        };
        let ro = m.read_only.unwrap_or(false)
            || prepared.read_only.get(&m.name).copied().unwrap_or(false);
        mounts.push(Mount {
            source,
            target: PathBuf::from(&m.mount_path),
            read_only: ro,
        });
    }
    if let Some(sa) = prepared.volumes.get(DEFAULT_SA_VOLUME)
        && !mounts.iter().any(|m| m.target == Path::new(SA_MOUNT_PATH))
    {
        mounts.push(Mount {
            source: sa.clone(),
            target: SA_MOUNT_PATH.into(),
            read_only: true,
        });
    }
    let term_path = root.join(format!("{}.termination-log", c.name));
    let term_target = c
        .termination_message_path
        .clone()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "/dev/termination-log".into());
    mounts.push(Mount {
        source: term_path.clone(),
        target: term_target.into(),
        read_only: false,
    });

    let mut groups: Vec<u32> = Vec::new();
    if let Some(g) = gid.or(uid.map(|_| 0)) {
        groups.push(g);
    }
    if let Some(fs) = psc.and_then(|s| s.fs_group) {
        groups.push(fs as u32);
    }
    groups.extend(
        psc.and_then(|s| s.supplemental_groups.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|g| g as u32),
    );
    groups.dedup();

    let hostname = spec.hostname.clone().unwrap_or_else(|| facts.name.clone());
    Ok(Plan {
        container: c.clone(),
        launch: Launch {
            program,
            args,
            env,
            working_dir: c
                .working_dir
                .clone()
                .filter(|w| !w.is_empty())
                .map(PathBuf::from),
            mounts,
            uid,
            gid: gid.or(uid.map(|_| 0)),
            groups,
            hostname,
            read_only_root: csc
                .and_then(|s| s.read_only_root_filesystem)
                .unwrap_or(false),
        },
        log_path: log_dir.join(format!("{}.log", c.name)),
        term_path,
        fallback_to_logs: c.termination_message_policy.as_deref() == Some("FallbackToLogsOnError"),
        image_id: format!("fake://{}", mapping.path.display()),
    })
}

/// The termination message: the file's content, or the end of the log (FallbackToLogsOnError).
fn termination_message(plan: &Plan, log_offset: u64, exit_code: i32) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut msg = Vec::new();
    if let Ok(f) = std::fs::File::open(&plan.term_path) {
        let _ = f.take(TERMINATION_MESSAGE_MAX as u64).read_to_end(&mut msg);
    }
    if msg.is_empty() && plan.fallback_to_logs && exit_code != 0 {
        // the answer lies within the last 2 KiB of this run's output
        let mut log = Vec::new();
        if let Ok(mut f) = std::fs::File::open(&plan.log_path) {
            let len = f.metadata().map_or(0, |m| m.len());
            let from = log_offset.max(len.saturating_sub(4096));
            if f.seek(SeekFrom::Start(from)).is_ok() {
                let _ = f.read_to_end(&mut log);
            }
        }
        msg = tail_lines(&log, 80, 2048);
    }
    if msg.is_empty() {
        None
    } else {
        Some(String::from_utf8_lossy(&msg).into_owned())
    }
}

/// The last `lines` lines of `data`, at most `max` bytes.
pub fn tail_lines(data: &[u8], lines: usize, max: usize) -> Vec<u8> {
    let mut start = data.len();
    let mut seen = 0;
    let body = data.strip_suffix(b"\n").unwrap_or(data);
    for (i, b) in body.iter().enumerate().rev() {
        if *b == b'\n' {
            seen += 1;
            if seen == lines {
                start = i + 1;
                break;
            }
        }
        start = i;
    }
    let out = &data[start..];
    out[out.len().saturating_sub(max)..].to_vec()
}

enum ProbeEvent {
    Started,
    Ready(bool),
    Unhealthy(String),
}

fn spawn_probe(
    kind: &'static str,
    p: Probe,
    c: Container,
    ip: String,
    pid: u32,
    tx: mpsc::Sender<ProbeEvent>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let timing = Timing::of(&p);
        let mut tracker = Tracker::new(timing);
        tokio::time::sleep(timing.initial_delay).await;
        loop {
            let r = probe::run(&p, &c, &ip, Some(pid)).await;
            if let Err(e) = &r {
                tracing::debug!(container = %c.name, kind, error = %e, "probe failed");
            }
            let flip = tracker.record(r.is_ok());
            let ev = match (kind, flip) {
                ("startup", Some(true)) => Some(ProbeEvent::Started),
                ("readiness", Some(b)) => Some(ProbeEvent::Ready(b)),
                ("startup" | "liveness", Some(false)) => Some(ProbeEvent::Unhealthy(format!(
                    "{kind} probe failed: {}",
                    r.err().unwrap_or_default()
                ))),
                _ => None,
            };
            if let Some(ev) = ev {
                let done = matches!(ev, ProbeEvent::Started | ProbeEvent::Unhealthy(_));
                if tx.send(ev).await.is_err() || done {
                    return;
                }
            }
            tokio::time::sleep(timing.period).await;
        }
    })
}

/// SIGTERM to the process group, SIGKILL after `grace`; returns the exit status.
async fn kill(
    child: &mut tokio::process::Child,
    pid: u32,
    grace: Duration,
) -> std::io::Result<std::process::ExitStatus> {
    process::signal_group(pid, libc::SIGTERM);
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(r) => r,
        Err(_) => {
            process::signal_group(pid, libc::SIGKILL);
            child.wait().await
        }
    }
}

/// Runs one container until it will not run again; returns its last exit code (None: never ran).
async fn supervise(
    sh: Arc<PodShared>,
    init: bool,
    idx: usize,
    plan: Plan,
    policy: Policy,
    mut stop_rx: watch::Receiver<Option<Stop>>,
    mut started_tx: Option<oneshot::Sender<()>>,
) -> Option<i32> {
    let ctx = sh.ctx.clone();
    let ip = sh.update(|rt| rt.pod_ip.clone()).unwrap_or_default();
    let c = plan.container.clone();
    let mut backoff = ctx.backoff_initial;
    let mut last_code = None;
    let owner = (plan.launch.uid, plan.launch.gid);
    loop {
        if stop_rx.borrow().is_some() {
            sh.update(|rt| rt.container_mut(init, idx).done = true);
            return last_code;
        }
        let _ = std::fs::write(&plan.term_path, b"");
        let _ = std::os::unix::fs::chown(&plan.term_path, owner.0, owner.1);
        let _ = std::fs::set_permissions(
            &plan.term_path,
            std::os::unix::fs::PermissionsExt::from_mode(0o666),
        );
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&plan.log_path);
        let log_offset = log
            .as_ref()
            .ok()
            .and_then(|f| f.metadata().ok())
            .map_or(0, |m| m.len());
        let started_at = Timestamp::now();
        let t0 = Instant::now();
        let spawned = log.and_then(|log| process::spawn(&plan.launch, &log));
        let mut stopping = false;
        let start_failed = spawned.is_err();
        let (code, signal, mut message) = match spawned {
            Err(e) => {
                tracing::warn!(pod = %sh.name, container = %c.name, error = %e, "start failed");
                (
                    128,
                    None,
                    Some(format!(
                        "failed to start {}: {e}",
                        plan.launch.program.display()
                    )),
                )
            }
            Ok(mut child) => {
                let pid = child.id().unwrap_or(0);
                ctx.groups.add(pid);
                ctx.live_logs
                    .lock()
                    .expect("live logs")
                    .insert(plan.log_path.clone());
                tracing::info!(pod = %sh.name, container = %c.name, pid, program = %plan.launch.program.display(), "started");
                let has_startup = c.startup_probe.is_some();
                let has_readiness = c.readiness_probe.is_some();
                sh.update(|rt| {
                    let cr = rt.container_mut(init, idx);
                    cr.state = CState::Running { started_at };
                    cr.container_id = Some(format!("fake://{}", pid));
                    cr.image_id = plan.image_id.clone();
                    cr.started = !has_startup;
                    cr.ready = !has_startup && !has_readiness;
                });
                sh.publish().await;
                let (tx, mut rx) = mpsc::channel(8);
                let mut probes: Vec<JoinHandle<()>> = Vec::new();
                let start_main_probes = |probes: &mut Vec<JoinHandle<()>>| {
                    if let Some(p) = &c.liveness_probe {
                        probes.push(spawn_probe(
                            "liveness",
                            p.clone(),
                            c.clone(),
                            ip.clone(),
                            pid,
                            tx.clone(),
                        ));
                    }
                    if let Some(p) = &c.readiness_probe {
                        probes.push(spawn_probe(
                            "readiness",
                            p.clone(),
                            c.clone(),
                            ip.clone(),
                            pid,
                            tx.clone(),
                        ));
                    }
                };
                match &c.startup_probe {
                    Some(p) => probes.push(spawn_probe(
                        "startup",
                        p.clone(),
                        c.clone(),
                        ip.clone(),
                        pid,
                        tx.clone(),
                    )),
                    None => {
                        start_main_probes(&mut probes);
                        if let Some(t) = started_tx.take() {
                            let _ = t.send(());
                        }
                    }
                }
                let mut unhealthy: Option<String> = None;
                let status = loop {
                    tokio::select! {
                        st = child.wait() => break st,
                        s = stopped(&mut stop_rx) => {
                            stopping = true;
                            break kill(&mut child, pid, s.grace).await;
                        }
                        Some(ev) = rx.recv() => match ev {
                            ProbeEvent::Started => {
                                sh.update(|rt| {
                                    let cr = rt.container_mut(init, idx);
                                    cr.started = true;
                                    cr.ready = !has_readiness;
                                });
                                start_main_probes(&mut probes);
                                if let Some(t) = started_tx.take() {
                                    let _ = t.send(());
                                }
                                sh.publish().await;
                            }
                            ProbeEvent::Ready(b) => {
                                tracing::info!(pod = %sh.name, container = %c.name, ready = b, "readiness");
                                sh.update(|rt| rt.container_mut(init, idx).ready = b);
                                sh.publish().await;
                            }
                            ProbeEvent::Unhealthy(msg) => {
                                tracing::info!(pod = %sh.name, container = %c.name, %msg, "unhealthy, killing");
                                unhealthy = Some(msg);
                                let pod = sh.pod_rx.borrow().clone();
                                break kill(&mut child, pid, grace_of(&pod, ctx.max_grace)).await;
                            }
                        }
                    }
                };
                for p in probes {
                    p.abort();
                }
                // nothing of the container outlives its main process
                process::signal_group(pid, libc::SIGKILL);
                ctx.groups.remove(pid);
                ctx.live_logs
                    .lock()
                    .expect("live logs")
                    .remove(&plan.log_path);
                let (code, signal) = match status {
                    Ok(st) => process::exit_code(st),
                    Err(_) => (255, None),
                };
                (code, signal, unhealthy)
            }
        };
        let finished_at = Timestamp::now();
        if let Some(m) = termination_message(&plan, log_offset, code).filter(|_| !start_failed) {
            message = Some(m);
        }
        tracing::info!(pod = %sh.name, container = %c.name, exit_code = code, "exited");
        last_code = Some(code);
        let terminated = CState::Terminated {
            exit_code: code,
            signal,
            reason: if start_failed {
                "StartError".into()
            } else {
                exit_reason(code).into()
            },
            message,
            started_at,
            finished_at,
        };
        if stopping || !policy.restarts(code) {
            sh.update(|rt| {
                let cr = rt.container_mut(init, idx);
                cr.state = terminated;
                cr.ready = false;
                cr.started = false;
                cr.done = true;
            });
            sh.publish().await;
            return last_code;
        }
        if t0.elapsed() > Duration::from_secs(600) {
            backoff = ctx.backoff_initial;
        }
        sh.update(|rt| {
            let cr = rt.container_mut(init, idx);
            cr.last_state = Some(terminated.clone());
            cr.restart_count += 1;
            cr.ready = false;
            cr.started = false;
            cr.state = CState::waiting(
                "CrashLoopBackOff",
                Some(format!(
                    "back-off {}s restarting failed container={} pod={}",
                    backoff.as_secs(),
                    c.name,
                    sh.name
                )),
            );
        });
        sh.publish().await;
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stopped(&mut stop_rx) => {
                sh.update(|rt| {
                    let cr = rt.container_mut(init, idx);
                    cr.state = terminated;
                    cr.done = true;
                });
                return last_code;
            }
        }
        backoff = (backoff * 2).min(ctx.backoff_max);
    }
}

/// The life of one pod on this node.
async fn run_pod(ctx: Arc<Ctx>, pod_rx: watch::Receiver<Arc<Pod>>, gone_rx: watch::Receiver<bool>) {
    let pod = pod_rx.borrow().clone();
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let (stop_tx, mut stop_rx) = watch::channel(None);
    tokio::spawn(monitor(ctx.clone(), pod_rx.clone(), gone_rx, stop_tx));
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default();
    let Some(spec) = pod.spec.clone() else { return };
    if phase == "Succeeded" || phase == "Failed" {
        // finished before (possibly under a previous fake kubelet): only complete its deletion
        let stop = stopped(&mut stop_rx).await;
        if stop.report {
            delete(&api, &name, &uid).await;
        }
        return;
    }
    let host_network = spec.host_network == Some(true);
    let ip = if host_network {
        HOST_IP.to_string()
    } else {
        let previous = pod.status.as_ref().and_then(|s| s.pod_ip.as_deref());
        ctx.ips.lock().expect("ip lock").alloc_preferred(previous)
    };
    tracing::info!(pod = %format!("{ns}/{name}"), %ip, "pod assigned");
    let mut rt = PodRt::new(&spec, HOST_IP, Timestamp::now());
    rt.pod_ip = Some(ip.clone());
    let sh = Arc::new(PodShared {
        ctx: ctx.clone(),
        api: api.clone(),
        name: name.clone(),
        pod_rx: pod_rx.clone(),
        rt: Mutex::new(rt),
        published: tokio::sync::Mutex::new((None, Vec::new())),
    });
    let pod_dir = ctx.data_dir.join(&ns).join(&name);
    let root = pod_dir.join(&uid);
    let facts = PodFacts::from_pod(&pod, &ip, HOST_IP);
    let owner = owner_of(&pod);
    let mut refresher: Option<JoinHandle<()>> = None;
    let mut sidecars: Vec<JoinHandle<Option<i32>>> = Vec::new();
    let (sidecar_stop_tx, sidecar_stop_rx) = watch::channel(None);

    // periodic re-publication (retries failed patches, picks up readiness-gate changes)
    let republisher = tokio::spawn({
        let sh = sh.clone();
        async move {
            loop {
                tokio::time::sleep(Duration::from_secs(10)).await;
                sh.publish().await;
            }
        }
    });

    'run: {
        if stop_rx.borrow().is_some() {
            break 'run;
        }
        sh.publish().await;
        // volumes, env, commands; retried until they succeed
        let (init_plans, main_plans) = loop {
            let attempt: Result<(Prepared, Vec<Plan>, Vec<Plan>), Blocked> = async {
                std::fs::create_dir_all(&root).map_err(|e| Blocked {
                    container: None,
                    reason: "ContainerCreating",
                    message: e.to_string(),
                })?;
                let prepared = volumes::prepare(&ctx, &pod, &facts, &root, owner)
                    .await
                    .map_err(|e| Blocked {
                        container: None,
                        reason: "ContainerCreating",
                        message: format!("{e:#}"),
                    })?;
                let refs = fetch_refs(&ctx, &pod, &ns).await.map_err(|e| Blocked {
                    container: None,
                    reason: "ContainerCreating",
                    message: format!("{e:#}"),
                })?;
                let mut plans = (Vec::new(), Vec::new());
                for (init, list) in [
                    (true, spec.init_containers.clone().unwrap_or_default()),
                    (false, spec.containers.clone()),
                ] {
                    for (i, c) in list.iter().enumerate() {
                        let p = plan_container(
                            &ctx, &pod, c, &facts, &refs, &prepared, &root, &pod_dir,
                        )
                        .map_err(|(reason, message)| Blocked {
                            container: Some((init, i)),
                            reason,
                            message,
                        })?;
                        if init {
                            plans.0.push(p)
                        } else {
                            plans.1.push(p)
                        }
                    }
                }
                Ok((prepared, plans.0, plans.1))
            }
            .await;
            match attempt {
                Ok((prepared, i, m)) => {
                    if !prepared.tokens.is_empty() {
                        refresher = Some(tokio::spawn(refresh_tokens(
                            ctx.clone(),
                            facts.clone(),
                            prepared.tokens.clone(),
                            owner,
                        )));
                    }
                    break (i, m);
                }
                Err(b) => {
                    tracing::warn!(pod = %format!("{ns}/{name}"), reason = b.reason, message = %b.message, "cannot start yet");
                    sh.update(|rt| {
                        let targets: Vec<(bool, usize)> = match b.container {
                            Some(t) => vec![t],
                            None => (0..rt.init.len())
                                .map(|i| (true, i))
                                .chain((0..rt.main.len()).map(|i| (false, i)))
                                .collect(),
                        };
                        for (init, i) in targets {
                            rt.container_mut(init, i).state =
                                CState::waiting(b.reason, Some(b.message.clone()));
                        }
                    });
                    sh.publish().await;
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                        _ = stopped(&mut stop_rx) => break 'run,
                    }
                }
            }
        };
        std::fs::create_dir_all(&pod_dir).ok();
        // init containers, in order
        let pod_policy = Policy::of(spec.restart_policy.as_deref());
        for (i, plan) in init_plans.into_iter().enumerate() {
            let sidecar = plan.container.restart_policy.as_deref() == Some("Always");
            if sidecar {
                let (tx, rx) = oneshot::channel();
                let h = tokio::spawn(supervise(
                    sh.clone(),
                    true,
                    i,
                    plan,
                    Policy::Always,
                    sidecar_stop_rx.clone(),
                    Some(tx),
                ));
                sidecars.push(h);
                tokio::select! {
                    r = rx => if r.is_err() { break 'run },
                    _ = stopped(&mut stop_rx) => break 'run,
                }
            } else {
                let policy = if pod_policy == Policy::Never {
                    Policy::Never
                } else {
                    Policy::OnFailure
                };
                let code =
                    supervise(sh.clone(), true, i, plan, policy, stop_rx.clone(), None).await;
                if code != Some(0) {
                    break 'run;
                }
            }
        }
        sh.update(|rt| rt.init_done = true);
        sh.publish().await;
        let mains = main_plans.into_iter().enumerate().map(|(i, plan)| {
            tokio::spawn(supervise(
                sh.clone(),
                false,
                i,
                plan,
                pod_policy,
                stop_rx.clone(),
                None,
            ))
        });
        futures::future::join_all(mains).await;
    }
    // everything that has not finished will not run any more
    let stop_now = *stop_rx.borrow();
    let _ = sidecar_stop_tx.send(Some(stop_now.unwrap_or(Stop {
        grace: Duration::from_secs(2),
        report: true,
    })));
    for h in sidecars {
        let _ = h.await;
    }
    if let Some(r) = refresher.take() {
        r.abort();
    }
    sh.update(|rt| {
        for c in rt.init.iter_mut().chain(rt.main.iter_mut()) {
            c.done = true;
            c.ready = false;
        }
    });
    let stop = match stop_now {
        Some(s) => s,
        None => {
            sh.publish().await;
            stopped(&mut stop_rx).await
        }
    };
    republisher.abort();
    if stop.report {
        sh.publish().await;
        delete(&api, &name, &uid).await;
    }
    if !host_network {
        ctx.ips.lock().expect("ip lock").free(&ip);
    }
    if stop.report || !ctx.shutdown.borrow().to_owned() {
        let _ = std::fs::remove_dir_all(&root);
    }
    tracing::info!(pod = %format!("{ns}/{name}"), "pod finished");
}

async fn delete(api: &Api<Pod>, name: &str, uid: &str) {
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(name, &dp).await {
        Ok(_) => tracing::info!(pod = %name, "deleted"),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
        Err(e) => tracing::warn!(pod = %name, error = %e, "deleting pod"),
    }
}

/// Re-requests projected service-account tokens at 80% of their lifetime.
async fn refresh_tokens(
    ctx: Arc<Ctx>,
    facts: PodFacts,
    tokens: Vec<volumes::TokenFile>,
    owner: Owner,
) {
    let every = tokens
        .iter()
        .map(|t| t.expiration_seconds.max(600))
        .min()
        .unwrap_or(3600) as u64
        * 8
        / 10;
    loop {
        tokio::time::sleep(Duration::from_secs(every)).await;
        for t in &tokens {
            match volumes::request_token(
                &ctx,
                &facts,
                &t.service_account,
                t.audience.as_deref(),
                t.expiration_seconds,
            )
            .await
            {
                Ok(tok) => {
                    let _ = volumes::write_file(&t.dir, &t.rel, tok.as_bytes(), t.mode, owner);
                }
                Err(e) => tracing::warn!(pod = %facts.name, error = %e, "refreshing a token"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_allocation() {
        let mut a = IpAlloc::new(1);
        assert_eq!(a.alloc(), "127.1.0.1");
        assert_eq!(a.alloc(), "127.1.0.2");
        a.free("127.1.0.1");
        for _ in 0..251 {
            a.alloc();
        }
        assert_eq!(a.alloc(), "127.1.0.254");
        assert_eq!(a.alloc(), "127.1.1.1");
        assert_eq!(a.alloc_preferred(Some("127.1.7.9")), "127.1.7.9");
        assert_eq!(a.alloc_preferred(Some("127.1.7.9")), "127.1.1.2");
        assert_eq!(a.alloc_preferred(Some("10.0.0.1")), "127.1.1.3");
        assert_eq!(a.alloc_preferred(None), "127.1.1.4");
        // another kubelet's range is not ours
        assert_eq!(a.alloc_preferred(Some("127.2.0.9")), "127.1.1.5");
        let mut b = IpAlloc::new(42);
        assert_eq!(b.alloc(), "127.42.0.1");
    }

    #[test]
    fn tails() {
        assert_eq!(tail_lines(b"a\nb\nc\n", 2, 100), b"b\nc\n");
        assert_eq!(tail_lines(b"a\nb\nc", 2, 100), b"b\nc");
        assert_eq!(tail_lines(b"abc", 2, 100), b"abc");
        assert_eq!(tail_lines(b"a\nb\nc\n", 10, 100), b"a\nb\nc\n");
        assert_eq!(tail_lines(b"a\nbbbb\n", 10, 3), b"bb\n");
        assert_eq!(tail_lines(b"", 10, 3), b"");
    }

    #[test]
    fn restart_policies() {
        assert!(Policy::of(None).restarts(0));
        assert!(Policy::of(Some("OnFailure")).restarts(1));
        assert!(!Policy::of(Some("OnFailure")).restarts(0));
        assert!(!Policy::of(Some("Never")).restarts(1));
    }
}
