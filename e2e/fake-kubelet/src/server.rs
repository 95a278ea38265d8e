//! The kubelet's HTTPS port, for `kubectl logs` only: the apiserver proxies
//! `pods/<name>/log` to `https://<node InternalIP>:<daemonEndpoints.kubeletEndpoint.Port>/containerLogs/<ns>/<pod>/<container>`.
//! Self-signed certificate (the test apiserver has no `--kubelet-certificate-authority`, so it
//! does not verify it); client certificates are not checked. exec/attach/port-forward answer 404.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context;
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::Ctx;

/// Binds 127.0.0.1 on a free port, serves in the background and returns the port.
pub async fn start(ctx: Arc<Ctx>) -> anyhow::Result<u16> {
    let ck = rcgen::generate_simple_self_signed(vec![
        "127.0.0.1".to_string(),
        "localhost".to_string(),
        ctx.node.clone(),
    ])
    .context("generating the kubelet serving certificate")?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(vec![ck.cert.der().clone()], key)?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    ctx.kubelet_port.store(port, Ordering::Relaxed);
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let (acceptor, ctx) = (acceptor.clone(), ctx.clone());
            tokio::spawn(async move {
                match acceptor.accept(tcp).await {
                    Ok(tls) => {
                        if let Err(e) = serve(&ctx, tls).await {
                            tracing::debug!(error = %e, "kubelet port request");
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "kubelet port TLS handshake"),
                }
            });
        }
    });
    Ok(port)
}

/// Query parameters of `/containerLogs` that are honoured.
#[derive(Debug, Default, PartialEq)]
pub struct LogQuery {
    pub follow: bool,
    pub tail_lines: Option<usize>,
    pub limit_bytes: Option<usize>,
}

/// Parses a request target into (path segments, query).
pub fn parse_target(target: &str) -> (Vec<String>, LogQuery) {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let segs = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    let mut q = LogQuery::default();
    for kv in query.split('&') {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        match k {
            "follow" => q.follow = v == "true" || v == "1",
            "tailLines" => q.tail_lines = v.parse().ok(),
            "limitBytes" => q.limit_bytes = v.parse().ok(),
            _ => {}
        }
    }
    (segs, q)
}

async fn respond<S: AsyncWrite + Unpin>(
    s: &mut S,
    status: &str,
    body: &str,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await?;
    s.write_all(body.as_bytes()).await?;
    s.shutdown().await
}

async fn serve<S: AsyncRead + AsyncWrite + Unpin>(ctx: &Ctx, mut s: S) -> anyhow::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut buf).await?;
        if n == 0 || head.len() > 16 * 1024 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&head);
    let mut first = text.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (first.next().unwrap_or(""), first.next().unwrap_or("/"));
    let (segs, q) = parse_target(target);
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    match (method, segs.as_slice()) {
        ("GET", ["healthz"]) => respond(&mut s, "200 OK", "ok").await?,
        ("GET", ["containerLogs", ns, pod, container]) => {
            let path = ctx.data_dir.join(ns).join(pod).join(format!("{container}.log"));
            let Ok(mut data) = tokio::fs::read(&path).await else {
                respond(&mut s, "404 Not Found", &format!("larch-fake-kubelet: no log for container {container} of pod {ns}/{pod}\n")).await?;
                return Ok(());
            };
            if let Some(n) = q.tail_lines {
                data = crate::pod::tail_lines(&data, n, usize::MAX);
            }
            if let Some(n) = q.limit_bytes {
                data.truncate(n);
            }
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n").await?;
            s.write_all(&data).await?;
            if q.follow && q.limit_bytes.is_none() {
                let mut offset = tokio::fs::metadata(&path).await.map_or(0, |m| m.len());
                loop {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    let live = ctx.live_logs.lock().expect("live logs").contains(&path);
                    let len = tokio::fs::metadata(&path).await.map_or(0, |m| m.len());
                    if len > offset {
                        let mut f = tokio::fs::File::open(&path).await?;
                        tokio::io::AsyncSeekExt::seek(&mut f, std::io::SeekFrom::Start(offset)).await?;
                        let mut more = Vec::new();
                        f.take(len - offset).read_to_end(&mut more).await?;
                        s.write_all(&more).await?;
                        s.flush().await?;
                        offset = len;
                    }
                    if !live {
                        break;
                    }
                }
            }
            s.shutdown().await?;
        }
        _ => {
            respond(
                &mut s,
                "404 Not Found",
                "larch-fake-kubelet serves only /containerLogs (kubectl logs); exec, attach and port-forward are not supported\n",
            )
            .await?
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        let (segs, q) =
            parse_target("/containerLogs/ns/p-1/c?follow=true&tailLines=10&timestamps=false");
        assert_eq!(segs, vec!["containerLogs", "ns", "p-1", "c"]);
        assert_eq!(
            q,
            LogQuery {
                follow: true,
                tail_lines: Some(10),
                limit_bytes: None
            }
        );
        let (segs, q) = parse_target("/healthz");
        assert_eq!(segs, vec!["healthz"]);
        assert_eq!(q, LogQuery::default());
        assert_eq!(parse_target("/x?limitBytes=5").1.limit_bytes, Some(5));
    }
}
