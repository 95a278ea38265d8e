//! The shared environment of the end-to-end scenarios (e2e/env.sh: control plane, PostgreSQL 15
//! with a sample of events.sql, SeaweedFS, the fake kubelet running the `larch` image as this
//! build's `larch` binary), the operator installed once with helm, and small helpers around the
//! control plane's `kubectl` and `helm`.
//!
//! Lifetime: the environment is brought up once per test process. A watchdog (`sh` in its own
//! session) holds a pipe from this process on its stdin; when this process exits, however it
//! exits (SIGKILL included), the pipe closes and the watchdog runs `e2e/env.sh down`, which stops
//! the fake kubelet first (it kills every pod process), then the control plane, SeaweedFS and
//! PostgreSQL, and removes the directory.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const REPO: &str = env!("CARGO_MANIFEST_DIR");
pub const PSQL: &str = "/usr/lib/postgresql/15/bin/psql";
/// The image the chart and the operator use; the fake kubelet maps repository `larch` to this
/// build's binary.
pub const IMAGE: &str = "larch.local/larch:e2e";
pub const OPERATOR_NS: &str = "larch-system";

pub struct Env {
    pub dir: PathBuf,
    pub vars: BTreeMap<String, String>,
    pub kubeconfig: String,
    pub kubectl: String,
    pub helm: String,
    pub pg_dsn: String,
    pub pg_port: String,
    pub s3_endpoint: String,
    _watchdog_stdin: Mutex<ChildStdin>,
    _watchdog: Mutex<Child>,
}

static ENV: OnceLock<Result<Env, String>> = OnceLock::new();
static OPERATOR: OnceLock<Result<(), String>> = OnceLock::new();
static SERIAL: Mutex<()> = Mutex::new(());

/// Scenarios share the operator and the cluster: they run one at a time.
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The environment, brought up on first use. Panics (fails the test, never skips) when a part
/// cannot start.
pub fn env() -> &'static Env {
    match ENV.get_or_init(Env::start) {
        Ok(e) => e,
        Err(e) => panic!("the end-to-end environment did not come up: {e}"),
    }
}

/// The environment with the operator installed by `helm install` of charts/larch and Ready.
pub fn env_with_operator() -> &'static Env {
    let e = env();
    match OPERATOR.get_or_init(|| e.install_operator()) {
        Ok(()) => e,
        Err(err) => panic!("helm install of the operator failed: {err}"),
    }
}

fn cache_dir() -> PathBuf {
    std::env::var_os("LARCH_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                .join(".cache/larch")
        })
}

/// Builds e2e/fake-kubelet (its own workspace) into this build's target directory.
fn fake_kubelet() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("LARCH_FAKE_KUBELET") {
        return Ok(PathBuf::from(p));
    }
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("target dir")
        .to_path_buf();
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["build", "--locked", "--manifest-path"])
        .arg(Path::new(REPO).join("e2e/fake-kubelet/Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .map_err(|e| format!("running cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo build of e2e/fake-kubelet failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(target.join("debug/larch-fake-kubelet"))
}

impl Env {
    fn start() -> Result<Env, String> {
        let t0 = Instant::now();
        let kubelet = fake_kubelet()?;
        // Not under /tmp: pods mount an emptyDir on /tmp, which would hide the fake kubelet's
        // volume sources under it from the pod's own later bind mounts.
        let dir = PathBuf::from(format!("/var/tmp/larch-e2e-{}", std::process::id()));
        let script = Path::new(REPO).join("e2e/env.sh");
        // The watchdog first, so that a half-started environment is torn down too.
        let watchdog = format!(
            "read -r _ignored || true; bash '{}' down '{}'",
            script.display(),
            dir.display()
        );
        let mut child = Command::new("setsid")
            .args(["sh", "-c", &watchdog])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting the watchdog: {e}"))?;
        let stdin = child.stdin.take().expect("watchdog stdin");
        let out = Command::new("bash")
            .arg(&script)
            .arg("up")
            .arg(&dir)
            .env("LARCH_BIN", env!("CARGO_BIN_EXE_larch"))
            .env("LARCH_FAKE_KUBELET", &kubelet)
            .env("LARCH_CACHE", cache_dir())
            .output()
            .map_err(|e| format!("running e2e/env.sh: {e}"))?;
        eprintln!("{}", String::from_utf8_lossy(&out.stderr));
        if !out.status.success() {
            return Err(format!(
                "e2e/env.sh up failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let text = std::fs::read_to_string(dir.join("env")).map_err(|e| e.to_string())?;
        let mut vars = BTreeMap::new();
        for line in text.lines() {
            let line = line.trim_start_matches("export ");
            if let Some((k, v)) = line.split_once('=') {
                vars.insert(k.to_string(), v.trim_matches('\'').to_string());
            }
        }
        let get = |k: &str| vars.get(k).cloned().ok_or(format!("{k} missing from env"));
        let env = Env {
            kubeconfig: get("KUBECONFIG")?,
            kubectl: get("KUBECTL")?,
            helm: get("HELM")?,
            pg_dsn: get("LARCH_E2E_PG_DSN")?,
            pg_port: get("LARCH_E2E_PG_PORT")?,
            s3_endpoint: get("LARCH_E2E_S3_ENDPOINT")?,
            dir,
            vars,
            _watchdog_stdin: Mutex::new(stdin),
            _watchdog: Mutex::new(child),
        };
        eprintln!("e2e: environment up in {:?}", t0.elapsed());
        Ok(env)
    }

    fn install_operator(&self) -> Result<(), String> {
        let t0 = Instant::now();
        let (repo, tag) = IMAGE.rsplit_once(':').unwrap();
        let out = self.helm(&[
            "install",
            "larch",
            &format!("{REPO}/charts/larch"),
            "--namespace",
            OPERATOR_NS,
            "--create-namespace",
            "--set",
            &format!("image.repository={repo}"),
            "--set",
            &format!("image.tag={tag}"),
            "--wait",
            "--timeout",
            "180s",
        ]);
        if !out.status.success() {
            return Err(format!(
                "{}{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                self.diagnostics(OPERATOR_NS)
            ));
        }
        eprintln!("e2e: operator installed in {:?}", t0.elapsed());
        Ok(())
    }

    pub fn helm(&self, args: &[&str]) -> Output {
        Command::new(&self.helm)
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .output()
            .expect("running helm")
    }

    /// `kubectl ARGS` (with this cluster's kubeconfig).
    pub fn kubectl_out(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut cmd = Command::new(&self.kubectl);
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if stdin.is_some() {
            cmd.stdin(Stdio::piped());
        } else {
            cmd.stdin(Stdio::null());
        }
        let mut child = cmd.spawn().expect("running kubectl");
        if let Some(s) = stdin {
            child
                .stdin
                .take()
                .unwrap()
                .write_all(s.as_bytes())
                .expect("writing kubectl stdin");
        }
        child.wait_with_output().expect("waiting for kubectl")
    }

    /// `kubectl ARGS`, which must succeed; returns stdout.
    pub fn kubectl(&self, args: &[&str]) -> String {
        let out = self.kubectl_out(args, None);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// `kubectl apply --server-side -f -` of `manifest`, which must succeed.
    pub fn apply(&self, manifest: &str) {
        let out = self.kubectl_out(
            &[
                "apply",
                "--server-side",
                "--field-manager=larch-e2e",
                "-f",
                "-",
            ],
            Some(manifest),
        );
        assert!(
            out.status.success(),
            "kubectl apply failed: {}\n{manifest}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `kubectl get ARGS -o json`, parsed; `None` when it does not exist.
    pub fn get(&self, args: &[&str]) -> Option<Value> {
        let mut a = vec!["get"];
        a.extend_from_slice(args);
        a.extend_from_slice(&["-o", "json"]);
        let out = self.kubectl_out(&a, None);
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("NotFound"), "kubectl {a:?}: {err}");
            return None;
        }
        Some(serde_json::from_slice(&out.stdout).expect("kubectl JSON"))
    }

    /// `kubectl get ARGS -o json` of a list; its items.
    pub fn list(&self, args: &[&str]) -> Vec<Value> {
        self.get(args)
            .and_then(|v| v["items"].as_array().cloned())
            .unwrap_or_default()
    }

    /// A namespace with the Secrets the examples reference: `pg-source` (key `dsn`: the test
    /// PostgreSQL) and `s3-credentials` (any key pair: SeaweedFS has no identities configured).
    pub fn namespace(&self, ns: &str, labels: &[(&str, &str)]) {
        let labels: String = labels
            .iter()
            .map(|(k, v)| format!("    {k}: \"{v}\"\n"))
            .collect();
        let labels = if labels.is_empty() {
            String::new()
        } else {
            format!("  labels:\n{labels}")
        };
        self.apply(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n{labels}"
        ));
        self.apply(&format!(
            r#"apiVersion: v1
kind: Secret
metadata: {{name: pg-source, namespace: {ns}}}
stringData:
  dsn: "{dsn}"
---
apiVersion: v1
kind: Secret
metadata: {{name: s3-credentials, namespace: {ns}}}
stringData:
  AWS_ACCESS_KEY_ID: larch-e2e
  AWS_SECRET_ACCESS_KEY: larch-e2e-secret
"#,
            dsn = self.pg_dsn
        ));
        // The ServiceAccount admission plugin rejects pods until `default` exists.
        wait_until(&format!("ServiceAccount {ns}/default"), 60, || {
            self.get(&["serviceaccount", "default", "-n", ns]).is_some()
        });
    }

    /// Creates an S3 bucket on SeaweedFS (anonymous PUT: no identities configured).
    pub fn bucket(&self, name: &str) {
        let out = Command::new("curl")
            .args(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "-X", "PUT"])
            .arg(format!("{}/{name}", self.s3_endpoint))
            .output()
            .expect("running curl");
        let code = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            code == "200" || code == "409",
            "creating bucket {name}: HTTP {code} {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `psql -At -c SQL` on the sample database; stdout trimmed.
    pub fn sql(&self, sql: &str) -> String {
        self.sql_in("app", sql)
    }

    /// `psql -At -c SQL` on `database` of the environment's PostgreSQL; stdout trimmed.
    pub fn sql_in(&self, database: &str, sql: &str) -> String {
        let out = Command::new(PSQL)
            .args([
                "-X",
                "-At",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-U",
            ])
            .args(["postgres", "-d", database, "-p", &self.pg_port, "-c", sql])
            .output()
            .expect("running psql");
        assert!(
            out.status.success(),
            "psql {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    /// Stops the environment's PostgreSQL (immediate shutdown) until [`Env::pg_start`].
    pub fn pg_stop(&self) {
        self.postgres_script(&["stop", &self.vars["LARCH_E2E_PG_DIR"]]);
    }

    /// Starts the environment's PostgreSQL again on its port, with its data.
    pub fn pg_start(&self) {
        self.postgres_script(&["start", &self.vars["LARCH_E2E_PG_DIR"], &self.pg_port]);
    }

    fn postgres_script(&self, args: &[&str]) {
        let out = Command::new("bash")
            .arg(Path::new(REPO).join("scripts/postgres.sh"))
            .args(args)
            .output()
            .expect("running scripts/postgres.sh");
        assert!(
            out.status.success(),
            "scripts/postgres.sh {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The object keys under `prefix` in `bucket` (S3 ListObjectsV2 on SeaweedFS).
    pub fn s3_keys(&self, bucket: &str, prefix: &str) -> Vec<String> {
        let out = Command::new("curl")
            .args(["-sSf", "--max-time", "10"])
            .arg(format!(
                "{}/{bucket}?list-type=2&max-keys=1000&prefix={prefix}",
                self.s3_endpoint
            ))
            .output()
            .expect("running curl");
        assert!(
            out.status.success(),
            "listing {bucket}/{prefix}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .split("<Key>")
            .skip(1)
            .filter_map(|s| s.split("</Key>").next())
            .map(str::to_string)
            .collect()
    }

    /// `larch ARGS` (this build), which must succeed; returns stdout.
    pub fn larch(&self, args: &[&str]) -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_larch"))
            .args(args)
            .env("AWS_ACCESS_KEY_ID", "larch-e2e")
            .env("AWS_SECRET_ACCESS_KEY", "larch-e2e-secret")
            .output()
            .expect("running larch");
        assert!(
            out.status.success(),
            "larch {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Every `*.log` file of the pods of `namespaces` (the fake kubelet's container logs): its
    /// path and text.
    pub fn pod_logs(&self, namespaces: &[&str]) -> Vec<(String, String)> {
        let data = Path::new(&self.vars["LARCH_E2E_KUBELET_DATA"]);
        let mut out = vec![];
        for ns in namespaces {
            let Ok(pods) = std::fs::read_dir(data.join(ns)) else {
                continue;
            };
            for pod in pods.flatten() {
                for f in std::fs::read_dir(pod.path())
                    .into_iter()
                    .flatten()
                    .flatten()
                {
                    if f.path().extension().is_some_and(|x| x == "log") {
                        let text = std::fs::read_to_string(f.path()).unwrap_or_default();
                        out.push((f.path().display().to_string(), text));
                    }
                }
            }
        }
        out
    }

    /// What happened in a namespace (pods, events, operator log tail) for failure messages.
    pub fn diagnostics(&self, ns: &str) -> String {
        let pods = self.kubectl_out(&["get", "pods", "-n", ns, "-o", "wide"], None);
        let events = self.kubectl_out(
            &["get", "events", "-n", ns, "--sort-by=.lastTimestamp"],
            None,
        );
        let mut logs = String::new();
        for (path, text) in self.pod_logs(&[ns, OPERATOR_NS]) {
            let lines: Vec<&str> = text.lines().collect();
            logs.push_str(&format!(
                "--- {path}\n{}\n",
                lines[lines.len().saturating_sub(15)..].join("\n")
            ));
        }
        format!(
            "pods:\n{}\nevents:\n{}\nlogs:\n{logs}",
            String::from_utf8_lossy(&pods.stdout),
            String::from_utf8_lossy(&events.stdout)
        )
    }

    /// Waits (up to `secs`) until `f` returns `Some`, failing with the namespace's diagnostics.
    pub fn wait_for<T>(
        &self,
        ns: &str,
        what: &str,
        secs: u64,
        mut f: impl FnMut() -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(v) = f() {
                return v;
            }
            if Instant::now() > deadline {
                panic!(
                    "timed out after {secs}s waiting for {what}\n{}",
                    self.diagnostics(ns)
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// `GET url` through curl; the parsed JSON body, or `None` on any failure.
    /// A GET of `url` as JSON; a tables API URL of an engine carries its source's token (the
    /// engines' tables need one by default).
    pub fn http_json(&self, url: &str) -> Option<Value> {
        let mut cmd = Command::new("curl");
        cmd.args(["-sf", "--max-time", "10"]);
        if url.contains(":8080/tables") {
            let ip = url.trim_start_matches("http://").split(':').next()?;
            if let Some(token) = self.engine_token(ip) {
                cmd.args(["-H", &format!("Authorization: Bearer {token}")]);
            }
        }
        let out = cmd.arg(url).output().expect("running curl");
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }
}

impl Env {
    /// The API token of the engine pod at `ip`: its source's `tokenSecretRef`, else the Secret
    /// `<source>-engine-token` the operator generated (read as a client would, with kubectl).
    pub fn engine_token(&self, ip: &str) -> Option<String> {
        let pod = self
            .list(&[
                "pods",
                "-A",
                "--field-selector",
                &format!("status.podIP={ip}"),
            ])
            .into_iter()
            .find(|p| p["metadata"]["labels"]["larch.dev/archive-source"].is_string())?;
        let ns = pod["metadata"]["namespace"].as_str()?;
        let source = pod["metadata"]["labels"]["larch.dev/archive-source"].as_str()?;
        let src = self.get(&["archivesource", source, "-n", ns])?;
        let named = &src["spec"]["access"]["tokenSecretRef"];
        let (name, key) = match named["name"].as_str() {
            Some(n) => (n.to_string(), named["key"].as_str()?.to_string()),
            None => (format!("{source}-engine-token"), "token".to_string()),
        };
        self.secret_value(ns, &name, &key)
    }

    /// A key of a Secret, decoded.
    pub fn secret_value(&self, ns: &str, name: &str, key: &str) -> Option<String> {
        let out = self.kubectl_out(
            &[
                "get",
                "secret",
                name,
                "-n",
                ns,
                "-o",
                &format!("go-template={{{{index .data \"{key}\" | base64decode}}}}"),
            ],
            None,
        );
        (out.status.success() && !out.stdout.is_empty())
            .then(|| String::from_utf8_lossy(&out.stdout).to_string())
    }
}

pub fn wait_until(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(
            Instant::now() < deadline,
            "timed out after {secs}s waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// The condition `type` of an object's status, if any.
pub fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

pub fn condition_is(obj: &Value, type_: &str, status: &str) -> bool {
    condition(obj, type_).is_some_and(|c| c["status"] == status)
}

/// kstatus as Flux reads an object: computed by `sigs.k8s.io/cli-utils` `pkg/kstatus/status`
/// itself (`larch-gitops kstatus`, e2e/gitops), not by a re-implementation of its rules.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum KStatus {
    Current,
    InProgress,
    Failed,
    Terminating,
    Unknown,
}

/// What a GitOps tool's library says of one object: its status and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub status: String,
    pub message: String,
}

pub fn kstatus(obj: &Value) -> KStatus {
    KStatus::of(&kstatus_verdict(obj))
}

impl KStatus {
    /// The status of a `larch-gitops kstatus` verdict.
    pub fn of(v: &Verdict) -> KStatus {
        match v.status.as_str() {
            "Current" => KStatus::Current,
            "InProgress" => KStatus::InProgress,
            "Failed" => KStatus::Failed,
            "Terminating" => KStatus::Terminating,
            "Unknown" => KStatus::Unknown,
            other => panic!("kstatus {other:?} ({})", v.message),
        }
    }
}

/// kstatus with its message (e.g. "Resource is Ready", the Stalled condition's message).
pub fn kstatus_verdict(obj: &Value) -> Verdict {
    gitops_tool(&["kstatus"], obj)
}

/// The Argo CD checks users install (deploy/argocd/argocd-cm.yaml).
pub const ARGOCD_CM: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/argocd/argocd-cm.yaml");

/// Argo CD's health of a larch object: the repository's `argocd-cm` health Lua for its kind,
/// run by `larch-gitops argocd-health` in gopher-lua with Argo CD's sandbox.
pub fn argocd_health(obj: &Value) -> Verdict {
    gitops_tool(&["argocd-health", "--argocd-cm", ARGOCD_CM], obj)
}

static GITOPS_TOOL: OnceLock<Result<PathBuf, String>> = OnceLock::new();

/// `larch-gitops`, built (or found up to date by its stamp) by `e2e/build.sh larch-gitops` on
/// first use: a few seconds from the Go module cache, nothing when the stamp matches.
fn gitops_tool_path() -> &'static Path {
    let built = GITOPS_TOOL.get_or_init(|| {
        let out = Command::new("bash")
            .arg(Path::new(REPO).join("e2e/build.sh"))
            .arg("larch-gitops")
            .env("LARCH_CACHE", cache_dir())
            .output()
            .map_err(|e| format!("running e2e/build.sh: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "e2e/build.sh larch-gitops failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(cache_dir().join("bin/larch-gitops"))
    });
    match built {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    }
}

fn gitops_tool(args: &[&str], obj: &Value) -> Verdict {
    let mut child = Command::new(gitops_tool_path())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running larch-gitops");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(obj.to_string().as_bytes())
        .expect("writing larch-gitops stdin");
    let out = child.wait_with_output().expect("waiting for larch-gitops");
    assert!(
        out.status.success(),
        "larch-gitops {args:?} failed: {} (object: {obj})",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).expect("larch-gitops JSON");
    Verdict {
        status: r["status"].as_str().unwrap_or_default().to_string(),
        message: r["message"].as_str().unwrap_or_default().to_string(),
    }
}
