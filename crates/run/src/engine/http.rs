//! The engine's one HTTP listener: health, status, metrics and the memory tables' API.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{MatchedPath, Path, Query, Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use super::Shared;
use super::access::{self, ApiAccess};
use super::metrics::Metrics;

/// Every endpoint, the tables API and the control endpoints behind `access`.
pub fn router(shared: Arc<Shared>, access: Arc<ApiAccess>) -> Router {
    let reads = Router::new()
        .route("/tables", get(tables))
        .route("/tables/{table}", get(table))
        .route("/tables/{table}/rows", get(rows))
        .route("/tables/{table}/row", get(row))
        .route_layer(axum::middleware::from_fn_with_state(
            access.clone(),
            access::guard_reads,
        ));
    let control = Router::new()
        .route("/sources/{id}/pause", post(pause))
        .route("/sources/{id}/resume", post(resume))
        .route_layer(axum::middleware::from_fn_with_state(
            access.clone(),
            access::guard_control,
        ));
    let metrics = shared.metrics.clone();
    counted(
        health_routes()
            .merge(status_routes(access))
            .merge(reads)
            .merge(control)
            .with_state(shared),
        metrics,
    )
}

/// Health, status and metrics only (no row data, no control): the plain listener's routes
/// when the API is served over TLS.
pub fn open_router(shared: Arc<Shared>, access: Arc<ApiAccess>) -> Router {
    let metrics = shared.metrics.clone();
    counted(
        health_routes()
            .merge(status_routes(access))
            .with_state(shared),
        metrics,
    )
}

/// Every request counted and timed by its route template (`/tables/{table}`, never the raw
/// path: one series a route, however many tables or bad paths are asked for).
fn counted(router: Router, metrics: Metrics) -> Router {
    router.layer(axum::middleware::from_fn_with_state(metrics, count_request))
}

async fn count_request(State(metrics): State<Metrics>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let method = match *req.method() {
        Method::GET | Method::HEAD | Method::POST | Method::PUT | Method::DELETE => {
            req.method().as_str().to_string()
        }
        _ => "other".to_string(),
    };
    let start = Instant::now();
    let response = next.run(req).await;
    metrics
        .http_request_duration_seconds
        .with_label_values(&[&route, &method])
        .observe(start.elapsed().as_secs_f64());
    metrics
        .http_requests_total
        .with_label_values(&[&route, &method, response.status().as_str()])
        .inc();
    response
}

/// Probes: always open.
fn health_routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/health/live", get(live))
        .route("/health/ready", get(ready))
}

/// `/status` and `/metrics`: behind the token when status is protected (they name tables,
/// positions and errors, never a row value).
fn status_routes(access: Arc<ApiAccess>) -> Router<Arc<Shared>> {
    Router::new()
        .route("/status", get(status))
        .route("/metrics", get(metrics))
        .route_layer(axum::middleware::from_fn_with_state(
            access,
            access::guard_status,
        ))
}

fn json(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    json(
        status,
        serde_json::json!({ "error": message.into() }).to_string(),
    )
}

async fn live() -> Response {
    json(StatusCode::OK, r#"{"status":"ok"}"#.into())
}

async fn ready(State(s): State<Arc<Shared>>) -> Response {
    if s.ready() {
        json(StatusCode::OK, r#"{"ready":true}"#.into())
    } else {
        json(StatusCode::SERVICE_UNAVAILABLE, r#"{"ready":false}"#.into())
    }
}

async fn status(State(s): State<Arc<Shared>>) -> Response {
    json(StatusCode::OK, s.status().to_string())
}

async fn metrics(State(s): State<Arc<Shared>>) -> Response {
    for r in &s.runners {
        r.refresh();
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.metrics.render(),
    )
        .into_response()
}

async fn tables(State(s): State<Arc<Shared>>) -> Response {
    let list: Vec<serde_json::Value> = s
        .tables
        .iter()
        .map(|(name, t)| serde_json::json!({"table": name, "row_count": t.len()}))
        .collect();
    json(
        StatusCode::OK,
        serde_json::json!({ "tables": list }).to_string(),
    )
}

/// An error answer, built lazily (a `Response` is large).
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        error(self.0, self.1)
    }
}

fn find(s: &Shared, name: &str) -> Result<Arc<super::targets::memory::MemoryTarget>, ApiError> {
    s.tables.get(name).cloned().ok_or_else(|| {
        ApiError(
            StatusCode::NOT_FOUND,
            format!(
                "no memory table {name:?} (tables: {})",
                s.tables.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        )
    })
}

async fn table(State(s): State<Arc<Shared>>, Path(name): Path<String>) -> Response {
    match find(&s, &name) {
        Ok(t) => json(StatusCode::OK, t.describe().to_string()),
        Err(r) => r.into_response(),
    }
}

async fn rows(
    State(s): State<Arc<Shared>>,
    Path(name): Path<String>,
    Query(params): Query<Vec<(String, String)>>,
) -> Response {
    let t = match find(&s, &name) {
        Ok(t) => t,
        Err(r) => return r.into_response(),
    };
    match t.page(&params) {
        Ok(body) => json(StatusCode::OK, body),
        Err(e) => error(StatusCode::BAD_REQUEST, e.0),
    }
}

async fn row(
    State(s): State<Arc<Shared>>,
    Path(name): Path<String>,
    Query(params): Query<Vec<(String, String)>>,
) -> Response {
    let t = match find(&s, &name) {
        Ok(t) => t,
        Err(r) => return r.into_response(),
    };
    match t.get(&params) {
        Ok(Some(body)) => json(StatusCode::OK, body),
        Ok(None) => error(StatusCode::NOT_FOUND, "no row with that primary key"),
        Err(e) => error(StatusCode::BAD_REQUEST, e.0),
    }
}

fn runner(s: &Shared, id: &str) -> Result<Arc<super::pipeline::SourceRunner>, ApiError> {
    s.runners
        .iter()
        .find(|r| r.id == id)
        .cloned()
        .ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("no source {id:?}")))
}

async fn pause(State(s): State<Arc<Shared>>, Path(id): Path<String>) -> Response {
    match runner(&s, &id) {
        Ok(r) => {
            r.source.pause();
            r.refresh();
            json(StatusCode::OK, r#"{"paused":true}"#.into())
        }
        Err(e) => e.into_response(),
    }
}

async fn resume(State(s): State<Arc<Shared>>, Path(id): Path<String>) -> Response {
    match runner(&s, &id) {
        Ok(r) => {
            r.source.resume();
            r.refresh();
            json(StatusCode::OK, r#"{"paused":false}"#.into())
        }
        Err(e) => e.into_response(),
    }
}
