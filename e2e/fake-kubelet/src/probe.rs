//! Container probes: httpGet (plain HTTP/1.1 over a TCP connection to podIP:port), tcpSocket,
//! exec (run inside the container's mount namespace with `nsenter`), grpc (checked as tcpSocket).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Probe timing with Kubernetes' defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timing {
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

impl Timing {
    pub fn of(p: &Probe) -> Self {
        let secs = |v: Option<i32>, d: i32| Duration::from_secs(v.unwrap_or(d).max(0) as u64);
        Self {
            initial_delay: secs(p.initial_delay_seconds, 0),
            period: secs(p.period_seconds, 10).max(Duration::from_secs(1)),
            timeout: secs(p.timeout_seconds, 1).max(Duration::from_secs(1)),
            success_threshold: p.success_threshold.unwrap_or(1).max(1) as u32,
            failure_threshold: p.failure_threshold.unwrap_or(3).max(1) as u32,
        }
    }
}

/// Resolves a probe port (number, or the name of one of the container's ports).
pub fn resolve_port(port: &IntOrString, c: &Container) -> Option<u16> {
    match port {
        IntOrString::Int(p) => u16::try_from(*p).ok(),
        IntOrString::String(name) => name.parse::<u16>().ok().or_else(|| {
            c.ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .and_then(|p| u16::try_from(p.container_port).ok())
        }),
    }
}

/// Whether an HTTP status line reports success (200 <= code < 400).
pub fn http_success(status_line: &str) -> bool {
    let mut parts = status_line.split_whitespace();
    let proto = parts.next().unwrap_or("");
    let code: u16 = parts.next().and_then(|c| c.parse().ok()).unwrap_or(0);
    proto.starts_with("HTTP/") && (200..400).contains(&code)
}

/// Runs the probe once; `Err` carries a failure message.
pub async fn run(p: &Probe, c: &Container, pod_ip: &str, pid: Option<u32>) -> Result<(), String> {
    let timeout = Timing::of(p).timeout;
    let fut = async {
        if let Some(h) = &p.http_get {
            let port = resolve_port(&h.port, c).ok_or("unknown probe port")?;
            let host = h
                .host
                .clone()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| pod_ip.to_string());
            if h.scheme
                .as_deref()
                .is_some_and(|s| s.eq_ignore_ascii_case("https"))
            {
                // no TLS client here: an accepted connection counts as success
                TcpStream::connect((host.as_str(), port))
                    .await
                    .map_err(|e| e.to_string())?;
                return Ok(());
            }
            let path = h
                .path
                .clone()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "/".into());
            let mut s = TcpStream::connect((host.as_str(), port))
                .await
                .map_err(|e| e.to_string())?;
            let mut req = format!(
                "GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: kube-probe/1.37\r\nAccept: */*\r\nConnection: close\r\n"
            );
            for hd in h.http_headers.iter().flatten() {
                req.push_str(&format!("{}: {}\r\n", hd.name, hd.value));
            }
            req.push_str("\r\n");
            s.write_all(req.as_bytes())
                .await
                .map_err(|e| e.to_string())?;
            let mut buf = Vec::with_capacity(256);
            let mut chunk = [0u8; 256];
            while !buf.contains(&b'\n') && buf.len() < 4096 {
                let n = s.read(&mut chunk).await.map_err(|e| e.to_string())?;
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            let text = String::from_utf8_lossy(&buf);
            let line = text.lines().next().unwrap_or("").to_string();
            if http_success(&line) {
                Ok(())
            } else {
                Err(format!("HTTP probe failed: {line:?}"))
            }
        } else if let Some(t) = &p.tcp_socket {
            let port = resolve_port(&t.port, c).ok_or("unknown probe port")?;
            let host = t
                .host
                .clone()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| pod_ip.to_string());
            TcpStream::connect((host.as_str(), port))
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        } else if let Some(g) = &p.grpc {
            let port = u16::try_from(g.port).map_err(|e| e.to_string())?;
            TcpStream::connect((pod_ip, port))
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        } else if let Some(e) = &p.exec {
            let cmd = e.command.clone().unwrap_or_default();
            if cmd.is_empty() {
                return Err("exec probe without command".into());
            }
            let mut command = match pid {
                Some(pid) => {
                    let mut k = tokio::process::Command::new("nsenter");
                    k.arg("-t")
                        .arg(pid.to_string())
                        .arg("-m")
                        .arg("-u")
                        .arg("--");
                    k.args(&cmd);
                    k
                }
                None => {
                    let mut k = tokio::process::Command::new(&cmd[0]);
                    k.args(&cmd[1..]);
                    k
                }
            };
            let st = command
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true)
                .status()
                .await
                .map_err(|e| e.to_string())?;
            if st.success() {
                Ok(())
            } else {
                Err(format!("exec probe: {st}"))
            }
        } else {
            Ok(())
        }
    };
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => Err(format!("probe timed out after {timeout:?}")),
    }
}

/// Consecutive-result bookkeeping: `Some(new_state)` when the thresholds flip the result.
#[derive(Clone, Debug)]
pub struct Tracker {
    timing: Timing,
    pub state: Option<bool>,
    successes: u32,
    failures: u32,
}

impl Tracker {
    pub fn new(timing: Timing) -> Self {
        Self {
            timing,
            state: None,
            successes: 0,
            failures: 0,
        }
    }

    pub fn record(&mut self, ok: bool) -> Option<bool> {
        if ok {
            self.successes += 1;
            self.failures = 0;
            if self.successes >= self.timing.success_threshold && self.state != Some(true) {
                self.state = Some(true);
                return Some(true);
            }
        } else {
            self.failures += 1;
            self.successes = 0;
            if self.failures >= self.timing.failure_threshold && self.state != Some(false) {
                self.state = Some(false);
                return Some(false);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_and_ports() {
        let p: Probe =
            serde_json::from_value(json!({"httpGet": {"port": "http", "path": "/ready"}})).unwrap();
        let t = Timing::of(&p);
        assert_eq!(
            (
                t.period,
                t.timeout,
                t.success_threshold,
                t.failure_threshold
            ),
            (Duration::from_secs(10), Duration::from_secs(1), 1, 3)
        );
        let c: Container = serde_json::from_value(
            json!({"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}),
        )
        .unwrap();
        assert_eq!(resolve_port(&p.http_get.unwrap().port, &c), Some(8080));
        assert_eq!(resolve_port(&IntOrString::Int(9), &c), Some(9));
        assert_eq!(resolve_port(&IntOrString::String("nope".into()), &c), None);
    }

    #[test]
    fn http_status_lines() {
        assert!(http_success("HTTP/1.0 200 OK"));
        assert!(http_success("HTTP/1.1 302 Found"));
        assert!(!http_success("HTTP/1.1 404 Not Found"));
        assert!(!http_success("HTTP/1.1 503 Service Unavailable"));
        assert!(!http_success("garbage"));
    }

    #[test]
    fn thresholds() {
        let p: Probe = serde_json::from_value(
            json!({"tcpSocket": {"port": 1}, "successThreshold": 2, "failureThreshold": 2}),
        )
        .unwrap();
        let mut t = Tracker::new(Timing::of(&p));
        assert_eq!(t.record(true), None);
        assert_eq!(t.record(true), Some(true));
        assert_eq!(t.record(true), None);
        assert_eq!(t.record(false), None);
        assert_eq!(t.record(true), None);
        assert_eq!(t.record(false), None);
        assert_eq!(t.record(false), Some(false));
        assert_eq!(t.record(false), None);
    }

    #[tokio::test]
    async fn http_probe_against_a_tiny_server() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            for code in ["200 OK", "500 Oops"] {
                let (mut s, _) = l.accept().await.unwrap();
                let mut b = [0u8; 1024];
                let _ = s.read(&mut b).await;
                let _ = s
                    .write_all(format!("HTTP/1.0 {code}\r\n\r\n").as_bytes())
                    .await;
            }
        });
        let p: Probe =
            serde_json::from_value(json!({"httpGet": {"port": port, "path": "/"}})).unwrap();
        let c: Container = serde_json::from_value(json!({"name": "c"})).unwrap();
        assert_eq!(run(&p, &c, "127.0.0.1", None).await, Ok(()));
        assert!(run(&p, &c, "127.0.0.1", None).await.is_err());
    }
}
