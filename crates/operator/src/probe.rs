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
}

/// Plain HTTP/1.1 with a short timeout.
pub struct HttpProber {
    client: Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>,
    timeout: Duration,
}

impl Default for HttpProber {
    fn default() -> Self {
        Self {
            client: Client::builder(TokioExecutor::new()).build_http(),
            timeout: Duration::from_secs(3),
        }
    }
}

#[async_trait::async_trait]
impl Prober for HttpProber {
    async fn get(&self, ip: &str, port: u16, path: &str) -> Result<String, String> {
        let host = if ip.contains(':') {
            format!("[{ip}]")
        } else {
            ip.to_string()
        };
        let uri: http::Uri = format!("http://{host}:{port}{path}")
            .parse()
            .map_err(|e| format!("{e}"))?;
        let fut = async {
            let resp = self.client.get(uri).await.map_err(|e| e.to_string())?;
            let status = resp.status();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            if !status.is_success() {
                return Err(format!("HTTP {status}"));
            }
            // Bodies are small JSON or Prometheus text; cap what is kept.
            let body = &body[..body.len().min(4 << 20)];
            Ok(String::from_utf8_lossy(body).into_owned())
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
            for status in ["200 OK", "503 Service Unavailable"] {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 1024];
                let n = s.read(&mut buf).await.unwrap();
                let req = String::from_utf8_lossy(&buf[..n]).to_string();
                assert!(req.starts_with("GET /status HTTP/1.1"), "{req}");
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
    }
}
