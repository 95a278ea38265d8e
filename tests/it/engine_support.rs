//! Helpers for engine tests: start an engine from YAML on 127.0.0.1:0, a minimal HTTP/1.1
//! client (no extra dependency), polling.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use larch::engine::config::EngineConfig;
use larch::engine::{RunningEngine, Serving, start, start_serving};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub async fn start_engine(yaml: &str) -> RunningEngine {
    let config = EngineConfig::parse("engine.yaml", yaml).unwrap_or_else(|e| panic!("{e}"));
    start(&config, "127.0.0.1:0").await.unwrap()
}

/// An engine from YAML served as `serving` says (its listeners on 127.0.0.1:0).
pub async fn start_engine_serving(yaml: &str, serving: &Serving) -> RunningEngine {
    let config = EngineConfig::parse("engine.yaml", yaml).unwrap_or_else(|e| panic!("{e}"));
    start_serving(&config, serving).await.unwrap()
}

/// `larch engine --listen 127.0.0.1:0 --config FILE` as a child process, and the address it
/// printed.
pub struct CliEngine {
    child: std::process::Child,
    pub addr: SocketAddr,
}

impl CliEngine {
    pub async fn spawn(config: &std::path::Path) -> CliEngine {
        CliEngine::spawn_with_env(config, &[]).await
    }

    pub async fn spawn_with_env(
        config: &std::path::Path,
        env: &[(&str, &std::ffi::OsStr)],
    ) -> CliEngine {
        use std::io::BufRead;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_larch"))
            .args(["engine", "--listen", "127.0.0.1:0", "--config"])
            .arg(config)
            // The address is an info event in JSON (a caller may ask for more).
            .env("LARCH_LOG", "info")
            .env("LARCH_LOG_FORMAT", "json")
            .envs(env.iter().copied())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let addr = tokio::task::spawn_blocking(move || {
            let mut lines = std::io::BufReader::new(stderr).lines();
            let addr = loop {
                let line = lines
                    .next()
                    .expect("the engine prints its address")
                    .unwrap();
                if let Some(a) = listening_addr(&line) {
                    break a;
                }
            };
            // Keep draining so the child never blocks on a full pipe.
            std::thread::spawn(move || lines.for_each(drop));
            addr
        })
        .await
        .unwrap();
        CliEngine { child, addr }
    }

    /// SIGTERM, then the exit status.
    pub async fn stop(mut self) -> std::process::ExitStatus {
        let kill = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(kill.success());
        tokio::task::spawn_blocking(move || self.child.wait().unwrap())
            .await
            .unwrap()
    }
}

/// One request; returns (status, body).
pub async fn request(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    request_with(addr, method, path, &[]).await
}

/// One request with extra header lines (`"Authorization: Bearer …"`); returns (status, body).
pub async fn request_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[&str],
) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    exchange(&mut s, &addr.to_string(), method, path, headers).await
}

/// Writes one HTTP/1.1 request on `s` (plain or TLS) and reads the whole answer.
pub async fn exchange<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    s: &mut S,
    host: &str,
    method: &str,
    path: &str,
    headers: &[&str],
) -> (u16, String) {
    let extra: String = headers.iter().map(|h| format!("{h}\r\n")).collect();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: 0\r\n{extra}\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    // A TLS peer may close without close_notify once the answer is complete.
    let _ = s.read_to_end(&mut buf).await;
    let text = String::from_utf8(buf).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("HTTP response");
    let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    (status, body)
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    loop {
        let (len, rest) = s.split_once("\r\n").unwrap();
        let n = usize::from_str_radix(len.trim(), 16).unwrap();
        if n == 0 {
            return out;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
}

pub async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    request(addr, "GET", path).await
}

pub async fn get_json(addr: SocketAddr, path: &str) -> serde_json::Value {
    let (status, body) = get(addr, path).await;
    assert_eq!(status, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
}

/// Polls `f` until it returns `Some` (panics after `secs`).
pub async fn eventually<T, F, Fut>(secs: u64, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub async fn wait_ready(addr: SocketAddr) {
    eventually(30, "readiness", || async move {
        (get(addr, "/health/ready").await.0 == 200).then_some(())
    })
    .await
}

/// Every row of a memory table through the paginated API, as JSON values, in table order.
pub async fn all_rows(addr: SocketAddr, table: &str, page: usize) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut path = format!("/tables/{table}/rows?limit={page}");
        if let Some(a) = &after {
            path.push_str(&format!("&after={a}"));
        }
        let body = get_json(addr, &path).await;
        out.extend(body["rows"].as_array().unwrap().iter().cloned());
        match body["next"].as_str() {
            Some(n) => after = Some(n.to_string()),
            None => return out,
        }
    }
}

/// The value of one metric sample (`name{labels}`) in a Prometheus text body.
pub fn metric(body: &str, sample: &str) -> Option<f64> {
    body.lines()
        .find(|l| l.starts_with(sample) && l[sample.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// The plain listener's address from the engine's `larch engine listening` event (a JSON log
/// line: `"fields":{"message":"larch engine listening","addr":"127.0.0.1:PORT","tls":false}`).
pub fn listening_addr(line: &str) -> Option<SocketAddr> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let fields = &v["fields"];
    (fields["message"] == larch::engine::LISTENING && fields["tls"] == false)
        .then(|| fields["addr"].as_str()?.parse().ok())
        .flatten()
}
