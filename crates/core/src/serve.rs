//! The one way larch serves HTTP (the engine, the exporters, `slot-status`, the operator):
//! `axum::serve` sets no header-read timeout (its HTTP/1 builder has no timer), so a client
//! that sends half a request line held a connection and its task for as long as it liked.
//! Here every connection has a deadline for its request head, a cap on the head's size and a
//! cap on the body (nothing larch serves takes more than a small body).

use std::fmt::Debug;
use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::serve::Listener;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::sync::watch;

/// How long a client has to send a request's line and headers (the first, and each next one
/// on a kept-alive connection) before the connection is closed.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest request head (line and headers) read; a larger one is refused with 431.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// The largest request body a handler can read; a larger one fails the read.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// What a listener tolerates of its clients.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub header_read_timeout: Duration,
    pub max_head_bytes: usize,
    pub max_body_bytes: usize,
    /// HTTP/2 beside HTTP/1.1 (prior knowledge in cleartext, ALPN `h2` over TLS): the engine's
    /// gRPC listener; every other listener speaks HTTP/1.1 only.
    pub http2: bool,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            header_read_timeout: HEADER_READ_TIMEOUT,
            max_head_bytes: MAX_HEAD_BYTES,
            max_body_bytes: MAX_BODY_BYTES,
            http2: false,
        }
    }
}

/// Serves `app` on `listener` with the default [`Limits`] until `shutdown` resolves, then
/// stops accepting, lets the requests in flight finish and returns.
pub async fn serve<L>(
    listener: L,
    app: Router,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()>
where
    L: Listener,
    L::Addr: Debug,
{
    serve_with(listener, app, Limits::default(), shutdown).await
}

/// Binds `listen` (an error names it as `--listen`) and serves `app` in a task of its own until
/// `shutdown` flips to true; returns the bound address (port 0: the one chosen).
pub async fn spawn_until(
    listen: &str,
    app: Router,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<std::net::SocketAddr> {
    use anyhow::Context;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("--listen {listen}"))?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let stop = async move {
            let _ = shutdown.wait_for(|s| *s).await;
        };
        let _ = serve(listener, app, stop).await;
    });
    Ok(addr)
}

/// [`serve`] with explicit limits.
pub async fn serve_with<L>(
    mut listener: L,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()>
where
    L: Listener,
    L::Addr: Debug,
{
    let (stop_tx, stop_rx) = watch::channel(());
    let mut shutdown = pin!(shutdown);
    loop {
        let (io, peer) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        tracing::trace!(?peer, "connection accepted");
        tokio::spawn(connection(io, app.clone(), limits, stop_rx.clone()));
    }
    drop(listener);
    drop(stop_rx);
    // Every connection's task holds a receiver: `closed` resolves when the last one ended.
    let _ = stop_tx.send(());
    stop_tx.closed().await;
    Ok(())
}

async fn connection<Io>(io: Io, app: Router, limits: Limits, mut stop: watch::Receiver<()>)
where
    Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let max_body = limits.max_body_bytes;
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let req = req.map(|b| Body::new(http_body_util::Limited::new(b, max_body)));
        let mut app = app.clone();
        async move { tower_service::Service::call(&mut app, req).await }
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_head_bytes.max(8192));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(limits.max_head_bytes as u32);
    if !limits.http2 {
        builder = builder.http1_only();
    }
    let mut conn = pin!(builder.serve_connection(TokioIo::new(io), service));
    let stopping = tokio::select! {
        result = conn.as_mut() => {
            if let Err(e) = result {
                tracing::debug!(error = %e, "HTTP connection ended");
            }
            false
        }
        _ = stop.changed() => true,
    };
    if stopping {
        conn.as_mut().graceful_shutdown();
        let _ = conn.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn started(limits: Limits) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().route(
            "/echo",
            axum::routing::post(|body: axum::body::Bytes| async move { body.len().to_string() }),
        );
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(serve_with(listener, app, limits, async move {
            let _ = rx.await;
        }));
        (addr, tx)
    }

    #[tokio::test]
    async fn a_half_sent_head_is_cut_and_big_requests_are_refused() {
        let limits = Limits {
            header_read_timeout: Duration::from_millis(300),
            max_head_bytes: 8192,
            max_body_bytes: 100,
            http2: false,
        };
        let (addr, stop) = started(limits).await;
        let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /echo HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        let started = std::time::Instant::now();
        let mut buf = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), slow.read_to_end(&mut buf)).await;
        assert!(
            read.is_ok(),
            "the half-sent request was still open after 5 s"
        );
        assert!(started.elapsed() < Duration::from_secs(2));

        // A client that connects and sends nothing is cut alike.
        let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut buf = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), silent.read_to_end(&mut buf)).await;
        assert!(read.is_ok(), "a silent connection was still open after 5 s");

        let mut big = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "GET /echo HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n",
            "a".repeat(20_000)
        );
        let _ = big.write_all(head.as_bytes()).await;
        let mut answer = Vec::new();
        let _ = big.read_to_end(&mut answer).await;
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
            "{answer}"
        );

        let mut body = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!(
            "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\nConnection: close\r\n\r\n{}",
            "b".repeat(1000)
        );
        body.write_all(req.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        body.read_to_end(&mut answer).await.unwrap();
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
        let _ = stop.send(());
    }
}
