//! HTTP GETs to pods (`/status`, `/metrics` on port 8080). A trait so controller tests can
//! answer without a network.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

#[async_trait::async_trait]
pub trait Prober: Send + Sync {
    /// GET `http://<ip>:<port><path>`; the body on HTTP 200, an error message otherwise.
    async fn get(&self, ip: &str, port: u16, path: &str) -> Result<String, String>;

    /// [`Prober::get`] with `Authorization: Bearer <token>` when a token is given (an engine
    /// whose reads, and so `/status`, are protected).
    async fn get_with_token(
        &self,
        ip: &str,
        port: u16,
        path: &str,
        token: Option<&str>,
    ) -> Result<String, String> {
        let _ = token;
        self.get(ip, port, path).await
    }
}

/// Plain HTTP/1.1, bounded: a pod's answer is read for at most `timeout` in all (connecting
/// included) and at most `max_body` bytes, so an endpoint that stalls or streams forever costs
/// the operator one short wait and a small buffer, never its memory or its other reconciles.
pub struct HttpProber {
    client: Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>,
    timeout: Duration,
    max_body: usize,
}

/// `/status` and `/metrics` of larch's pods are a few KiB; a body past this is refused.
pub const MAX_PROBE_BODY: usize = 256 * 1024;

impl Default for HttpProber {
    fn default() -> Self {
        let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(1)));
        Self {
            client: Client::builder(TokioExecutor::new()).build(connector),
            timeout: Duration::from_secs(3),
            max_body: MAX_PROBE_BODY,
        }
    }
}

#[async_trait::async_trait]
impl Prober for HttpProber {
    async fn get(&self, ip: &str, port: u16, path: &str) -> Result<String, String> {
        self.get_with_token(ip, port, path, None).await
    }

    async fn get_with_token(
        &self,
        ip: &str,
        port: u16,
        path: &str,
        token: Option<&str>,
    ) -> Result<String, String> {
        let host = if ip.contains(':') {
            format!("[{ip}]")
        } else {
            ip.to_string()
        };
        let uri: http::Uri = format!("http://{host}:{port}{path}")
            .parse()
            .map_err(|e| format!("{e}"))?;
        let mut request = http::Request::get(uri);
        if let Some(t) = token {
            request = request.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let request = request.body(Empty::new()).map_err(|e| format!("{e}"))?;
        let fut = async {
            let resp = self
                .client
                .request(request)
                .await
                .map_err(|e| e.to_string())?;
            let status = resp.status();
            if !status.is_success() {
                return Err(format!("HTTP {status}"));
            }
            let mut body = resp.into_body();
            let mut kept = Vec::new();
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| e.to_string())?;
                if let Some(data) = frame.data_ref() {
                    if kept.len() + data.len() > self.max_body {
                        return Err(format!("answer over {} bytes: not read", self.max_body));
                    }
                    kept.extend_from_slice(data);
                }
            }
            Ok(String::from_utf8_lossy(&kept).into_owned())
        };
        tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| "timed out".to_string())?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn http_prober_reads_bodies_and_reports_errors() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            for (status, bearer) in [
                ("200 OK", None),
                ("503 Service Unavailable", None),
                ("200 OK", Some("engine-token-0123456789")),
            ] {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 1024];
                let n = s.read(&mut buf).await.unwrap();
                let req = String::from_utf8_lossy(&buf[..n]).to_string();
                assert!(req.starts_with("GET /status HTTP/1.1"), "{req}");
                let sent = req
                    .lines()
                    .find_map(|l| l.strip_prefix("authorization: Bearer "));
                assert_eq!(sent, bearer, "{req}");
                let body = r#"{"ok":true}"#;
                let resp = format!(
                    "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                s.write_all(resp.as_bytes()).await.unwrap();
            }
        });
        let p = HttpProber::default();
        assert_eq!(
            p.get("127.0.0.1", port, "/status").await.unwrap(),
            r#"{"ok":true}"#
        );
        assert!(
            p.get("127.0.0.1", port, "/status")
                .await
                .unwrap_err()
                .contains("503")
        );
        let token = Some("engine-token-0123456789");
        assert_eq!(
            p.get_with_token("127.0.0.1", port, "/status", token)
                .await
                .unwrap(),
            r#"{"ok":true}"#
        );
    }

    /// A pod that streams `/status` forever, or accepts and never answers, costs one bounded
    /// read: the prober gives up past its body limit or its deadline and reads the next pod.
    #[tokio::test]
    async fn a_hostile_endpoint_costs_a_bounded_read() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let streamed = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = streamed.clone();
        tokio::spawn(async move {
            // 1: chunked, forever (stops when the prober hangs up).
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await.unwrap();
            s.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                .await
                .unwrap();
            let chunk = format!("{:x}\r\n{}\r\n", 64 * 1024, "x".repeat(64 * 1024));
            while s.write_all(chunk.as_bytes()).await.is_ok() {
                counter.fetch_add(64 * 1024, std::sync::atomic::Ordering::Relaxed);
            }
            // 2: headers, then silence.
            let (mut s, _) = listener.accept().await.unwrap();
            let _ = s.read(&mut buf).await.unwrap();
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n")
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_secs(60)).await;
        });
        let p = HttpProber::default();
        let t0 = std::time::Instant::now();
        let e = p.get("127.0.0.1", port, "/status").await.unwrap_err();
        assert!(e.contains("over 262144 bytes"), "{e}");
        let sent = streamed.load(std::sync::atomic::Ordering::Relaxed);
        assert!(
            sent < 64 << 20,
            "the prober stopped reading early, the server wrote {sent} bytes"
        );
        let e = p.get("127.0.0.1", port, "/status").await.unwrap_err();
        assert_eq!(e, "timed out");
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    }
}
