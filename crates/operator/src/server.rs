//! The operator's own HTTP endpoints: `/health/live`, `/health/ready`, `/metrics`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use super::metrics::Metrics;

#[derive(Clone)]
pub struct ServerState {
    pub metrics: Arc<Metrics>,
    /// Set once the operator reached the API server (leader or standby alike).
    pub ready: Arc<AtomicBool>,
}

pub fn router(state: ServerState) -> Router {
    Router::new()
        .route("/health/live", get(|| async { "ok" }))
        .route(
            "/health/ready",
            get(|State(s): State<ServerState>| async move {
                if s.ready.load(Ordering::Relaxed) {
                    (StatusCode::OK, "ready")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "starting")
                }
            }),
        )
        .route(
            "/metrics",
            get(|State(s): State<ServerState>| async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4",
                    )],
                    s.metrics.render(),
                )
            }),
        )
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::probe::{HttpProber, Prober};

    #[tokio::test]
    async fn health_and_metrics_endpoints() {
        let state = ServerState {
            metrics: Arc::new(Metrics::default()),
            ready: Arc::new(AtomicBool::new(false)),
        };
        state
            .metrics
            .reconciles
            .with_label_values(&["export"])
            .inc();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let app = router(state.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let p = HttpProber::default();
        assert_eq!(
            p.get("127.0.0.1", port, "/health/live").await.unwrap(),
            "ok"
        );
        assert!(
            p.get("127.0.0.1", port, "/health/ready")
                .await
                .unwrap_err()
                .contains("503")
        );
        state.ready.store(true, Ordering::Relaxed);
        assert_eq!(
            p.get("127.0.0.1", port, "/health/ready").await.unwrap(),
            "ready"
        );
        let m = p.get("127.0.0.1", port, "/metrics").await.unwrap();
        assert!(
            m.contains("larch_operator_reconciles_total{controller=\"export\"} 1"),
            "{m}"
        );
    }
}
