//! The engine's optional TLS listener: a certificate chain and key in PEM files (a mounted
//! `kubernetes.io/tls` Secret: `tls.crt`, `tls.key`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::ServerConfig;
use rustls::pki_types::PrivateKeyDer;
use rustls::pki_types::pem::PemObject;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use larch_core::failure::{Reason, tag};

/// A client gets this long to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn invalid(flag: &str, path: &Path, what: impl std::fmt::Display) -> anyhow::Error {
    tag(
        Reason::InvalidConfig,
        anyhow::anyhow!("{flag} {}: {what}", path.display()),
    )
}

impl TlsFiles {
    /// Reads and checks both files (errors name the flag and the file, never key material).
    pub fn server_config(&self) -> anyhow::Result<Arc<ServerConfig>> {
        let certs = larch_core::tls::read_certificates("--tls-cert", &self.cert)
            .map_err(|e| tag(Reason::InvalidConfig, e))?;
        let key_pem = std::fs::read(&self.key).map_err(|e| invalid("--tls-key", &self.key, e))?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
            invalid(
                "--tls-key",
                &self.key,
                format!("no usable private key: {e}"),
            )
        })?;
        let config =
            ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .and_then(|b| b.with_no_client_auth().with_single_cert(certs, key))
                .map_err(|e| {
                    invalid(
                        "--tls-cert",
                        &self.cert,
                        format!("does not match --tls-key: {e}"),
                    )
                })?;
        Ok(Arc::new(config))
    }
}

/// A TCP listener whose connections are TLS sessions; handshakes run in their own tasks so a
/// slow client does not hold up the others.
pub struct TlsListener {
    addr: SocketAddr,
    ready: mpsc::Receiver<(TlsStream<tokio::net::TcpStream>, SocketAddr)>,
    acceptor: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    pub fn new(tcp: TcpListener, config: Arc<ServerConfig>) -> std::io::Result<TlsListener> {
        let addr = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(64);
        let acceptor = TlsAcceptor::from(config);
        let acceptor = tokio::spawn(async move {
            loop {
                let (stream, peer) = match tcp.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "TLS listener: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener {
            addr,
            ready,
            acceptor,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The accept task only ends when aborted, i.e. when this listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.addr)
    }
}
