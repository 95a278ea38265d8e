//! The gRPC listener's connections: HTTP/1.1 (Connect, gRPC-Web) and HTTP/2 (gRPC, and
//! Connect over h2; cleartext with prior knowledge or TLS with ALPN `h2`) on one port, with the
//! HTTP listener's limits on request heads and bodies ([`larch_core::serve`]).

use std::fmt::Debug;

use axum::Router;
use axum::serve::Listener;

use larch_core::serve::Limits;

/// Serves `app` on `listener` until `shutdown` resolves, then stops accepting and lets the
/// connections finish (streams end with the engine: `Api::stop`).
pub async fn serve<L>(
    listener: L,
    app: Router,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()>
where
    L: Listener,
    L::Addr: Debug,
{
    let limits = Limits {
        http2: true,
        ..Limits::default()
    };
    larch_core::serve::serve_with(listener, app, limits, shutdown).await
}
