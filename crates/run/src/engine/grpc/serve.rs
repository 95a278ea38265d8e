//! The gRPC listener's connections: HTTP/1.1 (Connect, gRPC-Web) and HTTP/2 (gRPC, and
//! Connect over h2; cleartext with prior knowledge or TLS with ALPN `h2`) on one port, with the
//! HTTP listener's limits on request heads and bodies.

use std::pin::pin;

use axum::Router;
use axum::body::Body;
use axum::serve::Listener;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::sync::watch;

use larch_core::serve::Limits;

/// Serves `app` on `listener` until `shutdown` resolves, then stops accepting and lets the
/// connections finish (streams end with the engine: `Api::stop`).
pub async fn serve<L: Listener>(
    mut listener: L,
    app: Router,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let limits = Limits::default();
    let (stop_tx, stop_rx) = watch::channel(());
    let mut shutdown = pin!(shutdown);
    loop {
        let (io, _) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        tokio::spawn(connection(io, app.clone(), limits, stop_rx.clone()));
    }
    drop(listener);
    drop(stop_rx);
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
    let mut conn = pin!(builder.serve_connection(TokioIo::new(io), service));
    let stopping = tokio::select! {
        result = conn.as_mut() => {
            if let Err(e) = result {
                tracing::debug!(error = %e, "gRPC API connection ended");
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
